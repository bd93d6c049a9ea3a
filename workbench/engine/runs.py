"""Run folders: each session writes into its own `<state>/runs/<start time>/`, so runs never
overwrite or prune each other.

A run folder holds the session's snapshots, traces, memory snapshots, `events.jsonl` and
versions exports, plus `run.json`: when it started, what it resumed from, and (updated at
each snapshot and at exit) how far it got. `--resume latest` and `vram-bench runs` read them.
Snapshots from before run folders existed (`<state>/snapshots/`) count as one older run.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.engine.actions.leftovers import temp_prefix

RUNS = "runs"
RECORD = "run.json"
LEGACY = "snapshots"  # `<state>/snapshots/`: where versions before run folders wrote every run's snapshots
_SNAPSHOT = re.compile(r"^step-(\d+)\.(?:pt|dcp)$")  # .dcp: a folder, a sharded snapshot
_RUN_NAME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d)(?:-(\d+))?$")


def new_run_folder(state_dir: Path, started: float | None = None) -> Path:
    """Create this session's run folder, named for its start time (`-2`, `-3`... when two start in one second)."""
    base = time.strftime("%Y-%m-%dT%H-%M-%S", time.localtime(started))
    (state_dir / RUNS).mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        path = state_dir / RUNS / (base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")


def run_sort_key(folder: Path) -> tuple[str, int]:
    """Start order: the folder names are start times, and `-N` counts up within one second."""
    match = _RUN_NAME.match(folder.name)
    if match is None:
        return ("", 0)  # not a run folder vram-bench made: oldest
    return (match.group(1), int(match.group(2) or 1))


def snapshot_step(path: Path) -> int | None:
    match = _SNAPSHOT.match(path.name)
    return int(match.group(1)) if match else None


def snapshots_by_step(folder: Path) -> list[Path]:
    """Complete snapshots in a folder, highest step first (temp files are never listed)."""
    found = [(step, p) for p in _entries(folder) if (step := snapshot_step(p)) is not None]
    return [p for _, p in sorted(found, key=lambda pair: pair[0], reverse=True)]


def run_folders(state_dir: Path) -> list[Path]:
    """Every run folder, newest start first."""
    return sorted((p for p in _entries(state_dir / RUNS) if p.is_dir()), key=run_sort_key, reverse=True)


def latest_snapshot(state_dir: Path) -> Path | None:
    """The highest step of the newest run that has a snapshot; the old shared folder last.

    By run and step, never by file time: a snapshot touched or copied later is not newer training."""
    for folder in [*(run / "snapshots" for run in run_folders(state_dir)), state_dir / LEGACY]:
        found = snapshots_by_step(folder)
        if found:
            return found[0]
    return None


def run_of_snapshot(path: Path) -> Path | None:
    """The run folder a snapshot was written into (None for the old shared folder or a file elsewhere)."""
    if path.parent.name == "snapshots" and path.parent.parent.parent.name == RUNS:
        return path.parent.parent
    return None


def leftover_folders(state_dir: Path) -> list[Path]:
    """Where a killed writer may have left a temp file: every run's snapshots and memory folders, the old one."""
    folders = [state_dir / LEGACY]
    for run in run_folders(state_dir):
        folders += [run, run / "snapshots", run / "memory"]
    return folders


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


class RunRecord:
    """`run.json`: written at start, updated at each snapshot and at exit (atomically: never half a file)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / RECORD
        self._fields: dict[str, Any] = {}

    def start(self, project: str, resumed_from: Path | None = None) -> None:
        self._fields = {
            "started": time.time(),
            "project": project,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "resumed_from": str(resumed_from) if resumed_from else None,
            "step": 0,
            "code_version": 0,
            "last_loss": None,
            "ended": None,
            "exit_reason": None,
        }
        self._write()

    def update(self, **fields: Any) -> None:
        """Best effort: a record that cannot be written (disk full) never stops training."""
        if not self._fields:
            return
        self._fields.update(fields)
        try:
            self._write()
        except OSError:
            pass

    def _write(self) -> None:
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(), suffix=".json", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(self._fields, out, indent=1)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


@dataclass(frozen=True)
class SnapshotFile:
    path: Path
    step: int
    bytes: int


@dataclass
class RunSummary:
    """One run for `vram-bench runs`: what its record and its snapshot folder say."""

    name: str
    path: Path
    started: float | None = None
    ended: float | None = None
    exit_reason: str | None = None
    steps: int | None = None
    code_version: int | None = None
    last_loss: float | None = None
    resumed_from: str | None = None
    pid: int | None = None
    snapshots: list[SnapshotFile] = field(default_factory=list)
    legacy: bool = False

    @property
    def snapshot_bytes(self) -> int:
        return sum(s.bytes for s in self.snapshots)


def read_record(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def list_runs(state_dir: Path) -> list[RunSummary]:
    """Every run, newest first, and the old shared snapshot folder (if it has snapshots) last."""
    runs = []
    for folder in run_folders(state_dir):
        record = read_record(folder)
        snapshots = _snapshot_files(folder / "snapshots")
        if not record and not snapshots:
            continue  # a session that never started
        runs.append(
            RunSummary(
                name=folder.name,
                path=folder,
                started=_number(record.get("started")),
                ended=_number(record.get("ended")),
                exit_reason=record.get("exit_reason"),
                steps=_int(record.get("step")),
                code_version=_int(record.get("code_version")),
                last_loss=_number(record.get("last_loss")),
                resumed_from=record.get("resumed_from"),
                pid=_int(record.get("pid")),
                snapshots=snapshots,
            )
        )
    legacy = _snapshot_files(state_dir / LEGACY)
    if legacy:
        runs.append(
            RunSummary(name="(before run folders)", path=state_dir / LEGACY, steps=legacy[0].step, snapshots=legacy, legacy=True)
        )
    return runs


def _snapshot_files(folder: Path) -> list[SnapshotFile]:
    files = []
    for path in snapshots_by_step(folder):
        try:
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size
            files.append(SnapshotFile(path, snapshot_step(path) or 0, size))
        except OSError:
            continue
    return files


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
