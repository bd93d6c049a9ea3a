"""Shared helpers for the engine tests: real projects in tmp dirs, real sessions, real threads.

Nothing here mocks the engine. A test writes a small project (a `train.py` with
`setup`/`step` around a tiny torch model, plus optional modules), loads it with
`workbench.engine.project.load_project`, runs a real `Session` (training thread,
watcher, reload thread, memory sampler) and reads the events from `session.bus`.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import shutil
import sys
import textwrap
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from workbench.protocol.eventbus import Subscription
from workbench.protocol.events import Command, Event, Exit
from workbench.engine.project import load_project, unload_project
from workbench.engine.session import Session, SessionConfig

# --------------------------------------------------------------------------- project files

# A tiny regression (Linear(4, 1) learning y = sum(x)). `time.sleep` keeps steps slow
# enough to observe and leaves the GIL to the watcher and reload threads.
TRAIN_PY = """\
import time

import torch

SCALE = 1.0


def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return {"model": model, "opt": opt}


def step(state, bench):
    time.sleep(0.005)
    x = torch.randn(8, 4)
    y = x.sum(dim=1, keepdim=True)
    loss = ((state["model"](x) - y) ** 2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad(set_to_none=True)
    return {"loss": loss, "scale": SCALE}
"""


def make_project(tmp_path: Path, files: dict[str, str], *, folder: str = "proj") -> Path:
    """Write `files` (relative name -> source, dedented) under tmp_path/folder; return the folder."""
    root = tmp_path / folder
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def import_file(folder: Path, name: str, source: str) -> types.ModuleType:
    """Write `name.py` (dedented) into folder and import it as a real module, registered in sys.modules: the caller
    forgets it (`sys.modules.pop`) when done."""
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def save(path: Path, text: str) -> None:
    """Save in place like most editors: truncate, write, flush, fsync."""
    data = textwrap.dedent(text).encode("utf-8")
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save_atomic(path: Path, text: str) -> None:
    """Save like editors that write a temp file next to the target and rename it over it."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(textwrap.dedent(text).encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def line_of(source: str, needle: str) -> int:
    """1-based line number of the first line of (dedented) `source` containing `needle`."""
    for number, line in enumerate(textwrap.dedent(source).splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} is not in the source")


# --------------------------------------------------------------------------- events


def describe(event: Event) -> str:
    """A compact one-line view of an event for failure messages."""
    data = event.to_dict()
    data.pop("time", None)
    name = data.pop("event")
    if name == "error" and data.get("traceback"):
        data["traceback"] = "...(" + str(len(data["traceback"])) + " chars)"
    body = ", ".join(f"{k}={v!r}" for k, v in data.items())
    return f"{name}({body})"


def is_event(kind: str, **fields: Any) -> Callable[[Event], bool]:
    """Predicate: an event named `kind` whose fields equal the given values."""

    def pred(event: Event) -> bool:
        return event.name == kind and all(getattr(event, k, object()) == v for k, v in fields.items())

    pred.__doc__ = f"{kind}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"
    return pred


class EventLog:
    """Everything a subscription delivered, with a cursor so waits only look at new events."""

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.seen: list[Event] = []
        self.pos = 0

    def pull(self, timeout: float = 0.0) -> None:
        self.seen.extend(self.subscription.wait(timeout) if timeout > 0 else self.subscription.drain())

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float = 10.0, what: str | None = None) -> Event:
        """The next event (after the cursor) matching `predicate`; fails after `timeout` s or on exit."""
        deadline = time.monotonic() + timeout
        start = self.pos
        while True:
            while self.pos < len(self.seen):
                event = self.seen[self.pos]
                self.pos += 1
                if predicate(event):
                    return event
                if isinstance(event, Exit):
                    self._fail(predicate, what, start, "the session exited first")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(predicate, what, start, f"nothing matched within {timeout} s")
            self.pull(min(remaining, 0.25))

    def steps(self, n: int, predicate: Callable[[Event], bool] | None = None, timeout: float = 10.0) -> list[Event]:
        """The next `n` step events (optionally only those matching `predicate`)."""
        out = []
        for _ in range(n):
            out.append(
                self.wait_for(lambda e: e.name == "step" and (predicate is None or predicate(e)), timeout, f"{n} step events")
            )
        return out

    def after(self, event: Event) -> list[Event]:
        """Every event seen after `event` so far (pulls what is queued first)."""
        self.pull()
        index = next(i for i, e in enumerate(self.seen) if e is event)
        return self.seen[index + 1 :]

    def of(self, kind: str) -> list[Event]:
        self.pull()
        return [e for e in self.seen if e.name == kind]

    def _fail(self, predicate: Callable[[Event], bool], what: str | None, start: int, why: str) -> None:
        wanted = what or predicate.__doc__ or getattr(predicate, "__name__", "an event")
        tail = self.seen[max(start - 5, 0) :]
        shown = tail[-60:]
        lines = "\n  ".join(describe(e) for e in shown)
        skipped = len(tail) - len(shown)
        more = f"\n  ... ({skipped} earlier not shown)" if skipped else ""
        stacks = _training_stacks() if why.startswith("nothing matched") else ""
        pytest.fail(f"waiting for {wanted}: {why}. Events seen:{more}\n  {lines or '(none)'}{stacks}", pytrace=False)


