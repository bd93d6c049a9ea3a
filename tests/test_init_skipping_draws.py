"""A resume's or rebuild's setup() skips initialization, yet draws at random as a fresh start's does.

The skipped `kaiming_uniform_` of every layer draws nothing, so each draw setup() makes after building its model
(synthetic data, `random_split`, a shuffling loader's seed, a reseed) came from another place in torch's stream than
the first start's: a resumed run trained on another split of its data than the run it resumed, and said nothing.
The skipped calls are now owed draws, made in setup()'s order before any such draw (workbench/engine/init_skipping.py).
"""

from __future__ import annotations

import importlib.util
import math
import inspect
import shutil
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset, random_split

from tests.conftest import make_project
from tests.test_resume_matches_straight_run import finished, losses, rebuilt_at, snapshot_at
from workbench.engine import init_skipping
from workbench.engine.init_skipping import settled_notes, skipping_init


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 6)
        self.body = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 10, bias=False)
        self.head.weight = self.emb.weight  # the first head weight is freed: its draws were made all the same


def draws_after_a_model(draw) -> tuple[object, object]:  # type: ignore[no-untyped-def]
    """(plain, skipping): what `draw()` returns after building a model, in a plain setup() and a skipping one."""
    torch.manual_seed(0)
    Tied()
    plain = draw()
    torch.manual_seed(0)
    with skipping_init() as log:
        Tied()
        skipping = draw()
    assert log.settled and log.settled[0].drew, "the owed calls ran before the draw"
    return plain, skipping


def first_shuffled_batch() -> torch.Tensor:
    loader = DataLoader(TensorDataset(torch.arange(32)), batch_size=8, shuffle=True)
    return next(iter(loader))[0]


@pytest.mark.parametrize(
    "draw",
    [
        lambda: torch.randn(5),
        lambda: torch.randint(0, 100, (5,)),
        lambda: torch.rand(3, generator=torch.default_generator),
        lambda: random_split(range(20), [10, 10])[0].indices,
        first_shuffled_batch,
        lambda: torch.empty(5).normal_(),
        lambda: torch.nn.init.trunc_normal_(torch.empty(5)),  # an initializer on plain data runs, and draws
        lambda: torch.nn.init.kaiming_uniform_(torch.empty(4, 4)),  # seen whole: it draws inside the handler
        lambda: torch.nn.functional.dropout(torch.ones(8), 0.5),
        lambda: torch.get_rng_state(),
        lambda: (torch.manual_seed(1), torch.randn(3))[1],  # a reseed must come after the model's draws
    ],
    ids=["randn", "randint", "default-generator", "random_split", "shuffle", "normal_", "plain-init", "plain-kaiming",
         "dropout",
         "get_rng_state", "manual_seed"],
)
def test_a_draw_after_the_model_is_a_fresh_starts(draw) -> None:  # type: ignore[no-untyped-def]
    plain, skipping = draws_after_a_model(draw)
    if isinstance(plain, torch.Tensor):
        assert torch.equal(plain, skipping)
    else:
        assert plain == skipping


def test_the_owed_calls_fill_their_parameters_in_place_or_through_a_scratch_copy() -> None:
    torch.manual_seed(0)
    plain = Tied()
    plain_moved = torch.nn.Linear(4, 4).to(torch.float64)
    plain_data = torch.randn(3)
    torch.manual_seed(0)
    with skipping_init() as log:
        model = Tied()
        moved = torch.nn.Linear(4, 4).to(torch.float64)
        data = torch.randn(3)
    assert torch.equal(data, plain_data)
    assert log.parameters == [], "everything owed ran: nothing is left to replay"
    for name, value in model.state_dict().items():
        assert torch.equal(value, plain.state_dict()[name]), name
    assert torch.equal(moved.weight, plain_moved.weight), "a moved parameter gets its values as made, then converted"
    assert log.settled[0].calls == 6, "emb, body (2), the head weight the tie freed, moved (2)"


