"""What x leaves as it is: a statement it reaches only because it reads what the slice binds runs only if
a value it reads changed.

x runs an edited module statement with the ones that make what it uses and those that use what it makes
(statement_slice.py), as a fresh start would. In a script that builds its model at import, that slice
reaches `model = RNNModel(args.model, ntokens, args.emsize, ...)` as soon as any `parser.add_argument`
line changes, because the model reads `args`: running it would swap a new, untrained model in for the live
one when only `--clip` changed; `lr = args.lr` would undo the annealing training did; `torch.manual_seed`
would restart the random stream. A fresh start computes those lines from their inputs, so where the inputs
are what they were before x ran anything (`args.nhid` equal, `W_TARGET` the same shape and values, the
model an earlier line left alone), the line would compute what is already there, and x leaves it, with
what training did since. The statements the user edited always run; so do those that make what they use
(`parser = ArgumentParser()` before its `add_argument` lines run again), unless they would put a new object
in place of a live model, optimizer or LR scheduler: those too run only if what they read changed.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.engine.hotswap.patches import RunInNamespace, apply_all

_MISSING = object()
_PLAIN = (int, float, complex, str, bytes, bool, type(None), torch.device, torch.dtype)
_MAX_DEPTH = 4
_MAX_ITEMS = 256  # a longer list is data, compared as the same object or not


def inputs_of(node: ast.stmt) -> tuple[str, ...]:
    """The values a module statement reads, as dotted names (`args.nhid`, `ntokens`, `model` for
    `model.parameters()`), without looking into functions or classes it defines."""
    found: dict[str, None] = {}

    def chain(expr: ast.expr) -> str | None:
        parts: list[str] = []
        while isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        if isinstance(expr, ast.Name):
            return ".".join([expr.id, *reversed(parts)])
        return None

    def visit(expr: ast.AST) -> None:
        if isinstance(expr, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            return
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and chain(expr.func):
            visit(expr.func.value)  # `model.parameters()`: the model is the input, not a bound method made anew
            for part in (*expr.args, *expr.keywords):
                visit(part)
            return
        if isinstance(expr, ast.Attribute) and isinstance(expr.ctx, ast.Load) and (dotted := chain(expr)):
            found[dotted] = None
            return
        if isinstance(expr, ast.Name) and isinstance(expr.ctx, ast.Load):
            found[expr.id] = None
            return
        for child in ast.iter_child_nodes(expr):
            visit(child)

    visit(node)
    return tuple(found)


def read_input(namespace: dict[str, Any], dotted: str) -> Any:
    root, *attributes = dotted.split(".")
    value = namespace.get(root, _MISSING)
    for attribute in attributes:
        if value is _MISSING:
            break
        try:
            value = getattr(value, attribute)
        except Exception:  # noqa: BLE001 - a property that raises: unknown, so not the same as before
            return _MISSING
    return value


@dataclass(frozen=True)
class _Tensor:
    tensor: torch.Tensor
    version: int  # in-place writes (`W[0] = 5`) bump it: the same tensor object may hold other values


@dataclass(frozen=True)
class _Identity:
    obj: Any  # an object of no known kind: the same only if it is the very same object


def freeze(value: Any, depth: int = 0) -> Any:
    """What `value` is now, kept so a later comparison is not fooled by in-place changes (an override's
    `args.lr = ...` changes the same Namespace): plain data copied, a tensor with its version counter."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, torch.Tensor):
        return _Tensor(value, value._version)
    if depth >= _MAX_DEPTH:
        return _Identity(value)
    if isinstance(value, (tuple, list, dict)) and len(value) > _MAX_ITEMS:
        return _Identity(value)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(freeze(item, depth + 1) for item in value))
    if isinstance(value, dict):
        return (dict, tuple((key, freeze(item, depth + 1)) for key, item in value.items()))
    if isinstance(value, argparse.Namespace):
        return (argparse.Namespace, freeze(vars(value), depth + 1))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value), tuple((f.name, freeze(getattr(value, f.name), depth + 1)) for f in dataclasses.fields(value)))
    return _Identity(value)


