"""Screens pushed over the main view."""
