"""The second project family: one train.py shaped like a script-style trainer (nanoGPT's train.py,
pytorch/examples), rendered from parameters, and random sequences of saves over it.

Script-style trainers keep their configuration in module constants, override some of them from
the command line at import, keep the model and optimizer in module globals that `setup` sets
(`global model, optimizer`), compute a learning-rate schedule from the constants, make some
objects lazily on first use, and run module statements with calls (`torch.full(...)`). Each
construct contributes ONE scalar to what `step` returns; every value depends on the code (and
the script's fixed arguments) only: weights are filled with constants, nothing trains, and
`step` changes nothing later values read. So a scalar differs from a fresh start exactly when
live code or values differ from the file.

| scalar | construct |
| --- | --- |
| batch | `batch_size`, overridden by `--batch-size` below it (`if args.batch_size is not None: ...`) |
| tokens | `tokens_per_iter = batch_size * block_size`, derived after the override (as nanoGPT does) |
| lr | `get_lr(it)`, warmup and cosine decay from `learning_rate`, `min_lr` (derived), iteration constants |
| data | `get_batch()`, reading `batch_size` and the global `model` (its device) |
| mlp | `MLP(nn.Module)`: `__init__` reads `n_layer`, `forward` reads `mlp_scale` |
| opt | the global `optimizer` setup() makes through `make_optimizer()` (a helper it calls, as pytorch/examples'
  `load_train_objs()`) from `weight_decay` and a literal beta2 there |
| opt2 | an optimizer `step()` makes lazily in a global from `momentum` (and a literal dampening); +100 when
  it does not hold the live model's parameters |
| init | `init_weight = torch.full((n_embd,), init_scale)`: a module statement with a call |
| loss | the batch through the model |
| accum | `grad_accum`, which setup() re-binds (`global grad_accum; grad_accum //= 2`, as nanoGPT divides its
  accumulation steps by the world size): a rebuild must halve the file's value, not its own last result |
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields, replace

from differential.generator import Action, RebuildNow, RollbackNow, Save, _break

TRAIN = "train.py"
FAMILY = "script"
IMPORT_FAMILY = "script_import"
CONFIG_FAMILY = "script_config"  # script_import with `n_layer` a dataclass default, read through `config = ModelConfig()`

# The names a reload event must mention for a differing scalar to count as reported (see judge.py): the code
# each scalar runs, the constants it reads (under every name the generator may give them), and for values
# the command line sets, the statements that set them (`args.batch_size`, `parser`).
# `setup() changed` is how a held or rolled-back setup() is named ("an optimizer setup() does not make" names none).
_SETUP = "setup() changed"
SCALAR_NAMES: dict[str, tuple[str, ...]] = {
    "batch": ("batch_size", "args.batch_size", "parser"),
    "tokens": ("tokens_per_iter", "batch_size", "block_size", "args.batch_size", "parser"),
    "lr": ("get_lr", "lr_for", "learning_rate", "min_lr", "warmup_iters", "lr_decay_iters", "step"),
    "data": ("get_batch", "fetch_batch", "batch_size", "args.batch_size", "parser", "step"),
    "mlp": ("MLP", "mlp_scale", "n_layer", "ModelConfig", "train.config", _SETUP),
    "opt": ("train.optimizer", "state['optimizer']", "weight_decay", "make_optimizer", _SETUP),
    "opt2": ("opt2", "momentum"),
    "init": ("init_weight", "init_scale", "n_embd"),
    "loss": ("get_batch", "fetch_batch", "batch_size", "args.batch_size", "parser", "MLP", "mlp_scale", "n_layer",
             "ModelConfig", "train.config", _SETUP, "step"),
    "accum": ("grad_accum", _SETUP),
}

BLOCKS = ("globals", "get_lr", "get_batch", "mlp", "setup", "step")
ARGVS: tuple[tuple[str, ...], ...] = ((), ("--batch-size", "4"), ("--batch-size", "12"))


@dataclass(frozen=True)
class ScriptSpec:
    """train.py, script style; every field is something an edit may change."""

    header: int = 0  # comment lines at the top: every statement below shifts
    gap: int = 0  # extra blank lines after the imports
    batch_size: int = 8
    block_size: int = 4
    n_layer: int = 2
    learning_rate: float = 3e-4
    min_lr_expr: str = "learning_rate / 10"  # derived: nanoGPT's "~= learning_rate/10 per Chinchilla"
    warmup_iters: int = 2
    lr_decay_iters: int = 10
    weight_decay: float = 0.1
    momentum: float = 0.9
    mlp_scale: float = 1.5
    init_scale: float = 0.5
    grad_accum: int = 4  # setup() halves it; no edit changes it (the draws, so the recorded cases' seeds, stay as they were)
    arg_default: str = "None"  # parser.add_argument("--batch-size", ..., default=...)
    override: str = "batch_size = args.batch_size"  # the line under `if args.batch_size is not None:`
    tokens_expr: str = "batch_size * block_size"
    init_expr: str = "torch.full((n_embd,), init_scale)"
    decay_k: float = 0.5  # get_lr: coeff = decay_k * (1.0 + cos(...))
    lr_name: str = "get_lr"
    batch_name: str = "get_batch"
    inline_batch: bool = False  # the helper deleted, its lines written into step
    data_k: float = 1.0  # get_batch: the value the batch is filled with
    mlp_gain: float = 1.0  # set by MLP.__init__: live instances keep the old value
    beta2: float = 0.95  # make_optimizer(), which setup() calls: AdamW(..., betas=(0.9, beta2))
    returns: str = "model_opt"  # what setup returns: "model_opt" | "model" | "empty" (globals only)
    dampening: float = 0.0  # step: the lazy SGD's dampening
    order: tuple[str, ...] = BLOCKS
    # The script_import family: the model and its optimizer are built at import, at the end of the file (as
    # pytorch/examples' word_language_model does), and setup() only returns them. No edit changes it.
    at_import: bool = False
    # The script_config family (makemore's shape): `n_layer` is a default of a dataclass, `config = ModelConfig()` is
    # made at import and MLP reads `config.n_layer`. No edit changes it.
    config_class: bool = False

    def render(self) -> str:
        header = "".join(f"# note {i}: nothing but a comment\n" for i in range(self.header))
        top = header + "import argparse\nimport math\n" + ("from dataclasses import dataclass\n" if self.config_class else "")
        top += "\nimport torch\nfrom torch import nn\n" + "\n" * self.gap
        n_layer = (f"\n\n@dataclass\nclass ModelConfig:\n    n_layer: int = {self.n_layer!r}\n\n\nconfig = ModelConfig()\n"
                   if self.config_class else f"n_layer = {self.n_layer!r}\n")
        config = (
            "\n# " + "-" * 77 + "\n# default config values\n"
            f"batch_size = {self.batch_size!r}\nblock_size = {self.block_size!r}\n{n_layer}"
            "n_embd = 4\n"
            f"learning_rate = {self.learning_rate!r}\nmin_lr = {self.min_lr_expr}\n"
            f"warmup_iters = {self.warmup_iters!r}\nlr_decay_iters = {self.lr_decay_iters!r}\n"
            f"weight_decay = {self.weight_decay!r}\nmomentum = {self.momentum!r}\n"
            f"mlp_scale = {self.mlp_scale!r}\ninit_scale = {self.init_scale!r}\ngrad_accum = {self.grad_accum!r}\n"
            "# " + "-" * 77 + "\n\n"
            "parser = argparse.ArgumentParser()\n"
            f'parser.add_argument("--batch-size", type=int, default={self.arg_default})\n'
            "args = parser.parse_args()\n"
            f"if args.batch_size is not None:\n    {self.override}\n"
            f"tokens_per_iter = {self.tokens_expr}\n\n"
            f"init_weight = {self.init_expr}\n"
        )
        blocks = [b for b in (self._block(name) for name in self.order) if b]
        built = "\n\nmodel = MLP()\noptimizer = make_optimizer(model.parameters())\n" if self.at_import else ""
        return top + config + "\n\n" + "\n\n".join(blocks) + built

    def _block(self, name: str) -> str:
        if name == "globals":
            return "model = None\noptimizer = None\nopt2 = None  # made by step() on first use\n"
        if name == "get_lr":
            return (
                f"def {self.lr_name}(it):\n"
                "    if it < warmup_iters:\n        return learning_rate * (it + 1) / (warmup_iters + 1)\n"
                "    if it > lr_decay_iters:\n        return min_lr\n"
                "    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)\n"
                f"    coeff = {self.decay_k!r} * (1.0 + math.cos(math.pi * decay_ratio))\n"
                "    return min_lr + coeff * (learning_rate - min_lr)\n"
            )
        if name == "get_batch":
            return "" if self.inline_batch else f"def {self.batch_name}():\n{self._batch_lines()}    return x, y\n"
        if name == "mlp":
            return (
                "class MLP(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                "        self.layers = nn.ModuleList([nn.Linear(n_embd, n_embd) for _ in "
                f"range({'config.n_layer' if self.config_class else 'n_layer'})])\n"
                "        with torch.no_grad():\n            for layer in self.layers:\n"
                "                layer.weight.fill_(0.125)\n                layer.bias.fill_(0.0)\n"
                f"        self.gain = {self.mlp_gain!r}\n\n"
                "    def forward(self, x):\n        for layer in self.layers:\n            x = layer(x)\n"
                "        return x * mlp_scale * self.gain\n"
            )
        if name == "setup":
            returns = {
                "model_opt": '{"model": model, "optimizer": optimizer}',
                "model": '{"model": model}',
                "empty": "{}",
            }[self.returns]
            return (
                "def make_optimizer(params):\n"
                "    return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay, "
                f"betas=(0.9, {self.beta2!r}))\n\n\n"
                "def setup(bench):\n    global model, optimizer, grad_accum\n    grad_accum //= 2\n    torch.manual_seed(0)\n"
                + ("    model.to(bench.device)\n" if self.at_import else
                   "    model = MLP().to(bench.device)\n    optimizer = make_optimizer(model.parameters())\n")
                + f"    return {returns}\n"
            )
        if name == "step":
            batch = self._batch_lines() if self.inline_batch else f"    x, y = {self.batch_name}()\n"
            return (
                "def step(state, bench):\n    global opt2\n    if opt2 is None:\n"
                f"        opt2 = torch.optim.SGD(model.parameters(), lr=0.01, momentum=momentum, dampening={self.dampening!r})\n"
                f"    lr = {self.lr_name}(3)\n"
                "    for param_group in optimizer.param_groups:\n        param_group[\"lr\"] = lr\n"
                f"{batch}"
                "    loss = ((model(x) - y) ** 2).mean()\n"
                "    group, group2 = optimizer.param_groups[0], opt2.param_groups[0]\n"
                "    bound = group2[\"params\"][0] is next(model.parameters())\n"
                "    return {\n"
                '        "loss": loss,\n'
                '        "batch": batch_size,\n'
                '        "tokens": tokens_per_iter,\n'
                '        "lr": lr * 1e4,\n'
                '        "data": x.sum(),\n'
                '        "mlp": model(torch.ones(n_embd)).sum(),\n'
                '        "opt": group["weight_decay"] + group["betas"][1],\n'
                '        "opt2": group2["momentum"] + group2["dampening"] + (0.0 if bound else 100.0),\n'
                '        "init": init_weight.sum(),\n'
                '        "accum": grad_accum,\n'
                "    }\n"
            )
        raise ValueError(name)

    def _batch_lines(self) -> str:
        return (
            "    device = next(model.parameters()).device\n"
            f"    x = torch.full((batch_size, n_embd), {self.data_k!r}, device=device)\n"
            "    y = torch.zeros(batch_size, n_embd, device=device)\n"
        )


# --------------------------------------------------------------------------- the generator

INTS: dict[str, tuple[int, ...]] = {
    "batch_size": (8, 16, 6, 2),
    "block_size": (4, 8, 3),
    "n_layer": (2, 3, 1),
    "warmup_iters": (2, 1, 5),
    "lr_decay_iters": (10, 6, 20),
}
FLOATS: dict[str, tuple[float, ...]] = {
    "learning_rate": (3e-4, 6e-4, 1e-3, 3e-3),
    "weight_decay": (0.1, 0.0, 0.05, 0.2),
    "momentum": (0.9, 0.8, 0.5, 0.95),
    "mlp_scale": (1.5, 1.0, 2.0, 0.5),
    "init_scale": (0.5, 1.0, 2.0, 0.25),
    "decay_k": (0.5, 0.4, 0.6),
    "data_k": (1.0, 2.0, 0.5, 3.0),
    "mlp_gain": (1.0, 2.0, 0.5),
    "beta2": (0.95, 0.99, 0.9),
    "dampening": (0.0, 0.1, 0.2),
}
CHOICES: dict[str, tuple[str, ...]] = {
    "min_lr_expr": ("learning_rate / 10", "learning_rate / 20", "learning_rate * 0.05"),
    "arg_default": ("None", "6"),
    "override": ("batch_size = args.batch_size", "batch_size = args.batch_size * 2", "batch_size = max(args.batch_size, 6)"),
    "tokens_expr": ("batch_size * block_size", "batch_size * block_size * 2", "block_size * batch_size + 1"),
    "init_expr": ("torch.full((n_embd,), init_scale)", "torch.full((n_embd,), init_scale * 2)", "init_scale * torch.ones(n_embd)"),
    "lr_name": ("get_lr", "lr_for"),
    "batch_name": ("get_batch", "fetch_batch"),
    "returns": ("model_opt", "model", "empty"),
}
BOOLEAN = ("inline_batch",)
VALUE_FIELDS = (
    # constants
    "batch_size", "batch_size", "block_size", "n_layer", "learning_rate", "learning_rate", "min_lr_expr", "warmup_iters",
    "lr_decay_iters", "weight_decay", "momentum", "mlp_scale", "init_scale",
    # the command line, its override and what is derived after it
    "arg_default", "override", "override", "tokens_expr", "init_expr",
    # values in bodies: a helper, a method, __init__, setup, step
    "decay_k", "data_k", "mlp_gain", "beta2", "returns", "dampening",
)
RENAMES = ("lr_name", "batch_name")
DELETIONS = ("inline_batch",)
OPS = {  # weights, as the two-file family's
    "value": 30, "layout": 12, "move": 10, "rename": 9, "delete": 7, "revert": 10, "mixed": 14, "syntax": 4,
}


@dataclass(frozen=True)
class RunStatementsNow:
    what: str = "run the statements a reload did not re-run (command `run-statements`, key x)"


@dataclass(frozen=True)
class ScriptSequence:
    """A start (the spec and the script's arguments) and the actions after it."""

    seed: int
    script: ScriptSpec
    argv: tuple[str, ...]
    actions: tuple[Action | RunStatementsNow, ...]
    family: str = FAMILY

    @property
    def scalar_names(self) -> dict[str, tuple[str, ...]]:
        return SCALAR_NAMES

    def initial_files(self) -> dict[str, str]:
        return {TRAIN: self.script.render()}


def describe_change(before: ScriptSpec, after: ScriptSpec) -> str:
    parts = [f"{f.name} {getattr(before, f.name)!r} -> {getattr(after, f.name)!r}" for f in fields(before)
             if getattr(before, f.name) != getattr(after, f.name)]
    return ", ".join(parts) or "no change"


def generate_script(seed: int, family: str = FAMILY, saves_between: tuple[int, int] = (1, 5)) -> ScriptSequence:
    """1-5 saves of train.py (`saves_between`), each maybe followed by rebuild, rollback or x; the script's arguments drawn first.
    `family` "script_import": the same draws, the model and optimizer built at import (ScriptSpec.at_import);
    "script_config": that, with `n_layer` read from a dataclass config made at import (ScriptSpec.config_class)."""
    rng = random.Random(seed)
    argv = rng.choice(ARGVS)
    # the state setup() returns, or globals only
    spec = ScriptSpec(returns=rng.choice(CHOICES["returns"]), at_import=family in (IMPORT_FAMILY, CONFIG_FAMILY),
                      config_class=family == CONFIG_FAMILY)
    if rng.random() < 0.5:  # start from a varied script half of the time
        for _ in range(rng.randint(0, 3)):
            spec = _edit(rng, spec, rng.choice(("value", "value", "move", "rename", "delete")))
    start = spec
    versions = [spec]
    actions: list[Action | RunStatementsNow] = []
    saves = rng.randint(*saves_between)
    fixing = False  # after a syntax error, the next save fixes the file
    for index in range(saves):
        op = rng.choices(list(OPS), weights=list(OPS.values()))[0]
        if fixing and op == "syntax":
            op = "value"
        before = spec
        if op == "revert":
            earlier = [v for v in versions if v != before]
            after = rng.choice(earlier) if earlier else _edit(rng, before, "value")
            what = f"{TRAIN}: revert to an earlier version ({describe_change(before, after)})"
        else:
            after = _edit(rng, before, "value" if op == "syntax" else op)
            what = f"{TRAIN}: {op}: {describe_change(before, after)}"
        text = after.render()
        if op == "syntax":
            text, line = _break(rng, text)
            actions.append(Save(TRAIN, text, f"{TRAIN}: syntax error at line {line} (with {describe_change(before, after)})", True))
            fixing = True
            continue
        fixing = False
        spec = after
        versions.append(after)
        actions.append(Save(TRAIN, text, what))
        draw = rng.random()
        if draw < 0.25:
            actions.append(RebuildNow())
        elif draw < 0.37:
            actions.append(RollbackNow())
        elif draw < 0.5:
            actions.append(RunStatementsNow())
        if index == saves - 1 and rng.random() < 0.2:
            actions.append(RollbackNow())
    return ScriptSequence(seed, start, argv, tuple(actions), family)


def _edit(rng: random.Random, spec: ScriptSpec, op: str) -> ScriptSpec:
    """One edit of the kind `op` (or 2-3 of them, for `mixed`); always a different spec."""
    for _ in range(20):
        if op == "mixed":
            new = spec
            for sub in rng.sample(("value", "layout", "move", "rename", "delete", "value"), rng.randint(2, 3)):
                new = _edit(rng, new, sub)
        elif op == "value":
            new = _flip(rng, spec, rng.choice(VALUE_FIELDS))
        elif op == "layout":
            new = replace(spec, header=rng.choice([h for h in range(4) if h != spec.header])) if rng.random() < 0.7 \
                else replace(spec, gap=rng.choice([g for g in range(3) if g != spec.gap]))
        elif op == "move":
            order = list(spec.order)
            rng.shuffle(order)
            new = replace(spec, order=tuple(order))
        elif op == "rename":
            new = _flip(rng, spec, rng.choice(RENAMES))
        elif op == "delete":
            new = _flip(rng, spec, rng.choice(DELETIONS))
        else:
            raise ValueError(op)
        if new != spec:
            return new
    return spec


def _flip(rng: random.Random, spec: ScriptSpec, name: str) -> ScriptSpec:
    current = getattr(spec, name)
    if name in BOOLEAN:
        return replace(spec, **{name: not current})
    options = INTS.get(name) or FLOATS.get(name) or CHOICES[name]
    return replace(spec, **{name: rng.choice([v for v in options if v != current])})
