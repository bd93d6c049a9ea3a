"""The session memory breakdown on real torch models and optimizers (CPU; CUDA figures passed in),
the saved-for-backward figure that stands in for activations on CPU, and the screen (b) that shows it."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console
from textual.app import App
from textual.widgets import Static

from workbench.protocol.eventbus import EventBus
from workbench.protocol.events import BreakdownReady
from workbench.engine.memory.breakdown import (
    ACTIVATIONS,
    BUFFERS,
    CACHE,
    GRADIENTS,
    OPTIMIZER_STATE,
    PARAMETERS,
    PART_NAMES,
    SAVED_FOR_BACKWARD,
    Breakdown,
    session_breakdown,
    session_breakdown_for_gpus,
)
from workbench.engine.memory.device import GpuMemory
from workbench.engine.saved_bytes import SavedBytes
from workbench.frontends.tui.screens.breakdown import BreakdownScreen
from workbench.units import human_bytes
from workbench.engine.versions import SAVED_MEASURE_STEPS, VersionTable


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(), torch.nn.Linear(64, 8)
    )


def train_one_step(model: torch.nn.Module, opt: torch.optim.Optimizer, inputs: int = 32) -> None:
    model.train()
    loss = model(torch.randn(16, inputs)).square().mean()
    loss.backward()
    opt.step()


def only(breakdowns: list[Breakdown]) -> Breakdown:
    assert len(breakdowns) == 1, [b.device for b in breakdowns]
    return breakdowns[0]


def advice_with(b: Breakdown, text: str) -> list[str]:
    return [line for line in b.advice if text in line]


# --------------------------------------------------------------------------- exact static parts


def test_adamw_after_one_step_counts_every_part_exactly() -> None:
    model = small_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_one_step(model, opt)

    b = only(session_breakdown({"model": model, "opt": opt}))

    params = list(model.parameters())
    param_bytes = tensor_bytes(params)
    steps = [opt.state[p]["step"] for p in params]
    assert all(s.dim() == 0 for s in steps)  # AdamW keeps one scalar `step` tensor per parameter
    step_bytes = tensor_bytes(steps)
    assert step_bytes == 4 * len(params)
    buffer_bytes = tensor_bytes(model.buffers())
    assert buffer_bytes == 64 * 4 + 64 * 4 + 8  # BatchNorm1d(64): running_mean, running_var, num_batches_tracked (int64)

    assert b.device == "cpu"
    assert [p.name for p in b.parts] == list(PART_NAMES)
    assert b.part(PARAMETERS).bytes == param_bytes
    assert b.part(GRADIENTS).bytes == param_bytes
    assert b.part(OPTIMIZER_STATE).bytes == 2 * param_bytes + step_bytes
    assert b.part(BUFFERS).bytes == buffer_bytes
    assert b.static_bytes == 4 * param_bytes + step_bytes + buffer_bytes
    assert b.frozen_parameter_bytes == 0
    assert "trainable 100%" in b.part(PARAMETERS).detail
    assert f"{sum(p.numel() for p in params):,} elements in {len(params)} tensors" in b.part(PARAMETERS).detail
    assert {"exp_avg", "exp_avg_sq", "step"} <= set(b.part(OPTIMIZER_STATE).detail.split(" (")[0].split(", "))
    [line] = advice_with(b, "optimizer state is 2.0x the parameters")
    assert "8-bit" in line and "1 byte per state element" in line


def test_sgd_momentum_is_below_the_optimizer_threshold() -> None:
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_one_step(model, opt)

    b = only(session_breakdown({"model": model, "opt": opt}))

    assert b.part(OPTIMIZER_STATE).bytes == tensor_bytes(model.parameters())
    assert b.part(OPTIMIZER_STATE).detail.startswith("momentum_buffer")
    assert not advice_with(b, "optimizer state")


def test_optimizer_before_its_first_step_and_gradients_set_to_none() -> None:
    model = small_model()
    opt = torch.optim.AdamW(model.parameters())

    b = only(session_breakdown({"model": model, "opt": opt}))

    assert b.part(OPTIMIZER_STATE).bytes == 0
    assert "no state yet" in b.part(OPTIMIZER_STATE).detail
    assert b.part(GRADIENTS).bytes == 0
    assert "hold no .grad" in b.part(GRADIENTS).detail


def test_a_bare_tensor_trained_by_the_optimizer_counts_as_a_parameter() -> None:
    scale = torch.ones(1000, requires_grad=True)
    opt = torch.optim.Adam([scale])
    (scale * 2).sum().backward()
    opt.step()

    b = only(session_breakdown({"scale": scale, "opt": opt}))

    assert b.part(PARAMETERS).bytes == 4000
    assert b.part(GRADIENTS).bytes == 4000
    assert b.part(OPTIMIZER_STATE).bytes == 8000 + 4


# --------------------------------------------------------------------------- shared storage


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.mid = torch.nn.Linear(dim, dim)
        self.lm_head = torch.nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight  # tied

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.mid(self.embed(ids)))


def test_tied_embedding_and_lm_head_are_counted_once() -> None:
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 1000, (4, 8))).logsumexp(-1).mean().backward()
    opt.step()

    b = only(session_breakdown({"model": model, "opt": opt}))

    embed, mid = 1000 * 64 * 4, (64 * 64 + 64) * 4
    assert b.part(PARAMETERS).bytes == embed + mid
    assert b.part(GRADIENTS).bytes == embed + mid
    assert b.part(OPTIMIZER_STATE).bytes == 2 * (embed + mid) + 3 * 4


def test_distinct_parameters_viewing_one_storage_are_counted_once() -> None:
    """`Parameter(embed.weight.data)` is a new tensor object on the same memory, as some tying code does."""
    embed = torch.nn.Embedding(500, 32)
    head = torch.nn.Linear(32, 500, bias=False)
    head.weight = torch.nn.Parameter(embed.weight.data)
    assert head.weight is not embed.weight

    b = only(session_breakdown({"embed": embed, "head": head}))

    assert b.part(PARAMETERS).bytes == 500 * 32 * 4
    assert "1 share storage with another tensor, counted once" in b.part(PARAMETERS).detail


def test_a_parameter_viewing_part_of_a_larger_tensor_costs_the_whole_storage() -> None:
    """The documented choice: the whole storage stays alive, so the whole storage is counted."""
    flat = torch.zeros(10_000)
    layer = torch.nn.Linear(10, 10, bias=False)
    layer.weight = torch.nn.Parameter(flat[:100].view(10, 10))

    b = only(session_breakdown(layer))

    assert b.part(PARAMETERS).bytes == 10_000 * 4


# --------------------------------------------------------------------------- frozen parameters


def test_frozen_parameters_need_no_gradients_or_optimizer_state() -> None:
    torch.manual_seed(0)
    backbone = torch.nn.Linear(128, 128)
    head = torch.nn.Linear(128, 4)
    for p in backbone.parameters():
        p.requires_grad_(False)
    model = torch.nn.Sequential(backbone, torch.nn.ReLU(), head)
    opt = torch.optim.AdamW(head.parameters())
    train_one_step(model, opt, inputs=128)

    b = only(session_breakdown({"model": model, "opt": opt}))

    frozen, trainable = tensor_bytes(backbone.parameters()), tensor_bytes(head.parameters())
    assert all(p.grad is None for p in backbone.parameters())
    assert b.frozen_parameter_bytes == frozen
    assert b.part(PARAMETERS).bytes == frozen + trainable
    assert b.part(GRADIENTS).bytes == trainable
    assert b.part(OPTIMIZER_STATE).bytes == 2 * trainable + 2 * 4
    share = round(100 * frozen / (frozen + trainable))
    [line] = advice_with(b, f"{share}% of parameters are frozen")
    assert "they need no gradients or optimizer state" in line
    assert "bf16" in line  # they are fp32
    assert not advice_with(b, "still hold")
    # ratio is against trainable parameters only
    assert advice_with(b, "optimizer state is 2.0x the parameters")


def test_gradients_left_on_frozen_parameters_are_called_out() -> None:
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train_one_step(model, opt)
    first = model[0]
    for p in first.parameters():
        p.requires_grad_(False)  # frozen after backward: the old .grad stays

    b = only(session_breakdown({"model": model, "opt": opt}))

    held = tensor_bytes(first.parameters())
    assert b.frozen_parameter_bytes == held
    assert "belongs to frozen parameters" in b.part(GRADIENTS).detail
    [line] = advice_with(b, "frozen parameters still hold")
    assert "set their .grad to None" in line


def test_a_small_frozen_share_gets_no_frozen_advice() -> None:
    model = small_model()
    model[1].weight.requires_grad_(False)

    b = only(session_breakdown(model))

    assert b.frozen_parameter_bytes == 64 * 4
    assert not advice_with(b, "frozen")


# --------------------------------------------------------------------------- activations


def trained_state() -> dict[str, object]:
    model = small_model()
    opt = torch.optim.AdamW(model.parameters())
    train_one_step(model, opt)
    return {"model": model, "opt": opt}


def test_activations_are_the_step_peak_minus_static_bytes() -> None:
    """No GPU here, so the peak is given for the device that holds the model: the arithmetic is the same."""
    state = trained_state()
    static = only(session_breakdown(state)).static_bytes

    b = only(session_breakdown(state, step_peak_allocated={"cpu": static + 5_000}))
    assert b.part(ACTIVATIONS).bytes == 5_000
    assert "minus static" in b.part(ACTIVATIONS).detail
    assert not advice_with(b, "activation checkpointing")

    b = only(session_breakdown(state, step_peak_allocated={"cpu": 5 * static}))
    assert b.part(ACTIVATIONS).bytes == 4 * static
    [line] = advice_with(b, "activation checkpointing")
    assert "use_reentrant=False" in line

    b = only(session_breakdown(state, step_peak_allocated={"cpu": static // 2}))
    assert b.part(ACTIVATIONS).bytes == 0
    assert "clamped at 0" in b.part(ACTIVATIONS).detail


def test_a_bare_int_peak_goes_to_the_cuda_device() -> None:
    """With no CUDA tensors in the state, an int figure lands on cuda:0, next to the cpu Breakdown."""
    state = trained_state()

    cuda, cpu = session_breakdown(state, step_peak_allocated=12_345)

    assert (cuda.device, cpu.device) == ("cuda:0", "cpu")
    assert cuda.static_bytes == 0
    assert cuda.part(ACTIVATIONS).bytes == 12_345
    assert cpu.part(ACTIVATIONS).bytes is None


def test_gradients_freed_before_the_peak_is_read_are_mentioned() -> None:
    state = trained_state()
    state["opt"].zero_grad(set_to_none=True)

    b = only(session_breakdown(state, step_peak_allocated={"cpu": 10 << 20}))

    assert b.part(GRADIENTS).bytes == 0
    assert "includes the gradients made in backward" in b.part(ACTIVATIONS).detail


def test_activations_on_cpu_before_any_measured_step_say_nothing_was_measured_and_when_it_will_be() -> None:
    b = only(session_breakdown(small_model()))

    part = b.part(ACTIVATIONS)
    assert part.bytes is None
    assert part.label == ""
    assert part.detail.startswith("not measured yet: the bytes autograd saves for backward")
    assert f"measured on the first {SAVED_MEASURE_STEPS} steps of each code version" in part.detail
    assert "CPU run has no allocator peak" in part.detail
    assert b.saved_for_backward is None


# --------------------------------------------------------------------------- saved for backward (any device)


def measured_step(state: dict[str, object], inputs: torch.Tensor) -> int:
    """One training step inside SavedBytes, as the worker runs the first steps of each code version."""
    model, opt = state["model"], state["opt"]
    with SavedBytes(state) as saved:
        model(inputs).square().mean().backward()
    opt.step()
    return saved.bytes


def mlp_state() -> dict[str, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}


def test_a_saved_for_backward_figure_fills_activations_on_cpu_labelled_for_what_it_is() -> None:
    state = trained_state()

    b = only(session_breakdown(state, saved_for_backward=300_000))

    part = b.part(ACTIVATIONS)
    assert [p.name for p in b.parts] == list(PART_NAMES)  # same slot, so callers keep finding it
    assert part.bytes == 300_000
    assert part.label == SAVED_FOR_BACKWARD == "saved for backward (last measured step)"
    assert "tensors kept for the backward pass" in part.detail
    assert "Not an allocator peak" in part.detail
    assert "not measured" not in part.detail
    assert b.saved_for_backward == 300_000
    assert b.static_bytes == only(session_breakdown(state)).static_bytes  # not counted as static memory

    d = b.to_dict()
    assert d["saved_for_backward"] == 300_000
    [activations] = [p for p in d["parts"] if p["name"] == ACTIVATIONS]
    assert activations == {"name": ACTIVATIONS, "bytes": 300_000, "detail": part.detail, "label": SAVED_FOR_BACKWARD}


def test_saved_for_backward_above_the_static_bytes_gets_checkpointing_advice() -> None:
    state = trained_state()
    static = only(session_breakdown(state)).static_bytes

    assert not advice_with(only(session_breakdown(state, saved_for_backward=static)), "checkpointing")
    b = only(session_breakdown(state, saved_for_backward=3 * static))

    [line] = advice_with(b, "activation checkpointing")
    assert line.startswith(f"activations saved for backward ({human_bytes(3 * static)}) outweigh")


def test_with_a_step_peak_activations_stay_the_peak_and_the_saved_figure_is_quoted_beside_it() -> None:
    state = trained_state()
    static = only(session_breakdown(state)).static_bytes

    b = only(session_breakdown(state, step_peak_allocated={"cpu": static + 5_000}, saved_for_backward=3_000))

    part = b.part(ACTIVATIONS)
    assert part.bytes == 5_000
    assert part.label == ""
    assert part.detail.startswith("step peak")
    assert f"autograd saved {human_bytes(3_000)} for backward in the last measured step" in part.detail
    assert b.saved_for_backward == 3_000


def test_the_saved_figure_goes_to_the_device_holding_the_parameters() -> None:
    """A figures-only cuda:0 sorts first, but the cpu model is where the step's activations live."""
    cuda, cpu = session_breakdown(trained_state(), step_peak_allocated=12_345, saved_for_backward=4_000)

    assert (cuda.device, cpu.device) == ("cuda:0", "cpu")
    assert (cuda.saved_for_backward, cpu.saved_for_backward) == (None, 4_000)
    assert "saved" not in cuda.part(ACTIVATIONS).detail
    assert cpu.part(ACTIVATIONS).bytes == 4_000
    assert cpu.part(ACTIVATIONS).label == SAVED_FOR_BACKWARD


