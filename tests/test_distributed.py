"""Two ranks through the real launcher (torch.distributed.run, gloo on CPU): every rank swaps the same code
at the same step.

Each test starts `vram-bench run train.py --headless --nproc-per-node 2` on a small DDP project, saves
edits, and reads rank 0's event stream (which carries every rank's `step` events) and rank 1's own
`events-rank1.jsonl` in the run folder (which has its scalars, the parameter checksum among them).
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.event_log_file import logged_events
from tests.test_headless import Headless

PROJECT = textwrap.dedent(
    """
    import sys

    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    LR = 0.05
    ACCUM = 2  # nanoGPT's pattern: setup() divides it by the world size, once per fresh start


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 16)
            self.b = nn.Linear(16, 1)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))


    def setup(bench):
        global ACCUM
        assert ACCUM % bench.world_size == 0, f"ACCUM={ACCUM}"
        ACCUM //= bench.world_size
        torch.manual_seed(0)
        model = Net().to(bench.device)
        if "--no-ddp" not in sys.argv:
            model = DDP(model)
        data = torch.Generator().manual_seed(bench.rank)  # each rank its own batches: DDP averages the gradients
        return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=LR), "data": data}


    def step(state, bench):
        x = torch.randn(32, 8, generator=state["data"])
        loss = (state["model"](x) - x.sum(1, keepdim=True)).pow(2).mean()
        state["opt"].zero_grad()
        loss.backward()
        state["opt"].step()
        bench.log(checksum=sum(float(p.double().sum()) for p in state["model"].parameters()))
        return loss
    """
)


def project_folder(tmp_path: Path, source: str = PROJECT) -> Path:
    """A project folder holding `source` as train.py."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(source)
    return project


def start(tmp_path: Path, *args: str) -> Headless:
    return Headless(project_folder(tmp_path) / "train.py", "--nproc-per-node", "2", *args)


def rank_log(run: Headless) -> list[dict[str, Any]]:
    """Rank 1's own event log (all of its events, scalars included)."""
    start = next(e for e in run.events if e["event"] == "start")
    del start
    runs = sorted((run.entry.parent / ".vram-bench" / "runs").iterdir())
    return logged_events(runs[-1] / "events-rank1.jsonl")


def steps_of(events: list[dict[str, Any]], rank: int) -> dict[int, dict[str, Any]]:
    return {e["step"]: e for e in events if e["event"] == "step" and e.get("rank") == rank}


def line_of(path: Path, code: str) -> int:
    """The line number of the first line of `path` that starts with `code` once indented."""
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip().startswith(code))


def save(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    time.sleep(0.05)
    path.write_text(text.replace(old, new))


@pytest.fixture
def ranks(tmp_path: Path):
    runs: list[Headless] = []

    def make(*args: str) -> Headless:
        run = start(tmp_path, *args)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.close()


def test_two_ranks_start_with_their_rank_and_stream_both_ranks_steps(ranks):
    run = ranks("--max-steps", "12")
    started = run.wait_event("start", timeout=60)
    assert (started["rank"], started["world_size"], started["backend"]) == (0, 2, "gloo")
    assert run.finish(timeout=60) == 0
    zero, one = steps_of(run.events, 0), steps_of(run.events, 1)
    assert sorted(zero) == sorted(one) == list(range(1, 13))
    exit_event = run.events[-1]
    assert exit_event["event"] == "exit" and exit_event["reason"] == "max steps"


def test_with_an_exchange_every_turn_each_of_rank_1s_steps_is_streamed_once_as_it_ran(ranks, monkeypatch):
    """Long steps exchange at every turn, and then a rank's one new step crosses in its row rather than as bytes:
    every step of rank 1 reaches rank 0's stream once, in order, with the loss, code version and time it ran with."""
    monkeypatch.setenv("VRAM_BENCH_EXCHANGE_MS", "0")  # every turn, as for steps longer than the exchange period
    run = ranks("--max-steps", "30")
    assert run.finish(timeout=90) == 0
    streamed = [e for e in run.events if e["event"] == "step" and e.get("rank") == 1]
    assert [e["step"] for e in streamed] == list(range(1, 31))
    own = steps_of(rank_log(run), 1)
    for event in streamed:
        mine = own[event["step"]]
        assert (event["loss"], event["code_version"]) == (pytest.approx(mine["loss"], rel=1e-12), mine["code_version"])
        assert event["time"] == pytest.approx(mine["time"], abs=1e-3) and event["ms"] == pytest.approx(mine["ms"], abs=1e-3)


def test_a_quit_streams_every_step_rank_1_ran(ranks, monkeypatch):
    """The quit crossed in the same exchange as rank 1's last steps, and the loop that dispatched it stopped before
    it had published them: a quit on 2 ranks of the FSDP2 + tensor-parallel port lost rank 1's last 4 steps."""
    monkeypatch.setenv("VRAM_BENCH_EXCHANGE_MS", "5000")  # rank 1's steps wait: the quit's exchange carries them
    run = ranks()
    run.wait_for(lambda e: e["event"] == "step" and e["step"] >= 20, timeout=60, what="step 20")
    time.sleep(0.5)
    run.send("quit")
    assert run.finish(timeout=60) == 0
    assert sorted(steps_of(run.events, 1)) == sorted(steps_of(rank_log(run), 1)) == sorted(steps_of(run.events, 0))


def test_a_save_is_applied_at_the_same_step_on_both_ranks_and_parameters_stay_identical(ranks):
    run = ranks()
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 5, timeout=60, what="rank 1 at step 5")
    save(run.entry, "return self.b(torch.relu(self.a(x)))", "return self.b(torch.tanh(self.a(x)))")
    reload = run.wait_event("reload", timeout=30)
    assert reload["ok"] and reload["changed"] == ["Net.forward"], reload
    save(run.entry, "LR = 0.05", "LR = 0.02")
    reload = run.wait_event("reload", timeout=30)
    assert reload["ok"] and "LR" in reload["changed"], reload
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e.get("code_version") == 2 and True,
                 timeout=30, what="rank 1 on code v2")
    target = max(steps_of(run.events, 0)) + 5
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= target, timeout=30, what="5 more steps")
    run.wait_for(lambda e: e["event"] == "ranks" and all(r["step"] > 0 for r in e["ranks"]), timeout=10, what="a ranks summary")
    run.send("quit")
    assert run.finish(timeout=60) == 0
    zero, one = steps_of(run.events, 0), steps_of(rank_log(run), 1)
    common = sorted(set(zero) & set(one))
    assert len(common) >= 10
    for step in common:  # the same code version at every step, on both ranks
        assert zero[step]["code_version"] == one[step]["code_version"], (step, zero[step], one[step])
    first_v1 = min(s for s in common if zero[s]["code_version"] >= 1)
    assert one[first_v1]["code_version"] >= 1 and one[first_v1 - 1]["code_version"] == 0
    for step in common:  # DDP keeps the replicas equal: after each swap too
        assert zero[step]["scalars"]["checksum"] == pytest.approx(one[step]["scalars"]["checksum"], rel=1e-12), step
    summaries = [e for e in run.events if e["event"] == "ranks"]  # rank 0's summary of every rank, at most 1 Hz
    assert len(summaries) >= 2
    assert summaries and [r["rank"] for r in summaries[-1]["ranks"]] == [0, 1]
    assert all(r["step"] > 0 and r["rss_bytes"] and r["state"] for r in summaries[-1]["ranks"]), summaries[-1]
    gaps = [b["time"] - a["time"] for a, b in zip(summaries, summaries[1:])]
    assert all(gap >= 0.95 for gap in gaps), gaps


def test_rank_1_plans_a_save_ahead_and_a_plan_failing_on_rank_1_alone_is_applied_nowhere(ranks):
    """Rank 0 posts a saved source as it reads it and rank 1 plans it on its own thread meanwhile, not on its
    training thread at the boundary (planning runs a new import, so the module imported says which thread planned).
    A plan that fails on rank 1 alone is applied on no rank; one that fails on rank 0 alone is never sent, though
    rank 1 planned it; and the next save, planned against what is live rather than against either, applies on both."""
    run = ranks()
    (run.entry.parent / "probe.py").write_text("import threading\nTHREAD = threading.current_thread().name\n")
    (run.entry.parent / "rank_1_cannot.py").write_text(
        "import os\nif os.environ['RANK'] == '1':\n    raise RuntimeError('rank 1 cannot import this')\n")
    (run.entry.parent / "rank_0_cannot.py").write_text(
        "import os\nif os.environ['RANK'] == '0':\n    raise RuntimeError('rank 0 cannot import this')\n")
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=60, what="rank 1 at step 3")
    save(run.entry, "import sys\n", "import sys\nimport probe\n")
    reload = run.wait_event("reload", timeout=30)
    assert reload["ok"], reload
    save(run.entry, "bench.log(checksum=", "bench.log(planned_ahead=float(probe.THREAD == 'vram-bench-prepare-ahead'), checksum=")
    reload = run.wait_event("reload", timeout=30)
    assert reload["ok"] and reload["changed"] == ["step"], reload
    version = reload["code_version"]
    save(run.entry, "import probe\n", "import probe\nimport rank_1_cannot\n")
    failed = run.wait_event("reload", timeout=30)
    assert not failed["ok"] and failed["error"].startswith("rank 1: ") and "rank 1 cannot import this" in failed["error"], failed
    assert "Nothing was applied on any rank" in failed["error"] and failed["code_version"] == version, failed
    save(run.entry, "import rank_1_cannot\n", "")
    assert run.wait_event("reload", timeout=30)["ok"]
    save(run.entry, "import probe\n", "import probe\nimport rank_0_cannot\n")  # rank 1 plans what rank 0 never sends
    failed = run.wait_event("reload", timeout=30)
    assert not failed["ok"] and "rank 0 cannot import this" in failed["error"], failed
    save(run.entry, "import rank_0_cannot\n", "")
    assert run.wait_event("reload", timeout=30)["ok"]
    save(run.entry, "LR = 0.05\n", "LR = 0.04\n")
    reload = run.wait_event("reload", timeout=30)
    assert reload["ok"] and reload["changed"] == ["LR"] and reload["code_version"] == version + 1, reload
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e.get("code_version") == version + 1,
                 timeout=30, what="rank 1 on the last code version")
    run.send("quit")
    assert run.finish(timeout=60) == 0
    one = steps_of(rank_log(run), 1)
    logged = [e for e in one.values() if e["code_version"] >= version]
    assert logged and all(e["scalars"]["planned_ahead"] == 1.0 for e in logged), logged[:3]
    assert max(e["code_version"] for e in one.values()) == version + 1  # the failed plan was applied nowhere


