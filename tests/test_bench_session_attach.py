"""bench/session_attach.py --quick: every figure of issue 16 comes out of one short pass, as numbers.

Real session processes, the real app (run_test in child processes), a real `vram-bench attach` in tmux;
the figures themselves are not asserted (a smoke pass on a shared machine says nothing about them)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRAIN_PY, make_project

pytestmark = [pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed (apt-get install tmux)"),
              pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parent.parent


def finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def test_quick_pass_produces_every_figure(tmp_path: Path) -> None:
    # The suite's small project (a 5 ms step) rather than tiny_gpt: steps keep coming on a loaded machine.
    project = make_project(tmp_path, {"train.py": TRAIN_PY})
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "session_attach.py"), "--quick", "--project", str(project),
                           "--rounds", "1", "--presses", "2", "--attaches", "2", "--history-steps", "1000",
                           "--idle-seconds", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=170, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    throughput, history, latency, idle = result["throughput"], result["history"], result["latency"], result["idle"]
    assert all(finite(throughput["median_steps_per_s"][k]) and throughput["median_steps_per_s"][k] > 0
               for k in ("detached", "attached", "inprocess"))
    assert finite(throughput["ratio"]) and finite(throughput["ratio_vs_inprocess"])
    assert history["steps_at_attach"][0] >= result["config"]["history_steps"]
    assert finite(history["full_frame"]["p95"]) and history["full_frame"]["n"] == result["config"]["attaches"]
    assert min(history["braille_cells_in_plot"]) > 0  # the frame timed as full had the loss plot drawn
    for side in ("attached", "inprocess"):
        for key in ("space", "help"):
            assert latency[side][key]["n"] >= 1 and finite(latency[side][key]["p95"])
    assert finite(idle["session_alone_pct"]) and finite(idle["app_pct"])
    for label in ("app attached vs no client", "attached vs in-process app", "full frame", "space -> PAUSING",
                  "? -> help", "paused session, no client", "attached app (tmux)"):
        assert label in done.stdout, (label, done.stdout)


def test_pairs_only_throughput_gives_a_mean_with_its_interval(tmp_path: Path) -> None:
    project = make_project(tmp_path, {"train.py": TRAIN_PY})
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "session_attach.py"), "--quick", "--only", "throughput",
                           "--no-inprocess", "--project", str(project), "--rounds", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=170, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    throughput = json.loads(out.read_text())["throughput"]
    assert not throughput["with_inprocess"] and throughput["steps_per_s"]["inprocess"] == []
    pairs = throughput["attached_over_detached"]
    assert len(pairs) == 3 and all(finite(r) and r > 0 for r in pairs)
    low, high = throughput["mean_ratio_95"]
    assert low <= throughput["mean_ratio"] <= high
    assert "mean of the pairs (95% interval)" in done.stdout and "in-process app" not in done.stdout
