"""Saved statements compiled as their own file compiles them.

`compile()` hands the caller's `from __future__` imports on to what it compiles, and the planner has
`from __future__ import annotations`: every saved function, class and re-run statement got string annotations,
even in files without that import, and its code compared unequal to the file's. So statements are compiled with
the file's own future flags and nothing inherited.
"""

from __future__ import annotations

import __future__
import ast
import types
from collections.abc import Iterable
from pathlib import Path


def compile_nodes(nodes: tuple[ast.stmt, ...] | list[ast.stmt], path: Path, flags: int = 0) -> types.CodeType:
    """The user's statements compiled as their file is: with its own `from __future__` imports (`flags`) and
    none of this module's (compile() would otherwise hand them this file's `annotations` future)."""
    return compile(ast.Module(body=list(nodes), type_ignores=[]), str(path), "exec", flags=flags, dont_inherit=True)


def future_flags(statements: Iterable[ast.stmt]) -> int:
    """The compiler flags of a file's `from __future__ import ...` lines, which come first (after a docstring)."""
    flags = 0
    for node in statements:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            for alias in node.names:
                feature = getattr(__future__, alias.name, None)
                flags |= getattr(feature, "compiler_flag", 0)
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            break
    return flags
