"""A loader wrapped as accelerate's `prepare` wraps it: the place it is given back holds, or the notes say what not.

accelerate's `DataLoaderShard` (with `use_stateful_dataloader=True`) wraps a StatefulDataLoader it makes, passes
attribute reads on to it, and answers `isinstance(..., DataLoader)` as it does. Three things went wrong on a
transformers + accelerate trainer: the inner loader's `state_dict()`, called in the wrapper's constructor, made an
iterator, so a resume said "setup() already made an iterator of it" and started the data over; the first iterator
made after the place was given drew a base seed (dropout's draws one behind the run that never stopped); and with
accelerate's default sampler (torch's RandomSampler, which draws each epoch's order as it begins) the place it keeps
is a count of batches into a new order, yet the notes said the batch after the snapshot's comes next.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import is_event, make_project, open_session, snapshot_after
from tests.test_loader_places import PROJECT as LOADER_PROJECT
from tests.test_loader_places import batches_read, resumed_after, straight_run
from workbench.engine.loader_places import LOADER

pytest.importorskip("torchdata.stateful_dataloader")
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")

PROJECT = """\
import torch
from torch.utils.data import BatchSampler, RandomSampler
from torchdata.stateful_dataloader import StatefulDataLoader


class EpochSeeded(RandomSampler):
    \"\"\"accelerate's SeedableRandomSampler, in brief: each epoch's order from a seed and the epoch.\"\"\"

    def __init__(self, data):
        super().__init__(data)
        self.epoch = 0

    def __iter__(self):
        self.generator = torch.Generator().manual_seed(1234 + self.epoch)
        yield from super().__iter__()
        self.epoch += 1


class Wrapped:
    \"\"\"accelerate's DataLoaderAdapter, in brief.\"\"\"

    def __init__(self, base):
        self.base_dataloader = base
        self.dl_state_dict = base.state_dict()  # makes the inner loader's first iterator

    def __getattr__(self, name):
        if name == "base_dataloader":
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    @property
    def __class__(self):
        return self.base_dataloader.__class__

    def state_dict(self):
        return self.dl_state_dict

    def load_state_dict(self, state):
        self.base_dataloader.load_state_dict(state)

    def __iter__(self):
        for batch in self.base_dataloader:
            self.dl_state_dict = self.base_dataloader.state_dict()
            yield batch


class Counted(Wrapped):
    \"\"\"accelerate's DataLoaderShard, in brief: it counts its epochs and sets its sampler's as each begins.\"\"\"

    def __init__(self, base):
        super().__init__(base)
        self.iteration = 0

    def set_epoch(self, epoch):
        self.iteration = epoch
        self.base_dataloader.batch_sampler.sampler.epoch = epoch

    def __iter__(self):
        self.set_epoch(self.iteration)
        yield from super().__iter__()
        self.iteration += 1


WORKERS = 0
model = torch.nn.Linear(1, 1)


def batches(loader):
    while True:
        for batch in loader:
            yield batch


def setup(bench):
    torch.manual_seed(0)
    data = list(range(10))
    loader = Wrapped(StatefulDataLoader(data, batch_sampler=BatchSampler(SAMPLER(data), batch_size=2, drop_last=False),
                                        num_workers=WORKERS))
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01), "batches": batches(loader)}


