"""What crosses between the engine and any front end: the wire, the history replay a client gets
when it attaches, and the mirror it keeps current from events. Standard library only: importing
this package must never import torch or Textual (tests/test_protocol_imports.py checks)."""
