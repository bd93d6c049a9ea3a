"""The reload log: reloads, errors with tracebacks, pauses, actions and what the code printed.

Newest last. It has its own event subscription and drains it on a timer, so the
training thread never waits for it. What the code prints can be hidden (key `l`):
a real trainer prints every few steps (makemore: a status line every 10 steps and
samples every 200), which scrolls a reload's notes out of the pane in seconds; the
reloads, errors and actions are kept apart, so hiding the output shows the last
`entries` of them however much was printed since.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

from rich.console import Group, RenderableType
from rich.text import Text
from textual.geometry import Size
from textual.widgets import RichLog

from workbench.protocol.eventbus import EventBus, Subscription
from workbench.protocol.events import (
    Cleanup,
    CommandSent,
    Error,
    Evaluation,
    Event,
    LeaksFound,
    MemorySnapshotTaken,
    Exit,
    Paused,
    Print,
    Profile,
    Rebuilt,
    Reload,
    Resumed,
    ResumeLoaded,
    Setup,
    Snapshot,
    Start,
)
from workbench.frontends.tui.format import human_bytes
from workbench.frontends.tui.pane_clock import on_beat
from workbench.frontends.tui.roles import DEFAULT_ROLES, Roles, roles
from workbench.frontends.tui.traceback_view import render_traceback

LOGGED = (
    Reload, Rebuilt, MemorySnapshotTaken, Evaluation, Error, Paused, Resumed, ResumeLoaded, Setup, Snapshot, Cleanup, Profile,
    Print, Exit, Start, LeaksFound, CommandSent,
)
DEFAULT_ENTRIES = 1000


class ReloadLog(RichLog, can_focus=True):
    """Keeps the last `entries` entries (an entry is one event with its traceback or notes)."""

    ALLOW_MAXIMIZE = True

    def __init__(
        self,
        bus: EventBus,
        project_root: Path,
        *,
        timestamps: bool = True,
        entries: int = DEFAULT_ENTRIES,
        id: str | None = None,
    ) -> None:
        super().__init__(max_lines=None, wrap=True, markup=False, highlight=False, id=id)
        self._subscription: Subscription = bus.subscribe(maxlen=5000, accept=lambda e: isinstance(e, LOGGED))
        self._root = project_root
        self._timestamps = timestamps
        self._events: deque[Event] = deque(maxlen=entries)
        self._notices: deque[Event] = deque(maxlen=entries)  # the events but what the code printed
        self._line_counts: deque[int] = deque()  # lines each shown entry took, oldest first
        self._theme = ""
        self._show_output = True

    @property
    def showing_output(self) -> bool:
        return self._show_output

    def toggle_output(self) -> bool:
        """Hide what the code prints, or show it again; returns whether it is shown now."""
        self._show_output = not self._show_output
        self.redraw_all()
        return self._show_output

    @property
    def entries(self) -> int:
        return len(self._line_counts)

    def on_mount(self) -> None:
        on_beat(self, 0.25, self.pull)
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.redraw_all())

    def on_unmount(self) -> None:
        self._subscription.close()

    def pull(self) -> None:
        if not self._size_known:
            return  # entries wait in the subscription until the pane has a width to wrap at
        events = self._subscription.drain()
        if not events:
            return
        with self.app.batch_update():
            for event in events:
                self._events.append(event)
                if not isinstance(event, Print):
                    self._notices.append(event)
                elif not self._show_output:
                    continue
                self._show(event)
            self._trim()

    def redraw_all(self) -> None:
        """Draw every kept entry again: after a theme change (old lines take the new colours), and when `l` hides or
        shows what the code prints."""
        if not self._size_known:
            return
        self.clear()
        self._line_counts.clear()
        for event in self._events if self._show_output else self._notices:
            self._show(event)

    def _show(self, event: Event) -> None:
        before = len(self.lines)
        self.write(render_entry(event, self._root, roles(self.app), dark=self.app.current_theme.dark, timestamps=self._timestamps))
        self._line_counts.append(len(self.lines) - before)

    def _trim(self) -> None:
        """Drop whole entries from the top once there are more than the log keeps."""
        drop = 0
        while len(self._line_counts) > (self._events.maxlen or 0):
            drop += self._line_counts.popleft()
        if drop:
            self.lines = self.lines[drop:]
            self._start_line += drop
            self._line_cache.clear()
            self.virtual_size = Size(self._widest_line_width, len(self.lines))
            self.refresh()


def render_entry(event: Event, root: Path, roles: Roles = DEFAULT_ROLES, *, dark: bool = True, timestamps: bool = True) -> RenderableType:
    """One log entry: a headline, then the traceback, notes or top operators that belong to it."""
    line = Text()
    if timestamps:
        line.append(time.strftime("%H:%M:%S ", time.localtime(event.time)), style="dim")
    _describe(line, event, root, roles)
    parts: list[RenderableType] = [line]
    if isinstance(event, Error) and event.traceback:
        parts.append(render_traceback(event.traceback, root, roles=roles, dark=dark))
    if isinstance(event, Reload):
        parts.extend(Text(f"         note: {note}", style="dim") for note in event.notes)
    if isinstance(event, MemorySnapshotTaken):
        parts.extend(Text(f"         {summary}", style="dim") for summary in event.summary)
    if isinstance(event, Profile) and event.top_ops:
        parts.extend(
            Text(f"         {op['self_cpu_ms']:>9.2f} ms  {op['calls']:>6}x  {op['name']}", style="dim") for op in event.top_ops[:5]
        )
    return parts[0] if len(parts) == 1 else Group(*parts)


def _describe(line: Text, event: Event, root: Path, roles: Roles) -> None:
    if isinstance(event, Reload):
        if event.needs_rebuild:
            line.append("NEEDS REBUILD ", style=roles.bold("error"))
            line.append(f"{event.file}: held back {', '.join(event.held) or 'the change'}: {'; '.join(event.needs_rebuild)}")
        elif event.ok and event.changed:
            line.append("RELOAD ", style=roles.bold("ok"))
            line.append(f"{event.file} -> code v{event.code_version}: {', '.join(event.changed)} ({event.ms:.0f} ms)")
        elif event.ok:
            line.append("RELOAD ", style=roles.bold("ok"))
            line.append(f"{event.file}: nothing to apply")
        else:
            where = f"{event.file}:{event.line}" if event.line else event.file
            line.append("RELOAD FAILED ", style=roles.bold("error"))
            line.append(f"{where}: {event.error}", style=roles.error)
    elif isinstance(event, Rebuilt):
        if event.ok:
            line.append("REBUILT ", style=roles.bold("ok"))
            line.append(
                f"setup() ran again in {event.seconds:.1f} s -> code v{event.code_version}; carried "
                f"{event.tensors_carried} tensors ({event.tensors_shared} handed over without a copy) and "
                f"{event.optimizer_states_carried} optimizer states"
                + (f", and {event.schedulers_carried} LR schedule(s) going on" if event.schedulers_carried else "")
            )
            for label, names in (("new", event.new), ("shape changed", event.mismatched), ("dropped", event.dropped)):
                if names:
                    line.append(f"; {label}: {', '.join(names[:6])}" + (" ..." if len(names) > 6 else ""), style=roles.warning)
            for note in event.notes:
                line.append(f"; {note}", style=roles.warning)
        else:
            line.append("REBUILD FAILED ", style=roles.bold("error"))
            line.append(event.error or "", style=roles.error)
    elif isinstance(event, Error) and event.is_warning:
        line.append(f"WARNING {event.where} ", style=roles.bold("warning"))
        line.append(event.message, style=roles.warning)
    elif isinstance(event, Error) and event.where == "data":  # step() read past the end of its data: paused
        line.append("DATA ENDED ", style=roles.bold("warning"))
        line.append(event.message, style=roles.warning)
    elif isinstance(event, Error):
        where = f" ({event.file}:{event.line})" if event.file else ""
        line.append(f"ERROR in {event.where} ", style=roles.bold("error"))
        line.append(f"{event.message}{where}", style=roles.error)
        if event.where == "step":
            line.append(" - training paused; save a fix to resume", style=roles.warning)
        elif event.where == "setup":
            line.append(" - fix it and save to run setup() again, or press q to quit", style=roles.warning)
    elif isinstance(event, Paused):
        line.append("PAUSED ", style=roles.bold("warning"))
        line.append(f"at step {event.step} ({event.reason})")
    elif isinstance(event, Resumed):
        line.append("RESUMED ", style=roles.bold("ok"))
        line.append(f"at step {event.step} ({event.reason})")
    elif isinstance(event, Setup):
        line.append("SETUP ", style=roles.bold("info"))
        if event.status == "running":
            line.append("running setup()...")
        elif event.status == "done":
            line.append("setup() finished" + (f" in {event.seconds:.1f} s" if event.seconds >= 1 else ""))
        else:
            line.append("setup() failed", style=roles.error)
    elif isinstance(event, ResumeLoaded):
        if event.late:
            line.append("RESUME ", style=roles.bold("ok"))
            line.append(f"at step {event.step}: " + "; ".join(event.notes))
        elif event.ok:  # a failed resume is also an error event, logged as such
            line.append("RESUMED FROM ", style=roles.bold("ok"))
            line.append(
                f"{_relative(event.path, root)} at step {event.step}: {event.tensors} tensors"
                + (f" ({event.mapped} mapped from the file, no copy)" if event.mapped else "")
                + f", {event.optimizers} optimizer(s)"
                + (f", {event.schedulers} LR scheduler(s)" if event.schedulers else "")
                + f" in {event.seconds:.1f} s"
            )
            skipped = [*event.missing, *event.unexpected, *event.mismatched]
            if skipped:
                line.append(f"; not loaded: {', '.join(skipped[:6])}" + (" ..." if len(skipped) > 6 else ""), style=roles.warning)
            for note in event.notes:
                line.append(f"; {note}", style=roles.warning)
    elif isinstance(event, LeaksFound):
        line.append("LEAKS ", style=roles.bold("warning"))
        line.append(f"{human_bytes(event.unowned_bytes)} of {human_bytes(event.total_bytes)} in tensors no model, optimizer or "
                    "state owns")
        suspects = [f"{s['description']} ({human_bytes(s['bytes'])})" for s in event.suspects[:3]]
        if suspects:
            line.append("; largest: " + "; ".join(suspects), style=roles.warning)
    elif isinstance(event, Snapshot):
        line.append("SNAPSHOT ", style=roles.bold("info"))
        line.append(f"{_relative(event.path, root)} ({human_bytes(event.bytes)}) at step {event.step}")
        if event.reason != "requested":  # one the user did not ask for just now: say what took it
            line.append(f" ({event.reason})", style="dim")
        if event.left_out:
            line.append("; not kept: " + "; ".join(event.left_out), style=roles.warning)
    elif isinstance(event, Cleanup):
        line.append("CLEANUP ", style=roles.bold("info"))
        line.append(f"freed {human_bytes(event.freed_bytes)}; ")
        line.append(", ".join(f"{k} {human_bytes(event.before[k])} -> {human_bytes(event.after.get(k))}" for k in event.before))
    elif isinstance(event, Profile):
        line.append("PROFILE ", style=roles.bold("accent"))
        if event.status == "started":
            line.append(f"recording the next {event.steps} steps...")
        elif event.status == "cancelled":
            line.append(f"cancelled with {event.steps} step(s) to go; no trace written")
        else:
            line.append(f"{event.steps} steps -> {_relative(event.trace or '', root)} (open in ui.perfetto.dev; o shows the table); top ops:")
    elif isinstance(event, CommandSent):
        line.append("COMMAND ", style="bold")
        line.append(f"{event.command}", style="bold")
        line.append(f" from {event.client}", style="dim")
    elif isinstance(event, Print):
        style = roles.warning if event.stream == "stderr" else ""
        line.append(f"[{event.stream}] ", style="dim")
        line.append(event.text, style=style)
    elif isinstance(event, MemorySnapshotTaken):
        line.append("MEMORY SNAPSHOT ", style=roles.bold("info"))
        line.append(f"{_relative(event.path, root)} ({human_bytes(event.bytes)}, {event.reason})")
    elif isinstance(event, Evaluation):
        line.append("EVALUATE ", style=roles.bold("info"))
        line.append(f"at step {event.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in event.scalars.items()))
    elif isinstance(event, Start):
        line.append("START ", style="bold")
        line.append(f"{event.project} on {event.device} (vram-bench {event.version}, torch {event.torch})")
    elif isinstance(event, Exit):
        line.append("STOPPED ", style="bold")
        line.append(f"{event.reason} at step {event.step}")


def _relative(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path
