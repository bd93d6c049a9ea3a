"""What the terminal app costs training: throughput in the TUI vs headless, key latency, idle CPU.

Everything runs the real CLI (`python -m workbench run ...` from this checkout) in its own process,
the app inside a detached tmux server (private socket, 120x40, HOME and XDG folders in a tmp dir),
so every cost of the app is counted: Textual's rendering and the terminal (tmux) taking its output.

1. Throughput. The default sample (tiny_gpt, copied to a tmp dir) runs `--max-steps N` headless
   (`--headless < /dev/null`, events to a file) and in the TUI (which pauses at N; its events come
   from `<project>/.vram-bench/events.jsonl`), alternating over R rounds so drift hits both alike.
   Steps/s is the steady state, from the step events' own timestamps between step W (warm-up,
   N/5) and step N. Target: TUI >= 97% of headless (medians).
2. Keypress-to-screen latency while training flat out. A tmux control-mode client (`tmux -C`, the
   way a terminal attaches) sends the key and gets a `%output` line each time the app writes to the
   pane; after each write the screen is captured over the same connection until it shows the change.
   The time runs from just before the key is sent to the reply of the first capture that shows it
   (nothing subtracted). `--watch poll` instead runs `tmux capture-pane` processes back to back, as
   this benchmark did before 2026-11-22; on 2 cores those process starts take CPU from the app they
   measure. Two keys: `?` (help opens / closes over the panes; training keeps running
   under it) and `space` (pause: the first change on the status bar, e.g. PAUSING..., is the key
   reaching the screen; PAUSED itself also waits for the running step to end, shown for reference).
   Each pause press comes 100-300 ms (random) after the status bar said RUNNING again. Target: p95 <= 100 ms.
3. Idle CPU while paused: the TUI started with `--paused` (setup runs, then it waits); once the
   screen says PAUSED and a few seconds have passed, the CPU time (user + system, all threads) of
   the app's process over S seconds, as % of one core. Target: <= 2%. `--headless --paused` is
   measured the same way as a reference, and the tmux server's CPU (drawing the app's output) is shown.

    python bench/tui_cost.py                      # 3 rounds x 400 steps each way, 40 latency samples, 20 s idle
    python bench/tui_cost.py --steps 150 --rounds 1 --latency-samples 10 --idle-seconds 5   # a quick check
    python bench/tui_cost.py --project path/to/train.py --json
    python bench/tui_cost.py --only latency --latency-samples 30   # one part (repeat --only for more)

Needs tmux (apt-get install tmux) and psutil (a dependency of vram-bench). Takes about
2 x rounds x (setup + N steps), plus about two minutes; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import queue
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_projects" / "tiny_gpt"
WIDTH, HEIGHT = 120, 40
STARTUP_TIMEOUT = 180.0  # torch import + setup() on a slow machine
KEY_TIMEOUT = 10.0  # a key press until the screen shows its effect
SETTLE_SECONDS = 3.0  # after PAUSED shows, before idle CPU is measured
HELP_TEXT = "pause / resume training"  # a line of the help screen's key table

TARGET_RATIO = 0.97
TARGET_P95_MS = 100.0
TARGET_IDLE_PCT = 2.0
PARTS = ("throughput", "latency", "idle")


class BenchError(RuntimeError):
    pass


# --------------------------------------------------------------------------- processes and terminals


def cli_argv() -> list[str]:
    """The vram-bench CLI of this checkout (PYTHONPATH points at it), with this interpreter."""
    return [sys.executable, "-m", "workbench"]


def make_env(tmp: Path) -> dict[str, str]:
    """This environment with a private HOME and XDG folders (no user config or theme), this checkout first."""
    home = tmp / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TMUX", "TEXTUAL", "NO_COLOR", "XDG_"))}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        COLORTERM="truecolor",
    )
    env.setdefault("LANG", "C.UTF-8")
    for key in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    return env


class Tmux:
    """A detached tmux server on a private socket with one WIDTH x HEIGHT pane running the app."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.socket = f"vram-bench-tui-cost-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.env = env
        self.conf = workdir / f"{self.socket}.conf"
        # No status line (the app gets the whole pane); a dead pane stays readable; keys react at once.
        self.conf.write_text(
            "set -g remain-on-exit on\nset -g status off\nset -g default-terminal tmux-256color\nset -sg escape-time 10\n",
            encoding="utf-8",
        )
        self.started = False
        self.app_pid: int | None = None
        self.socket_path: Path | None = None
        self.capture_seconds: list[float] = []

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-u", "-L", self.socket, "-f", str(self.conf), *args],
            env=self.env, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=30, check=check,
        )

    def start(self, cwd: Path, argv: list[str]) -> int:
        """Run argv in the pane (exec'd, so the pane's pid is the app's); returns that pid."""
        command = " ".join(
            [f"cd {shlex.quote(str(cwd))} &&", "exec env", *(shlex.quote(f"{k}={v}") for k, v in self.env.items()), *map(shlex.quote, argv)]
        )
        self.started = True
        self.tmux("new-session", "-d", "-s", "bench", "-x", str(WIDTH), "-y", str(HEIGHT), command)
        pane = self.tmux("display-message", "-p", "-t", "bench", "#{pane_pid} #{socket_path}").stdout.split(" ", 1)
        self.app_pid, self.socket_path = int(pane[0]), Path(pane[1].strip())
        return self.app_pid

    def server_pid(self) -> int:
        return int(self.tmux("display-message", "-p", "#{pid}").stdout.strip())

    def capture(self) -> str:
        started = time.perf_counter()
        screen = self.tmux("capture-pane", "-p", "-t", "bench", check=False).stdout
        self.capture_seconds.append(time.perf_counter() - started)
        return screen

    def send(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "bench", *keys)

    def alive(self) -> bool:
        result = self.tmux("display-message", "-p", "-t", "bench", "#{pane_dead}", check=False)
        return result.returncode == 0 and result.stdout.strip() == "0"

    def wait_for(self, condition: Callable[[str], bool], timeout: float, what: str) -> tuple[str, float]:
        """Capture back to back until `condition(screen)`; the screen and when its capture ended."""
        deadline = time.perf_counter() + timeout
        checks = 0
        while True:
            screen = self.capture()
            now = time.perf_counter()
            if condition(screen):
                return screen, now
            checks += 1
            if checks % 50 == 0 and not self.alive():
                raise BenchError(f"the app exited while waiting for {what}:\n{screen.rstrip()}")
            if now > deadline:
                raise BenchError(f"waiting for {what}: not on the screen after {timeout:.0f} s:\n{screen.rstrip()}")

    def close(self) -> None:
        """The app is killed (a benchmark run needs no final snapshot), then the server."""
        if self.app_pid is not None:
            kill_and_reap(self.app_pid)
            self.app_pid = None
        if self.started:
            self.tmux("kill-server", check=False)
            self.started = False
        for path in (self.socket_path, self.conf):  # tmux leaves its socket behind
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()


