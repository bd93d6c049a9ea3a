"""An error that goes up through a generator ends it: the failed step says so, and so does the StopIteration a fix
then meets, instead of "the data ran out".

Found porting pytorch/examples' word_language_model: its epochs became a generator with the epoch-end evaluate()
inside; a rename left evaluate() calling a removed function, the step paused with the NameError, the fix resumed,
and the next step said the data had run out.
"""

from __future__ import annotations

import pytest

from conftest import is_event, save
from workbench.engine.generator_end import generators_ended
from workbench.protocol.events import Rebuild, StepOnce

PROJECT_PY = """\
import torch

FAIL = False


def check():
    if FAIL:
        raise ValueError("check failed")


def epochs():
    for epoch in range(100):
        for i in range(2):
            yield i
        check()


def setup(bench):
    return {"model": torch.nn.Linear(1, 1), "batches": epochs()}


def step(state, bench):
    return {"loss": 0.0, "i": float(next(state["batches"]))}
"""


def test_an_error_that_ends_the_states_generator_says_so_and_the_fix_rebuilds_before_training_goes_on(start_session) -> None:
    failing = PROJECT_PY.replace("FAIL = False", "FAIL = True")
    live = start_session({"train.py": failing}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    failed = _step_into_error(live, (1, 2))
    assert failed.message.startswith("step() raised ValueError: check failed"), failed.message
    assert ("went up through the generator epochs() (train.py:15), and an exception that leaves a generator ends it: "
            "so saving a fix (or resuming) rebuilds first") in failed.message, failed.message
    live.wait_for(is_event("paused", reason="error"))

    # Before: the fix resumed, and the next step met the ended generator's StopIteration ("data exhausted").
    save(live.entry, failing.replace('raise ValueError("check failed")', "return None"))
    said = live.wait_for(is_event("error", where="recovery"))
    assert said.message == ("step 3's ValueError ended state['batches'], which step() reads (reading it again could "
                            "only raise StopIteration): rebuilding before training goes on"), said.message
    assert live.wait_for(is_event("rebuild")).ok
    live.wait_for(is_event("resumed", reason="rebuild"))
    assert live.wait_for(is_event("step", step=3)).scalars["i"] == 0.0, "a new generator, from its first item"
    assert "data exhausted" not in [p.reason for p in live.events.of("paused")], "no pause for the data's end"


def test_a_generator_only_a_module_global_holds_is_said_to_have_ended_when_its_end_is_met(start_session) -> None:
    # A rebuild would not make it again (setup() does not): the fix resumes, and the StopIteration says why.
    failing = PROJECT_PY.replace("FAIL = False", "FAIL = True").replace(
        '    return {"model": torch.nn.Linear(1, 1), "batches": epochs()}',
        '    return {"model": torch.nn.Linear(1, 1)}\n\n\nBATCHES = epochs()').replace(
        'next(state["batches"])', "next(BATCHES)")
    live = start_session({"train.py": failing}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    failed = _step_into_error(live, (1, 2))
    assert "after a fix, reading it raises StopIteration. A module statement made it at import, which R (command " \
        "`rebuild`) does not run again" in failed.message, failed.message
    live.wait_for(is_event("paused", reason="error"))

    save(live.entry, failing.replace('raise ValueError("check failed")', "return None"))
    live.wait_for(is_event("resumed", reason="reload"))
    ended = live.wait_for(is_event("error", where="data"))
    assert ("not because its data ran out: step 3's ValueError went up through the generator epochs() (train.py:15) "
            "and ended it") in ended.message, ended.message
    live.wait_for(is_event("paused", reason="data exhausted"))


def test_only_the_projects_generators_are_named() -> None:
    def gen():
        yield 1
        raise KeyError("x")

    try:
        list(gen())
    except KeyError as exc:
        here = __file__
        assert generators_ended(exc, lambda path: "t.py" if path == here else None) == [
            f"test_only_the_projects_generators_are_named.<locals>.gen() (t.py:{gen.__code__.co_firstlineno + 2})"]
        assert generators_ended(exc, lambda path: None) == [], "a generator outside the project is not the user's"


def test_a_traceback_through_a_generator_running_replaced_code_shows_that_codes_line(start_session) -> None:
    """Found porting word_language_model: after an edit above its epochs generator, an error inside it showed the
    generator's frame at `yield batch, i`, today's file at the old code's line number, while it ran the evaluate()
    call two lines lower."""
    live = start_session({"train.py": PROJECT_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    live.send(StepOnce())
    live.wait_for(is_event("step", step=1))  # the generator runs: it keeps this code
    edited = "# a comment line above everything\n" + PROJECT_PY.replace("FAIL = False", "FAIL = True").replace(
        "range(2)", "range(3)")
    save(live.entry, edited)
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert "epochs" in reload.changed and any("keeps the old code" in n for n in reload.notes), reload
    shown, at = _failing_frame(live, (2,), ", in epochs")
    assert shown[at].endswith('line 15, in epochs (running the code from before version 1: this line is from that '
                              'code, not the file)'), shown[at]
    assert shown[at + 1].strip() == "check()", f"the old code's own line 15, not the file's: {shown[at + 1]!r}"
    assert edited.splitlines()[14].strip() == "yield i", "the file's line 15 is another line"
    assert any(line.strip() == 'raise ValueError("check failed")' for line in shown), "current code: the file's line"


def _step_into_error(live, steps: tuple[int, ...]):  # type: ignore[no-untyped-def]
    """Run the good `steps` one by one, then one more into the step's error: its `error` event."""
    for step in steps:
        live.send(StepOnce())
        live.wait_for(is_event("step", step=step))
    live.send(StepOnce())
    return live.wait_for(is_event("error", where="step"))


def _failing_frame(live, steps: tuple[int, ...], frame: str) -> tuple[list[str], int]:  # type: ignore[no-untyped-def]
    """Run the good `steps`, then one more into the step's error: its traceback's lines, and where `frame` is."""
    shown = _step_into_error(live, steps).traceback.splitlines()
    return shown, next(i for i, line in enumerate(shown) if frame in line)


RAISES_PY = """\
import torch


def setup(bench):
    return {"model": torch.nn.Linear(1, 1)}


def step(state, bench):
    if bench.step >= 1:
        raise ValueError("the second step fails")
    return 0.0
"""


def test_after_a_save_that_did_not_parse_a_traceback_shows_the_live_codes_line_not_the_files(start_session) -> None:
    """The old code keeps running when a save does not parse (or is held for a rebuild, or after a rollback): a
    traceback from it used to show the file's new lines at the old code's numbers."""
    live = start_session({"train.py": RAISES_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    broken = "# one line\n# and another above everything\n" + RAISES_PY + "def oops(:\n"
    save(live.entry, broken)
    assert not live.wait_for(is_event("reload", file="train.py")).ok
    shown, at = _failing_frame(live, (1,), ", in step")
    assert shown[at].endswith("line 10, in step (this line is from the code that runs: the file on disk has changed "
                              "since)"), shown[at]
    assert shown[at + 1].strip() == 'raise ValueError("the second step fails")', shown[at + 1]
    assert broken.splitlines()[9].strip() == "def step(state, bench):", "the file's line 10 is another line"


LEFT_FOR_R = {  # a project whose model WIDTH builds, and what the recovery says comes in with a WIDTH edit
    "read by setup()": (PROJECT_PY.replace("FAIL = False", "FAIL = True\nWIDTH = 1").replace(
        "torch.nn.Linear(1, 1)", "torch.nn.Linear(WIDTH, 1)"), "comes in now: built with: WIDTH"),
    "built at import": (PROJECT_PY.replace("FAIL = False", "FAIL = True\nWIDTH = 1\nMODEL = torch.nn.Linear(WIDTH, 1)").replace(
        '{"model": torch.nn.Linear(1, 1)', '{"model": MODEL'),
        "comes in now: module statements left for x: line 5: `MODEL = torch.nn.Linear(WIDTH, 1)`"),
}


@pytest.mark.parametrize("failing, said", LEFT_FOR_R.values(), ids=LEFT_FOR_R.keys())
def test_a_recovery_says_what_earlier_saves_left_for_r_comes_in_with_it(start_session, failing: str, said: str) -> None:
    """A recovery's rebuild is R's: an x-transformers trainer, ported, under torchrun, had a DEPTH edit (noted: the live
    model keeps the old depth until R; its model is built at import) built in by the recovery after a one-rank fix,
    and nothing said so."""
    live = start_session({"train.py": failing}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    _step_into_error(live, (1, 2))
    live.wait_for(is_event("paused", reason="error"))
    save(live.entry, failing.replace('raise ValueError("check failed")', "return None").replace("WIDTH = 1", "WIDTH = 2"))
    warning = live.wait_for(is_event("error", where="recovery")).message
    assert "Like R, it builds from the code and values on disk, so what earlier saves left for R " in warning, warning
    assert said in warning, warning
    assert live.wait_for(is_event("rebuild")).ok
    assert live.session.worker.user_state["model"].in_features == 2, "what the warning says"