def test_the_saved_figure_passes_through_the_gpu_entry_point() -> None:
    gpus = [GpuMemory(index=0, name="A", allocated=600, reserved=1000)]

    [cuda] = session_breakdown_for_gpus({}, gpus, step_peak_allocated={0: 900}, saved_for_backward=700)

    assert cuda.saved_for_backward == 700
    assert cuda.part(ACTIVATIONS).bytes == 900
    assert f"autograd saved {human_bytes(700)} for backward" in cuda.part(ACTIVATIONS).detail

    [cuda] = session_breakdown_for_gpus({}, gpus)
    assert "no bytes saved for backward measured yet either" in cuda.part(ACTIVATIONS).detail


def test_latest_saved_bytes_is_the_current_versions_last_measured_step() -> None:
    table = VersionTable()
    assert table.latest_saved_bytes() is None
    table.record_saved(100)
    table.record_saved(300)
    table.record_saved(200)
    assert table.latest_saved_bytes() == 200  # the latest step, not the table's max

    table.start(1, ("train.py",), step=3)
    assert table.latest_saved_bytes() is None  # a new code version: its own steps are measured anew
    assert table.rows()[0]["saved_bytes_per_step"] == 300


async def test_a_real_measured_step_shows_in_the_breakdown_as_the_worker_would_feed_it() -> None:
    """SavedBytes around a real forward/backward, recorded in the versions table, read back, broken down."""
    state = mlp_state()
    inputs = torch.randn(16, 32)
    table = VersionTable()
    while table.wants_saved_measurement():
        table.record_saved(measured_step(state, inputs))

    figure = table.latest_saved_bytes()
    b = only(session_breakdown(state, saved_for_backward=figure))

    # Linear(32, 64) keeps its input (16x32), ReLU its output (16x64, also Linear(64, 8)'s input, counted once),
    # square its input (16x8); the weights (and their transposed views) are parameters and not counted.
    assert figure == (16 * 32 + 16 * 64 + 16 * 8) * 4 == 6656
    assert b.part(ACTIVATIONS).bytes == figure
    assert b.part(ACTIVATIONS).label == SAVED_FOR_BACKWARD
    rows = await render_breakdown_screen(BreakdownReady(step=3, devices=tuple(d.to_dict() for d in [b])))
    [line] = [r for r in rows if r.lstrip().startswith(SAVED_FOR_BACKWARD)]
    assert human_bytes(figure) == "6.50 KiB"
    assert line.split(SAVED_FOR_BACKWARD)[1].split()[:2] == ["6.50", "KiB"]


