"""Fixture for bench/edit_kinds.py: a second module that imports a function by name."""

from train import shared


def use_shared():
    return shared()