def same_frozen(a: Any, b: Any) -> bool:
    """Two values `freeze` kept: the same input to a statement."""
    if type(a) is not type(b):
        return False
    if isinstance(a, _Identity):
        return a.obj is b.obj
    if isinstance(a, _Tensor):
        x, y = a.tensor, b.tensor
        if x is y:
            return a.version == b.version  # written in place since: its old values are gone, so say changed
        if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
            return False
        with torch.no_grad():
            return bool(torch.equal(x, y))
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same_frozen(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def same_value(before: Any, now: Any) -> bool:
    """Whether a fresh run of a statement would see the same input: equal plain data, equal tensors, the same
    object; anything else made anew (a new `Corpus`) counts as changed."""
    return same_frozen(freeze(before), freeze(now))


@dataclass
class RunUnlessSameInputs(RunInNamespace):
    """A statement of x's slice that runs only if one of its inputs changed by its turn; one that would put a new
    object in place of a live model, optimizer or scheduler (`kept`) never runs under x: a rebuild (R) runs it,
    carrying the trained weights over (import_builders.py), where x would drop them, and leave `setup()`'s state
    holding the old object beside the new global."""

    inputs: tuple[str, ...] = ()
    kept: str = ""  # the live model, optimizer or scheduler it would replace or change, with what each holds; or ""
    in_place: bool = False  # `kept` is what it reads and could change in place (`netG.apply(init)`), not replace
    edited: bool = False  # the user edited it (or the code it calls): it differs whatever its inputs are
    before: dict[str, Any] = field(default_factory=dict, init=False)
    changed: list[str] = field(default_factory=list, init=False)

    def capture(self) -> None:
        """Before x runs anything: the inputs as the live state has them."""
        self.before = {name: freeze(read_input(self.namespace, name)) for name in self.inputs}

    def apply(self) -> None:
        self.changed = [
            name for name in self.inputs
            if not same_frozen(self.before.get(name, _Identity(_MISSING)), freeze(read_input(self.namespace, name)))
        ]
        if self.changed and not self.kept:
            super().apply()
        else:
            self._saved = {}

    @property
    def ran(self) -> bool:
        return bool(self.changed) and not self.kept

    @property
    def for_rebuild(self) -> bool:
        """Left for R: it would make something new of a live model, optimizer or scheduler."""
        return bool(self.kept) and (self.edited or bool(self.changed))

    def outcome(self, label: str) -> str | None:
        """What x did with it, once applied: a note, or None for a plain line x left alone (listed together)."""
        if self.for_rebuild:
            why = "it was edited" if self.edited else f"{', '.join(self.changed)} changed"
            if self.in_place:
                return (f"left {label} for a rebuild: {why}, but it reads {self.kept}, and running it could change "
                        "it in place, losing what training did; R (command `rebuild`) runs it on what it builds anew, "
                        "then carries the trained weights and optimizer state over (until then the live one runs as "
                        "it is)")
            return (f"left {label} for a rebuild: {why}, but running it would put a new object in place of "
                    f"{self.kept} without what training did; R (command `rebuild`) runs it and carries the trained "
                    "weights and optimizer state over (until then the live one runs)")
        if self.changed:
            return f"ran {label} as {', '.join(self.changed)} changed"
        if self.kept and not self.in_place:
            return f"kept {self.kept}: {label} reads nothing x changed, so running it would only lose what training did"
        return None


def run_slice(statements: list[tuple[str, RunInNamespace]]) -> None:
    """Run a planned slice (x's, or a rebuild's import-time builders), all or nothing: each conditional line's
    inputs are taken first, as they are before any line runs."""
    for _, patch in statements:
        if isinstance(patch, RunUnlessSameInputs):
            patch.capture()
    apply_all([patch for _, patch in statements])


def ran(patch: RunInNamespace) -> bool:
    """Whether a line of a slice that `run_slice` applied did run."""
    return not isinstance(patch, RunUnlessSameInputs) or patch.ran
