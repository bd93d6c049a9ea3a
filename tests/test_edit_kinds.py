"""Every kind of edit a PyTorch user makes, on a live session: applied, or held back with a reason.

The cases (and the checks on live objects behind each verdict) live in
bench/edit_kinds.py, which also runs them through IPython's autoreload and
jurigged for bench/RESULTS.md. Here only vram-bench runs, and a verdict of
"silently stale" or "silently wrong" fails the test.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "bench" / "edit_kinds.py"
_spec = importlib.util.spec_from_file_location("bench_edit_kinds", _PATH)
edit_kinds = importlib.util.module_from_spec(_spec)
sys.modules["bench_edit_kinds"] = edit_kinds
_spec.loader.exec_module(edit_kinds)

# What vram-bench must do with each edit: apply it, or say why not (never guess).
EXPECTED_REPORTED = {
    "decorators",
    "closure_vars",
    "model_statement",
    "env_statement",
    "init_forward",
    "bases",
    "dataclass",
    "setup",
    "generator",
    "syntax_error",
    "step_removed",
}


@pytest.mark.parametrize("case", edit_kinds.CASES, ids=[c.id for c in edit_kinds.CASES])
def test_edit_is_applied_or_reported_never_silently_wrong(case):
    assert set(EXPECTED_REPORTED) <= {c.id for c in edit_kinds.CASES}
    result = edit_kinds.run_one("vram-bench", case)
    expected = "reported" if case.id in EXPECTED_REPORTED else "applied"
    assert result["category"] == expected, f"{case.title}: {result['cell']} - {result['reason']}"