# --------------------------------------------------------------------------- the breakdown screen (b)


class _FakeSession:
    """What BreakdownScreen needs of a Session: a bus, and a send() answered with a ready breakdown."""

    def __init__(self, answer: BreakdownReady) -> None:
        self.bus = EventBus()
        self._answer = answer

    def send(self, command: object) -> None:
        self.bus.publish(self._answer)


async def render_breakdown_screen(event: BreakdownReady) -> list[str]:
    """The breakdown screen's text for `event`, as the user would read it (wide enough not to wrap)."""
    app = App()
    async with app.run_test(size=(200, 40)) as pilot:
        screen = BreakdownScreen(_FakeSession(event))  # type: ignore[arg-type] - a duck-typed Session
        await app.push_screen(screen)
        for _ in range(100):
            await pilot.pause(0.05)
            text = report_text(screen)
            if "at step" in text:
                return text.splitlines()
        raise AssertionError(f"the breakdown never arrived: {report_text(screen)!r}")


def report_text(screen: BreakdownScreen) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(screen.query_one("#report", Static).content)
    return console.export_text()


async def test_the_screen_shows_the_saved_figure_under_its_own_label_instead_of_n_a() -> None:
    state = trained_state()
    measured = only(session_breakdown(state, saved_for_backward=3 << 20))
    unmeasured = only(session_breakdown(state))

    rows = await render_breakdown_screen(BreakdownReady(step=7, devices=(measured.to_dict(),)))
    [line] = [r for r in rows if SAVED_FOR_BACKWARD in r]
    assert line.split(SAVED_FOR_BACKWARD)[1].split()[:2] == ["3.00", "MiB"]
    assert "tensors kept for the backward pass" in line
    [activations_row] = [r for r in rows if r.lstrip().startswith(("activations", SAVED_FOR_BACKWARD))]
    assert "n/a" not in activations_row

    rows = await render_breakdown_screen(BreakdownReady(step=7, devices=(unmeasured.to_dict(),)))
    assert not [r for r in rows if SAVED_FOR_BACKWARD in r]
    [line] = [r for r in rows if r.lstrip().startswith("activations")]
    assert line.split()[1] == "n/a"
    assert "not measured yet" in line


