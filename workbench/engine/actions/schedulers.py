"""Learning-rate schedulers in snapshots and resumes: a schedule goes on from where the snapshot left it.

A scheduler (`torch.optim.lr_scheduler`: StepLR, OneCycleLR, a LambdaLR warm-up) counts the steps it has taken;
the optimizer's param groups hold the learning rate it set last. A resume that restored the optimizer and not the
scheduler started the schedule over while the optimizer kept the snapshot's rate: OneCycleLR went back to its
warm-up, a StepLR decayed at the wrong steps, and the `resume` event said nothing. So a snapshot holds every
scheduler it finds in the state and the module globals (by the same path as the optimizers), a resume loads each
into the scheduler setup() made at that path, and whatever cannot be loaded is said.
"""

from __future__ import annotations

from typing import Any

from torch.optim.lr_scheduler import LRScheduler

from workbench.engine.state_walk import Namespaces, find_reachable

def is_scheduler(obj: Any) -> bool:
    return isinstance(obj, LRScheduler)


def find_schedulers(state: Any, namespaces: Namespaces = ()) -> dict[str, LRScheduler]:
    """Every LR scheduler in the state (dict values, list items, public attributes) and in the project's module
    globals (`train.scheduler`), each once, by its path; the state's path wins."""
    return find_reachable(state, namespaces, is_scheduler, "scheduler")


def type_name(obj: Any) -> str:
    """`torch.optim.lr_scheduler.StepLR`: what snapshots record of an optimizer's or scheduler's class."""
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def scheduler_payload(schedulers: dict[str, LRScheduler]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """What a snapshot keeps of them: each one's `state_dict()` (numbers and lists, loadable with weights_only=True)
    and its class, so a resume into another kind is refused rather than half-loaded."""
    return {name: s.state_dict() for name, s in schedulers.items()}, {name: type_name(s) for name, s in schedulers.items()}


def load_schedulers(schedulers: dict[str, LRScheduler], payload: dict[str, Any]) -> tuple[int, list[str]]:
    """Load the snapshot's scheduler states into the live ones of the same path and class (after the optimizers,
    whose param groups hold the rate each scheduler set last). Returns how many were loaded and the notes for the
    others: a scheduler the snapshot lacks starts its schedule over, which the `resume` event must say."""
    saved: dict[str, Any] = payload.get("schedulers") or {}
    types: dict[str, str] = payload.get("scheduler_types") or {}
    loaded, notes = 0, []
    for name, scheduler in schedulers.items():
        kind = type(scheduler).__name__
        state = saved.get(name)
        if state is None:
            older = "" if "schedulers" in payload else " (written before vram-bench kept schedulers)"
            if payload.get("schedulers_error"):
                older = f" (its state could not be written: {payload['schedulers_error']})"
            notes.append(f"{name} ({kind}) is not in the snapshot{older}: its schedule starts over, while the optimizer "
                         "keeps the learning rate the snapshot has")
            continue
        if types.get(name, type_name(scheduler)) != type_name(scheduler):
            notes.append(f"{name}: the snapshot holds a {types[name].rsplit('.', 1)[-1]}'s state, setup() made a {kind}: "
                         "it starts its schedule over")
            continue
        before = scheduler.state_dict()
        try:
            scheduler.load_state_dict(state)
        except Exception as exc:  # noqa: BLE001 - a state that does not fit: the scheduler as setup() made it, said
            scheduler.load_state_dict(before)
            notes.append(f"{name} ({kind}): the snapshot's state could not be loaded ({type(exc).__name__}: {exc}); "
                         "it starts its schedule over")
            continue
        loaded += 1
    unclaimed = sorted(set(saved) - set(schedulers))
    if unclaimed:
        notes.append(f"the snapshot holds scheduler(s) setup() did not make: {', '.join(unclaimed)} (not loaded)")
    return loaded, notes


def partial_resume_notes(schedulers: dict[str, LRScheduler]) -> list[str]:
    """A partial resume (`--resume-partial`, a model that no longer fits) loads no optimizer state: the schedulers
    setup() made start over with it, said."""
    return [f"{name} ({type(s).__name__}) starts its schedule over: a partial resume loads no optimizer or scheduler "
            "state" for name, s in schedulers.items()]