def test_a_syntax_error_is_reported_once_and_both_ranks_keep_the_old_code(ranks):
    run = ranks()
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=60, what="rank 1 at step 3")
    save(run.entry, "LR = 0.05", "LR = = 0.05")
    failed = run.wait_event("reload", timeout=30)
    assert failed["ok"] is False and failed["line"] is not None, failed
    mark = max(steps_of(run.events, 1))
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= mark + 5, timeout=30, what="more steps")
    run.send("quit")
    assert run.finish(timeout=60) == 0
    assert [e for e in run.events if e["event"] == "reload"] == [failed]  # said once, by rank 0
    assert {e["code_version"] for e in run.events if e["event"] == "step"} == {0}
    assert {e["code_version"] for e in rank_log(run) if e["event"] == "step"} == {0}


def test_a_step_raising_on_rank_1_only_pauses_both_and_a_saved_fix_resumes_both(ranks, tmp_path):
    # Each rank trains its own replica here (no DDP): a step that fails on one rank cannot leave the other
    # waiting in a gradient all-reduce. (Under DDP the other rank waits there until the collective's timeout.)
    run = ranks("--", "--no-ddp")
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=60, what="rank 1 at step 3")
    # Raises after the backward pass (its collectives are done), on rank 1 alone.
    save(run.entry, "    bench.log(checksum=", "    if bench.rank == 1:\n        raise ValueError('only on rank 1')\n    bench.log(checksum=")
    error = run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "step", timeout=30, what="the step error")
    assert error["message"].startswith("rank 1: step() raised ValueError: only on rank 1"), error
    assert "ValueError" in (error.get("traceback") or "") and error["file"] == "train.py" and error["line"], error
    assert any(e["event"] == "paused" and e["reason"] == "error" for e in run.events), "rank 0 paused too"
    save(run.entry, "    if bench.rank == 1:\n        raise ValueError('only on rank 1')\n", "")
    run.wait_event("resumed", timeout=30, reason="reload")
    mark = max(steps_of(run.events, 1))
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= mark + 3, timeout=30, what="steps after the fix")
    run.send("quit")
    assert run.finish(timeout=60) == 0
    one = rank_log(run)
    assert any(e["event"] == "resumed" and e["reason"] == "reload" for e in one), "rank 1 resumed too"


def test_a_rebuild_whose_setup_fails_on_rank_1_only_is_dropped_on_every_rank(ranks):
    # No DDP here: a setup() that fails before DDP(model) would leave the other rank in DDP's first broadcast
    # until the collective timeout (then both fail, and agree so just the same).
    run = ranks("--", "--no-ddp")
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=60, what="rank 1 at step 3")
    # step() logs which model object it trains (applied first: a save that changes setup() too is held whole).
    # Then setup() (held for a rebuild) fails on rank 1.
    save(run.entry, "    bench.log(checksum=", "    bench.log(model=float(id(state['model']) % 1_000_003))\n    bench.log(checksum=")
    run.wait_for(lambda e: e["event"] == "reload" and e["ok"] and "step" in e["changed"], timeout=30, what="step swapped")
    save(run.entry, "    torch.manual_seed(0)\n", "    torch.manual_seed(0)\n    if bench.rank == 1:\n        raise MemoryError('no room on rank 1')\n")
    run.wait_for(lambda e: e["event"] == "reload" and "setup" in e.get("held", ()), timeout=30, what="setup held for rebuild")
    version = run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 0 and "model" in e.get("scalars", {}),
                           timeout=30, what="a step that logs its model")
    model_before = version["scalars"]["model"]
    run.send("rebuild")
    rebuilt = run.wait_event("rebuild", timeout=60)
    assert rebuilt["ok"] is False and "rank 1: MemoryError: no room on rank 1" in rebuilt["error"], rebuilt
    mark = max(steps_of(run.events, 1))
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= mark + 3, timeout=30, what="steps after it")
    run.send("quit")
    assert run.finish(timeout=60) == 0
    after = [e for e in run.events if e["event"] == "step" and e.get("rank") == 0 and e["time"] > rebuilt["time"]]
    assert after and {e["scalars"]["model"] for e in after} == {model_before}  # rank 0 dropped what it built
    one = rank_log(run)
    assert any(e["event"] == "rebuild" and e["ok"] is False and "MemoryError" in e["error"] for e in one), "rank 1 failed"
    assert max(e["code_version"] for e in run.events if e["event"] == "step" and e["time"] > rebuilt["time"]) == \
        max(e["code_version"] for e in one if e["event"] == "step" and e["time"] > rebuilt["time"])


RANK_SCHEDULES = textwrap.dedent(
    """
    import torch

    SWITCH = False  # edited to True: rank 1 alone makes its schedule of another class


    def setup(bench):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        other = SWITCH and bench.rank == 1
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9) if other else torch.optim.lr_scheduler.StepLR(opt, 1, 0.9)
        return {"model": model, "opt": opt, "sched": sched}


    def step(state, bench):
        loss = state["model"](torch.ones(4)).pow(2).sum()
        state["opt"].zero_grad()
        loss.backward()
        state["opt"].step()
        state["sched"].step()
        return loss
    """
)


def test_a_rebuild_that_carried_otherwise_on_rank_1_says_so_in_rank_0s_event(tmp_path: Path):
    """Each rank decides what it carries; rank 0's event speaks for every rank, so a rank that carried other counts is
    named with its own notes (here its schedule, made of another class on rank 1 alone, starts over)."""
    run = Headless(project_folder(tmp_path, RANK_SCHEDULES) / "train.py", "--nproc-per-node", "2", "--paused")
    try:
        run.wait_event("paused", timeout=90)
        run.send("step")
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 0, timeout=30, what="a step")
        run.send("rebuild")  # the same code on both ranks: nothing to add
        same = run.wait_event("rebuild", timeout=60)
        assert same["ok"] and same["schedulers_carried"] == 1 and not [n for n in same["notes"] if "rank 1" in n], same
        save(run.entry, "SWITCH = False", "SWITCH = True")
        run.wait_event("reload", timeout=30)
        run.send("rebuild")
        rebuilt = run.wait_event("rebuild", timeout=60)
        assert rebuilt["ok"] and rebuilt["schedulers_carried"] == 1, rebuilt
        told = [n for n in rebuilt["notes"] if n.startswith("rank 1 carried otherwise than rank 0: ")]
        assert len(told) == 1 and "0 LR schedules carried (rank 0: 1)" in told[0], rebuilt["notes"]
        assert "ExponentialLR" in told[0] and "another class" in told[0], told
        run.send("quit")
        assert run.finish(timeout=60) == 0, run.explain()
    finally:
        run.close()


def test_reload_of_one_file_is_answered_once_under_torchrun_for_a_file_no_rank_imports_too(tmp_path: Path):
    """`reload FILE` on 2 ranks: a change every rank applies, and a file no rank imports (rank 0 answers it alone)."""
    run = Headless(project_folder(tmp_path) / "train.py", "--nproc-per-node", "2", "--paused", "--no-watch")
    try:
        run.wait_event("paused", timeout=90)
        (run.entry.parent / "helper.py").write_text("X = 1\n")
        run.send("reload helper.py")
        skipped = run.wait_event("reload", timeout=30, file="helper.py")
        assert skipped["notes"] == ["helper.py is not imported by the session: nothing to patch"], skipped
        save(run.entry, "LR = 0.05", "LR = 0.01")
        run.send("reload train.py")
        applied = run.wait_event("reload", timeout=30, file="train.py")
        assert applied["ok"] and applied["changed"] == ["LR"] and applied["code_version"] == 1, applied
        run.send("step")
        ones = run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1, timeout=30, what="rank 1's step")
        assert ones["code_version"] == 1
        run.send("quit")
        assert run.finish(timeout=60) == 0, run.explain()
        assert [e["file"] for e in run.events if e["event"] == "reload"] == ["helper.py", "train.py"]
    finally:
        run.close()


def test_each_rank_runs_the_command_without_the_launchers_options():
    from workbench.cli.launch import worker_argv

    argv = ["run", "train.py", "--nproc-per-node", "4", "--headless", "--max-restarts=2", "--nnodes", "2",
            "--rdzv-endpoint", "h:29400", "--", "--nproc-per-node", "9"]
    assert worker_argv(argv) == ["run", "train.py", "--headless", "--", "--nproc-per-node", "9"]  # the script's own stay


def test_the_bare_command_with_a_sample_launches_ranks_that_run_the_samples_entry():
    import argparse

    from workbench.cli.launch import torchrun_argv

    args = argparse.Namespace(nproc_per_node=2, max_restarts=0, nnodes=None, rdzv_endpoint=None, entry=Path("/s/ddp_gpt/train.py"),
                              argv=["--sample", "ddp_gpt", "--nproc-per-node", "2", "--headless", "--sample-hz", "5"])
    assert torchrun_argv(args) == ["--nproc-per-node", "2", "--max-restarts", "0", "--standalone", "-m", "workbench", "run",
                                   "/s/ddp_gpt/train.py", "--headless", "--sample-hz", "5"]


