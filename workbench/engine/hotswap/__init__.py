"""Hot-swap: turn a saved source file into in-place patches of the live code."""