class ControlWatcher:
    """Watches the pane the way a terminal does: tmux control mode (`tmux -C`) pushes `%output` as
    the app writes, and only then is the screen captured, over the same connection.

    Polling with a `tmux capture-pane` process back to back spends most of a core on process
    starts; on a 2-core machine that is taken from the app it measures. Here keys and captures are
    lines on one pipe (no process each), read in large chunks, and nothing runs between the app's
    writes but reading them."""

    def __init__(self, terminal: Tmux) -> None:
        self.process = subprocess.Popen(
            ["tmux", "-u", "-L", terminal.socket, "-f", str(terminal.conf), "-C", "attach-session", "-t", "bench"],
            env=terminal.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
        )
        # (when the block ended, its text, %end rather than %error, its flags: 1 = a command of ours)
        self.replies: queue.Queue[tuple[float, str, bool, str]] = queue.Queue()
        self.changed = threading.Condition()
        self.outputs = 0  # %output notifications so far: the app wrote to the pane
        self.closed = False
        self.capture_seconds: list[float] = []
        self.reader = threading.Thread(target=self._read, name="tmux-control-reader", daemon=True)
        self.reader.start()
        try:
            _, text, attached, _ = self._reply()  # attach-session's own reply: commands sent before it fail
            if not attached:
                raise BenchError(f"tmux control mode could not attach: {text}")
        except BaseException:
            self.close()
            raise

    def _lines(self) -> Iterator[tuple[float, str]]:
        """The client's output line by line, read in chunks (unbuffered line iteration reads a
        byte at a time: 20,000 reads for one frame) and stamped with when their chunk arrived."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        pending = b""
        while chunk := os.read(fd, 1 << 16):
            now = time.perf_counter()
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                yield now, line.decode("utf-8", errors="replace")

    def _read(self) -> None:
        block: list[str] | None = None
        opened = ""  # the %begin line's time and command number: its %end or %error carries the same
        try:
            for now, line in self._lines():
                if block is not None:
                    ending = line.split(" ")
                    if ending[0] in ("%end", "%error") and " ".join(ending[1:3]) == opened:
                        self.replies.put((now, "\n".join(block), ending[0] == "%end", ending[3] if len(ending) > 3 else ""))
                        block = None
                    else:
                        block.append(line)
                elif line.startswith("%begin "):
                    block, opened = [], " ".join(line.split(" ")[1:3])
                elif line.startswith("%output "):
                    with self.changed:
                        self.outputs += 1
                        self.changed.notify_all()
        finally:
            with self.changed:
                self.closed = True
                self.changed.notify_all()
            self.replies.put((time.perf_counter(), "the tmux control client ended", False, "1"))

    def _reply(self) -> tuple[float, str, bool, str]:
        try:
            return self.replies.get(timeout=30)
        except queue.Empty:
            raise BenchError("tmux did not answer the control client within 30 s") from None

    def _command(self, command: str) -> tuple[float, str]:
        """Runs one tmux command over the pipe; its output and when the reply ended."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(command.encode("utf-8") + b"\n")
        except OSError as exc:
            raise BenchError(f"the tmux control client is gone ({exc}) before {command!r}") from None
        while True:
            when, text, ok, flags = self._reply()
            if flags == "1":  # not a block tmux sent for something else
                break
        if not ok:
            raise BenchError(f"tmux {command!r} failed: {text}")
        return when, text

    def send(self, *keys: str) -> None:
        self._command(" ".join(["send-keys", "-t", "bench", *map(shlex.quote, keys)]))

    def _capture(self) -> tuple[str, float]:
        """The pane's text, and when the reply came back."""
        started = time.perf_counter()
        when, screen = self._command("capture-pane -p -t bench")
        self.capture_seconds.append(when - started)
        return screen + "\n", when

    def capture(self) -> str:
        return self._capture()[0]

    def pane_dead(self) -> bool:
        return self._command("display-message -p -t bench '#{pane_dead}'")[1].strip() == "1"

    def wait_for(self, condition: Callable[[str], bool], timeout: float, what: str) -> tuple[str, float]:
        """Captures now, then after each write of the app's until `condition(screen)`; the screen and
        when the capture that showed it came back. Checks each second that the app is still there."""
        deadline = time.perf_counter() + timeout
        while True:
            with self.changed:
                seen = self.outputs
            screen, when = self._capture()
            if condition(screen):
                return screen, when
            if when > deadline:
                raise BenchError(f"waiting for {what}: not on the screen after {timeout:.0f} s:\n{screen.rstrip()}")
            with self.changed:
                while self.outputs == seen and not self.closed:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    if not self.changed.wait(min(left, 1.0)):
                        break  # a quiet second: look at the pane again
                closed = self.closed
            if closed or (self.outputs == seen and self.pane_dead()):
                raise BenchError(f"the app exited while waiting for {what}:\n{screen.rstrip()}")

    def close(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


def kill_and_reap(pid: int) -> None:
    """SIGKILL, then wait until it is gone (a zombie left for tmux to reap counts as gone)."""
    try:
        process = psutil.Process(pid)
        process.kill()
        deadline = time.monotonic() + 10
        while process.is_running() and process.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


class Cleanup:
    """Every tmux server and child process this run starts; all ended on exit, Ctrl-C or SIGTERM."""

    def __init__(self) -> None:
        self.terminals: list[Tmux] = []
        self.processes: list[subprocess.Popen[bytes]] = []

    def terminal(self, workdir: Path, env: dict[str, str]) -> Tmux:
        made = Tmux(workdir, env)
        self.terminals.append(made)
        return made

    def popen(self, *args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(*args, start_new_session=True, **kwargs)  # type: ignore[call-overload]
        self.processes.append(process)
        return process

    def close_all(self) -> None:
        for terminal in self.terminals:
            with contextlib.suppress(Exception):
                terminal.close()
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(Exception):
                    process.kill()
                    process.wait(10)
        self.terminals.clear()
        self.processes.clear()


@contextlib.contextmanager
def cleanup_on_exit() -> Iterator[Cleanup]:
    cleanup = Cleanup()

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        yield cleanup
    finally:
        cleanup.close_all()
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------- the project and its events


def copy_project(source: Path, tmp: Path) -> Path:
    """The project folder copied into tmp (its .vram-bench/ artifacts land there); returns the entry file."""
    entry = source / "train.py" if source.is_dir() else source
    if not entry.is_file():
        raise BenchError(f"no project entry file at {entry}")
    root = tmp / entry.parent.name
    shutil.copytree(entry.parent, root, ignore=shutil.ignore_patterns(".vram-bench", "__pycache__", "*.pyc", ".git", ".venv"))
    return root / entry.name


def fresh_run_dir(entry: Path) -> Path:
    """Remove the previous run's artifacts (the event log is appended to); returns the event log's path."""
    shutil.rmtree(entry.parent / ".vram-bench", ignore_errors=True)
    return entry.parent / ".vram-bench" / "events.jsonl"


def read_events(path: Path) -> list[dict]:  # type: ignore[type-arg]
    events = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    return events


def steady_rate(events: list[dict], first: int, last: int) -> tuple[float, float]:  # type: ignore[type-arg]
    """Steps/s between the step events numbered `first` and `last`, and the median step ms there."""
    steps = {e["step"]: e for e in events if e.get("event") == "step"}
    if first not in steps or last not in steps:
        raise BenchError(f"the run has no step events {first} and {last} (got {len(steps)} steps)")
    seconds = steps[last]["time"] - steps[first]["time"]
    ms = [steps[i]["ms"] for i in range(first + 1, last + 1) if i in steps]
    return (last - first) / seconds, statistics.median(ms)


def describe_failure(events: list[dict]) -> str:  # type: ignore[type-arg]
    lines = [json.dumps({k: v for k, v in e.items() if k != "traceback"})[:300] for e in events if e.get("event") in ("error", "exit", "print")]
    return "\n".join(lines[-10:]) or "(no error, exit or print events)"


# --------------------------------------------------------------------------- 1. throughput


def throughput_headless(cleanup: Cleanup, entry: Path, env: dict[str, str], steps: int, warmup: int, tmp: Path) -> tuple[float, float]:
    fresh_run_dir(entry)
    out = tmp / "headless.jsonl"
    with out.open("wb") as stdout, (tmp / "headless.stderr").open("wb") as stderr:
        process = cleanup.popen(
            [*cli_argv(), "run", entry.name, "--headless", "--max-steps", str(steps)],
            cwd=entry.parent, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
        )
        try:
            code = process.wait(timeout=STARTUP_TIMEOUT + steps * 2.0)
        except subprocess.TimeoutExpired:
            process.kill()
            raise BenchError(f"headless run of {steps} steps did not finish in time") from None
    events = read_events(out)
    if code != 0:
        raise BenchError(f"headless run exited with code {code}:\n{describe_failure(events)}\n{(tmp / 'headless.stderr').read_text()[-2000:]}")
    return steady_rate(events, warmup, steps)


def throughput_tui(cleanup: Cleanup, entry: Path, env: dict[str, str], steps: int, warmup: int, tmp: Path) -> tuple[float, float]:
    log = fresh_run_dir(entry)
    terminal = cleanup.terminal(tmp, env)
    try:
        terminal.start(entry.parent, [*cli_argv(), "run", entry.name, "--max-steps", str(steps)])
        deadline = time.monotonic() + STARTUP_TIMEOUT + steps * 2.0
        while True:
            time.sleep(0.5)  # the event log is flushed every 0.5 s; reading it is all this process does meanwhile
            events = read_events(log)
            if any(e.get("event") == "step" and e.get("step") == steps for e in events):
                return steady_rate(events, warmup, steps)
            if not terminal.alive():
                raise BenchError(f"the app exited before step {steps}:\n{terminal.capture().rstrip()}\n{describe_failure(events)}")
            if any(e.get("event") in ("exit",) or (e.get("event") == "paused" and e.get("reason") != "max steps") for e in events):
                raise BenchError(f"the TUI run stopped before step {steps}:\n{describe_failure(events)}")
            if time.monotonic() > deadline:
                raise BenchError(f"the TUI run did not reach step {steps} in time:\n{terminal.capture().rstrip()}")
    finally:
        terminal.close()


# --------------------------------------------------------------------------- 2. latency


def status_line(screen: str) -> str:
    return screen.split("\n", 1)[0]


def shows(state: str) -> Callable[[str], bool]:
    return lambda screen: re.search(rf"\| {state}\b", status_line(screen)) is not None


def step_shown(screen: str) -> int:
    match = re.search(r"\bstep (\d+)", status_line(screen))
    return int(match.group(1)) if match else -1


def status_words(screen: str) -> str:
    """The status bar without the numbers that move while training (step, steps/s)."""
    return re.sub(r"\bstep \d+|[\d.]+ steps/s", "", status_line(screen))


def latency(cleanup: Cleanup, entry: Path, env: dict[str, str], samples: int, tmp: Path, watch: str) -> dict[str, object]:
    fresh_run_dir(entry)
    terminal = cleanup.terminal(tmp, env)
    rng = random.Random(7)
    pause_react_ms: list[float] = []
    paused_ms: list[float] = []
    resume_ms: list[float] = []
    help_ms: list[float] = []
    help_open_ms: list[float] = []
    help_close_ms: list[float] = []
    not_advanced = 0
    watcher: Tmux | ControlWatcher = terminal
    try:
        terminal.start(entry.parent, [*cli_argv(), "run", entry.name])
        watcher = ControlWatcher(terminal) if watch == "control" else terminal
        screen, _ = watcher.wait_for(lambda s: shows("RUNNING")(s) and step_shown(s) >= 20, STARTUP_TIMEOUT, "RUNNING at step 20")
        watcher.capture_seconds.clear()

        def press(key: str) -> float:
            started = time.perf_counter()
            watcher.send(key)
            return started

        last_step = -1
        for _ in range(samples):
            # space while training runs flat out: the first change on the status bar (the app may
            # show that it took the key, e.g. PAUSING..., before the worker pauses at the step
            # boundary), then PAUSED itself. Then resume, and let it run again.
            time.sleep(rng.uniform(0.1, 0.3))
            before = status_words(screen)
            started = press("Space")
            screen, seen = watcher.wait_for(lambda s: status_words(s) != before, KEY_TIMEOUT, "a change on the status bar after space")
            pause_react_ms.append((seen - started) * 1000)
            if not shows("PAUSED")(screen):
                screen, seen = watcher.wait_for(shows("PAUSED"), KEY_TIMEOUT, "PAUSED after space")
            paused_ms.append((seen - started) * 1000)
            if step_shown(screen) <= last_step:
                not_advanced += 1
            last_step = step_shown(screen)
            time.sleep(rng.uniform(0.1, 0.3))
            started = press("Space")
            screen, seen = watcher.wait_for(shows("RUNNING"), KEY_TIMEOUT, "RUNNING after space")
            resume_ms.append((seen - started) * 1000)
        for _ in range(samples):
            # ?: the help screen opens, then closes; training keeps running under it.
            for visible in (True, False):
                time.sleep(rng.uniform(0.1, 0.3))
                started = press("?")
                screen, seen = watcher.wait_for(lambda s, v=visible: (HELP_TEXT in s) == v, KEY_TIMEOUT, f"the help screen {'open' if visible else 'closed'} after ?")
                help_ms.append((seen - started) * 1000)
                (help_open_ms if visible else help_close_ms).append((seen - started) * 1000)
        if not shows("RUNNING")(watcher.capture()):
            raise BenchError(f"training was not running at the end of the latency test:\n{status_line(screen)}")
        capture_ms = [s * 1000 for s in watcher.capture_seconds]
    finally:
        if watcher is not terminal:
            watcher.close()
        terminal.close()
    return {
        "help_toggle": summarize(help_ms),
        "help_open": summarize(help_open_ms),
        "help_close": summarize(help_close_ms),
        "pause_first_change": summarize(pause_react_ms),
        "pause_to_paused": summarize(paused_ms),
        "resume_to_running": summarize(resume_ms),
        "watch": watch,
        "capture_ms_median": round(statistics.median(capture_ms), 2),
        "pauses_without_new_steps": not_advanced,
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(round(q * (len(ordered) - 1))), len(ordered) - 1)]


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": round(statistics.median(values), 1),
        "p95": round(percentile(values, 0.95), 1),
        "max": round(max(values), 1),
    }


