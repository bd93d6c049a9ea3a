"""The module statements a save did not re-run stay left for x (and for R) until one of them runs them.

Found by the differential harness once a rebuild had to build from the file as it is: a later save that re-ran
nothing (a changed function) dropped what an earlier save had left for x, so x said there was nothing to run and
R built from the old value, while the file held the new one. And a rollback left x holding the undone save's
statements, compiled from the text the rollback had taken back.
"""

from __future__ import annotations

import pytest

from conftest import is_event, save
from workbench.protocol.events import Rebuild, Rollback, RunStatements, StepOnce

TRAIN_PY = """\
import torch

init_scale = 1.0
init_weight = torch.full((2,), init_scale)


def setup(bench):
    return {"model": torch.nn.Linear(2, 1)}


def offset():
    return 0.0


def step(state, bench):
    return {"loss": 0.0, "init": float(init_weight.sum()), "offset": offset()}
"""
LEFT_FOR_X = TRAIN_PY.replace("torch.full((2,), init_scale)", "torch.full((2,), init_scale * 2)")
AND_A_FUNCTION = LEFT_FOR_X.replace("return 0.0", "return 1.0")


def _session(start_session):  # type: ignore[no-untyped-def]
    live = start_session({"train.py": TRAIN_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    return live


def _after_two_saves(start_session):  # type: ignore[no-untyped-def]
    """A session where one save left a line for x and a later one changed only a function."""
    live = _session(start_session)
    _saved(live, LEFT_FOR_X)
    _saved(live, AND_A_FUNCTION)
    return live


def _saved(live, source: str):  # type: ignore[no-untyped-def]
    save(live.entry, source)
    return live.wait_for(is_event("reload", file="train.py"))


def _x(live):  # type: ignore[no-untyped-def]
    """Press x: the reload event of what it ran, or the command error of nothing to run."""
    live.send(RunStatements())
    return live.wait_for(lambda e: is_event("reload", file="train.py", ms=0.0)(e) or is_event("error", where="command")(e))


def _rolled_back(live) -> None:  # type: ignore[no-untyped-def]
    live.send(Rollback())
    assert live.wait_for(is_event("reload", file="train.py", ms=0.0)).ok


def _rebuilt_then_rolled_back(live) -> None:  # type: ignore[no-untyped-def]
    """R (which runs `init_scale * 2`), then u, which must say the line as the code before has it is left for x."""
    live.send(Rebuild())
    assert live.wait_for(is_event("rebuild")).ok
    assert _step(live) == {"init": 4.0, "offset": 1.0}
    live.send(Rollback())
    rolled = live.wait_for(is_event("reload", file="train.py", ms=0.0))
    assert any("line 4: `init_weight = torch.full((2,), init_scale)`" in n and "ran with the rolled-back code since" in n
               for n in rolled.notes), rolled.notes


def _step(live) -> dict[str, float]:  # type: ignore[no-untyped-def]
    live.send(StepOnce())
    return live.wait_for(is_event("step")).scalars


def test_a_later_save_that_re_runs_nothing_keeps_what_an_earlier_one_left_for_x(start_session) -> None:
    live = _session(start_session)
    first = _saved(live, LEFT_FOR_X)
    assert any("init_weight = torch.full((2,), init_scale * 2)" in n and "not re-run" in n for n in first.notes), first
    later = _saved(live, AND_A_FUNCTION)
    assert later.ok and later.changed == ("offset",), later
    assert not any("x also runs" in n or "x leaves" in n for n in later.notes), "said once, at the save that left it"
    assert "init_weight" in _x(live).changed
    assert _step(live) == {"init": 4.0, "offset": 1.0}, "as a fresh start of the file"


def test_a_rebuild_after_a_later_save_runs_what_the_earlier_one_left_for_x(start_session) -> None:
    live = _after_two_saves(start_session)
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    assert rebuilt.ok and any("had not re-run" in n and "init_scale * 2" in n for n in rebuilt.notes), rebuilt.notes
    assert _step(live) == {"init": 4.0, "offset": 1.0}
    assert "no held-back module statements" in _x(live).message


def test_a_rolled_back_save_takes_what_it_left_for_x_with_it(start_session) -> None:
    live = _session(start_session)
    _saved(live, AND_A_FUNCTION)  # one save: the line left for x, and a function (a version to roll back)
    _rolled_back(live)
    assert "no held-back module statements" in _x(live).message
    assert _step(live) == {"init": 2.0, "offset": 0.0}, "the rolled-back code's values, as a fresh start of it"


def test_rolling_back_a_later_save_keeps_what_an_earlier_one_left_for_x(start_session) -> None:
    live = _after_two_saves(start_session)
    _rolled_back(live)
    assert "init_weight" in _x(live).changed
    assert _step(live) == {"init": 4.0, "offset": 0.0}


def test_rolling_back_a_save_whose_line_a_rebuild_ran_leaves_the_line_before_it_for_x(start_session) -> None:
    """R ran the undone save's line (`init_scale * 2`): what it made stays until the line as the code before has
    it runs again, so the rollback says so and leaves that line for x. Found by the differential harness (the
    script_import family, seed 565: an optimizer R built at import with a rolled-back `make_optimizer`)."""
    live = _session(start_session)
    _saved(live, AND_A_FUNCTION)
    _rebuilt_then_rolled_back(live)
    assert _step(live) == {"init": 4.0, "offset": 0.0}, "said, not yet run"
    assert "init_weight" in _x(live).changed
    assert _step(live) == {"init": 2.0, "offset": 0.0}, "as a fresh start of the code before"


def test_nothing_to_roll_back_leaves_the_line_numbers_a_save_moved(start_session) -> None:
    """A rollback with no changed version left used to undo the line-number updates first, then say there was
    nothing to roll back: tracebacks then pointed at the lines before the save."""
    live = _session(start_session)
    module = live.session.project.module
    moved = _saved(live, "\n\n" + TRAIN_PY)
    assert moved.ok and not moved.changed and module.offset.__code__.co_firstlineno == 13, moved
    live.send(Rollback())
    assert "nothing to roll back" in live.wait_for(is_event("error", where="command")).message
    assert module.offset.__code__.co_firstlineno == 13, "the file's lines, as saved"


def test_a_line_left_for_x_that_raises_fails_the_rebuild_and_stays_left_for_x(start_session) -> None:
    live = _session(start_session)
    model = live.session.worker.user_state["model"]
    _saved(live, TRAIN_PY.replace("torch.full((2,), init_scale)", "torch.full((2,), init_scale / 0)"))
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    assert not rebuilt.ok and "ZeroDivisionError" in rebuilt.error, rebuilt
    assert live.session.worker.user_state["model"] is model, "the old state stays"
    assert _step(live) == {"init": 2.0, "offset": 0.0}
    live.send(RunStatements())
    failed = live.wait_for(is_event("error", where="reload"))
    assert "ZeroDivisionError" in failed.message, "still left for x, which meets the same error"


OVERRIDE_PY = """\
import argparse

import torch

batch_size = 8
parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=6)
args = parser.parse_args()
if args.batch_size is not None:
    batch_size = args.batch_size


def setup(bench):
    return {"model": torch.nn.Linear(1, 1)}


def step(state, bench):
    return {"loss": 0.0, "batch": float(batch_size)}
"""


@pytest.mark.parametrize("act", ["x", "R"])
def test_an_override_that_no_longer_fires_leaves_the_files_default_after_x_and_after_r(start_session, act: str) -> None:
    """`--batch-size`'s default 6 -> None: a fresh start keeps `batch_size = 8`. x (and R, which runs x's lines) ran
    the parser and the `if`, which no longer bound anything, and 6 stayed (script_import seed 32001370)."""
    live = start_session({"train.py": OVERRIDE_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    assert _step(live)["batch"] == 6.0
    _saved(live, OVERRIDE_PY.replace("default=6", "default=None"))
    if act == "x":
        assert "batch_size" in _x(live).changed
    else:
        live.send(Rebuild())
        rebuilt = live.wait_for(is_event("rebuild"))
        assert rebuilt.ok and any("line 5: `batch_size = 8`" in n for n in rebuilt.notes), rebuilt.notes
    assert _step(live)["batch"] == 8.0


def test_a_rebuild_after_a_rollback_says_it_reads_the_code_that_runs_not_the_file(start_session) -> None:
    """R runs the lines left for x as the live (rolled-back) code has them: its note said it read "the file as it
    is" and quoted a line the file does not hold (a Forward-Forward port: `default=2`, the file `default=1.5`)."""
    live = _session(start_session)
    _saved(live, AND_A_FUNCTION)
    _rebuilt_then_rolled_back(live)
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    said = [n for n in rebuilt.notes if n.startswith("ran first what the saves of train.py had not re-run")]
    assert said and "reads the code that runs now, not the file on disk, which differs" in said[0], rebuilt.notes
    assert "torch.full((2,), init_scale)" in said[0] and "init_scale * 2" not in said[0], said
    assert _step(live) == {"init": 2.0, "offset": 0.0}, "the rolled-back code's, as the note says"


def test_a_save_that_only_left_a_line_for_x_is_folded_into_the_rollback_before_it(start_session) -> None:
    """A function changed (a version), then a save that only left a line for x (not a version), R ran it, then u:
    the rollback takes the file back past both saves, so the line as the code before has it is left for x again,
    and said (script seed 33000144)."""
    live = _session(start_session)
    _saved(live, TRAIN_PY.replace("return 0.0", "return 1.0"))
    _saved(live, AND_A_FUNCTION)
    _rebuilt_then_rolled_back(live)
    assert "init_weight" in _x(live).changed
    assert _step(live) == {"init": 2.0, "offset": 0.0}


LOG_PY = """\
import argparse
import os

import torch

HERE = os.path.dirname(__file__)
parser = argparse.ArgumentParser()
parser.add_argument("--flash", type=int, default=0)
parser.add_argument("--output-dir", default="out")
args = parser.parse_args()
FLASH = args.flash
logfile = None
if args.output_dir:
    os.makedirs(os.path.join(HERE, args.output_dir), exist_ok=True)
    logfile = os.path.join(HERE, args.output_dir, "main.log")
    with open(logfile, "w") as f:
        pass


def setup(bench):
    return {"model": torch.nn.Linear(1, 1)}


def step(state, bench):
    with open(logfile, "a") as f:
        f.write("step\\n")
    return {"loss": 0.0, "flash": float(FLASH)}
"""


def test_x_runs_an_override_and_its_default_only_where_what_the_override_reads_changed(start_session) -> None:
    """llm.c's train_gpt2.py, ported: `logfile = None` then `if args.output_dir:` that opens its log with "w". x of an
    unrelated flag (`--flash`) ran both, since they read the new `args`, and wiped the log; a fresh start would, but
    nothing in them changed. They now run, together, only where a value the `if` reads changed."""
    live = start_session({"train.py": LOG_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    for _ in range(3):
        _step(live)
    log = live.root / "out" / "main.log"
    assert log.read_text() == "step\n" * 3

    _saved(live, LOG_PY.replace("default=0", "default=1"))
    ran = _x(live)
    assert "FLASH" in ran.changed and "logfile" not in ran.changed, ran
    assert not any("if args.output_dir" in note and note.startswith("ran") for note in ran.notes), ran.notes
    assert _step(live)["flash"] == 1.0
    assert log.read_text() == "step\n" * 4, "the log was not opened again"

    # Its input changed: the default and the override run, at the override's turn, and the note names both lines.
    _saved(live, LOG_PY.replace("default=0", "default=1").replace('default="out"', 'default="out2"'))
    ran = _x(live)
    assert "logfile" in ran.changed, ran
    assert any("line 13: `if args.output_dir:` (with its default first, line 12: `logfile = None`)" in note
               for note in ran.notes), ran.notes
    _step(live)
    assert (live.root / "out2" / "main.log").read_text() == "step\n" and log.read_text() == "step\n" * 4


TWO_DEFAULTS_PY = """\
import argparse

import torch

lr = 1e-3
wd = 0.1
parser = argparse.ArgumentParser()
parser.add_argument("--fast", type=int, default=1)
args = parser.parse_args()
if args.fast:
    lr = 3e-3
    wd = 0.0


def setup(bench):
    return {"model": torch.nn.Linear(1, 1)}


def step(state, bench):
    return {"loss": 0.0, "lr": lr, "wd": wd}
"""


@pytest.mark.parametrize("act", ["x", "R"])
def test_an_override_of_two_defaults_that_no_longer_fires_leaves_both_defaults(start_session, act: str) -> None:
    """`if args.fast:` overrides `lr` and `wd`; `--fast` 1 -> 0: a fresh start trains with both file defaults. The
    override was run with one of its two defaults only, so the other kept the override's value (found reviewing)."""
    live = start_session({"train.py": TWO_DEFAULTS_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    assert _step(live) == {"lr": 3e-3, "wd": 0.0}
    _saved(live, TWO_DEFAULTS_PY.replace("default=1", "default=0"))
    if act == "x":
        ran = _x(live)
        assert {"lr", "wd"} <= set(ran.changed), ran
        assert any("line 10: `if args.fast:` (with its defaults first, line 5: `lr = 1e-3`, line 6: `wd = 0.1`)" in note
                   for note in ran.notes), ran.notes
    else:
        live.send(Rebuild())
        assert live.wait_for(is_event("rebuild")).ok
    assert _step(live) == {"lr": 1e-3, "wd": 0.1}


def test_an_edited_default_under_an_override_that_still_fires_keeps_the_override(start_session) -> None:
    """`lr = 1e-3` -> `lr = 2e-3` while `if args.fast:` still binds `lr = 3e-3`: a fresh start trains at 3e-3, so x
    must run the override after the default it edited, not leave the default's new value (found reviewing)."""
    live = start_session({"train.py": TWO_DEFAULTS_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    assert _step(live) == {"lr": 3e-3, "wd": 0.0}
    _saved(live, TWO_DEFAULTS_PY.replace("lr = 1e-3", "lr = 2e-3"))
    _x(live)
    assert _step(live) == {"lr": 3e-3, "wd": 0.0}


CONFIG_PY = """\
import torch

init_scale = 1.0
init_weight = torch.full((2,), init_scale)
"""
USES_CONFIG_PY = """\
import torch

import config


def setup(bench):
    return {"model": torch.nn.Linear(2, 1)}


def offset():
    return 0.0


def step(state, bench):
    return {"loss": 0.0, "init": float(config.init_weight.sum()), "offset": offset()}
"""


def test_a_rollback_leaves_another_files_save_that_only_left_a_line_for_x(start_session) -> None:
    """A function changed in train.py (a version), then a save of config.py that only left a line for x, then u: the
    rollback undid config.py's save too, and its line was no longer x's to run (found reviewing)."""
    live = start_session({"train.py": USES_CONFIG_PY, "config.py": CONFIG_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    assert _step(live) == {"init": 2.0, "offset": 0.0}
    _saved(live, USES_CONFIG_PY.replace("return 0.0", "return 1.0"))
    save(live.root / "config.py", CONFIG_PY.replace("init_scale)", "init_scale * 2)"))
    left = live.wait_for(is_event("reload", file="config.py"))
    assert left.ok and not left.changed, left
    live.send(Rollback())
    rolled = live.wait_for(is_event("reload", file="train.py", ms=0.0))
    assert rolled.ok and not any("config" in note or "line 4" in note for note in rolled.notes), rolled.notes
    assert _step(live) == {"init": 2.0, "offset": 0.0}
    live.send(RunStatements())
    ran = live.wait_for(is_event("reload", file="config.py", ms=0.0))
    assert "init_weight" in ran.changed, ran
    assert _step(live) == {"init": 4.0, "offset": 0.0}, "as a fresh start of the files on disk, less the undone save"


ARG_DEFAULT = """\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=None)
args = parser.parse_args()
batch_size = 8
if args.batch_size is not None:
    batch_size = args.batch_size


def setup(bench):
    return {"model": torch.nn.Linear(2, 1)}


def offset():
    return 0.0


def step(state, bench):
    return {"loss": 0.0, "batch": float(batch_size), "offset": offset()}
"""


def test_a_rollback_past_an_edited_call_that_r_ran_leaves_what_the_call_changed_for_x(start_session) -> None:
    """`parser.add_argument(..., default=6)` binds no name: the rollback that took the file back past it (with the
    function changed before it) said nothing of `args` and `batch_size`, which R had set from it, and the step ran
    with batch 6 where the code before has 8 (script seed 36100027, silent)."""
    live = start_session({"train.py": ARG_DEFAULT}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    changed = ARG_DEFAULT.replace("return 0.0", "return 1.0")
    _saved(live, changed)
    _saved(live, changed.replace("default=None", "default=6"))
    live.send(Rebuild())
    assert live.wait_for(is_event("rebuild")).ok
    assert _step(live) == {"batch": 6.0, "offset": 1.0}
    live.send(Rollback())
    rolled = live.wait_for(is_event("reload", file="train.py", ms=0.0))
    assert any("line 7: `args = parser.parse_args()`" in n and "line 9: `if args.batch_size is not None:`" in n
               and "ran with the rolled-back code since" in n for n in rolled.notes), rolled.notes
    _x(live)
    assert _step(live) == {"batch": 8.0, "offset": 0.0}


WIDTH_PY = """\
import torch


def width():
    return 2


def setup(bench):
    return {"model": torch.nn.Linear(2, width())}


def step(state, bench):
    return {"loss": 0.0, "width": float(state["model"].out_features)}
"""


def test_a_rebuild_after_rolling_back_a_change_it_built_says_the_file_differs(start_session) -> None:
    """A layer added, R, then u and R again: the second R built the rolled-back code and dropped the trained layer,
    with no word of why (a VAE port, ported)."""
    live = start_session({"train.py": WIDTH_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    _saved(live, WIDTH_PY.replace("return 2", "return 3"))
    live.send(Rebuild())
    first = live.wait_for(is_event("rebuild"))
    assert first.ok and not any("not the file" in n for n in first.notes), first.notes
    _rolled_back(live)
    live.send(Rebuild())
    second = live.wait_for(is_event("rebuild"))
    assert second.ok and any(n.startswith("built from the code that runs now, not the file on disk: train.py differs")
                             for n in second.notes), second.notes
    assert _step(live)["width"] == 2.0, "the rolled-back code's, as the note says"


def test_a_rebuild_before_a_save_is_read_says_that_save_is_not_applied_yet_not_that_it_was_refused(start_session) -> None:
    """A save made as R ran (a transformers port: the model's width edited while R was building) was put down to "a
    rollback since its save, or a save that was refused" and told to save again: neither had happened. Without
    watching, the save waits for `r` deterministically; a refused save still gets the old note."""
    from workbench.protocol.events import ReloadNow

    live = start_session({"train.py": WIDTH_PY}, start_paused=True, watch=False)
    live.wait_for(is_event("setup", status="done"))
    save(live.entry, WIDTH_PY.replace("return 2", "return 3"))
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    said = [n for n in rebuilt.notes if n.startswith("built from the code that runs now")]
    assert rebuilt.ok and len(said) == 1 and "train.py has a save not applied yet" in said[0], rebuilt.notes
    assert "refused" not in said[0], said
    assert _step(live)["width"] == 2.0, "the code that runs, as the note says"
    save(live.entry, WIDTH_PY.replace("return 2", "return (3"))  # a syntax error: read, and refused
    live.send(ReloadNow())
    assert not live.wait_for(is_event("reload", file="train.py")).ok
    live.send(Rebuild())
    again = live.wait_for(is_event("rebuild"))
    assert again.ok and any(n.startswith("built from the code that runs now, not the file on disk: train.py differs "
                                         "(a rollback since its save, or a save that was refused)")
                            for n in again.notes), again.notes
