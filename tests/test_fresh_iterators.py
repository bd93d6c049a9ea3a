"""A resume says that the iterators setup() made start from their beginning, and which put-back globals they set
again (found porting pytorch/examples' dcgan: its epoch loop as a generator with `global epoch`)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import is_event, make_project, open_session, snapshot_after
from workbench.engine.fresh_iterators import fresh_iterator_notes

PROJECT = """\
import torch

epoch = 0
model = torch.nn.Linear(2, 1)


def batches():
    global epoch
    for epoch in range(100):
        for i in range(3):
            yield torch.full((1, 2), float(i))


def setup(bench):
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01), "batches": batches()}


def step(state, bench):
    loss = state["model"](next(state["batches"])).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return {"loss": loss, "epoch": float(epoch)}
"""


def test_a_resume_says_the_generator_starts_over_and_sets_the_put_back_epoch_again(tmp_path: Path) -> None:
    snapshot = snapshot_after(tmp_path, PROJECT, 7)
    root = make_project(tmp_path, {"train.py": PROJECT}, folder="second")
    with open_session(root / "train.py", resume=snapshot, max_steps=8, exit_at_max_steps=False) as live:
        resumed = live.wait_for(is_event("resume"), timeout=30)
        assert "put back from the snapshot (module globals that training changed, not setup()): train.epoch = 2" \
            in resumed.notes, resumed.notes
        assert any(n.startswith("state['batches'] (the generator batches(), train.py:7): the one setup() just made, "
                                "so it starts from its beginning, not where step 7 left it") for n in resumed.notes), resumed.notes
        assert any(n.startswith("train.epoch put back from the snapshot, but state['batches'] sets it again when it "
                                "starts (batches() assigns it)") for n in resumed.notes), resumed.notes
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        (step,) = live.events.of("step")
        assert step.scalars["epoch"] == 0.0, "what the note says: the generator set the epoch to 0 at its first next()"


def test_no_note_for_a_state_without_iterators_and_none_on_globals_a_generator_does_not_set() -> None:
    def draws():
        while True:
            yield 1

    with open(__file__) as log:  # an open file is an iterator too, but not where data was read from
        assert fresh_iterator_notes({"model": object(), "data": [1, 2], "log": log}, 5, ["train.epoch"],
                                    lambda path: None) == ()
    notes = fresh_iterator_notes({"data": draws()}, 5, ["test_fresh_iterators.epoch"], lambda path: None)
    assert len(notes) == 1 and notes[0].startswith("state['data'] (the generator "), notes
    assert "one that draws at random goes on from the restored RNG states" in notes[0]


class Trainer:
    """minGPT's shape: the trainer keeps its loader and the iterator it reads from."""

    def __init__(self, workers: int) -> None:
        import torch

        self.train_loader = torch.utils.data.DataLoader(list(range(64)), batch_size=4, shuffle=True,
                                                        num_workers=workers)
        self.data_iter = iter(self.train_loader)


def test_an_iterator_inside_an_object_of_the_state_is_named_and_one_with_workers_reads_a_fresh_starts_batches() -> None:
    """minGPT's Trainer, ported: `state['trainer'].data_iter` went unnamed (only the state's top was looked at), and
    the resumed run read a fresh start's first batches again; with workers, the order was drawn as setup() made the
    iterator, so "goes on from the restored RNG states" would not be true."""
    alone = Trainer(workers=0)
    notes = fresh_iterator_notes({"trainer": alone}, 5, [], lambda path: None)
    assert len(notes) == 1 and notes[0].startswith("state['trainer'].data_iter (a _SingleProcessDataLoaderIter): the "
                                                   "one setup() just made, so it starts from its beginning"), notes
    assert "one that draws at random goes on from the restored RNG states" in notes[0]

    with_workers = Trainer(workers=1)
    try:
        notes = fresh_iterator_notes({"trainer": with_workers}, 5, [], lambda path: None, rebuild=True)
    finally:
        del with_workers.data_iter  # its worker ends with it
    assert len(notes) == 1, notes
    assert notes[0].startswith("state['trainer'].data_iter (a _MultiProcessingDataLoaderIter): the one the new "
                               "setup() made, so it starts from its beginning, not where step 5 left it, in the order "
                               "drawn as setup() made it"), notes
    assert "it reads again the batches a fresh start reads first" in notes[0]
    assert "goes on from the carried RNG states" not in notes[0]


class Rows:
    """An iterator of the project's own whose place is a plain counter: kept and put back (training_globals.py)."""

    def __init__(self) -> None:
        self.pos = 0

    def __iter__(self) -> "Rows":
        return self

    def __next__(self) -> int:
        self.pos += 1
        return self.pos


def test_an_iterator_whose_own_counters_were_put_back_is_not_said_to_start_over() -> None:
    """A review's finding: `state['rows'].pos` put back by the resume, and the note still said it started over."""
    notes = fresh_iterator_notes({"rows": Rows()}, 5, ["state['rows'].pos"], lambda path: None)
    assert notes == (), notes
    notes = fresh_iterator_notes({"rows": Rows()}, 5, [], lambda path: None)
    assert len(notes) == 1 and notes[0].startswith("state['rows'] (a Rows): the one setup() just made"), notes


