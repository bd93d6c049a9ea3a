"""A stateful data loader (torchdata's StatefulDataLoader) goes on from its place after a resume and a rebuild.

The proof is differential: the batches a resumed run reads after the snapshot's step are the ones a run that never
stopped read at the same steps (workbench/engine/loader_places.py).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import is_event, make_project, open_session, save, snapshot_after
from tests.test_distributed import rank_log, steps_of
from tests.test_headless import Headless
from workbench.engine.actions.plain_data_dcp import read_metadata
from workbench.engine.actions.sharded_snapshot import read_loader_places
from workbench.engine.loader_places import (
    carry_places,
    find_loaders,
    loaders_read_by,
    pack,
    places,
    put_back,
    record,
    unpack,
)

pytest.importorskip("torchdata.stateful_dataloader")
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")

PROJECT = """\
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

WORKERS = 0
model = torch.nn.Linear(1, 1)


def batches(loader):
    for epoch in range(1000):
        for batch in loader:
            yield batch


def setup(bench):
    torch.manual_seed(0)
    loader = StatefulDataLoader(list(range(10)), batch_size=2, shuffle=True, num_workers=WORKERS)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01), "batches": batches(loader)}


def step(state, bench):
    batch = next(state["batches"])
    loss = state["model"](batch.float()[:, None] / 10).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return {"loss": loss, "a": float(batch[0]), "b": float(batch[1])}
"""


def batches_read(live: Any) -> dict[int, tuple[float, ...]]:
    """Each step's batch (`a`, `b`), and `r` where the project draws it from the global random state."""
    return {e.step: tuple(e.scalars[name] for name in ("a", "b", "r") if name in e.scalars) for e in live.events.of("step")}


