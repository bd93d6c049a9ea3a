"""The reload log: reloads, errors with tracebacks, pauses, actions and what the code printed.

Newest last. It has its own event subscription and drains it on a timer, so the
training thread never waits for it.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.syntax import Syntax
from rich.text import Text
from textual.widgets import RichLog

from workbench.eventbus import EventBus, Subscription
from workbench.events import (
    Cleanup,
    Error,
    Evaluation,
    Event,
    MemorySnapshotTaken,
    Exit,
    Paused,
    Print,
    Profile,
    Rebuilt,
    Reload,
    Resumed,
    Setup,
    Snapshot,
    Start,
)
from workbench.tui.format import human_bytes

LOGGED = (Reload, Rebuilt, MemorySnapshotTaken, Evaluation, Error, Paused, Resumed, Setup, Snapshot, Cleanup, Profile, Print, Exit, Start)
MAX_LINES = 2000


class ReloadLog(RichLog):
    def __init__(self, bus: EventBus, project_root: Path, *, timestamps: bool = True, id: str | None = None) -> None:
        super().__init__(max_lines=MAX_LINES, wrap=True, markup=False, highlight=False, id=id)
        self._subscription: Subscription = bus.subscribe(maxlen=5000, accept=lambda e: isinstance(e, LOGGED))
        self._root = project_root
        self._timestamps = timestamps

    def on_mount(self) -> None:
        self.set_interval(0.25, self.pull)

    def on_unmount(self) -> None:
        self._subscription.close()

    def pull(self) -> None:
        events = self._subscription.drain()
        if not events:
            return
        with self.app.batch_update():
            for event in events:
                self.show(event)

    def show(self, event: Event) -> None:
        line = Text()
        if self._timestamps:
            line.append(time.strftime("%H:%M:%S ", time.localtime(event.time)), style="dim")
        _describe(line, event, self._root)
        self.write(line)
        if isinstance(event, Error) and event.traceback:
            self.write(Syntax(event.traceback.rstrip(), "pytb", theme="ansi_dark", word_wrap=True, background_color="default"))
        if isinstance(event, Reload):
            for note in event.notes:
                self.write(Text(f"         note: {note}", style="dim"))
        if isinstance(event, MemorySnapshotTaken):
            for line in event.summary:
                self.write(Text(f"         {line}", style="dim"))
        if isinstance(event, Profile) and event.top_ops:
            for op in event.top_ops[:5]:
                self.write(Text(f"         {op['self_cpu_ms']:>9.2f} ms  {op['calls']:>6}x  {op['name']}", style="dim"))


def _describe(line: Text, event: Event, root: Path) -> None:
    if isinstance(event, Reload):
        if event.needs_rebuild:
            line.append("NEEDS REBUILD ", style="bold red")
            line.append(f"{event.file}: held back {', '.join(event.held) or 'the change'}: {'; '.join(event.needs_rebuild)}")
        elif event.ok and event.changed:
            line.append("RELOAD ", style="bold green")
            line.append(f"{event.file} -> code v{event.code_version}: {', '.join(event.changed)} ({event.ms:.0f} ms)")
        elif event.ok:
            line.append("RELOAD ", style="bold green")
            line.append(f"{event.file}: nothing to apply")
        else:
            where = f"{event.file}:{event.line}" if event.line else event.file
            line.append("RELOAD FAILED ", style="bold red")
            line.append(f"{where}: {event.error}", style="red")
    elif isinstance(event, Rebuilt):
        if event.ok:
            line.append("REBUILT ", style="bold green")
            line.append(
                f"setup() ran again in {event.seconds:.1f} s -> code v{event.code_version}; carried "
                f"{event.tensors_carried} tensors and {event.optimizer_states_carried} optimizer states"
            )
            for label, names in (("new", event.new), ("shape changed", event.mismatched), ("dropped", event.dropped)):
                if names:
                    line.append(f"; {label}: {', '.join(names[:6])}" + (" ..." if len(names) > 6 else ""), style="yellow")
        else:
            line.append("REBUILD FAILED ", style="bold red")
            line.append(event.error or "", style="red")
    elif isinstance(event, Error):
        where = f" ({event.file}:{event.line})" if event.file else ""
        line.append(f"ERROR in {event.where} ", style="bold red")
        line.append(f"{event.message}{where}", style="red")
        if event.where == "step":
            line.append(" - training paused; save a fix to resume", style="yellow")
        elif event.where == "setup":
            line.append(" - fix it and save to run setup() again, or press q to quit", style="yellow")
    elif isinstance(event, Paused):
        line.append("PAUSED ", style="bold yellow")
        line.append(f"at step {event.step} ({event.reason})")
    elif isinstance(event, Resumed):
        line.append("RESUMED ", style="bold green")
        line.append(f"at step {event.step} ({event.reason})")
    elif isinstance(event, Setup):
        line.append("SETUP ", style="bold cyan")
        if event.status == "running":
            line.append("running setup()...")
        elif event.status == "done":
            line.append("setup() finished" + (f" in {event.seconds:.1f} s" if event.seconds >= 1 else ""))
        else:
            line.append("setup() failed", style="red")
    elif isinstance(event, Snapshot):
        line.append("SNAPSHOT ", style="bold blue")
        line.append(f"{_relative(event.path, root)} ({human_bytes(event.bytes)}) at step {event.step}")
    elif isinstance(event, Cleanup):
        line.append("CLEANUP ", style="bold blue")
        line.append(f"freed {human_bytes(event.freed_bytes)}; ")
        line.append(", ".join(f"{k} {human_bytes(event.before[k])} -> {human_bytes(event.after.get(k))}" for k in event.before))
    elif isinstance(event, Profile):
        line.append("PROFILE ", style="bold magenta")
        if event.status == "started":
            line.append(f"recording the next {event.steps} steps...")
        else:
            line.append(f"{event.steps} steps -> {_relative(event.trace or '', root)} (open in ui.perfetto.dev; o shows the table); top ops:")
    elif isinstance(event, Print):
        style = "yellow" if event.stream == "stderr" else ""
        line.append(f"[{event.stream}] ", style="dim")
        line.append(event.text, style=style)
    elif isinstance(event, MemorySnapshotTaken):
        line.append("MEMORY SNAPSHOT ", style="bold blue")
        line.append(f"{_relative(event.path, root)} ({human_bytes(event.bytes)}, {event.reason})")
    elif isinstance(event, Evaluation):
        line.append("EVALUATE ", style="bold cyan")
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
