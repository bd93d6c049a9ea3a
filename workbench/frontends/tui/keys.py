"""Every action the app offers, in one table: keys, footer, help screen and palette all come from it.

Each action has a stable id; the user's config file rebinds keys by that id
(`[keys] snapshot = "S"`), and the help screen and palette show the keys in effect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from textual.binding import Binding
from textual.keys import format_key

PROFILE_STEPS = 3


@dataclass(frozen=True)
class KeyAction:
    """One thing the user can do, and the key(s) that do it by default."""

    id: str
    keys: str  # Textual key names, comma separated
    action: str  # the App action it runs
    label: str  # short: footer and palette title
    help: str  # one sentence: help screen and palette
    footer: bool = False
    priority: bool = False  # works even when a pane has focus and binds the key itself


ACTIONS: tuple[KeyAction, ...] = (
    KeyAction("toggle_pause", "space", "toggle_pause", "Pause/Resume", "pause / resume training", footer=True, priority=True),
    KeyAction("step_once", "n", "step_once", "Step once", "run one step while paused"),
    KeyAction("reload", "r", "reload", "Reload", "reload now: re-read every project file and apply what changed", footer=True),
    KeyAction("rollback", "u", "rollback", "Undo reload", "undo the last reload (roll back to the previous code version)"),
    KeyAction("rebuild", "R", "rebuild", "Rebuild",
              "rebuild from the code on disk (held changes, x's lines, import-time builders, setup()), carrying weights and optimizer state over (asks first)"),
    KeyAction("run_statements", "x", "run_statements", "Run held statements",
              "run the changed module statements a reload held back (e.g. MODEL = Net())"),
    KeyAction("evaluate", "e", "evaluate", "Evaluate", "run evaluate(state, bench) now; its scalars join the chart", footer=True),
    KeyAction("cleanup", "c", "cleanup", "Cleanup", "cleanup: gc.collect + torch.cuda.empty_cache, and what it freed", footer=True),
    KeyAction("breakdown", "b", "breakdown", "Memory breakdown",
              "memory breakdown: parameters, gradients, optimizer state, buffers, activations, cache; with advice", footer=True),
    KeyAction("versions", "v", "versions", "Versions",
              "versions table: per code version steps/s, saved activations, peaks, loss, and the change vs the previous", footer=True),
    KeyAction("last_profile", "o", "last_profile", "Last profile", "the last profile's top operators by time and memory"),
    KeyAction("leaks", "t", "leaks", "Leak finder",
              "leak finder: every live tensor by owner; the largest unowned ones and what keeps them alive"),
    KeyAction("memory_snapshot", "m", "memory_snapshot", "CUDA memory snapshot",
              "CUDA memory snapshot for pytorch.org/memory_viz (to the run folder's memory/; --record-memory for stacks)"),
    KeyAction("snapshot", "s", "snapshot", "Snapshot", "snapshot: models, optimizers, schedulers, GradScaler, loader places, RNG to .vram-bench/runs/<start>/snapshots/", footer=True),
    KeyAction("profile", "p", "profile", "Profile",
              f"profile the next {PROFILE_STEPS} steps with torch.profiler (trace to the run folder's traces/)", footer=True),
    KeyAction("interrupt", "i", "interrupt", "Interrupt step", "interrupt a running step (raises KeyboardInterrupt in it; the model stays)"),
    KeyAction("toggle_output", "l", "toggle_output", "Log: output",
              "log: hide or show what the code prints (reloads, errors and actions stay, however much was printed)"),
    KeyAction("zoom", "z", "zoom", "Zoom pane", "maximize the focused pane, or restore it (tab / shift+tab move the focus between panes)"),
    KeyAction("help", "question_mark,f1", "help", "Help", "this help: every key, and what each pane shows", footer=True),
    KeyAction("detach", "d", "detach", "Detach", "detach: leave the app, training goes on (vram-bench attach brings it back)"),
    KeyAction("quit", "q", "quit", "Quit", "leave: detach, or stop the session with or without a final snapshot (ctrl+c too)", footer=True),
)

ACTION_IDS = frozenset(action.id for action in ACTIONS)


def bindings() -> list[Binding]:
    """The app's BINDINGS, built from the table (ids make them rebindable with `App.set_keymap`)."""
    made = [
        Binding(a.keys, a.action, a.label, id=a.id, show=a.footer, priority=a.priority)
        for a in ACTIONS
    ]
    made.append(Binding("ctrl+c", "quit", "Quit", id="quit_ctrl_c", show=False, priority=True))
    return made


def key_label(keys: str) -> str:
    """How a comma-separated key list reads on screen: "question_mark,f1" -> "? / F1"."""
    labels = []
    for key in keys.split(","):
        *modifiers, base = key.strip().split("+")
        shown = base.upper() if re.fullmatch(r"f\d+", base) else format_key(base)
        labels.append("+".join([*modifiers, shown]))
    return " / ".join(labels)


def keys_in_effect(keymap: dict[str, str]) -> dict[str, str]:
    """Action id -> its keys, with the user's rebindings applied."""
    return {a.id: keymap.get(a.id, a.keys) for a in ACTIONS}


def check_keymap(keymap: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Keep the rebindings that name a known action and a key; say what was ignored and why."""
    good: dict[str, str] = {}
    problems: list[str] = []
    for action_id, keys in keymap.items():
        if action_id not in ACTION_IDS:
            problems.append(f"[keys] {action_id}: no such action (known: {', '.join(sorted(ACTION_IDS))})")
        elif not isinstance(keys, str) or not keys.strip():
            problems.append(f"[keys] {action_id}: the value must be a key name such as \"S\" or \"ctrl+s\"")
        else:
            good[action_id] = keys.strip()
    taken: dict[str, str] = {}
    for action_id, keys in keys_in_effect(good).items():
        for key in keys.split(","):
            other = taken.setdefault(key.strip(), action_id)
            if other != action_id:
                problems.append(f"[keys] {key.strip()!r} is bound to both {other} and {action_id}: give one of them another key")
    return good, problems
