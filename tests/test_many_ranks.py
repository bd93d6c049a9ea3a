"""Beyond 8 ranks, rank 0 streams only its own steps and a summary of every rank (issue 17, item 5).

Real torchrun runs with 9 processes do not fit this 2-core machine in CI; the policy lives in two small
parts of the lockstep (what a rank keeps for rank 0's stream, and the once-a-second summary), tested here
on their own. Runs with 2 ranks through the real launcher are in test_distributed.py.
"""

from __future__ import annotations

import types

from workbench.engine.control_plane import RankRow
from workbench.engine.lockstep import MAX_STEP_EVENTS_RANKS, Lockstep
from workbench.engine.run_state import RunState
from workbench.protocol.eventbus import EventBus
from workbench.protocol.events import Ranks


def _lockstep(rank: int, world_size: int) -> Lockstep:
    plane = types.SimpleNamespace(rank=rank, world_size=world_size)  # only its rank and size are read here
    return Lockstep(plane)  # type: ignore[arg-type]


def test_up_to_8_ranks_every_rank_keeps_its_steps_for_rank_0s_stream():
    lockstep = _lockstep(rank=5, world_size=MAX_STEP_EVENTS_RANKS)
    lockstep.record_step(10, 0.5, 12.0, 1, 1_700_000_000.0)
    lockstep.record_step(11, 0.4, 12.5, 1, 1_700_000_000.1)
    assert list(lockstep._unsent_steps) == [10, 0.5, 12.0, 1, 1_700_000_000.0, 11, 0.4, 12.5, 1, 1_700_000_000.1]


def test_beyond_8_ranks_steps_stay_in_each_ranks_own_log():
    lockstep = _lockstep(rank=5, world_size=MAX_STEP_EVENTS_RANKS + 1)
    lockstep.record_step(10, 0.5, 12.0, 1, 1_700_000_000.0)
    assert len(lockstep._unsent_steps) == 0


def test_rank_0_summarizes_all_9_ranks_and_names_the_straggler():
    bus = EventBus()
    events = bus.subscribe()
    lockstep = _lockstep(rank=0, world_size=9)
    lockstep.rows = [
        RankRow(rank=r, payload_bytes=0, step=100 + r, loss=1.0 / (r + 1), ms=40.0 if r == 7 else 10.0, code_version=2,
                state=list(RunState).index(RunState.RUNNING), step_time=1_700_000_000.0, cadence=4,
                steps_per_second=25.0 if r == 7 else 100.0, rss=2**30, gpu_allocated=-1, gpu_reserved=-1)
        for r in range(9)
    ]
    lockstep._summarize(types.SimpleNamespace(bus=bus))  # type: ignore[arg-type]
    (summary,) = [e for e in events.drain() if isinstance(e, Ranks)]
    assert [r["rank"] for r in summary.ranks] == list(range(9))
    assert summary.slowest == 7
    assert summary.ranks[3]["step"] == 103 and summary.ranks[3]["state"] == "running"
    assert summary.ranks[3]["rss_bytes"] == 2**30 and summary.ranks[3]["gpu_allocated_bytes"] is None
