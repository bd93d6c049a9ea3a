"""The ddp_gpt sample: two real ranks (gloo on CPU) learn, and every edit of its README's tour takes effect
on both ranks at the same step.

One session through the launcher (`--nproc-per-node 2 --headless`) on a copy of the sample: the tour's edits
are read from the README (tests/tour.py) and made in order as real saves, the rebuild the tour asks for is
sent as a command, and each is checked against what the README says. Rank 0's stdout carries every rank's
`step` events; rank 1's own `events-rank1.jsonl` has its scalars.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import conftest
from tests.event_log_file import logged_events
from tests.test_headless import Headless
from tests.tour import tour_edits

REPO = Path(__file__).resolve().parent.parent
README = REPO / "sample_projects" / "ddp_gpt" / "README.md"

NEW_LAYER = 13  # Block's tensors: 2 LayerNorms (weight, bias), q/k/v/proj (proj with a bias), the MLP's 2 Linears
TWO_LAYERS = 31  # tok_emb, pos_emb, 2 blocks, ln_f (weight, bias), head


def rank1_log(entry: Path) -> list[dict[str, Any]]:
    (run_dir,) = (entry.parent / ".vram-bench" / "runs").iterdir()
    return logged_events(run_dir / "events-rank1.jsonl")


def steps_of(events: list[dict[str, Any]], rank: int) -> dict[int, dict[str, Any]]:
    return {e["step"]: e for e in events if e["event"] == "step" and e.get("rank") == rank}


def step_before(events: list[dict[str, Any]], kind: str, rank: int) -> int:
    """The last step `rank` finished before its `kind` event: where that rank did it."""
    index = next(i for i, e in enumerate(events) if e["event"] == kind)
    return max(e["step"] for e in events[:index] if e["event"] == "step" and e.get("rank") == rank)


def readme_says(text: str) -> None:
    assert text in " ".join(README.read_text(encoding="utf-8").split()), f"the README should say {text!r}"


def stop(run: Headless) -> None:
    """Quit if it still runs, then SIGTERM (torchrun passes it to the ranks) before the last resort, SIGKILL."""
    if run.proc.poll() is None:
        try:
            run.send("quit")
            run.proc.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            run.proc.terminate()
            try:
                run.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
    run.close()


def test_two_ranks_learn_and_every_tour_edit_applies_on_both_ranks_at_the_same_step(tmp_path: Path) -> None:
    entry = conftest.copy_sample("ddp_gpt", tmp_path) / "train.py"
    project = entry.parent
    edits = tour_edits(README)
    run = Headless(entry, "--nproc-per-node", "2")

    def rank1_at(predicate, what: str) -> None:
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and predicate(e), timeout=60, what=what)

    def reload_of(edit) -> dict[str, Any]:
        edit.apply(project)
        reload = run.wait_event("reload", timeout=30)
        assert reload["ok"] and reload["file"] == edit.file, reload
        readme_says(f"`RELOAD {reload['file']} -> code v{reload['code_version']}: {', '.join(reload['changed'])}`")
        return reload

    def lr(edit) -> None:
        reload = reload_of(edit)
        assert reload["changed"] == ["LR"] and reload["code_version"] == 1, reload
        assert not [note for note in reload["notes"] if "LR" in note], reload["notes"]  # step() sets group["lr"]
        readme_says("No note says the optimizer keeps its old LR")
        rank1_at(lambda e: e["code_version"] == 1, "rank 1 on code v1")

    def attention_scale(edit) -> None:
        reload = reload_of(edit)
        assert reload["changed"] == ["CausalSelfAttention.forward"] and reload["code_version"] == 2, reload
        rank1_at(lambda e: e["code_version"] == 2, "rank 1 on code v2")

    def n_layer(edit) -> None:
        reload = reload_of(edit)
        assert reload["changed"] == ["N_LAYER"] and reload["code_version"] == 3, reload
        (note,) = reload["notes"]
        assert note.startswith("N_LAYER was read when setup() built the live state"), note
        readme_says(note)
        rank1_at(lambda e: e["code_version"] == 3, "rank 1 on code v3")
        run.send("rebuild")
        rebuilt = run.wait_event("rebuild", timeout=60)
        assert rebuilt["ok"] and rebuilt["code_version"] == 3, rebuilt
        assert rebuilt["tensors_carried"] == rebuilt["optimizer_states_carried"] == TWO_LAYERS, rebuilt
        assert len(rebuilt["new"]) == NEW_LAYER and all(n.startswith("model.module.blocks.2.") for n in rebuilt["new"])
        assert rebuilt["mismatched"] == rebuilt["dropped"] == [], rebuilt
        readme_says(f"{TWO_LAYERS} tensors carried and {TWO_LAYERS} optimizer states")
        readme_says(f"the new layer's {NEW_LAYER} tensors")
        mark = max(steps_of(run.events, 0))
        rank1_at(lambda e: e["step"] >= mark + 10, "10 steps after the rebuild")

    checks = {"lr": lr, "attention-scale": attention_scale, "n-layer": n_layer}
    assert [e.name for e in edits] == list(checks)
    try:
        started = run.wait_event("start", timeout=60)
        assert (started["rank"], started["world_size"], started["backend"]) == (0, 2, "gloo")
        rank1_at(lambda e: e["step"] >= 40, "rank 1 at step 40")
        for edit in edits:
            checks[edit.name](edit)
        run.send("quit")
        assert run.finish(timeout=60) == 0, run.explain()
    finally:
        stop(run)

    zero, one = steps_of(run.events, 0), steps_of(rank1_log(entry), 1)
    common = sorted(set(zero) & set(one))
    assert common == list(range(1, len(common) + 1)) and len(common) >= 60, common[-1:]

    # Every rank ran the same code at every step, and DDP kept the replicas equal (the rebuild too).
    for step in common:
        a, b = zero[step], one[step]
        assert a["code_version"] == b["code_version"], (step, a, b)
        for name in ("grad_norm", "weight_norm"):
            assert a["scalars"][name] == pytest.approx(b["scalars"][name], rel=1e-6), (step, name, a, b)
    # Each rank draws its own batches: their losses differ.
    assert sum(zero[s]["loss"] != one[s]["loss"] for s in common) > len(common) // 2

    # It learns: from about ln 64 to well below it within 40 steps.
    assert zero[1]["loss"] == pytest.approx(4.16, abs=0.05)
    assert sum(zero[s]["loss"] for s in range(31, 41)) / 10 < zero[1]["loss"] - 1.0

    # (a) every rank's lr changes at the step that first runs code v1.
    for steps in (zero, one):
        first_v1 = min(s for s in common if steps[s]["code_version"] == 1)
        assert {steps[s]["scalars"]["lr"] for s in common if s < first_v1} == {3e-3}
        assert {steps[s]["scalars"]["lr"] for s in common if s >= first_v1} == {3e-4}

    # Rank 0 said each reload once; rank 1 applied the same changes.
    said = [e["changed"] for e in run.events if e["event"] == "reload"]
    assert said == [["LR"], ["CausalSelfAttention.forward"], ["N_LAYER"]]
    assert [e["changed"] for e in rank1_log(entry) if e["event"] == "reload"] == said

    # (c) both ranks rebuilt between the same two steps; the new layer (the same on both) adds to the weights' norm.
    boundary = step_before(run.events, "rebuild", rank=0)
    assert step_before(rank1_log(entry), "rebuild", rank=1) == boundary
    assert zero[boundary + 1]["scalars"]["weight_norm"] > zero[boundary]["scalars"]["weight_norm"] + 1.0
    before = sum(zero[s]["loss"] for s in range(boundary - 4, boundary + 1)) / 5
    after = sum(zero[s]["loss"] for s in range(boundary + 1, boundary + 6)) / 5
    assert after < before + 0.5, (before, after)


def test_run_alone_it_trains_as_one_process_without_ddp(tmp_path: Path) -> None:
    entry = conftest.copy_sample("ddp_gpt", tmp_path) / "train.py"
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "run", str(entry), "--headless", "--max-steps", "5", "--no-watch"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert "world_size" not in events[0] or events[0]["world_size"] == 1, events[0]
    steps = [e for e in events if e["event"] == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    assert all(set(s["scalars"]) == {"grad_norm", "weight_norm", "lr"} for s in steps), steps
