"""The differential promise under torchrun: on 2 ranks, after every save, rebuild, rollback and x, each rank runs
what a fresh start on the same files runs, or the reload event says what differs.

tests/test_differential.py proves it in one process. Here each sequence runs under `vram-bench run --nproc-per-node 2`
(tests/differential/ranks.py): rank 0's values are judged against the fresh start after every action, and every step
rank 1 trained must equal rank 0's. The seeds below cover a save that does not parse, rebuilds, rollbacks and x in
each family; `python tests/differential --ranks 2 --family F --count N` is the long run (bench/RESULTS.md).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from differential.generator import RebuildNow, RollbackNow, Save, generate
from differential.ranks import LiveRanks
from differential.report import explain, summary
from differential.runner import APPLIED, REPORTED, Harness
from differential.script import RunStatementsNow

pytestmark = pytest.mark.timeout(600)

CASES = (("two_file", 0), ("two_file", 7), ("two_file", 11), ("script", 0), ("script", 8), ("script_import", 3),
         ("script_config", 0), ("script_config", 10))


# Running: each action comes while the ranks train, and rank 1's every step is compared with rank 0's.
RUNNING_CASES = (("two_file", 7), ("two_file", 11), ("script", 8), ("script_config", 10))


@pytest.mark.parametrize("running", [False, True], ids=["paused", "running"])
def test_every_rank_runs_what_a_fresh_start_runs_after_every_kind_of_action(one_torch_thread, running: bool) -> None:
    sequences = [generate(seed, family) for family, seed in (RUNNING_CASES if running else CASES)]
    kinds = {type(action) for sequence in sequences for action in sequence.actions}
    assert {RebuildNow, RollbackNow, RunStatementsNow, Save} <= kinds
    assert any(isinstance(a, Save) and a.broken for s in sequences for a in s.actions), "a save that does not parse"
    started = time.monotonic()
    with Harness(ranks=2, running=running) as harness:
        results = [harness.run(sequence) for sequence in sequences]
    took = summary(results, time.monotonic() - started)
    bad = [r for r in results if r.outcome not in (APPLIED, REPORTED) or r.problems]
    assert not bad, took + "\n\n" + "\n\n".join(explain(r) for r in bad[:3])
    assert {r.outcome for r in results} == {APPLIED, REPORTED}, took
    assert sum(len(r.checks) for r in results) >= sum(len(s.actions) + 1 for s in sequences), took


RANK_DEPENDENT = """
import torch


def setup(bench):
    return {"w": torch.zeros(1)}


def step(state, bench):
    return {"loss": 1.0, "who": float(bench.rank)}
"""


def test_a_step_that_trains_otherwise_on_rank_1_is_caught(tmp_path: Path) -> None:
    """The check of rank 1 reads rank 1's own steps: a step whose value depends on the rank is told apart."""
    with LiveRanks(tmp_path / "proj", {"train.py": RANK_DEPENDENT}) as live:
        first, _ = live.step()
        reloaded = live.save("train.py", RANK_DEPENDENT.replace('"loss": 1.0', '"loss": 2.0'))
        second, _ = live.step()
    assert first.scalars == {"who": 0.0, "loss": 1.0} and second.scalars == {"who": 0.0, "loss": 2.0}
    assert reloaded[-1].ok and reloaded[-1].changed == ("step",), reloaded[-1]
    assert live.ranks_apart == [
        "step 1: rank 1 loss 1.0 scalars {'who': 1.0}, rank 0 loss 1.0 scalars {'who': 0.0}",
        "step 2: rank 1 loss 2.0 scalars {'who': 1.0}, rank 0 loss 2.0 scalars {'who': 0.0}",
    ]