def test_rank_facts_come_from_torchruns_environment_and_bad_values_are_one_clear_error():
    from workbench.engine.distributed import RankInfo, rank_info_from_env
    from workbench.errors import UserError

    assert rank_info_from_env({}) is None
    info = rank_info_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert info == RankInfo(rank=3, local_rank=1, world_size=4, local_world_size=2) and not info.is_main
    with pytest.raises(UserError, match="outside WORLD_SIZE"):
        rank_info_from_env({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(UserError, match="whole numbers"):
        rank_info_from_env({"RANK": "x", "WORLD_SIZE": "4"})


def checksums_agree_after(run: Headless, step: int) -> None:
    zero, one = steps_of(run.events, 0), steps_of(rank_log(run), 1)
    later = [s for s in sorted(set(zero) & set(one)) if s > step]
    assert len(later) >= 3, (sorted(zero)[-5:], sorted(one)[-5:])
    for s in later:
        assert zero[s]["scalars"]["checksum"] == pytest.approx(one[s]["scalars"]["checksum"], rel=1e-12), s


def test_under_ddp_a_rank_that_raises_before_the_all_reduce_pauses_both_and_a_fix_rebuilds_on_new_groups(ranks):
    run = ranks("--collective-timeout", "15")
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=60, what="rank 1 at step 3")
    # Rank 1 raises before its forward: rank 0 waits in the gradient all-reduce for it until the collective timeout.
    save(run.entry, "    x = torch.randn(32, 8", "    if bench.rank == 1:\n        raise ValueError('only on rank 1')\n    x = torch.randn(32, 8")
    # Long before the timeout, rank 0's stream says where each rank is (through the store, not a collective).
    saved = time.time()
    waiting = run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "waiting", timeout=12, what="the report")
    assert waiting["time"] - saved < 10, waiting
    assert not any(e["event"] == "error" and e.get("where") == "step" for e in run.events)  # the timeout is still ahead
    message = waiting["message"]
    assert "rank 1: paused after step" in message and "ValueError: only on rank 1" in message, message
    assert "rank 0: in step" in message and "(`loss.backward()`)" in message and "idle" in message, message
    assert "which will not join it" in message and "--collective-timeout (15 s" in message, message
    errors = []
    while len({e["message"][:6] for e in errors}) < 2:
        errors.append(run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "step", timeout=30, what="both errors"))
    by_rank = {("rank 1" if e["message"].startswith("rank 1:") else "rank 0"): e["message"] for e in errors}
    assert "ValueError: only on rank 1" in by_rank["rank 1"]
    assert "rank 0 waited in a training collective" in by_rank["rank 0"], by_rank
    save(run.entry, "    if bench.rank == 1:\n        raise ValueError('only on rank 1')\n", "")
    rebuilt = run.wait_event("rebuild", timeout=60)
    assert rebuilt["ok"] and rebuilt["tensors_carried"] >= 4, rebuilt
    resumed = run.wait_event("resumed", timeout=30)
    mark = max(steps_of(run.events, 0))
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= mark + 5, timeout=60, what="steps after")
    run.send("quit")
    assert run.finish(timeout=60) == 0
    assert resumed["reason"] == "rebuild"
    recovery = [e["message"] for e in run.events if e["event"] == "error" and e.get("where") == "recovery"]
    assert len(recovery) == 2 and "rebuilding on every rank" in recovery[0], recovery
    assert "every rank now holds rank 0's weights" in recovery[1], recovery  # a warning: nothing failed there
    assert not any(e["event"] == "error" and e.get("where") == "rebuild" for e in run.events)
    checksums_agree_after(run, mark)


def test_a_rank_stuck_in_its_step_is_named_with_its_line_and_interrupt_reaches_it_from_rank_0(ranks):
    run = ranks("--collective-timeout", "20")
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=60, what="rank 1 at step 3")
    save(run.entry, "    x = torch.randn(32, 8", "    while bench.rank == 1:\n        pass\n    x = torch.randn(32, 8")
    # Rank 1 spins in its own code; rank 0 waits for it in DDP's all-reduce. Once the wait is as long as a slow step's
    # (5 s), rank 0 says where each rank is.
    report = run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "waiting", timeout=15, what="the report")
    message = report["message"]
    spin = line_of(run.entry, "while bench.rank == 1:")
    assert "rank 1: in step" in message and f"at train.py:{spin} in step (`while bench.rank == 1:`)" in message, message
    assert "rank 0: in step" in message and "inside torch" in message, message
    assert "press i" in message, message
    run.send("interrupt")
    sent = run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "waiting" and "interrupting" in e["message"],
                        timeout=10, what="the interrupt")
    assert sent["message"].startswith("interrupting the step of rank 1 "), sent  # rank 0 waits in torch: left to it
    again = run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "waiting" and "paused after" in e["message"],
                         timeout=10, what="rank 1 interrupted")
    assert "rank 1: paused after step" in again["message"] and "step() was interrupted at train.py:3" in again["message"]
    # At the collective timeout, both pause: rank 0 with its collective's error, rank 1 with its interrupt.
    errors = [run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "step", timeout=40, what="the timeout")]
    errors.append(run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "step" and e is not errors[0],
                               timeout=10, what="both errors"))
    said = " | ".join(e["message"] for e in errors)
    assert "rank 0 waited in a training collective" in said and "rank 1: step() was interrupted" in said, said
    save(run.entry, "    while bench.rank == 1:\n        pass\n", "")
    assert run.wait_event("rebuild", timeout=60)["ok"]
    mark = max(steps_of(run.events, 0))
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= mark + 5, timeout=60, what="steps after")
    run.send("quit")
    assert run.finish(timeout=60) == 0


def test_a_job_stopped_whole_and_continued_reports_no_rank_holding_another_up(ranks):
    """SIGSTOP to every process of the job (ctrl+z of a foreground job, a batch system's suspend): no rank waited for
    another, so the steps that spanned the stop must not be reported as a hold."""
    import signal

    import psutil

    run = ranks()
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 20, timeout=60, what="rank 1 at step 20")
    root = psutil.Process(run.proc.pid)
    job = [root, *root.children(recursive=True)]
    for process in job:
        process.send_signal(signal.SIGSTOP)
    time.sleep(7)  # longer than a slow step's 5 s
    for process in job:
        process.send_signal(signal.SIGCONT)
    mark = max(steps_of(run.events, 0))
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 0 and e["step"] >= mark + 200, timeout=30,
                 what="steps after the stop")
    time.sleep(1.5)  # three of the watchdog's ticks
    run.send("quit")
    assert run.finish(timeout=60) == 0
    held = [e for e in run.events if e["event"] == "error" and e.get("where") in ("waiting", "slow step")]
    assert not held, held


def test_without_ddp_rank_0_waiting_between_steps_names_the_stuck_rank_and_interrupt_pauses_both_at_once(ranks):
    run = ranks("--", "--no-ddp")
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=60, what="rank 1 at step 3")
    save(run.entry, "    x = torch.randn(32, 8", "    while bench.rank == 1:\n        pass\n    x = torch.randn(32, 8")
    # No collective in the step: rank 0 trains on to the next exchange, and waits there for rank 1.
    report = run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "waiting", timeout=15, what="the report")
    message = report["message"]
    assert message.startswith("rank 0 has waited"), message
    assert "rank 0: waiting for the other ranks between steps" in message, message
    assert "rank 1: in step" in message and "(`while bench.rank == 1:`), busy" in message, message
    assert "--collective-timeout" not in message  # vram-bench's own exchange waits; no training collective is involved
    run.send("interrupt")
    assert run.wait_event("paused", timeout=10)["reason"] == "interrupted"  # rank 0 pauses with it: no timeout to wait for
    run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "step" and e["message"].startswith("rank 1: step() was "
                 "interrupted"), timeout=10, what="rank 1 interrupted")
    run.send("quit")
    assert run.finish(timeout=60) == 0


def test_a_forward_that_stops_using_a_parameter_pauses_both_naming_it_and_rollback_rebuilds_the_ddp_wrapper(ranks):
    run = ranks()
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=60, what="rank 1 at step 3")
    save(run.entry, "return self.b(torch.relu(self.a(x)))", "return torch.relu(self.a(x)).sum(1, keepdim=True)")
    error = run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "step", timeout=30, what="the DDP error")
    assert "no longer uses b.weight, b.bias" in error["message"], error["message"]
    assert "rollback" in error["message"] and "find_unused_parameters=True" in error["message"]
    time.sleep(1)
    assert [e for e in run.events if e["event"] == "error" and e.get("where") == "step"] == [error], "said once"
    run.send("rollback")
    rebuilt = run.wait_event("rebuild", timeout=60)
    assert rebuilt["ok"], rebuilt
    assert any("train.ACCUM" in note for note in rebuilt["notes"]), "setup() divided the file's ACCUM, not its own result"
    run.wait_event("resumed", timeout=30, reason="rebuild")
    mark = max(steps_of(run.events, 0))
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= mark + 5, timeout=60, what="steps after")
    run.send("quit")
    assert run.finish(timeout=60) == 0
    checksums_agree_after(run, mark)


