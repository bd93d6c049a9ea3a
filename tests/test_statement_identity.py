"""The planner names statements by where they start in the file, not by `id()` of their nodes.

A save that shifts lines (a comment added or removed above) makes a copy of each moved statement's node
(`SourceStatement.current_node()`). The planner kept the `id()` of the copies it had run again; a copy freed
after use let a later copy, of another statement, take its address, and that statement was then skipped as
"already run". Found by the differential harness (script_import seed 73, once, under load): a save after a
rollback re-bound `batch_size` but not the `--batch-size` override below it, silently. With ids, 2-3 of 300
plans of that save missed the override; the plans must all be alike.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from differential.generator import generate
from workbench.engine.hotswap.planner import plan_reload


def test_every_plan_of_a_shifting_save_runs_the_override_below_an_edited_constant(tmp_path: Path, monkeypatch) -> None:
    sequence = generate(73, "script_import")
    saves = {action.what: action.text for action in sequence.actions if hasattr(action, "text")}
    base = next(text for what, text in saves.items() if "header 0 -> 2" in what)
    new = next(text for what, text in saves.items() if "header 2 -> 1" in what)  # header 2 -> 1, batch_size 8 -> 6
    path = tmp_path / "train_identity.py"
    path.write_text(base, encoding="utf-8")
    monkeypatch.setattr(sys, "argv", [str(path), *sequence.argv])
    spec = importlib.util.spec_from_file_location("train_identity", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "train_identity", module)
    spec.loader.exec_module(module)
    missing = 0
    for _ in range(300):
        changeset = plan_reload(module, path, base, new)
        missing += not any("binds batch_size again" in note for note in changeset.notes)
    assert missing == 0, f"{missing} of 300 plans did not run the override again"


def test_a_statement_key_is_its_start_in_the_file() -> None:
    import ast

    from workbench.engine.hotswap.statement_slice import statement_key

    first, second = ast.parse("a = 1; b = 2\nc = 3\n").body[:2]
    assert statement_key(first) == (1, 0) and statement_key(second) == (1, 7)
