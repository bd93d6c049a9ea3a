"""Did every rank run the same collectives during evaluate()? The training group's operation counts say.

`if bench.is_main:` around an evaluation forward is the classic slip under DDP and FSDP: the model's forward runs
collectives (FSDP's all-gathers, DDP's buffer broadcast) on rank 0 only. Nothing fails there: rank 0's
collectives pair up with the other ranks' next step's, so its evaluation is computed on wrong data, and the next
step hangs until the collective timeout, blamed on a rank "that did not join" (seen in a port of pytorch/examples'
FSDP2 trainer). Each process group counts the operations issued on it (torch's sequence number, which its flight
recorder and debug wrapper use too); after evaluate() every rank says how many it issued, over vram-bench's own
control group, and a difference is said at once, before any step runs on groups whose pairing is now off.

Point-to-point sends count too, so evaluate() code that sends more from one rank than another on purpose is
reported as well: the message says so, and `resume` goes on (after making the groups again)."""

from __future__ import annotations

import torch.distributed as dist


def training_operations() -> int | None:
    """How many operations this rank has issued on the default (training) process group; None when unknown."""
    try:
        if not dist.is_initialized():
            return None
        return int(dist.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - a private API: without it, no check
        return None


def mismatch_sentence(issued: list[int | None], during: str) -> str | None:
    """What to say when the ranks issued different numbers of training-group operations `during` something; None
    when they agree (or a rank cannot tell)."""
    if any(n is None for n in issued) or len(set(issued)) <= 1:
        return None
    counts = ", ".join(f"rank {rank}: {n}" for rank, n in enumerate(issued))
    return (f"{during} ran a different number of collectives on each rank ({counts} operations on the training "
            "process group): some ran on some ranks only, most likely a forward under DDP or FSDP inside `if "
            "bench.is_main:` (every rank must run it; keep only the printing or logging to rank 0). Such "
            "collectives wait for partners that never come (until --collective-timeout) or pair up with the wrong "
            "ones, so what they computed is wrong, and the next step would hang or compute garbage. Every rank is paused: fix the code and save, or resume "
            "(either makes the process groups again and rebuilds the state on every rank first)")