def straight_run(tmp_path: Path, source: str, steps: int) -> dict[int, tuple[float, float]]:
    root = make_project(tmp_path, {"train.py": source}, folder="straight")
    with open_session(root / "train.py", max_steps=steps, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        return batches_read(live)


def resumed_after(tmp_path: Path, source: str, snapshot_at: int, until: int) -> tuple[Any, dict[int, tuple[float, float]]]:
    """Train `source` to `snapshot_at`, snapshot, then resume a fresh session from it up to `until`: its `resume` event
    and the batches it read."""
    snapshot = snapshot_after(tmp_path, source, snapshot_at)
    root = make_project(tmp_path, {"train.py": source}, folder="second")
    with open_session(root / "train.py", resume=snapshot, max_steps=until, exit_at_max_steps=False) as live:
        resumed = live.wait_for(is_event("resume"), timeout=60)
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        return resumed, batches_read(live)


def rebuilt_at(tmp_path: Path, source: str, at: int, until: int) -> tuple[Any, dict[int, tuple[float, ...]]]:
    """Train `source` to step `at`, rebuild with no change (its place said carried), then step to `until`: the
    `rebuild` event and the batches read."""
    from workbench.protocol.events import Rebuild, StepOnce

    root = make_project(tmp_path, {"train.py": source}, folder="rebuilt")
    with open_session(root / "train.py", max_steps=at, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        live.send(Rebuild())
        rebuilt = live.wait_for(is_event("rebuild"), timeout=60)
        assert rebuilt.ok, rebuilt
        assert any(n.startswith("batches(loader): carried over the place the old loader had reached")
                   for n in rebuilt.notes), rebuilt.notes
        for k in range(at + 1, until + 1):
            live.send(StepOnce())
            live.wait_for(is_event("step", step=k), timeout=30)
        return rebuilt, batches_read(live)


OWN_GENERATOR = ("num_workers=WORKERS)", "num_workers=WORKERS, generator=torch.Generator())")


@pytest.mark.parametrize("own_generator", [False, True], ids=["sampler's", "generator="])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_run_reads_the_batches_a_run_that_never_stopped_read(tmp_path: Path, workers: int,
                                                                        own_generator: bool) -> None:
    """And draws what it drew (`r`, dropout's kind of draw): the fresh loader's first iterator drew a base seed of
    its own from the global random state, one draw the run that never stopped did not make there. With a
    `generator=` of the loader's own, the epoch after the snapshot's had the order of the run's first (the fresh
    generator's, put back after the first iterator was made)."""
    source = PROJECT.replace("WORKERS = 0", f"WORKERS = {workers}").replace(
        '"b": float(batch[1])}', '"b": float(batch[1]), "r": float(torch.rand(()))}')
    if own_generator:
        source = source.replace(*OWN_GENERATOR)
    straight = straight_run(tmp_path, source, 13)
    resumed, after = resumed_after(tmp_path, source, 7, 13)  # epoch 1 of 5 batches, its second batch
    assert sorted(after) == list(range(8, 14)) and len(after[8]) == 3
    assert after == {k: straight[k] for k in range(8, 14)}, "the batches after the snapshot (an epoch's end included)"
    assert resumed.notes[0] == ("batches(loader): given back the place step 7 had left it at (state_dict()), so the "
                                "batch after the snapshot's comes next"), resumed.notes
    assert any(n.startswith("state['batches'] (the generator batches(), train.py:8): the one setup() just made, so its "
                            "own variables (epoch, batch) start over, while the loader it "
                            "reads, batches(loader), goes on from where step 7 left it") for n in resumed.notes), resumed.notes
    assert not any("starts from its beginning, not where step 7 left it" in n for n in resumed.notes), resumed.notes
    said = [n for n in resumed.notes if "worker processes start from their seeds again" in n]
    assert len(said) == (1 if workers else 0), resumed.notes


NOISY = PROJECT.replace("WORKERS = 0\n", """WORKERS = 2


class Noisy(torch.utils.data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.tensor([float(i), float(torch.rand(()))])  # a random augmentation's kind of draw
""").replace("StatefulDataLoader(list(range(10)),", "StatefulDataLoader(Noisy(),").replace(
    "state[\"model\"](batch.float()[:, None] / 10)", "state[\"model\"](batch[:, :1] / 10)").replace(
    '"a": float(batch[0]), "b": float(batch[1])}', '"a": float(batch[0, 0]), "b": float(batch[1, 0]), '
    '"r": float(batch[0, 1])}')


def test_workers_random_draws_after_a_place_inside_an_epoch_are_not_the_runs_and_the_note_says_so(tmp_path: Path) -> None:
    """pytorch-cifar's port: random crops and flips in 2 workers, a StatefulDataLoader resumed mid-epoch. The
    samples after the snapshot were the run's, their augmentations were not, and the note said only that the
    batch after the snapshot's comes next."""
    assert "Noisy()" in NOISY and '"r": float(batch[0, 1])' in NOISY
    straight = straight_run(tmp_path, NOISY, 13)
    resumed, after = resumed_after(tmp_path, NOISY, 7, 13)  # epoch 1 of 5 batches, its second: 3 batches left
    assert [after[k][:2] for k in range(8, 11)] == [straight[k][:2] for k in range(8, 11)], "the samples are the run's"
    assert all(after[k][2] != straight[k][2] for k in range(8, 11)), "their random draws are not"
    assert all(after[k] == straight[k] for k in range(11, 14)), "the next epoch's workers draw as the run's did"
    assert ("batches(loader): its worker processes start from their seeds again inside the epoch, so random draws in "
            "the dataset's code (a random crop or flip) for the rest of this epoch are not the run's: the place keeps "
            "which samples come next, not the workers' random states; the next epoch's draw as the run's did") in resumed.notes, \
        resumed.notes


def test_without_a_stateful_loader_the_data_starts_over_as_the_notes_say(tmp_path: Path) -> None:
    source = PROJECT.replace("from torchdata.stateful_dataloader import StatefulDataLoader",
                             "from torch.utils.data import DataLoader as StatefulDataLoader")
    straight = straight_run(tmp_path, source, 9)
    resumed, after = resumed_after(tmp_path, source, 7, 9)
    assert any("starts from its beginning, not where step 7 left it" in n
               and "whose new iterator draws its seed and its shuffled order from the global random" in n
               and "or read a torchdata StatefulDataLoader, whose place goes on" in n for n in resumed.notes), resumed.notes
    assert after[8] != straight[8] or after[9] != straight[9], "a plain DataLoader starts its epoch over"


@pytest.mark.parametrize("own_generator", [False, True], ids=["sampler's", "generator="])
def test_a_rebuild_carries_the_loaders_place_to_the_loader_setup_makes_again(tmp_path: Path, own_generator: bool) -> None:
    """Into the next epoch too (the loader's state holds its sampler's random state; a `generator=` of its own is
    carried beside it), and training's draws (`r`) go on as in a run without the rebuild: setup()'s
    `torch.manual_seed(0)` does not begin them again, nor does the new loader's first iterator draw."""
    source = PROJECT.replace('"b": float(batch[1])}', '"b": float(batch[1]), "r": float(torch.rand(()))}')
    if own_generator:
        source = source.replace(*OWN_GENERATOR)
    straight = straight_run(tmp_path, source, 15)
    rebuilt, read = rebuilt_at(tmp_path, source, 7, 15)  # past the epoch's end, into the next epoch's order
    assert any(n.startswith("state['batches'] (the generator batches(), train.py:") and "while the loader it reads, "
               "batches(loader), goes on from where step 7 left it" in n for n in rebuilt.notes), rebuilt.notes
    assert sorted(read) == list(range(1, 16)) and len(read[8]) == 3
    assert read == {k: straight[k] for k in read}, "the batches after the rebuild are the ones of a run without it"


AT_IMPORT = PROJECT.replace("model = torch.nn.Linear(1, 1)\n", "model = torch.nn.Linear(1, 1)\ntorch.manual_seed(0)\n"
                             "LOADER = StatefulDataLoader(list(range(10)), batch_size=2, shuffle=True, "
                             "num_workers=WORKERS)\n").replace(
    "    torch.manual_seed(0)\n    loader = StatefulDataLoader(list(range(10)), batch_size=2, shuffle=True, "
    "num_workers=WORKERS)\n", "").replace('"batches": batches(loader)}', '"batches": batches(LOADER)}')


@pytest.mark.parametrize("reading", ["for", "yield from"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_rebuild_keeps_the_place_of_a_loader_made_at_import_that_a_new_generator_reads(
        tmp_path: Path, reading: str, workers: int) -> None:
    """pytorch-cifar's port: `trainloader = StatefulDataLoader(...)` at import, `batches(trainloader)` in setup(). R
    with no change closed the old generator, the new one's iter() started a new epoch, and the note said the place
    was kept (`a rebuild with no change trains as the run that never stopped`): 15 of 15 later steps differed."""
    source = AT_IMPORT.replace("WORKERS = 0", f"WORKERS = {workers}")
    assert "LOADER = StatefulDataLoader" in source and "batches(LOADER)" in source
    if reading == "yield from":
        source = source.replace("        for batch in loader:\n            yield batch\n", "        yield from loader\n")
    straight = straight_run(tmp_path, source, 12)
    rebuilt, read = rebuilt_at(tmp_path, source, 3, 12)  # the rest of the epoch, then the next one's order
    said = [n for n in rebuilt.notes if "worker processes start from their seeds again inside the epoch" in n]
    assert len(said) == (1 if workers else 0), rebuilt.notes
    assert read == {k: straight[k] for k in read}, "the batches after the rebuild are the ones of a run without it"


def loader_of(data: list[int], seed: int = 0) -> StatefulDataLoader:
    torch.manual_seed(seed)
    return StatefulDataLoader(data, batch_size=2, shuffle=True)


def test_what_cannot_take_its_place_is_named_with_why() -> None:
    used = loader_of(list(range(10)))
    iterator = iter(used)
    next(iterator)
    saved = {"world_size": 1, "ranks": {0: record({"loader": used})}}

    made_iterator = loader_of(list(range(10)))
    iter(made_iterator)
    done = put_back({"loader": made_iterator}, saved, 0, 1, 1)
    assert done.placed == {} and done.notes == [
        "loader (StatefulDataLoader) starts from its beginning: setup() already made an iterator of it, which the "
        "snapshot's place cannot go into; iterate the loader in a generator or in step() instead"]

    done = put_back({"loader": loader_of(list(range(10)))}, saved, 1, 2, 1)
    assert done.placed == {} and "are for 1 ranks' shares of the data, and this run has 2" in done.notes[0]

    done = put_back({"loader": loader_of(list(range(10)))}, None, 0, 1, 1)
    assert "written before vram-bench kept them" in done.notes[0]

    done = put_back({"other": loader_of(list(range(10)))}, saved, 0, 1, 1)
    assert done.notes == ["other (StatefulDataLoader) starts from its beginning: the snapshot holds no place for it",
                          "the snapshot holds the place of loader(s) setup() did not make: loader (not used)"]


def test_a_rebuild_says_a_loader_setup_already_iterated_starts_over_as_a_resume_does() -> None:
    """A rebuild whose setup() made an iterator of its new loader gave it no place, and said nothing (a resume
    said it): the data went back to its first batches unannounced (minGPT's Trainer, ported)."""
    used = loader_of(list(range(10)))
    iterator = iter(used)
    next(iterator), next(iterator)
    made_again = loader_of(list(range(10)))
    iter(made_again)
    done = carry_places({"trainer.train_loader": used}, {"trainer.train_loader": made_again})
    assert done.placed == {} and done.notes == [
        "trainer.train_loader (StatefulDataLoader) starts from its beginning: setup() already made an iterator of it, "
        "which the old one's place cannot go into; iterate the loader in a generator or in step() instead"]


def test_a_sampler_epoch_that_started_over_is_named_after_the_first_resumed_step() -> None:
    from torch.utils.data.distributed import DistributedSampler

    def loader_and_sampler() -> tuple[StatefulDataLoader, DistributedSampler]:
        sampler = DistributedSampler(list(range(24)), num_replicas=2, rank=0, seed=3)
        return StatefulDataLoader(list(range(24)), batch_size=2, sampler=sampler), sampler

    trained, sampler = loader_and_sampler()
    sampler.set_epoch(3)
    iterator = iter(trained)
    next(iterator), next(iterator)
    saved = {"world_size": 2, "ranks": {0: record({"batches(loader)": trained})}}
    assert saved["ranks"][0]["epochs"] == {"batches(loader)": 3}

    fresh, fresh_sampler = loader_and_sampler()
    done = put_back({"batches(loader)": fresh}, saved, 0, 2, 40)
    assert list(done.placed.values()) == ["batches(loader)"] and done.epoch_check is not None
    fresh_sampler.set_epoch(0)  # what imagenet's `for epoch in range(args.start_epoch, ...)` does at its start
    assert done.epoch_check.after_step() == (
        "after the resume, batches(loader)'s sampler is at epoch 0, where step 40 was in epoch 3: the loader went on "
        "from its place, but in that epoch's order, so it reads other batches than the run would have. The code that "
        "counts its epochs (set_epoch()'s caller, or the sampler itself) started its count over: keep the epoch in a "
        "module global it reads (`global epoch` ... `epoch += 1`), which snapshots keep")
    fresh_sampler.set_epoch(3)
    assert done.epoch_check.after_step() is None


def test_a_loader_never_iterated_is_not_asked_for_its_state_and_needs_no_place() -> None:
    class Watched(StatefulDataLoader):
        asked = 0

        def state_dict(self):  # noqa: ANN201 - a StatefulDataLoader makes an iterator (starts workers) to answer
            Watched.asked += 1
            return super().state_dict()

    idle = Watched(list(range(4)), batch_size=2)
    kept = record(find_loaders({"test_loader": idle}))
    assert Watched.asked == 0 and kept == {"states": {"test_loader": None}, "errors": {}, "epochs": {}, "large": {},
                                   "generators": {}}
    done = put_back({"test_loader": Watched(list(range(4)), batch_size=2)}, {"world_size": 1, "ranks": {0: kept}}, 0, 1, 3)
    assert done.placed == {} and done.notes == []


def test_loaders_are_found_in_module_globals_and_in_what_a_generator_closes_over() -> None:
    loader = loader_of(list(range(4)))

    def make():
        def batches():
            yield from loader

        return batches()

    class Trainer:
        def __init__(self) -> None:
            self.train_loader = loader_of(list(range(4)))

    found = find_loaders({"batches": make()}, [("train", {"trainer": Trainer(), "plain": [1, 2]})])
    assert list(found) == ["batches(loader)", "train.trainer.train_loader"]

    def epochs(state):  # pytorch/examples' imagenet, ported: the generator reads the loader from the state it is given
        yield from state["train_loader"]

    state = {"train_loader": loader}
    state["batches"] = epochs(state)
    assert loaders_read_by(state["batches"]) == [loader]
    assert list(find_loaders(state)) == ["train_loader"]


DDP_PROJECT = textwrap.dedent(
    """
    import time

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data.distributed import DistributedSampler
    from torchdata.stateful_dataloader import StatefulDataLoader


    epoch = 0  # a module global, so a snapshot keeps it and a resume puts it back (training_globals.py)


    def batches(loader, sampler):
        global epoch
        while True:
            sampler.set_epoch(epoch)  # the order of this epoch; the loader's place is where in it
            yield from loader
            epoch += 1


    def setup(bench):
        torch.manual_seed(0)
        data = list(range(24))
        sampler = DistributedSampler(data, shuffle=True, seed=3)
        loader = StatefulDataLoader(data, batch_size=2, sampler=sampler)
        model = DDP(torch.nn.Linear(1, 1))
        return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01), "batches": batches(loader, sampler)}


    def step(state, bench):
        time.sleep(0.05)  # the test's pause lands a few steps in
        batch = next(state["batches"])
        loss = state["model"](batch.float()[:, None] / 24).pow(2).mean()
        loss.backward()
        state["opt"].step()
        state["opt"].zero_grad()
        bench.log(a=float(batch[0]), b=float(batch[1]))
        return loss
    """
)


def rank_batches(run: Headless) -> dict[int, dict[int, tuple[float, float]]]:
    """Each rank's batches by step: rank 0's from its stream, rank 1's from its own event log."""
    both = {}
    for rank, events in ((0, run.events), (1, rank_log(run))):
        steps = steps_of(events, rank)
        both[rank] = {k: tuple(e["scalars"][name] for name in ("a", "b", "c", "d") if name in e["scalars"])
                      for k, e in steps.items() if "a" in e.get("scalars", {})}
    return both


def two_rank_batches(tmp_path: Path, source: str, *args: str, folder: str) -> tuple[dict[int, dict[int, tuple[float, float]]], Headless]:
    """Run `source` on 2 ranks to its end (`args`: --max-steps, --resume): each rank's batches, and the run."""
    project = tmp_path / folder
    if not project.exists():
        make_project(tmp_path, {"train.py": source}, folder=folder)
    run = Headless(project / "train.py", "--nproc-per-node", "2", *args)
    try:
        assert run.finish(timeout=120) == 0, run.explain()
        return rank_batches(run), run
    finally:
        run.close()


def snapshot_a_few_steps_in(tmp_path: Path, source: str) -> dict[str, Any]:
    """Start `source` on 2 ranks in tmp_path/first, pause a few steps in, snapshot, quit: the snapshot event."""
    project = make_project(tmp_path, {"train.py": source}, folder="first")
    first = Headless(project / "train.py", "--nproc-per-node", "2")
    try:
        first.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 1 and e["step"] >= 3, timeout=90, what="step 3")
        first.send("pause")
        paused = first.wait_event("paused", timeout=30)
        first.send("snapshot")
        taken = first.wait_event("snapshot", timeout=30)
        first.send("quit")
        assert first.finish(timeout=60) == 0
    finally:
        first.close()
    assert taken["step"] == paused["step"] <= 26, (paused, taken)  # the straight runs go to 30
    return taken


# An EMA of the weights with a model's worth of state (over 1 MiB): replicated under DDP, as the weights are.
EMA_CLASS = textwrap.dedent("""
    class WeightEMA:
        def __init__(self, model):
            self.shadow = {"w": model.weight.detach().clone(), "pad": torch.zeros(1 << 19)}

        @torch.no_grad()
        def update(self, model):
            self.shadow["w"].mul_(0.5).add_(model.weight.detach(), alpha=0.5)

        def state_dict(self):
            return self.shadow

        def load_state_dict(self, state):
            self.shadow = {k: v.clone() for k, v in state.items()}


""")
DDP_EMA_PROJECT = DDP_PROJECT.replace("def setup(bench):", EMA_CLASS.lstrip("\n") + "def setup(bench):").replace(
    '"batches": batches(loader, sampler)}', '"batches": batches(loader, sampler),\n            "ema": WeightEMA(model.module)}'
).replace(
    "    bench.log(a=float(batch[0]), b=float(batch[1]))",
    '    state["ema"].update(state["model"].module)\n    bench.log(a=float(batch[0]), b=float(batch[1]), c=float(state["ema"].shadow["w"]))',
)
assert "WeightEMA(model.module)" in DDP_EMA_PROJECT and "c=float" in DDP_EMA_PROJECT


def test_under_torchrun_each_rank_resumes_its_own_loader_from_rank_0s_snapshot(tmp_path: Path) -> None:
    """Each rank's loader place is its own; a project object's model-sized state (an EMA of the weights) is rank 0's,
    as the weights are."""
    straight, _ = two_rank_batches(tmp_path, DDP_EMA_PROJECT, "--max-steps", "30", folder="straight")
    assert straight[0][5] != straight[1][5], "each rank reads its own share"
    taken = snapshot_a_few_steps_in(tmp_path, DDP_EMA_PROJECT)
    saved = torch.load(taken["path"], weights_only=True)["loader_places"]
    assert saved["world_size"] == 2 and set(saved["ranks"]) == {0, 1}, saved
    assert list(saved["large"]) == ["ema"] and all("ema" not in r["states"] for r in saved["ranks"].values()), saved
    at = taken["step"]

    after, again = two_rank_batches(tmp_path, DDP_EMA_PROJECT, "--resume", taken["path"], "--max-steps", "30",
                                    folder="first")
    resumed = next(e for e in again.events if e["event"] == "resume")
    assert resumed["ok"] and resumed["notes"][1].startswith("batches(loader): given back the place"), resumed
    assert resumed["notes"][2] == ("ema (WeightEMA, 2.0 MiB of tensors): load_state_dict() given what state_dict() "
                                   f"held at step {at} (rank 0's, as the models)"), resumed
    assert resumed["notes"][0] == ("put back from the snapshot (module globals that training changed, not "
                                   f"setup()): train.epoch = {(at - 1) // 6}"), resumed
    assert not any("sets it again when it starts" in n for n in resumed["notes"]), "it reads it first"
    for rank in (0, 1):
        assert after[rank] == {k: straight[rank][k] for k in range(at + 1, 31)}, (rank, after[rank], straight[rank])


# Each rank seeded apart (nanoGPT's `1337 + rank`), drawing its batch from the global random state (nanoGPT's
# `get_batch`): no loader whose fresh iterator draws a seed of its own at the first resumed step.
SEEDED_PER_RANK = """\
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(bench):
    torch.manual_seed(100 + bench.rank)
    model = DDP(torch.nn.Linear(1, 1))
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def step(state, bench):
    time.sleep(0.05)  # the test's pause lands a few steps in
    ix = torch.randint(0, 24, (2,))
    loss = state["model"](ix.float()[:, None] / 24).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    bench.log(a=float(ix[0]), b=float(ix[1]))
    return loss
"""
SEEDED_PER_RANK_SHARDED = SEEDED_PER_RANK.replace(
    "from torch.nn.parallel import DistributedDataParallel as DDP", "from torch.distributed.fsdp import fully_shard").replace(
    "    model = DDP(torch.nn.Linear(1, 1))", "    model = torch.nn.Linear(1, 1)\n    fully_shard(model)")
assert "fully_shard(model)" in SEEDED_PER_RANK_SHARDED


@pytest.mark.parametrize("source", [SEEDED_PER_RANK, SEEDED_PER_RANK_SHARDED], ids=["one-file", "sharded"])
def test_under_torchrun_each_rank_resumes_its_own_global_random_states(tmp_path: Path, source: str) -> None:
    """A one-file snapshot kept rank 0's random states, and a resume gave them to every rank: a trainer that seeds
    each rank apart drew rank 0's batches on rank 1 from then on. A sharded snapshot kept none."""
    straight, _ = two_rank_batches(tmp_path, source, "--max-steps", "30", folder="straight")
    assert straight[0][5] != straight[1][5], "each rank draws its own"
    taken = snapshot_a_few_steps_in(tmp_path, source)
    at = taken["step"]
    after, again = two_rank_batches(tmp_path, source, "--resume", taken["path"], "--max-steps", "30", folder="first")
    resumed = next(e for e in again.events if e["event"] == "resume")
    assert resumed["notes"][-1] == (f"the global random states (Python's, torch's, the GPUs') each rank's own at step "
                                    f"{at}, put back"), resumed["notes"]
    for rank in (0, 1):
        assert after[rank] == {k: straight[rank][k] for k in range(at + 1, 31)}, (rank, after[rank], straight[rank])


# The EMA's shadow weight is a DTensor (this rank's shard); its state, over 1 MiB, is each rank's in a sharded snapshot.
SHARDED_PROJECT = DDP_EMA_PROJECT.replace(
    "from torch.nn.parallel import DistributedDataParallel as DDP", "from torch.distributed.fsdp import fully_shard"
).replace(
    "    model = DDP(torch.nn.Linear(1, 1))", "    model = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Linear(4, 1))\n    fully_shard(model)"
).replace("WeightEMA(model.module)", "WeightEMA(model[0])").replace('state["ema"].update(state["model"].module)',
                                                                    'state["ema"].update(state["model"][0])').replace(
    'c=float(state["ema"].shadow["w"])',
    'c=float(state["ema"].shadow["w"].full_tensor().sum()), w=float(state["model"][0].weight.full_tensor().sum())')
# Beside it, a state of each rank's own (over 1 MiB, a plain tensor that differs by rank): written under a key of the
# rank's own, which the same number of ranks takes back and another cannot.
SHARDED_PROJECT = SHARDED_PROJECT.replace("def setup(bench):", textwrap.dedent('''\
    class RankCounter:
        def __init__(self, rank, layer):
            # and a DTensor beside it: under a key of the rank's own, its other shard was missing and DCP refused it
            self.counts = {"x": torch.full(((1 << 18) + 1,), float(rank)), "w": layer.weight.detach().clone()}

        def state_dict(self):
            return self.counts

        def load_state_dict(self, state):
            self.counts = {k: v.clone() for k, v in state.items()}


    def setup(bench):''')).replace('"ema": WeightEMA(model[0])', '"ema": WeightEMA(model[0]), "own": RankCounter(bench.rank, model[0])').replace(
    "    bench.log(a=", '    state["own"].counts["x"].add_(1)\n    bench.log(d=float(state["own"].counts["x"][0]), a=')
assert "fully_shard(model)" in SHARDED_PROJECT and "model[0]" in SHARDED_PROJECT and "full_tensor" in SHARDED_PROJECT
assert "RankCounter(bench.rank, model[0])" in SHARDED_PROJECT and "bench.log(d=" in SHARDED_PROJECT


def test_a_sharded_snapshot_keeps_each_ranks_loader_place_under_a_key_of_its_own(tmp_path: Path) -> None:
    """The EMA's state goes into DCP as tensors (a shard of its DTensor on each rank, its plain tensor once: the
    ranks' are the same), not serialized into the ranks' records, so one rank can take it resharded."""
    straight, _ = two_rank_batches(tmp_path, SHARDED_PROJECT, "--max-steps", "30", folder="straight")
    taken = snapshot_a_few_steps_in(tmp_path, SHARDED_PROJECT)
    assert taken["path"].endswith(".dcp"), taken
    at = taken["step"]
    saved = read_metadata(Path(taken["path"])).state_dict_metadata
    assert tuple(saved["vram-bench/state/ema/0"].size) == (4, 1) and "vram-bench/state/ema/1" in saved, sorted(saved)
    assert "vram-bench/state/rank0/own/0" in saved and "vram-bench/state/rank1/own/0" in saved, sorted(saved)
    assert tuple(saved["vram-bench/state/own/1"].size) == (4, 1), "the DTensor under the shared key, both shards"
    record = read_loader_places(Path(taken["path"]), 1, 2)["ranks"][1]
    assert "large" not in record and record["large_layout"]["ema"]["keys"] == ["vram-bench/state/ema/0", "vram-bench/state/ema/1"], record
    assert straight[1][at][3] == 1 + at and straight[0][at][3] == at, "each rank's count is its own"

    after, again = two_rank_batches(tmp_path, SHARDED_PROJECT, "--resume", taken["path"], "--max-steps", "30",
                                    folder="first")
    resumed = next(e for e in again.events if e["event"] == "resume")
    assert resumed["ok"] and any(n.startswith("batches(loader): given back the place") for n in resumed["notes"]), resumed
    assert ("ema (WeightEMA, 2.0 MiB of tensors), own (RankCounter, 1.0 MiB of tensors): load_state_dict() given what "
            f"state_dict() held at step {at}") in resumed["notes"], resumed
    for rank in (0, 1):
        assert after[rank] == {k: straight[rank][k] for k in range(at + 1, 31)}, (rank, after[rank], straight[rank])

    alone = Headless(tmp_path / "first" / "train.py", "--nproc-per-node", "1", "--resume", taken["path"],
                     "--max-steps", str(at + 1))
    try:
        resumed = alone.wait_event("resume", timeout=90)
        assert resumed["ok"] and any("the snapshot's loader places are for 2 ranks' shares of the data, and this run "
                                     "has 1, so they start from their beginning" in n for n in resumed["notes"]), resumed
        assert (f"ema (WeightEMA, 2.0 MiB of tensors): load_state_dict() given what state_dict() held at step "
                f"{at} (the snapshot is of 2 ranks, this run has 1: torch.distributed.checkpoint read each rank's part)"
                ) in resumed["notes"], resumed
        assert ("own (RankCounter) is as setup() made it: a sharded snapshot keeps each of its 2 ranks' own state where "
                "the ranks' states differed, which another number of ranks cannot take") in resumed["notes"], resumed
        assert alone.finish(timeout=60) == 0, alone.explain()
        first = next(e for e in alone.events if e["event"] == "step" and e["step"] == at + 1)["scalars"]
        # The update is shadow = (shadow + weight) / 2: from the snapshot's shadow, the whole of it on one rank.
        assert first["c"] == pytest.approx((straight[0][at][2] + first["w"]) / 2, rel=1e-5), (first, straight[0][at])
    finally:
        alone.close()


def test_a_trainer_of_the_projects_that_checkpoints_everything_is_walked_into_not_taken_for_a_loader() -> None:
    """A project `Trainer` with its own state_dict() holds the model, the optimizer and the loader: taken for a loader,
    it was refused as a model's state and the loader inside it was never found, so a resume started the data over."""
    model = torch.nn.Linear(1, 1)

    class Trainer:
        def __init__(self) -> None:
            self.model, self.opt = model, torch.optim.SGD(model.parameters(), lr=0.1)
            self.loaders = {"train": loader_of(list(range(4)))}

        def state_dict(self) -> dict:
            return {"model": self.model.state_dict(), "opt": self.opt.state_dict()}

        def load_state_dict(self, state: dict) -> None:
            self.model.load_state_dict(state["model"])

    class Place:
        """A loader of the project's own: it holds data, not a model, and says where it is."""

        def __init__(self) -> None:
            self.tokens, self.position = torch.arange(10), 0

        def state_dict(self) -> dict:
            return {"position": self.position}

        def load_state_dict(self, state: dict) -> None:
            self.position = state["position"]

    Trainer.__module__ = Place.__module__ = "train"  # classes of the project
    found = find_loaders({}, [("train", {"trainer": Trainer(), "feed": Place()})])
    assert list(found) == ["train.trainer.loaders.train", "train.feed"], list(found)


OWN_LOADER = """\
import torch


class DistributedDataLoader:
    \"\"\"llm.c's: walks its tokens in order from a position; given state_dict() and load_state_dict().\"\"\"

    def __init__(self, tokens, batch):
        self.tokens, self.batch = tokens, batch
        self.current_position = 0
        self.cache = torch.zeros(WIDE)  # kept in the state below when STATE_HOLDS_CACHE

    def next_batch(self):
        x = self.tokens[self.current_position:self.current_position + self.batch]
        self.current_position = (self.current_position + self.batch) % (len(self.tokens) - self.batch)
        return x

    def state_dict(self):
        return {"current_position": self.current_position, **({"cache": self.cache} if STATE_HOLDS_CACHE else {})}

    def load_state_dict(self, state):
        self.current_position = state["current_position"]


WIDE = 4
STATE_HOLDS_CACHE = False
model = torch.nn.Linear(1, 1)
train_loader = DistributedDataLoader(torch.arange(100), 3)


def setup(bench):
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def step(state, bench):
    x = train_loader.next_batch()
    loss = state["model"](x.float()[:, None] / 100).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return {"loss": loss, "a": float(x[0]), "b": float(x[1])}
"""


def test_a_loader_of_the_projects_own_with_state_dict_goes_on_from_its_place(tmp_path: Path) -> None:
    """llm.c's DistributedDataLoader (ported) in a module global: a resume read its first batches again. Given
    state_dict() and load_state_dict() (torch.distributed.checkpoint's Stateful protocol), it goes on from its place."""
    straight = straight_run(tmp_path, OWN_LOADER, 10)
    resumed, after = resumed_after(tmp_path, OWN_LOADER, 6, 10)
    assert resumed.notes[0] == ("train.train_loader (DistributedDataLoader): load_state_dict() given what "
                                "state_dict() held at step 6"), resumed.notes
    assert after == {k: straight[k] for k in range(7, 11)}, "the batches after the snapshot's"


def test_a_project_objects_state_that_holds_a_models_worth_of_tensors_is_kept_as_tensors(tmp_path: Path) -> None:
    """More than 1 MiB of tensors is written beside the records (`large`), not serialized into them: kept all the same."""
    source = OWN_LOADER.replace("WIDE = 4", "WIDE = 1 << 19").replace("STATE_HOLDS_CACHE = False", "STATE_HOLDS_CACHE = True")
    straight = straight_run(tmp_path, source, 6)
    snapshot = snapshot_after(tmp_path, source, 4)
    kept = torch.load(snapshot, weights_only=True)["loader_places"]
    assert set(kept["large"]) == {"train.train_loader"} and kept["large"]["train.train_loader"]["cache"].numel() == 1 << 19
    assert "train.train_loader" not in kept["ranks"][0]["states"], "never serialized into the rank's record"
    root = make_project(tmp_path, {"train.py": source}, folder="second")
    with open_session(root / "train.py", resume=snapshot, max_steps=6, exit_at_max_steps=False) as live:
        resumed = live.wait_for(is_event("resume"), timeout=60)
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        after = batches_read(live)
    assert resumed.notes[0] == ("train.train_loader (DistributedDataLoader, 2.0 MiB of tensors): load_state_dict() given "
                                "what state_dict() held at step 4"), resumed.notes
    assert after == {k: straight[k] for k in (5, 6)}, "it went on from its place"


EMA = """\
import torch

WIDTH = 1024


class EMA:
    \"\"\"A hand-written EMA: shadow copies of the weights, no nn.Module.\"\"\"

    def __init__(self, model, decay=0.9):
        self.decay = decay
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters()}

    @torch.no_grad()
    def update(self, model):
        for n, p in model.named_parameters():
            self.shadow[n].mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)

    def state_dict(self):
        return {"decay": self.decay, "shadow": self.shadow}

    def load_state_dict(self, state):
        self.decay = state["decay"]
        self.shadow = {n: t.clone() for n, t in state["shadow"].items()}


def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 8))
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=1e-3), "ema": EMA(model)}


def step(state, bench):
    x = torch.randn(4, 8)
    loss = (state["model"](x) - x).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    state["ema"].update(state["model"])
    return {"loss": loss, "a": float(state["ema"].shadow["0.weight"].sum()), "b": float(state["ema"].shadow["2.bias"][0])}
"""


@pytest.mark.parametrize("width", [16, 1 << 15], ids=["small", "over 1 MiB"])
def test_an_ema_of_the_projects_own_goes_on_from_its_value_not_from_setups(tmp_path: Path, width: int) -> None:
    """An EMA's shadow weights in a project object (state_dict()/load_state_dict(), no nn.Module): a resume gives it
    back what it held, so it averages on as a run that never stopped did. Its note says what was done, not that a
    batch comes next (nothing tells an EMA from a loader)."""
    source = EMA.replace("WIDTH = 1024", f"WIDTH = {width}")
    straight = straight_run(tmp_path, source, 8)
    resumed, after = resumed_after(tmp_path, source, 5, 8)
    assert after == {k: straight[k] for k in (6, 7, 8)}, "the EMA averaged on from its value at the snapshot"
    size = f", {(8 * width * 2 + width + 8) * 4 / 2**20:.1f} MiB of tensors" if width > 1000 else ""
    assert resumed.notes[0] == f"ema (EMA{size}): load_state_dict() given what state_dict() held at step 5", resumed.notes
    assert not any("comes next" in n or "beginning" in n for n in resumed.notes), resumed.notes


class _Opaque:
    """Not plain data: a weights_only load refuses it."""


class _Holder:
    __module__ = "train"

    def __init__(self, value: Any) -> None:
        self.value = value

    def state_dict(self) -> dict[str, Any]:
        return {"big": torch.zeros(1 << 19), "other": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["other"]


def test_a_large_state_that_is_not_plain_data_is_not_kept_and_the_object_is_said_to_be_as_setup_made_it() -> None:
    """Serializing a model's worth at every snapshot to check it would cost a copy: a walk of its types does. A state a
    weights_only load would refuse is named, and left out, so the resume itself never fails on it."""
    holder = _Holder(_Opaque())
    taken = record({"train.holder": holder})
    opaque = f"its state_dict() is not plain data: it holds a {_Opaque.__module__}._Opaque, which a weights_only load refuses"
    assert not taken["large"] and taken["errors"] == {"train.holder": opaque}
    done = put_back({"train.holder": _Holder(1)}, places({0: taken}, 1), rank=0, world_size=1, step=3)
    assert done.notes == [f"train.holder (_Holder) is as setup() made it: its state could not be kept at step 3 ({opaque})"]
    fine = record({"train.holder": _Holder(7)})
    assert list(fine["large"]) == ["train.holder"] and not fine["errors"], fine


class _MetaEMA:
    """Shadow weights on another device than the snapshot's tensors (the CPU): `meta` stands in for a GPU here."""

    __module__ = "train"

    def __init__(self) -> None:
        self.shadow = {"w": torch.empty(1 << 19, device="meta"), "steps": 3}

    def state_dict(self) -> dict[str, Any]:
        return {"shadow": self.shadow}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.shadow = state["shadow"]  # keeps what it is given, as many hand-written EMAs do


def test_a_project_objects_tensors_are_handed_over_on_the_devices_its_own_are_on() -> None:
    """A one-file snapshot loads onto the CPU; an EMA on a GPU that keeps what load_state_dict() is given would fail its
    next update on a device mismatch."""
    saved = places({0: {"states": {}, "errors": {}}}, 1, {"train.ema": {"shadow": {"w": torch.ones(1 << 19), "steps": 9}}})
    ema = _MetaEMA()
    done = put_back({"train.ema": ema}, saved, rank=0, world_size=1, step=9)
    assert done.placed == {id(ema): "train.ema"}, done.notes
    assert ema.shadow["w"].device.type == "meta" and ema.shadow["steps"] == 9


OPAQUE_STATE = """\
import torch


class Opaque:
    pass


class Holder:
    def state_dict(self):
        return {"big": torch.zeros(1 << 19), "other": Opaque()}

    def load_state_dict(self, state):
        pass


holder = Holder()
model = torch.nn.Linear(1, 1)


def setup(bench):
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def step(state, bench):
    loss = state["model"](torch.ones(1, 1)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return loss
"""


def test_the_snapshot_event_names_what_it_does_not_keep(tmp_path: Path) -> None:
    """Not only the resume: the snapshot itself says a state was left out, so it never reads as keeping it all."""
    from workbench.frontends.tui.widgets.reload_log import render_entry
    from workbench.protocol.events import TakeSnapshot

    root = make_project(tmp_path, {"train.py": OPAQUE_STATE})
    with open_session(root / "train.py", max_steps=2, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        live.send(TakeSnapshot())
        taken = live.wait_for(is_event("snapshot"), timeout=20)
    why = "its state_dict() is not plain data: it holds a train.Opaque, which a weights_only load refuses"
    assert taken.left_out == (f"train.holder: {why}",), taken
    shown = render_entry(taken, root, timestamps=False).plain
    assert shown.endswith(f"at step 2; not kept: train.holder: {why}"), shown


GENERATOR_OVER_OWN_LOADER = OWN_LOADER.replace('''def setup(bench):
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}''', '''def batches(loader):
    while True:
        yield loader.next_batch()


def setup(bench):
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01), "batches": batches(train_loader)}''').replace(
    "    x = train_loader.next_batch()", '    x = next(state["batches"])')
assert 'next(state["batches"])' in GENERATOR_OVER_OWN_LOADER


def test_a_generator_given_a_loader_of_the_projects_own_is_said_to_read_one_that_goes_on(tmp_path: Path) -> None:
    """`batches(train_loader)` with llm.c's loader: the resume gave the loader its state, so the note must not say the
    generator starts the data from its beginning (it said so: only DataLoaders were looked for among its inputs)."""
    straight = straight_run(tmp_path, GENERATOR_OVER_OWN_LOADER, 8)
    resumed, after = resumed_after(tmp_path, GENERATOR_OVER_OWN_LOADER, 5, 8)
    assert after == {k: straight[k] for k in (6, 7, 8)}
    assert any(n.startswith("state['batches'] (the generator batches(), train.py:") and
               n.endswith("the loader it reads, batches(loader), goes on from where step 5 left it")
               for n in resumed.notes), resumed.notes
    assert not any("starts from its beginning" in n for n in resumed.notes), resumed.notes


def test_a_project_object_only_reached_through_a_generators_argument_is_not_a_loader_it_reads() -> None:
    """imagenet's `epochs(state)`: an EMA in that state was given its state too, but the generator reads no EMA."""
    ema = _MetaEMA()
    state = {"ema": ema}

    def epochs(state):  # noqa: ANN001, ANN202
        yield state

    assert loaders_read_by(epochs(state), frozenset({id(ema)})) == []

    def batches(loader):  # noqa: ANN001, ANN202
        yield loader

    assert loaders_read_by(batches(ema), frozenset({id(ema)})) == [], "an EMA given to it is not a loader it reads"

    class OwnLoader:  # llm.c's DistributedDataLoader: no __iter__, a next_batch()
        def next_batch(self) -> int:
            return 0

    own = OwnLoader()
    assert loaders_read_by(batches(own), frozenset({id(own)})) == [own]


GRAD_SCALER = """\
import torch

model = torch.nn.Linear(2, 1)
scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=2)  # script-style, a module global
unused = torch.amp.GradScaler("cpu", enabled=False)  # `enabled=use_amp` with AMP off: nothing to keep


def setup(bench):
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def step(state, bench):
    loss = state["model"](torch.ones(1, 2)).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(state["opt"])
    scaler.update()
    state["opt"].zero_grad()
    return {"loss": loss, "a": scaler.get_scale(), "b": float(scaler._growth_tracker)}
"""


def test_an_amp_grad_scaler_goes_on_from_its_scale(tmp_path: Path) -> None:
    """A fresh GradScaler starts at its initial scale, so a resumed AMP run skipped steps to find the scale again (and
    its weights left the run that never stopped). Its state is in the snapshot now, and a resume gives it back."""
    straight = straight_run(tmp_path, GRAD_SCALER, 9)
    resumed, after = resumed_after(tmp_path, GRAD_SCALER, 5, 9)
    assert after == {k: straight[k] for k in (6, 7, 8, 9)}, (after, straight)
    assert straight[6][0] == 2 ** 5, "the scale grew from 4 every second step"
    assert resumed.notes[0] == "train.scaler (GradScaler): load_state_dict() given what state_dict() held at step 5"
    assert not any("unused" in n for n in resumed.notes), resumed.notes


def test_a_rebuild_gives_an_ema_of_the_projects_own_its_old_state_when_it_still_fits(tmp_path: Path) -> None:
    """R made the EMA again from the current weights, and its average started over. Now it is given the old one's state;
    after a change of the model's shapes that state no longer fits (its next update would fail on it), and the notes
    say it was not given."""
    from workbench.protocol.events import Rebuild, StepOnce

    source = EMA.replace("WIDTH = 1024", "WIDTH = 16").replace("x = torch.randn(4, 8)", "x = torch.full((4, 8), bench.step % 3 / 3)")
    straight = straight_run(tmp_path, source, 8)
    root = make_project(tmp_path, {"train.py": source}, folder="rebuilt")
    with open_session(root / "train.py", max_steps=5, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        live.send(Rebuild())
        rebuilt = live.wait_for(is_event("rebuild"), timeout=60)
        assert rebuilt.ok and "ema: load_state_dict() given what the old one's state_dict() held" in rebuilt.notes, rebuilt
        for k in (6, 7, 8):
            live.send(StepOnce())
            live.wait_for(is_event("step", step=k), timeout=30)
        read = batches_read(live)
        assert read == {k: straight[k] for k in read}, "the EMA averaged on as in a run without the rebuild"

        save(root / "train.py", source.replace("WIDTH = 16", "WIDTH = 32"))
        live.wait_for(is_event("reload"), timeout=30)
        live.send(Rebuild())
        rebuilt = live.wait_for(lambda e: is_event("rebuild")(e) and e is not rebuilt, timeout=60)
    assert rebuilt.ok and ("ema (EMA) is as setup() made it: the old one's state does not fit the new one's "
                           "(['shadow']['0.weight'] is (16, 8) torch.float32 then (32, 8) torch.float32: the model "
                           "changed?), so it was not given") in rebuilt.notes, rebuilt.notes


LIBRARY_EMA = '''\
import torch


class ExponentialMovingAverage:
    """torch_ema's, in short: a library's class, not the project's."""

    def __init__(self, parameters, decay):
        self.decay = decay
        self.shadow_params = [p.clone().detach() for p in parameters]

    def update(self, parameters):
        with torch.no_grad():
            for s, p in zip(self.shadow_params, parameters):
                s.sub_((1 - self.decay) * (s - p))

    def state_dict(self):
        return {"decay": self.decay, "shadow_params": self.shadow_params}

    def load_state_dict(self, state):
        self.decay, self.shadow_params = state["decay"], state["shadow_params"]


class CosineLRScheduler:
    """timm's scheduler, in short: holds its optimizer, steps by epoch or update, not a torch LRScheduler."""

    def __init__(self, optimizer, t_initial):
        self.optimizer, self.t_initial, self.updates = optimizer, t_initial, 0

    def step_update(self):
        self.updates += 1
        for group in self.optimizer.param_groups:
            group["lr"] = 0.1 * (1 + __import__("math").cos(__import__("math").pi * self.updates / self.t_initial)) / 2

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state):
        self.__dict__.update(state)
'''

WITH_LIBRARY_OBJECTS = """\
import sys

sys.path.insert(0, LIBRARY)
import torch
from emalib import CosineLRScheduler, ExponentialMovingAverage


class Warmup:
    \"\"\"The project's own schedule: it holds the optimizer (a model or loader would make it a trainer).\"\"\"

    def __init__(self, optimizer, steps):
        self.optimizer, self.steps, self.done = optimizer, steps, 0

    def step(self):
        self.done += 1
        for group in self.optimizer.param_groups:
            group["momentum"] = min(0.9, self.done / self.steps)

    def state_dict(self):
        return {"steps": self.steps, "done": self.done}

    def load_state_dict(self, state):
        self.steps, self.done = state["steps"], state["done"]


def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0)
    return {"model": model, "opt": opt, "ema": ExponentialMovingAverage(model.parameters(), 0.9),
            "sched": CosineLRScheduler(opt, 50), "warmup": Warmup(opt, 20)}


def step(state, bench):
    loss = state["model"](torch.ones(2, 4)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    state["sched"].step_update()
    state["warmup"].step()
    state["ema"].update(state["model"].parameters())
    group = state["opt"].param_groups[0]
    return {"loss": loss, "a": float(state["ema"].shadow_params[0].sum()), "b": group["lr"] + group["momentum"]}
"""


def test_a_librarys_ema_and_scheduler_and_a_projects_schedule_holding_the_optimizer_go_on(tmp_path: Path) -> None:
    """torch_ema's EMA and timm's scheduler are no class of the project: a resume left both as setup() made them
    (the EMA began again from the weights, the cosine schedule from its start). A schedule of the project's that
    holds the optimizer was taken for a trainer and walked into. All are kept now."""
    library = tmp_path / "site"
    library.mkdir()
    (library / "emalib.py").write_text(LIBRARY_EMA)
    source = WITH_LIBRARY_OBJECTS.replace("sys.path.insert(0, LIBRARY)", f"sys.path.insert(0, {str(library)!r})")
    straight = straight_run(tmp_path, source, 9)
    resumed, after = resumed_after(tmp_path, source, 5, 9)
    assert after == {k: straight[k] for k in (6, 7, 8, 9)}, (after, straight)
    assert resumed.notes[0] == ("ema (ExponentialMovingAverage), sched (CosineLRScheduler), warmup (Warmup): "
                                "load_state_dict() given what state_dict() held at step 5"), resumed.notes


def test_a_librarys_sampler_or_dataset_is_left_to_its_loader_and_torch_objects_to_their_own_keeping() -> None:
    class Sampler(torch.utils.data.Sampler):
        __module__ = "torchdata.samplers"

        def __iter__(self):  # noqa: ANN204
            return iter(())

        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            pass

    from workbench.engine.loader_places import is_stateful

    assert not is_stateful(Sampler()) and not is_stateful(torch.nn.Linear(1, 1))
    assert not is_stateful(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1))
    Sampler.__module__ = "train"
    assert is_stateful(Sampler(), frozenset({"train"})), "the project's own sampler says where it is"


OWN_GENERATORS = """\
import torch

noise = torch.Generator().manual_seed(1)  # a random stream of its own, in a module global
model = torch.nn.Linear(4, 1)


def setup(bench):
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01),
            "order": torch.Generator().manual_seed(2)}


def step(state, bench):
    x = torch.randn(2, 4, generator=noise)
    pick = torch.randint(0, 100, (1,), generator=state["order"])
    loss = state["model"](x).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return {"loss": loss, "a": float(x[0, 0]), "b": float(pick)}
"""


def test_a_torch_generator_of_the_trainers_own_goes_on_from_its_random_state(tmp_path: Path) -> None:
    """A resume put back the global random states only: a `torch.Generator` the trainer draws its noise or its data
    order from began again from its seed, and the resumed run read other data than the one that never stopped."""
    straight = straight_run(tmp_path, OWN_GENERATORS, 8)
    resumed, after = resumed_after(tmp_path, OWN_GENERATORS, 5, 8)
    assert after == {k: straight[k] for k in (6, 7, 8)}, (after, straight)
    assert resumed.notes[0] == ("order, train.noise (torch.Generator): the random state step 5 had left them in, put "
                                "back (set_state())"), resumed.notes


NODES_LOADER = """\
import torch
from torchdata.nodes import Batcher, IterableWrapper, Loader

model = torch.nn.Linear(1, 1)


def batches(loader):
    while True:
        yield from loader


def setup(bench):
    loader = Loader(Batcher(IterableWrapper(range(10)), batch_size=2))
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01), "batches": batches(loader),
            "val": Loader(Batcher(IterableWrapper(range(4)), batch_size=2))}


def step(state, bench):
    batch = torch.tensor(next(state["batches"]))
    loss = state["model"](batch.float()[:, None] / 10).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return {"loss": loss, "a": float(batch[0]), "b": float(batch[1])}
"""


UNSEEDED_SETUP = """\
import torch

noise = torch.Generator().manual_seed(1)


def setup(bench):
    data = torch.randn(40, 4)  # no seed: a fresh start draws these from the process's first random state
    train, _ = torch.utils.data.random_split(data, [30, 10])
    model = torch.nn.Linear(4, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01), "train": train,
            "order": torch.Generator().manual_seed(2)}


def step(state, bench):
    x = state["train"][int(torch.randint(0, 30, (1,), generator=state["order"]))][None]
    dropped = torch.nn.functional.dropout(x, 0.5)  # the global random state, step by step
    loss = state["model"](dropped + torch.randn(1, 4, generator=noise)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return {"loss": loss, "a": float(x.sum()), "b": float(dropped.sum())}
"""


def test_a_rebuilds_setup_draws_what_a_fresh_starts_would_and_training_goes_on_drawing_where_it_was(
        tmp_path: Path) -> None:
    """setup() ran from training's random state at the rebuild: an unseeded `random_split` put other examples into
    the training set than the first setup() had (a fresh start's), and a seeded setup() began training's dropout
    again from its seed; a `torch.Generator` setup() makes started over from its seed."""
    from workbench.protocol.events import Rebuild, StepOnce

    torch.manual_seed(7)  # the sessions run in this process: each starts from the same global random state
    straight = straight_run(tmp_path, UNSEEDED_SETUP, 10)
    root = make_project(tmp_path, {"train.py": UNSEEDED_SETUP}, folder="rebuilt")
    torch.manual_seed(7)
    with open_session(root / "train.py", max_steps=5, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        live.send(Rebuild())
        rebuilt = live.wait_for(is_event("rebuild"), timeout=60)
        assert rebuilt.ok and ("order (torch.Generator): carried over the random state the old one had reached "
                               "(set_state())") in rebuilt.notes, rebuilt
        for k in range(6, 11):
            live.send(StepOnce())
            live.wait_for(is_event("step", step=k), timeout=30)
        read = batches_read(live)
        losses = {e.step: e.loss for e in live.events.of("step")}
    assert read == {k: straight[k] for k in read} and sorted(read) == list(range(1, 11)), (read, straight)
    assert len(set(losses.values())) == 10, "the steps differ from each other: the comparison means something"


def test_a_torchdata_nodes_loader_goes_on_from_its_place_and_is_not_asked_for_its_state_before_taking_one(
        tmp_path: Path) -> None:
    """torchdata.nodes.Loader's state_dict() makes the iterator its next iter() hands out, the loaded state ignored:
    asked for its state (to learn its devices) before load_state_dict(), it read its first batches again while the
    note said it had been given its place. A loader never iterated (`val`) is not asked at all."""
    pytest.importorskip("torchdata.nodes")
    straight = straight_run(tmp_path, NODES_LOADER, 9)
    snapshot = snapshot_after(tmp_path, NODES_LOADER, 6)
    assert load_places(snapshot)["ranks"][0]["states"]["val"] is None, "never iterated: no state asked"
    root = make_project(tmp_path, {"train.py": NODES_LOADER}, folder="second")
    with open_session(root / "train.py", resume=snapshot, max_steps=9, exit_at_max_steps=False) as live:
        resumed = live.wait_for(is_event("resume"), timeout=60)
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        after = batches_read(live)
    assert after == {k: straight[k] for k in (7, 8, 9)}, (after, straight)
    assert any(n.startswith("batches(loader) (Loader): load_state_dict() given") for n in resumed.notes), resumed.notes


def load_places(snapshot: Path) -> dict[str, Any]:
    return torch.load(snapshot, weights_only=True)["loader_places"]


class _NumpyDecay:
    """An EMA whose decay is a numpy float: an isinstance check takes it for a float; a weights_only load refuses it."""

    __module__ = "train"

    def __init__(self) -> None:
        import numpy

        self.decay, self.shadow = numpy.float64(0.9), [torch.zeros(1 << 19)]

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "shadow": self.shadow}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decay, self.shadow = state["decay"], state["shadow"]


def test_a_large_state_a_weights_only_load_refuses_is_left_out_and_the_snapshot_still_loads() -> None:
    """Otherwise the one value made the whole snapshot unloadable, the model's weights included."""
    taken = record({"train.ema": _NumpyDecay()})
    assert not taken["large"] and taken["errors"]["train.ema"].startswith(
        "its state_dict() is not plain data: it holds a numpy."), taken["errors"]
    assert unpack(pack(places({0: taken}, 1, taken.pop("large"))))["ranks"][0]["errors"], "loads with weights_only"


def test_what_a_state_costs_to_write_is_its_storages_not_its_views() -> None:
    tokens = torch.zeros(1 << 20, dtype=torch.int32)  # 4 MiB
    big = record({"train.place": _Holder(tokens[7])})  # torch.save writes a view's whole storage
    assert "train.place" in big["large"], "a 0-d view of 4 MiB is 4 MiB to write, not 4 bytes"


class _WrappedOptimizer:
    """fairseq's optimizer wrapper, in short: its state is the optimizer's, which the snapshot keeps on its own."""

    __module__ = "train"

    def __init__(self) -> None:
        model = torch.nn.Linear(2, 2)
        self.optimizer = torch.optim.Adam(model.parameters())
        model(torch.ones(1, 2)).sum().backward()
        self.optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])


def test_a_wrapper_whose_state_is_its_optimizers_is_not_kept_twice_and_left_out_is_true_for_every_rank() -> None:
    taken = record({"train.wrapped": _WrappedOptimizer()})
    assert taken["errors"] == {"train.wrapped": "its state_dict() holds the tensors of the optimizer it wraps, which "
                                                "the snapshot keeps"}, taken
    from workbench.engine.loader_places import left_out

    rank1 = {"states": {}, "errors": {"ema": "its state_dict() is not plain data: ..."}}
    assert left_out({0: {"errors": {}}, 1: rank1}, {"ema": {}}) == (), "rank 0's large state is every rank's"
    assert left_out({0: {"errors": {}}, 1: rank1}) == ("rank 1: ema: its state_dict() is not plain data: ...",)


def test_a_resume_leaves_an_ema_whose_model_changed_shape_as_setup_made_it() -> None:
    """A rebuild checked the layout; a resume (into a model with a layer resized) gave the old shadows, and the next
    update failed on them. Now both check."""
    ema = _MetaEMA()
    ema.shadow = {"w": torch.zeros(4), "steps": 0}
    saved = places({0: {"states": {}, "errors": {}}}, 1, {"train.ema": {"shadow": {"w": torch.ones(2), "steps": 9}}})
    done = put_back({"train.ema": ema}, saved, rank=0, world_size=1, step=9)
    assert done.placed == {} and ema.shadow["steps"] == 0
    assert done.notes == ["train.ema (_MetaEMA) is as setup() made it: the snapshot's state of step 9 does not fit its "
                          "own (['shadow']['w'] is (2,) torch.float32 then (4,) torch.float32: the model changed?), so "
                          "it was not given"], done.notes


def test_a_rank_whose_large_state_is_not_rank_0s_is_not_given_rank_0s_and_the_snapshot_says_so() -> None:
    """A one-file snapshot keeps rank 0's large state for every rank, as it keeps the models: right for an EMA of DDP's
    weights, wrong for a loader's order of its own share (1.5 MiB). Each rank's fingerprint says which."""
    from workbench.engine.loader_places import differing, fingerprints, left_out

    same, own = torch.arange(400_000.0), torch.arange(400_000.0).flip(0)
    records = {0: {"states": {}, "errors": {}, "large_sums": fingerprints({"ema": [same], "order": [same]})},
               1: {"states": {}, "errors": {}, "large_sums": fingerprints({"ema": [same.clone()], "order": [own]})}}
    differing(records)
    why = "its state differs from rank 0's, and a one-file snapshot keeps rank 0's only, as it keeps the models"
    assert records[1]["differs"] == {"order": why} and "differs" not in records[0]
    large = {"ema": {"shadow": torch.zeros(4)}, "order": {"perm": torch.zeros(4)}}
    assert left_out(records, large) == (f"rank 1: order: {why}",)

    class Holder:
        __module__ = "train"

        def __init__(self, own: dict[str, Any]) -> None:
            self.own, self.got = own, None

        def state_dict(self) -> dict[str, Any]:
            return self.own

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.got = state

    ema, order = Holder({"shadow": torch.ones(4)}), Holder({"perm": torch.ones(4)})
    done = put_back({"ema": ema, "order": order}, places(records, 2, large), rank=1, world_size=2, step=4)
    assert ema.got is not None and order.got is None, done.notes
    assert f"order (Holder) is as setup() made it: {why} (step 4)" in done.notes, done.notes


def test_another_number_of_ranks_gives_what_hands_out_no_data_rank_0s_state() -> None:
    """A 2-GPU snapshot resumed on 1 to debug: a loader's place is a share of the data that 1 rank divides otherwise,
    but a GradScaler's scale is the same on every rank. It was dropped with the loaders, in their words."""
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    saved_scaler = {"scale": 64.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
                    "_growth_tracker": 5}
    loader = loader_of(list(range(10)))
    iter(loader)
    records = {rank: {"states": {"train.scaler": saved_scaler, "loader": record({"loader": loader})["states"]["loader"]},
                      "errors": {}} for rank in (0, 1)}
    fresh_loader = loader_of(list(range(10)))
    done = put_back({"train.scaler": scaler, "loader": fresh_loader}, places(records, 2), rank=0, world_size=1, step=8)
    assert scaler.get_scale() == 64.0 and id(fresh_loader) not in done.placed
    assert done.notes == [
        "train.scaler (GradScaler): load_state_dict() given what rank 0's state_dict() held at step 8 (the snapshot "
        "is of 2 ranks, this run has 1)",
        "loader (StatefulDataLoader): the snapshot's loader places are for 2 ranks' shares of the data, and this run "
        "has 1, so they start from their beginning"], done.notes


def test_the_first_snapshots_estimate_counts_an_emas_state_and_asks_no_loader() -> None:
    from workbench.engine.loader_places import kept_state_bytes

    class Asked(StatefulDataLoader):
        def state_dict(self):  # noqa: ANN201
            raise AssertionError("a loader asked for its state starts its workers")

    found = {"ema": _Holder(1), "loader": Asked(list(range(4))), "g": torch.Generator()}
    assert kept_state_bytes(lambda: found) == 4 * (1 << 19), "the EMA's 2 MiB, nothing else"
    assert kept_state_bytes(lambda: 1 / 0) == 0, "a walk that fails counts nothing"


def test_a_large_state_no_checksum_can_read_is_not_compared_and_costs_the_snapshot_nothing() -> None:
    from workbench.engine.loader_places import fingerprints

    sparse = torch.eye(4).to_sparse()
    assert fingerprints({"odd": [sparse], "ema": [torch.ones(3)]}) == {"ema": [3.0, 6.0]}


def test_a_generator_drawing_from_a_torch_generator_the_resume_put_back_is_said_to_go_on() -> None:
    """lora_finetune's `batches(task, device, rows)`: the generator starts over, but the rows it draws come from
    where `rows` was, so the note had said its data started from its beginning when it went on."""
    from workbench.engine.fresh_iterators import fresh_iterator_notes

    rows = torch.Generator().manual_seed(0)

    def batches(stream: torch.Generator) -> Any:
        while True:
            yield torch.randn(2, generator=stream)

    def epochs(stream: torch.Generator) -> Any:
        for epoch in range(3):
            for _ in range(4):
                yield torch.randn(2, generator=stream) + epoch

    data = batches(rows)
    notes = fresh_iterator_notes({"rows": rows, "data": data}, 10, [], lambda path: None, {id(rows): "rows"})
    assert notes == ("state['data'] (the generator test_a_generator_drawing_from_a_torch_generator_the_resume_put_back_"
                     "is_said_to_go_on.<locals>.batches()): the one setup() just made, and the random stream it draws "
                     "from, rows, goes on from where step 10 left it",), notes
    # One with variables of its own names them: they start over (a count kept in a module global would go on).
    notes = fresh_iterator_notes({"rows": rows, "data": epochs(rows)}, 10, [], lambda path: None, {id(rows): "rows"})
    assert len(notes) == 1 and "the one setup() just made, so its own variables (epoch) start over, while the " \
        "random stream it draws from, rows, goes on" in notes[0], notes


def test_a_rebuild_names_the_iterators_its_setup_made_that_start_over(tmp_path: Path) -> None:
    """dcgan's `batches()` over a plain DataLoader (ported): a rebuild began its epoch again and said nothing, where a
    resume says so."""
    from workbench.protocol.events import Rebuild

    source = PROJECT.replace("from torchdata.stateful_dataloader import StatefulDataLoader",
                             "from torch.utils.data import DataLoader as StatefulDataLoader")
    root = make_project(tmp_path, {"train.py": source}, folder="rebuilt")
    with open_session(root / "train.py", max_steps=3, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        live.send(Rebuild())
        rebuilt = live.wait_for(is_event("rebuild"), timeout=60)
    assert rebuilt.ok and any(
        n.startswith("state['batches'] (the generator batches(), train.py:8): the one the new setup() made, so it "
                     "starts from its beginning, not where step 3 left it; and it reads batches(loader), whose new "
                     "iterator draws its seed") and "after the RNG states were carried" in n for n in rebuilt.notes
    ), rebuilt.notes


def test_a_loader_with_a_generator_of_its_own_that_is_kept_too_reads_the_next_epoch_as_the_run_that_never_stopped(
        tmp_path: Path) -> None:
    """The first iterator after the resume drew its base seed from the loader's `generator=`, which the resume had
    just put back: one draw ahead, the next epoch's order was another."""
    source = PROJECT.replace(
        "    loader = StatefulDataLoader(list(range(10)), batch_size=2, shuffle=True, num_workers=WORKERS)\n",
        "    order = torch.Generator().manual_seed(5)\n"
        "    loader = StatefulDataLoader(list(range(10)), batch_size=2, shuffle=True, num_workers=WORKERS, generator=order)\n",
    ).replace('"batches": batches(loader)}', '"batches": batches(loader), "order": order}')
    assert "generator=order" in source and '"order": order' in source
    straight = straight_run(tmp_path, source, 15)
    resumed, after = resumed_after(tmp_path, source, 7, 15)
    assert after == {k: straight[k] for k in range(8, 16)}, "the rest of the epoch and the next one"


GROWS = """\
import torch

EXTRA = False


def setup(bench):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 4)] + ([torch.nn.Linear(4, 4)] if EXTRA else [])
    model = torch.nn.Sequential(*layers)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def step(state, bench):
    loss = state["model"](torch.ones(1, 4)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return {"loss": loss, "a": float(torch.rand(())), "b": 0.0}
"""


def test_a_new_layers_initial_weights_do_not_draw_from_trainings_random_state(tmp_path: Path) -> None:
    """The new layer's initialization, replayed after setup(), ran after training's random states were put back: it
    drew from them, and every draw of training after the rebuild was another than the run without the layer's."""
    from workbench.protocol.events import Rebuild, StepOnce

    straight = {k: a for k, (a, _) in straight_run(tmp_path, GROWS, 8).items()}
    root = make_project(tmp_path, {"train.py": GROWS}, folder="grown")
    with open_session(root / "train.py", max_steps=4, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        save(root / "train.py", GROWS.replace("EXTRA = False", "EXTRA = True"))
        live.wait_for(is_event("reload"), timeout=30)
        live.send(Rebuild())
        rebuilt = live.wait_for(is_event("rebuild"), timeout=60)
        assert rebuilt.ok and rebuilt.new, rebuilt
        for k in range(5, 9):
            live.send(StepOnce())
            live.wait_for(is_event("step", step=k), timeout=30)
        drawn = {k: a for k, (a, _) in batches_read(live).items()}
    assert drawn == straight, (drawn, straight)


PLAIN_OWN_GENERATOR = """\
import torch
from torch.utils.data import DataLoader

torch.manual_seed(0)


def batches(loader):
    while True:
        yield from loader


def setup(bench):
    loader = DataLoader(list(range(10)), batch_size=2, shuffle=True, generator=torch.Generator())
    return {"model": torch.nn.Linear(1, 1), "batches": batches(loader)}


def step(state, bench):
    batch = next(state["batches"])
    return {"loss": 0.0, "a": float(batch[0]), "b": float(batch[1])}
"""


def test_a_plain_loaders_own_generator_is_put_back_so_its_next_epoch_is_not_the_first_again(tmp_path: Path) -> None:
    """README's advice for a plain DataLoader (`generator=torch.Generator()`): its new iterator after a resume drew
    the first epoch's order again from the fresh generator, while the notes said its random draws went on."""
    straight = straight_run(tmp_path, PLAIN_OWN_GENERATOR, 5)
    resumed, after = resumed_after(tmp_path, PLAIN_OWN_GENERATOR, 7, 12)  # in the second epoch of 5 batches
    assert any(n.startswith("batches(loader).generator (torch.Generator): the random state step 7 had left it in, "
                            "put back") for n in resumed.notes), resumed.notes
    said = [n for n in resumed.notes if n.startswith("state['batches'] (the generator batches(), train.py:")]
    assert said and "it reads batches(loader), whose new epoch draws its order from the loader's own generator, put " \
        "back as step 7 left it (so a new order, not the rest of the one step 7 was in)" in said[0], resumed.notes
    assert [after[k] for k in range(8, 13)] != [straight[k] for k in range(1, 6)], "not the first epoch's order again"
    # Not the straight run's third epoch either: torch's RandomSampler draws once more as an epoch ends (a randperm of
    # its remainder, empty here), which the resumed generator, put back mid-epoch, has not drawn; the note says only
    # "a new order".
    assert sorted(row for k in range(8, 13) for row in after[k]) == [float(row) for row in range(10)], "a whole epoch"
