"""The live side under torchrun: the same project run on 2 ranks by `vram-bench run --nproc-per-node 2`.

The generated projects use no collective, so every rank trains what a single process would, and each rank's
values must equal a fresh start's: rank 0's are judged after every action as LiveProject's are, and at the end every
step rank 1 trained (from its own event log, which holds its scalars; rank 0's stream carries only its loss) must
equal rank 0's at that step. That proves on every rank what the single-process harness proves on one: a saved file
crosses as its text, each rank plans it and applies it at the same boundary, and rebuild, rollback and x run on all.

Driven through the headless protocol, as a script would: started paused and unwatched, a save is `reload FILE` (one
`reload` event answers it), a step is `step`. The protocol, the launcher and the ranks are all real.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.protocol.events import Error, Event, Rebuilt, Step, event_from_dict

from differential.live import LiveError, StepResult, write

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT = 90.0  # two ranks importing torch on a busy 2-core CI machine
TIMEOUT = 30.0
RANKS = 2


class LiveRanks:
    """`vram-bench run train.py --nproc-per-node 2 --headless` on `folder`: LiveProject's actions, on every rank."""

    def __init__(self, folder: Path, files: dict[str, str], argv: tuple[str, ...] = ()) -> None:
        self.folder = folder
        self.argv = argv
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            write(folder / name, text)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._steps: dict[int, tuple[float, dict[str, float]]] = {}  # rank 0's: step -> (loss, scalars)
        self.ranks_apart: list[str] = []  # filled as the run ends: where rank 1 trained otherwise than rank 0
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> LiveRanks:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
        command = [sys.executable, "-m", "workbench", "run", "train.py", "--nproc-per-node", str(RANKS), "--headless",
                   "--paused", "--no-watch", *(("--", *self.argv) if self.argv else ())]
        self._process = subprocess.Popen(command, cwd=self.folder, env=env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        threading.Thread(target=self._pump, daemon=True).start()
        self._until(lambda e: e.name == "paused", "every rank to finish setup() and pause", STARTUP_TIMEOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None
        try:
            if self._process.poll() is None:
                self._send("quit")
                self._until(lambda e: e.name == "exit", "the run to end")
                self._process.wait(TIMEOUT)
                self.ranks_apart = self._rank_one_apart()
        finally:
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait()

    # Actions ----------------------------------------------------------------------------
    def save(self, file: str, text: str) -> list[Event]:
        write(self.folder / file, text)
        self._send(f"reload {file}")
        return self._until(lambda e: e.name == "reload" and e.file == file, f"the reload of {file}")

    def rebuild(self) -> list[Event]:
        self._send("rebuild")
        return self._until(lambda e: isinstance(e, Rebuilt), "a rebuild event")

    def rollback(self) -> list[Event]:
        self._send("rollback")
        return self._until(lambda e: e.name == "reload" or (isinstance(e, Error) and e.where == "command"),
                           "a rollback's answer")

    def run_statements(self) -> list[Event]:
        self._send("run-statements")
        return self._until(lambda e: e.name == "reload" or (isinstance(e, Error) and e.where in ("command", "reload")),
                           "the answer to run-statements")

    def step(self) -> tuple[StepResult, list[Event]]:
        self._send("step")
        events = self._until(lambda e: (isinstance(e, Step) and not e.rank)
                             or (isinstance(e, Error) and e.where in ("step", "command")), "one step")
        last = events[-1]
        if isinstance(last, Step):
            scalars = dict(last.scalars)
            self._steps[last.step] = (last.loss, scalars)
            return StepResult(scalars | {"loss": last.loss}), events[:-1]
        assert isinstance(last, Error)
        return StepResult({}, error=last.message), events[:-1]

    # Rank 1 ------------------------------------------------------------------------------
    def _rank_one_apart(self) -> list[str]:
        """Every step rank 1 trained whose loss or scalars are not rank 0's at that step."""
        logs = sorted(self.folder.glob(".vram-bench/runs/*/events-rank1.jsonl"))
        if len(logs) != 1:
            return [f"rank 1's event log: expected one, found {[str(p) for p in logs]}"]
        apart = []
        trained = 0
        for line in logs[0].read_text(encoding="utf-8").splitlines():
            event = json.loads(line)
            if event["event"] != "step":
                continue
            trained += 1
            mine = (event["loss"], event["scalars"])
            theirs = self._steps.get(event["step"])
            if theirs is None:
                apart.append(f"rank 1 trained step {event['step']}, rank 0 did not stream it")
            elif mine != theirs:
                apart.append(f"step {event['step']}: rank 1 loss {mine[0]} scalars {mine[1]}, "
                             f"rank 0 loss {theirs[0]} scalars {theirs[1]}")
        if trained != len(self._steps):
            apart.append(f"rank 1 trained {trained} steps, rank 0 {len(self._steps)}")
        return apart

    # The stream ---------------------------------------------------------------------------
    def _send(self, line: str) -> None:
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(line + "\n")
        self._process.stdin.flush()

    def _pump(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _until(self, predicate: Callable[[Event], bool], what: str, timeout: float = TIMEOUT) -> list[Event]:
        """Rank 0's events up to and including the first that matches."""
        deadline = time.monotonic() + timeout
        out: list[Event] = []
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise LiveError(f"waiting for {what}: nothing within {timeout} s; events: {_shown(out)}") from None
            if line is None:
                raise LiveError(f"waiting for {what}: the run's output ended; events: {_shown(out)}")
            event = event_from_dict(json.loads(line))
            out.append(event)
            if predicate(event):
                return out
            if event.name == "exit":
                raise LiveError(f"waiting for {what}: the run exited; events: {_shown(out)}")


def _shown(events: list[Event]) -> list[dict[str, Any]]:
    return [e.to_dict() for e in events if e.name not in ("memory", "ranks")]
