"""Requeue the batch job after its final snapshot, so the next start resumes (`--resume latest`).

The Slurm convention (PyTorch Lightning's, submitit's): the scheduler sends SIGUSR1 some
time before the job's limit (`#SBATCH --signal=USR1@90`); the job checkpoints, asks to be
requeued, and exits 0. Only Slurm is known today: `scontrol requeue $SLURM_JOB_ID`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping


def requeue_job(
    environ: Mapping[str, str] = os.environ, run: Callable[..., subprocess.CompletedProcess] = subprocess.run
) -> tuple[bool, str]:
    """(done, a sentence for the log)."""
    job = environ.get("SLURM_JOB_ID")
    if not job:
        return False, "--requeue: not running under Slurm (no SLURM_JOB_ID), so nothing was requeued"
    command = ["scontrol", "requeue", job]
    try:
        out = run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"`{' '.join(command)}` could not run ({exc}); the job was not requeued"
    if out.returncode != 0:
        why = (out.stderr or out.stdout).strip().splitlines()[-1:] or [f"exit status {out.returncode}"]
        return False, f"`{' '.join(command)}` failed: {why[0]}; the job was not requeued"
    return True, f"requeued Slurm job {job} (`{' '.join(command)}`): its next start resumes with --resume latest"
