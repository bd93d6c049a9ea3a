"""Where the project's own code assigns a hyperparameter into an optimizer's param groups.

A save that changes `LR` cannot change the learning rate an optimizer was built with: the reload says so.
But most real trainers set it themselves every step (nanoGPT's `param_group['lr'] = lr` from a schedule
that reads `learning_rate`), and then that note is wrong: the new value does reach the optimizer, through
their code. So before saying it, the project's sources are searched for an assignment to `...['lr']`.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from typing import Any

from workbench.engine.hotswap.syntax_trees import parse


def where_code_sets(namespaces: list[tuple[str, dict[str, Any]]], key: str) -> str | None:
    """`file:line` of the first `x[key] = ...` (or `x[key] += ...`) in the project's modules, else None."""
    for _, namespace in namespaces:
        filename = namespace.get("__file__")
        if not isinstance(filename, str) or not filename.endswith(".py"):
            continue
        path = Path(filename)
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            continue
        line = _first_assignment(str(path), stamp, key)
        if line is not None:
            return f"{path.name}:{line}"
    return None


@lru_cache(maxsize=256)
def _first_assignment(filename: str, stamp: int, key: str) -> int | None:
    """Cached by the file's modification time: a save is parsed once."""
    del stamp
    try:
        tree = parse(Path(filename).read_text(encoding="utf-8"), filename)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets for t in _flatten(target)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        lines += [target.lineno for target in targets if isinstance(target, ast.Subscript)
                  and isinstance(target.slice, ast.Constant) and target.slice.value == key]
    return min(lines, default=None)


def _flatten(target: ast.expr) -> list[ast.expr]:
    """`a["lr"], b = ...` assigns to each element."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for element in target.elts for t in _flatten(element)]
    return [target]
