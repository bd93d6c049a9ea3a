"""A job's wall-clock limit, seen before it kills: the final snapshot is written in time.

A batch job that reaches its limit gets SIGTERM and, a short grace period later,
SIGKILL; a large model's final snapshot may not fit in that grace. With a time limit
known (`--time-limit 3h50m`, or the job's own end time where Slurm says it), the
training thread writes the final snapshot and exits cleanly as soon as the time left
is no more than what a snapshot takes (the last one's measured duration, or an
estimate from the state's size) plus a margin.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")
# Until a snapshot has been timed: seconds per byte of state, a slow disk's 100 MB/s.
ASSUMED_WRITE_SECONDS_PER_BYTE = 1 / 100e6
MARGIN_SECONDS = 10.0  # on top of the snapshot's time: the step that may be running, the exit itself


def parse_duration(text: str) -> float:
    """`3h50m`, `90m`, `20s`, `1d2h`, `45` (seconds) or Slurm's `HH:MM:SS` / `D-HH:MM:SS` → seconds."""
    text = text.strip().lower()
    if ":" in text:
        days, _, clock = text.rpartition("-")
        parts = [float(p) for p in clock.split(":")]
        if len(parts) > 3 or not parts:
            raise ValueError(f"{text!r} is not a duration")
        while len(parts) < 3:
            parts.insert(0, 0.0)
        return (float(days) * 86400 if days else 0.0) + parts[0] * 3600 + parts[1] * 60 + parts[2]
    match = _DURATION.match(text)
    if not text or match is None or not any(match.groups()):
        raise ValueError(f"{text!r} is not a duration: use e.g. 3h50m, 90m, 20s or 1d2h")
    d, h, m, s = (float(g) if g else 0.0 for g in match.groups())
    return d * 86400 + h * 3600 + m * 60 + s


@dataclass(frozen=True)
class TimeLimit:
    deadline: float  # time.monotonic() when the job is killed
    source: str  # for the log: "--time-limit 3h50m", "Slurm job 1234 ends at 14:00:00"

    @classmethod
    def after(cls, seconds: float, source: str) -> TimeLimit:
        return cls(time.monotonic() + seconds, source)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def snapshot_due(self, snapshot_seconds: float | None, state_bytes: int, slowest_step_seconds: float) -> bool:
        """True once the time left is no more than a snapshot's time plus the margin (and the running step)."""
        needed = snapshot_seconds if snapshot_seconds is not None else state_bytes * ASSUMED_WRITE_SECONDS_PER_BYTE + 1.0
        return self.remaining() <= 1.5 * needed + MARGIN_SECONDS + slowest_step_seconds


def slurm_time_limit(
    environ: Mapping[str, str] = os.environ, run: Callable[..., subprocess.CompletedProcess] = subprocess.run
) -> TimeLimit | None:
    """The Slurm job's end: `SLURM_JOB_END_TIME` (epoch seconds, Slurm 23.02+), else `squeue -h -j ID -o %e`."""
    job = environ.get("SLURM_JOB_ID")
    if not job:
        return None
    end: float | None = None
    if environ.get("SLURM_JOB_END_TIME", "").isdigit():
        end = float(environ["SLURM_JOB_END_TIME"])
    else:
        try:
            out = run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True, text=True, timeout=10)
            end = datetime.fromisoformat(out.stdout.strip()).timestamp() if out.returncode == 0 else None
        except (OSError, ValueError, subprocess.SubprocessError):
            end = None
    if end is None:
        return None
    clock = datetime.fromtimestamp(end).strftime("%H:%M:%S")
    return TimeLimit.after(end - time.time(), f"Slurm job {job} ends at {clock}")
