"""Tools that ship with vram-bench but are not the workbench (the weight-loading benchmark)."""
