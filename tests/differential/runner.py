"""Run a sequence on a live session and check every step against a fresh start.

After the first step (the start is a fresh start, so it must equal one exactly)
and after every save, rebuild, rollback and x (run the statements a reload
left), one step runs and its scalars are judged against the oracle's for the
reference sources: the files on disk, or what a rollback restored. A save that cannot run (a syntax error) must fail to
reload and leave every value as it was.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from workbench.protocol.events import Error, Event, Rebuilt, Reload

from differential.generator import Action, RebuildNow, RollbackNow, Save, Sequence
from differential.judge import Verdict, judge, unchanged
from differential.ledger import Ledger, texts_of
from differential.live import LiveError, LiveProject
from differential.oracle import Oracle
from differential.ranks import RANKS, LiveRanks
from differential.script import RunStatementsNow, ScriptSequence

APPLIED, REPORTED, SILENT = "applied", "held/noted", "silent"


@dataclass
class Check:
    """One step after one action, and what the judge made of it."""

    action: str
    events: list[Event]
    live: dict[str, float]
    fresh: dict[str, float]
    verdict: Verdict
    against: str  # "disk", "rolled-back sources", or "the values before" (a save that cannot run)
    step_error: str | None = None


@dataclass
class Result:
    sequence: Sequence | ScriptSequence
    checks: list[Check] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the harness could not judge: a bug here or a hung session
    ranks_apart: list[str] = field(default_factory=list)  # under torchrun: steps where rank 1 trained otherwise

    @property
    def outcome(self) -> str:
        if self.ranks_apart or any(c.verdict.silent for c in self.checks):
            return SILENT
        if any(c.verdict.differing for c in self.checks):
            return REPORTED
        return APPLIED


class Harness:
    """One oracle process and one scratch folder for many sequences; `ranks=2`: each sequence under torchrun."""

    def __init__(self, ranks: int = 1, running: bool = False) -> None:
        if ranks not in (1, RANKS) or (running and ranks == 1):
            raise ValueError(f"ranks is 1 or {RANKS}, not {ranks}; running (actions while training) needs {RANKS}")
        self.live = LiveProject if ranks == 1 else partial(LiveRanks, running=running)
        self.oracle = Oracle()
        self.root = Path(tempfile.mkdtemp(prefix="vram-bench-differential-"))
        self.count = 0

    def close(self) -> None:
        self.oracle.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, sequence: Sequence | ScriptSequence) -> Result:
        self.count += 1
        folder = self.root / f"seq{self.count}"
        try:
            return _Run(sequence, self.oracle, folder, self.live).run()
        except LiveError as exc:  # a session that did not answer: this sequence's problem, the run goes on
            return Result(sequence, problems=[f"the live session: {exc}"])
        finally:
            shutil.rmtree(folder, ignore_errors=True)


class _Run:
    def __init__(self, sequence: Sequence | ScriptSequence, oracle: Oracle, folder: Path,
                 live: Callable[..., LiveProject | LiveRanks] = LiveProject) -> None:
        self.live_kind = live
        self.sequence = sequence
        self.oracle = oracle
        self.folder = folder
        self.ledger = Ledger(sequence.initial_files())
        self.result = Result(sequence)
        # Reload/rebuild events since the state was last built fresh. Nothing said before a rebuild excuses a
        # difference after it: it runs the statements a reload did not re-run (x's) before it builds.
        self.window: list[Event] = []
        self.last_live: dict[str, float] = {}

    def run(self) -> Result:
        with self.live_kind(self.folder, self.sequence.initial_files(), self.sequence.argv) as live:
            self.live = live
            if not self._check("start", []):
                return self.result
            for action in self.sequence.actions:
                events = self._act(action)
                if events is None or not self._check(action.what, events, action.file if isinstance(action, Save) and action.broken else None):
                    break
        self.result.ranks_apart = getattr(live, "ranks_apart", [])
        return self.result

    def _act(self, action: Action | RunStatementsNow) -> list[Event] | None:
        if isinstance(action, Save):
            self.ledger.saved(action.file, action.text)
            events = self.live.save(action.file, action.text)
            for event in events:
                if isinstance(event, Reload):
                    self.ledger.reload(event)
        elif isinstance(action, RebuildNow):
            events = self.live.rebuild()
            rebuilt = events[-1]
            assert isinstance(rebuilt, Rebuilt)
            self.ledger.rebuilt(rebuilt)
            if rebuilt.ok:
                self.window = []
        elif isinstance(action, RunStatementsNow):
            events = self.live.run_statements()  # values, not code: the ledger's sources stay
        else:
            assert isinstance(action, RollbackNow)
            undone = self.ledger.rollback()
            events = self.live.rollback()
            answer = events[-1]
            if undone is None and not (isinstance(answer, Error) and "nothing to roll back" in answer.message):
                self.result.problems.append(f"rollback: the ledger has nothing to roll back, the session answered {answer}")
                return None
            if undone is not None and not (isinstance(answer, Reload) and answer.ok and answer.file == undone.file):
                self.result.problems.append(f"rollback: the ledger expected {undone.file} rolled back, the session answered {answer}")
                return None
        self.window.extend(e for e in events if isinstance(e, (Reload, Rebuilt)))
        return events

    def _check(self, action: str, events: list[Event], broken_file: str | None = None) -> bool:
        """Run one step and judge it; False when the sequence cannot go on."""
        step, step_events = self.live.step()
        broken = broken_file is not None
        events = [*events, *step_events]
        self.window.extend(e for e in step_events if isinstance(e, (Reload, Rebuilt)))
        argv, names = self.sequence.argv, self.sequence.scalar_names
        fresh = self.oracle.run(self.ledger.reference, argv)
        if fresh.error is not None:
            failed = any(isinstance(e, Reload) and not e.ok for e in events)
            if not (broken and failed):
                why = "the saved files cannot run, but no reload failed" if broken else f"the generated project cannot run: {fresh.error}"
                self.result.problems.append(f"after {action}: {why}")
                return False
            # The broken file keeps its live code; other files a rescan re-applied count as saved.
            assert broken_file is not None
            fresh = self.oracle.run(self.ledger.live_instead_of(broken_file), argv)
            if fresh.error is not None:
                verdict, against = unchanged(step.scalars, self.last_live), "the values before"
            else:
                verdict, against = judge(step.scalars, fresh.scalars, texts_of(self.window), names), f"the live {broken_file}"
        else:
            verdict = judge(step.scalars, fresh.scalars, texts_of(self.window), names)
            against = "rolled-back sources" if self.ledger.reference != self.ledger.disk else "disk"
        if action == "start" and verdict.differing:
            self.result.problems.append(f"the start differs from a fresh start: {verdict.differing}")
        self.result.checks.append(Check(action, events, step.scalars, fresh.scalars, verdict, against, step.error))
        self.last_live = step.scalars
        return step.error is None  # a step that raised pauses on an error; a reload would resume training
