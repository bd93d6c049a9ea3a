"""A DataLoader's workers outlive a stop signal sent to the whole group; if they die anyway, that is said as such.

Found porting pytorch/examples' minGPT-ddp (a DataLoader with workers under torchrun): SIGTERM to the launcher reaches
every process of each rank's group, the DataLoader's workers too, and the step that asked them for a batch failed
with "Connection reset by peer", which vram-bench read as gloo's words for a dead training group ("rank 0 waited in
a training collective for a rank that did not join it"). Real DataLoader worker processes, killed for real.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from workbench.engine import forked_children
from workbench.engine.distributed import is_dead_group_error
from workbench.engine.forked_children import begin_ending_children, keep_data_loader_workers
from workbench.engine.loader_failure import raised_in_data_loader


class Slow(Dataset):
    def __init__(self, seconds: float = 0.01) -> None:
        self.seconds = seconds

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.seconds)
        return torch.full((4,), float(index))


def test_a_batch_from_killed_workers_is_the_data_loaders_failure_not_a_dead_group() -> None:
    batches = iter(DataLoader(Slow(0.25), batch_size=4, num_workers=1, prefetch_factor=1))
    next(batches)
    # Killed while it sleeps in the next batch's __getitem__, not while it holds one of the loader's shared locks
    # (its queue's, its done event's): a worker killed holding one left this process waiting on it for good (seen
    # once in a full suite on a loaded machine).
    time.sleep(0.3)
    for pid in [w.pid for w in batches._workers]:  # noqa: SLF001 - the loader's own worker processes
        os.kill(pid, signal.SIGTERM)
    with pytest.raises(Exception) as caught:
        for _ in range(20):
            next(batches)
    assert raised_in_data_loader(caught.value), caught.value
    assert not is_dead_group_error(caught.value)


def test_gloos_words_in_a_runtime_error_are_a_dead_group_and_in_a_socket_error_not() -> None:
    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:5678: Connection reset by peer")
    assert is_dead_group_error(gloo)
    assert not is_dead_group_error(ConnectionResetError(104, "Connection reset by peer"))
    assert not raised_in_data_loader(gloo)


def test_workers_forked_after_keep_data_loader_workers_shrug_off_sigterm_until_their_parent_ends_them() -> None:
    put_back = keep_data_loader_workers(os.getpid())
    forked_children._ending[0] = 0  # noqa: SLF001 - an earlier test's quit in this process may have set it
    try:
        loader = DataLoader(Slow(), batch_size=4, num_workers=1, prefetch_factor=1)
        batches = iter(loader)
        first = next(batches)
        worker = batches._workers[0]  # noqa: SLF001 - the loader's own worker process
        os.kill(worker.pid, signal.SIGTERM)  # what torchrun's os.killpg does to every process of a rank's group
        later = [next(batches) for _ in range(10)]  # torch's own handler would have died: the next batches failed
        assert worker.is_alive() and torch.equal(later[-1], first + 4 * 10)
        begin_ending_children()  # this process ends its children now (quit_escalation.end_child_processes)
        os.kill(worker.pid, signal.SIGTERM)
        worker.join(5)
        assert worker.exitcode == 0, worker.exitcode
    finally:
        forked_children._ending[0] = 0  # noqa: SLF001 - other tests' children: as before this one
        put_back()


def test_the_code_workers_run_is_found_through_random_splits_subset_and_a_concat(tmp_path, monkeypatch) -> None:
    """Found porting pytorch/examples' minGPT-ddp: its loader holds `random_split`'s Subset of a CharDataset, and an
    edited CharDataset.__getitem__ (which its workers run) was applied without a word about the workers."""
    import importlib

    from torch.utils.data import ConcatDataset, random_split

    from workbench.engine.hotswap.loader_workers import code_run_by_workers

    (tmp_path / "chars.py").write_text(
        "import torch\n\n\ndef encode(s):\n    return [ord(c) for c in s]\n\n\n"
        "class CharDataset(torch.utils.data.Dataset):\n    def __len__(self):\n        return 10\n\n"
        "    def __getitem__(self, i):\n        return torch.tensor(encode('abc'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    chars = importlib.import_module("chars")
    train, _ = random_split(chars.CharDataset(), [8, 2])
    for dataset in (train, ConcatDataset([train, chars.CharDataset()])):
        names = code_run_by_workers(DataLoader(dataset, num_workers=1), chars)
        assert {"CharDataset", "encode"} <= names, names
