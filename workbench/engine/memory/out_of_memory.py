"""What counts as running out of memory: CUDA's error, the CPU allocator's, and Python's own.

torch raises `torch.OutOfMemoryError` only for CUDA. The CPU allocator's failure (an
`RLIMIT_AS`, a container without swap, an overcommit policy that refuses) is a plain
`RuntimeError` ("DefaultCPUAllocator: can't allocate memory"), and Python's own is
`MemoryError`. All three take the out-of-memory path: the step's tensors released,
a pause with reason `out of memory`, memory reported.
"""

from __future__ import annotations

import torch

_CPU_ALLOCATOR_FAILURES = (
    "DefaultCPUAllocator: can't allocate memory",
    "Error code 12 (Cannot allocate memory)",  # ENOMEM, as c10 words it
)


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(text in str(exc) for text in _CPU_ALLOCATOR_FAILURES)
