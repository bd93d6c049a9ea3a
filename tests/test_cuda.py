"""Checks that need a real NVIDIA GPU: `python -m pytest -m cuda` on a machine with CUDA.

The default run deselects them (pyproject: -m 'not cuda'); without a GPU they skip.
"""

from __future__ import annotations

import pytest
import torch

from workbench.engine.actions.cleanup import run_cleanup
from workbench.engine.memory.device import TorchNvmlProbe

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_probe_reads_allocator_and_nvml_for_every_visible_gpu():
    probe = TorchNvmlProbe()
    assert probe.available()
    gpus = probe.gpus()
    assert len(gpus) == torch.cuda.device_count()
    before = gpus[0].allocated
    block = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda:0")
    after = probe.gpus()[0]
    assert after.allocated >= before + block.numel()
    assert after.device_total and after.device_used and after.device_used >= after.reserved
    assert probe.unavailable_reason() is None, probe.unavailable_reason()


def test_cleanup_returns_cached_blocks_to_the_driver():
    probe = TorchNvmlProbe()
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda:0")
    del block  # now cached by torch's allocator, not free on the device
    event = run_cleanup(probe)
    assert event.freed_bytes >= 256 * 2**20
    assert event.after["cuda:0.reserved"] < event.before["cuda:0.reserved"]


def test_memory_snapshot_writes_a_protocol_4_pickle_with_a_summary(tmp_path):
    import pickle

    from workbench.engine.actions.memory_snapshot import dump_snapshot, start_recording

    start_recording(max_entries=10_000)
    try:
        keep = torch.empty(32 * 2**20, dtype=torch.uint8, device="cuda:0")
        event = dump_snapshot(tmp_path, cuda_available=True, recording=True)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    data = open(event.path, "rb").read()
    assert data[:2] == b"\x80\x04", "memory_viz reads pickle protocol 4"
    snapshot = pickle.loads(data)
    assert snapshot["segments"] and event.bytes == len(data)
    assert any("allocation" in line for line in event.summary)
    del keep


def test_breakdown_activations_come_from_the_step_peak_on_cuda():
    from workbench.engine.memory.breakdown import session_breakdown_for_gpus

    model = torch.nn.Linear(1024, 1024).cuda()
    opt = torch.optim.AdamW(model.parameters())
    torch.cuda.reset_peak_memory_stats()
    loss = model(torch.randn(4096, 1024, device="cuda")).pow(2).mean()
    loss.backward()
    opt.step()
    peak = torch.cuda.max_memory_allocated()
    assert TorchNvmlProbe().peak_allocated(0) == peak  # the step path's cheaper read of the same figure
    breakdowns = session_breakdown_for_gpus({"model": model, "opt": opt}, TorchNvmlProbe().gpus(), {0: peak})
    cuda = next(b for b in breakdowns if b.device.startswith("cuda"))
    activations = next(p for p in cuda.parts if p.name == "activations")
    assert activations.bytes is not None and activations.bytes > 0


def test_resume_on_cuda_skips_init_copies_once_and_keeps_ties_and_the_optimizer(tmp_path):
    from workbench.engine.actions.snapshot import apply_snapshot, load_snapshot, write_snapshot
    from workbench.engine.init_skipping import skipping_init

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model = torch.nn.Sequential(torch.nn.Embedding(100, 64), torch.nn.Linear(64, 100, bias=False)).cuda()
        model[1].weight = model[0].weight
        return model, torch.optim.AdamW(model.parameters())

    model, opt = build()
    model(torch.randint(0, 100, (8,), device="cuda")).sum().backward()
    opt.step()
    write_snapshot({"model": model, "opt": opt}, 1, 0, tmp_path)
    path = next((tmp_path / "snapshots").glob("step-*.pt"))
    with skipping_init() as log:
        fresh, fresh_opt = build()
    report = apply_snapshot({"model": fresh, "opt": fresh_opt}, load_snapshot(path), path, init_log=log)
    assert report.clean and report.initialized == [] and report.mapped == 0  # GPU: copied into setup()'s tensors
    assert fresh[0].weight.is_cuda and fresh[1].weight is fresh[0].weight
    assert torch.equal(fresh[0].weight, model[0].weight)
    assert fresh_opt.state[fresh[0].weight]["exp_avg"].is_cuda


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_session_on_the_second_gpu_trains_with_it_as_the_training_threads_current_device(start_session):
    """CUDA's current device is per thread: without workbench/engine/thread_device.py, `x.cuda()` in the step of a
    session on cuda:1 (or of rank 1 under torchrun) landed on GPU 0."""
    source = (
        "import torch\n\n\ndef setup(bench):\n    return {}\n\n\n"
        "def step(state, bench):\n"
        "    assert torch.cuda.current_device() == 1, torch.cuda.current_device()\n"
        "    return float(torch.ones(4).cuda().sum())\n"
    )
    live = start_session({"train.py": source}, device=torch.device("cuda", 1))
    steps = live.wait_running(steps=3)
    assert [e.loss for e in steps] == [4.0, 4.0, 4.0]


