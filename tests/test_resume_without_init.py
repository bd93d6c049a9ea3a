"""--resume runs setup() without initializing what the snapshot fills, then maps the snapshot in without a copy."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from tests.conftest import is_event, make_project, open_session
from workbench.engine.actions.snapshot import apply_snapshot, load_snapshot, write_snapshot
from workbench.engine.init_skipping import skipping_init

MODEL = """\
import torch

WIDE = 8


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, WIDE)
        self.body = torch.nn.Linear(WIDE, WIDE)
        self.head = torch.nn.Linear(WIDE, 10, bias=False)
        self.head.weight = self.emb.weight  # tied
        EXTRA

    def forward(self, x):
        return self.head(torch.relu(self.body(self.emb(x))))


def setup(bench):
    torch.manual_seed(0)
    model = Net()
    return {"model": model, "opt": OPTIMIZER}


def step(state, bench):
    x = torch.randint(0, 10, (16,))
    loss = torch.nn.functional.cross_entropy(state["model"](x), x)
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return loss
"""


def project_source(extra: str = "", optimizer: str = "torch.optim.AdamW(model.parameters(), lr=0.01)") -> str:
    return MODEL.replace("EXTRA", extra or "pass").replace("OPTIMIZER", optimizer)


class InitCounter:
    """Counts the initializations that really run (on parameters): what a resume should not do."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, ...]] = []
        me = threading.get_ident()
        for name in ("kaiming_uniform_", "uniform_", "normal_"):
            original = getattr(torch.nn.init, name)

            def counted(tensor, *args, _original=original, **kwargs):  # type: ignore[no-untyped-def]
                if isinstance(tensor, torch.nn.Parameter) and threading.get_ident() != me:
                    self.calls.append(tuple(tensor.shape))
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.nn.init, name, counted)


