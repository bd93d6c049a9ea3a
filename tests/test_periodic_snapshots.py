"""`--snapshot-every N` and the end at `--max-steps`: what a run trained is on disk when it ends or dies.

A headless run that reached --max-steps exited without a snapshot (the trained model went with the process, where one
whose data ran out wrote a final one), and a run killed outright kept only what someone had asked to snapshot. Now
the run takes a snapshot after every Nth step and a final one at --max-steps; under torchrun every rank does both
at the boundary after exactly that step of rank 0 (planned_turns.py), so a sharded state's shards are all written.
"""

from __future__ import annotations

from pathlib import Path

from conftest import TRAIN_PY, make_project
from tests.test_distributed import PROJECT, project_folder, rank_log
from tests.test_headless import Headless


def _snapshots(events: list[dict]) -> list[tuple[int, str]]:
    return [(e["step"], e["reason"]) for e in events if e["event"] == "snapshot"]


def _ran_to_its_end(entry: Path, *args: str, timeout: float = 120) -> Headless:
    """A headless run of `entry`, waited for; it must exit 0."""
    run = Headless(entry, *args)
    try:
        assert run.finish(timeout=timeout) == 0, run.explain()
    finally:
        run.close()
    return run


def _resumed_at(run: Headless) -> int:
    resumed = next(e for e in run.events if e["event"] == "resume")
    assert resumed["ok"], resumed
    return resumed["step"]


def test_one_process_snapshots_after_every_nth_step_and_at_max_steps_and_a_resume_takes_the_last(tmp_path: Path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    run = _ran_to_its_end(root / "train.py", "--snapshot-every", "4", "--max-steps", "10")
    assert _snapshots(run.events) == [(4, "periodic"), (8, "periodic"), (10, "final")], run.explain()
    assert run.events[-1]["event"] == "exit" and run.events[-1]["reason"] == "max steps"
    assert all(Path(e["path"]).is_file() for e in run.events if e["event"] == "snapshot")
    again = _ran_to_its_end(root / "train.py", "--resume", "latest", "--max-steps", "12")
    assert _resumed_at(again) == 10
    assert _snapshots(again.events) == [(12, "final")], "the resumed run's own end"


def test_under_torchrun_every_rank_snapshots_after_exactly_every_nth_step_of_rank_0_and_ends_with_a_final_one(
        tmp_path: Path) -> None:
    project = project_folder(tmp_path, PROJECT)
    run = _ran_to_its_end(project / "train.py", "--nproc-per-node", "2", "--snapshot-every", "4", "--max-steps", "10")
    assert _snapshots(run.events) == [(4, "periodic"), (8, "periodic"), (10, "final")], run.explain()
    ends = [e for e in run.events if e["event"] == "exit"], [e for e in rank_log(run) if e["event"] == "exit"]
    assert [(e["reason"], e["step"]) for e in ends[0] + ends[1]] == [("max steps", 10)] * 2, ends
    again = _ran_to_its_end(project / "train.py", "--nproc-per-node", "2", "--resume", "latest", "--max-steps", "11")
    assert _resumed_at(again) == 10


def test_a_headless_run_that_reaches_max_steps_writes_a_final_snapshot(tmp_path: Path) -> None:
    """As a run whose data runs out does: the trained model was lost with the process."""
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    run = _ran_to_its_end(root / "train.py", "--max-steps", "3")
    assert _snapshots(run.events) == [(3, "final")], run.explain()


def test_under_torchrun_a_sharded_state_is_snapshotted_every_nth_step_by_every_rank_and_at_the_end(tmp_path: Path) -> None:
    """FSDP2 on CPU: each periodic snapshot and the final one is a DCP folder with one shard per rank, which needs every
    rank to write at one boundary."""
    from tests.test_distributed import FSDP_PROJECT

    project = project_folder(tmp_path, FSDP_PROJECT)
    run = _ran_to_its_end(project / "train.py", "--nproc-per-node", "2", "--snapshot-every", "3", "--max-steps", "7",
                          timeout=180)
    assert _snapshots(run.events) == [(3, "periodic"), (6, "periodic"), (7, "final")], run.explain()
    for event in (e for e in run.events if e["event"] == "snapshot"):
        folder = Path(event["path"])
        assert folder.suffix == ".dcp" and len(list(folder.glob("*.distcp"))) == 2, event  # one shard per rank


def test_the_log_says_what_took_a_snapshot_nobody_asked_for_just_now(tmp_path: Path) -> None:
    """Every 100 steps a `SNAPSHOT ... at step 100` line came with no word of why: a periodic one reads as asked for."""
    from rich.text import Text

    from workbench.frontends.tui.widgets.reload_log import render_entry
    from workbench.protocol.events import Snapshot

    def line(reason: str) -> str:
        rendered = render_entry(Snapshot(path=str(tmp_path / "step-00000100.pt"), bytes=1024, step=100, reason=reason),
                                tmp_path, timestamps=False)
        assert isinstance(rendered, Text)
        return rendered.plain

    assert line("periodic") == "SNAPSHOT step-00000100.pt (1.00 KiB) at step 100 (periodic)"
    assert line("final") == "SNAPSHOT step-00000100.pt (1.00 KiB) at step 100 (final)"
    assert line("requested") == "SNAPSHOT step-00000100.pt (1.00 KiB) at step 100"