def test_a_draw_from_a_generator_of_the_projects_own_keeps_the_initialization_skipped() -> None:
    rows = torch.Generator().manual_seed(7)
    with skipping_init() as log:
        model = torch.nn.Linear(4, 4)
        torch.randperm(10, generator=rows)
        torch.empty(3).uniform_(generator=rows)
    assert log.settled == [] and {id(p) for p in log.parameters} == {id(model.weight), id(model.bias)}


def test_a_seed_the_mode_cannot_see_is_said() -> None:
    with skipping_init() as log:
        torch.nn.Linear(4, 4)
        torch.default_generator.manual_seed(3)  # a Generator's own method: no torch function mode sees it
    assert log.settled == [] and log.unseen_draw
    assert any("where vram-bench does not look" in note for note in settled_notes(log, "resume"))
    with skipping_init() as quiet:
        torch.nn.Linear(4, 4)
    assert not quiet.unseen_draw and settled_notes(quiet, "resume") == []


def test_the_note_names_the_draw_the_place_and_the_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    import copy

    with skipping_init() as log:
        model = torch.nn.Linear(4, 4)
        copy.deepcopy(model)  # an EMA's copy: a use, usual and quick, so not said
        torch.nn.Linear(4, 4)
        torch.randperm(10)
    (note,) = settled_notes(log, "resume")
    assert "(torch.randperm at test_init_skipping_draws.py:" in note and "4 calls" in note
    assert "from a torch.Generator of their own, and a resume skips that work" in note
    with skipping_init() as used:
        copy.deepcopy(torch.nn.Linear(4, 4))
    assert settled_notes(used, "rebuild") == []
    monkeypatch.setattr(init_skipping, "SAID_USE_SECONDS", 0.0)  # a slow one is said: it is why the resume took long
    (slow,) = settled_notes(used, "rebuild")
    # deepcopy's `self.data.clone()`: the clone reads the values (`.data` alone hands out an alias)
    assert slow.startswith("setup() reads the values of parameters it built (Tensor.clone at test_init_skipping_draws")


SPLIT_AFTER_THE_MODEL = """\
import torch
from torch.utils.data import random_split


def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    x = torch.randn(256, 8)  # data made after the model, and split at random: as many trainers do
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(256, 1)
    train, _ = random_split(range(256), [192, 64])
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.05),
            "x": x[train.indices], "y": y[train.indices]}


def step(state, bench):
    rows = torch.randint(0, state["x"].shape[0], (16,))
    loss = torch.nn.functional.mse_loss(state["model"](state["x"][rows]), state["y"][rows])
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    return loss
"""


def test_a_resumed_run_that_splits_its_data_after_the_model_trains_on_the_first_runs_split(tmp_path: Path) -> None:
    root = make_project(tmp_path, {"train.py": SPLIT_AFTER_THE_MODEL}, folder="straight")
    for folder in ("first", "second"):
        shutil.copytree(root, tmp_path / folder)
    straight = losses(finished(root / "train.py", "--max-steps", "10").events)
    taken = snapshot_at(tmp_path / "first" / "train.py", 4)
    resumed = finished(tmp_path / "second" / "train.py", "--resume", taken["path"], "--max-steps", "10")
    event = next(e for e in resumed.events if e["event"] == "resume")
    assert event["ok"] and event["initialized"] == [], event
    assert any("random generator after building its model (torch.randn at train.py:8)" in n for n in event["notes"])
    after = losses(resumed.events)
    assert sorted(after) == list(range(5, 11))
    assert {k: after[k] for k in after} == {k: straight[k] for k in after}, "the resumed run trains on the same rows"


def test_a_rebuild_of_a_project_that_splits_its_data_after_the_model_keeps_the_first_runs_split(tmp_path: Path) -> None:
    root = make_project(tmp_path, {"train.py": SPLIT_AFTER_THE_MODEL}, folder="straight")
    shutil.copytree(root, tmp_path / "rebuilt")
    straight = losses(finished(root / "train.py", "--max-steps", "10").events)
    rebuilt, run = rebuilt_at(tmp_path / "rebuilt" / "train.py", 4, 10)
    assert rebuilt["ok"] and any("the initialization a rebuild skips ran first" in n for n in rebuilt["notes"]), rebuilt
    after = losses(run.events)
    assert {k: after[k] for k in range(5, 11)} == {k: straight[k] for k in range(5, 11)}