SCRIPT_LOADER = """\
import torch
from torch.utils.data import DataLoader

torch.manual_seed(0)
model = torch.nn.Linear(1, 1)


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        return torch.rand(1)  # a random crop's draw, as an enwik8 dataset's random start is


def cycle(loader):
    while True:
        for row in loader:
            yield row


batches = cycle(DataLoader(Rows(), batch_size=2, shuffle=True GENERATOR))


def setup(bench):
    return {"model": model}


def step(state, bench):
    return {"loss": float(next(batches).sum())}
"""


def _losses_after(tmp_path: Path, source: str, folder: str) -> tuple[list[float], list[float], tuple[str, ...]]:
    """The straight run's losses of steps 4-6, the run resumed from its step 3's snapshot, and the resume's notes."""
    snapshot = snapshot_after(tmp_path, source, 3, folder=f"{folder}-snap")
    straight_root = make_project(tmp_path, {"train.py": source}, folder=f"{folder}-straight")
    with open_session(straight_root / "train.py", max_steps=6, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        straight = [e.loss for e in live.events.of("step")][3:]
    root = make_project(tmp_path, {"train.py": source}, folder=f"{folder}-resumed")
    with open_session(root / "train.py", resume=snapshot, max_steps=6, exit_at_max_steps=False) as live:
        notes = live.wait_for(is_event("resume"), timeout=30).notes
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        resumed = [e.loss for e in live.events.of("step")]
    return straight, resumed, notes


def test_a_generator_a_script_made_at_import_is_named_and_its_loaders_seed_draw_said(tmp_path: Path) -> None:
    """An x-transformers trainer, ported: `train_loader = cycle(DataLoader(...))` at the top of the script; every step
    after a resume differed from the run that never stopped (the loader's new iterator drew its seed and its shuffle
    from the global generator after the resume put it back), and the resume's notes were empty."""
    straight, resumed, notes = _losses_after(tmp_path, SCRIPT_LOADER.replace(" GENERATOR", ""), "global")
    said = [n for n in notes if n.startswith("train.batches (the generator cycle(), train.py:")
            and "the one the import just made, so it starts from its beginning" in n]
    assert said and "draws its seed and its shuffled order from the global random generator" in said[0], notes
    assert "give the DataLoader a generator of its own" in said[0], notes
    assert resumed != straight, "what the note says: the draws after the resume are not the run's"
    # With a generator of its own the loader draws from it: the dataset's own draws go on as in the run.
    straight, resumed, notes = _losses_after(
        tmp_path, SCRIPT_LOADER.replace(" GENERATOR", ", generator=torch.Generator().manual_seed(0)"), "own")
    assert not any("draws its seed" in n for n in notes), notes
    assert any(n.startswith("train.batches (the generator cycle()") for n in notes), notes
    assert resumed == straight


def test_a_loader_whose_sampler_draws_no_order_from_the_global_generator_is_said_to_draw_only_its_seed(
        tmp_path: Path) -> None:
    """A DistributedSampler's order comes from its seed and epoch: the note said the loader's new iterator drew "its
    seed (a shuffling sampler's order too)" from the global generator (a transformers port under DDP)."""
    source = SCRIPT_LOADER.replace("shuffle=True GENERATOR",
                                   "sampler=torch.utils.data.DistributedSampler(Rows(), num_replicas=1, rank=0, seed=0)")
    _, _, notes = _losses_after(tmp_path, source, "distributed")
    said = [n for n in notes if n.startswith("train.batches (the generator cycle(), train.py:")]
    assert said and "whose new iterator draws its seed from the global random generator" in said[0], notes
    assert "order" not in said[0].split("from the global random generator")[0], said


MADE_INSIDE = """\
import torch
from torch.utils.data import DataLoader

torch.manual_seed(0)


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        return torch.full((1,), float(i))


def batches():
    loader = DataLoader(Rows(), batch_size=2, shuffle=True GENERATOR)
    for epoch in range(100):
        for row in loader:
            yield row


def setup(bench):
    return {"model": torch.nn.Linear(1, 1), "batches": batches()}


def step(state, bench):
    next(state["batches"])
    return {"loss": float(torch.rand(()))}  # a dropout's draw, after the loader's
"""


def test_a_loader_made_in_a_generators_body_is_said_to_draw_from_the_restored_global_generator(tmp_path: Path) -> None:
    """README's porting advice (`for epoch ...: for batch in loader: yield`) with the loader made inside the generator:
    its first `next()` after a resume makes it, drawing its shuffle from the global generator, so every later random
    draw differed from the run that never stopped, and the resume's note said only that it starts over."""
    straight, resumed, notes = _losses_after(tmp_path, MADE_INSIDE.replace(" GENERATOR", ""), "inside")
    said = [n for n in notes if n.startswith("state['batches'] (the generator batches(), train.py:15)")]
    assert said and "it reads the DataLoader it makes (train.py:16), whose new iterator draws its seed" in said[0], notes
    assert "give the DataLoader a generator of its own" in said[0], notes
    assert resumed != straight
    # With a generator of its own, the order starts over (as said) and the step's own draws go on as in the run.
    straight, resumed, notes = _losses_after(tmp_path, MADE_INSIDE.replace(" GENERATOR", ", generator=torch.Generator()"),
                                             "inside-own")
    assert not any("draws its seed" in n for n in notes), notes
    assert resumed == straight, "the step's own draws are the run's"