def test_a_forward_rolled_back_before_ddp_fails_is_not_blamed_and_resume_rebuilds_the_wrapper(tmp_path: Path):
    """DDP raises for the unused parameters of a step at the next step's forward. Rolled back in between (minGPT,
    ported), the error blamed "the code now running" and said to roll back, which answered "nothing to roll back":
    the error names the code that ran the step, and says that `resume` rebuilds the wrapper."""
    run = Headless(project_folder(tmp_path) / "train.py", "--nproc-per-node", "2", "--paused", "--no-watch")
    try:
        run.wait_event("paused", timeout=90)
        save(run.entry, "return self.b(torch.relu(self.a(x)))", "return torch.relu(self.a(x)).sum(1, keepdim=True)")
        run.send("reload train.py")
        assert run.wait_event("reload", timeout=30)["code_version"] == 1
        run.send("step")  # step 1 runs the forward that leaves b unused; DDP says so at step 2's forward
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 0 and e["code_version"] == 1, timeout=30,
                     what="step 1")
        run.send("rollback")
        assert run.wait_event("reload", timeout=30)["code_version"] == 2
        run.send("step")
        error = run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "step", timeout=30, what="the error")
        message = error["message"]
        assert message.startswith("DistributedDataParallel: the code that ran step 1 (code version 1) did not use "
                                  "b.weight, b.bias in the loss"), message
        assert "(version 2 runs now)" in message and "(command `resume`) rebuilds every rank's DDP wrapper" in message
        assert "rollback" not in message and "no longer uses" not in message, message
        run.wait_event("paused", timeout=10, reason="error")
        run.send("resume")  # rank 1's report of the same failure may come after: it pauses nothing then
        rebuilt = run.wait_event("rebuild", timeout=60)
        assert rebuilt["ok"] and rebuilt["code_version"] == 2, rebuilt
        run.wait_event("resumed", timeout=30, reason="rebuild")
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 6, timeout=60,
                     what="steps after")
        run.send("quit")
        assert run.finish(timeout=60) == 0, run.explain()
        later = [e for e in run.events if e["event"] == "error" and e.get("where") == "step" and e is not error]
        assert all(e["message"].startswith("rank 1, before the ranks resumed: ") for e in later), later
        assert [e["reason"] for e in run.events if e["event"] == "paused"] == ["user", "error"], "no second pause"
    finally:
        run.close()
    checksums_agree_after(run, 2)  # rank 0's weights went to every rank with the new wrapper


def rank_pid(run: Headless, rank: int) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            return next(e["pid"] for e in rank_log(run) if e["event"] == "start")
        except (StopIteration, FileNotFoundError, IndexError):
            time.sleep(0.1)
    raise AssertionError(f"rank {rank} never wrote its start event")


def test_a_rank_killed_with_sigkill_ends_the_run_with_a_report_and_rank_0s_final_snapshot(ranks):
    import os
    import signal

    run = ranks()
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 5, timeout=60, what="rank 1 at step 5")
    os.kill(rank_pid(run, 1), signal.SIGKILL)
    started = time.monotonic()
    code = run.proc.wait(timeout=45)  # the deadline: nothing may hang on the dead rank
    assert time.monotonic() - started < 45
    assert code == 1
    run.wait_for(lambda e: e["event"] == "exit", timeout=10, what="rank 0's exit event")
    assert "rank 1 was killed by SIGKILL" in run.stderr, run.stderr[-2000:]
    snapshots = [e for e in run.events if e["event"] == "snapshot"]
    assert snapshots and snapshots[-1]["reason"] == "final", [e for e in run.events if e["event"] in ("error", "exit")]
    assert Path(snapshots[-1]["path"]).exists() or (run.entry.parent / snapshots[-1]["path"]).exists()


def test_the_launcher_killed_with_sigkill_leaves_no_rank_running_and_rank_0_writes_a_final_snapshot(ranks):
    """Killed itself, torchrun can neither pass a signal on nor end its ranks: re-parented to init, they trained on
    (holding their GPUs) with nobody to stop them. Each rank now sees its launcher go and stops as its SIGTERM would."""
    import os
    import signal

    import psutil

    run = ranks()
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 5, timeout=60, what="rank 1 at step 5")
    rank_0 = next(e["pid"] for e in run.events if e["event"] == "start")
    rank_processes = [psutil.Process(rank_0), psutil.Process(rank_pid(run, 1))]
    os.kill(run.proc.pid, signal.SIGKILL)
    gone, alive = psutil.wait_procs(rank_processes, timeout=30)  # the deadline: no rank may outlive its launcher
    for process in alive:
        process.kill()
    assert not alive, f"ranks still running 30 s after their launcher was killed: {[p.pid for p in alive]}"
    told = run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "launcher", timeout=10, what="the report")
    assert told["message"].startswith(f"rank 0: the launcher (torchrun, pid {run.proc.pid}) is gone"), told
    run.wait_for(lambda e: e["event"] == "exit", timeout=10, what="rank 0's exit event")
    snapshots = [e for e in run.events if e["event"] == "snapshot"]
    assert snapshots and snapshots[-1]["reason"] == "final", [e for e in run.events if e["event"] in ("error", "exit")]
    rank_1 = [e for e in rank_log(run) if e["event"] == "error" and e.get("where") == "launcher"]
    assert rank_1 and rank_1[0]["message"].startswith("rank 1: the launcher"), rank_1


def test_under_torchrun_a_reader_of_stdout_that_goes_away_ends_every_rank_with_rank_0s_final_snapshot(tmp_path: Path):
    """`vram-bench run train.py --nproc-per-node 2 --headless | head`: rank 0 writes the stream, so its next write
    fails; it ends the run as SIGHUP would, on every rank at one boundary, and the launcher exits 0."""
    import json
    import subprocess
    import sys

    entry = project_folder(tmp_path) / "train.py"
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "run", str(entry), "--headless", "--nproc-per-node", "2"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=entry.parent.parent,
                            text=True, encoding="utf-8")
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = json.loads(line)
            if event["event"] == "step" and event.get("rank") == 1 and event["step"] >= 3:
                break
        proc.stdout.close()  # the reader goes away
        _, stderr = proc.communicate(timeout=90)  # the deadline: no rank may wait on a stream nobody reads
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, stderr[-3000:]
    assert "stdout's reader is gone (broken pipe): writing a final snapshot, then exiting" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    written = [line.rsplit(" written to ", 1)[1] for line in stderr.splitlines() if "final snapshot of step" in line]
    assert written and Path(written[0]).is_file(), stderr[-3000:]
    runs = sorted((entry.parent / ".vram-bench" / "runs").iterdir())
    rank_1 = logged_events(runs[-1] / "events-rank1.jsonl")
    ended = [e for e in rank_1 if e["event"] == "exit"]
    assert ended and ended[-1]["code"] == 0 and ended[-1]["reason"] == "output closed", ended


def test_torchrun_by_hand_with_restarts_on_a_shared_store_gets_a_note_saying_how_to_unshare_it():
    from workbench.engine.distributed import rank_info_from_env, shared_store_restart_note

    env = {"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_MAX_RESTARTS": "2", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    info = rank_info_from_env(env)
    assert info is not None and info.max_restarts == 2 and info.restart == 0
    note = shared_store_restart_note(info, env)
    assert note is not None and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in note and "(--max-restarts 2)" in note
    assert shared_store_restart_note(info, {**env, "TORCHELASTIC_USE_AGENT_STORE": "False"}) is None  # unshared
    no_restarts = rank_info_from_env({**env, "TORCHELASTIC_MAX_RESTARTS": "0"})
    assert no_restarts is not None and shared_store_restart_note(no_restarts, env) is None


def test_with_max_restarts_torchrun_restarts_every_rank_after_a_sigkill_and_they_resume_from_the_last_snapshot(ranks):
    """torchrun's restart (--max-restarts) with --resume auto: the ranks of the second attempt make their groups on a
    store of their own (the shared one still held the dead rank's address) and go on from rank 0's final snapshot."""
    import os
    import signal

    run = ranks("--max-restarts", "1", "--resume", "auto")
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 5, timeout=60, what="rank 1 at step 5")
    os.kill(rank_pid(run, 1), signal.SIGKILL)
    lost = run.wait_for(lambda e: e["event"] == "exit", timeout=45, what="the first attempt's exit")
    assert lost["reason"] == "rank lost", lost
    final = [e for e in run.events if e["event"] == "snapshot"][-1]
    assert final["reason"] == "final" and final["step"] == lost["step"], final
    again = run.wait_for(lambda e: e["event"] == "start", timeout=60, what="the restarted rank 0's start")
    assert again["restart"] == 1 and again["rank"] == 0, again
    resumed = run.wait_event("resume", timeout=60)
    assert resumed["step"] == final["step"] and resumed["path"] == final["path"], resumed
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] > final["step"] + 5, timeout=60,
                 what="the restarted rank 1 training on from the snapshot")
    run.send("quit")
    assert run.finish(timeout=60) == 0, run.stderr[-2000:]
    assert "connectFullMesh failed" not in run.stderr
    assert "restart" not in next(e for e in run.events if e["event"] == "start"), "the first attempt's start has none"
    assert not [e for e in run.events if e["event"] == "error" and e.get("where") == "torchrun"], "no note: unshared"


def test_an_internal_error_on_rank_1_alone_ends_the_run_with_a_report_and_no_hang(tmp_path: Path):
    """A bug in vram-bench itself on one rank (here: its bookkeeping after a step raises on rank 1): that rank
    cannot take part in the ranks' last exchange, so it must not try (the others would wait on it); it exits, and
    the others end as for a rank that died, rank 0 with its final snapshot."""
    project = tmp_path / "proj"
    project.mkdir()
    broken = PROJECT.replace("def setup(bench):\n", textwrap.dedent(
        """
        def _break_rank_1_after_step_5(bench):
            from workbench.engine.lockstep import Lockstep
            record = Lockstep.record_step

            def failing(self, step, *args):
                if bench.rank == 1 and step >= 5:
                    raise RuntimeError("an internal error on rank 1 only")
                return record(self, step, *args)

            Lockstep.record_step = failing


        def setup(bench):
            _break_rank_1_after_step_5(bench)
        """))
    (project / "train.py").write_text(broken)
    run = Headless(project / "train.py", "--nproc-per-node", "2")
    try:
        started = time.monotonic()
        code = run.proc.wait(timeout=60)  # the deadline: nothing may hang on the rank that failed
        assert time.monotonic() - started < 60
        assert code == 1
        run.wait_for(lambda e: e["event"] == "exit", timeout=10, what="rank 0's exit event")
        errors = [e for e in run.events if e["event"] == "error"]
        assert any("rank 1" in (e.get("message") or "") or "rank lost" in (e.get("message") or "") for e in errors) or \
            "rank 1" in run.stderr, (errors, run.stderr[-2000:])
        snapshots = [e for e in run.events if e["event"] == "snapshot"]
        assert snapshots and snapshots[-1]["reason"] == "final", [e for e in run.events if e["event"] in ("error", "exit")]
    finally:
        run.close()


