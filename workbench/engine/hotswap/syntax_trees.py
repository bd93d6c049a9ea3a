"""Every Python syntax tree vram-bench parses, one thread at a time.

CPython 3.11 counts the depth of the tree `ast.parse` is building in one counter for the whole interpreter. When a
garbage collection in the middle of a parse runs a finalizer that lets another thread parse too, the counter comes
out wrong and the parse raises `SystemError: AST constructor recursion depth mismatch` (python/cpython#106905).
vram-bench parses on two threads: the reload thread plans a save while the training thread reads import lines or
re-runs statements, and the full suite met it once. Formatting a traceback parses too (3.11 finds the expression to
underline with `ast.parse`), and the training thread formats the user's. So vram-bench's own parses and tracebacks
take turns here. (A thread of the user's parsing at the same moment can still meet it; none has been seen.)
"""

from __future__ import annotations

import ast
import threading
import traceback

_TURN = threading.RLock()  # re-entrant: a parse's garbage collection may run code that parses


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, taking its turn; raises SyntaxError as it does."""
    with _TURN:
        return ast.parse(source, filename)


def format_traceback(exc: traceback.TracebackException) -> str:
    """`"".join(exc.format())`, taking its turn."""
    with _TURN:
        return "".join(exc.format())