def test_a_skipping_setup_draws_on_the_gpu_as_a_plain_ones_does():
    """The owed draws (init_skipping.py) on CUDA: a model made on the GPU owes the GPU's generator, one made on the
    CPU and moved owes the CPU's, and a CUDA seed settles only what the GPU owes."""
    from workbench.engine.init_skipping import skipping_init

    def build() -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor, torch.Tensor]:
        with torch.device("cuda"):
            on_gpu = torch.nn.Linear(64, 64)
        moved = torch.nn.Linear(64, 64).cuda().half()
        return on_gpu, moved, torch.randn(8, device="cuda"), torch.randn(8)

    torch.manual_seed(0)
    plain = build()
    torch.manual_seed(0)
    with skipping_init() as log:
        skipping = build()
    assert torch.equal(plain[2], skipping[2]) and torch.equal(plain[3], skipping[3]) and not log.unseen_draw
    log.replay_all()
    for a, b in zip(plain[:2], skipping[:2]):
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    with skipping_init() as seeded:
        torch.nn.Linear(4, 4)  # the CPU's generator
        torch.cuda.manual_seed_all(3)
    assert seeded.settled == []


EMA_ON_THE_GPU = """\
import torch

WIDTH = 1 << 15  # two 1 MiB layers: kept as tensors in the snapshot, loaded onto the CPU


class EMA:
    def __init__(self, model, decay=0.9):
        self.decay = decay
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters()}

    @torch.no_grad()
    def update(self, model):
        for n, p in model.named_parameters():
            self.shadow[n].mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)

    def state_dict(self):
        return {"decay": self.decay, "shadow": self.shadow}

    def load_state_dict(self, state):
        self.decay = state["decay"]
        self.shadow = state["shadow"]  # keeps what it is given: on the CPU, the next update would fail


def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 8)).to(bench.device)
    return {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-3), "ema": EMA(model)}


def step(state, bench):
    x = torch.randn(4, 8, device=bench.device)  # the GPU's generator
    out = torch.nn.functional.dropout(state["model"](x), 0.25)  # and again
    loss = (out - x).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    state["ema"].update(state["model"])
    shadow = state["ema"].shadow
    return {"loss": loss, "a": float(shadow["0.weight"].sum()), "b": float(shadow["2.bias"][0])}
"""


def test_a_resume_on_the_gpu_gives_an_ema_its_tensors_on_the_gpu_and_the_gpus_random_state_back(tmp_path):
    """Straight against snapshot-and-resume on cuda: the EMA's shadow weights (loaded onto the CPU from the snapshot)
    are handed over on the GPU, and the draws after the snapshot are the GPU generator's as they were."""
    straight_then_resumed_agree(tmp_path, torch.device("cuda"))


def straight_then_resumed_agree(tmp_path, gpu: torch.device) -> None:
    from tests.conftest import is_event, make_project, open_session, snapshot_after

    straight = straight_ema_run(tmp_path, gpu)
    snapshot = snapshot_after(tmp_path, EMA_ON_THE_GPU, 6, device=gpu)
    root = make_project(tmp_path, {"train.py": EMA_ON_THE_GPU}, folder="second")
    with open_session(root / "train.py", resume=snapshot, max_steps=10, exit_at_max_steps=False, device=gpu) as live:
        resumed = live.wait_for(is_event("resume"), timeout=120)
        ran_to_the_end(live)  # an EMA left on the CPU fails its first update on a device mismatch
        after = ema_values(live)
    assert any(note.startswith("ema (EMA") for note in resumed.notes), resumed.notes
    assert after == {k: straight[k] for k in (7, 8, 9, 10)}, (after, straight)


