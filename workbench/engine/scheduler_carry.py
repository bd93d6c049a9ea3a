"""A rebuild carries an LR schedule on: the scheduler setup() makes again takes the old one's place in its schedule.

A rebuild is a fresh start that keeps the trained state (weights, optimizer state, the data's place, the random
streams). Where a schedule was, setup() makes a new scheduler at step 0 over the new optimizer, whose param groups
hold the rate setup() gave them: the schedule began again (OneCycleLR back in its warm-up), and a rebuild with no
change no longer trained as the run that never stopped. So a scheduler setup() made again at the same path, of the
same class and with the same settings, is given the old one's state (its step, its last rates), and the new
optimizer's groups the rates (and, for a cycled momentum, the momentum) the old schedule had set.

When the settings differ (an edited `total_steps`, `T_max` or peak rate), the new schedule is what runs, at the run's
step: a torch scheduler whose rate at a step follows from its settings alone (StepLR, CosineAnnealingLR, OneCycleLR,
a LambdaLR warm-up, ...) is put at the old one's step and the groups given the rate the new schedule has there, as a
fresh start with the new code would have at that step; the notes say what changed and the rate before and after.
Where the rate cannot be computed that way (a SequentialLR or ChainedScheduler, ReduceLROnPlateau, which follows the
loss, a class of the project's own, another class at that path, a schedule that ends before the run's step), the new
scheduler starts from its beginning, as setup() made it, and the notes say why and how far the old one had gone.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim import lr_scheduler
from torch.optim.lr_scheduler import LRScheduler

from workbench.engine.actions.schedulers import find_schedulers
from workbench.engine.state_walk import Namespaces

# What a scheduler's state_dict() holds of its place in the schedule rather than of its settings: the step and the
# rates it set (torch's base class), CosineAnnealingWarmRestarts' cycle, ReduceLROnPlateau's plateau count.
PLACE_KEYS = frozenset({"last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step", "_is_initial", "T_cur",
                        "T_i", "best", "num_bad_epochs", "cooldown_counter"})
NESTED_KEY = "_schedulers"  # SequentialLR and ChainedScheduler: each inner scheduler's state, in order
# torch schedulers whose get_lr() computes the rate from the step alone (the others with a closed form say so with
# `_get_closed_form_lr`); their chained get_lr() would go on from the group's current rate instead.
RATE_FROM_STEP = (lr_scheduler.OneCycleLR, lr_scheduler.LambdaLR, lr_scheduler.CyclicLR)
SET_BY_SCHEDULES = ("lr", "momentum", "betas")  # what a scheduler writes into its optimizer's param groups

Rates = dict[int, list[dict[str, Any]]]  # id(scheduler) -> its optimizer's groups' rates, before setup() ran again


def rates_before(state: Any, namespaces: Namespaces) -> Rates:
    """Before setup() runs again: the rates each scheduler's optimizer holds. A new scheduler over the same optimizer
    (one setup() does not make again) sets its groups to its own step 0 as it is made."""
    rates: Rates = {}
    try:
        schedulers = list(find_schedulers(state, namespaces).values())
    except Exception:  # noqa: BLE001 - a state that cannot be walked: nothing carried, said per scheduler later
        return rates
    for scheduler in schedulers:
        try:
            rates[id(scheduler)] = [{k: _copied(g[k]) for k in SET_BY_SCHEDULES if k in g}
                                    for g in scheduler.optimizer.param_groups]
        except Exception:  # noqa: BLE001 - no optimizer to read (a scheduler of a library's own): not carried
            continue
    return rates


def carry_schedulers(old_state: Any, new_state: Any, old_namespaces: Namespaces, new_namespaces: Namespaces,
                     rates: Rates) -> tuple[int, list[str]]:
    """Give each scheduler setup() made again the old one's place when nothing but the place differs; (how many
    were carried, the notes for the others). `rates`: `rates_before` the new setup() ran."""
    old = find_schedulers(old_state, old_namespaces)
    carried, notes = 0, []
    for path, new in find_schedulers(new_state, new_namespaces).items():
        before = old.get(path)
        if before is None or before is new:
            continue  # new in this setup(), or the same object (a global setup() does not make again)
        settings: list[str] = []
        try:
            why = _why_not_carried(before, new)
            if why is None:
                settings = _settings_that_differ(before.state_dict(), new.state_dict())
        except Exception as exc:  # noqa: BLE001 - a scheduler whose state cannot be read: the rebuild stands
            why = f"the schedulers' states could not be compared ({type(exc).__name__}: {exc})"
        if why is None and settings:
            moved = _new_settings_at_old_place(before, new, settings, path)
            if moved.startswith(path):
                carried += 1
                notes.append(moved)
                continue
            why = moved
        if why is None and id(before) not in rates:
            why = "the rates its optimizer held before the rebuild could not be read"
        if why is None:
            made = new.state_dict()
            try:
                _take_place(before, new, rates[id(before)])
            except Exception as exc:  # noqa: BLE001 - a state that does not load: the new schedule from its start
                _put_back(new, made)
                why = f"the old one's state could not be loaded ({type(exc).__name__}: {exc})"
            else:
                carried += 1
                continue
        if _steps_taken(before) > _steps_taken(new):
            notes.append(f"{path} ({type(new).__name__}) starts its schedule over, from the learning rate setup() "
                         f"gave the optimizer: {why} (the old one had taken {_steps_taken(before)} steps); a rebuild with "
                         "the same settings goes on with the schedule")
    return carried, notes


def _steps_taken(scheduler: LRScheduler) -> int:
    last = getattr(scheduler, "last_epoch", 0)
    return last if isinstance(last, int) else 0


def _put_back(scheduler: LRScheduler, state: dict[str, Any]) -> None:
    """The new scheduler as setup() made it, after a load that failed half-way."""
    try:
        scheduler.load_state_dict(state)
    except Exception:  # noqa: BLE001 - as good as it gets; the note says the schedule starts over
        pass


def _why_not_carried(old: LRScheduler, new: LRScheduler) -> str | None:
    if type(old) is not type(new):
        return f"setup() made a {type(new).__name__} where a {type(old).__name__} was"
    old_groups, new_groups = old.optimizer.param_groups, new.optimizer.param_groups
    if len(old_groups) != len(new_groups):
        return f"its optimizer has {len(new_groups)} parameter groups where the old one had {len(old_groups)}"
    return None


def _listed(settings: list[str]) -> str:
    """The settings that changed, the public ones alone when there are any (OneCycleLR's `_schedule_phases` follow
    from its `total_steps`)."""
    shown = [s for s in settings if not s.startswith("_")] or [s.lstrip("_") for s in settings]
    return ", ".join(shown[:4]) + (", ..." if len(shown) > 4 else "")


def _new_settings_at_old_place(old: LRScheduler, new: LRScheduler, settings: list[str], path: str) -> str:
    """Put the new scheduler at the old one's step and its groups at the new schedule's rate there. Returns the note
    (which starts with `path`), or why it cannot be done (the schedule then starts over)."""
    changed = f"its settings changed ({_listed(settings)})"
    kind = type(new)
    closed = kind.__module__ == lr_scheduler.__name__ and (hasattr(kind, "_get_closed_form_lr") or kind in RATE_FROM_STEP)
    if not closed:
        return f"{changed}, and a {kind.__name__}'s rate at a step cannot be computed from its settings alone"
    groups = new.optimizer.param_groups
    made, set_before = new.state_dict(), [{k: _copied(g[k]) for k in SET_BY_SCHEDULES if k in g} for g in groups]
    place = _steps_taken(old)
    try:
        new.last_epoch, new._step_count = place, max(getattr(old, "_step_count", place + 1), 1)
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
        return f"{changed}, and the new schedule has no rate at step {place} ({type(exc).__name__}: {exc})"
    return (f"{path} ({kind.__name__}) goes on from step {place} with the new settings ({_listed(settings)}): learning "
            f"rate {_rate(before)} as setup() made it, {_rate(new._last_lr)} at step {place} of the new schedule")


def _rate(rates: list[Any]) -> str:
    shown = [f"{float(r):.4g}" for r in rates[:3]]
    return ", ".join(shown) + (", ..." if len(rates) > 3 else "")


def _settings_that_differ(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """`name old -> new` for each setting (a state_dict entry that is not a place) that is not the same."""
    differ = []
    for key in sorted(set(old) | set(new)):
        if key in PLACE_KEYS:
            continue
        a, b = old.get(key), new.get(key)
        if key == NESTED_KEY and isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (inner_a, inner_b) in enumerate(zip(a, b)):
                if isinstance(inner_a, dict) and isinstance(inner_b, dict):
                    differ.extend(_settings_that_differ(inner_a, inner_b, f"{prefix}{key.lstrip('_')}[{i}]."))
                elif not _same(inner_a, inner_b):
                    differ.append(f"{prefix}{key.lstrip('_')}[{i}]")
            continue
        if not _same(a, b):
            differ.append(f"{prefix}{key} {_short(a)} -> {_short(b)}")
    return differ


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        both = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        return both and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that do not compare are taken as different
        return False


def _short(value: Any) -> str:
    text = repr(value.tolist() if isinstance(value, torch.Tensor) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def _take_place(old: LRScheduler, new: LRScheduler, rates: list[dict[str, Any]]) -> None:
    """The old scheduler's state into the new one, and the rates it had set into the new optimizer's groups."""
    new.load_state_dict(old.state_dict())
    keys = SET_BY_SCHEDULES if _cycles_momentum(old) else ("lr",)
    for old_group, new_group in zip(rates, new.optimizer.param_groups):
        for key in keys:
            if key in old_group and key in new_group:
                new_group[key] = _copied(old_group[key])


def _copied(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def _cycles_momentum(scheduler: LRScheduler) -> bool:
    """OneCycleLR and CyclicLR move the momentum (or Adam's beta1) with the rate, also inside a SequentialLR."""
    inner = getattr(scheduler, NESTED_KEY, None) or ()
    return bool(getattr(scheduler, "cycle_momentum", False)) or any(_cycles_momentum(s) for s in inner)
