"""What three hot-reload tools do with the edits a PyTorch user makes to a live training session.

Each case copies the small project in bench/edit_kinds/ (train.py, model.py,
other.py) to a temp folder, imports it, builds the live objects (setup(): a
model with a forward hook, an SGD optimizer with momentum, a suspended data
generator, closures and a lambda kept in the state), runs a few steps, saves
ONE edit, runs a few more steps, and then checks the live objects:

    applied          the live objects now behave per the new code, and the state is intact
    reported         the tool refused the edit or said what it did not apply, and nothing is wrong
    silently stale   no report, but live objects (or some of them) still run the old code
    silently wrong   no report, but the live state is inconsistent (fresh weights, a forward that
                     uses an attribute the live instance never got, step() deleted, ...)
    wrong, noted     the state is inconsistent, although the tool did log a note about the edit
    error            the tool itself crashed

Tools:
  vram-bench         in-process Session (training thread, watcher, reload thread), as in the README
  IPython            IPython.extensions.autoreload.ModuleReloader, `%autoreload 2` settings
  jurigged           jurigged.register.Registry + CodeFile.refresh(), what jurigged's watcher runs on a save

The verdict comes only from calling the live objects; nothing is hard-coded per tool.

    python bench/edit_kinds.py                    # the markdown table (about a minute)
    python bench/edit_kinds.py --json out.json    # also the raw results
    python bench/edit_kinds.py --cases lr,forward --tools vram-bench
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import io
import json
import os
import platform
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).resolve().parent / "edit_kinds"
TOOLS = ("vram-bench", "ipython", "jurigged")
TOOL_TITLES = {"vram-bench": "vram-bench", "ipython": "IPython autoreload", "jurigged": "jurigged"}
PROJECT_MODULES = ("train", "model", "other")
STEPS_AFTER = 3
STALL_SECONDS = 60.0  # no result for this long: the case hung; the worker is killed and restarted

# --------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Verdict:
    """What the live objects show after the edit: new | old | partial | wrong."""

    kind: str
    reason: str


_MISSING = "<missing>"


def _call(obj: Any, name: str, *args: Any) -> Any:
    """obj.name(*args), or "<missing>" when obj has no such attribute (an edit not applied)."""
    fn = getattr(obj, name, None)
    return _MISSING if fn is None else fn(*args)


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001
        return False


def probe(probes: dict[str, Callable[[], Any]], old: Any, new: Any) -> Verdict:
    """Evaluate every way the code can be reached; all new -> new, all old -> old, a mix -> partial."""
    seen: dict[str, tuple[str, str]] = {}
    for label, fn in probes.items():
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - a probe that raises is an observation
            seen[label] = ("raises", f"{label} raises {type(exc).__name__}: {exc}")
            continue
        if _same(value, new):
            seen[label] = ("new", f"{label} -> {value!r}")
        elif _same(value, old):
            seen[label] = ("old", f"{label} -> {value!r} (old)")
        else:
            seen[label] = ("other", f"{label} -> {value!r} (expected {new!r} or old {old!r})")
    kinds = {kind for kind, _ in seen.values()}
    text = "; ".join(desc for _, desc in seen.values())
    if kinds <= {"new"}:
        return Verdict("new", text)
    if kinds & {"raises", "other"}:
        return Verdict("wrong", "; ".join(desc for kind, desc in seen.values() if kind in ("raises", "other")))
    if kinds == {"old"}:
        return Verdict("old", text)
    return Verdict("partial", text)


# --------------------------------------------------------------------------- the live session, as a check sees it


@dataclass
class Live:
    """The live objects after the edit: the state setup() returned and the project's modules."""

    root: Path
    state: dict[str, Any]
    modules: Callable[[], dict[str, types.ModuleType]]
    before: dict[str, Any] = field(default_factory=dict)

    @property
    def mod(self) -> types.ModuleType:
        return self.modules()["train"]

    @property
    def mm(self) -> types.ModuleType:
        return self.modules()["model"]

    @property
    def other(self) -> types.ModuleType:
        return self.modules()["other"]

    @property
    def model(self) -> Any:
        return self.state["model"]

    def held(self, module: str, name: str) -> Any:
        """The object `module.name` was before the edit: what anyone holding a reference still calls."""
        return self.before["namespaces"][module][name]

    def source(self, name: str) -> str:
        return (self.root / f"{name}.py").read_text(encoding="utf-8")


def capture(live: Live) -> dict[str, Any]:
    """Everything the checks compare against, taken just before the edit is saved."""
    state = live.state
    model, opt = state["model"], state["opt"]
    params = list(model.parameters())
    return {
        "state": state,
        "model": model,
        "opt": opt,
        "params": params,
        "momentum": [opt.state.get(p, {}).get("momentum_buffer") for p in params],
        "cfg": state["cfg"],
        "data": state["data"],
        "steps": state["steps"],
        "namespaces": {name: dict(vars(module)) for name, module in live.modules().items()},
        "sources": {name: live.source(name) for name in PROJECT_MODULES},
    }