# --------------------------------------------------------------------------- cache / fragmentation


@pytest.mark.parametrize(
    ("allocated", "advised"),
    [(800, False), (799, True), (1000, False), (100, True)],
)
def test_cache_part_and_cleanup_advice_above_a_fifth_of_reserved(allocated: int, advised: bool) -> None:
    mib = 1 << 20
    b = only(
        session_breakdown(
            {}, reserved=1000 * mib, allocated=allocated * mib, inactive_split_bytes=40 * mib
        )
    )

    part = b.part(CACHE)
    assert b.device == "cuda:0"
    assert part.bytes == (1000 - allocated) * mib
    assert "40.00 MiB of it is in split blocks that empty_cache cannot return" in part.detail
    assert bool(advice_with(b, "call cleanup (c)")) is advised


def test_cache_advice_names_fragmentation_cleanup_cannot_return() -> None:
    b = only(session_breakdown({}, reserved=1 << 30, allocated=1 << 29, inactive_split_bytes=400 << 20))

    [line] = advice_with(b, "call cleanup (c)")
    assert "expandable_segments" in line


def test_cache_without_allocator_figures_is_unknown() -> None:
    b = only(session_breakdown(small_model()))

    assert b.part(CACHE).bytes is None
    assert b.part(CACHE).detail


