"""Output through streams the project's import kept: a logging handler (`logging.basicConfig()` at the top of a
script), a tqdm bar made at import. They hold the stream that was sys.stderr while the file was imported, which the
session's router had not wrapped, and their writes from step() went to the raw stderr: past the headless stream's
`print` events and the app's log (an x-transformers trainer, ported)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import make_project
from tests.test_headless import Headless

TRAIN_PY = """\
import logging
import sys

import torch

logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
log = logging.getLogger("trainer")
err = sys.stderr  # what a progress bar made at import writes to


def setup(bench):
    log.info("setup ran")
    return {"model": torch.nn.Linear(2, 1)}


def step(state, bench):
    log.info("step %d logged", bench.step)
    err.write(f"bar {bench.step}\\n")
    err.flush()
    return 0.0
"""


def test_a_logger_and_a_stream_kept_at_import_write_print_events_from_step(tmp_path: Path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    run = Headless(root / "train.py", "--max-steps", "3", "--no-watch")
    try:
        assert run.finish(timeout=60) == 0, run.explain()
    finally:
        run.close()
    printed = [(e["stream"], e["text"]) for e in run.events if e["event"] == "print"]
    for text in ("trainer setup ran", "trainer step 0 logged", "trainer step 2 logged", "bar 1"):
        assert ("stderr", text) in printed, (text, printed)
    assert "logged" not in run.stderr and "bar " not in run.stderr, run.stderr
