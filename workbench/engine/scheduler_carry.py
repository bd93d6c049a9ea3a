"""A rebuild carries an LR schedule on: the scheduler setup() makes again takes the old one's place in its schedule.

A rebuild is a fresh start that keeps the trained state (weights, optimizer state, the data's place, the random
streams). Where a schedule was, setup() makes a new scheduler at its start over the new optimizer: the schedule began
again (OneCycleLR back in its warm-up), and a rebuild with no change no longer trained as the run that never stopped.

Which schedule is the same is decided on the schedulers as made (`schedule_settings.fingerprint`, taken as each
setup() returns): the one the last setup() made against the one the new setup() made, class, attributes, functions'
code and the rates given to the optimizer. Training moves a scheduler on (its step, a plateau count, a project
class's own counter), never its as-made settings.

- Nothing differs: the new scheduler is given the old one's state (a scheduler it holds, as a warm-up wrapper holds
  the schedule after it, is given its old counterpart's in turn) and the new optimizer's groups the rates the old
  schedule had set (and beta1 or the momentum it cycles), so a rebuild with no change trains as the run that never
  stopped.
- Settings differ (an edited `gamma`, `T_max` or `total_steps`, another rate): the new schedule is what runs, at the
  run's step, for a torch scheduler whose rate at a step follows from its settings (StepLR, CosineAnnealingLR,
  OneCycleLR, a LambdaLR warm-up, ...): put at the old one's step, the groups at the new schedule's rate there, as a
  fresh start with the new code would be at that step. Otherwise (a SequentialLR or ChainedScheduler,
  ReduceLROnPlateau, which follows the loss, a class of the project's own, another class at that place, a schedule
  that ends before the run's step) the new scheduler starts from its beginning, as setup() made it.

The notes say every case but the first, with what changed and the rates.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.optim import lr_scheduler
from torch.optim.lr_scheduler import LRScheduler

from workbench.engine.actions.schedulers import find_schedulers
from workbench.engine.schedule_settings import SCHEDULED_KEYS, cycles_momentum, differences, fingerprint
from workbench.engine.state_walk import Namespaces

# torch schedulers whose get_lr() computes the rate from the step alone (the others with a closed form say so with
# `_get_closed_form_lr`); their chained get_lr() would go on from the group's current rate instead.
RATE_FROM_STEP = (lr_scheduler.OneCycleLR, lr_scheduler.LambdaLR, lr_scheduler.CyclicLR)

AsMade = dict[str, dict[str, Any]]  # path -> the scheduler's fingerprint as setup() made it
Rates = dict[int, list[dict[str, Any]]]  # id(scheduler) -> its optimizer's groups' rates, before setup() ran again


def as_made(state: Any, namespaces: Namespaces) -> AsMade:
    """Each scheduler's settings as setup() just made it (taken right after it returns; one that cannot be read is
    left out, and a rebuild then starts its schedule over, said)."""
    made: AsMade = {}
    try:
        schedulers = find_schedulers(state, namespaces)
    except Exception:  # noqa: BLE001 - a state that cannot be walked: no schedule is carried
        return made
    for path, scheduler in schedulers.items():
        try:
            made[path] = fingerprint(scheduler)
        except Exception:  # noqa: BLE001 - settings that cannot be read: compared as unknown
            continue
    return made


def rates_before(state: Any, namespaces: Namespaces) -> Rates:
    """Before setup() runs again: the rates each scheduler's optimizer holds. A new scheduler over the same optimizer
    (one setup() does not make again) sets its groups to its own start as it is made."""
    rates: Rates = {}
    try:
        schedulers = list(find_schedulers(state, namespaces).values())
    except Exception:  # noqa: BLE001 - a state that cannot be walked: nothing carried, said per scheduler later
        return rates
    for scheduler in schedulers:
        try:
            rates[id(scheduler)] = [{k: _copied(g[k]) for k in SCHEDULED_KEYS if k in g}
                                    for g in scheduler.optimizer.param_groups]
        except Exception:  # noqa: BLE001 - no optimizer to read (a scheduler of a library's own): not carried
            continue
    return rates


def carry_schedulers(old_state: Any, new_state: Any, old_namespaces: Namespaces, new_namespaces: Namespaces,
                     rates: Rates, old_made: AsMade, new_made: AsMade) -> tuple[int, list[str]]:
    """Give each scheduler setup() made again its place in the schedule (see the module docstring); (how many go on
    from the old one's step, the notes). `rates`: `rates_before` the new setup() ran; `old_made`, `new_made`: `as_made`
    after the last setup() and after this one."""
    try:
        old, new_schedulers = find_schedulers(old_state, old_namespaces), find_schedulers(new_state, new_namespaces)
    except Exception as exc:  # noqa: BLE001 - the rebuild stands; the schedules start over, said
        return 0, [f"the LR schedulers were not looked at ({type(exc).__name__}: {_brief(exc)}): any setup() made "
                   "again starts its schedule over"]
    carried, notes = 0, []
    for path, new in new_schedulers.items():
        before = old.get(path)
        if before is None or before is new:
            continue  # new in this setup(), or the same object (a global setup() does not make again)
        try:
            went_on, note = _carry_one(path, before, new, rates.get(id(before)), old_made.get(path), new_made.get(path))
        except Exception as exc:  # noqa: BLE001 - the rebuild stands whatever a scheduler does
            went_on, note = False, _starts_over(path, new, _steps_taken(before), f"it could not be looked at "
                                                f"({type(exc).__name__}: {_brief(exc)})")
        carried += went_on
        if note is not None:
            notes.append(note)
    live = set(map(id, new_schedulers.values()))
    unmatched = [path for path in new_schedulers if path not in old]
    for path, before in old.items():
        if path not in new_schedulers and id(before) not in live and (_steps_taken(before) or 0) > 0:
            elsewhere = f"; setup() made {', '.join(unmatched)}, which starts from its beginning" if unmatched else ""
            notes.append(f"{path} ({type(before).__name__}, at step {_steps_taken(before)}) has no scheduler at its "
                         f"place in the rebuilt state, so its schedule is not carried{elsewhere}")
    return carried, notes


def _carry_one(path: str, old: LRScheduler, new: LRScheduler, rates: list[dict[str, Any]] | None,
               old_made: dict[str, Any] | None, new_made: dict[str, Any] | None) -> tuple[bool, str | None]:
    """(whether the new scheduler goes on from the old one's step, the note if any)."""
    steps = _steps_taken(old)

    def over(why: str) -> tuple[bool, str]:
        return False, _starts_over(path, new, steps, why)

    if type(old) is not type(new):
        return over(f"setup() made a scheduler of another class there (it was a {type(old).__name__})")
    if rates is None:
        return over("the rates its optimizer held before the rebuild could not be read")
    groups = len(new.optimizer.param_groups)
    if len(rates) != groups:
        return over(f"its optimizer has {groups} parameter groups, the old one's had {len(rates)}")
    if old_made is None or new_made is None:
        return over("its settings as made could not be read")
    changed = differences(old_made, new_made)
    if changed:
        return _new_settings_at_old_place(path, old, new, changed)
    made = _as_it_is(new)
    try:
        _take_place(old, new, rates)
    except Exception as exc:  # noqa: BLE001 - a state that does not load: the new schedule from its start
        _put_back(new, made)
        return over(f"the old one's state could not be loaded ({type(exc).__name__}: {_brief(exc)})")
    return True, None


def _starts_over(path: str, new: LRScheduler, steps: int | None, why: str, settings: bool = False) -> str:
    where = f" (the old one was at step {steps})" if steps is not None else ""
    tail = "; a rebuild that leaves its settings as they are goes on with the schedule" if settings else ""
    return f"{path} ({type(new).__name__}) starts its schedule over, as setup() made it: {why}{where}{tail}"


def _take_place(old: LRScheduler, new: LRScheduler, rates: list[dict[str, Any]]) -> None:
    """The old scheduler's place into the new one, and the rates it had set into the new optimizer's groups."""
    _load_place(old, new)
    cycled = cycles_momentum(old)
    for old_group, new_group in zip(rates, new.optimizer.param_groups):
        new_group["lr"] = _copied(old_group["lr"]) if "lr" in old_group else new_group["lr"]
        if cycled and "momentum" in old_group and "momentum" in new_group:
            new_group["momentum"] = old_group["momentum"]
        if cycled and "betas" in old_group and "betas" in new_group:  # only beta1 is cycled: beta2 is the code's
            new_group["betas"] = (old_group["betas"][0], *tuple(new_group["betas"])[1:])


def _load_place(old: LRScheduler, new: LRScheduler) -> None:
    """`load_state_dict` of the old state's plain entries; a scheduler it holds (a warm-up's `after_scheduler`) is
    given its old counterpart's place rather than replaced by it, which would step the discarded optimizer."""
    try:
        old_state, new_state = old.state_dict(), new.state_dict()
    except Exception:  # noqa: BLE001 - torch's LambdaLR cannot say a slotted callable's state: its attributes then
        _put_back(new, _as_it_is(old))  # made alike (compared as made), so its plain attributes are its place
        return
    held = [(key, value, new_state.get(key)) for key, value in old_state.items() if not _is_data(value)]
    new.load_state_dict({key: value if _is_data(value) else new_state.get(key) for key, value in old_state.items()})
    for _, old_inner, new_inner in held:
        if isinstance(old_inner, LRScheduler) and type(new_inner) is type(old_inner):
            _load_place(old_inner, new_inner)


def _is_data(value: Any) -> bool:
    """Numbers, strings, tensors and containers of them: what can be loaded into another scheduler as it is (not a
    scheduler, optimizer or function of the old state's)."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.Tensor)):
        return True
    if isinstance(value, dict):
        return all(_is_data(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_is_data(v) for v in value)
    return False


def _new_settings_at_old_place(path: str, old: LRScheduler, new: LRScheduler, changed: list[str]) -> tuple[bool, str]:
    """Put the new scheduler at the old one's step and its groups at the new schedule's rate there: (whether it was
    done, the note)."""
    listed = _listed(changed)
    steps = _steps_taken(old)
    kind = type(new)
    from_step = hasattr(kind, "_get_closed_form_lr") or kind in RATE_FROM_STEP
    if kind.__module__ != lr_scheduler.__name__ or not from_step:
        return False, _starts_over(path, new, steps, f"its settings changed ({listed}), and a {kind.__name__}'s rate "
                                   "at a step does not follow from its settings alone", settings=True)
    groups = new.optimizer.param_groups
    set_before = [{k: _copied(g[k]) for k in SCHEDULED_KEYS if k in g} for g in groups]
    made = _as_it_is(new)
    try:
        if steps is None:
            raise ValueError("the old scheduler does not count its steps")
        new.last_epoch, new._step_count = steps, max(getattr(old, "_step_count", steps + 1), 1)
        if hasattr(kind, "_get_closed_form_lr"):
            rates = list(new._get_closed_form_lr())  # type: ignore[attr-defined]
        else:
            with lr_scheduler._enable_get_lr_call(new):
                rates = list(new.get_lr())  # computed from the step; a cycled momentum is set in the groups here
        before = [g["lr"] for g in groups]
        for group, rate in zip(groups, rates):
            group["lr"] = rate
        new._last_lr = [g["lr"] for g in groups]
    except Exception as exc:  # noqa: BLE001 - a schedule that ends before this step (OneCycleLR): from its start
        _put_back(new, made)
        for group, values in zip(groups, set_before):
            group.update(values)
        return False, _starts_over(path, new, steps, f"its settings changed ({listed}), and the new schedule has no "
                                   f"rate at step {steps} ({type(exc).__name__}: {_brief(exc)})")
    # "Its step": the scheduler's own count (its step() calls), which an epoch-wise schedule keeps apart from the
    # run's step (pytorch-cifar's port read "from step 3" at the run's step 31).
    return True, (f"{path} ({kind.__name__}) goes on from its step {steps} (step() called {steps} times) with the new "
                  f"settings ({listed}): learning rate {_rate(before)} as setup() made it, {_rate(new._last_lr)} at its "
                  f"step {steps} of the new schedule")


def _steps_taken(scheduler: LRScheduler) -> int | None:
    """How far it had gone (None: a scheduler of a library's own that does not count steps as torch's do)."""
    last = getattr(scheduler, "last_epoch", None)
    return last if isinstance(last, int) and not isinstance(last, bool) else None


def _as_it_is(scheduler: LRScheduler) -> dict[str, Any]:
    """Its plain attributes (what `load_state_dict` sets, without a `state_dict()` that may raise), to put back."""
    return {key: copy.deepcopy(value) for key, value in vars(scheduler).items() if _is_data(value)}


def _put_back(scheduler: LRScheduler, attributes: dict[str, Any]) -> None:
    """The new scheduler as setup() made it, after a load that failed half-way."""
    scheduler.__dict__.update(attributes)


def _listed(changed: list[str]) -> str:
    """The settings that changed, those not derived from others when there are any (OneCycleLR's schedule phases and
    a scheduler's starting rates follow from its `total_steps` and the optimizer's rate)."""
    derived = ("schedule_phases", "last_lr", "base_lrs", "param_groups")
    rates = [c for c in changed if c.startswith("param_groups") and (".lr " in c or ".initial_lr " in c)]
    shown = [c for c in changed if not c.startswith(derived)] or rates or changed
    return ", ".join(shown[:4]) + (", ..." if len(shown) > 4 else "")


def _rate(rates: list[Any]) -> str:
    shown = [f"{float(r):.4g}" for r in rates[:3]]
    return ", ".join(shown) + (", ..." if len(rates) > 3 else "")


def _brief(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if len(text) <= 120 else text[:117] + "..."


def _copied(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value
