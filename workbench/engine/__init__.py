"""What runs with the model, in the session process: the session, the training worker and its command handlers, hot-swap, memory, actions. Never imports Textual or a front end."""