""" + LOADER_PROJECT[LOADER_PROJECT.index("def step("):].replace(  # its batch (`a`, `b`) and a draw (`r`)
    '"b": float(batch[1])}', '"b": float(batch[1]), "r": float(torch.rand(()))}')
SEEDED = PROJECT.replace("SAMPLER(data)", "EpochSeeded(data)")
COUNTED = SEEDED.replace("loader = Wrapped(", "loader = Counted(")
RESHUFFLED = PROJECT.replace("SAMPLER(data)", "RandomSampler(data)")


def test_a_wrapped_loader_whose_sampler_orders_each_epoch_alike_goes_on_from_its_place(tmp_path: Path) -> None:
    straight = straight_run(tmp_path, SEEDED, 13)
    resumed, after = resumed_after(tmp_path, SEEDED, 3, 13)  # epoch 0 of 5 batches, into epoch 1 and 2
    assert after == {k: straight[k] for k in range(4, 14)}, "the batches, and the draws (`r`), of the run"
    assert resumed.notes[0] == ("batches(loader): given back the place step 3 had left it at (state_dict()), so the "
                                "batch after the snapshot's comes next"), resumed.notes
    assert not any("already made an iterator" in note for note in resumed.notes), resumed.notes


def test_a_wrapped_loaders_sampler_whose_epoch_started_over_is_named_after_the_first_resumed_step(
    tmp_path: Path,
) -> None:
    """Its epoch count is its own (accelerate keeps it in the wrapper), so a resume in epoch 1 reads epoch 0's order
    from the right place: said, as for a DistributedSampler's set_epoch() count."""
    snapshot = snapshot_after(tmp_path, SEEDED, 7)
    root = make_project(tmp_path, {"train.py": SEEDED}, folder="second")
    with open_session(root / "train.py", resume=snapshot, max_steps=8, exit_at_max_steps=False) as live:
        warning = live.wait_for(is_event("error", where=LOADER), timeout=60)
    assert "batches(loader)'s sampler is at epoch 0, where step 7 was in epoch 1" in warning.message, warning.message


@pytest.mark.parametrize("workers", [0, 2])
def test_a_wrapped_loader_whose_sampler_draws_each_epochs_order_anew_is_said_to_go_on_in_another_order(
    tmp_path: Path, workers: int,
) -> None:
    """With workers the place is kept in another form (a snapshot of the main process's), the count in it."""
    source = RESHUFFLED.replace("WORKERS = 0", f"WORKERS = {workers}")
    resumed, after = resumed_after(tmp_path, source, 7, 13)
    assert sorted(after) == list(range(8, 14))
    (note,) = [note for note in resumed.notes if note.startswith("batches(loader)")]
    assert note.startswith("batches(loader) (its RandomSampler): given back how far into its epoch it was at step 7 "
                           "(state_dict() keeps a count of batches), not the order"), note
    assert "use_seedable_sampler=True" in note and "the random draws after it (dropout) need not be the run's" in note
    assert any("goes on from how far into its epoch step 7 left it (in another order: see its note)" in note
               for note in resumed.notes), resumed.notes
    assert not any("comes next" in note for note in resumed.notes), resumed.notes


def test_a_rebuild_of_a_wrapped_loader_says_what_it_carried(tmp_path: Path) -> None:
    from workbench.protocol.events import Rebuild, StepOnce

    straight = straight_run(tmp_path, SEEDED, 11)
    for source, folder, at in ((SEEDED, "seeded", 3), (RESHUFFLED, "reshuffled", 3), (SEEDED, "next_epoch", 7)):
        root = make_project(tmp_path, {"train.py": source}, folder=folder)
        with open_session(root / "train.py", max_steps=at, exit_at_max_steps=False) as live:
            live.wait_for(is_event("paused", reason="max steps"), timeout=60)
            live.send(Rebuild())
            rebuilt = live.wait_for(is_event("rebuild"), timeout=60)
            assert rebuilt.ok, rebuilt
            live.send(StepOnce())
            live.wait_for(is_event("step", step=at + 1), timeout=30)
            if folder == "next_epoch":  # epoch 1's second batch: the new sampler counts from epoch 0
                warning = live.wait_for(is_event("error", where=LOADER), timeout=30)
                assert warning.message.startswith("after the rebuild, batches(loader)'s sampler is at epoch 0, where "
                                                  "step 7 was in epoch 1"), warning.message
                continue
            for k in range(at + 2, 12):
                live.send(StepOnce())
                live.wait_for(is_event("step", step=k), timeout=30)
            read = batches_read(live)
        if source is SEEDED:
            assert any(n.startswith("batches(loader): carried over the place the old loader had reached")
                       for n in rebuilt.notes), rebuilt.notes
            assert read == {k: straight[k] for k in read}, "the batches and draws of a run without the rebuild"
        else:
            assert any(n.startswith("batches(loader) (its RandomSampler): carried over how far into its epoch the old "
                                    "loader was") for n in rebuilt.notes), rebuilt.notes
            assert not any("comes next" in n for n in rebuilt.notes), rebuilt.notes


