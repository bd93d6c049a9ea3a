"""vram-bench: load a PyTorch model once, hot-swap the training code while it trains."""

__version__ = "0.1.0"