def trained_snapshot(tmp_path: Path, source: str, steps: int = 5) -> tuple[Path, dict[str, torch.Tensor]]:
    root = make_project(tmp_path, {"train.py": source}, folder="first")
    with open_session(root / "train.py", max_steps=steps, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        from workbench.protocol.events import TakeSnapshot

        live.send(TakeSnapshot())
        snap = live.wait_for(is_event("snapshot"), timeout=20)
        weights = {k: v.detach().clone() for k, v in live.session.worker.user_state["model"].state_dict().items()}
    return Path(snap.path), weights


def test_resume_runs_no_initialization_and_maps_the_weights_without_a_copy(tmp_path, monkeypatch) -> None:
    path, trained = trained_snapshot(tmp_path, project_source())
    counter = InitCounter(monkeypatch)
    root = make_project(tmp_path, {"train.py": project_source()}, folder="second")
    with open_session(root / "train.py", resume=path, start_paused=True) as live:
        loaded = live.wait_for(is_event("resume"), timeout=30)
        assert loaded.ok and loaded.initialized == () and loaded.mapped == loaded.tensors == 3, loaded
        assert counter.calls == [], f"setup() initialized parameters the snapshot fills: {counter.calls}"
        model = live.session.worker.user_state["model"]
        for key, value in model.state_dict().items():
            assert torch.equal(value, trained[key]), key
        assert model.head.weight is model.emb.weight, "tied weights stay one tensor"
        opt = live.session.worker.user_state["opt"]
        assert all(p in opt.state for p in model.parameters()), "the optimizer points at the live parameters"
        live.session.worker.max_steps = 2
        from workbench.protocol.events import Resume

        live.send(Resume())
        live.events.steps(1)
        assert model.head.weight.data_ptr() == model.emb.weight.data_ptr()
    before = path.read_bytes()
    assert load_snapshot(path)["step"] == 5 and path.read_bytes() == before, "training wrote into the snapshot file"


def test_a_partial_resume_initializes_what_the_snapshot_lacks_and_says_which(tmp_path, monkeypatch) -> None:
    path, trained = trained_snapshot(tmp_path, project_source())
    counter = InitCounter(monkeypatch)
    grown = project_source(extra="self.extra = torch.nn.Linear(WIDE, WIDE)")
    root = make_project(tmp_path, {"train.py": grown}, folder="second")
    with open_session(root / "train.py", resume=path, resume_partial=True, start_paused=True) as live:
        loaded = live.wait_for(is_event("resume"), timeout=30)
        assert loaded.ok and sorted(loaded.initialized) == ["model.extra.bias", "model.extra.weight"], loaded
        assert any("initialized as setup() does: model.extra" in n for n in loaded.notes)
        assert sorted(counter.calls) == [(8,), (8, 8)], "only the new layer is initialized"
        model = live.session.worker.user_state["model"]
        assert torch.equal(model.body.weight, trained["body.weight"])
        bound = 1 / 8**0.5
        assert 0 < model.extra.weight.abs().max() <= bound, "the new layer holds nn.Linear's own initialization"


def test_a_refused_resume_initializes_everything_as_setup_would(tmp_path, monkeypatch) -> None:
    path, trained = trained_snapshot(tmp_path, project_source())
    counter = InitCounter(monkeypatch)
    other = project_source().replace("WIDE = 8", "WIDE = 16")
    root = make_project(tmp_path, {"train.py": other}, folder="second")
    with open_session(root / "train.py", resume=path) as live:
        refused = live.wait_for(is_event("resume"), timeout=30)
        assert not refused.ok and "nothing was loaded" in refused.error and "initialized as usual" in refused.error
        live.wait_for(is_event("paused", reason="resume failed"), timeout=10)
        model = live.session.worker.user_state["model"]
        # embedding normal_, body kaiming + bias; the head weight setup() replaced by the tied one is never initialized
        assert sorted(counter.calls) == [(10, 16), (16,), (16, 16)], counter.calls
        bound = 1 / 16**0.5
        assert 0 < model.body.weight.abs().max() <= bound and model.body.weight.isfinite().all()


def test_skipping_is_only_for_the_calling_threads_parameters() -> None:
    data = torch.full((4,), 7.0)
    with skipping_init() as log:
        layer = torch.nn.Linear(3, 3)
        torch.nn.init.zeros_(data)  # a plain tensor: data, not a parameter; always initialized
        other: list[torch.nn.Linear] = []
        worker = threading.Thread(target=lambda: other.append(torch.nn.Linear(3, 3)))
        worker.start()
        worker.join()
    assert torch.equal(data, torch.zeros(4))
    assert [tuple(p.shape) for p in log.parameters] == [(3, 3), (3,)]
    assert other[0].weight.abs().max() > 0 and other[0].weight.abs().max() <= 1 / 3**0.5
    assert torch.nn.init.kaiming_uniform_.__name__ == "kaiming_uniform_" and not hasattr(
        torch.nn.init.kaiming_uniform_, "__vram_bench_skipping__"
    ), "the initializers are put back"
    replayed = log.replay([layer.bias])
    assert replayed == [layer.weight] and 0 < layer.weight.abs().max() <= 1 / 3**0.5


def test_another_optimizer_class_is_refused_before_anything_is_loaded(tmp_path) -> None:
    model = torch.nn.Linear(4, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(3, 4)).sum().backward()
    sgd.step()
    write_snapshot({"model": model, "opt": sgd}, 7, 0, tmp_path)
    path = next((tmp_path / "snapshots").glob("step-*.pt"))
    payload = load_snapshot(path)

    fresh = torch.nn.Linear(4, 2)
    before = fresh.weight.detach().clone()
    adam = torch.optim.AdamW(fresh.parameters())
    from workbench.engine.actions.snapshot import ResumeMismatch

    with pytest.raises(ResumeMismatch) as refused:
        apply_snapshot({"model": fresh, "opt": adam}, payload, path)
    assert "holds the state of a SGD, setup() made a AdamW" in str(refused.value)
    assert torch.equal(fresh.weight, before) and not adam.state, "something was loaded before the refusal"

    # A snapshot from before the class was recorded: AdamW state into SGD(momentum) lacks `momentum`.
    adam_model = torch.nn.Linear(4, 2)
    adam = torch.optim.AdamW(adam_model.parameters())
    adam_model(torch.randn(3, 4)).sum().backward()
    adam.step()
    old_style = {"format": payload["format"], "step": 3, "modules": {"model": adam_model.state_dict()},
                 "optimizers": {"opt": adam.state_dict()}}
    target = torch.nn.Linear(4, 2)
    before = target.weight.detach().clone()
    with pytest.raises(ResumeMismatch) as refused:
        apply_snapshot({"model": target, "opt": torch.optim.SGD(target.parameters(), lr=0.1, momentum=0.9)}, old_style, path)
    assert "lacks" in str(refused.value) and "momentum" in str(refused.value)
    assert torch.equal(target.weight, before)


def build_touched_layers() -> dict[str, torch.nn.Linear]:
    """Layers that setup() fills, uses, replaces, copies and moves, in one order: run plainly and with skipping."""
    import copy

    layers = {"filled": torch.nn.Linear(4, 4)}
    with torch.no_grad():
        layers["filled"].weight.fill_(0.125)  # replaces the whole value: the deferred init is dropped
    layers["scaled"] = torch.nn.Linear(4, 4)
    with torch.no_grad():
        layers["scaled"].weight.mul_(0.0).add_(1.0)  # arithmetic on its own values: deferred after its init, in
        # order (timm's trunc_normal_ works so), and run with it at the next use of anything owed
    layers["through_data"] = torch.nn.Linear(4, 4)
    layers["through_data"].weight.data.uniform_(5.0, 6.0)  # a fill through `.data`: deferred after its init, in order
    layers["assigned"] = torch.nn.Linear(4, 4)
    layers["assigned"].weight.data = torch.full((4, 4), 3.0)  # foreign data: the deferred init is dropped
    layers["moved_early"] = torch.nn.Linear(4, 4).to(torch.float64)  # deferred, then initialized by the copy below
    layers["ema"] = copy.deepcopy(torch.nn.Linear(4, 4))  # a copy reads the values: initialized first
    layers["moved"] = torch.nn.Linear(4, 4).to(torch.float64)  # a move reads nothing: still deferred
    layers["untouched"] = torch.nn.Linear(4, 4)
    return layers


def test_deferred_initialization_runs_before_setup_uses_a_value_so_setup_computes_what_it_always_did() -> None:
    torch.manual_seed(0)
    plain = build_touched_layers()
    plain_next = torch.rand(4)
    torch.manual_seed(0)
    with skipping_init() as log:
        layers = build_touched_layers()
    assert torch.equal(layers["filled"].weight, torch.full((4, 4), 0.125))
    assert torch.equal(layers["scaled"].weight, torch.ones(4, 4))
    assert ((layers["through_data"].weight >= 5) & (layers["through_data"].weight <= 6)).all()
    assert torch.equal(layers["assigned"].weight, torch.full((4, 4), 3.0))
    still = {id(p) for p in log.parameters}
    assert {name for name, layer in layers.items() if id(layer.weight) in still} == {"moved", "untouched"}
    assert layers["moved"].weight.dtype == torch.float64
    for name in ("scaled", "through_data", "moved_early", "ema"):  # run when used, in a plain setup()'s order
        assert torch.equal(layers[name].weight, plain[name].weight), name
    assert [s.drew for s in log.settled] == [False], "the one use (the EMA's copy) ran what was owed before it"
    log.replay_all()
    for name, layer in layers.items():  # every owed call in setup()'s order: a plain setup()'s values
        assert torch.equal(layer.weight, plain[name].weight) and torch.equal(layer.bias, plain[name].bias), name
    assert torch.equal(torch.rand(4), plain_next), "the generator stands where a plain setup() left it"


def test_the_mapped_pages_are_made_private_before_the_first_step_and_the_file_stays_as_it_was(tmp_path) -> None:
    import sys

    def anon() -> int:
        status = Path("/proc/self/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("RssAnon:")).split()[1]) * 1024

    if not sys.platform.startswith("linux"):
        pytest.skip("MADV_POPULATE_WRITE is Linux's")
    model = torch.nn.Linear(2048, 4096)  # 32 MiB of weights
    write_snapshot({"model": model}, 3, 0, tmp_path)
    path = next((tmp_path / "snapshots").glob("step-*.pt"))
    before_file = path.read_bytes()
    with skipping_init() as log:
        fresh = torch.nn.Linear(2048, 4096)
    payload = load_snapshot(path)
    before = anon()
    report = apply_snapshot({"model": fresh}, payload, path, init_log=log)
    grew = anon() - before
    assert report.mapped == 2 and torch.equal(fresh.weight, model.weight)
    if report.populated == 0:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14): pages become private in the first step")
    assert report.populated >= 32 << 20 and grew >= 30 << 20, (report.populated, grew)
    with torch.no_grad():
        fresh.weight.add_(1.0)  # training writes: the private pages change, the file does not
    assert path.read_bytes() == before_file