class WhatTheWorkerSees(torch.utils.data.Dataset):
    """Each item: whether the worker process finds a skipping log for its thread, and the calls it owes."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        import threading

        log = init_skipping._recorders.get(threading.get_ident())
        return torch.tensor([log is not None, len(log.owed) if log else 0])


def test_a_loader_worker_forked_during_setup_initializes_nothing() -> None:
    """`iter(loader)` in setup() forks the workers while initialization is skipped; the forking thread lives on in
    each with the same id, so the worker's own `torch.manual_seed` made the owed calls run there: the whole model
    initialized in every worker (its pages copied), for nothing."""
    with skipping_init() as log:
        torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
        rows = torch.Generator().manual_seed(0)  # the loader's seed: no draw in this process
        seen = next(iter(DataLoader(WhatTheWorkerSees(), batch_size=4, num_workers=2, generator=rows, shuffle=True)))
    assert seen.tolist() == [[0, 0]] * 4, "the worker found the setup thread's log"
    assert len(log.owed) == 4 and log.settled == [], "nothing drew in this process"


def skipping_against_plain(build):  # type: ignore[no-untyped-def]
    """(plain, skipping, log): `build()`'s result plainly and with skipping, both from seed 0."""
    torch.manual_seed(0)
    plain = build()
    torch.manual_seed(0)
    with skipping_init() as log:
        skipping = build()
    return plain, skipping, log


def skipped_then_replayed(build, parameters: int):  # type: ignore[no-untyped-def]
    """(plain, skipping): nothing ran while `build()` made its `parameters` deferred parameters, and replayed they
    hold a plain build's values, bit for bit."""
    plain, model, log = skipping_against_plain(build)
    assert log.settled == [] and len(log.parameters) == parameters, "nothing ran while the model was built"
    log.replay_all()
    for name, value in model.state_dict().items():
        assert torch.equal(value, plain.state_dict()[name]), name
    return plain, model


def test_an_unseen_seed_is_said_even_when_a_seen_draw_follows() -> None:
    def build() -> torch.Tensor:
        torch.nn.Linear(4, 4)
        torch.default_generator.manual_seed(1)  # not seen
        return torch.randn(3)  # seen: the owed calls run, after the seed

    plain, skipping, log = skipping_against_plain(build)
    assert not torch.equal(plain, skipping) and log.unseen_draw, "the draws differ, and that is said"


def test_a_generator_given_by_place_to_an_initializer_is_the_one_owed() -> None:
    rows = torch.Generator()

    def build() -> tuple[torch.Tensor, torch.nn.Linear]:
        rows.manual_seed(5)
        layer = torch.nn.Linear(4, 4)
        torch.nn.init.normal_(layer.weight, 0.0, 0.02, rows)
        return torch.randn(3, generator=rows), layer

    (plain, plain_layer), (skipping, layer), log = skipping_against_plain(build)
    assert torch.equal(plain, skipping)
    log.replay_all()
    assert torch.equal(layer.weight, plain_layer.weight)


def test_a_parameter_converted_there_and_back_is_rounded_as_a_plain_setups_was() -> None:
    def build() -> torch.nn.Sequential:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(torch.bfloat16)
        model[1].float()  # a head kept in fp32: its values went through bf16
        return model

    plain, model, log = skipping_against_plain(build)
    log.replay_all()
    for name, value in model.state_dict().items():
        assert value.dtype == plain.state_dict()[name].dtype and torch.equal(value, plain.state_dict()[name]), name


def test_a_layer_that_fills_its_own_parameters_at_random_stays_skipped() -> None:
    """nn.MultiheadAttention fills `in_proj_weight` with `Tensor.uniform_` (its `xavier_uniform_`, bound at import)."""
    def build() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.MultiheadAttention(16, 2))

    plain, model, log = skipping_against_plain(build)
    assert log.settled == [] and len(log.parameters) == 6, "nothing ran while the model was built"
    assert model[0].weight.data_ptr() != model[1].in_proj_weight.data_ptr() and log.settled == [], "no value read"
    log.replay_all()
    for name, value in model.state_dict().items():
        assert torch.equal(value, plain.state_dict()[name]), name


