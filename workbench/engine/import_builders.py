"""A rebuild builds what a script builds at import too, not only what setup() returns.

Many ported scripts keep their model where the original had it, at the top of the file:
`model = RNNModel(args.model, ntokens, ...)` runs once at import, and `setup()` returns that global.
A rebuild (R) ran only `setup()`, which handed back the same object: after an edit of `RNNModel.__init__`
the rebuild reported success while the live model kept what the old constructor built. So a rebuild first
runs again, in the file's order, the module statements that bind a global holding a live model, optimizer
or LR scheduler (and, where a value they read changed by then, the statements that read what those bind,
kept_objects.py), with initialization skipped like setup()'s; the weights are then carried over from the
old objects by name, as for what setup() builds.

It also runs again the statement that made a global holding an instance of old code: of a class whose
constructor or dataclass fields the change being built changed, or of a class a reload made again
(`config = ModelConfig(...)`, makemore's, after its dataclass's defaults changed); else the model was built
again from the old config, while the reload had named `train.config` among what needed the rebuild. And the
statement that made, at import, a global holding a DataLoader whose worker processes run code a save changed
since (`batch_loader = InfiniteDataLoader(train_dataset, num_workers=4)`, makemore's): those workers were
forked with the old code and keep it for as long as their iterator lives, which may be the whole run.
"""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path
from typing import Any

from workbench.engine.hotswap.kept_objects import RunUnlessSameInputs, inputs_of
from workbench.engine.hotswap.patches import RunInNamespace
from workbench.engine.hotswap.compiling import compile_nodes, future_flags
from workbench.engine.hotswap.planner import is_main_guard
from workbench.engine.hotswap.statement_slice import DEFINITIONS, bound_names, calls_code, line_label, rerun_slice
from workbench.engine.hotswap.syntax_trees import parse
from workbench.engine.state_walk import NOT_STATE, training_object



def plan_import_builders(module: types.ModuleType, source: str, path: Path,
                         also: frozenset[str] = frozenset()) -> list[tuple[str, RunInNamespace]]:
    """(label, statement) for what a rebuild runs again in `module`, whose file holds `source`, in source order.
    `also`: globals whose statements run again too (a loader whose workers run old code, loader_workers.py)."""
    namespace = module.__dict__
    try:
        body = parse(source, str(path)).body
    except SyntaxError:
        return []  # the live code is what was applied, so this is not expected; nothing to run again then
    builders = [
        node for node in body
        if _may_build(node) and any(
            name in also or (name in namespace and training_object(namespace[name])) for name in bound_names(node))
    ]
    if not builders:
        return []
    flags = future_flags(body)
    planned: list[tuple[str, RunInNamespace]] = []
    for node, always in rerun_slice(body, builders, with_makers=False):
        if is_main_guard(node):
            continue
        label = line_label(node, source)
        code, binds = compile_nodes((node,), path, flags), tuple(sorted(bound_names(node)))
        if always:
            planned.append((label, RunInNamespace(code, namespace, binds)))
        else:
            planned.append((label, RunUnlessSameInputs(code, namespace, binds, inputs=inputs_of(node))))
    return planned


def built_by_old_code(module: types.ModuleType, changed_classes: tuple[type, ...],
                      project_modules: frozenset[str]) -> frozenset[str]:
    """The globals of `module` that hold an instance of one of `changed_classes` (whose constructor or fields changed),
    or of a project class (of `project_modules`) that is no longer the one its module binds under its name (a
    dataclass a reload made again)."""
    found: set[str] = set()
    for name, value in list(vars(module).items()):
        if name.startswith("__") or isinstance(value, NOT_STATE):
            continue
        cls = type(value)
        if isinstance(value, changed_classes) or (cls.__module__ in project_modules and _class_replaced(cls)):
            found.add(name)
    return frozenset(found)


def _class_replaced(cls: type) -> bool:
    module = sys.modules.get(cls.__module__)
    if module is None or "<locals>" in cls.__qualname__:
        return False
    current: Any = module
    for part in cls.__qualname__.split("."):
        current = getattr(current, part, None)
        if current is None:
            return False
    return isinstance(current, type) and current is not cls


def _may_build(node: ast.stmt) -> bool:
    return not isinstance(node, DEFINITIONS) and not is_main_guard(node) and calls_code(node)


def builders_by_name(source: str, path: Path) -> dict[str, str]:
    """For each global a module statement makes by calling code, the label of the last such statement (what a
    rebuild would run again for it). Globals setup() or a function binds, or plain values, are not in it."""
    try:
        body = parse(source, str(path)).body
    except SyntaxError:
        return {}
    return {name: line_label(node, source)
            for node in body if _may_build(node) for name in bound_names(node)}


def built_again_note(relative: str, ran: list[str]) -> str:
    return (
        f"ran again what {relative} builds at import, so the new code builds it too: {'; '.join(ran)} "
        "(its weights and optimizer state were carried over like those setup() builds)"
    )
