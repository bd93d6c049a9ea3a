"""A rebuild carries the trained weights of layers that moved within an `nn.Sequential` or `nn.ModuleList`.

Found porting pytorch/examples' dcgan: one `nn.Dropout` inserted into the generator's `nn.Sequential`
renumbered every layer after it; matched by name, the rebuild dropped 16 trained tensors, called 3 changed in
shape and initialized 16 anew, though every trained layer was still there.
"""

from __future__ import annotations

import torch
from torch import nn

from conftest import is_event, save
from workbench.engine.moved_layers import aligned_names, match_moved, old_name, shapes_of
from workbench.engine.rebuild import carry_over
from workbench.protocol.events import Rebuild, StepOnce


def _generator(dropout: bool = False, extra: bool = False, width: int = 8) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(4, width), nn.BatchNorm1d(width), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(0.1))
    if extra:
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers += [nn.Linear(width, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2), nn.Tanh()]
    return nn.Sequential(*layers)


def _trained_pair(old: nn.Module, new: nn.Module):  # type: ignore[no-untyped-def]
    old_opt = torch.optim.Adam(old.parameters(), lr=0.01)
    for _ in range(3):
        old(torch.randn(5, 4)).pow(2).mean().backward()
        old_opt.step()
        old_opt.zero_grad()
    return old_opt, torch.optim.Adam(new.parameters(), lr=0.01)


def test_a_layer_inserted_into_a_sequential_leaves_every_trained_layer_carried_by_position() -> None:
    old, new = _generator(), _generator(dropout=True)
    old_opt, new_opt = _trained_pair(old, new)
    report = carry_over({"netG": old, "opt": old_opt}, {"netG": new, "opt": new_opt})
    assert report.new == [] and report.dropped == [] and report.mismatched == [], report
    assert report.tensors == len(new.state_dict())
    for position_old, position_new in ((0, 0), (1, 1), (3, 4), (4, 5), (6, 7)):
        assert torch.equal(new[position_new].weight, old[position_old].weight), (position_old, position_new)
    assert torch.equal(new[5].running_mean, old[4].running_mean), "buffers follow their layer"
    assert new_opt.state[new[7].weight]["exp_avg"] is old_opt.state[old[6].weight]["exp_avg"], "Adam's state follows"
    (note,) = report.moved
    assert note.startswith("netG: layers moved within a numbered container") and "3 -> 4, 4 -> 5" in note, note


def test_a_layer_with_weights_inserted_is_new_and_never_takes_the_weights_that_held_its_number() -> None:
    old, new = _generator(), _generator(extra=True)
    old_opt, new_opt = _trained_pair(old, new)
    report = carry_over({"m": old}, {"m": new})
    assert report.new == ["m.3.weight", "m.3.bias"], report.new
    assert report.dropped == [] and report.mismatched == [], report
    assert torch.equal(new[5].weight, old[3].weight) and torch.equal(new[8].weight, old[6].weight)


def test_a_layer_widened_in_place_is_reported_against_the_layer_it_replaces_and_the_rest_still_line_up() -> None:
    old = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 2))
    new = nn.Sequential(nn.Linear(4, 8), nn.Dropout(), nn.ReLU(), nn.Linear(8, 9), nn.Linear(9, 2))
    report = carry_over({"m": old}, {"m": new})
    assert report.mismatched == ["m.3.weight (was m.2.weight) (8, 8) -> (9, 8)", "m.3.bias (was m.2.bias) (8,) -> (9,)",
                                 "m.4.weight (was m.3.weight) (2, 8) -> (2, 9)"], report.mismatched
    assert report.new == [] and report.dropped == []
    assert torch.equal(new[0].weight, old[0].weight)


def test_nested_blocks_in_a_module_list_move_with_their_insides_and_unchanged_containers_keep_their_names() -> None:
    class Block(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.ff = nn.Sequential(nn.Linear(width, width), nn.ReLU())

    class Net(nn.Module):
        def __init__(self, blocks: list[int]) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block(w) for w in blocks)
            self.head = nn.Linear(4, 1)

    def names(old: nn.Module, new: nn.Module):  # type: ignore[no-untyped-def]
        return aligned_names(shapes_of(old.state_dict()), shapes_of(new.state_dict()))

    old, new = Net([4, 4]), Net([4, 3, 4])
    paths, moves = names(old, new)
    assert old_name(paths, "blocks.2.ff.0.weight") == "blocks.1.ff.0.weight"
    assert old_name(paths, "blocks.1.ff.0.weight") is None, "the inserted block is new"
    assert old_name(paths, "head.weight") == "head.weight"
    assert moves == ["blocks.1 -> blocks.2"]
    assert names(old, Net([4, 4])) == ({}, []), "nothing moved: names are matched as before"


