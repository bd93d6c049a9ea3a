"""`vram-bench runs [PROJECT]`: every run of a project, newest first, as a table on stdout.

Reads only the run folders (`runs.py`): no torch import, so it answers at once.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psutil

from workbench.errors import UserError
from workbench.engine.runs import RunSummary, list_runs
from workbench.engine.state_folder import FOLDER_NAME, user_state_folder
from workbench.units import human_bytes


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="vram-bench runs",
        description="List a project's runs: start, steps, code versions, last loss, snapshots and their size.",
    )
    parser.add_argument("project", nargs="?", default=".", help="the project's entry file or folder (default: here)")
    args = parser.parse_args(argv)
    try:
        state_dir = find_state_folder(Path(args.project))
    except UserError as exc:
        print(f"vram-bench: error: {exc}", file=sys.stderr)
        return 2
    runs = list_runs(state_dir)
    if not runs:
        print(f"no runs in {state_dir}: start one with `vram-bench run {args.project}`")
        return 0
    print(f"runs of {state_dir.parent if state_dir.name == FOLDER_NAME else state_dir} (newest first; resume one with --resume PATH):")
    print(format_runs(runs))
    return 0


def find_state_folder(project: Path) -> Path:
    """The project's `.vram-bench/`, or its folder in the user's state folder (a read-only checkout)."""
    project = project.expanduser().resolve()
    root = project.parent if project.is_file() else project
    if not root.is_dir():
        raise UserError(f"{project} is not a project file or folder.")
    for candidate in (root / FOLDER_NAME, user_state_folder(root)):
        if candidate.is_dir():
            return candidate
    raise UserError(f"{root} has no runs yet (no {FOLDER_NAME} folder).", hint=f"Start one with: vram-bench run {project}")


def format_runs(runs: list[RunSummary]) -> str:
    header = ("run", "started", "status", "steps", "code", "last loss", "snapshots", "size")
    rows = [header]
    details = []
    for run in runs:
        newest = f", newest step {run.snapshots[0].step}" if run.snapshots else ""
        rows.append(
            (
                run.name,
                time.strftime("%Y-%m-%d %H:%M", time.localtime(run.started)) if run.started else "-",
                _status(run),
                "-" if run.steps is None else str(run.steps),
                "-" if run.code_version is None else f"v{run.code_version}",
                "-" if run.last_loss is None else f"{run.last_loss:.4g}",
                f"{len(run.snapshots)}{newest}",
                human_bytes(run.snapshot_bytes) if run.snapshots else "-",
            )
        )
        if run.resumed_from:
            details.append(f"  {run.name} resumed from {run.resumed_from}")
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines + details)


def _status(run: RunSummary) -> str:
    if run.legacy:
        return "earlier version"
    if run.ended is not None:
        return run.exit_reason or "ended"
    if run.pid is not None and psutil.pid_exists(run.pid):
        return "running"
    return "killed"  # no exit recorded and its process is gone (SIGKILL, OOM, power cut)