def integrity(live: Live) -> list[str]:
    """Ways the live training state is no longer the one setup() built and training has been updating."""
    before, state = live.before, live.state
    problems = []
    if state is not before["state"]:
        problems.append("the training state was replaced")
    model, opt = state.get("model"), state.get("opt")
    if model is not before["model"]:
        problems.append("state['model'] is a new object")
    elif [id(p) for p in model.parameters()] != [id(p) for p in before["params"]]:
        problems.append("the live model's parameters are new objects")
    if opt is not before["opt"]:
        problems.append("state['opt'] is a new object")
    else:
        held = [id(p) for g in opt.param_groups for p in g["params"]]
        if held != [id(p) for p in before["params"]]:
            problems.append("the optimizer no longer holds the model's parameters")
        momentum = [opt.state.get(p, {}).get("momentum_buffer") for p in before["params"]]
        if any(a is not b for a, b in zip(momentum, before["momentum"])):
            problems.append("the optimizer's momentum buffers were replaced")
    if state.get("cfg") is not before["cfg"] or state.get("data") is not before["data"]:
        problems.append("objects in the state were replaced")
    if state.get("steps", 0) < before["steps"]:
        problems.append("the state's step counter went back")
    try:
        mm = live.mm
        if model is not None and type(model) is not getattr(mm, "Net", None):
            problems.append("model.Net is now another class than the live model's, so isinstance(live model, Net) is False")
        if type(state.get("cfg")) is not getattr(mm, "Config", None):
            problems.append("model.Config is now another class than the live config's")
    except KeyError:
        problems.append("model.py is no longer a loaded module")
    return problems


# --------------------------------------------------------------------------- the cases


Edit = tuple[str, str] | Callable[[str], str]


@dataclass(frozen=True)
class Case:
    id: str
    title: str
    file: str  # the file the edit saves: "train", "model"
    edits: tuple[Edit, ...]
    check: Callable[[Live], Verdict]
    before: tuple[tuple[str, str, str], ...] = ()  # (file, old, new): the starting point, when not the fixture
    about: tuple[str, ...] = ()  # a tool's note counts as reporting this edit only if it names one of these


def apply_edits(text: str, edits: tuple[Edit, ...], where: str) -> str:
    for edit in edits:
        if callable(edit):
            text = edit(text)
            continue
        old, new = edit
        count = text.count(old)
        if count != 1:
            raise AssertionError(f"{where}: {old!r} occurs {count} times, expected once")
        text = text.replace(old, new)
    return text


