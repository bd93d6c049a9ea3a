"""What the app as a client of a session process costs (issue 16, "Figures"), each figure beside a baseline
measured in the same run.

A session process is started the way users start it (`python -m workbench run ENTRY --detach`, from this
checkout, in a private XDG_RUNTIME_DIR, HOME and config folders). The app is the real Textual app
(`make_app(RemoteSession)`) under `App.run_test()` in a child process of its own (headless: the screen is
composed each frame but written to no terminal), or, for the idle figure, a real `vram-bench attach` in a
detached tmux server. Frames are seen by wrapping the app's `_display` (what Textual calls once per
composed screen update, with that update): a "frame" below is the moment a screen update that shows the
change was handed to the driver.

1. Throughput (the default sample tiny_gpt, copied to a tmp dir). One detached session trains flat out;
   each round measures, in a rotating order, a window of W seconds (a) with no client at all, (b) with the
   app attached (a child process, its imports done once, attaches before the window: connect, the app shown
   RUNNING, 2.5 s to settle past its one-off history draw and gc freeze; it leaves after the window, unfreezes
   and collects as a fresh process would start, and idles unconnected until the next), and (c) "today's
   in-process app", the old architecture: `make_app(Session(...))` in `run_test` in a child process on its own
   copy of the project, resumed for its window while the detached session is paused (and paused outside it:
   its idle cost, shown, lands on the other two windows alike). Steps/s comes from each session's own
   `events.jsonl` (step events' times, first to last step in the window; a window is stretched until it holds
   3 steps). Figures: the median of the per-round ratios attached / no client (target >= 0.99) and attached /
   in-process (target >= 1.0), and the mean of the per-round ratios with its 95% interval. On a 2-core VM the
   rate moves 5-7% between windows of any length, independently: many short pairs (`--no-inprocess`: no (c),
   pairs in alternating order) settle a 1% question where a dozen long rounds cannot.
2. Attach with a long history: a session with a trivial step (Linear(4,1) on CPU, no sleep) runs until it
   has N >= 100,000 steps, and keeps training; R times a fresh child process (imports done first) times
   `RemoteSession.connect()` (socket connect, hello sent, the hello with its history read and parsed),
   then the app: from before connect to the first frame composed after the loss chart has drawn its
   series into its canvas (textual-plot draws a canvas while composing, so the frame after that one) and
   with the status bar saying RUNNING. Target p95 <= 500 ms. Baseline, alternating with it: the same app
   on the same session with a hello without history (first frame with RUNNING). The hello's size is shown.
3. Key to screen over the socket, tiny_gpt training flat out: space (pause) until a frame whose status bar
   says PAUSING or PAUSED, and ? until a frame with the help panel shown; each press 100-300 ms (random)
   after the screen settled. Keys are handed to the app as its terminal driver would (no pilot waits).
   Baseline: the same presses in today's in-process app. The two apps alternate in blocks (the other's
   session paused meanwhile). Targets p95: space <= 100 ms, help <= 60 ms.
4. Idle CPU: the detached tiny_gpt session paused, no client: /proc/PID/stat utime + stime over S s, as %
   of one core (target <= 1%); then a real `vram-bench attach` in tmux (120x40) on it: the app's process
   (target <= 2%), and the session and the tmux server meanwhile.

    python bench/session_attach.py --out result.json     # the full run (about 10 minutes on 2 cores)
    python bench/session_attach.py --quick               # a smoke pass: every figure, small samples
    python bench/session_attach.py --only latency --presses 50
    python bench/session_attach.py --only throughput --no-inprocess --rounds 100 --window 2   # ~14 minutes

Needs tmux for the idle figure. Run it on a quiet machine; the ratios are measured interleaved so that a
steady background load hits both sides alike, and the load average is recorded with each part.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.metadata
import json
import math
import os
import platform
import queue
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_projects" / "tiny_gpt"
SIZE = (120, 40)
PARTS = ("history", "throughput", "latency", "idle")

TARGET_ATTACHED_RATIO = 0.99
# After an attach, the app draws the replayed history and, 1 s after it mounts, freezes its objects out of the
# collector's walks (FREEZE_AFTER): one-off work the attached window must not count as the steady cost.
ATTACHED_SETTLE = 2.5
TARGET_VS_INPROCESS = 1.0
TARGET_ATTACH_P95_MS = 500.0
TARGET_SPACE_P95_MS = 100.0
TARGET_HELP_P95_MS = 60.0
TARGET_SESSION_IDLE_PCT = 1.0
TARGET_APP_IDLE_PCT = 2.0

# A step that costs next to nothing: the history figure needs 100,000 steps in a minute or two.
TRIVIAL_TRAIN_PY = """\
import torch


def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return {"model": model, "opt": opt, "x": torch.randn(8, 4)}


