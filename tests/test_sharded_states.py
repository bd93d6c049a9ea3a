"""A project object's model-sized state in a sharded snapshot: its tensors written through DCP, its skeleton in the
rank's record, read back into tensors like the object's own (sharded_states.py). The two-rank paths (a DTensor
shadow resharded onto one rank, a rank's own state that another number of ranks cannot take) are in
tests/test_loader_places.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from workbench.engine.actions.plain_data_dcp import read_metadata
from workbench.engine.actions.sharded_snapshot import read_loader_places, write_sharded
from workbench.engine.actions.sharded_states import join, split, tensors_and_layout
from workbench.engine.loader_places import LAYOUT, put_back, record


class Shadows:
    """An EMA of the project's: shadow weights in a list, a count beside them; `lazy` makes them at the first update."""

    __module__ = "train"

    def __init__(self, shape: tuple[int, ...] = (600, 600), lazy: bool = False) -> None:
        self.shadow: list[torch.Tensor] | None = None if lazy else [torch.zeros(shape), torch.zeros(3)]
        self.updates = 0

    def update(self, value: float) -> None:
        assert self.shadow is not None
        for tensor in self.shadow:
            tensor.add_(value)
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {"shadow": self.shadow, "updates": self.updates, "decay": (0.999, "per step")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.shadow = [tensor.clone() for tensor in state["shadow"]]
        self.updates = state["updates"]


def test_split_and_join_give_the_state_back_with_its_tensors_in_place() -> None:
    state = {"a": [torch.ones(2), {"b": torch.zeros(1, dtype=torch.int64)}], "n": 3, "t": (torch.full((2,), 5.0), "x")}
    skeleton, leaves = split(state)
    assert [tuple(t.shape) for t in leaves] == [(2,), (1,), (2,)] and skeleton["n"] == 3 and skeleton["t"][1] == "x"
    assert all(t.numel() == 0 for t in split(skeleton)[1]) and split(skeleton)[1][1].dtype == torch.int64
    again = join(skeleton, leaves)
    assert again["a"][0] is leaves[0] and again["a"][1]["b"] is leaves[1] and again["t"][0] is leaves[2]
    assert type(again["t"]) is tuple and again["n"] == 3


def write_with_shadows(tmp_path: Path, ema: Shadows) -> Path:
    """A sharded snapshot of one process whose record lays out `ema`'s state, its tensors written through DCP."""
    kept = record({"ema": ema})
    assert set(kept["large"]) == {"ema"}, kept
    tensors, kept[LAYOUT] = tensors_and_layout(kept.pop("large"), 0, {"ema"})
    model = torch.nn.Linear(2, 2)
    event = write_sharded({"model": model}, 7, 0, tmp_path, writer_pid=os.getpid(), is_main=True, keep=3,
                          loader_record=kept, large=tensors)
    return Path(event.path)


def test_a_large_state_is_written_as_tensors_and_read_back_into_a_fresh_object(tmp_path: Path) -> None:
    trained = Shadows()
    trained.update(0.5)
    path = write_with_shadows(tmp_path, trained)
    saved = read_metadata(path).state_dict_metadata
    assert tuple(saved["vram-bench/state/ema/0"].size) == (600, 600) and "vram-bench/state/ema/1" in saved, sorted(saved)
    assert saved["loader_places/rank0"].size[0] < 4096, "the record keeps the layout only, not 1.4 MB of shadows"

    fresh = Shadows()
    given = put_back({"ema": fresh}, read_loader_places(path, 0, 1, {"ema": fresh}), 0, 1, 7)
    assert given.notes == ["ema (Shadows, 1.4 MiB of tensors): load_state_dict() given what state_dict() held at step 7"]
    assert fresh.updates == 1 and fresh.shadow is not None and bool((fresh.shadow[0] == 0.5).all())
    assert bool((fresh.shadow[1] == 0.5).all())


def test_an_object_that_makes_its_state_lazily_is_given_it_whole(tmp_path: Path) -> None:
    trained = Shadows()
    trained.update(2.0)
    path = write_with_shadows(tmp_path, trained)

    lazy = Shadows(lazy=True)
    put_back({"ema": lazy}, read_loader_places(path, 0, 1, {"ema": lazy}), 0, 1, 7)
    assert lazy.shadow is not None and tuple(lazy.shadow[0].shape) == (600, 600) and bool((lazy.shadow[0] == 2.0).all())


def test_an_object_whose_shapes_changed_is_left_as_setup_made_it_and_said(tmp_path: Path) -> None:
    trained = Shadows()
    trained.update(1.0)
    path = write_with_shadows(tmp_path, trained)

    grown = Shadows((700, 600))
    given = put_back({"ema": grown}, read_loader_places(path, 0, 1, {"ema": grown}), 0, 1, 7)
    assert given.notes == ["ema (Shadows) is as setup() made it: the snapshot's state of step 7 does not fit its own "
                           "(['shadow'][0] is (600, 600) torch.float32 then (700, 600) torch.float32: the model "
                           "changed?), so it was not given"], given.notes
    assert grown.updates == 0 and bool((grown.shadow[0] == 0).all())  # type: ignore[index]


def test_a_state_held_in_an_ordered_dict_goes_through_dcp_too(tmp_path: Path) -> None:
    """A copy of a model's state_dict() is an OrderedDict: it was not walked, so the whole state was pickled into the
    rank's record at every snapshot."""
    from collections import OrderedDict

    class Copy(Shadows):
        def state_dict(self) -> Any:
            return OrderedDict(w=self.shadow[0], b=self.shadow[1])  # type: ignore[index]

        def load_state_dict(self, state: Any) -> None:
            self.shadow = [state["w"].clone(), state["b"].clone()]

    trained = Copy()
    trained.update(3.0)
    kept = record({"ema": trained})
    tensors, kept[LAYOUT] = tensors_and_layout(kept.pop("large"), 0, {"ema"})
    assert len(tensors) == 2 and type(kept[LAYOUT]["ema"]["skeleton"]) is OrderedDict
    event = write_sharded({"model": torch.nn.Linear(2, 2)}, 7, 0, tmp_path, writer_pid=os.getpid(), is_main=True,
                          keep=3, loader_record=kept, large=tensors)
    fresh = Copy()
    put_back({"ema": fresh}, read_loader_places(Path(event.path), 0, 1, {"ema": fresh}), 0, 1, 7)
    assert fresh.shadow is not None and bool((fresh.shadow[0] == 3.0).all()) and bool((fresh.shadow[1] == 3.0).all())