def _no_grad(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        import torch

        with torch.no_grad():
            return fn()

    return run


def _x() -> Any:
    import torch

    return torch.ones(2, 4)


def _forward_kind(model: Any) -> str:
    """Which forward the live model runs: old (lin(x)) or new (lin(x) * 2)."""
    import torch

    x = _x()
    out, lin = model(x), model.lin(x)
    if torch.allclose(out, lin * 2):
        return "new"
    if torch.allclose(out, lin):
        return "old"
    return f"neither: {out.flatten().tolist()}"


def _boom_line(fn: Callable[[], Any]) -> Any:
    try:
        fn()
    except ValueError as exc:
        return traceback.extract_tb(exc.__traceback__)[-1].lineno
    return "did not raise"


def _line_of(source: str, needle: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if needle in line)


def check_moved(L: Live) -> Verdict:
    needle = 'raise ValueError("boom")'
    old, new = _line_of(L.before["sources"]["train"], needle), _line_of(L.source("train"), needle)
    return probe(
        {"traceback line of train.boom()": lambda: _boom_line(L.mod.boom), "of a held reference": lambda: _boom_line(L.held("train", "boom"))},
        old,
        new,
    )


def check_init_forward(L: Live) -> Verdict:
    import torch

    model = L.model
    with torch.no_grad():
        try:
            out = model(_x())
        except Exception as exc:  # noqa: BLE001
            return Verdict("wrong", f"the live model's forward raises {type(exc).__name__}: {exc} (the new forward uses "
                                    "self.gate, which the old __init__ never set on the live instance)")
        lin = model.lin(_x())
        gate = getattr(model, "gate", None)
        if torch.allclose(out, lin) and gate is None:
            return Verdict("old", "the live model still runs the old forward and has no gate")
        if isinstance(gate, torch.nn.Parameter) and torch.allclose(out, lin * gate):
            opt_params = {id(p) for g in L.state["opt"].param_groups for p in g["params"]}
            if id(gate) not in opt_params:
                return Verdict("wrong", "the live model got a gate parameter, but the optimizer does not train it")
            return Verdict("new", "the live model has a trained gate parameter and the new forward uses it")
    return Verdict("wrong", f"the live model's forward returns {out.flatten().tolist()}, neither old nor new")


def check_model_statement(L: Live) -> Verdict:
    if L.mod.MODEL is not L.state["model"]:
        return Verdict("wrong", "`MODEL = Net(d=4)` was re-run: train.MODEL is a fresh Net with new weights, while the "
                                "state and the optimizer keep training the old one")
    return Verdict("old", "`MODEL = ...` was not re-run: train.MODEL is still the live model")


def check_bases(L: Live) -> Verdict:
    return probe(
        {
            "live model is a Mixin": lambda: isinstance(L.model, L.mm.Mixin) and L.model.mixin_tag() == "mixin",
            "new Net() is a Mixin": lambda: issubclass(L.mm.Net, L.mm.Mixin),
        },
        False,
        True,
    )


def check_dataclass(L: Live) -> Verdict:
    if L.state["cfg"].depth != 2:
        return Verdict("wrong", f"the live config's depth changed to {L.state['cfg'].depth!r}: data was overwritten")
    return probe({"train.Config().depth": lambda: L.mod.Config().depth, "model.Config().depth": lambda: L.mm.Config().depth}, 2, 3)


def check_setup(L: Live) -> Verdict:
    patched = "new" in L.mod.setup.__code__.co_consts
    tag = L.state.get("setup_tag")
    if tag == "new":
        return Verdict("new", "the live state shows the new setup()")
    return Verdict("old", f"setup() already ran: the live state was built by the old one (train.setup now has "
                          f"{'the new' if patched else 'the old'} code; nothing re-ran it)")


def check_syntax_error(L: Live) -> Verdict:
    ran = L.state["steps"] - L.before["steps"]
    step = getattr(L.mod, "step", None)
    if step is None:
        return Verdict("wrong", "train.step is gone from the live module")
    if ran < STEPS_AFTER:
        return Verdict("wrong", f"only {ran} steps ran after the save")
    if L.mod.step is not L.held("train", "step") or L.mod.step.__code__ is not L.before["step_code"]:
        return Verdict("wrong", "train.step was replaced although the file does not compile")
    return Verdict("old", f"the old code keeps running ({ran} steps after the save)")


def check_step_removed(L: Live) -> Verdict:
    step = getattr(L.mod, "step", None)
    if step is None:
        return Verdict("wrong", "step() was deleted from the live module, so the training loop cannot go on")
    ran = L.state["steps"] - L.before["steps"]
    if ran < STEPS_AFTER:
        return Verdict("wrong", f"only {ran} steps ran after the save")
    return Verdict("old", f"the old step() keeps running ({ran} steps after the save)")


def _step_end(text: str) -> str:
    return text + '\n\ndef brand_new():\n    return "new"\n'


def _move_boom(text: str) -> str:
    block = 'def boom():\n    raise ValueError("boom")\n\n\n'
    assert text.count(block) == 1
    return text.replace(block, "") + '\n\ndef boom():\n    raise ValueError("boom")\n'


def _remove_step(text: str) -> str:
    start = text.index("def step(state, bench):")
    return text[:start].rstrip() + "\n"


def _held_and_module(L: Live, name: str, *args: Any, module: str = "train") -> dict[str, Callable[[], Any]]:
    return {
        f"{module}.{name}({', '.join(map(repr, args))})": lambda: getattr(L.modules()[module], name)(*args),
        "a reference held from before": lambda: L.held(module, name)(*args),
    }


def _instance(L: Live, fn: Callable[[Any], Any]) -> dict[str, Callable[[], Any]]:
    return {"live model": lambda: fn(L.model), "a new Net()": lambda: fn(L.mm.Net())}


CASES: tuple[Case, ...] = (
    Case("function", "function body", "train", (("def helper(x):\n    return x * 2", "def helper(x):\n    return x * 3"),),
         lambda L: probe(_held_and_module(L, "helper", 2), 4, 6)),
    Case("default", "default argument", "train", (("def scaled(x, factor=2):", "def scaled(x, factor=3):"),),
         lambda L: probe(_held_and_module(L, "scaled", 1), 2, 3)),
    Case("kwdefault", "keyword-only default", "train", (("def kw_only(x, *, k=2):", "def kw_only(x, *, k=3):"),),
         lambda L: probe({"train.kw_only(1)": lambda: L.mod.kw_only(1), "a reference held from before": lambda: L.held("train", "kw_only")(1)}, 2, 3)),
    Case("moved", "function only moved (traceback line)", "train", (_move_boom,), check_moved),
    Case("method", "method body, live instance", "model",
         (('def label(self):\n        return "old"', 'def label(self):\n        return "new"'),),
         lambda L: probe(_instance(L, lambda m: m.label()), "old", "new")),
    Case("forward", "`forward` of a live nn.Module", "model",
         (("def forward(self, x):\n        return self.lin(x)\n", "def forward(self, x):\n        return self.lin(x) * 2\n"),),
         lambda L: probe({"live model(x)": _no_grad(lambda: _forward_kind(L.model)), "a new Net()(x)": _no_grad(lambda: _forward_kind(L.mm.Net()))}, "old", "new")),
    Case("super", "method using `super()`", "model", (('return "old+" + super()', 'return "new+" + super()'),),
         lambda L: probe(_instance(L, lambda m: m.label_super()), "old+base", "new+base")),
    Case("staticmethod", "staticmethod", "model",
         (('def smethod():\n        return "old"', 'def smethod():\n        return "new"'),),
         lambda L: probe({"live model.smethod()": lambda: L.model.smethod(), "model.Net.smethod()": lambda: L.mm.Net.smethod()}, "old", "new")),
    Case("classmethod", "classmethod", "model", (('return "old:" + cls.__name__', 'return "new:" + cls.__name__'),),
         lambda L: probe({"live model.cmethod()": lambda: L.model.cmethod(), "model.Net.cmethod()": lambda: L.mm.Net.cmethod()}, "old:Net", "new:Net")),
    Case("property", "property", "model", (('def prop(self):\n        return "old"', 'def prop(self):\n        return "new"'),),
         lambda L: probe(_instance(L, lambda m: m.prop), "old", "new")),
    Case("added_method", "added method", "model",
         (("    @staticmethod\n    def smethod", '    def added(self):\n        return "new"\n\n    @staticmethod\n    def smethod'),),
         lambda L: probe(_instance(L, lambda m: _call(m, "added")), _MISSING, "new")),
    Case("removed_method", "removed method", "model", (('    def legacy(self):\n        return "legacy"\n\n', ""),),
         lambda L: probe(_instance(L, lambda m: hasattr(m, "legacy")), True, False)),
    Case("class_attr", "class attribute", "model", (('KIND = "old"', 'KIND = "new"'),),
         lambda L: probe(_instance(L, lambda m: m.KIND), "old", "new")),
    Case("no_grad", "`@torch.no_grad()` function body", "train",
         (('return ("old", torch.is_grad_enabled())', 'return ("new", torch.is_grad_enabled())'),),
         lambda L: probe(_held_and_module(L, "no_grad_fn"), ("old", False), ("new", False))),
    Case("wraps", "`functools.wraps` decorator chain", "train",
         (('def wrapped_fn():\n    return "old"', 'def wrapped_fn():\n    return "new"'),),
         lambda L: probe(_held_and_module(L, "wrapped_fn"), "old", "new")),
    Case("decorators", "decorator list changed", "train", (("@logged\ndef greet():", "@logged\n@shout\ndef greet():"),),
         lambda L: probe(_held_and_module(L, "greet"), "hi", "HI")),
    Case("nested", "nested helper (inner function) body", "train",
         (("def inner(y):\n        return y + 1", "def inner(y):\n        return y + 2"),),
         lambda L: probe(_held_and_module(L, "outer", 1), 2, 3)),
    Case("closure_vars", "closure in state, captured variables change", "train",
         (("def make_schedule(base):\n    def schedule(step):\n        return base\n",
           "def make_schedule(base):\n    warmup = 10\n\n    def schedule(step):\n        return base * min(1.0, step / warmup)\n"),),
         lambda L: probe({"state['schedule'](5)": lambda: L.state["schedule"](5), "train.make_schedule(0.5)(5)": lambda: L.mod.make_schedule(0.5)(5)}, 0.5, 0.25)),
    Case("closure_body", "closure in state, body only (same captured variables)", "train",
         (("def scale(x):\n        return x * k\n", "def scale(x):\n        return x * k + 1\n"),),
         lambda L: probe({"state['scaler'](1)": lambda: L.state["scaler"](1), "train.make_scaler(2)(1)": lambda: L.mod.make_scaler(2)(1)}, 2, 3)),
    Case("imported", "function imported elsewhere (`from train import shared`)", "train",
         (('def shared():\n    return "old"', 'def shared():\n    return "new"'),),
         lambda L: probe({"other.use_shared()": lambda: L.other.use_shared(), "other.shared()": lambda: L.other.shared(),
                          "train.shared()": lambda: L.mod.shared()}, "old", "new")),
    Case("lambda", "lambda stored in the state", "train", (("ACT = lambda t: t + 1", "ACT = lambda t: t + 2"),),
         lambda L: probe({"state['act'](0)": lambda: L.state["act"](0), "train.ACT(0)": lambda: L.mod.ACT(0)}, 1, 2)),
    Case("hook", "registered forward hook body", "model", (('module.hook_seen = "old"', 'module.hook_seen = "new"'),),
         lambda L: probe({"hook run by the live model": _no_grad(lambda: (L.model(_x()), L.model.hook_seen)[1])}, "old", "new")),
    Case("constant", "module constant (`LR = ...`)", "train", (("LR = 0.1", "LR = 0.05"),),
         lambda L: probe({"train.LR": lambda: L.mod.LR, "lr the step set": lambda: L.state["lr_seen"],
                          "optimizer lr": lambda: L.state["opt"].param_groups[0]["lr"]}, 0.1, 0.05)),
    Case("new_function", "new top-level function", "train", (_step_end,),
         lambda L: probe({"train.brand_new()": lambda: _call(L.mod, "brand_new")}, _MISSING, "new")),
    Case("model_statement", "`MODEL = Net()` changed", "train", (("MODEL = Net()", "MODEL = Net(d=4)"),), check_model_statement,
         before=(("train", 'N = int(os.environ', 'MODEL = Net()\nN = int(os.environ'), ("train", "    model = Net()\n", "    model = MODEL\n"))),
    Case("env_statement", "`N = int(os.environ.get(...))` changed", "train", (('"EDIT_KINDS_N", "3"', '"EDIT_KINDS_N", "5"'),),
         lambda L: probe({"train.N": lambda: L.mod.N}, 3, 5)),
    Case("init_forward", "`__init__` adds a parameter the new `forward` uses", "model",
         (("        self.lin = nn.Linear(d, 1)\n", "        self.lin = nn.Linear(d, 1)\n        self.gate = nn.Parameter(torch.ones(1))\n"),
          ("def forward(self, x):\n        return self.lin(x)\n", "def forward(self, x):\n        return self.lin(x) * self.gate\n")),
         check_init_forward),
    Case("bases", "class bases changed", "model", (("class Net(Base):", "class Net(Base, Mixin):"),), check_bases),
    Case("dataclass", "dataclass field default changed", "model", (("depth: int = 2", "depth: int = 3"),), check_dataclass),
    Case("setup", "`setup` changed", "train", (('"setup_tag": "old"', '"setup_tag": "new"'),), check_setup),
    Case("generator", "suspended generator (data iterator) body", "train",
         (('keepdim=True), "old"', 'keepdim=True), "new"'),),
         lambda L: probe({"live generator state['data']": lambda: next(L.state["data"])[2], "a new batches()": lambda: next(L.mod.batches())[2]}, "old", "new")),
    Case("syntax_error", "syntax error (old code must keep running)", "train",
         (('    x, y, tag = next(state["data"])\n', '    x, y, tag = next(state["data"])\n    loss = = 1\n'),), check_syntax_error),
    Case("step_removed", "`step` removed", "train", (_remove_step,), check_step_removed),
)
# What a tool's note has to name to count as reporting the edit: a note about something else the save
# touched (a moved function, a generator elsewhere) does not make a stale result "reported".
ABOUT: dict[str, tuple[str, ...]] = {
    "function": ("helper",), "default": ("scaled",), "kwdefault": ("kw_only",), "moved": ("boom",),
    "method": ("label",), "forward": ("forward",), "super": ("label_super",), "staticmethod": ("smethod",),
    "classmethod": ("cmethod",), "property": ("prop",), "added_method": ("added",), "removed_method": ("legacy",),
    "class_attr": ("KIND",), "no_grad": ("no_grad_fn",), "wraps": ("wrapped_fn",), "decorators": ("greet",),
    "nested": ("outer", "inner"), "closure_vars": ("schedule",), "closure_body": ("scaler",), "imported": ("shared",),
    "lambda": ("ACT", "state['act']"), "hook": ("hook",), "constant": ("LR",), "new_function": ("brand_new",),
    "model_statement": ("MODEL",), "env_statement": ("EDIT_KINDS_N",), "init_forward": ("__init__", "forward", "gate"),
    "bases": ("class Net", "Mixin"), "dataclass": ("Config", "cfg"), "setup": ("setup",), "generator": ("batches",),
    "syntax_error": (), "step_removed": ("step",),
}
CASES = tuple(dataclasses.replace(c, about=ABOUT[c.id]) for c in CASES)
CASE_BY_ID = {c.id: c for c in CASES}


def make_project(case: Case, folder: Path) -> Path:
    """The fixture, with the case's starting-point edits; returns the folder."""
    shutil.copytree(FIXTURE, folder, ignore=shutil.ignore_patterns("__pycache__", ".vram-bench"))
    for name, old, new in case.before:
        path = folder / f"{name}.py"
        path.write_text(apply_edits(path.read_text(encoding="utf-8"), ((old, new),), f"{case.id} (before)"), encoding="utf-8")
    return folder


def edited_source(case: Case, folder: Path) -> str:
    path = folder / f"{case.file}.py"
    return apply_edits(path.read_text(encoding="utf-8"), case.edits, case.id)


def save(path: Path, text: str) -> None:
    """Save in place, like most editors."""
    with open(path, "wb") as f:
        f.write(text.encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())


# --------------------------------------------------------------------------- tool runners (in a worker process)


@dataclass
class Outcome:
    """What a tool said and did around one save."""

    reports: list[str] = field(default_factory=list)  # refusals, failures and warnings the tool gave the user
    log: list[str] = field(default_factory=list)  # what it says it applied (informational)
    crashed: str | None = None  # the tool itself failed
    step_error: str | None = None  # the first training step after the save that raised
    report_kind: str = ""  # short label for the cell when not derived from the reports: reload failed / exception logged


class FakeBench:
    def __init__(self, root: Path) -> None:
        import torch

        self.device = torch.device("cpu")
        self.run_dir = root / ".vram-bench"
        self.step = 0

    def log(self, **scalars: Any) -> None:
        pass


class LoopRunner:
    """IPython and jurigged: a plain training loop on the main thread, the tool applies the save."""

    name = ""

    def run(self, case: Case, root: Path) -> tuple[Live, Outcome]:
        sys.path.insert(0, str(root))
        importlib.invalidate_caches()
        self.before_import()
        train = importlib.import_module("train")
        bench = FakeBench(root)
        state = train.setup(bench)
        live = Live(root, state, lambda: {n: sys.modules[n] for n in PROJECT_MODULES if n in sys.modules})
        self.attach(live)
        for _ in range(STEPS_AFTER):
            sys.modules["train"].step(state, bench)
        live.before = capture(live)
        live.before["step_code"] = train.step.__code__
        path = root / f"{case.file}.py"
        save(path, edited_source(case, root))
        outcome = self.apply(path)
        for _ in range(STEPS_AFTER):  # the loop looks step up on the module each time, as vram-bench does
            try:
                sys.modules["train"].step(state, bench)
            except Exception as exc:  # noqa: BLE001
                outcome.step_error = f"{type(exc).__name__}: {exc}"
                break
        return live, outcome

    def cleanup(self, root: Path) -> None:
        for name in PROJECT_MODULES:
            sys.modules.pop(name, None)
        with contextlib.suppress(ValueError):
            sys.path.remove(str(root))

    def before_import(self) -> None:
        pass

    def attach(self, live: Live) -> None:
        pass

    def apply(self, path: Path) -> Outcome:
        raise NotImplementedError


class IPythonRunner(LoopRunner):
    name = "ipython"

    def attach(self, live: Live) -> None:
        from IPython.extensions.autoreload import ModuleReloader

        self.reloader = ModuleReloader()  # records every loaded module's mtime
        self.reloader.check(check_all=True, do_reload=False)
        self.reloader.enabled = True
        self.reloader.check_all = True  # %autoreload 2
        self.reloader.autoload_obj = False

    def apply(self, path: Path) -> Outcome:
        # autoreload polls mtimes before each cell; a person saves seconds after importing, so
        # move the mtime on by 2 s rather than sleep (the harness runs in well under a second).
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
        err = io.StringIO()
        out = Outcome()
        try:
            with contextlib.redirect_stderr(err):
                self.reloader.check()  # what the pre_run_cell hook of %autoreload calls
        except Exception as exc:  # noqa: BLE001
            out.crashed = f"ModuleReloader.check raised {type(exc).__name__}: {exc}"
        text = err.getvalue()
        if "[autoreload of" in text:
            errors = [line.strip() for line in text.splitlines() if re.match(r"\s*\w*(Error|Exception)\b", line)]
            out.reports.append(f"printed '[autoreload of {path.stem} failed: ...]': {errors[-1] if errors else text.strip()[-200:]}")
            out.report_kind = "reload failed"
        return out


class JuriggedRunner(LoopRunner):
    name = "jurigged"

    def before_import(self) -> None:
        import jurigged  # noqa: F401 - installs codefind's audit hook, which indexes code objects as modules load

    def attach(self, live: Live) -> None:
        from jurigged.register import Registry

        self.events: list[Any] = []
        self.registry = Registry()
        self.registry.set_logger(self.events.append)
        for name, module in live.modules().items():
            self.registry.prepare(name, module.__file__)  # caches the source as imported
            self.registry.get(module.__file__)  # the CodeFile the watcher would build

    def apply(self, path: Path) -> Outcome:
        from jurigged.codetools import AddOperation, DeleteOperation, UpdateOperation

        out = Outcome()
        codefile = self.registry.get(str(path))
        if codefile is None:
            out.crashed = f"jurigged has no CodeFile for {path.name}"
            return out
        self.events.clear()
        try:  # what jurigged.live.Watcher.refresh does on a save
            codefile.refresh()
        except Exception as exc:  # noqa: BLE001 - the watcher logs it and goes on
            self.registry.log(exc)
        for event in self.events:
            if isinstance(event, BaseException):
                out.reports.append(f"logged {type(event).__name__}: {str(event).splitlines()[0] if str(event) else ''}")
                out.report_kind = "exception logged"
            elif isinstance(event, (UpdateOperation, AddOperation, DeleteOperation)):
                out.log.append(str(event))
            else:
                out.log.append(repr(event))
        return out


class VramBenchRunner:
    """A real Session: the training thread runs the steps, the watcher and the reload thread apply the save."""

    name = "vram-bench"

    def run(self, case: Case, root: Path) -> tuple[Live, Outcome]:
        import torch

        from workbench.protocol.events import Error, Exit, Pause, Reload, Step
        from workbench.engine.project import load_project
        from workbench.engine.session import Session, SessionConfig

        project = load_project(root / "train.py")
        self.session = session = Session(project, SessionConfig(device=torch.device("cpu"), memory_event_interval=0))
        sub = session.bus.subscribe(maxlen=1_000_000)
        seen: list[Any] = []

        def until(pred: Callable[[], bool], timeout: float) -> bool:
            deadline = time.monotonic() + timeout
            while not pred():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                seen.extend(sub.wait(min(remaining, 0.05)))
            return True

        def of(kind: type, start: int = 0) -> list[Any]:
            return [e for e in seen[start:] if isinstance(e, kind)]

        def modules() -> dict[str, types.ModuleType]:
            return {path.stem: module for path, module in session.project.modules().items()}

        session.start()
        if not session.wait_until_watching():
            raise RuntimeError("the watcher did not start within 10 s")
        if not until(lambda: len(of(Step)) >= 2 or bool(of(Exit)), 30):
            raise RuntimeError(f"no training steps within 30 s: {[e.to_dict() for e in seen if not isinstance(e, Step)][:5]}")
        live = Live(root, session.worker.user_state, modules)
        live.before = capture(live)
        live.before["step_code"] = live.mod.step.__code__
        mark = len(seen)
        path = root / f"{case.file}.py"
        save(path, edited_source(case, root))
        out = Outcome()
        if not until(lambda: bool(of(Reload, mark)), 10):
            out.log.append("no reload event within 10 s of the save")
        else:
            start = seen.index(of(Reload, mark)[0])
            until(lambda: len(of(Step, start)) >= STEPS_AFTER
                  or any(e.where in ("step", "worker") for e in of(Error, start)) or bool(of(Exit, start)), 10)
        session.send(Pause())
        until(lambda: session.worker.state.value in ("paused", "stopped", "setup failed"), 5)
        until(lambda: False, 0.1)  # whatever is still in flight
        for event in of(Reload, mark):
            if not event.ok:
                where = f" (line {event.line})" if event.line else ""
                text = f"Reload ok=False: {event.error}{where}"
                if (event.error or "").startswith("internal error"):
                    out.crashed = text
                else:
                    out.reports.append(text)
                continue
            out.log.append(f"Reload ok: changed={list(event.changed)}, held={list(getattr(event, 'held', ()))}")
            rebuild = list(getattr(event, "needs_rebuild", ()))  # newer vram-bench: held back until a rebuild
            out.reports.extend(f"needs rebuild: {r}" for r in rebuild)
            notes = [n for n in event.notes if n != "no code changes"]
            out.reports.extend(f"note: {n}" for n in notes)
        for event in of(Error, mark):
            if event.where == "step" and out.step_error is None:
                out.step_error = event.message
            elif event.where == "worker":
                out.crashed = event.message
        return live, out

    def cleanup(self, root: Path) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            session.close()
            self.session = None


RUNNERS: dict[str, Callable[[], Any]] = {"vram-bench": VramBenchRunner, "ipython": IPythonRunner, "jurigged": JuriggedRunner}


def relevant_reports(out: Outcome, about: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(reports about this edit, other notes). A refusal or a failed reload is always about it; a note
    ("note: ...", "needs rebuild: ...") only when it names something the edit touched (case.about)."""
    mine, other = [], []
    for report in out.reports:
        is_note = report.startswith(("note:", "needs rebuild:"))
        (mine if not is_note or not about or any(word in report for word in about) else other).append(report)
    return mine, other


def _report_kind(reports: list[str], fallback: str) -> str:
    for prefix, kind in (("Reload ok=False", "refused"), ("needs rebuild:", "needs rebuild"), ("note:", "note")):
        if any(r.startswith(prefix) for r in reports):
            return kind
    return fallback


def classify(verdict: Verdict, problems: list[str], out: Outcome, about: tuple[str, ...] = ()) -> tuple[str, str, str]:
    """(category, cell, reason) from what the live objects showed and what the tool said."""
    reports, unrelated = relevant_reports(out, about)
    said = "; ".join(reports + ([f"notes about other things: {'; '.join(unrelated)}"] if unrelated else []))
    if out.crashed:
        return "error", "error", out.crashed
    wrong = ([verdict.reason] if verdict.kind == "wrong" else []) + problems
    if problems and verdict.kind != "wrong":
        wrong.insert(0, verdict.reason)
    if out.step_error:
        wrong.append(f"the next training step raises {out.step_error}")
    if wrong:
        reason = "; ".join(wrong)
        if reports:
            return "wrong, noted", "wrong, noted", f"{reason} [tool: {said}]"
        cell = "silently wrong (step raises)" if out.step_error else "silently wrong"
        return "silently wrong", cell, reason + (f" [tool: {said}]" if said else "")
    if verdict.kind == "new":
        return "applied", "applied", verdict.reason + (f" [tool: {said}]" if said else "")
    if reports:
        return "reported", f"reported: {_report_kind(reports, out.report_kind)}", f"{verdict.reason} [tool: {said}]"
    cell = "silently stale (partly)" if verdict.kind == "partial" else "silently stale"
    return "silently stale", cell, verdict.reason + (f" [tool: {said}]" if said else "")


def run_one(tool: str, case: Case) -> dict[str, Any]:
    started = time.monotonic()
    runner = RUNNERS[tool]()
    tmp = Path(tempfile.mkdtemp(prefix=f"edit-kinds-{case.id}-")).resolve()
    root = make_project(case, tmp / "proj")
    result: dict[str, Any] = {"tool": tool, "case": case.id, "title": case.title}
    try:
        live, out = runner.run(case, root)
        try:
            verdict = case.check(live)
        except Exception as exc:  # noqa: BLE001 - a check that raises outside its probes is a harness bug
            verdict = Verdict("wrong", f"harness check raised {type(exc).__name__}: {exc}")
            result["harness_error"] = traceback.format_exc()
        problems = integrity(live)
        category, cell, reason = classify(verdict, problems, out, case.about)
        result.update(
            category=category, cell=cell, reason=reason, verdict=verdict.kind, verdict_reason=verdict.reason,
            problems=problems, step_error=out.step_error, reports=out.reports, tool_log=out.log, crashed=out.crashed,
            steps_after=live.state.get("steps", 0) - live.before.get("steps", 0),
        )
    except Exception as exc:  # noqa: BLE001 - the harness could not drive the tool at all
        result.update(category="harness error", cell="harness error", reason=f"{type(exc).__name__}: {exc}",
                      harness_error=traceback.format_exc())
    finally:
        with contextlib.suppress(Exception):
            runner.cleanup(root)
        shutil.rmtree(tmp, ignore_errors=True)
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def worker_main(tool: str, case_ids: list[str], out_path: Path) -> None:
    sys.dont_write_bytecode = True  # a same-size edit in the same second must not load a stale .pyc
    os.environ.pop("EDIT_KINDS_N", None)
    sys.path.insert(0, str(REPO))
    import torch

    torch.set_num_threads(1)
    with open(out_path, "a", encoding="utf-8") as f:
        for case_id in case_ids:
            result = run_one(tool, CASE_BY_ID[case_id])
            f.write(json.dumps(result, default=repr) + "\n")
            f.flush()


# --------------------------------------------------------------------------- the parent: run workers, print the table


def run_tool(tool: str, case_ids: list[str], workdir: Path) -> dict[str, dict[str, Any]]:
    """Run the cases in a worker process; a case that hangs or kills the worker is recorded as an error."""
    results: dict[str, dict[str, Any]] = {}
    attempt = 0
    while True:
        remaining = [c for c in case_ids if c not in results]
        if not remaining:
            return results
        attempt += 1
        out_path = workdir / f"{tool}-{attempt}.jsonl"
        log_path = workdir / f"{tool}-{attempt}.log"
        out_path.touch()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--worker", tool, "--cases", ",".join(remaining), "--out", str(out_path)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(REPO),
            )
            last_progress, count = time.monotonic(), 0
            while True:
                lines = out_path.read_text(encoding="utf-8").splitlines()
                if len(lines) > count:
                    for line in lines[count:]:
                        record = json.loads(line)
                        results[record["case"]] = record
                    count, last_progress = len(lines), time.monotonic()
                if proc.poll() is not None:
                    for line in out_path.read_text(encoding="utf-8").splitlines()[count:]:
                        record = json.loads(line)
                        results[record["case"]] = record
                    break
                if time.monotonic() - last_progress > STALL_SECONDS:
                    proc.kill()
                    proc.wait()
                    break
                time.sleep(0.1)
        pending = [c for c in remaining if c not in results]
        if pending:  # the worker died or hung on pending[0]
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-600:].strip()
            why = f"no result within {STALL_SECONDS:.0f} s" if proc.returncode in (None, -9) else f"worker exited {proc.returncode}"
            results[pending[0]] = {"tool": tool, "case": pending[0], "title": CASE_BY_ID[pending[0]].title, "category": "error",
                                   "cell": "error (worker died)", "reason": f"{why}: {tail}"}


def version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_describe() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "workbench"], cwd=REPO, capture_output=True, text=True, timeout=5).stdout.strip()
        return f"{head}{' + uncommitted changes in workbench/' if dirty else ''}" if head else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(cases: list[Case], tools: list[str], results: dict[str, dict[str, dict[str, Any]]], meta: dict[str, Any]) -> str:
    lines = [
        "# Edit kinds: what a save does to a live PyTorch training session",
        "",
        f"{meta['date']}, {meta['machine']}; Python {meta['python']}, torch {meta['torch']}; took {meta['seconds']} s",
        "",
    ]
    for tool in TOOLS:
        if tool in tools:
            lines.append(f"- {TOOL_TITLES[tool]}: {meta['versions'][tool]}")
    lines += ["", "| Edit | " + " | ".join(TOOL_TITLES[t] for t in tools) + " |", "| --- |" + " --- |" * len(tools)]
    for case in cases:
        cells = [results[t][case.id]["cell"] for t in tools]
        lines.append(f"| {_md(case.title)} | " + " | ".join(_md(c) for c in cells) + " |")
    lines += ["| **Total** | " + " | ".join(_totals(results[t]) for t in tools) + " |", ""]
    lines += [
        "applied: live objects run the new code, state intact. reported: the tool refused or said what it did not "
        "apply, nothing is wrong. silently stale: no report, live objects run the old code ((partly): some ways of reaching "
        "the code run the new one, others the old). silently wrong: "
        "no report, live state inconsistent. wrong, noted: inconsistent, but the tool logged a note. error: the tool crashed.",
        "",
        "## Why",
        "",
        "| Edit | Tool | Result | What the live objects showed [what the tool said] |",
        "| --- | --- | --- | --- |",
    ]
    for case in cases:
        for t in tools:
            r = results[t][case.id]
            reason = r.get("reason", "")
            lines.append(f"| {_md(case.title)} | {TOOL_TITLES[t]} | {_md(r['cell'])} | {_md(reason[:400])} |")
    return "\n".join(lines)


def _totals(per_case: dict[str, dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for r in per_case.values():
        counts[r["category"]] = counts.get(r["category"], 0) + 1
    order = ["applied", "reported", "silently stale", "silently wrong", "wrong, noted", "error", "skipped", "harness error"]
    return ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH", help="also write the raw results here")
    parser.add_argument("--cases", help="comma-separated case ids (default: all): " + ",".join(CASE_BY_ID))
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated, of " + ",".join(TOOLS))
    parser.add_argument("--serial", action="store_true", help="one tool at a time (default: the tools run side by side)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    case_ids = args.cases.split(",") if args.cases else list(CASE_BY_ID)
    unknown = [c for c in case_ids if c not in CASE_BY_ID]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {', '.join(CASE_BY_ID)}")
    if args.worker:
        worker_main(args.worker, case_ids, Path(args.out))
        return
    tools = [t for t in args.tools.split(",") if t]
    if any(t not in TOOLS for t in tools):
        parser.error(f"--tools takes {', '.join(TOOLS)}")

    started = time.monotonic()
    versions = {
        "vram-bench": f"{version_of('vram-bench') or 'not installed'} (git {git_describe()})",
        "ipython": f"IPython {version_of('ipython') or 'not installed'}, IPython.extensions.autoreload.ModuleReloader with %autoreload 2 settings",
        "jurigged": (f"jurigged {version_of('jurigged')} (codefind {version_of('codefind')}), Registry + CodeFile.refresh()"
                     if importlib.util.find_spec("jurigged") else "not installed (pip install jurigged to include it)"),
    }
    available = {"vram-bench": importlib.util.find_spec("workbench") is not None or (REPO / "workbench").is_dir(),
                 "ipython": importlib.util.find_spec("IPython") is not None,
                 "jurigged": importlib.util.find_spec("jurigged") is not None}
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="edit-kinds-") as tmp:
        workdir = Path(tmp)
        todo = []
        for tool in tools:
            if available[tool]:
                todo.append(tool)
            else:
                results[tool] = {c: {"tool": tool, "case": c, "title": CASE_BY_ID[c].title, "category": "skipped",
                                     "cell": "skipped: not installed", "reason": f"{tool} is not installed"} for c in case_ids}
        if args.serial:
            for tool in todo:
                results[tool] = run_tool(tool, case_ids, workdir)
        else:
            done: queue.Queue[tuple[str, dict[str, dict[str, Any]]]] = queue.Queue()
            threads = [threading.Thread(target=lambda t=t: done.put((t, run_tool(t, case_ids, workdir)))) for t in todo]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            while not done.empty():
                tool, per_case = done.get()
                results[tool] = per_case
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "torch": version_of("torch"),
        "versions": {t: versions[t] for t in tools},
        "seconds": round(time.monotonic() - started, 1),
    }
    cases = [CASE_BY_ID[c] for c in case_ids]
    print(render(cases, tools, results, meta))
    if args.json:
        payload = {"meta": meta, "cases": [{"id": c.id, "title": c.title, "file": f"{c.file}.py"} for c in cases],
                   "results": results}
        Path(args.json).write_text(json.dumps(payload, indent=2, default=repr), encoding="utf-8")


if __name__ == "__main__":
    main()
