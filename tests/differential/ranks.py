"""The live side under torchrun: the same project run on 2 ranks by `vram-bench run --nproc-per-node 2`.

The generated projects use no collective, so every rank trains what a single process would, and each rank's
values must equal a fresh start's: rank 0's are judged after every action as LiveProject's are, and at the end every
step rank 1 trained (from its own event log, which holds its scalars; rank 0's stream carries only its loss) must
equal rank 0's at that step. That proves on every rank what the single-process harness proves on one: a saved file
crosses as its text, each rank plans it and applies it at the same boundary, and rebuild, rollback and x run on all.

Driven through the headless protocol, as a script would: started paused and unwatched, a save is `reload FILE` (one
`reload` event answers it), a step is `step`. The protocol, the launcher and the ranks are all real.

`running=True`: every action comes while the ranks train (resumed, then paused again some steps after its answer, for
the judged step), so saves, rebuilds, rollbacks and x land wherever the ranks are, through the doorbell's proposed
boundary rather than the paused exchange of every turn. Rank 1's steps are then compared with rank 0's over every
step trained: a change applied at another step on one rank shows there.
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
SHOWN_APART = 5  # steps listed where rank 1 trained otherwise (running, thousands may)
STEPS_AFTER = 20  # running: steps trained after an action's answer before the pause for the judged step


class LiveRanks:
    """`vram-bench run train.py --nproc-per-node 2 --headless` on `folder`: LiveProject's actions, on every rank."""

    def __init__(self, folder: Path, files: dict[str, str], argv: tuple[str, ...] = (), running: bool = False) -> None:
        self.folder = folder
        self.argv = argv
        self.running = running
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
        return self._act(f"reload {file}", lambda e: e.name == "reload" and e.file == file, f"the reload of {file}",
                         before=lambda: write(self.folder / file, text))

    def rebuild(self) -> list[Event]:
        return self._act("rebuild", lambda e: isinstance(e, Rebuilt), "a rebuild event")

    def rollback(self) -> list[Event]:
        return self._act("rollback", lambda e: e.name == "reload" or (isinstance(e, Error) and e.where == "command"),
                         "a rollback's answer")

    def run_statements(self) -> list[Event]:
        return self._act("run-statements",
                         lambda e: e.name == "reload" or (isinstance(e, Error) and e.where in ("command", "reload")),
                         "the answer to run-statements")

    def _act(self, line: str, answered: Callable[[Event], bool], what: str,
             before: Callable[[], None] | None = None) -> list[Event]:
        """Send `line` (after `before`, the file's write), and return the events up to its answer, the answer last (the
        runner reads it there). Running: sent while the ranks train, paused again STEPS_AFTER steps after the answer
        (the events until then come before the answer; the steps' are left out)."""
        if self.running:
            self._send("resume")
            self._until(lambda e: e.name == "resumed", "the ranks to resume")
        if before is not None:
            before()
        self._send(line)
        *events, answer = self._until(answered, what)
        if self.running:
            after = self._last_step + STEPS_AFTER
            events += self._until(lambda e: (isinstance(e, Step) and not e.rank and e.step >= after)
                                  or e.name == "paused", "steps after it")  # or a pause for a step that failed
            if events[-1].name != "paused":
                self._send("pause")
                events += self._until(lambda e: e.name == "paused", "the ranks to pause")
        return [*(e for e in events if not isinstance(e, Step)), answer]

    def step(self) -> tuple[StepResult, list[Event]]:
        self._send("step")
        events = self._until(lambda e: (isinstance(e, Step) and not e.rank)
                             or (isinstance(e, Error) and e.where in ("step", "command")), "one step")
        last = events[-1]
        if isinstance(last, Step):
            return StepResult(dict(last.scalars) | {"loss": last.loss}), events[:-1]
        assert isinstance(last, Error)
        return StepResult({}, error=last.message), events[:-1]

    @property
    def _last_step(self) -> int:
        return max(self._steps, default=0)

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
        if len(apart) > SHOWN_APART:
            apart[SHOWN_APART:] = [f"... and {len(apart) - SHOWN_APART} more steps"]
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
            if isinstance(event, Step) and not event.rank:
                self._steps[event.step] = (event.loss, dict(event.scalars))
            out.append(event)
            if predicate(event):
                return out
            if event.name == "exit":
                raise LiveError(f"waiting for {what}: the run exited; events: {_shown(out)}")


def _shown(events: list[Event]) -> list[dict[str, Any]]:
    return [e.to_dict() for e in events if e.name not in ("memory", "ranks")]