def test_draws_are_taken_for_the_devices_they_are_made_on() -> None:
    with skipping_init() as log:
        torch.nn.Linear(4, 4)  # owes the CPU generator
        with torch.device("meta"):
            torch.randn(3)  # the default device is meta: no CPU draw
        torch.cuda.manual_seed_all(1)  # CUDA's generators: nothing owed there
    assert log.settled == [] and len(log.owed) == 2
    with skipping_init() as read:
        torch.nn.Linear(4, 4)
        torch.get_rng_state()
    (note,) = settled_notes(read, "resume")
    assert "(2 calls," in note and "from a torch.Generator of their own" in note, "a read: no advice to seed"


def test_modules_that_convert_by_swapping_tensors_convert_in_a_skipping_setup() -> None:
    """`torch.utils.swap_tensors` refuses a tensor with weak references, which the log held: `.to()` raised."""
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        plain, model, log = skipping_against_plain(lambda: torch.nn.Linear(4, 4).to(torch.float64))
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    assert model.weight.dtype == torch.float64 and len(log.parameters) == 2
    log.replay_all()
    assert torch.equal(model.weight, plain.weight) and torch.equal(model.bias, plain.bias)


def test_an_embeddings_padding_row_is_written_after_its_initialization_and_reads_through_views_are_uses() -> None:
    """nn.Embedding(padding_idx=...) zeroes its row through a view (`weight[idx].fill_(0)`): a write, deferred after
    the initialization, not a read that runs everything built before it."""
    plain, model, log = skipping_against_plain(
        lambda: torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Embedding(10, 16, padding_idx=0))
    )
    assert log.settled == [] and len(log.parameters) == 3, "the padding row's write ran nothing"
    log.replay_all()
    assert torch.equal(model[1].weight, plain[1].weight) and not model[1].weight[0].any()
    (plain_read, read, viewed) = skipping_against_plain(lambda: torch.nn.Linear(16, 16).weight[2].sum())
    assert torch.equal(read, plain_read) and [s.reason for s in viewed.settled] == ["Tensor.sum"]

    def zero_a_copy() -> torch.nn.Linear:
        layer = torch.nn.Linear(4, 4)
        with torch.no_grad():
            layer.weight[torch.tensor([0, 1])].fill_(0)  # advanced indexing copies: the parameter stays as made
        return layer

    plain_layer, layer, _ = skipping_against_plain(zero_a_copy)
    assert torch.equal(layer.weight, plain_layer.weight) and layer.weight[:2].any()
    with skipping_init() as kept:
        embedding = torch.nn.Embedding(10, 4)
        row = embedding.weight[3]  # kept past setup(), where nothing watches its reads
    assert kept.parameters == [] and row.abs().sum() > 0, "a view kept is made at the end"


_CAPTURED = {"normal_": torch.nn.init.normal_, "zeros_": torch.nn.init.zeros_}  # a library's, taken at its import


class _Library:
    """A library's own initializers, named as torch's (transformers' `initialization` module)."""

    @staticmethod
    def normal_(tensor: torch.Tensor, mean: float = 0.0, std: float = 1.0,  # type: ignore[no-untyped-def]
                generator=None):
        return _CAPTURED["normal_"](tensor, mean=mean, std=std, generator=generator)

    @staticmethod
    def zeros_(tensor: torch.Tensor):  # type: ignore[no-untyped-def]
        return _CAPTURED["zeros_"](tensor)


class _LibraryModel(torch.nn.Module):
    """As transformers' `PreTrainedModel` builds: torch.nn.init's functions are the library's own while it builds
    (`guard_torch_init_functions`), and its `_init_weights` calls the originals it took at import. Their calls
    reach torch.nn.init's dispatch with the tensor by keyword and the library's function as the one called."""

    def __init__(self) -> None:
        super().__init__()
        saved = torch.nn.init.normal_, torch.nn.init.zeros_
        torch.nn.init.normal_, torch.nn.init.zeros_ = _Library.normal_, _Library.zeros_
        try:
            self.wte = torch.nn.Embedding(32, 8)
            self.proj = torch.nn.Linear(8, 8)
            self.head = torch.nn.Linear(8, 32, bias=False)
            self.head.weight = self.wte.weight  # tied, as GPT-2's head is
            for module in self.modules():
                if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                    _CAPTURED["normal_"](module.weight, mean=0.0, std=0.02)
                if isinstance(module, torch.nn.Linear) and module.bias is not None:
                    _CAPTURED["zeros_"](module.bias)
        finally:
            torch.nn.init.normal_, torch.nn.init.zeros_ = saved