PROJECT_PY = """\
import torch
from torch import nn


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Linear(4, 8),
            nn.BatchNorm1d(8),
            nn.ReLU(True),
            nn.Linear(8, 2),
            nn.Tanh(),
        )

    def forward(self, x):
        return self.main(x)


def setup(bench):
    torch.manual_seed(0)
    net = Generator()
    return {"net": net, "opt": torch.optim.Adam(net.parameters(), lr=0.01)}


def step(state, bench):
    loss = state["net"](torch.ones(3, 4)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return loss
"""


def test_a_dropout_added_to_a_sequential_and_rebuilt_trains_on_from_the_trained_weights(start_session) -> None:
    live = start_session({"train.py": PROJECT_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    for step in (1, 2):
        live.send(StepOnce())
        live.wait_for(is_event("step", step=step))
    trained = live.session.worker.user_state["net"].main[3].weight.detach().clone()
    save(live.entry, PROJECT_PY.replace("nn.ReLU(True),\n", "nn.ReLU(True),\n            nn.Dropout(0.0),\n"))
    held = live.wait_for(is_event("reload", file="train.py"))
    assert "Generator.__init__" in held.held, held
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    assert rebuilt.ok and rebuilt.new == () and rebuilt.dropped == () and rebuilt.mismatched == (), rebuilt
    assert rebuilt.tensors_carried == 9 and rebuilt.optimizer_states_carried == 6, rebuilt
    assert any(n.startswith("net: layers moved") and "net.main.3 -> net.main.4" not in n and "main.3 -> main.4" in n
               for n in rebuilt.notes), rebuilt.notes
    assert torch.equal(live.session.worker.user_state["net"].main[4].weight, trained)
    live.send(StepOnce())
    live.wait_for(is_event("step", step=3))


def test_a_snapshot_resumes_into_a_model_with_a_layer_inserted_since_matching_the_rest_by_place(tmp_path) -> None:
    """The same alignment from the snapshot's keys and shapes alone: before, the resume loaded nothing and listed
    the renumbered layers as missing and unexpected."""
    from tests.conftest import make_project, open_session, snapshot_after

    snapshot = snapshot_after(tmp_path, PROJECT_PY, 3)
    saved = torch.load(snapshot, weights_only=True)
    trained = saved["modules"]["net"]["main.3.weight"]
    momentum = saved["optimizers"]["opt"]["state"][4]["exp_avg"]  # the 5th parameter: main.3.weight
    inserted = PROJECT_PY.replace("nn.ReLU(True),\n", "nn.ReLU(True),\n            nn.Dropout(0.0),\n")
    root = make_project(tmp_path, {"train.py": inserted}, folder="second")
    with open_session(root / "train.py", resume=snapshot, start_paused=True) as live:
        resumed = live.wait_for(is_event("resume"), timeout=30)
        assert resumed.ok and resumed.missing == () and resumed.unexpected == () and resumed.tensors == 9, resumed
        assert any(n.startswith("net: layers moved within a numbered container") and "main.3 -> main.4" in n
                   for n in resumed.notes), resumed.notes
        net, opt = live.session.worker.user_state["net"], live.session.worker.user_state["opt"]
        assert torch.equal(net.main[4].weight, trained)
        assert torch.equal(opt.state[net.main[4].weight]["exp_avg"], momentum), "the optimizer state follows"


SHARDED_PY = """\
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard


def setup(bench):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))
    fully_shard(model)
    return {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-2),
            "data": torch.Generator().manual_seed(bench.rank)}


def full_sum(model):  # every rank's shards (an all-gather on every rank alike)
    return sum(float(p.full_tensor().double().sum()) for p in model.parameters())


def step(state, bench):
    before = full_sum(state["model"])
    x = torch.randn(4, 8, generator=state["data"])
    loss = (state["model"](x) - x).pow(2).mean()
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    bench.log(before=before, after=full_sum(state["model"]))
    return loss
"""


def test_a_sharded_snapshot_resumes_into_a_model_with_a_layer_inserted_since(tmp_path) -> None:
    """Under torchrun, FSDP2 on 2 ranks: a DCP snapshot is matched by place too, model and optimizer state."""
    import pytest

    from tests.test_distributed import project_folder, steps_of
    from tests.test_headless import Headless

    project = project_folder(tmp_path, SHARDED_PY)
    run = Headless(project / "train.py", "--nproc-per-node", "2")
    try:
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=90, what="step 3")
        run.send("snapshot")
        taken = run.wait_event("snapshot", timeout=60)
        assert taken["path"].endswith(".dcp"), taken
        run.send("quit")
        assert run.finish(timeout=60) == 0
    finally:
        run.close()
    snapped = steps_of(run.events, 0)[taken["step"]]["scalars"]["after"]
    (project / "train.py").write_text(SHARDED_PY.replace("nn.ReLU(), ", "nn.ReLU(), nn.Dropout(0.0), "))
    again = Headless(project / "train.py", "--nproc-per-node", "2", "--resume", "latest",
                     "--max-steps", str(taken["step"] + 1))
    try:
        resumed = again.wait_event("resume", timeout=90)
        assert resumed["ok"] and resumed["missing"] == [] and resumed["unexpected"] == [], resumed
        assert resumed["optimizers"] == 1, resumed
        assert any(n.startswith("model: layers moved") and "2 -> 3" in n for n in resumed["notes"]), resumed["notes"]
        assert again.finish(timeout=60) == 0
    finally:
        again.close()
    first = steps_of(again.events, 0)[taken["step"] + 1]["scalars"]
    assert first["before"] == pytest.approx(snapped, rel=1e-12), "the first resumed step starts from the snapshot"


def test_a_rebuild_carries_a_model_across_torch_compile_and_ddp_prefixes_and_says_so() -> None:
    """`_orig_mod.` (torch.compile) and `module.` (DistributedDataParallel, DataParallel) prefix every key of the model
    they wrap: compiling a model, or no longer wrapping it, dropped every trained tensor by name."""
    old, new = _generator(), _generator()
    old_opt, new_opt = _trained_pair(old, new)
    compiled = torch.compile(new, backend="eager")
    report = carry_over({"netG": old, "opt": old_opt}, {"netG": compiled, "opt": new_opt})
    assert report.dropped == [] and report.new == [] and report.tensors == len(old.state_dict()), report
    assert torch.equal(new[0].weight, old[0].weight)
    assert new_opt.state[new[0].weight]["exp_avg"] is old_opt.state[old[0].weight]["exp_avg"]
    assert any("compiled with torch.compile now, not before (`_orig_mod.`)" in note for note in report.moved), report.moved

    wrapped = nn.DataParallel(_generator())  # the same `module.` prefix as DistributedDataParallel, in one process
    report = carry_over({"netG": wrapped}, {"netG": _generator()})
    assert report.dropped == [] and report.new == [], report
    assert any("wrapped in DistributedDataParallel before, not now (`module.`)" in note for note in report.moved)


def test_keys_that_only_look_wrapped_keep_their_names() -> None:
    """A model with a child named `module` of its own on both sides is no wrapper: nothing is renamed or said."""
    matched, note = match_moved({"module.weight": (2,), "head.weight": (2,)},
                                {"module.weight": torch.zeros(2), "head.weight": torch.zeros(2)}, "m")
    assert matched == {"module.weight": "module.weight", "head.weight": "head.weight"} and note is None


COMPILED_PY = """\
import torch

torch.manual_seed(0)
DATA = torch.randn(16, 3)
COMPILE = True


def setup(bench):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    if COMPILE:
        model = torch.compile(model, backend="eager")
    return {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=0.01)}


def step(state, bench):
    loss = state["model"](DATA).pow(2).mean()
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    return loss
"""


def test_a_snapshot_of_a_compiled_model_resumes_into_it_uncompiled(tmp_path) -> None:
    from tests.conftest import make_project, open_session, snapshot_after

    snapshot = snapshot_after(tmp_path, COMPILED_PY, 4)
    straight_root = make_project(tmp_path, {"train.py": COMPILED_PY}, folder="straight")
    with open_session(straight_root / "train.py", max_steps=7, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        straight = [e.loss for e in live.events.of("step")][4:]
    root = make_project(tmp_path, {"train.py": COMPILED_PY.replace("COMPILE = True", "COMPILE = False")}, folder="plain")
    with open_session(root / "train.py", resume=snapshot, max_steps=7, exit_at_max_steps=False) as live:
        resumed = live.wait_for(is_event("resume"), timeout=60)
        assert resumed.ok and resumed.tensors == 4 and resumed.optimizers == 1, resumed
        assert any("compiled with torch.compile before, not now" in n for n in resumed.notes), resumed.notes
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        assert [e.loss for e in live.events.of("step")] == straight
