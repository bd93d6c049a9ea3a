"""The headless protocol end to end: `python -m workbench run <project> --headless`.

stdout must carry only JSON lines, one event each; commands go in on stdin.
The user's step prints (Python and native) and must never show up raw on stdout.
"""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import TRAIN_PY, line_of, make_project, save

STARTUP_TIMEOUT = 60.0  # torch import + setup on a slow, busy CI machine

NOISY_TRAIN = TRAIN_PY.replace("import time\n", "import os\nimport sys\nimport time\n").replace(
    '    return {"loss": loss, "scale": SCALE}\n',
    '    print("py-print", bench.step)\n'
    '    print("py-stderr", bench.step, file=sys.stderr)\n'
    '    os.write(1, b"native-fd1\\n")\n'
    '    os.write(2, b"native-fd2\\n")\n'
    '    return {"loss": loss, "scale": SCALE}\n',
)


class Headless:
    """A `--headless` subprocess; stdout lines are parsed as they arrive, stderr is collected."""

    def __init__(self, entry: Path, *args: str, stdin: int | None = subprocess.PIPE) -> None:
        self.entry = entry
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workbench", "run", str(entry), "--headless", *args],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=entry.parent.parent,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )
        self.raw_lines: list[str] = []  # every stdout line, as is
        self.events: list[dict[str, Any]] = []  # every parsed event so far
        self.pos = 0
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._queue.put), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._stderr.append), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _pump(stream: Any, sink: Callable[[Any], None]) -> None:
        for line in stream:
            sink(line)
        sink(None)

    @property
    def stderr(self) -> str:
        return "".join(s for s in self._stderr if s is not None)

    def _take(self, timeout: float) -> bool:
        """Move one line from the reader thread into `events`; False on timeout or end of output."""
        try:
            line = self._queue.get(timeout=timeout)
        except queue.Empty:
            return False
        if line is None:
            self._queue.put(None)  # stay at end of output
            return False
        self.raw_lines.append(line)
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"stdout line is not JSON: {line!r}\n{self.explain()}", pytrace=False)
        assert isinstance(event, dict) and "event" in event, f"stdout line without an 'event' key: {line!r}"
        self.events.append(event)
        return True

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 15.0, what: str = "an event") -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            while self.pos < len(self.events):
                event = self.events[self.pos]
                self.pos += 1
                if predicate(event):
                    return event
            remaining = deadline - time.monotonic()
            ended = self.proc.poll() is not None and self._queue.empty()
            if remaining <= 0 or ended:
                why = "the process ended" if ended else f"nothing matched within {timeout} s"
                pytest.fail(f"waiting for {what}: {why}\n{self.explain()}", pytrace=False)
            self._take(min(remaining, 0.25))

    def wait_event(self, kind: str, timeout: float = 15.0, **fields: Any) -> dict[str, Any]:
        what = f"{kind}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"
        return self.wait_for(lambda e: e["event"] == kind and all(e.get(k) == v for k, v in fields.items()), timeout, what)

    def steps(self, n: int, timeout: float = 15.0) -> list[dict[str, Any]]:
        return [self.wait_event("step", timeout) for _ in range(n)]

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 30.0) -> int:
        """Wait for the process to exit and read the rest of stdout; returns the exit code."""
        code = self.proc.wait(timeout)
        for thread in self._threads:
            thread.join(10)
        while self._take(0.01):
            pass
        return code

    def since(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        index = next(i for i, e in enumerate(self.events) if e is event)
        return self.events[index + 1 :]

    def explain(self) -> str:
        shown = "".join(self.raw_lines[-40:])
        return f"--- last stdout lines\n{shown}--- stderr\n{self.stderr[-3000:]}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


@pytest.fixture
def headless(tmp_path: Path) -> Iterator[Callable[..., Headless]]:
    """Factory: `headless({"train.py": src}, "--max-steps", "3")` -> a running subprocess."""
    started: list[Headless] = []

    def start(files: dict[str, str] | None = None, *args: str, stdin: int | None = subprocess.PIPE) -> Headless:
        root = make_project(tmp_path, files or {"train.py": TRAIN_PY}, folder=f"proj{len(started)}")
        proc = Headless(root / "train.py", *args, stdin=stdin)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


def test_max_steps_run_prints_only_json_events(headless) -> None:
    run = headless({"train.py": NOISY_TRAIN}, "--max-steps", "4", stdin=subprocess.DEVNULL)
    code = run.finish(timeout=STARTUP_TIMEOUT)
    assert code == 0, run.explain()
    assert run.raw_lines, run.explain()
    assert all(line.startswith("{") and line.endswith("}\n") for line in run.raw_lines), run.explain()
    stdout = "".join(run.raw_lines)
    assert "native-fd1" not in stdout and "native-fd2" not in stdout
    names = [e["event"] for e in run.events]
    assert names[0] == "start"
    start = run.events[0]
    assert start["device"] == "cpu" and start["project"] == "proj0/train.py" and start["pid"] == run.proc.pid
    assert [e["status"] for e in run.events if e["event"] == "setup"] == ["running", "done"]
    steps = [e for e in run.events if e["event"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    for e in steps:
        assert isinstance(e["loss"], float) and math.isfinite(e["loss"])
        assert e["ms"] > 0 and e["scalars"] == {"scale": 1.0} and e["code_version"] == 0
    prints = [(e["stream"], e["text"]) for e in run.events if e["event"] == "print"]
    for n in range(4):
        assert ("stdout", f"py-print {n}") in prints
        assert ("stderr", f"py-stderr {n}") in prints
    assert not any("native" in text for _, text in prints)
    assert run.events[-1] == {**run.events[-1], "event": "exit", "reason": "max steps", "code": 0, "step": 4}
    assert names.count("exit") == 1
    # Native writes to fd 1 were moved to stderr, not lost and not on stdout.
    assert run.stderr.count("native-fd1") == 4 and run.stderr.count("native-fd2") == 4
    assert "Traceback" not in run.stderr


def test_commands_on_stdin(headless) -> None:
    run = headless()
    run.wait_event("setup", STARTUP_TIMEOUT, status="done")
    run.steps(2)

    run.send("pause")
    paused = run.wait_event("paused", reason="user")
    run.send("step")
    one = run.wait_event("step")
    assert one["step"] == paused["step"] + 1

    run.send("snapshot")
    snap = run.wait_event("snapshot")
    path = Path(snap["path"])
    assert path.parent.name == "snapshots" and path.parent.parent.parent == run.entry.parent.resolve() / ".vram-bench" / "runs"
    assert path.stat().st_size == snap["bytes"] > 0
    assert snap["step"] == one["step"]

    run.send("profile 2")
    refused = run.wait_event("error", where="command")
    assert "resume first" in refused["message"]

    run.send("cleanup")
    cleanup = run.wait_event("cleanup")
    assert isinstance(cleanup["freed_bytes"], int) and cleanup["freed_bytes"] >= 0
    assert not any(e["event"] == "step" for e in run.since(paused) if e is not one)

    run.send("resume")
    resumed = run.wait_event("resumed", reason="user")
    assert resumed["step"] == one["step"]
    run.send("profile 2")
    run.wait_event("profile", status="started", steps=2)
    done = run.wait_event("profile", 30, status="done")
    assert done["trace"].endswith(".json.gz") and Path(done["trace"]).is_file()
    assert done["top_ops"] and all({"name", "calls", "self_cpu_ms"} <= op.keys() for op in done["top_ops"])

    for bad, fragment in [("bogus", "unknown command 'bogus'"), ("profile x", "whole number"), ("pause now", "takes no arguments")]:
        run.send(bad)
        error = run.wait_event("error", where="command")
        assert fragment in error["message"], error
    run.steps(1)  # bad commands do not stop training

    run.send("quit")
    exit_event = run.wait_event("exit")
    assert (exit_event["reason"], exit_event["code"]) == ("quit", 0)
    assert run.finish() == 0, run.explain()
    assert run.events[-1]["event"] == "exit"


def test_save_while_running_headless_produces_a_reload_event(headless) -> None:
    run = headless()
    run.wait_event("setup", STARTUP_TIMEOUT, status="done")
    run.steps(2)
    edited = TRAIN_PY.replace('"scale": SCALE}', '"scale": SCALE, "headless": 1.0}')
    # Nothing in the protocol says when the watcher is up; steps running is a strong hint, but
    # save again if the first save went unseen (the second one then carries the change).
    reload = None
    for _ in range(3):
        save(run.entry, edited)
        try:
            reload = run.wait_event("reload", 5, file="train.py")
            break
        except pytest.fail.Exception:
            run.pos = len(run.events)
    assert reload is not None, run.explain()
    assert reload["ok"] is True and reload["changed"] == ["step"] and reload["code_version"] == 1, reload
    step = run.wait_for(lambda e: e["event"] == "step" and e["code_version"] == 1, what="a step with the new code")
    assert step["scalars"] == {"scale": 1.0, "headless": 1.0}

    broken = edited.replace("    x = torch.randn(8, 4)\n", "    x = torch.randn(8, 4\n")
    save(run.entry, broken)
    failed = run.wait_event("reload", 20, ok=False)
    assert failed["file"] == "train.py" and failed["line"] == line_of(broken, "x = torch.randn(8, 4")
    assert failed["error"].startswith("syntax error")

    run.send("rollback")
    back = run.wait_event("reload", code_version=2)
    assert back["ok"] is True and back["changed"] == ["step"]
    step = run.wait_for(lambda e: e["event"] == "step" and e["code_version"] == 2, what="a step after the rollback")
    assert step["scalars"] == {"scale": 1.0}

    run.send("quit")
    assert run.finish() == 0, run.explain()


def test_sigterm_exits_cleanly_with_an_exit_event(headless) -> None:
    run = headless()
    run.wait_event("setup", STARTUP_TIMEOUT, status="done")
    run.steps(1)
    os.kill(run.proc.pid, signal.SIGTERM)
    exit_event = run.wait_event("exit")
    assert (exit_event["reason"], exit_event["code"]) == ("quit", 0)
    assert run.finish() == 0, run.explain()


def test_closing_stdin_does_not_stop_the_run(headless) -> None:
    run = headless(None, "--max-steps", "30")
    run.wait_event("setup", STARTUP_TIMEOUT, status="done")
    assert run.proc.stdin is not None
    run.proc.stdin.close()
    exit_event = run.wait_event("exit", 30)
    assert (exit_event["reason"], exit_event["step"]) == ("max steps", 30)
    assert run.finish() == 0, run.explain()


def test_closing_stdin_while_paused_ends_the_run_with_a_final_snapshot(headless) -> None:
    """Nobody can send `resume` once stdin is closed: a run paused by the user (a driver script that died) waited
    forever, holding its model; it ends as SIGTERM ends it, with the trained state kept."""
    run = headless(None, "--paused", "--no-watch")
    run.wait_event("paused", STARTUP_TIMEOUT)
    run.send("step")
    run.send("step")
    run.wait_event("step", 15, step=2)
    assert run.proc.stdin is not None
    run.proc.stdin.close()
    snapshot = run.wait_event("snapshot", 30)
    assert snapshot["step"] == 2 and Path(snapshot["path"]).is_file(), snapshot
    exit_event = run.wait_event("exit", 30)
    assert (exit_event["reason"], exit_event["code"], exit_event["step"]) == ("input closed", 0, 2)
    assert run.finish() == 0, run.explain()


def test_reload_of_one_file_answers_once_for_it_whatever_it_finds(headless) -> None:
    """`reload FILE` (saves not watched): one `reload` event for that file, whether it applied a change or found none,
    so a script knows when its save took effect; a file that is not the project's is refused, nothing reloaded."""
    run = headless(None, "--paused", "--no-watch")
    run.wait_event("paused", STARTUP_TIMEOUT)
    save(run.entry, TRAIN_PY.replace('"scale": SCALE}', '"scale": SCALE, "by_hand": 1.0}'))
    run.send("reload train.py")
    applied = run.wait_event("reload", 15, file="train.py")
    assert applied["ok"] is True and applied["changed"] == ["step"], applied
    run.send("step")
    assert run.wait_event("step")["scalars"] == {"scale": 1.0, "by_hand": 1.0}
    run.send("reload train.py")
    unchanged = run.wait_event("reload", 15, file="train.py")
    assert unchanged["notes"] == ["no code changes"] and unchanged["code_version"] == 1, unchanged
    (run.entry.parent / "helper.py").write_text("X = 1\n")
    run.send("reload helper.py")  # a project file the session does not import: said, nothing to patch
    skipped = run.wait_event("reload", 15, file="helper.py")
    assert skipped["notes"] == ["helper.py is not imported by the session: nothing to patch"], skipped
    (run.entry.parent / "notes.txt").write_text("not code\n")
    (run.entry.parent.parent / "outside.py").write_text("X = 1\n")
    for name, why in (("missing.py", "does not exist"), ("notes.txt", "is not a Python file of the project"),
                      ("../outside.py", "is not a Python file of the project")):
        run.send(f"reload {name}")
        refused = run.wait_event("error", 15, where="command")
        assert refused["message"].startswith(f"reload {name}: ") and why in refused["message"], refused
    run.send("quit")
    assert run.finish() == 0, run.explain()
    assert [e["file"] for e in run.events if e["event"] == "reload"] == ["train.py", "train.py", "helper.py"], run.explain()


def test_a_reader_of_stdout_that_goes_away_ends_the_run_with_a_final_snapshot(tmp_path: Path) -> None:
    """`vram-bench run train.py --headless | head`, or a driver that died: the next write raised out of the session
    (a chain of BrokenPipeError tracebacks), exit code 1 and no snapshot, so the trained state was lost. It ends as a
    dropped terminal's SIGHUP ends it."""
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "run", str(root / "train.py"), "--headless"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root.parent,
                            text=True, encoding="utf-8")
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = json.loads(line)
            if event["event"] == "step" and event["step"] >= 3:
                break
        proc.stdout.close()  # the reader goes away
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, stderr
    assert "stdout's reader is gone (broken pipe): writing a final snapshot, then exiting" in stderr, stderr
    assert "Traceback" not in stderr, stderr
    written = [line.rsplit(" written to ", 1)[1] for line in stderr.splitlines() if "final snapshot of step" in line]
    assert written and Path(written[0]).is_file(), stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_stdout_on_a_full_disk_does_not_end_the_run(tmp_path: Path) -> None:
    """`vram-bench run train.py --headless > events.jsonl` on a disk that fills: the write error went up through the
    session, which ended with a traceback and no snapshot. Now the run trains on to its end (here --max-steps, whose
    final snapshot is written elsewhere), and stderr says the events are lost."""
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    with open("/dev/full", "w") as full:  # every write: ENOSPC, as a full disk gives
        proc = subprocess.run([sys.executable, "-m", "workbench", "run", str(root / "train.py"), "--headless",
                               "--max-steps", "12"], stdin=subprocess.DEVNULL, stdout=full, stderr=subprocess.PIPE,
                              cwd=root.parent, text=True, encoding="utf-8", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "cannot write events to stdout (No space left on device): training goes on" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    snapshots = list((root / ".vram-bench").rglob("step-00000012.pt"))
    assert snapshots, "the final snapshot at --max-steps was written: the trained state is kept"
