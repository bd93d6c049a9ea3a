"""Memory gauges: host process and system RAM always; per GPU when there is one; history lines.

The RSS bar's 100% is the real ceiling: the memory cgroup's limit where one
applies ("of cgroup limit 2.00 GiB", with what the cgroup holds), else the
host's RAM. A GPU's figures say what this process may use where that is less
than the device (a MIG slice, set_per_process_memory_fraction).

A GPU bar is stacked: other processes and CUDA context (device used minus our
reserved) | cached but free (reserved minus allocated) | live tensors
(allocated). Allocator retries and OOMs turn red when they move.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.text import Text
from textual.binding import Binding
from textual.widgets import Static

from workbench.protocol.payloads import GpuMemory, MemorySample
from workbench.protocol.events import Ranks
from workbench.protocol.mirror import TelemetryMirror as Telemetry  # the engine's Telemetry reads the same
from workbench.frontends.tui.format import bar, human_bytes
from workbench.units import compact_bytes
from workbench.frontends.tui.pane_clock import on_beat
from workbench.frontends.tui.roles import DEFAULT_ROLES, Roles, roles
from workbench.frontends.tui.shown_text import ShownText
from workbench.frontends.tui.widgets.loss_chart import sparkline

BAR_WIDTH = 20
HIGHLIGHT_SECONDS = 30.0  # how long a moved retry/OOM counter stays red
NEAR_LIMIT = 0.9  # share of the cgroup limit in use at which the host gauge turns to a warning
STALE_RANKS_SECONDS = 3.0  # ranks' rows older than this are shown with their age (gathered at least once a second)


class MemoryGauges(Static, can_focus=True):
    """Scrolls with the arrow and page keys when focused (tab), for terminals too short to show it all."""

    ALLOW_MAXIMIZE = True
    BINDINGS = [
        Binding("up", "scroll_up", show=False),
        Binding("down", "scroll_down", show=False),
        Binding("pageup", "page_up", show=False),
        Binding("pagedown", "page_down", show=False),
        Binding("home", "scroll_home", show=False),
        Binding("end", "scroll_end", show=False),
    ]

    def __init__(self, telemetry: Telemetry, *, window: float = 300.0, id: str | None = None) -> None:
        super().__init__(id=id)
        self._telemetry = telemetry
        self._window = window
        self._counters: dict[tuple[int, str], tuple[int, float]] = {}  # (gpu, name) -> (value, when it last moved)
        self._shown = ShownText()
        self._seen: tuple[object, ...] = ()
        self._last_sample: MemorySample | None = None

    def _highlighting(self) -> bool:
        now = time.monotonic()
        return any(now - moved < HIGHLIGHT_SECONDS for _, moved in self._counters.values())

    def on_mount(self) -> None:
        self.redraw()
        # Once a second, on the chart's beat: the pane sits beside the chart, and a frame redraws every line of
        # the screen between its changes, so a memory redraw on its own beat re-rendered the chart's lines too.
        on_beat(self, 1.0, self.redraw)

    def redraw(self) -> None:
        sample = self._telemetry.memory
        ranks = getattr(self._telemetry, "ranks", None)  # under torchrun (the app's mirror has it)
        now = time.time()
        seen = (self.size, self.app.theme, self._highlighting(), ranks, ranks_age(ranks, now))
        if sample is self._last_sample and seen == self._seen:
            return  # no new sample since the last redraw (paused: the sampler slows down)
        self._last_sample, self._seen = sample, seen
        if sample is None:
            self._shown.show(self, Text("sampling memory...", style="dim"))
            return
        width = max(self.size.width - 18, 6)
        history = self._telemetry.memory_history(self._window)
        self._shown.show(
            self,
            render_memory(
                sample,
                width,
                history=history,
                window=self._window,
                step_peaks=self._telemetry.step_peaks,
                moved=self._moved(sample),
                roles=roles(self.app),
                ranks=ranks,
                now=now,
            )
        )

    def _moved(self, sample: MemorySample) -> set[tuple[int, str]]:
        now = time.monotonic()
        moved = set()
        for gpu in sample.gpus:
            for name in ("alloc_retries", "ooms"):
                value = getattr(gpu, name)
                if value is None:
                    continue
                previous = self._counters.get((gpu.index, name))
                if previous is None:
                    self._counters[(gpu.index, name)] = (value, 0.0)
                elif value != previous[0]:
                    self._counters[(gpu.index, name)] = (value, now)
                if now - self._counters[(gpu.index, name)][1] < HIGHLIGHT_SECONDS:
                    moved.add((gpu.index, name))
        return moved


def render_memory(
    sample: MemorySample,
    bar_width: int = BAR_WIDTH,
    *,
    history: Sequence[MemorySample] = (),
    window: float = 300.0,
    step_peaks: dict[int, int] | None = None,
    moved: set[tuple[int, str]] | None = None,
    roles: Roles = DEFAULT_ROLES,
    ranks: Ranks | None = None,
    now: float | None = None,
) -> Text:
    bar_width = min(max(bar_width, 6), 40)
    host = sample.host
    text = Text(overflow="fold")
    text.append("Host\n", style="bold underline")
    used = host.system_total - host.system_available
    limit = host.limit  # the real ceiling: the memory cgroup's limit where one applies, else the host's RAM
    limited = host.limit_source != "host"
    charged = host.cgroup_usage if limited and host.cgroup_usage is not None else host.rss
    near = limited and limit and charged / limit >= NEAR_LIMIT
    text.append(" RSS ", style="bold")
    text.append(bar(host.rss / limit if limit else 0, bar_width), style=roles.warning if near else roles.info)
    text.append(f" {human_bytes(host.rss)}\n")
    text.append(f"     anon {human_bytes(host.rss_anon)}, file {human_bytes(host.rss_file)}\n", style="dim")
    if limited:
        text.append(f"     of cgroup limit {human_bytes(limit)}\n", style=roles.warning if near else "dim")
        if host.cgroup_usage is not None:
            text.append(f"     cgroup in use {human_bytes(host.cgroup_usage)}\n", style=roles.warning if near else "dim")
    text.append(" RAM ", style="bold")
    text.append(bar(used / host.system_total if host.system_total else 0, bar_width), style=roles.secondary)
    text.append(f" {human_bytes(used)}\n")
    text.append(f"     of {human_bytes(host.system_total)} in use\n", style="dim")
    if host.swap_used:
        text.append(f"     swap in use {human_bytes(host.swap_used)}\n", style=roles.warning)
    if len(history) > 1:
        _history_line(text, "RSS", [s.host.rss for s in history], bar_width, window, roles)
    text.append("GPU\n", style="bold underline")
    if not sample.gpus:
        text.append(f" {sample.gpu_note or 'No GPU visible.'}\n", style="dim")
    for i, gpu in enumerate(sample.gpus):
        rate = sample.allocations_per_step[i] if i < len(sample.allocations_per_step) else None
        _render_gpu(text, gpu, bar_width, (step_peaks or {}).get(gpu.index), rate, moved or set(), roles)
        gpu_history = [s.gpus[i] for s in history if i < len(s.gpus)]
        if len(gpu_history) > 1:
            _history_line(text, "live", [g.allocated or 0 for g in gpu_history], bar_width, window, roles)
            _history_line(text, "rsvd", [g.reserved or 0 for g in gpu_history], bar_width, window, roles)
    if sample.gpus and sample.gpu_note:
        text.append(f" {sample.gpu_note}\n", style="dim")
    if ranks is not None:
        _render_ranks(text, ranks, roles, ranks_age(ranks, now) if now is not None else None)
    text.rstrip()
    return text


def ranks_age(ranks: Ranks | None, now: float) -> int | None:
    """Whole seconds since the ranks' rows were gathered, once they are older than expected (else None).

    Rank 0 gathers them about once a second while the ranks exchange, paused or not, or once a step for steps longer
    than that; rows older than STALE_RANKS_SECONDS and two of the slowest rank's steps mean no exchange happened: a rank
    holds the others up (the status bar's WAITING says which), or the job is stopped."""
    if ranks is None:
        return None
    age = now - ranks.time
    longest_step = max((float(row.get("step_ms") or 0) for row in ranks.ranks), default=0.0) / 1000
    return int(age) if age > max(STALE_RANKS_SECONDS, 2 * longest_step) else None


def _render_ranks(text: Text, ranks: Ranks, roles: Roles, age: int | None = None) -> None:
    """Under torchrun: a row per rank (step, steps/s, host and GPU memory), the straggler marked; rows that stopped
    coming say how old they are, rather than show a stuck rank's last numbers as if current."""
    text.append(f"Ranks ({len(ranks.ranks)})", style="bold underline")
    text.append(f"  as of {age} s ago\n" if age is not None else "\n", style=roles.warning if age is not None else "")
    gpus = any(row.get("gpu_allocated_bytes") is not None for row in ranks.ranks)
    # Columns, not labelled values: a row fits the pane's ~40 columns with a GPU, so one rank is one line.
    text.append(" rank    step  it/s    ms   RSS" + ("   GPU" if gpus else "") + "\n", style="dim")
    for row in ranks.ranks:
        slow = row.get("rank") == ranks.slowest
        line = (f" r{row.get('rank')!s:<4}{row.get('step')!s:>6}{float(row.get('steps_per_second') or 0):>6.1f}"
                f"{float(row.get('step_ms') or 0):>6.0f}{compact_bytes(row.get('rss_bytes')):>6}"
                + (f"{compact_bytes(row.get('gpu_allocated_bytes')):>6}" if gpus else ""))
        text.append(line, style=roles.warning if slow else "")
        text.append(" <\n" if slow else "\n", style=roles.warning if slow else "")
    if ranks.slowest is not None:
        text.append(f" < slowest (r{ranks.slowest})\n", style="dim")


def _history_line(text: Text, label: str, values: list[int], width: int, window: float, roles: Roles) -> None:
    """A sparkline over the history window, right-aligned: the newest sample is always at the right edge."""
    line = sparkline(tuple(float(v) for v in _downsample(values, width + 4)), width + 4)
    text.append(f" {label:<5}", style="bold")
    text.append(line.rjust(width + 4), style=roles.ok)
    text.append(f" {_ago(window)}\n", style="dim")


def _downsample(values: list[int], points: int) -> list[int]:
    if len(values) <= points:
        return values
    stride = len(values) / points
    return [max(values[int(i * stride) : int((i + 1) * stride)] or [values[-1]]) for i in range(points)]


def _ago(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _render_gpu(
    text: Text, gpu: GpuMemory, bar_width: int, step_peak: int | None, rate: float | None, moved: set, roles: Roles
) -> None:
    text.append(f" cuda:{gpu.index} {gpu.name}\n", style="bold")
    facts = [
        f"util {gpu.utilization}%" if gpu.utilization is not None else None,
        f"{gpu.temperature} C" if gpu.temperature is not None else None,
        f"{gpu.power_watts:.0f} W" if gpu.power_watts is not None else None,
    ]
    if any(facts):
        text.append("   " + ", ".join(f for f in facts if f) + "\n", style="dim")
    width = bar_width + 4
    allocated, reserved = gpu.allocated or 0, gpu.reserved or 0
    total = gpu.device_total or gpu.limit or reserved or 1
    other = max((gpu.device_used or reserved) - reserved, 0)
    cached = max(reserved - allocated, 0)
    cells = [round(other / total * width), round(cached / total * width), round(allocated / total * width)]
    text.append("   ")
    text.append("█" * cells[0], style=roles.neutral)
    text.append("█" * cells[1], style=roles.warning)
    text.append("█" * cells[2], style=roles.ok)
    text.append("░" * max(width - sum(cells), 0))
    used = gpu.device_used if gpu.device_used is not None else reserved
    text.append(f"\n   {human_bytes(used)} of {human_bytes(gpu.device_total or gpu.limit)} used\n")
    if gpu.limit is not None and gpu.limit_source != "device" and gpu.limit != gpu.device_total:
        text.append(f"   this process may use {human_bytes(gpu.limit)} ({gpu.limit_source})\n", style="dim")
    text.append("   live   ", style=roles.ok)
    text.append(f"{human_bytes(allocated)}\n")
    text.append("   cached ", style=roles.warning)
    text.append(f"{human_bytes(cached)}\n")
    text.append("   other  ", style=roles.neutral)
    text.append(f"{human_bytes(other) if gpu.device_used is not None else 'n/a (no NVML)'}\n")
    if gpu.process_used is not None:
        text.append(f"   this process (NVML) {human_bytes(gpu.process_used)}\n", style="dim")
    peak = f"peak this step {human_bytes(step_peak)}" if step_peak is not None else f"peak live {human_bytes(gpu.peak_allocated)}"
    text.append(f"   {peak}\n", style="dim")
    if gpu.fragmentation is not None:
        style = roles.warning if gpu.fragmentation > 0.2 else "dim"
        text.append(f"   fragmentation {gpu.fragmentation:.0%} ({human_bytes(gpu.inactive_split)})\n", style=style)
    counters = []
    if rate is not None:
        counters.append((f"allocs/step {rate:.0f}", "dim"))
    for name, label in (("alloc_retries", "retries"), ("ooms", "OOMs")):
        value = getattr(gpu, name)
        if value is not None:
            counters.append((f"{label} {value}", roles.bold("error") if (gpu.index, name) in moved else "dim"))
    if counters:
        text.append("  ")
        for label, style in counters:
            text.append(f" {label}", style=style)
        text.append("\n")
