"""Which module statements to run again so an edited one means what it means in a fresh start.

Scripts build objects step by step at import: `parser = ArgumentParser()`, then
`parser.add_argument(...)` a few times, then `args = parser.parse_args()`, then
`BATCH = args.batch_size`. Running only the edited `add_argument` line again on
the live parser fails ("conflicting option string"), and would not reach `args`
anyway. The statements to run are the edited ones, the statements that made the
objects they use (the latest binding of each name they read, when that binding
calls code), and every later statement that reads what those bind: a slice of
the module, in source order.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable

from workbench.engine.hotswap.scopes import label_for

# Top-level statements that define rather than compute: never run again by x, R or a rollback.
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)


def line_label(node: ast.stmt, source: str) -> str:
    """How a note names a top-level statement (`line 9: ...` and the start of its text), and for an override run
    with its default, that default's line too."""
    label = f"line {node.lineno}: `{label_for(node, source)}`"
    if isinstance(node, OverrideWithDefault):
        defaults = ", ".join(f"line {default.lineno}: `{label_for(default, source)}`" for default in node.defaults)
        label += f" (with its default{'s' if len(node.defaults) > 1 else ''} first, {defaults})"
    return label


def statement_key(node: ast.stmt) -> tuple[int, int]:
    """Where a top-level statement starts in the file, which names it across the copies of its node that line
    shifts make (`SourceStatement.current_node()`); `id(node)` does not, and a freed copy's id is reused."""
    return node.lineno, node.col_offset


def statement_text(node: ast.stmt) -> str:
    """A top-level statement as its code, wherever it sits (`ast.dump` leaves positions out): what names a
    statement left for x across later saves, which shift lines and re-parse the file."""
    return ast.dump(node)


def bound_names(node: ast.stmt) -> set[str]:
    """Module names a top-level statement binds (its own scope only)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    names: set[str] = set()
    for sub in _own_scope(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            names.add(sub.id)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in sub.names)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(sub.name)
    return names


def read_names(node: ast.stmt) -> set[str]:
    """Module names a top-level statement reads (not those read inside functions it defines)."""
    return {sub.id for sub in _own_scope(node) if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load)}


def calls_code(node: ast.stmt) -> bool:
    return any(isinstance(sub, (ast.Call, ast.Await)) for sub in _own_scope(node))


def sets_globals_it_does_not_name(node: ast.stmt) -> bool:
    """`exec(open("configurator.py").read())` (nanoGPT's overrides), `globals().update(cfg)`: a statement
    that can bind any module name without naming it."""
    for sub in ast.walk(node):
        if not isinstance(sub, ast.Call):
            continue
        func = sub.func
        if isinstance(func, ast.Name) and func.id == "exec":
            return True
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "update"
            and isinstance(func.value, ast.Call)
            and isinstance(func.value.func, ast.Name)
            and func.value.func.id in ("globals", "vars")
        ):
            return True
    return False


def _own_scope(node: ast.AST) -> Iterable[ast.AST]:
    """Every node of a statement, without descending into function or class bodies."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if current is not node and isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(current))


def rerun_slice(
    module: list[ast.stmt],
    edited: list[ast.stmt],
    hidden_reads: Callable[[ast.stmt], set[str]] = lambda node: set(),
    with_makers: bool = True,
) -> list[tuple[ast.stmt, bool]]:
    """The statements of `module` (a file's top-level statements, in order) to run for the `edited` ones, each
    with whether it is one of them or makes what they use (True), or only reads what the slice binds (False:
    worth running only if what it reads turns out to differ, kept_objects.py).
    `hidden_reads`: the module names a statement reads through the code it calls (`model = Net()` whose
    constructor reads `args`), which its own text does not show. `with_makers=False`: the objects the edited
    statements use stay as they are (a rebuild remakes the model, not the `args` it is built from)."""
    position = {statement_key(node): i for i, node in enumerate(module)}
    chosen: set[int] = set()
    for node in edited:
        index = position.get(statement_key(node))
        if index is None:
            continue
        chosen.add(index)
        for name in read_names(node) if with_makers else ():
            maker = _latest_binding(module, index, name)
            if maker is not None and calls_code(module[maker]):
                chosen.add(maker)  # the object this statement uses was made by code: make it again
    if not chosen:
        return []
    tainted: set[str] = set()
    picked: dict[int, bool] = {}
    for i in range(min(chosen), len(module)):
        node = module[i]
        if i in chosen or (not isinstance(node, DEFINITIONS) and (read_names(node) | hidden_reads(node)) & tainted):
            picked[i] = i in chosen
            tainted |= bound_names(node)
    fused: dict[int, ast.stmt] = {}
    for override, defaults in _defaults_of_overrides(module, list(picked)).items():
        unit = None
        if not picked[override] and not any(default in picked for default in defaults):
            unit = _override_with_defaults(module[override], [module[default] for default in defaults])
        if unit is None:  # the override runs anyway, or a default does: every default runs again, then the override
            for index in (*defaults, override):
                picked[index] = True
        else:
            fused[override] = unit  # all of them run, at the override's turn, only if what it reads has changed
    return [(fused.get(i, module[i]), picked[i]) for i in sorted(picked)]


def _defaults_of_overrides(module: list[ast.stmt], picked: list[int]) -> dict[int, list[int]]:
    """For each picked `if`, the plain assignments that give a default to what it may bind (`batch_size = 8` before
    `if args.batch_size is not None: batch_size = args.batch_size`), in file order: an override that no longer fires
    must leave the file's defaults, as a fresh start does, not the values it bound last time."""
    found: dict[int, list[int]] = {}
    for i in picked:
        if not isinstance(module[i], ast.If):
            continue
        defaults = set()
        for name in bound_names(module[i]):
            default = _latest_binding(module, i, name)
            if default is not None and not calls_code(module[default]) and not isinstance(module[default], ast.If):
                defaults.add(default)
        if defaults:
            found[i] = sorted(defaults)
    return found


def _override_with_defaults(override: ast.stmt, defaults: list[ast.stmt]) -> ast.stmt | None:
    """`if C: B else: E` as `if C: defaults; B else: defaults; E`, at the override's place: one statement that gives
    the file's defaults and lets the override change them, run only where what it reads changed. Picked only because
    it reads a changed value (`args`), the override and its defaults were run whatever happened, and with them what
    such an `if` does beside binding (llm.c's `if args.output_dir:` opens its log with "w": x of an unrelated flag
    wiped the log). None where the test reads a default's own name: the fused form would read it before it is given."""
    assert isinstance(override, ast.If)
    given = set().union(*(bound_names(default) for default in defaults))
    if {n.id for n in ast.walk(override.test) if isinstance(n, ast.Name)} & given:
        return None
    unit = OverrideWithDefault(test=override.test, body=[*defaults, *override.body], orelse=[*defaults, *override.orelse])
    unit.defaults = defaults
    return ast.copy_location(unit, override)


class OverrideWithDefault(ast.If):
    """An override run with the defaults it overrides (`_override_with_defaults`): its label names their lines."""

    defaults: list[ast.stmt]


def _latest_binding(module: list[ast.stmt], before: int, name: str) -> int | None:
    for i in range(before - 1, -1, -1):
        node = module[i]
        if name in bound_names(node):
            return None if isinstance(node, DEFINITIONS) else i
    return None
