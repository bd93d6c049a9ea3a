"""Random sequences of 1-5 saves (or as many as asked) over the project in project.py, reproducible from a seed.

A save edits one file the way people do: a value in a body, a constant, a
closure's body or what it captures, a decorator, a dataclass field, a method of
a live module; or only the layout (comment lines at the top, blank lines,
reordered definitions); a rename, a deletion, a revert to an earlier version of
the file, several of these at once, or a syntax error (always followed by a
valid save of that file, as an editor user would fix it). After a save a user
may press rebuild, or roll back.

`generate(seed, family="script")` makes the second family's sequences instead: a
script-style train.py (script.py), with the script's command-line arguments.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from differential.project import MODEL, SCALAR_NAMES, TRAIN, ModelSpec, Spec, TrainSpec

if TYPE_CHECKING:
    from differential.script import ScriptSequence

FAMILIES = ("two_file", "script", "script_import", "script_config")
SAVES = (1, 5)  # saves a sequence (`--saves 12-30` for long ones: notes, held changes and versions pile up)

VALUES = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0)
BOOLEAN = ("f_capture", "decorator_on", "inline_body", "extra_field", "inline_mix")
CHOICES: dict[str, tuple[str, ...]] = {
    "derived_expr": ("BASE * 2", "BASE * 3", "BASE + 1.0"),
    "double_expr": ("GAIN * 2", "GAIN + 1.0", "GAIN * 4"),
    "body_name": ("body", "body_fn"),
    "scale_name": ("make_scale", "make_factor"),
    "inner_name": ("f", "g"),
    "mix_name": ("_mix", "_blend"),
}
VALUE_FIELDS = {
    TRAIN: ("base", "derived_expr", "body_k", "f_k", "f_k", "f_capture", "dec_k", "decorated_k", "gen_k", "gen_k", "tag"),
    MODEL: ("gain", "double_expr", "bias", "bias", "extra_field", "total_k", "block_offset", "block_k", "gpt_shift", "mix_k", "helper_k"),
}
RENAMES = {TRAIN: ("body_name", "scale_name", "inner_name", "inner_name"), MODEL: ("mix_name",)}
DELETIONS = {TRAIN: ("inline_body",), MODEL: ("inline_mix",)}
OPS = {  # weights
    "value": 30, "layout": 12, "move": 10, "rename": 9, "delete": 7, "decorator": 4, "revert": 10, "mixed": 14, "syntax": 4,
}


@dataclass(frozen=True)
class Save:
    file: str
    text: str
    what: str  # what changed, for reports: "train.py: f_k 2.0 -> 3.0, header 0 -> 1"
    broken: bool = False  # a syntax error: the reload must fail and the old code keep running


@dataclass(frozen=True)
class RebuildNow:
    what: str = "rebuild (command `rebuild`)"


@dataclass(frozen=True)
class RollbackNow:
    what: str = "rollback (command `rollback`)"


Action = Save | RebuildNow | RollbackNow


@dataclass(frozen=True)
class Sequence:
    seed: int
    train: TrainSpec
    model: ModelSpec
    actions: tuple[Action, ...]
    family = "two_file"
    argv: tuple[str, ...] = ()  # the script's arguments: none for this family

    @property
    def scalar_names(self) -> dict[str, tuple[str, ...]]:
        return SCALAR_NAMES

    def initial_files(self) -> dict[str, str]:
        return {TRAIN: self.train.render(), MODEL: self.model.render()}


def describe_change(before: Spec, after: Spec) -> str:
    parts = [f"{f.name} {getattr(before, f.name)!r} -> {getattr(after, f.name)!r}" for f in fields(before)
             if getattr(before, f.name) != getattr(after, f.name)]
    return ", ".join(parts) or "no change"


def generate(seed: int, family: str = "two_file", saves: tuple[int, int] = SAVES) -> Sequence | ScriptSequence:
    """The sequence of `seed` in a project family: "two_file" (train.py and model.py, project.py), "script"
    (a script-style train.py, script.py), "script_import" (the same, its model built at import) or "script_config"
    (that, its layer count a default of a dataclass config made at import)."""
    if family in ("script", "script_import", "script_config"):
        from differential.script import generate_script

        return generate_script(seed, family, saves)
    if family != "two_file":
        raise ValueError(f"no project family {family!r}: {', '.join(FAMILIES)}")
    return _generate_two_file(seed, saves)


def _generate_two_file(seed: int, saves_between: tuple[int, int] = SAVES) -> Sequence:
    rng = random.Random(seed)
    specs: dict[str, Spec] = {TRAIN: TrainSpec(), MODEL: ModelSpec()}
    if rng.random() < 0.5:  # start from a varied project half of the time
        for file in (TRAIN, MODEL):
            for _ in range(rng.randint(0, 3)):
                specs[file] = _edit(rng, file, specs[file], rng.choice(("value", "move", "rename", "delete", "decorator")))
    start = dict(specs)
    versions: dict[str, list[Spec]] = {file: [spec] for file, spec in specs.items()}
    actions: list[Action] = []
    saves = rng.randint(*saves_between)
    forced: str | None = None  # after a syntax error, the next save fixes that file
    for index in range(saves):
        file = forced or (TRAIN if rng.random() < 0.6 else MODEL)
        op = rng.choices(list(OPS), weights=list(OPS.values()))[0]
        if forced and op == "syntax":
            op = "value"
        before = specs[file]
        if op == "revert":
            earlier = [v for v in versions[file] if v != before]
            after = rng.choice(earlier) if earlier else _edit(rng, file, before, "value")
            what = f"{file}: revert to an earlier version ({describe_change(before, after)})"
        else:
            after = _edit(rng, file, before, "value" if op == "syntax" else op)
            what = f"{file}: {op}: {describe_change(before, after)}"
        text = after.render()
        if op == "syntax":
            text, line = _break(rng, text)
            actions.append(Save(file, text, f"{file}: syntax error at line {line} (with {describe_change(before, after)})", True))
            forced = file
            continue
        forced = None
        specs[file] = after
        versions[file].append(after)
        actions.append(Save(file, text, what))
        if rng.random() < 0.3:
            actions.append(RebuildNow())
        elif rng.random() < 0.15:
            actions.append(RollbackNow())
        if index == saves - 1 and rng.random() < 0.2:
            actions.append(RollbackNow())
    return Sequence(seed, start[TRAIN], start[MODEL], tuple(actions))  # type: ignore[arg-type]


def _edit(rng: random.Random, file: str, spec: Spec, op: str) -> Spec:
    """One edit of the kind `op` (or 2-3 of them, for `mixed`); always a different spec."""
    for _ in range(20):
        if op == "mixed":
            new = spec
            for sub in rng.sample(("value", "layout", "move", "rename", "delete", "value"), rng.randint(2, 3)):
                new = _edit(rng, file, new, sub)
        elif op == "value":
            new = _flip(rng, spec, rng.choice(VALUE_FIELDS[file]))
        elif op == "layout":
            new = replace(spec, header=rng.choice([h for h in range(4) if h != spec.header])) if rng.random() < 0.7 \
                else replace(spec, gap=rng.choice([g for g in range(3) if g != spec.gap]))
        elif op == "move":
            new = _move(rng, spec)
        elif op == "rename":
            new = _flip(rng, spec, rng.choice(RENAMES[file]))
        elif op == "delete":
            new = _flip(rng, spec, rng.choice(DELETIONS[file]))
        elif op == "decorator":
            new = _flip(rng, spec, "decorator_on") if file == TRAIN else _flip(rng, spec, "extra_field")
        else:
            raise ValueError(op)
        if new != spec:
            return new
    return spec


def _flip(rng: random.Random, spec: Spec, name: str) -> Spec:
    current = getattr(spec, name)
    if name in BOOLEAN:
        return replace(spec, **{name: not current})
    options = CHOICES.get(name, VALUES)
    return replace(spec, **{name: rng.choice([v for v in options if v != current])})


def _move(rng: random.Random, spec: Spec) -> Spec:
    if isinstance(spec, ModelSpec) and rng.random() < 0.5:
        methods = list(spec.methods)
        rng.shuffle(methods)
        return replace(spec, methods=tuple(methods))
    order = list(spec.order)
    rng.shuffle(order)
    return replace(spec, order=tuple(order))


def _break(rng: random.Random, text: str) -> tuple[str, int]:
    """The text with a line that cannot parse inside one of its functions; and that line's number."""
    lines = text.splitlines(keepends=True)
    defs = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ")]
    at = rng.choice(defs)
    indent = len(lines[at]) - len(lines[at].lstrip()) + 4
    lines.insert(at + 1, " " * indent + "y = = 1\n")
    return "".join(lines), at + 2
