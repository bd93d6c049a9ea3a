"""x (command `run-statements`) never swaps a new, untrained model in for the live one unless what it is
built from changed.

Found porting pytorch/examples' word_language_model: its script builds the model at import from `args`;
editing one `parser.add_argument` default (`--clip`) and pressing x, as the reload's note said, re-ran
`model = RNNModel(...)` with the rest of the slice, and training went on with a fresh model (loss 6.6 -> 7.1).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses

import pytest
import torch

from conftest import is_event, save
from workbench.engine.hotswap.kept_objects import inputs_of, same_value
from workbench.protocol.events import Rebuild, RunStatements, StepOnce

SCRIPT_PY = """\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--width", type=int, default=4)
parser.add_argument("--clip", type=float, default=0.25)
args = parser.parse_args()

model = torch.nn.Linear(args.width, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scale = args.clip * 2
count = args.width - args.width  # a counter training moves on, as a script's `lr = args.lr` it anneals


def setup(bench):
    return {"model": model, "opt": opt}


def step(state, bench):
    global count
    count += 1
    loss = model(torch.ones(2, args.width)).pow(2).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    opt.step()
    opt.zero_grad()
    return {"loss": loss, "clip": args.clip, "scale": scale, "width": float(model.in_features), "count": float(count)}
"""


def _trained(start_session, source: str, steps: int):  # type: ignore[no-untyped-def]
    """A paused session of `source` after `steps` steps."""
    live = start_session({"train.py": source}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    for step in range(1, steps + 1):
        live.send(StepOnce())
        live.wait_for(is_event("step", step=step))
    return live


def _x_run(live, code_version: int):  # type: ignore[no-untyped-def]
    live.send(RunStatements())
    return live.wait_for(is_event("reload", file="train.py", code_version=code_version, ms=0.0))


def test_an_edited_argument_the_model_does_not_read_leaves_the_live_model_and_optimizer_to_x(start_session) -> None:
    live = _trained(start_session, SCRIPT_PY, 2)
    module = live.session.project.module
    model, opt = module.model, module.opt
    trained = model.weight.detach().clone()
    save(live.entry, SCRIPT_PY.replace("default=0.25", "default=0.5"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    said = " ".join(reload.notes)
    assert ("x leaves line 10: `model = torch.nn.Linear(args.width, 1)` as it is: it would put a new object in place "
            "of `model`, the live model (Linear); if a value it reads has changed by then (args.width), R") in said, reload.notes
    assert "x leaves line 11" in said and "`opt`, the live optimizer (SGD)" in said, reload.notes

    ran = _x_run(live, reload.code_version)
    assert ran.ok, ran
    assert any(n.startswith("kept `model`, the live model (Linear): line 10") for n in ran.notes), ran.notes
    assert any(n.startswith("kept `opt`, the live optimizer (SGD): line 11") for n in ran.notes), ran.notes
    assert "model" not in ran.changed and "opt" not in ran.changed and {"args", "scale"} <= set(ran.changed), ran
    assert 'ran lines 6: `parser.add_argument("--width", type=int, default=4)`; 8: `args = parser.parse_args()`, ' \
        "as parser changed" in ran.notes, "lines run for the same reason share one note"
    assert module.model is model and module.opt is opt and torch.equal(model.weight, trained)
    assert opt.state[model.weight]["momentum_buffer"] is not None, "the optimizer's state survived"
    live.send(StepOnce())
    after = live.wait_for(is_event("step", step=3))
    assert after.scalars["clip"] == 0.5 and after.scalars["scale"] == 1.0, after.scalars
    assert after.scalars["count"] == 3.0, "args.width did not change: the counter keeps what training did"
    assert any("left as they were" in n and "line(s) 13: `count = args.width - args.width`" in n for n in ran.notes)


def test_an_edited_argument_the_model_is_built_from_is_left_by_x_for_a_rebuild_that_builds_it_anew(start_session) -> None:
    """x would drop the trained weights (and leave setup()'s state holding the old model beside the new global):
    it says R builds it, and R does, with the optimizer made again over the new model."""
    from workbench.protocol.events import Rebuild

    live = _trained(start_session, SCRIPT_PY, 1)
    module = live.session.project.module
    model = module.model
    save(live.entry, SCRIPT_PY.replace("default=4", "default=3"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    ran = _x_run(live, reload.code_version)
    assert any(n.startswith("left line 10: `model = torch.nn.Linear(args.width, 1)` for a rebuild: args.width changed, "
                            "but running it would put a new object in place of `model`") for n in ran.notes), ran.notes
    assert any(n.startswith("kept `opt`") for n in ran.notes), "the optimizer reads the model, which x left as it was"
    assert module.model is model and module.model.in_features == 4
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    assert rebuilt.ok and rebuilt.mismatched == ("model.weight (1, 4) -> (1, 3)",), rebuilt
    assert module.model is not model and module.model.in_features == 3
    assert live.session.worker.user_state["model"] is module.model, "setup()'s state holds the new model"
    assert module.opt.param_groups[0]["params"][0] is module.model.weight, "the new optimizer steps the new model"
    live.send(StepOnce())
    after = live.wait_for(is_event("step", step=2)).scalars
    assert after["width"] == 3.0 and after["count"] == 1.0, "count is made anew from the new width, as a fresh start"


def test_r_alone_runs_the_edited_argument_first_and_builds_the_model_a_fresh_start_would(start_session) -> None:
    """The same edit, then R without x: found porting pytorch/examples' FSDP2 + tensor-parallel trainer, whose
    `ModelArgs(n_layers=2)` line was edited to 3 and R rebuilt a two-layer model, saying it had built the new code."""
    from workbench.protocol.events import Rebuild

    live = _trained(start_session, SCRIPT_PY, 1)
    module = live.session.project.module
    save(live.entry, SCRIPT_PY.replace("default=4", "default=3"))
    live.wait_for(is_event("reload", file="train.py"))
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    assert rebuilt.ok and rebuilt.mismatched == ("model.weight (1, 4) -> (1, 3)",), rebuilt
    assert any(n.startswith("ran first what the saves of train.py had not re-run") and "args = parser.parse_args()" in n
               for n in rebuilt.notes), rebuilt.notes
    assert module.args.width == 3 and module.model.in_features == 3
    live.send(StepOnce())
    after = live.wait_for(is_event("step", step=2)).scalars
    assert after["width"] == 3.0 and after["count"] == 1.0, after


HIDDEN_PY = """\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--clip", type=float, default=0.25)
args = parser.parse_args()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 1)
        self.clip = args.clip


model = Net()


def setup(bench):
    return {"model": model}


def step(state, bench):
    return {"loss": 0.0, "clip": model.clip}
"""


def test_a_model_whose_constructor_reads_an_edited_global_is_built_anew_by_r_as_a_fresh_start_would(start_session) -> None:
    from workbench.protocol.events import Rebuild

    live = start_session({"train.py": HIDDEN_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    save(live.entry, HIDDEN_PY.replace("default=0.25", "default=0.5"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert any("x leaves line 17: `model = Net()` as it is" in n and "(args)" in n for n in reload.notes), reload.notes
    ran = _x_run(live, reload.code_version)
    assert any(n.startswith("left line 17: `model = Net()` for a rebuild: args changed") for n in ran.notes), ran.notes
    live.send(Rebuild())
    live.wait_for(is_event("rebuild"))
    live.send(StepOnce())
    assert live.wait_for(is_event("step", step=1)).scalars["clip"] == 0.5


def test_inputs_are_the_values_a_statement_reads_not_the_methods_it_calls() -> None:
    def inputs(source: str) -> tuple[str, ...]:
        return inputs_of(ast.parse(source).body[0])

    assert inputs("model = RNNModel(args.model, ntokens, args.nhid).to(device)") == (
        "RNNModel", "args.model", "ntokens", "args.nhid", "device")
    assert inputs("opt = torch.optim.AdamW(model.parameters(), lr=args.lr)") == ("torch.optim", "model", "args.lr")
    assert inputs("n = len(corpus.dictionary)") == ("len", "corpus.dictionary")
    assert inputs("f = lambda x: x * hidden") == ()


def test_same_value_compares_what_a_fresh_run_would_see() -> None:
    @dataclasses.dataclass
    class Config:
        width: int
        lr: float

    assert same_value(argparse.Namespace(a=1, b="x"), argparse.Namespace(a=1, b="x"))
    assert not same_value(argparse.Namespace(a=1, b="x"), argparse.Namespace(a=1, b="y"))
    assert same_value(Config(3, 0.1), Config(3, 0.1)) and not same_value(Config(3, 0.1), Config(4, 0.1))
    assert same_value(torch.ones(3), torch.ones(3)) and not same_value(torch.ones(3), torch.ones(4))
    assert not same_value(torch.ones(3), torch.ones(3, dtype=torch.float64))
    assert same_value(float("nan"), float("nan")) and same_value((1, [2.0]), (1, [2.0]))
    assert not same_value(1, 1.0), "another type is another value"
    assert not same_value(object(), object()), "an object made anew, of no known kind, counts as changed"
    assert same_value(torch.device("cpu"), torch.device("cpu"))


def test_what_x_compares_is_kept_as_it_was_not_as_an_in_place_change_left_it() -> None:
    from workbench.engine.hotswap.kept_objects import same_frozen, freeze

    args = argparse.Namespace(lr=0.1)
    before = freeze(args)
    args.lr = 0.2  # an override's in-place change: the same Namespace object
    assert not same_frozen(before, freeze(args))
    weights = torch.ones(3)
    before = freeze(weights)
    assert same_frozen(before, freeze(weights))
    weights[0] = 5.0
    assert not same_frozen(before, freeze(weights)), "an in-place write changes the tensor's values"
    data = list(range(1000))
    assert same_frozen(freeze(data), freeze(data)) and not same_frozen(freeze(data), freeze(list(range(1000)))), \
        "a long list is data: the same object or not"


# --------------------------------------------------------------------------- R rebuilds what the script built at import

IMPORT_BUILT_PY = """\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--width", type=int, default=4)
args = parser.parse_args()


class Net(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = torch.nn.Linear(width, 1)


model = Net(args.width)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
seed_note = print("built at import")
criterion = torch.nn.MSELoss()


def setup(bench):
    return {"model": model, "opt": opt}


def step(state, bench):
    loss = model.fc(torch.ones(2, args.width)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return {"loss": loss, "layers": float(len(list(model.children())))}
"""


def test_a_rebuild_builds_again_the_model_and_optimizer_a_script_made_at_import_and_carries_their_state(start_session) -> None:
    """Found porting word_language_model: after an edit of RNNModel.__init__, R ran setup(), which returned the
    model built at import, and said ok with no notes while the live model kept what the old constructor built."""
    from workbench.protocol.events import Rebuild

    live = _trained(start_session, IMPORT_BUILT_PY, 2)
    module = live.session.project.module
    trained = module.model.fc.weight.detach().clone()
    momentum = module.opt.state[module.model.fc.weight]["momentum_buffer"].clone()
    old_model = module.model
    save(live.entry, IMPORT_BUILT_PY.replace(
        "        self.fc = torch.nn.Linear(width, 1)\n",
        "        self.fc = torch.nn.Linear(width, 1)\n        self.extra = torch.nn.Linear(1, 1)\n"))
    held = live.wait_for(is_event("reload", file="train.py"))
    assert "Net.__init__" in held.held, held
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    assert rebuilt.ok and rebuilt.tensors_carried == 2 and rebuilt.optimizer_states_carried == 2, rebuilt
    assert rebuilt.new == ("model.extra.weight", "model.extra.bias"), rebuilt.new
    (note,) = [n for n in rebuilt.notes if n.startswith("ran again what train.py builds at import")]
    assert "line 17: `model = Net(args.width)`" in note and "line 18: `opt = torch.optim.SGD(" in note, note  # the edit added a line above
    assert "seed_note" not in note and "line 19" not in note, "a line reading nothing the rebuild made is left alone"
    assert "criterion" not in note, "a module with no parameters or buffers holds nothing training did"
    assert module.model is not old_model and hasattr(module.model, "extra")
    assert live.session.worker.user_state["model"] is module.model, "setup() returned the model built anew"
    assert torch.equal(module.model.fc.weight, trained), "the trained weights were carried over"
    assert module.opt.param_groups[0]["params"][0] is module.model.fc.weight, "the new optimizer steps the new model"
    assert torch.equal(module.opt.state[module.model.fc.weight]["momentum_buffer"], momentum)
    live.send(StepOnce())
    assert live.wait_for(is_event("step", step=3)).scalars["layers"] == 2.0


LBFGS_PY = """\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.8)
opt = parser.parse_args()


def setup(bench):
    model = torch.nn.Linear(2, 1)
    return {"model": model, "optimizer": torch.optim.LBFGS(model.parameters(), lr=opt.lr)}


def step(state, bench):
    return {"loss": 0.0, "lr": state["optimizer"].param_groups[0]["lr"], "arg": opt.lr}
"""


def test_x_says_when_what_it_changed_was_read_by_setup_and_what_setup_built_keeps_the_old_value(start_session) -> None:
    """Found porting pytorch/examples' time_sequence_prediction: `--lr`'s default edited and x pressed, `opt.lr`
    became 0.5 while the LBFGS setup() had built from it kept 0.8, and x's event said only what it ran."""
    live = _trained(start_session, LBFGS_PY, 1)
    save(live.entry, LBFGS_PY.replace("default=0.8", "default=0.5"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    ran = _x_run(live, reload.code_version)
    assert any(n.startswith("opt was read when setup() built the live state (setup): what it built keeps the old value; "
                            "R (command `rebuild`) builds it again") for n in ran.notes), ran.notes
    live.send(StepOnce())
    after = live.wait_for(is_event("step", step=2)).scalars
    assert after["arg"] == 0.5 and after["lr"] == 0.8, "the note is true: the live optimizer kept the old rate"


INIT_APPLIED_PY = """\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--std", type=float, default=0.02)
args = parser.parse_args()


def weights_init(m):
    if isinstance(m, torch.nn.Linear):
        torch.nn.init.normal_(m.weight, 0.0, args.std)


def weights_init_g(m):
    weights_init(m)


netG = torch.nn.Linear(4, 4)
netG.apply(weights_init)
print(netG)
opt = torch.optim.SGD(netG.parameters(), lr=0.5)


def setup(bench):
    return {"netG": netG, "opt": opt}


def step(state, bench):
    loss = netG(torch.ones(2, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss
"""


def test_x_never_runs_a_line_that_could_change_a_live_model_in_place(start_session) -> None:
    """Found porting pytorch/examples' dcgan: `netG.apply(weights_init)` at import, the line edited to apply another
    init function, x pressed as the reload offered: x re-initialized the trained generator in place (its first
    layer's std 0.0209 -> 0.0300, 2,000 steps of training gone) and said only `ran line 140`."""
    from workbench.protocol.events import Rebuild

    live = _trained(start_session, INIT_APPLIED_PY, 3)
    module = live.session.project.module
    trained = module.netG.weight.detach().clone()
    save(live.entry, INIT_APPLIED_PY.replace("netG.apply(weights_init)\n", "netG.apply(weights_init_g)\n"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    (offer,) = [n for n in reload.notes if n.startswith("line 20: `netG.apply(weights_init_g)` was not re-run")]
    assert ("it reads `netG`, the live model (Linear), and running it could change it in place, losing what training "
            "did (x leaves it for R)") in offer, offer
    ran = _x_run(live, reload.code_version)
    assert any(n.startswith("left line 20: `netG.apply(weights_init_g)` for a rebuild: it was edited, but it reads "
                            "`netG`, the live model (Linear)") for n in ran.notes), ran.notes
    assert torch.equal(module.netG.weight, trained), "x left the trained weights as they were"

    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    assert rebuilt.ok and rebuilt.tensors_carried == 2, rebuilt
    (note,) = [n for n in rebuilt.notes if n.startswith("ran again what train.py builds at import")]
    assert "line 20: `netG.apply(weights_init_g)`" in note, note
    assert torch.equal(module.netG.weight, trained), "R ran it on the new model, then carried the trained weights over"


def test_x_leaves_a_line_reading_a_live_model_whose_inputs_changed_and_says_so_beforehand(start_session) -> None:
    """An edited default that the init function reads: x runs the parser again, and the slice reaches the line that
    applies the init to the live model; it stays for R, while `print(netG)` (only shows) is no concern."""
    live = _trained(start_session, INIT_APPLIED_PY, 2)
    module = live.session.project.module
    trained = module.netG.weight.detach().clone()
    save(live.entry, INIT_APPLIED_PY.replace("default=0.02", "default=0.5"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert any(n.startswith("x leaves line(s) 20 as they are: they read `netG`, the live model (Linear), and running "
                            "them could change it in place") for n in reload.notes), reload.notes
    ran = _x_run(live, reload.code_version)
    assert any(n.startswith("left line 20: `netG.apply(weights_init)` for a rebuild: args changed")
               for n in ran.notes), ran.notes
    assert module.args.std == 0.5
    assert torch.equal(module.netG.weight, trained), "x left the trained weights as they were"


def test_the_values_a_left_line_reads_are_named_without_builtins_or_the_names_it_binds() -> None:
    """The FSDP2 + tensor-parallel port's `for layer_id, transformer_block in enumerate(model.layers):` was said to
    read `enumerate, model.layers, transformer_block, tp_mesh, layer_tp_plan`: a builtin and its own loop names."""
    from pathlib import Path

    from workbench.engine.hotswap.x_statements import StatementsForX

    source = (
        "import torch\n"
        "n = 2\n"
        "model = torch.nn.Linear(n, 1)\n"
        "for i, block in enumerate([model]):\n"
        "    plan = {'a': block}\n"
    )
    namespace: dict = {"__name__": "train"}
    exec(compile(source, "train.py", "exec"), namespace)
    body = ast.parse(source).body
    _, notes = StatementsForX(namespace, [], source, Path("train.py"), 0).plan(body, [body[1]])
    loop = next(n for n in notes if n.startswith("x leaves line 4"))
    assert "if a value it reads has changed by then (model)," in loop, loop


CONFIG_AT_IMPORT_PY = """\
from dataclasses import dataclass

import torch


@dataclass
class ModelConfig:
    n_layer: int = 2
    width: int = 4


class MLP(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(config.width, config.width) for _ in range(config.n_layer))


config = ModelConfig()
model = MLP(config)


def setup(bench):
    return {"model": model}


def step(state, bench):
    return {"loss": 0.0, "layers": float(len(model.layers)), "fresh_config": float(type(config) is ModelConfig)}
"""


PLAIN_CONFIG_PY = CONFIG_AT_IMPORT_PY.replace(
    "@dataclass\nclass ModelConfig:\n    n_layer: int = 2\n    width: int = 4\n",
    "class ModelConfig:\n    def __init__(self):\n        self.n_layer = 2\n        self.width = 4\n")


@pytest.mark.parametrize("source, edit, held_as", [
    (CONFIG_AT_IMPORT_PY, ("n_layer: int = 2", "n_layer: int = 3"), "ModelConfig"),
    (PLAIN_CONFIG_PY, ("self.n_layer = 2", "self.n_layer = 3"), "ModelConfig.__init__"),
], ids=["dataclass", "constructor"])
def test_r_makes_again_a_config_made_at_import_by_a_class_whose_defaults_changed(start_session, source, edit, held_as) -> None:
    """makemore's `config = ModelConfig(...)` at import: its dataclass's default changed, the reload held the change
    naming `train.config`, and R built the model again from the old config instance (same layers), saying the new
    code built it. R now makes the config again before the model (also for a plain class's constructor)."""
    live = start_session({"train.py": source}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    live.send(StepOnce())
    assert live.wait_for(is_event("step")).scalars == {"layers": 2.0, "fresh_config": 1.0}
    save(live.entry, source.replace(*edit))
    held = live.wait_for(is_event("reload", file="train.py"))
    assert held.held == (held_as,) and any("train.config" in reason for reason in held.needs_rebuild), held
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    assert rebuilt.ok and any("`config = ModelConfig()`" in note for note in rebuilt.notes), rebuilt.notes
    assert len(rebuilt.new) == 2, rebuilt.new  # the third layer's weight and bias
    live.send(StepOnce())
    assert live.wait_for(is_event("step")).scalars == {"layers": 3.0, "fresh_config": 1.0}


WRAPPED_PY = """\
import torch

LR = 0.1
model = torch.nn.Linear(2, 1)
model = torch.nn.Sequential(model)
opt = torch.optim.SGD(model.parameters(), lr=LR)


def setup(bench):
    return {"model": model, "opt": opt}


def step(state, bench):
    return 0.0
"""


def test_an_edited_rate_names_the_optimizer_and_not_each_statement_that_makes_the_model(start_session) -> None:
    """x-transformers' enwik8 trainer, ported: `model = TransformerWrapper(...)`, `model = AutoregressiveWrapper(model)`;
    an LR edit gave, beside the optimizer's note, "x leaves line 55: `model = AutoregressiveWrapper(model)` as it is
    ... if a value it reads has changed by then (none)", a note with nothing in it, one per such statement."""
    live = _trained(start_session, WRAPPED_PY, 1)
    save(live.entry, WRAPPED_PY.replace("LR = 0.1", "LR = 0.2"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok and reload.changed == ("LR",), reload
    assert any("opt = torch.optim.SGD" in note for note in reload.notes), reload.notes
    assert not any("model = torch.nn.Sequential(model)" in note or "(none)" in note for note in reload.notes), reload.notes
