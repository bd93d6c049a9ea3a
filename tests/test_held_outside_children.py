"""Models and optimizers a model holds outside its registered children: kept by snapshots, resumes and rebuilds.

pytorch/examples' Forward-Forward trainer (ported) keeps its layers in a plain list (`self.layers = []`) and each
layer its own Adam (`self.opt`). A snapshot kept neither, a resume said `ok` with 0 tensors and trained on from
fresh weights, and a rebuild with no change threw the trained weights away: every later step differed, unsaid.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import is_event, make_project, open_session, snapshot_after
from workbench.engine.state_walk import find_modules_and_optimizers

FORWARD_FORWARD = """\
import torch

torch.manual_seed(0)
DATA = torch.randn(32, 6)


class Layer(torch.nn.Linear):
    def __init__(self, width_in, width_out):
        super().__init__(width_in, width_out)
        self.opt = torch.optim.Adam(self.parameters(), lr=0.03)

    def train_step(self, x):
        loss = self(x).relu().pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return self(x).detach(), loss


class Net(torch.nn.Module):
    def __init__(self, widths):
        super().__init__()
        self.layers = LAYERS
        for width_in, width_out in zip(widths, widths[1:]):
            self.layers = self.layers + [Layer(width_in, width_out)]


def setup(bench):
    return {"net": Net([6, 5, 4])}


def step(state, bench):
    x, total = DATA[torch.randint(0, 32, (8,))], 0.0
    for layer in state["net"].layers:
        x, loss = layer.train_step(x)
        total += float(loss)
    return {"loss": total}
"""

PLAIN_LIST, MODULE_LIST = "[]", "torch.nn.ModuleList()"


def losses(live, first: int, last: int) -> list[float]:  # type: ignore[no-untyped-def]
    return [e.loss for e in live.events.of("step") if first <= e.step <= last]


def test_the_walk_finds_models_in_a_plain_list_and_optimizers_a_layer_holds() -> None:
    namespace: dict = {}
    exec(compile(FORWARD_FORWARD.replace("LAYERS", PLAIN_LIST), "train.py", "exec"), namespace)
    net = namespace["Net"]([6, 5, 4])
    modules, optimizers = find_modules_and_optimizers({"net": net})
    assert list(modules) == ["net", "net.layers[0]", "net.layers[1]"]
    assert list(optimizers) == ["net.layers[0].opt", "net.layers[1].opt"]
    assert optimizers["net.layers[1].opt"] is net.layers[1].opt
    exec(compile(FORWARD_FORWARD.replace("LAYERS", MODULE_LIST), "train.py", "exec"), namespace)
    net = namespace["Net"]([6, 5, 4])
    modules, optimizers = find_modules_and_optimizers({"net": net, "again": net.layers[0]})
    assert list(modules) == ["net"], "registered children are the model's, found once"
    assert list(optimizers) == ["net.layers.0.opt", "net.layers.1.opt"]


@pytest.mark.parametrize("layers", [PLAIN_LIST, MODULE_LIST], ids=["plain list", "ModuleList"])
def test_a_resume_goes_on_with_the_layers_and_their_optimizers(tmp_path: Path, layers: str) -> None:
    source = FORWARD_FORWARD.replace("LAYERS", layers)
    snapshot = snapshot_after(tmp_path, source, 5)
    root = make_project(tmp_path, {"train.py": source}, folder="straight")
    with open_session(root / "train.py", max_steps=10, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        straight = losses(live, 6, 10)
    root = make_project(tmp_path, {"train.py": source}, folder="resumed")
    with open_session(root / "train.py", resume=snapshot, max_steps=10, exit_at_max_steps=False) as live:
        resumed = live.wait_for(is_event("resume"), timeout=60)
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        assert resumed.ok and resumed.optimizers == 2, resumed
        assert resumed.tensors == 4, resumed
        assert losses(live, 6, 10) == straight


@pytest.mark.parametrize("layers", [PLAIN_LIST, MODULE_LIST], ids=["plain list", "ModuleList"])
def test_a_rebuild_with_no_change_carries_the_layers_and_their_optimizers(tmp_path: Path, layers: str) -> None:
    from workbench.protocol.events import Rebuild, StepOnce

    source = FORWARD_FORWARD.replace("LAYERS", layers)
    root = make_project(tmp_path, {"train.py": source}, folder="straight")
    with open_session(root / "train.py", max_steps=10, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        straight = losses(live, 6, 10)
    root = make_project(tmp_path, {"train.py": source}, folder="rebuilt")
    with open_session(root / "train.py", max_steps=5, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        live.send(Rebuild())
        rebuilt = live.wait_for(is_event("rebuild"), timeout=60)
        assert rebuilt.ok and rebuilt.tensors_carried == 4 and rebuilt.optimizer_states_carried == 4, rebuilt  # a state per parameter
        for k in range(6, 11):
            live.send(StepOnce())
            live.wait_for(is_event("step", step=k), timeout=30)
        assert losses(live, 6, 10) == straight


def test_an_optimizer_the_state_and_its_model_both_hold_keeps_the_states_name() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.opt = opt  # a Lightning-style module that keeps its optimizer
    modules, optimizers = find_modules_and_optimizers({"model": model, "opt": opt})
    assert list(modules) == ["model"] and list(optimizers) == ["opt"]
