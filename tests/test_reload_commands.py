"""Held-back module statements, torch.compile'd code, and what is never patched."""

from __future__ import annotations

from pathlib import Path

import workbench
from tests.conftest import is_event, save
from workbench.protocol.events import RunStatements
from workbench.engine.project import is_project_file

TRAIN_PY = """\
import time
import torch

BUILT = []


def build(size):
    BUILT.append(size)
    return size


SIZE = build(2)


@torch.compile(backend="eager")
def double(x):
    return x * 2


def setup(bench):
    model = torch.nn.Linear(4, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def step(state, bench):
    time.sleep(0.003)
    x = torch.randn(8, 4)
    loss = (state["model"](x) - x.sum(1, keepdim=True)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return {"loss": loss, "size": float(SIZE), "built": float(len(BUILT)), "doubled": float(double(torch.ones(1)))}
"""


def test_statement_with_a_call_is_held_until_the_user_runs_it(start_session):
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    save(live.entry, TRAIN_PY.replace("SIZE = build(2)", "SIZE = build(3)"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.changed == () and any("`SIZE = build(3)` was not re-run" in n and "run-statements" in n for n in reload.notes)
    steps = live.events.steps(3)
    assert all(e.scalars["size"] == 2.0 and e.scalars["built"] == 1.0 for e in steps), "the statement ran by itself"

    live.send(RunStatements())
    ran = live.wait_for(is_event("reload", changed=("SIZE",)))
    assert ran.notes == ("ran line 12: `SIZE = build(3)`",)
    after = live.events.steps(2, lambda e: e.scalars["size"] == 3.0)
    assert after[0].scalars["built"] == 2.0, "it should run exactly once"

    live.send(RunStatements())
    assert "no held-back module statements" in live.wait_for(is_event("error", where="command")).message


def test_torch_compiled_function_runs_the_new_code_after_a_save(start_session):
    live = start_session({"train.py": TRAIN_PY})
    assert live.wait_running(2)[-1].scalars["doubled"] == 2.0
    save(live.entry, TRAIN_PY.replace("return x * 2", "return x * 3"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.changed == ("double",)
    assert any("torch.compile caches were reset" in note for note in reload.notes), reload.notes
    assert live.events.steps(2, lambda e: e.code_version == 1)[0].scalars["doubled"] == 3.0


def test_only_project_files_are_ever_patched(tmp_path):
    root = tmp_path / "proj"
    for rel in ("train.py", "pkg/helper.py", ".venv/lib/x.py", "lib/site-packages/y.py", ".vram-bench/z.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    assert is_project_file(root / "train.py", root) and is_project_file(root / "pkg/helper.py", root)
    for rel in (".venv/lib/x.py", "lib/site-packages/y.py", ".vram-bench/z.py"):
        assert not is_project_file(root / rel, root), rel
    assert not is_project_file(tmp_path / "elsewhere.py", root)
    package = Path(workbench.__file__).resolve().parent
    assert not is_project_file(package / "worker.py", package.parent), "vram-bench must never patch itself"


def test_quick_successive_saves_coalesce_and_the_last_one_wins(start_session):
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    for value in range(3, 9):
        save(live.entry, TRAIN_PY.replace("return x * 2", f"return x * {value}"))
    live.events.steps(5, lambda e: e.scalars["doubled"] == 8.0, timeout=15)
    reloads = [e for e in live.events.of("reload") if e.changed]
    assert 1 <= len(reloads) <= 3, f"six saves within milliseconds gave {len(reloads)} reloads"
    assert live.session.reloader.version == len(reloads)


def test_a_save_with_unchanged_code_changes_nothing(start_session):
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    save(live.entry, TRAIN_PY + "\n# just a comment\n")
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok and reload.changed == () and live.session.reloader.version == 0


WARNS = """\
import time
import warnings

import torch

warnings.simplefilter('ignore')


def setup(bench):
    return {}


def step(state, bench):
    time.sleep(0.01)
    return torch.zeros(())
"""


def test_a_warning_from_swapped_code_quotes_the_line_that_runs(start_session):
    """linecache kept the file as first read: a warning the new step() raised quoted the line it replaced. And a save
    that is not applied is not what runs: the lines quoted stay the running code's."""
    import linecache

    live = start_session({"train.py": WARNS})
    live.wait_running()
    linecache.getlines(str(live.entry))  # read once, as a traceback or warning before the save would have
    save(live.entry, WARNS.replace("    return torch.zeros(())", "    warnings.warn('from the new step')  # new line\n"
                                   "    return torch.zeros(())"))
    live.wait_for(is_event("reload", ok=True), timeout=30)
    # What warnings.formatwarning and traceback quote: linecache's line.
    assert linecache.getline(str(live.entry), 15).strip() == "warnings.warn('from the new step')  # new line"
    broken = WARNS.replace("def step(state, bench):", "def step(state, bench) oops")
    save(live.entry, broken)  # not applied: what runs is still the code before it
    live.wait_for(is_event("reload", ok=False), timeout=30)
    assert linecache.getline(str(live.entry), 15).strip() == "warnings.warn('from the new step')  # new line"