def test_figures_from_the_device_probe() -> None:
    gpus = [
        GpuMemory(index=0, name="A", allocated=600, reserved=1000, inactive_split=50),
        GpuMemory(index=1, name="B", allocated=100, reserved=100),
    ]

    out = session_breakdown_for_gpus({}, gpus, step_peak_allocated={1: 90})

    assert [b.device for b in out] == ["cuda:0", "cuda:1"]
    assert out[0].part(CACHE).bytes == 400
    assert out[0].part(ACTIVATIONS).bytes is None
    assert out[1].part(CACHE).bytes == 0
    assert out[1].part(ACTIVATIONS).bytes == 90


# --------------------------------------------------------------------------- fp32 advice


def test_large_fp32_parameters_get_bf16_advice() -> None:
    """A 1 GiB parameter from torch.empty: the pages are never touched, so it costs no real memory."""
    big = torch.nn.Parameter(torch.empty((1 << 28) + 1024))
    opt = torch.optim.SGD([big], lr=0.1)

    b = only(session_breakdown({"opt": opt}))

    assert b.part(PARAMETERS).bytes == (1 << 30) + 4096
    [line] = advice_with(b, "are fp32")
    assert "bf16 weights would save 512.00 MiB" in line
    assert not advice_with(only(session_breakdown(small_model())), "are fp32")