def test_sigterm_to_the_launcher_ends_every_rank_cleanly_after_the_final_snapshot(ranks):
    import signal

    run = ranks()
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 5, timeout=60, what="rank 1 at step 5")
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(timeout=45) == 0, run.stderr[-2000:]
    exit_event = run.wait_for(lambda e: e["event"] == "exit", timeout=10, what="rank 0's exit event")
    assert exit_event["code"] == 0
    assert [e["reason"] for e in run.events if e["event"] == "snapshot"] == ["final"]
    assert any(e["event"] == "exit" and e["code"] == 0 for e in rank_log(run)), "rank 1 ended cleanly too"


LOADER_PROJECT = textwrap.dedent(
    """
    import time
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset


    class Slow(Dataset):  # the worker is always busy: the step waits on it, as a data-bound trainer's does
        def __len__(self):
            return 100_000

        def __getitem__(self, index):
            time.sleep(0.002)
            x = torch.randn(8, generator=torch.Generator().manual_seed(index))
            return x, x.sum(0, keepdim=True)


    def batches(loader):
        while True:
            yield from loader


    def setup(bench):
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(8, 1))
        loader = DataLoader(Slow(), batch_size=8, num_workers=1, prefetch_factor=1)
        return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01), "data": batches(loader)}


    def step(state, bench):
        x, y = next(state["data"])
        loss = (state["model"](x) - y).pow(2).mean()
        state["opt"].zero_grad()
        loss.backward()
        state["opt"].step()
        return loss
    """
)


def test_sigterm_to_the_launcher_leaves_the_data_loaders_workers_to_finish_the_step_and_the_final_snapshot_is_written(
    tmp_path: Path,
):
    """torchrun sends its SIGTERM to every process of each rank's group, the DataLoader's workers too. They died with it,
    a step waiting for their next batch failed on one rank (said as a dead training group) while the other waited in
    DDP's all-reduce, and the stop ended stuck, without its final snapshot (1 run in 3 or 4). Now they keep running
    until their rank ends them: the step finishes on every rank and the stop is clean."""
    import signal

    run = Headless(project_folder(tmp_path, LOADER_PROJECT) / "train.py", "--nproc-per-node", "2")
    try:
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 5, timeout=60, what="rank 1 at step 5")
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(timeout=45) == 0, run.stderr[-2000:]
        run.wait_for(lambda e: e["event"] == "exit", timeout=10, what="rank 0's exit event")
        errors = [e["message"] for e in [*run.events, *rank_log(run)] if e["event"] == "error" and e.get("where") == "step"]
        assert errors == [], errors
        assert [e["code"] for e in rank_log(run) if e["event"] == "exit"] == [0], "rank 1 ended cleanly too"
        assert [e["reason"] for e in run.events if e["event"] == "snapshot"] == ["final"], [
            e for e in [*run.events, *rank_log(run)] if e["event"] in ("error", "exit", "snapshot", "paused")]
    finally:
        run.close()


