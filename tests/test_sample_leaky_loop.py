"""The leaky_loop sample: it trains, it leaks the two ways its README says, and the README's fixes, saved live, stop both.

One real session trains a copy of the sample. The leak finder (command `leaks`,
key t) must name both leaking globals, the way the README quotes it. Then every
tour edit of the README is applied in order as a real save, and the census after
it must show what the README says: the losses' graphs gone, the cache bounded.
Sizes are asserted on the census's tensor bytes, which are exact, rather than on
RSS, which the allocator keeps high after the tensors are freed.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.conftest import Live, is_event, open_session
from tests.tour import TourEdit, tour_edits
from workbench.protocol.events import FindLeaks, LeaksFound, RunCleanup
from tests import conftest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_projects" / "leaky_loop"
README = SAMPLE / "README.md"

SMOOTHING, DRIFT_LAG = 20, 10  # as train.py sets them
FEATURES_BYTES = 32 * 512 * 4  # one probe batch's features: PROBE_ROWS x HIDDEN float32
LEAK_STEPS = 40  # steps before the first census



def copy_sample(tmp_path: Path) -> Path:
    return conftest.copy_sample("leaky_loop", tmp_path)


def census(live: Live) -> LeaksFound:
    live.send(FindLeaks())
    event = live.wait_for(is_event("leaks"), timeout=60)
    assert isinstance(event, LeaksFound)
    return event


def suspect(report: LeaksFound, global_name: str) -> dict | None:
    """The suspect whose referrer chain ends at the module global `train.<global_name>`, if any."""
    found = [s for s in report.suspects if s["referrers"] and s["referrers"][-1].endswith(f"train.{global_name}")]
    assert len(found) <= 1, report.suspects
    return found[0] if found else None


def shown(report: LeaksFound) -> str:
    lines = [f"step {report.step}: unowned {report.unowned_bytes} of {report.total_bytes} bytes"]
    lines += [f"{s['count']} x {s['description']}: {s['bytes']} <- {' <- '.join(s['referrers'])}" for s in report.suspects]
    return "\n".join(lines)


def test_trains_headless_with_a_falling_loss(tmp_path):
    project = copy_sample(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "run", str(project / "train.py"), "--headless", "--max-steps", "20", "--no-watch"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # as one_torch_thread does in-process
    )
    assert proc.returncode == 0, proc.stderr
    steps = [e for e in map(json.loads, proc.stdout.splitlines()) if e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 21))
    losses = [e["loss"] for e in steps]
    assert all(isinstance(x, float) and math.isfinite(x) for x in losses), losses
    assert abs(losses[0] - math.log(10)) < 0.2, "the first loss is a uniform guess over 10 classes"
    assert sum(losses[-5:]) / 5 < losses[0] - 0.3, f"the loss did not fall: {losses}"
    assert all({"held_out_loss", "drift"} <= set(e["scalars"]) for e in steps[DRIFT_LAG + 1 :])


@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar")  # the README's clue
def test_the_leak_finder_names_both_leaks_and_the_tour_fixes_them(tmp_path):
    project = copy_sample(tmp_path)
    edits = tour_edits(README)
    readme = README.read_text(encoding="utf-8")
    with open_session(project / "train.py") as live:
        live.wait_for(is_event("setup", status="done"), timeout=60)
        steps = live.events.steps(LEAK_STEPS, timeout=60)
        assert all(math.isfinite(s.loss) for s in steps)

        # What the README quotes from the leak finder: one loss per step with its graph, held by train.LOSSES,
        # and one (32, 512) feature tensor per step, held by train.FEATURE_CACHE.
        first = census(live)
        losses, cache = suspect(first, "LOSSES"), suspect(first, "FEATURE_CACHE")
        assert losses is not None and cache is not None, shown(first)
        assert losses["count"] >= LEAK_STEPS and cache["count"] >= LEAK_STEPS, shown(first)
        assert losses["description"].startswith("float32 [] on cpu, requires_grad, grad_fn=NllLossBackward0, its autograd graph keeps")
        assert losses["referrers"] == (f"list ({losses['count']} items)", "module global train.LOSSES"), shown(first)
        assert cache["description"] == "float32 [32, 512] on cpu", shown(first)
        assert cache["referrers"][0].startswith("dict key ") and cache["referrers"][1:] == ("module global train.FEATURE_CACHE",)
        # Each graph keeps the two hidden activations (64 KiB each) and more; each cache entry is 64 KiB.
        assert losses["bytes"] >= losses["count"] * 2 * FEATURES_BYTES, shown(first)
        assert cache["bytes"] == cache["count"] * FEATURES_BYTES, shown(first)
        assert first.suspects[0] == losses, "the losses' graphs are the largest suspect"
        for text in ("<- module global train.LOSSES", "<- module global train.FEATURE_CACHE", "grad_fn=NllLossBackward0"):
            assert text in readme, f"the README should quote {text!r}"
        leaked_before = losses["bytes"] + cache["bytes"]
        state = {"cache_count": cache["count"], "version": 0}

        def saved(edit: TourEdit) -> None:
            """Apply the edit as a save; the reload changes `step`, and the new code runs a step."""
            edit.apply(project)
            state["version"] += 1
            version = state["version"]
            reload = live.wait_for(is_event("reload", code_version=version), timeout=30, what=f"the reload of {edit.name}")
            assert reload.ok and reload.changed == ("step",), reload
            assert f"`RELOAD train.py -> code v{version}: step`" in readme, "the README quotes the reload log's line"
            live.events.steps(1, lambda e: e.code_version == version, timeout=30)

        def fix_losses(edit: TourEdit) -> None:
            saved(edit)
            # The last SMOOTHING losses with graphs age out over the next SMOOTHING steps.
            live.events.steps(SMOOTHING + 1, timeout=60)
            report = census(live)
            assert suspect(report, "LOSSES") is None, shown(report)
            assert not any("NllLossBackward0" in s["description"] for s in report.suspects), shown(report)
            cache = suspect(report, "FEATURE_CACHE")
            assert cache is not None and cache["count"] > state["cache_count"] + SMOOTHING, "the cache keeps growing"
            assert all(math.isfinite(s.loss) for s in live.events.of("step"))

        def fix_cache(edit: TourEdit) -> None:
            saved(edit)
            counts = []
            for _ in range(2):
                live.events.steps(DRIFT_LAG + 2, timeout=60)
                report = census(live)
                cache = suspect(report, "FEATURE_CACHE")
                assert cache is not None, shown(report)
                counts.append(cache["count"])
                assert cache["bytes"] == (DRIFT_LAG + 1) * FEATURES_BYTES, shown(report)
            assert counts == [DRIFT_LAG + 1, DRIFT_LAG + 1], f"the cache must stay at {DRIFT_LAG + 1} entries: {counts}"
            assert cache["bytes"] < leaked_before / 10, shown(report)
            held_by_globals = [s for s in report.suspects if "module global" in s["referrers"][-1]]
            assert held_by_globals == [cache], f"only the bounded cache is left\n{shown(report)}"
            # Unowned bytes fell from the leaks' tens of MiB to little more than the bounded cache.
            assert report.unowned_bytes < first.unowned_bytes / 2, f"{shown(first)}\n---\n{shown(report)}"
            steps = live.events.steps(3, timeout=30)
            assert all(math.isfinite(s.loss) and "drift" in s.scalars for s in steps)

        CHECKS: dict[str, Callable[[TourEdit], None]] = {"fix-losses": fix_losses, "fix-cache": fix_cache}
        assert [e.name for e in edits] == list(CHECKS)
        for edit in edits:
            CHECKS[edit.name](edit)

        # After the fixes, cleanup hands the freed heap back (malloc_trim): RSS falls, as the README says.
        live.send(RunCleanup())
        cleanup = live.wait_for(is_event("cleanup"), timeout=30)
        assert cleanup.after["rss"] < cleanup.before["rss"] and cleanup.freed_bytes > 0, cleanup


def load_train(project: Path):
    spec = importlib.util.spec_from_file_location("leaky_loop_train_under_test", project / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_safety_valve_stops_a_growing_leak_but_not_a_fixed_one(tmp_path):
    train = load_train(copy_sample(tmp_path))
    limit = train.LEAK_LIMIT
    train.LOSSES.extend(torch.zeros((), requires_grad=True) * 1 for _ in range(limit + 1))
    with pytest.raises(RuntimeError, match=rf"stops here: LOSSES holds {limit + 1} losses with their graphs \(LEAK_LIMIT is {limit}\).*README.md"):
        train.check_leak_limit()
    train.LOSSES.append(0.5)  # fixed: the newest entry is a float, so the list no longer grows graphs
    train.check_leak_limit()
    train.FEATURE_CACHE.update((i, None) for i in range(limit + 1))
    with pytest.raises(RuntimeError, match=rf"stops here: FEATURE_CACHE holds {limit + 1} tensors \(LEAK_LIMIT"):
        train.check_leak_limit()
