"""The `bench` object handed to the user's `setup(bench)` and `step(state, bench)`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from workbench.engine.step_values import kept_for_later, to_scalar

if TYPE_CHECKING:
    from workbench.engine.distributed import RankInfo


class Bench:
    """What the user's code may ask of the workbench: device, global step, extra series, run dir;
    under torchrun also its rank (`rank`, `local_rank`, `world_size`, `is_main`; a single process is rank 0 of 1)."""

    def __init__(self, device: torch.device, run_dir: Path, ranks: RankInfo | None = None) -> None:
        self.device = device
        self.run_dir = run_dir
        self.step = 0
        self.rank = ranks.rank if ranks is not None else 0
        self.local_rank = ranks.local_rank if ranks is not None else 0
        self.world_size = ranks.world_size if ranks is not None else 1
        self.is_main = self.rank == 0
        self._logged: dict[str, Any] = {}  # floats, or device scalars read later

    def log(self, **scalars: Any) -> None:
        """Add extra chart series for the current step: `bench.log(lr=LR, grad_norm=g)`."""
        for name, value in scalars.items():
            # A CUDA scalar is read with the step's loss, without waiting for the GPU (step_values.py); anything else
            # now, so a value that is not a number is refused at the line that logged it.
            kept = kept_for_later(value)
            self._logged[name] = kept if kept is not None else to_scalar(value, name)

    def _take_logged(self) -> dict[str, Any]:
        logged, self._logged = self._logged, {}
        return logged

    def __repr__(self) -> str:
        ranks = f", rank={self.rank}/{self.world_size}" if self.world_size > 1 else ""
        return f"Bench(device={self.device}, step={self.step}{ranks}, run_dir={str(self.run_dir)!r})"


def is_finite(value: float) -> bool:
    return math.isfinite(value)