def test_a_librarys_own_initializers_put_in_torchs_place_are_skipped_too() -> None:
    """A transformers model built from its config ran its whole initialization in a resume's setup(), and the notes
    blamed a draw "after building its model" at the library's own line."""
    _, model = skipped_then_replayed(_LibraryModel, 2)  # the bias is zeroed, not deferred: a whole write
    assert model.head.weight is model.wte.weight
    torch.manual_seed(0)
    _LibraryModel()
    plain_next = torch.rand(4)
    torch.manual_seed(0)
    with skipping_init() as drawn:
        _LibraryModel()
        next_draw = torch.rand(4)
    assert torch.equal(next_draw, plain_next) and [s.reason for s in drawn.settled] == ["torch.rand"]


def test_a_draw_made_inside_an_installed_package_is_placed_at_the_projects_line(tmp_path: Path) -> None:
    """The note's place is the line the project can move: where it called the package, not the package's own."""
    package = tmp_path / "site-packages" / "drawing_library.py"
    package.parent.mkdir()
    package.write_text("import torch\n\ndef noise():\n    return torch.randn(3)\n")
    spec = importlib.util.spec_from_file_location("drawing_library", package)
    assert spec is not None and spec.loader is not None
    library = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(library)
    with skipping_init() as log:
        torch.nn.Linear(4, 4)
        library.noise(); line = inspect.currentframe().f_lineno  # type: ignore[union-attr]  # noqa: E702
    assert [(s.reason, s.where) for s in log.settled] == [("torch.randn", f"{Path(__file__).name}:{line}")]


def _truncated_normal_(tensor: torch.Tensor, std: float = 1.0, a: float = -2.0, b: float = 2.0) -> torch.Tensor:
    """timm's and DeiT's `trunc_normal_` (copied into many projects): a random fill, then arithmetic in place."""
    def cdf(x: float) -> float:
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    with torch.no_grad():
        low, high = cdf(a / std), cdf(b / std)
        tensor.uniform_(2 * low - 1, 2 * high - 1)
        tensor.erfinv_()
        tensor.mul_(std * math.sqrt(2.0))
        tensor.add_(0.0)
        tensor.clamp_(min=a, max=b)
    return tensor


