"""A rebuild's setup() reads the module globals a fresh start's would, not what the last setup() left there.

Found porting nanoGPT's train.py under two ranks: its setup() does `global gradient_accumulation_steps;
gradient_accumulation_steps //= world_size` after `assert gradient_accumulation_steps % world_size == 0`, so
the rebuild that follows a DDP unused-parameter error (and every `R`) failed the script's own assert, and
every rank stayed paused. Real sessions on small projects (see conftest.py).
"""

from __future__ import annotations

import gc
import weakref

from conftest import is_event, save
from workbench.protocol.events import Rebuild, Rollback

TRAIN_PY = """\
import torch

ACCUM = 4
model = None


def setup(bench):
    global ACCUM, model, seen, aux
    assert ACCUM % 2 == 0, f"ACCUM={ACCUM} is odd"
    ACCUM //= 2
    seen = ACCUM
    model = torch.nn.Linear(2, 1)
    aux = torch.nn.Linear(1, 1)  # a name only setup() binds
    return {"opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def step(state, bench):
    loss = model(torch.ones(4, 2)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return {"loss": loss, "accum": float(ACCUM)}
"""


def _module(live):
    return live.session.worker.project.modules()[live.entry]


def test_a_rebuild_runs_setup_on_the_globals_it_found_and_says_so(start_session) -> None:
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    assert _module(live).ACCUM == 2
    for _ in range(2):  # without the fix: the first rebuild halves 2 to 1, the second fails the assert on 1
        live.send(Rebuild())
        rebuilt = live.wait_for(is_event("rebuild"), timeout=30)
        assert rebuilt.ok, rebuilt.error
        assert _module(live).ACCUM == 2
        assert any("train.ACCUM" in note and "fresh start" in note for note in rebuilt.notes), rebuilt.notes
        assert not any("train.model" in note for note in rebuilt.notes), "a placeholder put back to None is not news"
    assert live.events.steps(2, lambda e: e.scalars["accum"] == 2.0)


def test_a_saved_value_setup_re_binds_waits_for_the_rebuild_and_wins_over_the_one_setup_found(start_session) -> None:
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    save(live.entry, TRAIN_PY.replace("ACCUM = 4\n", "ACCUM = 8\n"))
    held = live.wait_for(is_event("reload", file="train.py"))
    assert held.ok and held.held == ("ACCUM",) and "setup() re-binds ACCUM" in held.needs_rebuild[0], held
    assert _module(live).ACCUM == 2, "applied alone, ACCUM would be 8 where a fresh start's is 4"
    live.send(Rebuild())
    assert live.wait_for(is_event("rebuild"), timeout=30).ok
    assert _module(live).ACCUM == 4, "setup() halved the file's 8, as a fresh start's would"

    live.send(Rollback())  # back to `ACCUM = 4`: a fresh start of that code halves 4, once
    assert live.wait_for(is_event("reload", file="train.py")).ok
    assert _module(live).ACCUM == 2, "the rollback puts back the value the old code ran with"
    live.send(Rebuild())
    assert live.wait_for(is_event("rebuild"), timeout=30).ok
    assert _module(live).ACCUM == 2


def test_what_setup_made_is_not_kept_alive_by_the_rebuilds(start_session) -> None:
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    first = [weakref.ref(_module(live).model), weakref.ref(_module(live).aux)]
    for _ in range(2):
        live.send(Rebuild())
        assert live.wait_for(is_event("rebuild"), timeout=30).ok
    live.events.steps(2)
    gc.collect()
    assert [ref() for ref in first] == [None, None], "the first setup()'s modules outlived two rebuilds"
    assert _module(live).model is not None and _module(live).aux is not None


def test_a_failed_rebuild_leaves_the_globals_the_running_code_has(start_session) -> None:
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    broken = TRAIN_PY.replace("    model = torch.nn.Linear(2, 1)\n", "    model = torch.nn.Linear(2, 1)\n    raise RuntimeError('no')\n")
    save(live.entry, broken)
    assert live.wait_for(is_event("reload", file="train.py")).held == ("setup",)
    live.send(Rebuild())
    failed = live.wait_for(is_event("rebuild"), timeout=30)
    assert not failed.ok and "the old state and code stay" in failed.error
    assert _module(live).ACCUM == 2 and _module(live).seen == 2, "the running code's values, not setup()'s half-run"
    assert live.events.steps(2, lambda e: e.scalars["accum"] == 2.0)


def test_a_setup_that_failed_after_re_binding_a_global_runs_again_on_the_globals_it_found(start_session) -> None:
    """nanoGPT's order: the accumulation steps are divided first, a later line fails (a missing data file, say); the
    fixed setup() must divide the file's value, not the failed run's result, or its own assert fails on every fix."""
    failing = TRAIN_PY.replace("    model = torch.nn.Linear(2, 1)\n", "    model = torch.nn.Linear(2, 1)\n    raise FileNotFoundError('data/train.bin')\n")
    live = start_session({"train.py": failing})
    live.wait_for(is_event("setup", status="failed"), timeout=30)
    assert _module(live).ACCUM == 4 and not hasattr(_module(live), "seen"), "what the failed setup() bound is gone"
    save(live.entry, TRAIN_PY)
    live.wait_for(is_event("setup", status="done"), timeout=30)
    assert _module(live).ACCUM == 2
    assert live.events.steps(2, lambda e: e.scalars["accum"] == 2.0)