def straight_ema_run(tmp_path, device: torch.device) -> dict[int, tuple[float, float, float]]:
    """The EMA project's 10 steps, straight: what a snapshot-and-resume or a rebuild must give again."""
    from tests.conftest import make_project, open_session

    root = make_project(tmp_path, {"train.py": EMA_ON_THE_GPU}, folder="straight")
    with open_session(root / "train.py", max_steps=10, exit_at_max_steps=False, device=device) as live:
        ran_to_the_end(live)
        straight = ema_values(live)
    assert len(straight) == 10, straight
    return straight


def ema_values(live) -> dict[int, tuple[float, float, float]]:
    """Each step's loss and two of its EMA's values."""
    return {e.step: (e.loss, e.scalars["a"], e.scalars["b"]) for e in live.events.of("step")}


def ran_to_the_end(live) -> None:
    """Paused at max steps, not for a failed step (whose error is shown)."""
    from tests.conftest import is_event

    paused = live.wait_for(is_event("paused"), timeout=120)
    errors = [e.message for e in live.events.of("error")]
    assert paused.reason == "max steps", (paused.reason, errors)


class _InitThroughDataAndInPlace(torch.nn.Module):
    """Both initializers init skipping defers beyond torch.nn.init: a fill through `.data`, and timm's trunc_normal_
    (a random fill, then `erfinv_`, whose values on a GPU are not the CPU's)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(64, 32)
        self.proj = torch.nn.Linear(32, 32)
        self.embedding.weight.data.normal_(mean=0.0, std=0.02)
        with torch.no_grad():
            weight = self.proj.weight
            weight.uniform_(-0.9, 0.9)
            weight.erfinv_()
            weight.mul_(0.02)
            weight.clamp_(min=-0.04, max=0.04)


def test_deferred_initialization_replays_where_a_plain_build_ran_it_after_a_move_to_the_gpu():
    """Made on the CPU then moved, the plain build ran `erfinv_` on the CPU; made under `torch.device("cuda")`, on the
    GPU. The replay gives both the plain build's values bit for bit."""
    from workbench.engine.init_skipping import skipping_init

    def build() -> tuple[torch.nn.Module, torch.nn.Module]:
        moved = _InitThroughDataAndInPlace().cuda()
        with torch.device("cuda"):
            made_there = _InitThroughDataAndInPlace()
        return moved, made_there

    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    plain = build()
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    with skipping_init() as log:
        skipping = build()
    assert log.settled == [] and len(log.parameters) == 6, "nothing ran while both models were built and moved"
    log.replay_all()
    for a, b in zip(plain, skipping):
        for name, value in a.state_dict().items():
            assert value.is_cuda and torch.equal(value, b.state_dict()[name]), name


def test_a_rebuild_with_no_change_on_the_gpu_trains_on_as_the_run_that_never_stopped(tmp_path):
    """The rebuild's setup() draws from the random states the first one began with, the GPU's too, and training then
    draws on from where it was (dropout on the GPU): with the EMA carried, every later step is the straight run's."""
    straight_then_rebuilt_agree(tmp_path, torch.device("cuda"))


def straight_then_rebuilt_agree(tmp_path, gpu: torch.device) -> None:
    from tests.conftest import is_event, make_project, open_session
    from workbench.protocol.events import Rebuild, Resume

    straight = straight_ema_run(tmp_path, gpu)
    root = make_project(tmp_path, {"train.py": EMA_ON_THE_GPU}, folder="rebuilt")
    with open_session(root / "train.py", max_steps=6, exit_at_max_steps=False, device=gpu) as live:
        ran_to_the_end(live)
        live.send(Rebuild())
        rebuilt = live.wait_for(is_event("rebuild"), timeout=120)
        live.session.worker.max_steps = 10
        live.send(Resume())
        ran_to_the_end(live)
        after = ema_values(live)
    assert rebuilt.ok and "ema: load_state_dict() given what the old one's state_dict() held" in rebuilt.notes, rebuilt
    later = (7, 8, 9, 10)
    assert {k: after.get(k) for k in later} == {k: straight[k] for k in later}, (after, straight)
