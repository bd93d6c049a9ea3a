"""What x (command `run-statements`) runs for the module statements a save did not re-run, and what the
reload's notes say it will do.

The slice is statement_slice.py's: the statements named (edited, or calling changed code), those that make what
they use, and those that read what the slice binds, including what the project code they call reads (`model =
Net()` whose constructor reads `args`). Of those, the ones the user did not name run only if a value they read
changed by their turn (kept_objects.py), and none that would put a new object in place of a live model,
optimizer or scheduler runs under x at all: R runs those, carrying the trained weights over. Nor does one that
reads such an object and so could change it in place (`netG.apply(weights_init)` re-initialized a trained DCGAN
generator when x ran it): R runs it on what it builds anew, before the trained weights are carried over. The notes
name each such line and what it would replace or change.
"""

from __future__ import annotations

import ast
import builtins
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from workbench.engine.hotswap.compiling import compile_nodes
from workbench.engine.hotswap.construction import globals_read_by
from workbench.engine.hotswap.kept_objects import RunUnlessSameInputs, inputs_of
from workbench.engine.hotswap.patches import RunInNamespace
from workbench.engine.hotswap.scopes import line_numbers
from workbench.engine.hotswap.statement_slice import bound_names, line_label, read_names, rerun_slice, statement_key
from workbench.engine.state_walk import training_object

_CODE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)  # inputs not worth naming in a note