def test_a_detached_two_rank_session_is_listed_attached_to_and_stopped_from_rank_0(tmp_path: Path):
    """`run --nproc-per-node 2` starts the launcher detached (it outlives the terminal); rank 0 serves the socket."""
    from tests.session_process_harness import Sessions, cli, wait_message, wait_until

    project = project_folder(tmp_path)
    sessions = Sessions()
    try:
        live = sessions.start(project / "train.py", "--nproc-per-node", "2")
        listed = cli(["ls"], sessions.env)
        assert live.name in listed.stdout and str(live.pid) in listed.stdout, listed.stdout  # rank 0's pid
        client = live.connect("watcher")
        wait_message(client, lambda m: m.get("event") == "step" and m.get("rank") == 1, what="rank 1's steps over the socket")
        client.send_line("pause")
        paused = wait_message(client, lambda m: m.get("event") == "paused", what="paused")
        assert paused["reason"] == "user"
        stopped = cli(["stop", live.name], sessions.env, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        assert "final snapshot" in stopped.stderr, stopped.stderr
        wait_until(lambda: not live.alive(), 30, "rank 0's exit")
        # The launcher and rank 1 end with it: nothing of the job is left.
        wait_until(lambda: not subprocess_lines(["pgrep", "-f", f"session-name {live.name}"]), 30, "the launcher and rank 1")
        rank1_exit = [e for e in rank_log_of(project) if e["event"] == "exit"]
        assert rank1_exit and rank1_exit[-1]["code"] == 0, "rank 1 stopped with rank 0"
    finally:
        sessions.close()


def test_an_attached_clients_status_says_what_rank_0_waits_for_while_a_rank_holds_it_up(tmp_path: Path):
    """The status bar's facts over the socket: `held` names the stuck rank while rank 0 waits, and clears after."""
    from tests.session_process_harness import Sessions, wait_message

    project = project_folder(tmp_path)
    sessions = Sessions()
    try:
        live = sessions.start(project / "train.py", "--nproc-per-node", "2", "--", "--no-ddp")
        client = live.connect("watcher")
        wait_message(client, lambda m: m.get("event") == "step" and m.get("rank") == 1 and m["step"] >= 3, what="rank 1's steps")
        save(project / "train.py", "    x = torch.randn(32, 8", "    while bench.rank == 1:\n        pass\n    x = torch.randn(32, 8")
        held = wait_message(client, lambda m: m.get("wire") == "status" and m.get("held"), timeout=20, what="a held status")
        spin = line_of(project / "train.py", "while bench.rank == 1:")
        assert held["held"] == f"rank 1 (busy at train.py:{spin} in step)" and held["state"] == "running", held
        client.send_line("interrupt")
        wait_message(client, lambda m: m.get("wire") == "status" and m.get("state") == "paused" and not m.get("held"),
                     timeout=15, what="paused, nothing held")
    finally:
        sessions.close()


def test_an_attached_client_follows_torchruns_restart_to_the_new_rank_0(tmp_path: Path):
    """Detached with --max-restarts: when a rank is lost and torchrun starts every rank again, the attached client
    (what the app reads) waits for the restarted rank 0 and carries on with it, instead of saying the session ended."""
    import os
    import signal

    from tests.session_process_harness import Sessions, cli, wait_until
    from workbench.protocol import registry
    from workbench.protocol.events import Error
    from workbench.protocol.remote import RemoteSession

    project = project_folder(tmp_path)
    sessions = Sessions()
    remote = None
    try:
        live = sessions.start(project / "train.py", "--nproc-per-node", "2", "--max-restarts", "1", "--resume", "auto")
        remote = RemoteSession(registry.SessionEntry(live.name, live.socket, registry.read_facts(live.socket.with_suffix(".json"))))
        remote.connect()
        said = remote.bus.subscribe()
        remote.start()
        first_pid = remote.facts["pid"]
        assert remote.facts["torchrun"]["max_restarts"] == 1 and remote.facts["torchrun"]["restart"] == 0, remote.facts
        wait_until(lambda: remote.status().step >= 5, 60, "rank 0 at step 5")
        rank1 = next(e["pid"] for e in rank_log_of(project) if e["event"] == "start")
        os.kill(rank1, signal.SIGKILL)
        messages: list[str] = []

        def restarted() -> bool:
            messages.extend(e.message for e in said.drain() if isinstance(e, Error) and e.where == "restart" and e.is_warning)
            return any("attached to the restarted rank 0" in m for m in messages)

        wait_until(restarted, 90, "the client attached to the restarted rank 0")
        assert any("torchrun starts every rank again (restart 1 of 1)" in m for m in messages), messages
        assert remote.ended is None and remote.facts["pid"] != first_pid and remote.facts["torchrun"]["restart"] == 1
        resumed_at = remote.status().step
        wait_until(lambda: remote.status().step > resumed_at + 5 and remote.status().state == "running", 60,
                   "the restarted ranks training on, seen by the same client")
        stopped = cli(["stop", live.name], sessions.env, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        wait_until(lambda: remote.ended is not None, 30, "the client seeing the end")
        assert "quit" in remote.ended, remote.ended  # the last restart is used up: a quit ends it for good
    finally:
        if remote is not None:
            remote.close()
        sessions.close()
        for pid in subprocess_lines(["pgrep", "-f", f"{project}/train.py"]):
            os.kill(int(pid), signal.SIGKILL)


def rank_log_of(project: Path) -> list[dict[str, Any]]:
    runs = sorted((project / ".vram-bench" / "runs").iterdir())
    return logged_events(runs[-1] / "events-rank1.jsonl")


def subprocess_lines(command: list[str]) -> list[str]:
    import subprocess

    done = subprocess.run(command, capture_output=True, text=True)
    return [line for line in done.stdout.splitlines() if line.strip()]


FSDP_PROJECT = textwrap.dedent(
    """
    import torch
    from torch import nn
    from torch.distributed.fsdp import fully_shard


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(64, 256)
            self.b = nn.Linear(256, 64)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))


    def setup(bench):
        torch.manual_seed(0)
        model = Net()
        fully_shard(model.a)
        fully_shard(model.b)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return {"model": model, "opt": opt, "sched": torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5),
                "data": torch.Generator().manual_seed(bench.rank)}


    def full_sum(model):  # every rank's shards (an all-gather on every rank alike)
        return sum(float(p.full_tensor().double().sum()) for p in model.parameters())


    def step(state, bench):
        before = full_sum(state["model"])
        x = torch.randn(16, 64, generator=state["data"])
        loss = (state["model"](x) - x).pow(2).mean()
        state["opt"].zero_grad()
        loss.backward()
        state["opt"].step()
        state["sched"].step()
        bench.log(before=before, after=full_sum(state["model"]), lr=state["opt"].param_groups[0]["lr"])
        return loss
    """
)


def start_fsdp(project: Path, *args: str) -> Headless:
    return Headless(project / "train.py", *args)


def test_sharded_state_is_snapshotted_by_every_rank_through_dcp_and_resumed_on_two_ranks_and_on_one(tmp_path: Path):
    project = project_folder(tmp_path, FSDP_PROJECT)
    run = start_fsdp(project, "--nproc-per-node", "2")
    try:
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 5, timeout=90, what="step 5")
        run.send("snapshot")
        taken = run.wait_event("snapshot", timeout=60)
        folder = Path(taken["path"])
        assert folder.suffix == ".dcp" and folder.is_dir(), taken
        assert (folder / ".metadata").exists() and len(list(folder.glob("*.distcp"))) == 2  # one shard per rank
        run.send("rebuild")  # setup() again on every rank: the sharded tensors are carried over shard by shard
        rebuilt = run.wait_event("rebuild", timeout=60)
        assert rebuilt["ok"] and rebuilt["tensors_carried"] == 4 and rebuilt["optimizer_states_carried"] == 4, rebuilt
        assert rebuilt["schedulers_carried"] == 1 and not any("schedule" in n for n in rebuilt["notes"]), rebuilt  # the StepLR goes on
        # Carried means the new model computes with the trained values: the first step after the rebuild starts from
        # exactly what the last one before it ended with (before the fix, FSDP2 ran on the new, uninitialized storage).
        at = next(i for i, e in enumerate(run.events) if e["event"] == "rebuild")
        last = max(steps_of(run.events[:at], 0))
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 0 and e["step"] >= last + 3, timeout=60, what="steps after")
        zero = steps_of(run.events, 0)
        assert zero[last + 1]["scalars"]["before"] == pytest.approx(zero[last]["scalars"]["after"], rel=1e-12), (zero[last], zero[last + 1])
        run.send("quit")
        assert run.finish(timeout=60) == 0
    finally:
        run.close()
    assert not list(folder.parent.glob(".tmp-*")), "no temp folder left behind"
    snapped = steps_of(run.events, 0)[taken["step"]]["scalars"]["after"]
    for nproc in ("2", "1"):  # the same world size, then another: DCP reshards
        # The first resumed run writes a final snapshot at its --max-steps: the second names the snapshot taken here.
        which = "latest" if nproc == "2" else str(folder)
        again = start_fsdp(project, "--nproc-per-node", nproc, "--resume", which, "--max-steps", str(taken["step"] + 3))
        try:
            resumed = again.wait_event("resume", timeout=90)
            assert resumed["ok"] and resumed["step"] == taken["step"] and resumed["path"] == str(folder), resumed
            # Each rank's own data generator goes on from its random state; on another number of ranks, a share of
            # the data that is divided otherwise, it starts over.
            data = ([f"data (torch.Generator): the random state step {taken['step']} had left it in, put back "
                     "(set_state())"] if nproc == "2" else
                    ["data (Generator): the snapshot's loader places are for 2 ranks' shares of the data, and this run "
                     "has 1, so they start from their beginning"])
            data.append(f"the global random states (Python's, torch's, the GPUs') each rank's own at step {taken['step']}, "
                        "put back" if nproc == "2" else f"the global random states are rank 0's at step {taken['step']} "
                        "on every rank (the snapshot is of 2 ranks, this run has 1)")
            assert resumed["schedulers"] == 1 and resumed["notes"] == [
                "sharded snapshot (torch.distributed.checkpoint): every rank read its part", *data], resumed
            assert again.finish(timeout=60) == 0
            steps = steps_of(again.events, 0)
            assert min(steps) == taken["step"] + 1 and max(steps) == taken["step"] + 3, sorted(steps)
            # The first resumed step starts from exactly the weights the snapshotted step ended with, and the LR
            # schedule goes on from the snapshot's step (StepLR: halved every 4 steps since the start).
            assert steps[taken["step"] + 1]["scalars"]["before"] == pytest.approx(snapped, rel=1e-12), nproc
            assert all(steps[k]["scalars"]["lr"] == pytest.approx(1e-3 * 0.5 ** (k // 4)) for k in steps), steps
        finally:
            again.close()
    # A model that no longer fits: nothing is loaded and the resume says what differs (it ended the session as a
    # "vram-bench internal error": DCP's CheckpointException is a BaseException); --resume-partial loads what fits.
    (project / "train.py").write_text(FSDP_PROJECT.replace("        self.b = nn.Linear(256, 64)\n",
                                                           "        self.b = nn.Linear(256, 64)\n        self.c = nn.Linear(64, 64)\n"))
    for partial in (False, True):
        again = start_fsdp(project, "--nproc-per-node", "2", "--resume", str(folder), "--max-steps", str(taken["step"] + 2),
                           *(["--resume-partial"] if partial else []))
        try:
            resumed = again.wait_event("resume", timeout=90)
            assert resumed["missing"] == ["model.c.weight", "model.c.bias"], resumed
            assert any(m.startswith("optimizer opt: ") and "not in the snapshot" in m for m in resumed["mismatched"]), resumed
            if partial:
                assert resumed["ok"] and resumed["tensors"] == 4 and resumed["optimizers"] == 0, resumed
                assert resumed["initialized"] == ["model.c.weight", "model.c.bias"]
                # The sharded snapshot's facts keep which code its run ran (code_on_record.py): the edit is said.
                assert ("train.py changed since the snapshot was taken: this run runs it as it is now, not the code "
                        "the snapshot's run ran") in resumed["notes"], resumed["notes"]
                assert again.finish(timeout=60) == 0
            else:
                assert not resumed["ok"] and "nothing was loaded" in resumed["error"] and "--resume-partial" in resumed["error"]
                assert again.finish(timeout=60) == 2  # headless: a resume that loads nothing ends the run
        finally:
            again.close()


def test_a_rank_killed_while_a_sharded_snapshot_is_written_leaves_the_previous_snapshot_whole(tmp_path: Path):
    import os
    import signal

    from workbench.engine.actions.sharded_snapshot import read_facts

    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(FSDP_PROJECT.replace("nn.Linear(64, 256)", "nn.Linear(64, 4096)")
                                      .replace("nn.Linear(256, 64)", "nn.Linear(4096, 64)"))
    run = start_fsdp(project, "--nproc-per-node", "2")
    try:
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=90, what="step 3")
        run.send("snapshot")
        first = Path(run.wait_event("snapshot", timeout=60)["path"])
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 8, timeout=60, what="step 8")
        run.send("snapshot")
        time.sleep(0.15)  # the second snapshot is being written (or just done): the kill lands somewhere in it
        os.kill(rank_pid(run, 1), signal.SIGKILL)
        run.proc.wait(timeout=60)
    finally:
        run.close()
    # Whatever has a final name is whole; the first snapshot is untouched.
    assert read_facts(first)["step"] == int(first.name[5:13])
    for folder in first.parent.glob("step-*.dcp"):
        facts = read_facts(folder)
        assert len(list(folder.glob("*.distcp"))) == 2 and facts["step"] == int(folder.name[5:13])
    again = start_fsdp(project, "--nproc-per-node", "2", "--resume", "latest", "--max-steps", "40")
    try:
        resumed = again.wait_event("resume", timeout=90)
        assert resumed["ok"], resumed
        assert again.finish(timeout=60) == 0
    finally:
        again.close()
    assert not list(first.parent.glob(".tmp-*")), "the next start removed the killed writer's temp folder"


def test_a_forward_swapped_under_fsdp2_runs_on_both_ranks(tmp_path: Path):
    """fully_shard swaps the module's class for a generated subclass (FSDPNet): the user's Net is patched."""
    project = project_folder(tmp_path, FSDP_PROJECT)
    run = start_fsdp(project, "--nproc-per-node", "2")
    try:
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=90, what="step 3")
        save(project / "train.py", "return self.b(torch.relu(self.a(x)))", "return self.b(torch.tanh(self.a(x))) * 0.5")
        reload = run.wait_event("reload", timeout=30)
        assert reload["ok"] and reload["changed"] == ["Net.forward"], reload
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e.get("code_version") == 1, timeout=30,
                     what="rank 1 on the new forward")
        # The memory breakdown counts what this rank holds: its shards (a DTensor's own storage and numel are the
        # whole tensor's, which made every rank report the full model, and its optimizer state, as its own).
        run.send("breakdown")
        parts = {p["name"]: p for p in run.wait_event("breakdown", timeout=30)["devices"][0]["parts"]}
        whole = (64 * 256 + 256 + 256 * 64 + 64) * 4
        assert parts["parameters"]["bytes"] == whole // 2, parts["parameters"]
        assert parts["parameters"]["detail"].startswith(f"{whole // 8:,} elements"), parts["parameters"]
        assert parts["optimizer state"]["bytes"] < whole + 1024, parts["optimizer state"]  # 2 moments of half the model
        run.send("quit")
        assert run.finish(timeout=60) == 0
    finally:
        run.close()
    zero, one = steps_of(run.events, 0), steps_of(run.events, 1)
    assert all(zero[s]["code_version"] == one[s]["code_version"] for s in set(zero) & set(one))


def test_a_non_finite_loss_on_one_rank_pauses_every_rank(ranks):
    run = ranks("--", "--no-ddp")
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=60, what="rank 1 at step 3")
    save(run.entry, "    loss.backward()\n", "    loss.backward()\n    if bench.rank == 1:\n        loss = loss * float('nan')\n")
    error = run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "step", timeout=30, what="the NaN report")
    assert error["message"].startswith("rank 1: loss is nan"), error
    assert any(e["event"] == "paused" and e["reason"] == "non-finite loss" for e in run.events), "rank 0 paused too"
    run.send("quit")
    assert run.finish(timeout=60) == 0