def test_a_plain_stateful_loader_given_a_random_sampler_is_said_to_go_on_in_another_order(tmp_path: Path) -> None:
    """torchdata keeps the order of the sampler it makes for shuffle=True, not of torch's RandomSampler given as
    `sampler=`: its place is a count into an order drawn again, and the batches after it were the run's no more."""
    wrapped = ("Wrapped(StatefulDataLoader(data, batch_sampler=BatchSampler(RandomSampler(data), batch_size=2, "
               "drop_last=False),")
    source = RESHUFFLED.replace(wrapped, "(StatefulDataLoader(data, sampler=RandomSampler(data), batch_size=2,")
    assert "sampler=RandomSampler(data), batch_size=2," in source
    straight = straight_run(tmp_path, source, 13)
    resumed, after = resumed_after(tmp_path, source, 7, 13)
    assert [after[k][:2] for k in range(8, 11)] != [straight[k][:2] for k in range(8, 11)], "another order"
    assert any(note.startswith("batches(loader) (its RandomSampler): given back how far into its epoch it was at "
                               "step 7") for note in resumed.notes), resumed.notes
    assert not any("comes next" in note for note in resumed.notes), resumed.notes


def test_at_an_epochs_end_the_next_epoch_is_the_runs_and_nothing_is_said_of_it(tmp_path: Path) -> None:
    """Placed after its epoch's last batch, a loader's next batch begins the next epoch, drawn as the run drew it:
    its sampler's epoch one on is right, and no batch of an order drawn again is left to speak of."""
    from workbench.protocol.events import Rebuild, StepOnce

    straight = straight_run(tmp_path, SEEDED, 8)
    for source, folder in ((SEEDED, "seeded"), (RESHUFFLED, "reshuffled")):
        root = make_project(tmp_path, {"train.py": source}, folder=folder)
        with open_session(root / "train.py", max_steps=5, exit_at_max_steps=False) as live:  # 5 batches an epoch
            live.wait_for(is_event("paused", reason="max steps"), timeout=60)
            live.send(Rebuild())
            rebuilt = live.wait_for(is_event("rebuild"), timeout=60)
            assert rebuilt.ok and not any("(its RandomSampler)" in n for n in rebuilt.notes), rebuilt.notes
            for k in (6, 7, 8):
                live.send(StepOnce())
                live.wait_for(is_event("step", step=k), timeout=30)
            read = batches_read(live)
            warnings = [e for e in live.events.of("error") if e.where == LOADER]
        assert warnings == [], warnings
        if source is SEEDED:
            assert read == {k: straight[k] for k in read}, "the next epoch, as the run read it"


def test_a_wrapped_loader_that_counts_its_own_epochs_is_set_back_to_the_epoch_it_was_in(tmp_path: Path) -> None:
    """accelerate's loader sets its sampler's epoch from a count of its own as each epoch begins, a count a fresh
    loader begins at 0: a resume or rebuild in a later epoch read that epoch's place in epoch 0's order. Its count is
    set back (`set_epoch()`), so the epoch goes on in its own order, and the next ones in theirs."""
    from workbench.protocol.events import Rebuild, StepOnce

    assert "loader = Counted(" in COUNTED
    straight = straight_run(tmp_path, COUNTED, 13)
    resumed, after = resumed_after(tmp_path, COUNTED, 7, 13)  # epoch 1 of 5 batches, into epoch 2
    assert after == {k: straight[k] for k in range(8, 14)}, "the batches and the draws of the run"
    assert "batches(loader): its own epoch count set back to 1 (set_epoch()), where its sampler's order was" in (
        resumed.notes), resumed.notes
    root = make_project(tmp_path, {"train.py": COUNTED}, folder="rebuilt")
    with open_session(root / "train.py", max_steps=7, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        live.send(Rebuild())
        rebuilt = live.wait_for(is_event("rebuild"), timeout=60)
        for k in range(8, 14):
            live.send(StepOnce())
            live.wait_for(is_event("step", step=k), timeout=30)
        read = batches_read(live)
        warnings = [e for e in live.events.of("error") if e.where == LOADER]
    assert rebuilt.ok and any("its own epoch count set back to 1" in n for n in rebuilt.notes), rebuilt.notes
    assert read == {k: straight[k] for k in read} and warnings == [], warnings
