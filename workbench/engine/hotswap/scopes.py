"""Index a module's source scope by scope, so two versions can be compared.

A definition is identified by its name, and compared by its AST without line
numbers: moving code around is not a change, editing it is.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass

DEF_NODES = (ast.FunctionDef, ast.AsyncFunctionDef)

# Module statements whose right-hand side may run again without surprises: no calls,
# no awaits, no yields. `MODEL = Net()` is not one of them.
_UNSAFE_NODES = (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)


@dataclass(frozen=True)
class Scope:
    """One top-level statement (or a group of same-named class members)."""

    kind: str  # "def", "class", "assign", "import", "stmt"
    name: str
    nodes: tuple[ast.stmt, ...]
    fingerprint: str

    @property
    def node(self) -> ast.stmt:
        return self.nodes[-1]

    @property
    def line(self) -> int:
        return self.nodes[0].lineno

    @property
    def lines(self) -> tuple[int, ...]:
        return tuple(n.lineno for n in self.nodes)

    def is_rerunnable(self) -> bool:
        """Plain constants and imports can be re-run; anything that calls code cannot."""
        if self.kind == "import":
            return True
        if self.kind != "assign" or any(isinstance(node, ast.AugAssign) for node in self.nodes):
            return False  # `N += 1` run again would count twice
        return not any(isinstance(sub, _UNSAFE_NODES) for node in self.nodes for sub in ast.walk(node))


def _fingerprint(nodes: tuple[ast.stmt, ...]) -> str:
    return "\n".join(ast.dump(node) for node in nodes)


def _assigned_names(node: ast.stmt) -> list[str] | None:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    else:
        return None
    names: list[str] = []
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                names.append(sub.id)
            elif isinstance(sub, (ast.Attribute, ast.Subscript)):
                return None  # `cfg.x = 1` mutates an object: not a plain constant
    return names or None


def index_statements(body: list[ast.stmt]) -> dict[tuple[str, str], Scope]:
    """Key every statement of a body: defs and classes by name, assignments by target."""
    grouped: dict[tuple[str, str], list[ast.stmt]] = {}
    for node in body:
        if isinstance(node, DEF_NODES):
            key = ("def", node.name)
        elif isinstance(node, ast.ClassDef):
            key = ("class", node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            key = ("import", ast.dump(node))
        elif (names := _assigned_names(node)) is not None:
            key = ("assign", ",".join(names))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            key = ("doc", "")
        else:
            key = ("stmt", ast.dump(node))
        grouped.setdefault(key, []).append(node)
    return {key: Scope(key[0], key[1], tuple(nodes), _fingerprint(tuple(nodes))) for key, nodes in grouped.items()}


def label_for(node: ast.stmt, source: str) -> str:
    """The statement's first source line, shortened, for messages like `line 12: MODEL = Net()`."""
    segment = ast.get_source_segment(source, node) or ""
    first = segment.splitlines()[0] if segment else type(node).__name__
    return first if len(first) <= 60 else first[:57] + "..."


def line_numbers(lines: Iterable[int]) -> str:
    """Line numbers for a note, runs of consecutive lines joined (`598-605, 607, 609-615`): a parser's twenty
    `add_argument` lines read as one range, not twenty numbers."""
    runs: list[list[int]] = []
    for line in lines:
        if runs and line == runs[-1][-1] + 1:
            runs[-1].append(line)
        else:
            runs.append([line])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}, {run[1]}" if len(run) == 2 else f"{run[0]}-{run[-1]}"
                     for run in runs)