def test_a_non_finite_loss_on_one_ddp_rank_pauses_every_rank_without_a_stuck_collective(ranks):
    """Under DDP the other ranks are inside the next step's all-reduce when rank 1 sees its NaN: rank 1 trains on to the
    agreed boundary instead of pausing alone, which left rank 0 waiting in that collective for the collective timeout."""
    run = ranks()
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=60, what="rank 1 at step 3")
    save(run.entry, "    loss.backward()\n", "    loss.backward()\n    if bench.rank == 1 and bench.step > 20:\n"
         "        loss = loss * float('nan')\n")
    run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "step" and e["message"].startswith("rank 1: loss is nan"),
                 timeout=30, what="rank 1's NaN on rank 0")
    run.wait_for(lambda e: e["event"] == "ranks" and all(r["state"] == "paused" for r in e["ranks"]), timeout=15,
                 what="every rank paused")
    assert not any(e["event"] == "error" and e.get("where") == "slow step" for e in run.events), "a rank was stuck"
    steps = {e["step"] for e in rank_log(run) if e["event"] == "paused"}
    assert steps == {e["step"] for e in run.events if e["event"] == "paused"}, "both ranks paused at the same step"
    run.send("quit")
    assert run.finish(timeout=60) == 0


def test_a_paused_rank_1_stops_rank_0_long_before_the_regular_exchange(ranks, monkeypatch):
    """A rank > 0 that pauses for its own failure races through its paused turns (they take no time). It must still
    take the turn rank 0 proposes for its request, not reach the regular exchange first and wait there: with exchanges a
    minute apart, rank 0 pauses within seconds or not at all."""
    monkeypatch.setenv("VRAM_BENCH_EXCHANGE_MS", "60000")
    run = ranks("--", "--no-ddp")
    run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 0 and e["step"] >= 3, timeout=60, what="step 3")
    save(run.entry, "    loss.backward()\n",
         "    loss.backward()\n    __import__('time').sleep(0.02)\n    if bench.rank == 1 and bench.step > 20:\n"
         "        loss = loss * float('nan')\n")
    run.wait_for(lambda e: e["event"] == "reload" and e["ok"], timeout=30, what="the edit applied")
    error = run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "step", timeout=15, what="rank 1's NaN on rank 0")
    assert error["message"].startswith("rank 1: loss is nan"), error
    assert any(e["event"] == "paused" and e["reason"] == "non-finite loss" for e in run.events), "rank 0 paused too"
    run.send("quit")
    assert run.finish(timeout=60) == 0


def test_the_straggler_is_the_rank_clearly_slower_than_the_median():
    from workbench.engine.control_plane import RankRow
    from workbench.engine.lockstep import straggler

    def row(rank: int, ms: float) -> RankRow:
        return RankRow(rank=rank, payload_bytes=0, step=5, loss=1.0, ms=ms, code_version=0, state=0, step_time=0.0, cadence=1)

    assert straggler([row(0, 10.0), row(1, 10.5), row(2, 30.0), row(3, 9.8)]) == 2
    assert straggler([row(0, 10.0), row(1, 11.0)]) is None  # within 20% of the median: nobody is named
    assert straggler([row(0, 10.0)]) is None


RANK_0_EVALUATE = '''

def evaluate(state, bench):
    if bench.is_main:  # the classic slip: under FSDP the forward's all-gathers run on rank 0 alone
        with torch.no_grad():
            return {"val": float(state["model"](torch.ones(4, 64)).sum())}
    return {}
'''


def test_an_evaluate_that_runs_the_fsdp2_forward_on_rank_0_only_pauses_every_rank_and_a_fix_recovers(tmp_path: Path):
    """Found in a port of pytorch/examples' FSDP2 trainer: rank 0's evaluation collectives paired up with rank 1's
    next step's (a wrong val_loss, then a hang blamed on a rank that "did not join"); the recovery that followed
    broadcast DTensors, which c10d cannot, and ended the session as an internal error."""
    project = project_folder(tmp_path, FSDP_PROJECT + RANK_0_EVALUATE)
    run = start_fsdp(project, "--nproc-per-node", "2", "--collective-timeout", "4")
    try:
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=90, what="step 3")
        run.send("evaluate")
        said = run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "evaluate"
                            and "different number of collectives" in e["message"], timeout=60, what="the mismatch")
        assert "rank 0: 1, rank 1: 0" in said["message"] and "bench.is_main" in said["message"], said["message"]
        paused = run.wait_event("paused", timeout=10)
        assert paused["reason"] == "error"
        held = paused["step"]
        time.sleep(1)
        assert max(steps_of(run.events, 0)) == held, "no step ran on the mispaired groups"
        save(project / "train.py", '    if bench.is_main:  # the classic slip', '    if True:  # fixed')
        rebuilt = run.wait_event("rebuild", timeout=60)  # new groups first, then setup() again, shards carried over
        assert rebuilt["ok"] and rebuilt["tensors_carried"] == 4, rebuilt
        run.wait_event("resumed", timeout=30, reason="rebuild")
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= held + 3, timeout=60, what="steps after")
        run.send("evaluate")
        assert "val" in run.wait_event("evaluate", timeout=30)["scalars"]
        run.send("quit")
        assert run.finish(timeout=60) == 0
    finally:
        run.close()
    assert not [e for e in run.events if e["event"] == "error" and e.get("where") == "worker"], "no internal error"
    zero = steps_of(run.events, 0)
    assert zero[held + 1]["scalars"]["before"] == pytest.approx(zero[held]["scalars"]["after"], rel=1e-12)


EVALUATE_ON_RANK_0 = PROJECT.replace("import torch\n", "import torch\nimport torch.distributed as dist\n", 1) + textwrap.dedent(
    """

    def evaluate(state, bench):
        total = torch.ones(1)
        if bench.is_main:  # the slip: a collective on rank 0 alone
            dist.all_reduce(total)
        return {"val": float(total), "at": float(bench.step)}
    """
)


def test_eval_every_runs_evaluate_on_every_rank_at_one_boundary_and_a_collective_on_rank_0_alone_is_reported_and_paused(
        tmp_path: Path):
    """Run by each rank after its own step, `--eval-every`'s evaluate() put rank 0's all_reduce beside rank 1's next
    gradient all-reduce; now rank 0 queues the `evaluate` command, every rank runs it at one boundary, rank 0's stream
    says where each rank is while they wait, and the ranks' counts pause both."""
    project = project_folder(tmp_path, EVALUATE_ON_RANK_0)
    run = Headless(project / "train.py", "--nproc-per-node", "2", "--eval-every", "5", "--collective-timeout", "15")
    try:
        waiting = run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "waiting", timeout=60, what="the report")
        message = waiting["message"]
        assert message.startswith("the ranks' evaluate() has run for"), message
        assert "rank 0: in evaluate() for" in message and "(`dist.all_reduce(total)`)" in message, message
        assert "rank 1: done with evaluate(), waiting" in message, message
        assert "rank 0 waits inside torch/" in message and "for rank 1, which finished evaluate() without" in message, message
        said = run.wait_for(lambda e: e["event"] == "error" and e.get("where") == "evaluate"
                            and "different number of collectives" in e["message"], timeout=40, what="the mismatch")
        assert "rank 0: 1, rank 1: 0" in said["message"], said["message"]
        paused = run.wait_event("paused", timeout=10)
        held = paused["step"]
        # The step rank 0 had run when the ranks were seen inside evaluate(): the pause comes at that boundary. (Not a
        # fixed bound: on a loaded machine the doorbell proposes a later turn, and the evaluation due at step 5 ran
        # after step 11 once, in a full suite beside a process using most of a core.)
        before_report = run.events[:run.events.index(waiting)]
        evaluated_after = max(e["step"] for e in before_report if e["event"] == "step" and e.get("rank", 0) == 0)
        assert held == evaluated_after and held >= 5, "no step ran between the evaluate() and the pause"
        save(project / "train.py", "    if bench.is_main:  # the slip", "    if True:  # fixed")
        assert run.wait_event("rebuild", timeout=60)["ok"]
        run.wait_event("resumed", timeout=30, reason="rebuild")
        run.wait_for(lambda e: e["event"] == "evaluate" and e["scalars"]["val"] == 2.0, timeout=60, what="an evaluation after")
        run.send("quit")
        assert run.finish(timeout=60) == 0
    finally:
        run.close()
    zero = [e for e in run.events if e["event"] == "evaluate" and e["scalars"]["val"] == 2.0]
    one = {e["step"]: e for e in rank_log(run) if e["event"] == "evaluate" and e["scalars"]["val"] == 2.0}
    for event in zero:  # both ranks ran it at the same boundary: after the same step, the same all-reduced value
        assert event["step"] in one and one[event["step"]]["scalars"] == event["scalars"], (event, one)
    # After every 5th step exactly, as one process runs it (a turn planned from an exchange: planned_turns.py), on a
    # loaded machine too; none skipped, the pause and the rebuild between them included.
    steps = sorted(e["step"] for e in zero)
    assert steps and all(step % 5 == 0 for step in steps), steps
    assert all(later - earlier == 5 for earlier, later in zip(steps, steps[1:])), steps


def test_eval_every_runs_after_exactly_each_multiple_on_both_ranks_through_steps_sent_while_paused_a_pause_and_a_resume(
        tmp_path: Path):
    """--eval-every 3 as one process runs it: after steps 3, 6, 9, ... of rank 0, every rank at that boundary (each
    evaluate() all-reduces), none skipped or run twice, across single steps sent while paused, a resume, and a pause
    and resume while training. As a command queued by rank 0 it ran where the doorbell could agree on a turn (after
    steps 22, 46, 65 for --eval-every 20 in a transformers port)."""
    project = project_folder(tmp_path, EVALUATE_ON_RANK_0.replace("    if bench.is_main:  # the slip", "    if True:  # every rank"))
    run = Headless(project / "train.py", "--nproc-per-node", "2", "--paused", "--eval-every", "3", "--no-watch")
    try:
        run.wait_event("paused", timeout=90)
        for _ in range(4):
            run.send("step")
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] == 4, timeout=60, what="step 4")
        run.send("resume")
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank", 0) == 0 and e["step"] >= 20, timeout=60,
                     what="step 20")
        run.send("pause")
        run.wait_event("paused", timeout=30)
        run.send("resume")
        reached = run.wait_for(lambda e: e["event"] == "step" and e.get("rank", 0) == 0 and e["step"] >= 40, timeout=60,
                               what="step 40")
        run.send("quit")
        assert run.finish(timeout=60) == 0, run.explain()
    finally:
        run.close()
    last = max(steps_of(run.events, 0))
    zero = [e["step"] for e in run.events if e["event"] == "evaluate"]
    one = [e["step"] for e in rank_log(run) if e["event"] == "evaluate"]
    assert zero == list(range(3, last + 1, 3)) and reached["step"] >= 40, (zero, last)
    assert one == zero, (one, zero)  # rank 1 at the same boundaries
    assert all(e["scalars"]["val"] == 2.0 for e in run.events if e["event"] == "evaluate")  # the all-reduce paired


