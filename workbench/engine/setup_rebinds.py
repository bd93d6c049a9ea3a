"""Module globals that setup() re-binds, and what they were before it ran, so a rebuild's setup() reads what a
fresh start's would.

A fresh start runs the module's statements and then setup(); a rebuild runs setup() and, of the module's
statements, only those that build a live model or optimizer and those left for x. Trainers ported from
scripts keep their configuration in module globals and adjust it in setup() (nanoGPT's
`global gradient_accumulation_steps; gradient_accumulation_steps //= world_size`): a rebuild would read the
adjusted value and adjust it again (or fail the script's own assert), which no fresh start does. So the
values setup() found are kept, and put back before setup() runs again, except where a saved statement of
the file bound the name since (that value is the file's, as a fresh start would read it).

Only re-binding is seen: a global mutated in place (`CONFIG["lr"] *= 2`, a list appended to) is not. Values
that hold memory (tensors, modules, optimizers, arrays) are not kept: keeping the module's copy of a dataset
that setup() moved to the GPU would cost what a rebuild is there to save. Names setup() made (`global model`)
are not kept either: setup() binds them again, and keeping the last ones would keep the old state alive.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from workbench.engine.hotswap.deleted_names import RemoveDeleted
from workbench.engine.hotswap.patches import Patch, RunInNamespace

Namespaces = list[tuple[str, dict[str, Any]]]


def copies(namespaces: Namespaces) -> Namespaces:
    """The globals as they are now (shallow copies: the bindings, not the objects)."""
    return [(name, dict(namespace)) for name, namespace in namespaces]


def names_bound_by(patches: Iterable[Patch]) -> list[str]:
    """The module globals applying (or undoing) these patches binds or removes."""
    names: list[str] = []
    for patch in patches:
        if isinstance(patch, RunInNamespace):
            names.extend(patch.binds)
        elif isinstance(patch, RemoveDeleted):
            names.extend(deleted.name for deleted in patch.names)
    return names


class SetupRebinds:
    """{module: {name: value before setup()}} for the globals the last setup() re-bound."""

    def __init__(self) -> None:
        self._before: dict[str, dict[str, Any]] = {}
        # What the module's statements bind: its globals before the first setup() saw it, and those saved since.
        self._statement_names: dict[str, set[str]] = {}
        # {code version: {(module, name): value}}: what a save superseded, for a rollback of that save.
        self._superseded: dict[int, dict[tuple[str, str], Any]] = {}
        self._bound_since: dict[str, set[str]] = {}  # names saves and rollbacks bound since the last setup()
        self._bound_by_setup: dict[str, set[str]] = {}  # names the last setup() bound: made or re-bound

    def record(self, before: Namespaces, after: Namespaces) -> None:
        """After a setup() that succeeded: `before` are `copies()` taken just before it ran.

        Only names the module's statements bind are kept: those setup() made (`global model`) never are, then
        or at a later rebuild."""
        self._before, self._bound_since, self._bound_by_setup = {}, {}, {}
        now_by_module = dict(after)  # setup() may import modules: match by name, not position
        for module, old in before:
            now = now_by_module.get(module, {})
            self._bound_by_setup[module] = {name for name, value in now.items() if old.get(name, _ABSENT) is not value}
            statements = self._statement_names.setdefault(module, set(old))
            rebound = {
                name: value for name, value in old.items()
                if name in statements and name in now and now[name] is not value and not _holds_memory(value)
            }
            if rebound:
                self._before[module] = rebound

    def saved(self, version: int, module: str, names: Iterable[str]) -> None:
        """Code version `version` (a save) bound these names: the file's value is what a fresh start reads."""
        names = list(names)
        self._bound_since.setdefault(module, set()).update(names)
        if module in self._statement_names:  # else its first record() takes all it binds
            self._statement_names[module].update(names)
        kept = self._before.get(module, {})
        superseded = {(module, name): kept.pop(name) for name in names if name in kept}
        if superseded:
            self._superseded.setdefault(version, {}).update(superseded)
            for old in sorted(self._superseded)[:-_VERSIONS_KEPT]:
                del self._superseded[old]

    def rolled_back(self, version: int, module: str, names: Iterable[str]) -> None:
        """A rollback undid version `version`: its names are back to the values before it, and what setup()
        had found for them before that save is what it finds again."""
        superseded = self._superseded.pop(version, {})
        kept = self._before.setdefault(module, {})
        names = list(names)
        self._bound_since.setdefault(module, set()).update(names)
        for name in names:
            kept.pop(name, None)
            if (module, name) in superseded:
                kept[name] = superseded[(module, name)]

    def rebound_by_setup(self, module: str, names: Iterable[str]) -> list[str]:
        """Of `names` (a save binds them), those setup() re-binds: applied alone, the global would hold the file's raw
        value where a fresh start's holds what setup() makes of it (nanoGPT's accumulation steps per rank)."""
        kept = self._before.get(module, {})
        return [name for name in names if name in kept]

    def bound_by_setup(self, module: str, name: str) -> bool:
        """Whether the last setup() bound this global (`global loader; loader = ...`, over a `loader = None` or not): a
        rebuild's setup() binds it again, where what the module's statements alone bound stays as it is."""
        return name in self._bound_by_setup.get(module, ())

    def bound_since_setup(self) -> dict[str, set[str]]:
        """{module: names} that saved statements (or rollbacks) bound since setup() last ran: the file's values."""
        return self._bound_since

    def restore(self, namespaces: Namespaces, skip: set[tuple[str, str]] = frozenset()) -> list[str]:
        """Put the values setup() found back, before it runs again; returns `module.name` for each one changed
        but placeholders put back to None (`model = None` above a `global model`): too common to be news.

        `skip`: (module, name) pairs that changes committed with this rebuild bind (their values are the file's)."""
        restored: list[str] = []
        for module, namespace in namespaces:
            for name, value in self._before.get(module, {}).items():
                if (module, name) in skip or namespace.get(name, _ABSENT) is value:
                    continue
                namespace[name] = value
                if value is not None:
                    restored.append(f"{module}.{name}")
        return restored


_ABSENT = object()
_VERSIONS_KEPT = 200  # more than the rollback history holds (--history, 50 by default)


def _holds_memory(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)) or hasattr(value, "nbytes")
