"""MKL's thread count held steady, so a session computes what a plain loop computes on the same machine.

MKL picks how many threads a matrix product uses by how busy the machine looks when it runs (`MKL_DYNAMIC`, on by
default), and the blocking, hence the order of a float sum, follows the thread count. Beside training, a session's
own threads wake (the memory sampler, the event writers); each wake could make MKL use fewer threads for a product,
and two runs of the same code from the same seed drifted apart by rounding (sample_projects/memory_lab on two
cores: 28 of 40 steps' losses differed between two straight runs, none with MKL_DYNAMIC=FALSE or a plain loop).
Set before torch is imported, and only where the user has not set it.
"""

from __future__ import annotations

import os


def hold_blas_threads_steady() -> None:
    os.environ.setdefault("MKL_DYNAMIC", "FALSE")