# --------------------------------------------------------------------------- state shapes


class Holder:
    def __init__(self, **kw: object) -> None:
        self.__dict__.update(kw)


@pytest.mark.parametrize(
    "wrap",
    [
        lambda m, o: {"model": m, "opt": o},
        lambda m, o: {"train": {"parts": [m, {"optim": o}]}},
        lambda m, o: [m, (o,)],
        lambda m, o: Holder(net=m, opt=o, steps=0),
        lambda m, o: SimpleNamespace(inner=Holder(pair=(m, o))),
    ],
    ids=["dict", "nested-dict-list", "list-tuple", "attributes", "nested-attributes"],
)
def test_model_and_optimizer_are_found_in_any_state_shape(wrap) -> None:
    model = small_model()
    opt = torch.optim.AdamW(model.parameters())
    train_one_step(model, opt)
    expected = only(session_breakdown({"model": model, "opt": opt}))

    b = only(session_breakdown(wrap(model, opt)))

    assert b.parts == expected.parts
    assert b.part(OPTIMIZER_STATE).bytes > 0


def test_a_state_without_tensors_gives_no_breakdown() -> None:
    assert session_breakdown({"lr": 0.1, "data": [1, 2, 3]}) == []
    assert session_breakdown(None) == []


def test_meta_tensors_hold_no_memory() -> None:
    with torch.device("meta"):
        model = torch.nn.Linear(4096, 4096)

    assert session_breakdown(model) == []
