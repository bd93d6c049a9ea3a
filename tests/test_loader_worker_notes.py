"""A save of code that DataLoader workers run says which workers keep the old code, until when, and what starts new ones.

Found porting karpathy/makemore: its `InfiniteDataLoader` (a plain class in a module global, made at import) holds a
DataLoader with workers and one iterator over a sampler of 1e10 samples. An edit of `CharDataset.__getitem__` was
reported applied with no note, while the workers ran the old code for the rest of the session. Each test checks the
note against what the steps read afterwards (every batch carries the version of `__getitem__` that made it).
"""

from __future__ import annotations

import gc
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import Live, line_of, make_project, open_session
from test_real_shaped_projects import edit, next_steps, rebuild, reload_of, rollback, said, wait_gone, worker_pids

DATASET = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, RandomSampler


class Words(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        version = 1.0
        return torch.full((4,), float(index % 7)), torch.tensor(version)


class InfiniteDataLoader:
    """makemore's: one iterator, over a sampler that never ends."""

    def __init__(self, dataset, **kwargs):
        sampler = RandomSampler(dataset, replacement=True, num_samples=int(1e10))
        self.train_loader = DataLoader(dataset, sampler=sampler, **kwargs)
        self.data_iter = iter(self.train_loader)

    def next(self):
        return next(self.data_iter)


torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
'''

STEP = '''
def step(state, bench):
    x, version = next_batch(state)
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return {"loss": loss, "data_version": float(version.mean())}
'''

MADE_AT_IMPORT = DATASET + '''
batch_loader = InfiniteDataLoader(Words(), batch_size=8, num_workers=1)


def setup(bench):
    return {"model": model, "optimizer": optimizer}


def next_batch(state):
    return batch_loader.next()
''' + STEP

MADE_BY_SETUP = DATASET + '''
batch_loader = None


def setup(bench):
    global batch_loader
    batch_loader = InfiniteDataLoader(Words(), batch_size=8, num_workers=1)
    return {"model": model, "optimizer": optimizer}


def next_batch(state):
    return batch_loader.next()
''' + STEP

EPOCHS_IN_STATE = DATASET + '''
def setup(bench):
    loader = DataLoader(Words(), batch_size=4, shuffle=True, num_workers=1)
    return {"model": model, "optimizer": optimizer, "loader": loader, "batches": iter(loader)}


def next_batch(state):
    try:
        return next(state["batches"])
    except StopIteration:
        state["batches"] = iter(state["loader"])
        return next(state["batches"])
''' + STEP

DATASET_EDIT = ("version = 1.0", "version = 2.0")


@pytest.fixture
def session_of(tmp_path: Path, one_torch_thread: None) -> Iterator:
    """Opens a one-file project; at the end, shuts down the workers a module global's iterator still holds (the
    module is unloaded with the session, and its globals may outlive it in a reference cycle) and checks they exit."""
    others = worker_pids()
    opened: list[Live] = []

    def open_one(source: str):
        root = make_project(tmp_path, {"train.py": source})
        live_cm = open_session(root / "train.py")
        live = live_cm.__enter__()
        opened.append((live, live_cm))
        return root, live

    open_one.others = others  # the child processes this test process had before: not the sessions' workers
    yield open_one
    for live, live_cm in opened:
        loader = live.session.worker.project.modules()
        for module in loader.values():
            feed = vars(module).get("batch_loader")
            if feed is not None:
                feed.data_iter._shutdown_workers()
            persistent = getattr(vars(module).get("train_loader"), "_iterator", None)
            if persistent is not None:
                persistent._shutdown_workers()  # a persistent loader in a reference cycle (PERSISTENT_AT_IMPORT)
        state = live.session.worker.user_state
        if isinstance(state, dict):
            batches = state.pop("batches", None)
            if hasattr(batches, "_shutdown_workers"):
                batches._shutdown_workers()  # now, not when a collection finds it (a full suite's gc may be late)
        live_cm.__exit__(None, None, None)
    gc.collect()
    assert not wait_gone(worker_pids(others)), "the loaders' worker processes outlived the test"


def test_an_endless_loader_made_at_import_keeps_the_old_code_until_r_runs_its_line_again(session_of) -> None:
    line = line_of(MADE_AT_IMPORT, "batch_loader = InfiniteDataLoader")
    root, live = session_of(MADE_AT_IMPORT)
    live.wait_running(2)
    first_workers = worker_pids(session_of.others)
    assert len(first_workers) == 1, first_workers
    edit(root / "train.py", DATASET_EDIT)
    reload = reload_of(live, "train.py")
    assert reload.ok and reload.changed == ("Words.__getitem__",), reload
    assert said(reload, "train.batch_loader.train_loader", "Words.__getitem__", "1 worker process forked before this save",
                "for the rest of the session", "train.batch_loader is made at import, not by setup()",
                f"press R (command `rebuild`), which runs line {line}: `batch_loader = InfiniteDataLoader(Words(), "), reload.notes
    assert all(step.scalars["data_version"] == 1.0 for step in next_steps(live, 4)), "the workers run the old code"

    # As said: R runs the line again; the new iterator's workers run the new code, the old ones are shut down.
    rebuilt = rebuild(live)
    assert said(rebuilt, "ran again what train.py builds at import", f"line {line}: `batch_loader = "), rebuilt.notes
    assert all(step.scalars["data_version"] == 2.0 for step in next_steps(live, 3))
    assert not wait_gone(first_workers), "the old iterator's workers were shut down"
    assert len(worker_pids(session_of.others)) == 1

    # A rollback: the workers forked after the save keep its code, said the right way round; R starts new ones again.
    rolled = rollback(live, "train.py")
    assert said(rolled, "train.batch_loader.train_loader", "forked before this rollback", "keeps the rolled-back code",
                f"which runs line {line}: `batch_loader = ", "to start new workers with the live code"), rolled.notes
    assert next_steps(live, 2)[-1].scalars["data_version"] == 2.0
    rebuild(live)
    assert all(step.scalars["data_version"] == 1.0 for step in next_steps(live, 3))

    # The next R has no reason to make it again: its workers run the code on disk.
    workers = worker_pids(session_of.others)
    rebuilt = rebuild(live)
    assert not said(rebuilt, "batch_loader"), rebuilt.notes
    assert worker_pids(session_of.others) == workers


NO_STATEMENT_MAKES_IT = MADE_AT_IMPORT.replace(
    "batch_loader = InfiniteDataLoader(Words(), batch_size=8, num_workers=1)\n",
    "def make_loader():\n    global batch_loader\n    batch_loader = InfiniteDataLoader(Words(), batch_size=8, num_workers=1)\n\n\n"
    "make_loader()\n")


@pytest.mark.parametrize("source, said_of_r, after_r", [
    (NO_STATEMENT_MAKES_IT, ("R (command `rebuild`) does not start new ones", "no statement at the top of the file makes it"),
     1.0),
    (MADE_BY_SETUP, ("press R (command `rebuild`) to start new workers",), 2.0),
], ids=["no-statement-makes-it", "setup-makes-it"])
def test_what_the_note_says_of_r_is_what_r_does(session_of, source: str, said_of_r: tuple[str, ...], after_r: float) -> None:
    """A global no top-level statement makes (a function binds it at import): R cannot make it again, and says so. A
    global setup() makes (`global batch_loader`): setup() makes it again, and R says it starts new workers."""
    root, live = session_of(source)
    live.wait_running(2)
    edit(root / "train.py", DATASET_EDIT)
    reload = reload_of(live, "train.py")
    assert said(reload, "train.batch_loader.train_loader", "Words.__getitem__", "for the rest of the session", *said_of_r), \
        reload.notes
    assert all(step.scalars["data_version"] == 1.0 for step in next_steps(live, 2))
    rebuild(live)
    assert all(step.scalars["data_version"] == after_r for step in next_steps(live, 3)), "as said"


def test_an_epoch_running_now_says_how_many_of_its_batches_keep_the_old_code(session_of) -> None:
    root, live = session_of(EPOCHS_IN_STATE)
    live.wait_running(1)
    edit(root / "train.py", DATASET_EDIT)
    reload = reload_of(live, "train.py")
    notes = [note for note in reload.notes if "worker process" in note]
    assert len(notes) == 1, reload.notes
    assert "state['loader'] runs Words.__getitem__ in 1 worker process forked before this save" in notes[0], notes
    left = re.search(r"until its epoch ends, (\d+) of its 16 batches from now", notes[0])
    assert left is not None, notes
    steps = next_steps(live, 17)  # the rest of this epoch, then the next one's
    old = [step for step in steps if step.scalars["data_version"] == 1.0]
    assert len(old) == int(left.group(1)), (len(old), notes[0])
    assert steps[-1].scalars["data_version"] == 2.0, "the next epoch's workers run the new code"


@pytest.mark.parametrize("reading", ["for", "yield from"])
def test_the_epoch_a_generator_is_reading_says_how_many_of_its_batches_keep_the_old_code(tmp_path: Path, reading: str) -> None:
    """A generator's `for batch in loader` holds its iterator on its frame's stack, and `yield from loader` as what it
    delegates to: not among its locals. The note said only what holds either way ("until it ends"), where it says
    how much of the running epoch keeps the old code when it can see the iterator (pytorch-cifar's port)."""
    import types

    from torch.utils.data import DataLoader

    from workbench.engine.hotswap.loader_workers import LoaderRoot, worker_notes

    module = types.ModuleType("train")
    exec(compile(DATASET, str(tmp_path / "train.py"), "exec"), module.__dict__)
    loader = DataLoader(module.Words(), batch_size=8, num_workers=1)

    def batches():
        for batch in loader:
            yield batch

    def delegating():
        yield from loader

    running = batches() if reading == "for" else delegating()
    next(running)
    try:
        notes = worker_notes([LoaderRoot("state['batches']", running, True)], ["Words.__getitem__"], module).notes
        total = len(loader)
        assert notes == [f"state['batches']'s loader runs Words.__getitem__ in 1 worker process forked before this save, "
                         f"when its epoch began: it keeps the old code until its epoch ends, {total - 1} of its {total} "
                         "batches from now (the next epoch's workers start with the new code); press R (command "
                         "`rebuild`) to start new workers with the new code"], notes
        assert worker_notes([LoaderRoot("state", running, True)], ["InfiniteDataLoader.next"], module).notes == []
    finally:
        running.close()


LOOKED_AT_BADLY = DATASET + '''
class Touchy:
    """A library object that raises when looked at (a proxy, a handle whose state is gone)."""

    @property
    def __dict__(self):
        raise RuntimeError("the handle is closed")


handle = Touchy()


def setup(bench):
    return {"model": model, "optimizer": optimizer}


def next_batch(state):
    return Words()[0][0].unsqueeze(0), Words()[0][1]
''' + STEP


def test_a_global_that_raises_when_looked_at_costs_the_note_not_the_session(session_of) -> None:
    """The walk for loaders runs on the training thread after the change is applied, through every module global: an
    object that raised there ended the session as an internal error, and the applied change had no event."""
    root, live = session_of(LOOKED_AT_BADLY)
    live.wait_running(2)
    edit(root / "train.py", DATASET_EDIT)
    reload = reload_of(live, "train.py")
    assert reload.ok and reload.changed == ("Words.__getitem__",), reload
    assert said(reload, "could not tell whether DataLoader workers still run the code before this save",
                "RuntimeError: the handle is closed"), reload.notes
    assert next_steps(live, 2)[-1].scalars["data_version"] == 2.0, "the session trains on, with the new code"


def test_a_rollback_says_nothing_of_workers_forked_before_the_save_it_undoes(session_of) -> None:
    """makemore's endless loader, forked at import: a save of its dataset's code, then u with no R between. The
    workers have the code the rollback makes live again, yet the note said they kept the rolled-back code for the
    rest of the session, and the next R restarted them for it (found reviewing)."""
    root, live = session_of(MADE_AT_IMPORT)
    live.wait_running(2)
    workers = worker_pids(session_of.others)
    edit(root / "train.py", DATASET_EDIT)
    assert said(reload_of(live, "train.py"), "1 worker process forked before this save")
    rolled = rollback(live, "train.py")
    assert not said(rolled, "worker process"), rolled.notes
    assert all(step.scalars["data_version"] == 1.0 for step in next_steps(live, 3)), "the live code, as the workers have"
    rebuilt = rebuild(live)
    assert not said(rebuilt, "batch_loader"), rebuilt.notes
    assert worker_pids(session_of.others) == workers, "R had no reason to restart them"


PERSISTENT_AT_IMPORT = DATASET + '''
train_loader = DataLoader(Words(), batch_size=8, num_workers=1, persistent_workers=True)
train_loader.me = train_loader  # a reference cycle: only a collection would free the old loader and its workers


def batches():
    while True:
        yield from train_loader


def setup(bench):
    return {"model": model, "optimizer": optimizer, "batches": batches()}


def next_batch(state):
    return next(state["batches"])
''' + STEP


def test_r_shuts_down_the_old_persistent_workers_of_a_loader_made_at_import_now(session_of) -> None:
    """`train_loader = DataLoader(..., persistent_workers=True)` at import: R runs its line again, and the old loader's
    workers (its private `_iterator`) were left to whenever a collection freed it (found reviewing)."""
    root, live = session_of(PERSISTENT_AT_IMPORT)
    live.wait_running(2)
    first_workers = worker_pids(session_of.others)
    assert len(first_workers) == 1, first_workers
    edit(root / "train.py", DATASET_EDIT)
    assert said(reload_of(live, "train.py"), "train.train_loader", "persistent")
    rebuild(live)
    assert all(step.scalars["data_version"] == 2.0 for step in next_steps(live, 3))
    assert not wait_gone(first_workers, timeout=5.0), "the old workers were shut down by R, not left to a collection"


def test_a_save_whose_loaders_have_no_workers_parses_no_file_on_the_training_thread(session_of, monkeypatch) -> None:
    """Which statement made a global (for R's note) is found by parsing its file, at a step boundary: only a global
    that holds workers needs it, and every code-changing save of a project without any paid for all its files."""
    from workbench.engine.commands import reload as reload_command

    parsed: list[Path] = []
    real = reload_command.builders_by_name
    monkeypatch.setattr(reload_command, "builders_by_name", lambda source, path: parsed.append(path) or real(source, path))
    root, live = session_of(LOOKED_AT_BADLY.replace("handle = Touchy()", "handle = None"))
    live.wait_running(2)
    edit(root / "train.py", DATASET_EDIT)
    reload = reload_of(live, "train.py")
    assert reload.ok and not said(reload, "worker"), reload.notes
    assert parsed == []  # a global that holds workers still gets its line named (the tests above)
