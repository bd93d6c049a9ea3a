"""Memory gauges: host process and system RAM always; per GPU when there is one.

A GPU bar is stacked: other processes and CUDA context (device used minus our
reserved) | cached but free (reserved minus allocated) | live tensors (allocated).
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from workbench.memory.device import GpuMemory
from workbench.memory.sampler import MemorySample
from workbench.telemetry import Telemetry
from workbench.tui.format import bar, human_bytes

BAR_WIDTH = 20


class MemoryGauges(Static):
    def __init__(self, telemetry: Telemetry, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._telemetry = telemetry

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(0.5, self.redraw)

    def redraw(self) -> None:
        sample = self._telemetry.memory
        self.update(render_memory(sample, self.size.width - 18) if sample else Text("sampling memory...", style="dim"))


def render_memory(sample: MemorySample, bar_width: int = BAR_WIDTH) -> Text:
    bar_width = min(max(bar_width, 6), 40)
    host = sample.host
    text = Text(overflow="fold")
    text.append("Host\n", style="bold underline")
    used = host.system_total - host.system_available
    text.append(" RSS ", style="bold")
    text.append(bar(host.rss / host.system_total if host.system_total else 0, bar_width), style="cyan")
    text.append(f" {human_bytes(host.rss)}\n")
    text.append(f"     anon {human_bytes(host.rss_anon)}, file {human_bytes(host.rss_file)}\n", style="dim")
    text.append(" RAM ", style="bold")
    text.append(bar(used / host.system_total if host.system_total else 0, bar_width), style="blue")
    text.append(f" {human_bytes(used)}\n")
    text.append(f"     of {human_bytes(host.system_total)} in use\n", style="dim")
    if host.swap_used:
        text.append(f"     swap in use {human_bytes(host.swap_used)}\n", style="yellow")
    text.append("GPU\n", style="bold underline")
    if not sample.gpus:
        text.append(f" {sample.gpu_note or 'No GPU visible.'}\n", style="dim")
    for gpu in sample.gpus:
        _render_gpu(text, gpu, bar_width)
    if sample.gpus and sample.gpu_note:
        text.append(f" {sample.gpu_note}\n", style="dim")
    text.rstrip()
    return text


def _render_gpu(text: Text, gpu: GpuMemory, bar_width: int) -> None:
    text.append(f" cuda:{gpu.index} {gpu.name}\n", style="bold")
    bar_width += 4
    allocated, reserved = gpu.allocated or 0, gpu.reserved or 0
    total = gpu.device_total or reserved or 1
    other = max((gpu.device_used or reserved) - reserved, 0)
    cached = max(reserved - allocated, 0)
    cells = [round(other / total * bar_width), round(cached / total * bar_width), round(allocated / total * bar_width)]
    text.append("   ")
    text.append("█" * cells[0], style="grey50")
    text.append("█" * cells[1], style="yellow")
    text.append("█" * cells[2], style="green")
    text.append("░" * max(bar_width - sum(cells), 0))
    used = gpu.device_used if gpu.device_used is not None else reserved
    text.append(f"\n   {human_bytes(used)} of {human_bytes(gpu.device_total)} used\n")
    text.append("   live   ", style="green")
    text.append(f"{human_bytes(allocated)}\n")
    text.append("   cached ", style="yellow")
    text.append(f"{human_bytes(cached)}\n")
    text.append("   other  ", style="grey50")
    text.append(f"{human_bytes(other) if gpu.device_used is not None else 'n/a (no NVML)'}\n")
    text.append(f"   peak live {human_bytes(gpu.peak_allocated)}\n", style="dim")
