"""The small project every differential sequence edits: train.py and model.py, rendered from parameters.

Each construct the hot-swapper treats differently (a plain function, module
constants plain and derived, a closure kept in the state, a decorated function,
a running generator, methods of live modules, a dataclass held by a model, a
class imported with `from model import ...`) contributes ONE scalar to what
`step` returns. Every value depends on the code only: weights are filled with
constants, nothing trains, and `step` changes nothing later values read. So a
scalar differs from a fresh start exactly when live code differs from the file.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

TRAIN = "train.py"
MODEL = "model.py"
FILES = (TRAIN, MODEL)

# The names a reload event must mention for a differing scalar to count as reported (see judge.py):
# the qualified names of the code each scalar runs, under every name the generator may give it.
SCALAR_NAMES: dict[str, tuple[str, ...]] = {
    "loss": ("GPT.forward", "GPT.__init__", "GPT._mix", "GPT._blend", "Block.forward", "Block.__init__", "GAIN", "DOUBLE"),
    "base": ("BASE",),
    "derived": ("BASE", "DERIVED"),
    "func": ("body", "body_fn", "step"),
    "closure": ("make_scale", "make_factor"),
    "decorated": ("decorated", "traced"),
    "gen": ("numbers",),
    "method": ("GPT.helper",),
    "block": ("Block.forward", "Block.__init__", "GAIN", "DOUBLE"),
    "config": ("Config",),
    "tag": ("setup",),
}

TRAIN_BLOCKS = ("scale", "decorated", "numbers", "body", "setup", "step")
MODEL_BLOCKS = ("config", "block", "gpt")
GPT_METHODS = ("init", "forward", "mix", "helper")


@dataclass(frozen=True)
class TrainSpec:
    """train.py: constants, a closure factory, a decorator, a generator, a helper, setup and step."""

    header: int = 0  # comment lines at the top: every def below shifts
    gap: int = 0  # extra blank lines after the imports
    base: float = 3.0
    derived_expr: str = "BASE * 2"
    body_name: str = "body"
    body_k: float = 3.0
    inline_body: bool = False  # the helper deleted, its expression written into step
    scale_name: str = "make_scale"
    inner_name: str = "f"
    f_k: float = 2.0
    f_capture: bool = False  # f reads a variable of make_scale (a free variable) instead of a literal
    dec_k: float = 0.5
    decorated_k: float = 4.0
    decorator_on: bool = True
    gen_k: float = 7.0
    tag: float = 1.0
    order: tuple[str, ...] = TRAIN_BLOCKS

    def render(self) -> str:
        header = "".join(f"# note {i}: nothing but a comment\n" for i in range(self.header))
        top = header + "import functools\n\nimport torch\n\nfrom model import GPT, Block, Config\n" + "\n" * self.gap
        constants = f"\nBASE = {self.base!r}\nDERIVED = {self.derived_expr}\n"
        blocks = [b for b in (self._block(name) for name in self.order) if b]
        return top + constants + "\n\n" + "\n\n".join(blocks)

    def _block(self, name: str) -> str:
        if name == "scale":
            if self.f_capture:
                inner = f"    k = {self.f_k!r}\n\n    def {self.inner_name}(x):\n        return x * k\n"
            else:
                inner = f"    def {self.inner_name}(x):\n        return x * {self.f_k!r}\n"
            return f"def {self.scale_name}():\n{inner}\n    return {self.inner_name}\n"
        if name == "decorated":
            decorator = "@traced\n" if self.decorator_on else ""
            return (
                "def traced(fn):\n    @functools.wraps(fn)\n    def wrapper(x):\n"
                f"        return fn(x) + {self.dec_k!r}\n\n    return wrapper\n\n\n"
                f"{decorator}def decorated(x):\n    return x * {self.decorated_k!r}\n"
            )
        if name == "numbers":
            return f"def numbers():\n    while True:\n        yield {self.gen_k!r} * 3\n"
        if name == "body":
            return "" if self.inline_body else f"def {self.body_name}(x):\n    return x * {self.body_k!r}\n"
        if name == "setup":
            return (
                "def setup(bench):\n    torch.manual_seed(0)\n    model = GPT(Config())\n"
                f'    return {{"model": model, "scale_fn": {self.scale_name}(), "gen": numbers(), "block": Block(4), '
                f'"tag": {self.tag!r}}}\n'
            )
        if name == "step":
            func = f"2.0 * {self.body_k!r}" if self.inline_body else f"{self.body_name}(2.0)"
            return (
                "def step(state, bench):\n    x = torch.ones(4)\n    return {\n"
                '        "loss": state["model"](x),\n'
                '        "base": BASE,\n'
                '        "derived": DERIVED,\n'
                f'        "func": {func},\n'
                '        "closure": state["scale_fn"](1.0),\n'
                '        "decorated": decorated(1.0),\n'
                '        "gen": next(state["gen"]),\n'
                '        "method": state["model"].helper(2.0),\n'
                '        "block": state["block"](x).sum(),\n'
                '        "config": state["model"].config.total(),\n'
                '        "tag": state["tag"],\n'
                "    }\n"
            )
        raise ValueError(name)


@dataclass(frozen=True)
class ModelSpec:
    """model.py: constants, a dataclass Config, a Block module and a GPT module holding both."""

    header: int = 0
    gap: int = 0
    gain: float = 0.5
    double_expr: str = "GAIN * 2"
    bias: float = 0.25
    extra_field: bool = False  # Config gains a field (the dataclass must be made again)
    total_k: float = 2.0
    block_offset: float = 1.0  # set by Block.__init__: live instances keep the old value
    block_k: float = 1.0
    gpt_shift: float = 0.0  # set by GPT.__init__
    mix_name: str = "_mix"
    mix_k: float = 1.5
    inline_mix: bool = False  # the helper method deleted, its expression written into forward
    helper_k: float = 2.0
    order: tuple[str, ...] = MODEL_BLOCKS
    methods: tuple[str, ...] = GPT_METHODS

    def render(self) -> str:
        header = "".join(f"# model note {i}\n" for i in range(self.header))
        top = header + "import dataclasses\n\nimport torch\n" + "\n" * self.gap
        constants = f"\nGAIN = {self.gain!r}\nDOUBLE = {self.double_expr}\n"
        return top + constants + "\n\n" + "\n\n".join(self._block(name) for name in self.order)

    def _block(self, name: str) -> str:
        if name == "config":
            extra = "    scale: float = 1.0\n" if self.extra_field else ""
            total = "(self.bias + self.scale)" if self.extra_field else "self.bias"
            return (
                "@dataclasses.dataclass\nclass Config:\n    width: int = 4\n"
                f"    bias: float = {self.bias!r}\n{extra}\n"
                f"    def total(self):\n        return {total} * {self.total_k!r}\n"
            )
        if name == "block":
            return (
                "class Block(torch.nn.Module):\n    def __init__(self, width):\n        super().__init__()\n"
                "        self.lin = torch.nn.Linear(width, width)\n        with torch.no_grad():\n"
                "            self.lin.weight.fill_(0.125)\n            self.lin.bias.fill_(0.0)\n"
                f"        self.offset = {self.block_offset!r}\n\n"
                f"    def forward(self, x):\n        return self.lin(x) * DOUBLE + self.offset * {self.block_k!r}\n"
            )
        if name == "gpt":
            methods = [m for m in (self._method(name) for name in self.methods) if m]
            return "class GPT(torch.nn.Module):\n" + "\n".join(methods)
        raise ValueError(name)

    def _method(self, name: str) -> str:
        if name == "init":
            return (
                "    def __init__(self, config):\n        super().__init__()\n        self.config = config\n"
                f"        self.block = Block(config.width)\n        self.shift = {self.gpt_shift!r}\n"
            )
        if name == "forward":
            mixed = f"y * {self.mix_k!r}" if self.inline_mix else f"self.{self.mix_name}(y)"
            return f"    def forward(self, x):\n        y = self.block(x).sum()\n        return {mixed} + self.shift\n"
        if name == "mix":
            return "" if self.inline_mix else f"    def {self.mix_name}(self, y):\n        return y * {self.mix_k!r}\n"
        if name == "helper":
            return f"    def helper(self, v):\n        return v * {self.helper_k!r}\n"
        raise ValueError(name)


Spec = TrainSpec | ModelSpec


def initial_files(train: TrainSpec | None = None, model: ModelSpec | None = None) -> dict[str, str]:
    return {TRAIN: (train or TrainSpec()).render(), MODEL: (model or ModelSpec()).render()}


def with_changes(spec: Spec, **changes: object) -> Spec:
    return replace(spec, **changes)  # type: ignore[type-var]