def test_the_evaluation_due_at_the_last_step_runs_on_every_rank_before_the_run_ends(tmp_path: Path):
    """Under torchrun --eval-every's evaluation runs at the boundary after its step, on every rank: at the last step of
    --max-steps the run ended first, and the final evaluation never ran. Each runs after exactly its step (it was a
    command, run a turn or more later: after steps 22, 46 and 65 for --eval-every 20 in a transformers port)."""
    project = project_folder(tmp_path, EVALUATE_ON_RANK_0.replace("    if bench.is_main:  # the slip", "    if True:  # every rank"))
    run = Headless(project / "train.py", "--nproc-per-node", "2", "--eval-every", "5", "--max-steps", "10")
    try:
        assert run.finish(timeout=90) == 0
    finally:
        run.close()
    assert run.events[-1]["event"] == "exit" and run.events[-1]["reason"] == "max steps", run.events[-1]
    zero = [e for e in run.events if e["event"] == "evaluate"]
    one = [e for e in rank_log(run) if e["event"] == "evaluate"]
    assert [e["step"] for e in zero] == [e["step"] for e in one] == [5, 10], (zero, one)
    assert all(e["scalars"]["val"] == 2.0 for e in zero + one)
    assert max(steps_of(run.events, 0)) == max(steps_of(rank_log(run), 1)) == 10
    assert not [e for e in run.events if e["event"] in ("paused", "error")]


# The same project wrapped in FSDP1's FullyShardedDataParallel (a CPU device works for it when named).
FSDP1_PROJECT = (
    FSDP_PROJECT.replace("from torch.distributed.fsdp import fully_shard", "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP")
    .replace("    fully_shard(model.a)\n    fully_shard(model.b)\n    fully_shard(model)\n", "    model = FSDP(model, device_id=bench.device)\n")
    .replace("    return sum(float(p.full_tensor().double().sum()) for p in model.parameters())",
             "    with FSDP.summon_full_params(model):\n        return sum(float(p.double().sum()) for p in model.parameters())")
)
assert "FSDP(model" in FSDP1_PROJECT and "summon_full_params" in FSDP1_PROJECT and "fully_shard(" not in FSDP1_PROJECT


def test_fsdp1_state_is_snapshotted_by_every_rank_and_resumed_exactly_and_a_rebuild_is_refused(tmp_path: Path):
    """FSDP1's state_dict() is a collective: rank 0 alone called it for a snapshot, which paired with the other
    rank's next step and hung it until the collective timeout."""
    project = project_folder(tmp_path, FSDP1_PROJECT)
    run = start_fsdp(project, "--nproc-per-node", "2", "--collective-timeout", "10")
    try:
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=90, what="step 3")
        run.send("snapshot")
        taken = run.wait_event("snapshot", timeout=60)
        folder = Path(taken["path"])
        assert folder.suffix == ".dcp" and len(list(folder.glob("*.distcp"))) == 2, taken
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= taken["step"] + 5, timeout=30,
                     what="steps after the snapshot")
        run.send("rebuild")
        refused = run.wait_event("rebuild", timeout=30)
        assert not refused["ok"] and "FSDP1's FullyShardedDataParallel" in refused["error"], refused
        assert "--resume latest" in refused["error"]
        mark = max(steps_of(run.events, 0))
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= mark + 3, timeout=30, what="training on")
        run.send("quit")
        assert run.finish(timeout=60) == 0
    finally:
        run.close()
    assert not [e for e in run.events if e["event"] == "error" and e.get("where") in ("step", "waiting", "worker")]
    snapped = steps_of(run.events, 0)[taken["step"]]["scalars"]["after"]
    again = start_fsdp(project, "--nproc-per-node", "2", "--resume", str(folder), "--max-steps", str(taken["step"] + 2))
    try:
        resumed = again.wait_event("resume", timeout=90)
        assert resumed["ok"] and resumed["step"] == taken["step"] and resumed["tensors"] == 4, resumed
        assert again.finish(timeout=60) == 0
    finally:
        again.close()
    assert steps_of(again.events, 0)[taken["step"] + 1]["scalars"]["before"] == pytest.approx(snapped, rel=1e-12)


@pytest.mark.parametrize("sharded", [False, True], ids=["ddp", "fsdp2"])
def test_a_time_limit_under_torchrun_ends_every_rank_at_one_boundary_after_the_final_snapshot(tmp_path: Path, sharded: bool):
    # Each rank used to check the limit on its own and end at its own turn: rank 0 wrote a sharded snapshot alone (a
    # collective the other ranks never joined) and the ranks' last exchanges paired with the wrong calls.
    source = (FSDP_PROJECT if sharded else PROJECT).replace("def step(state, bench):\n",
                                                            "def step(state, bench):\n    __import__('time').sleep(0.02)\n")
    run = Headless(project_folder(tmp_path, source) / "train.py", "--nproc-per-node", "2", "--time-limit", "16s")
    try:
        assert run.finish(timeout=60) == 0, run.explain()
    finally:
        run.close()
    said = [e for e in run.events if e["event"] == "error" and e["where"] == "time limit"]
    assert len(said) == 1 and "writing it and exiting" in said[0]["message"], said
    final = [e for e in run.events if e["event"] == "snapshot" and e["reason"] == "final"]
    assert len(final) == 1, run.explain()
    assert Path(final[0]["path"]).suffix == (".dcp" if sharded else ".pt")
    if sharded:
        assert len(list(Path(final[0]["path"]).glob("*.distcp"))) == 2, "every rank wrote its shard"
    assert run.events[-1]["event"] == "exit" and run.events[-1]["reason"] == "time limit", run.events[-1]
    ranks_exit = [e for e in rank_log(run) if e["event"] == "exit"]
    assert ranks_exit and ranks_exit[-1]["reason"] == "time limit" and ranks_exit[-1]["step"] == run.events[-1]["step"], ranks_exit


def test_the_requeue_signal_to_the_launcher_reaches_every_rank_and_the_job_is_requeued_once(tmp_path: Path, monkeypatch):
    # torchrun forwards SIGTERM, SIGINT, SIGHUP and SIGQUIT only: SIGUSR1 (Slurm's `--signal=B:USR1@120`, sent to the
    # batch shell's process, the launcher) killed the launcher, and the ranks ended as for a lost launcher (exit 1).
    import signal

    from tests.test_time_limits import fake_scheduler

    env, calls = fake_scheduler(tmp_path)
    for key in ("PATH", "SLURM_JOB_ID", "SLURM_JOB_END_TIME"):
        monkeypatch.setenv(key, env[key])
    source = PROJECT.replace("def step(state, bench):\n", "def step(state, bench):\n    __import__('time').sleep(0.02)\n")
    run = Headless(project_folder(tmp_path, source) / "train.py", "--nproc-per-node", "2", "--requeue")
    try:
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 5, timeout=90, what="step 5")
        run.proc.send_signal(signal.SIGUSR1)
        assert run.finish(timeout=60) == 0, run.explain()
    finally:
        run.close()
    assert [e["reason"] for e in run.events if e["event"] == "snapshot"] == ["final"], run.explain()
    assert run.events[-1]["event"] == "exit" and run.events[-1]["reason"] == "requeue signal", run.events[-1]
    assert [e["reason"] for e in rank_log(run) if e["event"] == "exit"] == ["requeue signal"]
    assert calls.read_text().split() == ["requeue", "4242"], "the job is requeued once, by rank 0"


ENDED_GENERATOR_PROJECT = textwrap.dedent(
    """
    import time

    import torch

    FAIL = True


    def check(bench):
        if FAIL and bench.rank == 1:
            raise ValueError("rank 1's end-of-epoch check failed")


    def epochs(bench):
        while True:
            for i in range(4):
                yield i
            check(bench)


    def setup(bench):
        return {"model": torch.nn.Linear(1, 1), "batches": epochs(bench)}


    def step(state, bench):
        time.sleep(0.02)
        bench.log(i=float(next(state["batches"])))
        return 0.0
    """
)


def test_an_error_that_ends_a_generator_on_rank_1_pauses_both_and_the_fix_rebuilds_both(tmp_path: Path):
    project = project_folder(tmp_path, ENDED_GENERATOR_PROJECT)
    run = Headless(project / "train.py", "--nproc-per-node", "2")
    try:
        failed = run.wait_for(lambda e: e["event"] == "error" and e["where"] == "step", timeout=90, what="the step error")
        assert failed["message"].startswith("rank 1: step() raised ValueError"), failed
        assert "so saving a fix (or resuming) rebuilds first" in failed["message"], failed
        save(project / "train.py", "FAIL = True", "FAIL = False")
        said = run.wait_for(lambda e: e["event"] == "error" and e["where"] == "recovery", timeout=60, what="recovery")
        assert said["message"].startswith("step 5's ValueError ended state['batches']") and "on every rank" in said["message"], said
        assert run.wait_event("rebuild", timeout=60)["ok"]
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 9, timeout=60, what="step 9")
        run.send("quit")
        assert run.finish(timeout=60) == 0, run.explain()
    finally:
        run.close()
    assert not [e for e in run.events if e["event"] == "paused" and e["reason"] == "data exhausted"]
    ones = steps_of(rank_log(run), 1)
    assert [ones[k]["scalars"]["i"] for k in range(5, 9)] == [0.0, 1.0, 2.0, 3.0], "rank 1 reads a new generator"