class StatementsForX:
    """For one file being planned: its live namespace, the project's other modules, the new source and how to
    compile a statement of it."""

    def __init__(self, live: dict[str, Any], others: list[dict[str, Any]], source: str, path: Path, flags: int) -> None:
        self.live, self.others, self.source, self.path, self.flags = live, others, source, path, flags
        self._training_objects: dict[str, str | None] = {}  # live globals checked for what training made
        self._globals_read: dict[str, list[str]] = {}  # project function or class -> module globals its code reads

    def plan(self, module: list[ast.stmt], named: list[ast.stmt]) -> tuple[list[tuple[str, RunInNamespace]], list[str]]:
        """(label, statement) for what x runs, in source order, and the notes that say so. `module`: the file's
        top-level statements; `named`: those the reload did not re-run and said so."""
        if not named:
            return [], []
        notes: list[str] = []
        edited = {statement_key(node) for node in named}
        picked = rerun_slice(module, named, lambda node: set(self._hidden_inputs(read_names(node)))) \
            or [(node, True) for node in named]
        # Lines x leaves for R are said below, one by one: not listed here as lines x runs.
        left = {statement_key(node) for node, _ in picked
                if statement_key(node) not in edited and (self._replaced_by([node]) or self._touched_by([node]))}
        makers = [node.lineno for node, always in picked
                  if always and statement_key(node) not in edited and statement_key(node) not in left]
        readers = [node.lineno for node, always in picked if not always and statement_key(node) not in left]
        if makers or readers:
            parts = [f"the statements that make what they use (line(s) {line_numbers(makers)})"] if makers else []
            if readers:
                parts.append(f"those that use what they make, where a value they read has changed by then "
                             f"(line(s) {line_numbers(readers)})")
            notes.append(f"x also runs, as a fresh start would, {' and '.join(parts)}")
        run: list[tuple[str, RunInNamespace]] = []
        left_in_place: list[int] = []
        touched_by_left: dict[str, None] = {}
        for node, always in picked:
            label = line_label(node, self.source)
            code, binds = compile_nodes((node,), self.path, self.flags), tuple(sorted(bound_names(node)))
            replaced = self._replaced_by([node])
            touched = [] if replaced else self._touched_by([node])
            is_edited = statement_key(node) in edited
            if always and not replaced and not touched:
                run.append((label, RunInNamespace(code, self.live, binds)))
                continue
            kept = " and ".join(replaced or touched)
            inputs = tuple(dict.fromkeys([*inputs_of(node), *self._hidden_inputs(inputs_of(node))]))
            shown = [name for name in inputs if self._worth_naming(name.split(".")[0], binds)]
            if replaced and not is_edited and shown:
                # One that reads nothing worth naming (`model = Outer(model)`) is left as it is unsaid: an LR edit gave
                # such a note for each statement that makes the model (an x-transformers trainer, ported).
                notes.append(
                    f"x leaves {label} as it is: it would put a new object in place of {kept}; if a value it reads "
                    f"has changed by then ({', '.join(shown)}), R (command `rebuild`) runs it with the "
                    "trained weights and optimizer state carried over"
                )
            elif touched and not is_edited:
                left_in_place.append(node.lineno)
                touched_by_left.update(dict.fromkeys(touched))
            run.append((label, RunUnlessSameInputs(
                code, self.live, binds, inputs=inputs, kept=kept, edited=is_edited, in_place=bool(touched))))
        if left_in_place:
            notes.append(
                f"x leaves line(s) {line_numbers(left_in_place)} as they are: they read "
                f"{' and '.join(touched_by_left)}, and running them could change it in place, losing what training "
                "did; if a value they read has changed by then, R (command `rebuild`) runs them on what it builds "
                "anew, then carries the trained weights and optimizer state over"
            )
        return run, notes

    def offer(self, nodes: list[ast.stmt]) -> str:
        """How a note about module statements that were not re-run ends: what x would do with them."""
        replaced = self._replaced_by(nodes)
        if replaced:
            return (
                f"it would put a new object in place of {' and '.join(replaced)}: press R (command `rebuild`) to run "
                "it with the trained weights and optimizer state carried over (x leaves it for R)"
            )
        touched = self._touched_by(nodes)
        if touched:
            return (
                f"it reads {' and '.join(touched)}, and running it could change it in place, losing what training "
                "did (x leaves it for R): press R (command `rebuild`) to build the live objects anew, running the "
                "script's import-time lines on them, and carry the trained weights and optimizer state over"
            )
        return "press x (command `run-statements`) to run it now (R runs it too, before it builds anything)"

    def _hidden_inputs(self, inputs: Iterable[str]) -> list[str]:
        """The module globals (not code) that the project functions and classes among `inputs` read when called,
        through the code they call (construction.py): `args` for `Net()` whose constructor reads `args.clip`."""
        modules = {str(ns.get("__name__")) for ns in (self.live, *self.others)}
        hidden: dict[str, None] = {}
        for name in inputs:
            root = name.split(".")[0]
            value = self.live.get(root)
            if not isinstance(value, (types.FunctionType, type)) or getattr(value, "__module__", None) not in modules:
                continue
            if root not in self._globals_read:
                self._globals_read[root] = [
                    read for read in globals_read_by(value, self.live, modules)
                    if read in self.live and not isinstance(self.live[read], _CODE)  # not builtins (`super`), not code
                ]
            hidden.update(dict.fromkeys(self._globals_read[root]))
        return list(hidden)

    def _worth_naming(self, root: str, binds: tuple[str, ...]) -> bool:
        """Whether an input is a value a user could have changed: not code, not a builtin (`enumerate`), not a name
        the statement binds itself (a `for` loop's `transformer_block`)."""
        if root in binds:
            return False
        value = self.live[root] if root in self.live else vars(builtins).get(root)
        return not isinstance(value, _CODE)

    def _training_object(self, name: str) -> str | None:
        """What training made that the live global `name` holds (state_walk.training_object), looked at once."""
        if name not in self._training_objects:
            self._training_objects[name] = training_object(self.live[name]) if name in self.live else None
        return self._training_objects[name]

    def _touched_by(self, nodes: list[ast.stmt]) -> list[str]:
        """The globals holding what training made that `nodes` read without binding anew (directly, or through the
        project code they call), each with what it holds: a call on them may change them in place. A `print(...)`
        only reads."""
        found: dict[str, None] = {}
        for node in nodes:
            if _only_prints(node):
                continue
            binds = bound_names(node)
            direct = inputs_of(node)
            for name in (*direct, *self._hidden_inputs(direct)):
                root = name.split(".")[0]
                if root not in binds and (what := self._training_object(root)):
                    found[f"`{root}`, {what}"] = None
        return list(found)

    def _replaced_by(self, nodes: list[ast.stmt]) -> list[str]:
        """The globals holding what training made that running `nodes` would bind anew, each with what it holds."""
        names = sorted({name for node in nodes for name in bound_names(node)})
        return [f"`{name}`, {what}" for name in names if (what := self._training_object(name))]


def _only_prints(node: ast.stmt) -> bool:
    """`print(model)`: a statement that only shows what it reads."""
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id == "print")