class _VisionTransformerish(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.position = torch.nn.Parameter(torch.zeros(1, 5, 8))
        self.blocks = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
        _truncated_normal_(self.position, std=0.02)
        for module in self.blocks:
            if isinstance(module, torch.nn.Linear):
                _truncated_normal_(module.weight, std=0.02)
                torch.nn.init.zeros_(module.bias)


def test_an_initializer_that_fills_at_random_then_works_on_the_values_in_place_stays_skipped() -> None:
    """Its `erfinv_()` read the values it had just filled: every owed call ran, the whole model's initialization."""
    skipped_then_replayed(_VisionTransformerish, 5)
    (plain_sum, summed, read) = skipping_against_plain(lambda: _VisionTransformerish().position.sum())
    assert torch.equal(summed, plain_sum) and [s.reason for s in read.settled] == ["Tensor.sum"], "a read still runs it"

    def scale_by_a_tensor() -> torch.Tensor:
        with torch.no_grad():
            return torch.nn.Linear(4, 4).weight.mul_(torch.tensor(2.0))

    scaled_by_a_tensor = skipping_against_plain(scale_by_a_tensor)[2]
    assert [s.reason for s in scaled_by_a_tensor.settled] == ["Tensor.mul_"], "a tensor argument is a use"


class _TransformersFourStyle(torch.nn.Module):
    """transformers 4's `_init_weights`, and the many models written after it: through `.data`."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(12, 8, padding_idx=0)
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        self.apply(self._init_weights)

    def _init_weights(self, module: torch.nn.Module) -> None:
        if isinstance(module, torch.nn.Linear):
            module.weight.data.normal_(mean=0.0, std=0.02)
            module.bias.data.zero_()
        elif isinstance(module, torch.nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=0.02)
            module.weight.data[module.padding_idx].zero_()
        elif isinstance(module, torch.nn.LayerNorm):
            module.bias.data.zero_()
            module.weight.data.fill_(1.0)


def test_initialization_written_through_data_stays_skipped_and_a_read_through_data_is_a_use() -> None:
    _, model = skipped_then_replayed(_TransformersFourStyle, 5)
    assert not model.embedding.weight[0].any(), "the padding row, zeroed after the draw"

    def shape_then_sum() -> torch.Tensor:
        values = torch.nn.Linear(4, 4).weight.data
        assert values.shape == (4, 4)
        return values.sum()

    plain_sum, summed, read = skipping_against_plain(shape_then_sum)
    assert torch.equal(summed, plain_sum) and [s.reason for s in read.settled] == ["Tensor.sum"], read.settled


def test_a_copy_through_data_replaces_the_deferred_value_and_keeps_its_draws_owed() -> None:
    pretrained = torch.full((4, 4), 0.5)

    def load_then_draw() -> tuple[torch.nn.Linear, torch.Tensor]:
        layer = torch.nn.Linear(4, 4)
        layer.weight.data.copy_(pretrained)
        return layer, torch.rand(3)

    (plain, plain_draw), (layer, draw), log = skipping_against_plain(load_then_draw)
    assert torch.equal(layer.weight, pretrained) and torch.equal(draw, plain_draw)
    assert [(s.reason, s.calls) for s in log.settled] == [("torch.rand", 2)], "the draws ran, not the weight's init"
    log.replay_all()
    assert torch.equal(layer.weight, pretrained) and torch.equal(layer.bias, plain.bias)


def test_a_write_that_would_raise_or_that_another_tensor_would_see_is_not_deferred() -> None:
    """Deferred, a leaf's in-place write outside no_grad passed where a fresh start raised (a rebuild took code a
    fresh start refuses), an integer parameter's `div_` raised at a later line, and a slice of a flat buffer, filled
    and scaled, left the buffer unwritten when setup() read it."""
    def scale_a_leaf() -> None:
        torch.nn.Linear(4, 4).weight.mul_(0.5)

    def halve_integers() -> None:
        counts = torch.nn.Parameter(torch.zeros(4, dtype=torch.int64), requires_grad=False)
        with torch.no_grad():
            counts.random_(0, 10)
            counts.div_(2.5)

    for setup in (scale_a_leaf, halve_integers):
        with pytest.raises(RuntimeError) as plain:
            setup()
        with skipping_init(), pytest.raises(RuntimeError) as skipping:
            setup()
        assert str(skipping.value) == str(plain.value), setup.__name__

    def fill_a_slice_of_a_buffer() -> torch.Tensor:
        flat = torch.zeros(8)
        part = torch.nn.Parameter(flat[:4])
        with torch.no_grad():
            part.uniform_(-1, 1)
            part.mul_(2.0)
        return flat.sum()

    plain_sum, summed, _ = skipping_against_plain(fill_a_slice_of_a_buffer)
    assert torch.equal(summed, plain_sum) and plain_sum != 0


def test_a_move_to_where_the_model_already_is_keeps_its_initialization_deferred() -> None:
    """`Net().to(bench.device)` on a CPU session: `Module._apply` sets `p.data = p` (the move hands back the parameter
    itself), which read as a use and ran every owed call: init skipping was off for the usual `setup()`."""
    def build() -> torch.nn.Module:
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
        return model.to("cpu").to(torch.device("cpu")).to(torch.float32).float().cpu()

    skipped_then_replayed(build, 4)
    (plain_sum, moved_then_read, read) = skipping_against_plain(lambda: build()[0].weight.sum())
    assert [s.reason for s in read.settled] == ["Tensor.sum"], "a read after the move still runs what is owed"
    assert torch.equal(moved_then_read, plain_sum), "and reads a plain build's values"