def step(state, bench):
    x = state["x"]
    loss = ((state["model"](x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad(set_to_none=True)
    return {"loss": loss}
"""


class BenchError(RuntimeError):
    pass


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation, as numpy's default."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summary_ms(seconds: list[float]) -> dict[str, Any]:
    ms = [s * 1000 for s in seconds]
    return {"n": len(ms), "p50": round(pct(ms, 0.5), 1), "p95": round(pct(ms, 0.95), 1),
            "min": round(min(ms), 1) if ms else None, "max": round(max(ms), 1) if ms else None}


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_and_reap(pid: int, timeout: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)


# --------------------------------------------------------------------------- environment and sessions


def make_env(tmp: Path) -> dict[str, str]:
    """This environment with a private HOME, config folders and a short XDG_RUNTIME_DIR (a socket path fits in 107 bytes)."""
    home = tmp / "home"
    runtime = Path(tempfile.mkdtemp(prefix="vb", dir="/tmp"))
    os.chmod(runtime, 0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TMUX", "TEXTUAL", "NO_COLOR", "XDG_"))}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        XDG_RUNTIME_DIR=str(runtime),
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        PYTHONUNBUFFERED="1",
        COLORTERM="truecolor",
    )
    env.setdefault("LANG", "C.UTF-8")
    for key in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    return env


def copy_project(source: Path, into: Path) -> Path:
    """A copy of the project (a folder, or the folder of an entry file); its entry file."""
    folder = source if source.is_dir() else source.parent
    target = into / folder.name
    shutil.copytree(folder, target, ignore=shutil.ignore_patterns(".vram-bench", "__pycache__"))
    return target / (source.name if source.is_file() else "train.py")


class StepLog:
    """A session's step events, read from its events.jsonl as it grows: (wall time, step)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.pending = b""
        self.steps: list[tuple[float, int]] = []

    def read(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        self.offset += len(chunk)
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        for line in lines:
            if line.startswith(b'{"event":"step"'):
                data = json.loads(line)
                self.steps.append((data["time"], data["step"]))

    def rate(self, t0: float, t1: float) -> tuple[float, int]:
        """Steps/s between wall times t0 and t1: first to last step event inside; and how many steps."""
        self.read()
        inside = [(t, s) for t, s in self.steps if t0 <= t <= t1]
        if len(inside) >= 3:
            (ta, sa), (tb, sb) = inside[0], inside[-1]
            return (sb - sa) / (tb - ta), sb - sa
        if inside:  # steps slower than the window's third (a loaded machine, a quick pass): count them
            return len(inside) / (t1 - t0), len(inside)
        raise BenchError(f"no step in a {t1 - t0:.1f} s window ({self.path})")


class Detached:
    """A session process started with `run --detach`; commands and status through short-lived socket clients."""

    def __init__(self, entry: Path, env: dict[str, str], *extra: str) -> None:
        runtime = Path(env["XDG_RUNTIME_DIR"]) / "vram-bench"
        before = set(runtime.glob("*.json")) if runtime.exists() else set()
        result = subprocess.run([sys.executable, "-m", "workbench", "run", str(entry), "--detach", *extra],
                                env=env, capture_output=True, text=True, timeout=300, cwd=entry.parent, check=False)
        if result.returncode != 0:
            raise BenchError(f"run --detach failed ({result.returncode}): {result.stderr.strip()}")
        facts = max(set(runtime.glob("*.json")) - before, key=lambda p: p.stat().st_mtime)
        data = json.loads(facts.read_text())
        self.name: str = data["name"]
        self.pid: int = data["pid"]
        self.socket = runtime / f"{self.name}.sock"
        self.root = entry.parent
        self.env = env

    def events_file(self) -> Path:
        runs = sorted((self.root / ".vram-bench" / "runs").iterdir())
        return runs[-1] / "events.jsonl"

    def _client(self):  # type: ignore[no-untyped-def]
        from workbench.protocol.client import SessionClient
        from workbench.protocol.wire import ClientHello

        return SessionClient(self.socket, ClientHello(client="bench", history="none"))

    def status(self) -> dict[str, Any]:
        with self._client() as client:
            return dict(client.hello.get("status") or {})

    def send(self, line: str) -> None:
        with self._client() as client:
            client.send_line(line)

    def wait_state(self, state: str, timeout: float = 120.0, min_step: int = 0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if status.get("state") == state and int(status.get("step") or 0) >= min_step:
                return status
            if time.monotonic() > deadline:
                raise BenchError(f"session {self.name}: not {state} (step >= {min_step}) after {timeout:.0f} s: {status}")
            time.sleep(0.2)

    def pause(self) -> None:
        self.send("pause")
        self.wait_state("paused", 30)

    def resume(self) -> None:
        self.send("resume")
        self.wait_state("running", 30)

    def hello_bytes(self, history: str = "screen") -> int:
        """The size of the hello line an app gets (history downsampled to what a screen shows)."""
        from workbench.protocol.wire import ClientHello

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(30)
            sock.connect(str(self.socket))
            sock.sendall(ClientHello(client="bench size", history=history).to_json().encode() + b"\n")
            reader = sock.makefile("rb")
            while True:
                line = reader.readline(1 << 28)
                if not line:
                    raise BenchError("the session closed before its hello")
                if b'"wire":"hello"' in line[:200] or json.loads(line).get("wire") == "hello":
                    return len(line)

    def close(self) -> None:
        kill_and_reap(self.pid)


class Child:
    """This script in a child process (`--child MODE ...`): JSON lines out, command lines in."""

    def __init__(self, env: dict[str, str], log: Path, *args: str, cwd: Path | None = None) -> None:
        self.log = log
        self._log_file = open(log, "ab")  # noqa: SIM115 - closed in close(), after the child
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", *args], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log_file, cwd=cwd)
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            with contextlib.suppress(ValueError):
                self.lines.put(json.loads(raw))
        self.lines.put(None)

    def expect(self, kind: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise BenchError(f"child: no {kind!r} within {timeout:.0f} s; its stderr: {self.tail()}") from None
            if message is None:
                raise BenchError(f"child ended before {kind!r} (exit {self.process.wait()}): {self.tail()}")
            if message.get("kind") == "error":
                raise BenchError(f"child: {message.get('message')}; its stderr: {self.tail()}")
            if message.get("kind") == kind:
                return message

    def tell(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()

    def tail(self) -> str:
        self._log_file.flush()
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-1500:]
        return ""

    def close(self, timeout: float = 5.0) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.tell("exit")
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log_file.close()


# --------------------------------------------------------------------------- the child: the app under run_test


class Frames:
    """Wraps the app's `_display` (once per composed screen update) to see when a frame shows something."""

    def __init__(self, app: Any) -> None:
        self._original = app._display
        self.count = 0
        self._waiter: tuple[Callable[[], bool], asyncio.Future[float], int] | None = None
        app._display = self._display

    def _display(self, screen: Any, renderable: Any) -> None:
        self._original(screen, renderable)
        if renderable is None:
            return
        now = time.perf_counter()
        self.count += 1
        if self._waiter is None:
            return
        condition, future, after = self._waiter
        if future.done():
            self._waiter = None
            return
        try:
            held = condition()
        except Exception:  # noqa: BLE001 - a widget not composed yet
            held = False
        if not held:
            return
        if after > 0:  # the next frame, not this one (a canvas drawn while composing shows in the next)
            self._waiter = (lambda: True, future, 0)
            return
        self._waiter = None
        future.set_result(now)

    def arm(self, condition: Callable[[], bool], *, next_frame: bool = False) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiter = (condition, future, 1 if next_frame else 0)
        return future

    async def until(self, condition: Callable[[], bool], timeout: float = 10.0) -> float:
        return await asyncio.wait_for(self.arm(condition), timeout)


def _child_out() -> Callable[[dict[str, Any]], None]:
    out = os.fdopen(os.dup(1), "w", buffering=1)  # before any session captures fd 1

    def say(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    return say


def _send_key(app: Any, key: str, char: str | None) -> None:
    """As the terminal driver hands a key to the app: a Key message posted to its loop, nothing awaited."""
    from textual import events

    event = events.Key(key, char)
    event.set_sender(app)
    app._driver.send_message(event)


async def _poll(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def _latency(app: Any, frames: Frames, key: str, presses: int, seed: int) -> dict[str, Any]:
    from workbench.frontends.tui.widgets.help_panel import HelpPanel
    from workbench.frontends.tui.widgets.status_bar import StatusBar

    rng = random.Random(seed)
    bar = app.query_one(StatusBar)
    panel = app.query_one(HelpPanel)
    status = lambda: str(bar.render())
    first: list[float] = []
    final: list[float] = []
    misses = 0
    for _ in range(presses):
        if key == "space":
            await _poll(lambda: "RUNNING" in status() and "RESUMING" not in status(), 30, "RUNNING before a press")
            await asyncio.sleep(rng.uniform(0.1, 0.3))
            started = time.perf_counter()
            _send_key(app, "space", " ")
            try:
                shown = await frames.until(lambda: "PAUSING" in status() or "PAUSED" in status())
                first.append(shown - started)
                paused = shown if "PAUSED" in status() else await frames.until(lambda: "PAUSED" in status(), 30)
                final.append(paused - started)
            except asyncio.TimeoutError:
                misses += 1
            await _poll(lambda: "PAUSED" in status(), 30, "PAUSED")
            await asyncio.sleep(rng.uniform(0.1, 0.3))
            _send_key(app, "space", " ")  # resume
        else:
            await asyncio.sleep(rng.uniform(0.1, 0.3))
            started = time.perf_counter()
            _send_key(app, "question_mark", "?")
            try:
                first.append(await frames.until(lambda: panel.shown) - started)
            except asyncio.TimeoutError:
                misses += 1
            await _poll(lambda: panel.shown, 10, "the help shown")
            await asyncio.sleep(rng.uniform(0.1, 0.3))
            started = time.perf_counter()
            _send_key(app, "question_mark", "?")  # close
            try:
                final.append(await frames.until(lambda: not panel.shown) - started)
            except asyncio.TimeoutError:
                misses += 1
    if key == "space":
        await _poll(lambda: "RUNNING" in status() and "RESUMING" not in status(), 30, "RUNNING after the presses")
    return {"first": first, "final": final, "misses": misses}


async def _child_app(mode: str, target: str, say: Callable[[dict[str, Any]], None]) -> None:
    """mode remote: attaches the app to the session on socket `target` at each `attach`, leaves at `detach`
    (the process, its imports done, stays); inprocess: the app on a local Session of the entry `target`, at once."""
    from workbench.frontends.tui.app import make_app  # noqa: F401 - imported before any window

    loop = asyncio.get_running_loop()
    commands = os.fdopen(os.dup(0), "r")

    async def read() -> list[str]:
        return (await loop.run_in_executor(None, commands.readline)).split() or ["exit"]

    if mode == "remote":
        from workbench.protocol import registry
        from workbench.protocol.remote import RemoteSession

        sock = Path(target)
        say({"kind": "imported"})
        while (await read())[0] == "attach":
            source = RemoteSession(registry.SessionEntry(sock.stem, sock, registry.read_facts(sock.with_suffix(".json"))))
            source.connect()
            try:
                if await _run_app(source, source.run_dir, read, say) == "exit":
                    break
            finally:
                source.close()
            # As a fresh `vram-bench attach` process would be next time: the app froze its objects out of the
            # collector's reach (gc.freeze), and what the next app leaves behind must not pile up round after round
            # (measured: the attached window's app CPU grew from 2.5 to 7 % of a core over 14 rounds without this).
            gc.unfreeze()
            gc.collect()
            say({"kind": "detached"})
    else:
        import torch

        from workbench.engine.project import load_project
        from workbench.engine.session import Session, SessionConfig

        entry = Path(target).resolve()
        os.chdir(entry.parent)
        sys.argv = [str(entry)]
        # As `vram-bench run` configured the in-process app before issue 16 (cli._session_config, TUI case).
        session = Session(load_project(entry, []), SessionConfig(device=torch.device("cpu"), exit_at_max_steps=False,
                                                                 write_event_log=True, memory_interval=0.1))
        await _run_app(session, session.run_dir, read, say)
    say({"kind": "bye"})


async def _run_app(source: Any, run_dir: Path, read: Callable[[], Any], say: Callable[[dict[str, Any]], None]) -> str:
    """The app on `source` until `detach` or `exit` (which it returns); `latency`, `pause`, `resume` meanwhile."""
    from workbench.frontends.tui.app import make_app
    from workbench.frontends.tui.widgets.status_bar import StatusBar
    from workbench.protocol.events import Pause, Resume

    app = make_app(source, timestamps=False)
    frames = Frames(app)
    async with app.run_test(size=SIZE):
        bar = app.query_one(StatusBar)
        await _poll(lambda: "RUNNING" in str(bar.render()) and source.status().step > 0, 300, "RUNNING")
        say({"kind": "ready", "run_dir": str(run_dir), "pid": os.getpid()})
        while True:
            words = await read()
            if words[0] in ("exit", "detach"):
                break
            if words[0] == "latency":
                result = await _latency(app, frames, words[1], int(words[2]), int(words[3]))
                say({"kind": "latency", **result})
            elif words[0] in ("pause", "resume"):
                source.send(Pause() if words[0] == "pause" else Resume())
                want = "paused" if words[0] == "pause" else "running"
                await _poll(lambda want=want: source.status().state == want, 30, want)
                say({"kind": words[0]})
        app.exit()
    return words[0]


async def _child_attach_time(target: str, history: str, say: Callable[[dict[str, Any]], None]) -> None:
    """Connect (the hello with its history), then the app until its first full frame; the times.

    history "none" is the baseline: the same app on the same session, its hello without the history replay
    (the chart then starts from the steps that arrive after it): the frame counted is the first with RUNNING."""
    from workbench.frontends.tui.app import make_app
    from workbench.frontends.tui.widgets.loss_chart import LossChart, _Plot
    from workbench.frontends.tui.widgets.status_bar import StatusBar
    from workbench.protocol import registry
    from workbench.protocol.remote import RemoteSession

    sock = Path(target)
    entry = registry.SessionEntry(sock.stem, sock, registry.read_facts(sock.with_suffix(".json")))
    started = time.perf_counter()
    source = RemoteSession(entry)
    if history != "screen":
        from workbench.protocol.wire import ClientHello

        source._hello = ClientHello(client="app", history=history)
    source.connect()
    hello = time.perf_counter()
    points = {s.name: len(s.steps) for s in source.telemetry.series()}
    app = make_app(source, timestamps=False)
    frames = Frames(app)

    def full() -> bool:
        chart = app.query_one(LossChart)
        plot = chart.query_one(_Plot)
        running = "RUNNING" in str(app.query_one(StatusBar).render())
        if history == "none":
            return running and not plot._needs_rerender
        return running and chart.plotted_points > 0 and not plot._needs_rerender

    shown = frames.arm(full, next_frame=True)
    async with app.run_test(size=SIZE):
        drawn = await asyncio.wait_for(shown, 30)
        frame_count = frames.count
        step = source.status().step
        # Evidence that the frame had the series: braille cells in the plot's canvas (read after the timing).
        canvas = app.query_one(LossChart).query_one("#plot")
        cells = sum(1 for y in range(canvas.size.height) for ch in canvas.render_line(y).text if "\u2801" <= ch <= "\u28ff")
        app.exit()
    say({"kind": "attach", "hello_s": hello - started, "frame_s": drawn - started, "frames": frame_count,
         "step": step, "points": points, "braille_cells": cells})


def child_main(argv: list[str]) -> None:
    say = _child_out()
    try:
        if argv[0] == "attach-time":
            asyncio.run(_child_attach_time(argv[1], argv[2], say))
        else:
            asyncio.run(_child_app(argv[0], argv[1], say))
    except BaseException as exc:  # noqa: BLE001 - said to the parent, then out
        import traceback

        traceback.print_exc()
        say({"kind": "error", "message": f"{type(exc).__name__}: {exc}"})
    finally:
        sys.stderr.flush()
        os._exit(0)  # the command reader's thread and the session's threads: nothing to wait for


# --------------------------------------------------------------------------- the parts


def part_history(tmp: Path, env: dict[str, str], steps: int, reps: int) -> dict[str, Any]:
    root = tmp / "trivial"
    root.mkdir()
    (root / "train.py").write_text(TRIVIAL_TRAIN_PY)
    progress(f"history: a trivial-step session until {steps:,} steps")
    session = Detached(root / "train.py", env)
    try:
        started = time.monotonic()
        status = session.wait_state("running", timeout=600 + steps / 100, min_step=steps)
        reached = time.monotonic() - started
        hello_bytes = session.hello_bytes()
        progress(f"history: {status['step']:,} steps after {reached:.0f} s ({status.get('steps_per_second', 0):.0f} steps/s); "
                 f"hello {hello_bytes / 1e3:.0f} kB; {reps} attaches")
        full_bytes = session.hello_bytes("full")
        session_hello_none = session.hello_bytes("none")
        times: dict[str, dict[str, list[float]]] = {h: {"hello": [], "frame": []} for h in ("screen", "none")}
        at_step: list[int] = []
        braille: list[int] = []
        frame_counts: list[int] = []
        points: dict[str, int] = {}
        load_at = [load()]
        for i in range(reps):
            # Alternating with the baseline (the same app, its hello without history), so load hits both alike.
            for history in (("screen", "none") if i % 2 == 0 else ("none", "screen")):
                child = Child(env, tmp / "attach-time.log", "attach-time", str(session.socket), history)
                try:
                    result = child.expect("attach", 120)
                finally:
                    child.close()
                times[history]["hello"].append(result["hello_s"])
                times[history]["frame"].append(result["frame_s"])
                if history == "screen":
                    if not result["braille_cells"]:
                        raise BenchError(f"the frame counted as full had no braille in the loss plot: {result}")
                    braille.append(result["braille_cells"])
                    at_step.append(result["step"])
                    frame_counts.append(result["frames"])
                    points = result["points"]
            progress(f"history: attach {i + 1}/{reps}: hello {times['screen']['hello'][-1] * 1000:.0f} ms, full frame "
                     f"{times['screen']['frame'][-1] * 1000:.0f} ms (step {at_step[-1]:,}); without history: "
                     f"{times['none']['frame'][-1] * 1000:.0f} ms")
        load_at.append(load())
    finally:
        session.close()
    frame, base = summary_ms(times["screen"]["frame"]), summary_ms(times["none"]["frame"])
    return {
        "steps_wanted": steps, "seconds_to_reach": round(reached, 1), "steps_at_attach": [min(at_step), max(at_step)],
        "hello_bytes_screen": hello_bytes, "hello_bytes_none": session_hello_none, "hello_bytes_full": full_bytes,
        "points_replayed": points, "braille_cells_in_plot": [min(braille), max(braille)],
        "frames_until_full": [min(frame_counts), max(frame_counts)],
        "hello": summary_ms(times["screen"]["hello"]), "full_frame": frame,
        "baseline_hello": summary_ms(times["none"]["hello"]), "baseline_first_frame": base,
        "p95_ratio": round(frame["p95"] / base["p95"], 3), "p50_ratio": round(frame["p50"] / base["p50"], 3),
        "load": load_at, "target_p95_ms": TARGET_ATTACH_P95_MS, "pass": frame["p95"] <= TARGET_ATTACH_P95_MS,
    }


def _window(seconds: float, log: StepLog | None = None) -> tuple[float, float]:
    """A window of `seconds`, stretched (to 10x at most) until it holds 3 step events of `log`: on a machine
    so loaded that a step takes longer than the window, the rate still comes from whole steps."""
    start = time.time()
    time.sleep(seconds)
    while log is not None and time.time() - start < 10 * seconds:
        log.read()
        if sum(1 for t, _ in log.steps[-3:] if t >= start) >= 3:
            break
        time.sleep(0.2)
    return start, time.time()


def part_throughput(tmp: Path, env: dict[str, str], session: Detached, entry: Path, rounds: int, window: float,
                    settle: float, with_inprocess: bool = True) -> dict[str, Any]:
    """Rounds of three windows in a rotating order; the app processes stay (imports and setup done once): the
    remote one attaches before its window and leaves after it, the in-process one is paused outside its own.
    Without the in-process arm, rounds are pairs in alternating order (no client first, then attached first)."""
    log = StepLog(session.events_file())
    rates: dict[str, list[float]] = {"detached": [], "attached": [], "inprocess": []}
    app_cpu: list[float] = []
    session_cpu: dict[str, list[float]] = {"detached": [], "attached": []}
    idle_inprocess_cpu: list[float] = []
    orders = [("detached", "attached", "inprocess"), ("attached", "inprocess", "detached"), ("inprocess", "detached", "attached")]
    if not with_inprocess:
        orders = [("detached", "attached"), ("attached", "detached")]
    loads = [load()]
    remote = Child(env, tmp / "attached.log", "remote", str(session.socket))
    inprocess = Child(env, tmp / "inprocess.log", "inprocess", str(entry)) if with_inprocess else None
    try:
        remote.expect("imported", 120)
        if inprocess is not None:
            ready = inprocess.expect("ready", 300)
            inprocess_log = StepLog(Path(ready["run_dir"]) / "events.jsonl")
            inprocess.tell("pause")
            inprocess.expect("pause", 60)
        for i in range(rounds):
            for what in orders[i % len(orders)]:
                if what == "detached":
                    time.sleep(settle)
                    other = inprocess.process.pid if inprocess is not None else None
                    before, before_other = cpu_seconds(session.pid), cpu_seconds(other) if other else 0.0
                    t0, t1 = _window(window, log)
                    session_cpu["detached"].append((cpu_seconds(session.pid) - before) / (t1 - t0) * 100)
                    if other:
                        idle_inprocess_cpu.append((cpu_seconds(other) - before_other) / (t1 - t0) * 100)
                    rate, _ = log.rate(t0, t1)
                elif what == "attached":
                    remote.tell("attach")
                    remote.expect("ready", 120)
                    time.sleep(max(settle, ATTACHED_SETTLE))
                    before, before_app = cpu_seconds(session.pid), cpu_seconds(remote.process.pid)
                    t0, t1 = _window(window, log)
                    app_cpu.append((cpu_seconds(remote.process.pid) - before_app) / (t1 - t0) * 100)
                    session_cpu["attached"].append((cpu_seconds(session.pid) - before) / (t1 - t0) * 100)
                    remote.tell("detach")
                    remote.expect("detached", 60)
                    rate, _ = log.rate(t0, t1)
                else:
                    assert inprocess is not None
                    session.pause()
                    inprocess.tell("resume")
                    inprocess.expect("resume", 60)
                    time.sleep(settle)
                    t0, t1 = _window(window, inprocess_log)
                    inprocess.tell("pause")
                    inprocess.expect("pause", 60)
                    session.resume()
                    rate, _ = inprocess_log.rate(t0, t1)
                rates[what].append(rate)
            in_process = f", in-process app {rates['inprocess'][-1]:.2f}" if inprocess is not None else ""
            progress(f"throughput round {i + 1}/{rounds}: no client {rates['detached'][-1]:.2f}, app attached "
                     f"{rates['attached'][-1]:.2f}{in_process} steps/s (the app {app_cpu[-1]:.1f}% of a core; load {load()[0]})")
            loads.append(load())
    finally:
        remote.close()
        if inprocess is not None:
            inprocess.close()
    pairs = [a / d for a, d in zip(rates["attached"], rates["detached"])]
    versus = [a / p for a, p in zip(rates["attached"], rates["inprocess"])]
    ratio = statistics.median(pairs)
    vs_inproc = statistics.median(versus) if versus else math.nan
    # This VM's step rate moves 5-7 % between windows of any length from 1 to 8 s, and adjacent windows do not
    # move together: a median of a dozen pairs cannot tell 0.99 from 0.97. Many short pairs can: the mean ratio's
    # 95 % interval says what the figure is within.
    spread = statistics.stdev(pairs) if len(pairs) > 1 else math.nan
    half = 1.96 * spread / math.sqrt(len(pairs)) if len(pairs) > 1 else math.nan
    mean = statistics.fmean(pairs)
    return {
        "mean_ratio": round(mean, 4), "mean_ratio_95": [round(mean - half, 4), round(mean + half, 4)],
        "with_inprocess": inprocess is not None,
        "steps_per_s": {k: [round(r, 3) for r in v] for k, v in rates.items()},
        "median_steps_per_s": {k: round(statistics.median(v), 3) for k, v in rates.items() if v},
        "attached_over_detached": [round(r, 4) for r in pairs], "ratio": round(ratio, 4),
        "attached_over_inprocess": [round(r, 4) for r in versus], "ratio_vs_inprocess": round(vs_inproc, 4),
        "app_cpu_pct_attached": round(statistics.median(app_cpu), 1),
        "session_cpu_pct": {k: round(statistics.median(v), 1) for k, v in session_cpu.items()},
        "paused_inprocess_app_cpu_pct": round(statistics.median(idle_inprocess_cpu), 1) if idle_inprocess_cpu else None,
        "load": loads, "window_s": window, "rounds": rounds,
        "target_ratio": TARGET_ATTACHED_RATIO, "target_vs_inprocess": TARGET_VS_INPROCESS,
        "pass": ratio >= TARGET_ATTACHED_RATIO and (not versus or vs_inproc >= TARGET_VS_INPROCESS),
    }


def part_latency(tmp: Path, env: dict[str, str], session: Detached, entry: Path, presses: int, blocks: int) -> dict[str, Any]:
    """The attached app and the in-process app alternate in blocks; the other side's session is paused meanwhile."""
    per_block = max(1, -(-presses // blocks))
    results: dict[str, dict[str, list[float]]] = {side: {"space": [], "space_paused": [], "help": [], "help_close": []}
                                                  for side in ("attached", "inprocess")}
    misses = {"attached": 0, "inprocess": 0}
    loads = [load()]
    attached = Child(env, tmp / "latency-attached.log", "remote", str(session.socket))
    inprocess = Child(env, tmp / "latency-inprocess.log", "inprocess", str(entry))
    try:
        attached.expect("imported", 120)
        attached.tell("attach")
        attached.expect("ready", 120)
        inprocess.expect("ready", 300)
        inprocess.tell("pause")
        inprocess.expect("pause", 60)
        seed = 0
        for block in range(blocks):
            for side in (("attached", "inprocess") if block % 2 == 0 else ("inprocess", "attached")):
                child = attached if side == "attached" else inprocess
                if side == "inprocess":
                    session.pause()
                    child.tell("resume")
                    child.expect("resume", 60)
                time.sleep(1.0)
                for key, first, final in (("space", "space", "space_paused"), ("help", "help", "help_close")):
                    seed += 1
                    child.tell(f"latency {key} {per_block} {seed}")
                    result = child.expect("latency", 60 + per_block * 10)
                    results[side][first] += result["first"]
                    results[side][final] += result["final"]
                    misses[side] += result["misses"]
                if side == "inprocess":
                    child.tell("pause")
                    child.expect("pause", 60)
                    session.resume()
            progress(f"latency block {block + 1}/{blocks}: attached space p50 "
                     f"{pct(results['attached']['space'], 0.5) * 1000:.0f} ms, in-process "
                     f"{pct(results['inprocess']['space'], 0.5) * 1000:.0f} ms")
            loads.append(load())
    finally:
        attached.close()
        inprocess.close()
    out: dict[str, Any] = {side: {k: summary_ms(v) for k, v in r.items()} for side, r in results.items()}
    out["misses"] = misses
    out["load"] = loads
    space, help_ = out["attached"]["space"]["p95"], out["attached"]["help"]["p95"]
    out["target_space_p95_ms"], out["target_help_p95_ms"] = TARGET_SPACE_P95_MS, TARGET_HELP_P95_MS
    out["pass"] = space <= TARGET_SPACE_P95_MS and help_ <= TARGET_HELP_P95_MS and misses["attached"] == 0
    return out


class Tmux:
    """A detached tmux server (private socket, no status line) with one pane running a command."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.name = f"vb-attach-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.conf = tmp / f"{self.name}.conf"
        self.conf.write_text("set -g status off\nset -g remain-on-exit on\nset -g default-terminal tmux-256color\n"
                             "set -sg escape-time 10\n")
        self.env = env
        self.started = False

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-u", "-L", self.name, "-f", str(self.conf), *args], env=self.env,
                              capture_output=True, text=True, timeout=30, check=check)

    def start(self, cwd: Path, argv: list[str]) -> int:
        command = " ".join([f"cd {shlex.quote(str(cwd))} &&", "exec env",
                            *(shlex.quote(f"{k}={v}") for k, v in self.env.items()), *map(shlex.quote, argv)])
        self.started = True
        self.tmux("new-session", "-d", "-s", "bench", "-x", str(SIZE[0]), "-y", str(SIZE[1]), command)
        return int(self.tmux("display-message", "-p", "-t", "bench", "#{pane_pid}").stdout.strip())

    def server_pid(self) -> int:
        return int(self.tmux("display-message", "-p", "#{pid}").stdout.strip())

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.tmux("capture-pane", "-p", "-t", "bench", check=False).stdout
            if text in screen:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"tmux: {text!r} not on the screen after {timeout:.0f} s:\n{screen}")
            time.sleep(0.25)

    def close(self) -> None:
        if self.started:
            self.tmux("kill-server", check=False)
            self.started = False


def _cpu_pct(pids: dict[str, int], seconds: float) -> dict[str, float]:
    before = {k: cpu_seconds(p) for k, p in pids.items()}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    return {k: round((cpu_seconds(p) - before[k]) / elapsed * 100, 2) for k, p in pids.items()}


def part_idle(tmp: Path, env: dict[str, str], session: Detached, seconds: float, settle: float) -> dict[str, Any]:
    session.pause()
    time.sleep(settle)
    load_at = load()
    progress(f"idle: the paused session with no client, {seconds:.0f} s")
    alone = _cpu_pct({"session": session.pid}, seconds)
    if shutil.which("tmux") is None:
        raise BenchError("tmux is needed for the idle figure of an attached app (apt-get install tmux)")
    terminal = Tmux(tmp, env)
    try:
        app_pid = terminal.start(session.root, [sys.executable, "-m", "workbench", "attach", session.name])
        terminal.wait_for("PAUSED", 120)
        time.sleep(settle)
        progress(f"idle: a real `vram-bench attach` in tmux on the paused session, {seconds:.0f} s")
        attached = _cpu_pct({"app": app_pid, "session": session.pid, "tmux_server": terminal.server_pid()}, seconds)
    finally:
        terminal.close()
    return {
        "session_alone_pct": alone["session"], "app_pct": attached["app"], "session_while_attached_pct": attached["session"],
        "tmux_server_pct": attached["tmux_server"], "seconds": seconds, "load": load_at,
        "target_session_pct": TARGET_SESSION_IDLE_PCT, "target_app_pct": TARGET_APP_IDLE_PCT,
        "pass": alone["session"] <= TARGET_SESSION_IDLE_PCT and attached["app"] <= TARGET_APP_IDLE_PCT,
    }


# --------------------------------------------------------------------------- report


def version_of(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(), "torch": version_of("torch"),
            "textual": version_of("textual"), "vram_bench": version_of("vram-bench"),
            "load_average_at_start": load(), "date": time.strftime("%Y-%m-%d %H:%M")}


def interval_verdict(low: float, high: float, target: float) -> str:
    """PASS when the whole interval is at or above the target, MISS when it is all below, else not settled."""
    if math.isnan(low) or math.isnan(high):
        return "-"
    return "PASS" if low >= target else ("MISS" if high < target else "NOT SETTLED")


def rows(result: dict[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    """(figure, baseline, measured, ratio or value, target, verdict)"""
    out = []
    verdict = lambda ok: "PASS" if ok else "MISS"
    if "throughput" in result:
        t = result["throughput"]
        m = t["median_steps_per_s"]
        out.append(("steps/s, app attached vs no client", f"{m['detached']:.2f}", f"{m['attached']:.2f}",
                    f"{t['ratio']:.3f}", f">= {TARGET_ATTACHED_RATIO}", verdict(t["ratio"] >= TARGET_ATTACHED_RATIO)))
        low, high = t["mean_ratio_95"]
        out.append(("  the same, mean of the pairs (95% interval)", "", "", f"{t['mean_ratio']:.3f} ({low:.3f}-{high:.3f})",
                    f">= {TARGET_ATTACHED_RATIO}", interval_verdict(low, high, TARGET_ATTACHED_RATIO)))
        if t["with_inprocess"]:
            out.append(("steps/s, attached vs in-process app", f"{m['inprocess']:.2f}", f"{m['attached']:.2f}",
                        f"{t['ratio_vs_inprocess']:.3f}", f">= {TARGET_VS_INPROCESS}",
                        verdict(t["ratio_vs_inprocess"] >= TARGET_VS_INPROCESS)))
    if "history" in result:
        h = result["history"]
        b = h["baseline_first_frame"]
        out.append((f"attach, {h['steps_at_attach'][0]:,}+ steps: full frame p50 / p95", f"{b['p50']:.0f} / {b['p95']:.0f} ms",
                    f"{h['full_frame']['p50']:.0f} / {h['full_frame']['p95']:.0f} ms",
                    f"{h['p95_ratio']:.2f}x", f"p95 <= {TARGET_ATTACH_P95_MS:.0f} ms",
                    verdict(h["full_frame"]["p95"] <= TARGET_ATTACH_P95_MS)))
    if "latency" in result:
        lat = result["latency"]
        for key, target, label in (("space", TARGET_SPACE_P95_MS, "space -> PAUSING"), ("help", TARGET_HELP_P95_MS, "? -> help")):
            a, b = lat["attached"][key], lat["inprocess"][key]
            out.append((f"key to screen, {label}: p50 / p95", f"{b['p50']:.0f} / {b['p95']:.0f} ms",
                        f"{a['p50']:.0f} / {a['p95']:.0f} ms", f"{a['p95'] / b['p95']:.2f}x" if b["p95"] else "-",
                        f"p95 <= {target:.0f} ms", verdict(a["p95"] <= target and lat["misses"]["attached"] == 0)))
    if "idle" in result:
        i = result["idle"]
        out.append(("idle CPU, paused session, no client", "-", f"{i['session_alone_pct']:.2f}% of a core",
                    f"{i['session_alone_pct']:.2f}%", f"<= {TARGET_SESSION_IDLE_PCT:.0f}%",
                    verdict(i["session_alone_pct"] <= TARGET_SESSION_IDLE_PCT)))
        out.append(("idle CPU, attached app (tmux), paused", f"session {i['session_while_attached_pct']:.2f}%",
                    f"{i['app_pct']:.2f}% of a core", f"{i['app_pct']:.2f}%", f"<= {TARGET_APP_IDLE_PCT:.0f}%",
                    verdict(i["app_pct"] <= TARGET_APP_IDLE_PCT)))
    return out


def print_report(result: dict[str, Any]) -> None:
    m = result["machine"]
    print(f"\nsession_attach.py  {m['date']}  {m['cores']} cores ({m['cpu']}), Python {m['python']}, torch {m['torch']}, "
          f"textual {m['textual']}; load {m['load_average_at_start']} -> {m['load_average_at_end']}")
    header = ("figure", "baseline", "measured", "ratio / value", "target", "")
    table = [header, *rows(result)]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for n, row in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    if "throughput" in result:
        t = result["throughput"]
        print(f"\nthroughput: per-round attached/no-client {t['attached_over_detached']}; attached/in-process "
              f"{t['attached_over_inprocess']}; app process {t['app_cpu_pct_attached']}% of a core while attached; "
              f"session {t['session_cpu_pct']}")
    if "history" in result:
        h = result["history"]
        print(f"history: connect + hello parsed p50/p95 {h['hello']['p50']:.0f}/{h['hello']['p95']:.0f} ms (baseline without "
              f"history {h['baseline_hello']['p50']:.0f}/{h['baseline_hello']['p95']:.0f} ms)")
        print(f"history: {h['steps_at_attach'][0]:,}-{h['steps_at_attach'][1]:,} steps, reached in {h['seconds_to_reach']} s; "
              f"hello {h['hello_bytes_screen'] / 1e3:.0f} kB (history 'screen'), {h['hello_bytes_full'] / 1e6:.1f} MB with "
              f"'full'; points replayed {h['points_replayed']}; frames until the full one {h['frames_until_full']}; braille cells "
              f"in the plot then {h['braille_cells_in_plot']}")
    if "latency" in result:
        lat = result["latency"]
        for side in ("attached", "inprocess"):
            s = lat[side]
            print(f"latency {side}: space->PAUSED {s['space_paused']['p50']:.0f}/{s['space_paused']['p95']:.0f} ms, "
                  f"help close {s['help_close']['p50']:.0f}/{s['help_close']['p95']:.0f} ms (p50/p95), "
                  f"n={s['space']['n']}/{s['help']['n']}, misses {lat['misses'][side]}")
    if "idle" in result:
        i = result["idle"]
        print(f"idle: tmux server {i['tmux_server_pct']:.2f}% while the attached app idles; over {i['seconds']:.0f} s each")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke pass: small samples of every figure")
    parser.add_argument("--only", choices=PARTS, action="append", help="run only this part (repeatable)")
    parser.add_argument("--project", type=Path, default=SAMPLE, help="throughput/latency/idle project (default tiny_gpt)")
    parser.add_argument("--rounds", type=int, help="throughput rounds (default 12; quick 2)")
    parser.add_argument("--window", type=float, help="throughput window, seconds (default 4; quick 1.5)")
    parser.add_argument("--no-inprocess", action="store_true",
                        help="throughput: pairs only, without the old in-process app's arm (more pairs in the same time)")
    parser.add_argument("--history-steps", type=int, help="steps before attaching (default 100,000; quick 3,000)")
    parser.add_argument("--attaches", type=int, help="attach repetitions (default 20; quick 3)")
    parser.add_argument("--presses", type=int, help="presses per key and app (default 30; quick 4)")
    parser.add_argument("--idle-seconds", type=float, help="idle CPU measured over (default 30; quick 3)")
    parser.add_argument("--torch-threads", type=int, metavar="N",
                        help="OMP_NUM_THREADS for every session (default: unset, torch's own choice: one per core)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    quick = args.quick
    rounds = args.rounds or (2 if quick else 12)
    window = args.window or (1.5 if quick else 4.0)
    settle = 0.5 if quick else 1.0
    history_steps = args.history_steps or (3_000 if quick else 100_000)
    attaches = args.attaches or (3 if quick else 20)
    presses = args.presses or (4 if quick else 30)
    idle_seconds = args.idle_seconds or (3.0 if quick else 30.0)
    blocks = 1 if quick else 3
    parts = [p for p in PARTS if p in (args.only or PARTS)]
    result: dict[str, Any] = {"machine": machine()}
    result["config"] = {"quick": quick, "parts": parts, "project": str(args.project), "rounds": rounds, "window_s": window,
                        "history_steps": history_steps, "attaches": attaches, "presses": presses, "latency_blocks": blocks,
                        "idle_seconds": idle_seconds, "terminal": f"{SIZE[0]}x{SIZE[1]}"}
    tmp = Path(tempfile.mkdtemp(prefix="vram-bench-session-attach-"))
    env = make_env(tmp)
    if args.torch_threads:
        env["OMP_NUM_THREADS"] = str(args.torch_threads)
    result["config"]["omp_num_threads"] = env.get("OMP_NUM_THREADS", "unset")
    session: Detached | None = None
    try:
        if "history" in parts:
            result["history"] = part_history(tmp, env, history_steps, attaches)
        if {"throughput", "latency", "idle"} & set(parts):
            entry = copy_project(args.project.resolve(), tmp / "detached")
            inproc_entry = copy_project(args.project.resolve(), tmp / "inprocess")
            progress(f"starting the detached session ({entry.parent.name})")
            session = Detached(entry, env)
            session.wait_state("running", 300, min_step=20)
            if "throughput" in parts:
                result["throughput"] = part_throughput(tmp, env, session, inproc_entry, rounds, window, settle,
                                                       with_inprocess=not args.no_inprocess)
            if "latency" in parts:
                result["latency"] = part_latency(tmp, env, session, inproc_entry, presses, blocks)
            if "idle" in parts:
                result["idle"] = part_idle(tmp, env, session, idle_seconds, 1.0 if quick else 3.0)
    finally:
        if session is not None:
            session.close()
        shutil.rmtree(env["XDG_RUNTIME_DIR"], ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    result["machine"]["load_average_at_end"] = load()
    figures = [part for part in ("throughput", "history", "latency", "idle") if part in result]
    result["pass"] = all(result[p]["pass"] for p in figures)
    print_report(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    try:
        main()
    except BenchError as exc:
        sys.exit(f"session_attach.py: {exc}")
    except KeyboardInterrupt:
        sys.exit(130)