def _training_stacks() -> str:
    """Where each session's training thread is: a wait that timed out says what the thread was doing instead
    (a full suite's flake is otherwise a list of events and nothing more)."""
    import sys
    import threading
    import traceback

    frames = sys._current_frames()  # noqa: SLF001 - the interpreter's own view of every thread
    parts = [
        f"\n--- {thread.name} (thread {thread.ident}) now:\n" + "".join(traceback.format_stack(frames[thread.ident])[-12:])
        for thread in threading.enumerate()
        if thread.name == "vram-bench-training" and thread.ident in frames
    ]
    return "".join(parts)


def wait_for(
    subscription: Subscription | EventLog, predicate: Callable[[Event], bool], timeout: float = 10.0
) -> Event:
    """Drain events until one matches `predicate` and return it; fail listing the events seen."""
    log = subscription if isinstance(subscription, EventLog) else EventLog(subscription)
    return log.wait_for(predicate, timeout)


# --------------------------------------------------------------------------- sessions


def fast_config(**overrides: Any) -> SessionConfig:
    """CPU, no periodic memory events (they would only add noise), default watcher timings."""
    values: dict[str, Any] = {"device": torch.device("cpu"), "memory_event_interval": 0, "memory_interval": 0.5}
    values.update(overrides)
    return SessionConfig(**values)


@dataclass
class Live:
    """A running session and the events it has published."""

    session: Session
    events: EventLog
    root: Path
    entry: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def send(self, command: Command) -> None:
        self.session.send(command)

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float = 10.0, what: str | None = None) -> Event:
        return self.events.wait_for(predicate, timeout, what)

    def wait_running(self, steps: int = 2) -> list[Event]:
        """Wait for setup to finish and `steps` steps to run."""
        self.wait_for(is_event("setup", status="done"), timeout=30)
        return self.events.steps(steps)


@contextlib.contextmanager
def open_session(entry: Path, argv: Sequence[str] = (), **config: Any) -> Iterator[Live]:
    """Load the project (`argv`: the script's arguments), subscribe, start, wait until saves are watched; always close."""
    project = load_project(entry, argv)
    try:
        session = Session(project, fast_config(**config))
    except BaseException:
        unload_project(project)
        raise
    events = EventLog(session.bus.subscribe())  # before start: no event is missed
    try:
        session.start()
        assert session.wait_until_watching(10.0), "the watcher did not start within 10 s"
        yield Live(session, events, project.root, project.entry)
    finally:
        session.close()
    assert not session.worker.is_alive(), "the training thread did not stop on close()"
    assert gc.get_freeze_count() == 0, "close() left objects frozen (gc.freeze): later collections would skip them"
    assert str(project.root) not in sys.path, "close() left the project folder on sys.path"
    leftovers = [n for n, m in list(sys.modules.items()) if str(getattr(m, "__file__", "") or "").startswith(str(project.root))]
    assert not leftovers, f"close() left the project's modules imported: {leftovers}"



def snapshot_after(tmp_path: Path, source: str, steps: int, *, folder: str = "first", **config: Any) -> Path:
    """Train a project of one `train.py` for `steps` steps, take a snapshot, close; the snapshot's path."""
    from workbench.protocol.events import TakeSnapshot

    root = make_project(tmp_path, {"train.py": source}, folder=folder)
    with open_session(root / "train.py", max_steps=steps, exit_at_max_steps=False, **config) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        live.send(TakeSnapshot())
        return Path(live.wait_for(is_event("snapshot"), timeout=20).path)

@pytest.fixture
def start_session(tmp_path: Path) -> Iterator[Callable[..., Live]]:
    """Factory: `start_session({"train.py": src, ...}, **config)` -> a running `Live` session.

    Call it from the test body (not from another fixture): the session wraps
    sys.stdout when it starts, and pytest swaps sys.stdout between test phases.
    """
    stack = contextlib.ExitStack()
    count = 0

    def start(files: dict[str, str] | None = None, *, entry: str = "train.py", **config: Any) -> Live:
        nonlocal count
        count += 1
        root = make_project(tmp_path, files if files is not None else {"train.py": TRAIN_PY}, folder=f"proj{count}")
        return stack.enter_context(open_session(root / entry, **config))

    with stack:
        yield start


SAMPLES = Path(__file__).resolve().parent.parent / "sample_projects"


def copy_sample(name: str, tmp_path: Path) -> Path:
    """A sample project copied to a tmp folder (its .vram-bench/ and every edit stay out of the checkout)."""
    target = tmp_path / name
    shutil.copytree(SAMPLES / name, target, ignore=shutil.ignore_patterns(".vram-bench", "__pycache__"))
    return target


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One torch thread while a session runs: on a busy 2-core machine, a thread pool makes small models'
    steps much slower, not faster. The training thread starts after this, so it inherits it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