# --------------------------------------------------------------------------- 3. idle CPU


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) and of its live children."""
    process = psutil.Process(pid)
    total = sum(process.cpu_times()[:2])
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += sum(child.cpu_times()[:2])
    return total


def core_percent(pids: list[int], seconds: float) -> list[float]:
    before = [cpu_seconds(p) for p in pids]
    started = time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - started
    return [(cpu_seconds(p) - b) / wall * 100 for p, b in zip(pids, before)]


def idle_tui(cleanup: Cleanup, entry: Path, env: dict[str, str], seconds: float, tmp: Path) -> dict[str, float]:
    fresh_run_dir(entry)
    terminal = cleanup.terminal(tmp, env)
    try:
        pid = terminal.start(entry.parent, [*cli_argv(), "run", entry.name, "--paused"])
        terminal.wait_for(shows("PAUSED"), STARTUP_TIMEOUT, "PAUSED after setup")
        time.sleep(SETTLE_SECONDS)
        app, server = core_percent([pid, terminal.server_pid()], seconds)
        if not shows("PAUSED")(terminal.capture()):
            raise BenchError("the app was not paused during the idle measurement")
    finally:
        terminal.close()
    return {"app_pct": round(app, 2), "tmux_server_pct": round(server, 2)}


def idle_headless(cleanup: Cleanup, entry: Path, env: dict[str, str], seconds: float, tmp: Path) -> float:
    fresh_run_dir(entry)
    out = tmp / "headless-paused.jsonl"
    with out.open("wb") as stdout:
        process = cleanup.popen(
            [*cli_argv(), "run", entry.name, "--headless", "--paused"],
            cwd=entry.parent, env=env, stdin=subprocess.PIPE, stdout=stdout, stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT
            while not any(e.get("event") == "paused" for e in read_events(out)):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise BenchError(f"headless --paused did not pause:\n{describe_failure(read_events(out))}")
                time.sleep(0.2)
            time.sleep(SETTLE_SECONDS)
            (pct,) = core_percent([process.pid], seconds)
        finally:
            with contextlib.suppress(OSError):
                process.stdin.write(b"quit\n")  # type: ignore[union-attr]
                process.stdin.close()  # type: ignore[union-attr]
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
    return round(pct, 2)


# --------------------------------------------------------------------------- report


def version_of(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, object]:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    tmux = subprocess.run(["tmux", "-V"], capture_output=True, text=True).stdout.strip()
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "torch": version_of("torch"),
        "textual": version_of("textual"),
        "vram_bench": version_of("vram-bench"),
        "tmux": tmux,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d"),
    }


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def print_report(result: dict) -> None:  # type: ignore[type-arg]
    c, m = result["config"], result["machine"]
    rows: list[tuple[str, str, str, str]] = []
    t = result.get("throughput")
    if t:
        rows.append(("steps/s headless (median)", f"{t['headless_median']:.2f}  {t['headless']}", "", ""))
        rows.append(("steps/s in the TUI (median)", f"{t['tui_median']:.2f}  {t['tui']}", "", ""))
        rows.append(("TUI / headless", f"{t['ratio']:.1%}", f">= {TARGET_RATIO:.0%}", verdict(t["ratio"] >= TARGET_RATIO)))
        pairs = t["round_ratios"]
        rows.append(("  per round (the noise)", f"median {statistics.median(pairs):.1%}, {min(pairs):.1%} .. {max(pairs):.1%}", "", ""))
        rows.append(("median step ms, headless / TUI", f"{t['headless_step_ms']:.1f} / {t['tui_step_ms']:.1f}", "", ""))
    lat = result.get("latency")
    if lat:
        for key, label, target in (
            ("help_toggle", "key -> screen: ? help opens/closes", True),
            ("help_open", "  ? -> help shown", False),
            ("help_close", "  ? -> help gone", False),
            ("pause_first_change", "key -> screen: space, status bar reacts", True),
            ("pause_to_paused", "  space -> PAUSED (waits for the step end)", False),
            ("resume_to_running", "  space -> RUNNING (from paused)", False),
        ):
            s = lat[key]
            rows.append((f"{label}, p95", f"{s['p95']:.1f} ms (p50 {s['p50']:.1f}, max {s['max']:.1f}, n={s['n']})",
                         f"<= {TARGET_P95_MS:.0f} ms" if target else "", verdict(s["p95"] <= TARGET_P95_MS) if target else ""))
        how = "tmux control mode, a capture after each write" if lat["watch"] == "control" else "capture-pane processes back to back"
        rows.append((f"  one capture ({how})", f"{lat['capture_ms_median']:.2f} ms median", "", ""))
    idle = result.get("idle")
    if idle:
        rows.append(("idle CPU while paused, TUI", f"{idle['tui_app_pct']:.2f}% of a core", f"<= {TARGET_IDLE_PCT:.0f}%",
                     verdict(idle["tui_app_pct"] <= TARGET_IDLE_PCT)))
        rows.append(("  tmux server meanwhile (the terminal)", f"{idle['tmux_server_pct']:.2f}% of a core", "", ""))
        if "headless_pct" in idle:
            rows.append(("  headless --paused (reference)", f"{idle['headless_pct']:.2f}% of a core", "", ""))
    print(f"vram-bench TUI cost: {c['project']}, {c['rounds']} round(s) x {c['steps']} steps each way "
          f"(steady state: steps {c['warmup']}..{c['steps']}), {c['latency_samples']} latency samples per key, "
          f"{c['idle_seconds']:g} s idle; terminal tmux {WIDTH}x{HEIGHT}")
    width = max(len(r[0]) for r in rows)
    value_width = max(len(r[1]) for r in rows)
    for name, value, target, ok in rows:
        print(f"  {name:<{width}}  {value:<{value_width}}  {target:<9} {ok}".rstrip())
    print(f"  {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; python {m['python']}, torch {m['torch']}, "
          f"textual {m['textual']}, {m['tmux']}, OMP_NUM_THREADS {m['omp_num_threads']}; "
          f"load average {m['load_average_at_start']} at start, {m['load_average_at_end']} at end; {m['date']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400, help="steps per throughput run (default 400)")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds, alternating headless and TUI (default 3)")
    parser.add_argument("--latency-samples", type=int, default=40, help="presses per key for the latency test (default 40)")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="idle CPU measured over this long (default 20)")
    parser.add_argument("--project", type=Path, default=SAMPLE, help="entry file or folder (default: the tiny_gpt sample); copied to a tmp dir")
    parser.add_argument("--watch", choices=("control", "poll"), default="control",
                        help="how the latency test sees the screen: control = tmux control mode, a capture after each write "
                             "of the app's (default); poll = `tmux capture-pane` processes back to back (the method before 2026-11-22)")
    parser.add_argument("--only", choices=PARTS, action="append",
                        help="run only this part (repeatable; default: all of throughput, latency, idle)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        sys.exit("tui_cost.py: tmux is needed (apt-get install tmux)")
    if args.steps < 20 or args.rounds < 1 or args.latency_samples < 1 or args.idle_seconds <= 0:
        sys.exit("tui_cost.py: need --steps >= 20, --rounds >= 1, --latency-samples >= 1, --idle-seconds > 0")
    warmup = max(10, args.steps // 5)
    parts = set(args.only or PARTS)
    result: dict[str, object] = {"machine": machine()}
    result["config"] = {"project": str(args.project.resolve().relative_to(REPO) if args.project.resolve().is_relative_to(REPO) else args.project),
                        "steps": args.steps, "warmup": warmup, "rounds": args.rounds,
                        "latency_samples": args.latency_samples, "idle_seconds": args.idle_seconds,
                        "watch": args.watch, "parts": sorted(parts)}
    progress = (lambda text: print(text, file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory(prefix="vram-bench-tui-cost-") as tmp_name, cleanup_on_exit() as cleanup:
        tmp = Path(tmp_name)
        env = make_env(tmp)
        entry = copy_project(args.project.resolve(), tmp)
        headless: list[tuple[float, float]] = []
        tui: list[tuple[float, float]] = []
        for i in range(args.rounds if "throughput" in parts else 0):
            order = (("headless", throughput_headless, headless), ("TUI", throughput_tui, tui))
            for name, run, into in order if i % 2 == 0 else order[::-1]:
                into.append(run(cleanup, entry, env, args.steps, warmup, tmp))
                progress(f"round {i + 1}/{args.rounds}: {name} {into[-1][0]:.2f} steps/s")
        if headless:
            h, u = statistics.median(r for r, _ in headless), statistics.median(r for r, _ in tui)
            result["throughput"] = {
                "headless": [round(r, 2) for r, _ in headless], "tui": [round(r, 2) for r, _ in tui],
                "headless_median": round(h, 2), "tui_median": round(u, 2), "ratio": round(u / h, 4),
                "headless_step_ms": round(statistics.median(ms for _, ms in headless), 2),
                "tui_step_ms": round(statistics.median(ms for _, ms in tui), 2),
                "target_ratio": TARGET_RATIO, "pass": u / h >= TARGET_RATIO,
                # Each round's pair (run back to back, order alternating): their spread is the noise.
                "round_ratios": [round(t / hh, 3) for (hh, _), (t, _) in zip(headless, tui)],
            }
        if "latency" in parts:
            progress(f"latency (watching the screen by {args.watch})...")
            lat = latency(cleanup, entry, env, args.latency_samples, tmp, args.watch)
            lat["target_p95_ms"] = TARGET_P95_MS
            lat["pass"] = lat["help_toggle"]["p95"] <= TARGET_P95_MS and lat["pause_first_change"]["p95"] <= TARGET_P95_MS  # type: ignore[index]
            result["latency"] = lat
        if "idle" in parts:
            progress("idle CPU...")
            idle = idle_tui(cleanup, entry, env, args.idle_seconds, tmp)
            result["idle"] = {
                "tui_app_pct": idle["app_pct"], "tmux_server_pct": idle["tmux_server_pct"],
                "headless_pct": idle_headless(cleanup, entry, env, args.idle_seconds, tmp),
                "target_pct": TARGET_IDLE_PCT, "pass": idle["app_pct"] <= TARGET_IDLE_PCT,
            }
    result["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]  # type: ignore[index]
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)


if __name__ == "__main__":
    try:
        main()
    except BenchError as exc:
        sys.exit(f"tui_cost.py: {exc}")
    except KeyboardInterrupt:
        sys.exit(130)
