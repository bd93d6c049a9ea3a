"""The `bench` object handed to the user's `setup(bench)` and `step(state, bench)`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

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
        self._logged: dict[str, float] = {}

    def log(self, **scalars: Any) -> None:
        """Add extra chart series for the current step: `bench.log(lr=LR, grad_norm=g)`."""
        for name, value in scalars.items():
            self._logged[name] = to_scalar(value, name)

    def _take_logged(self) -> dict[str, float]:
        logged, self._logged = self._logged, {}
        return logged

    def __repr__(self) -> str:
        ranks = f", rank={self.rank}/{self.world_size}" if self.world_size > 1 else ""
        return f"Bench(device={self.device}, step={self.step}{ranks}, run_dir={str(self.run_dir)!r})"


def to_scalar(value: Any, name: str) -> float:
    """A Python number or a one-element tensor as a float; anything else is the user's mistake."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"{name!r} is a tensor of shape {tuple(value.shape)}; log a scalar (e.g. .mean())")
        return float(value.item())  # no detach(): item() reads the value, autograd or not
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise TypeError(f"{name!r} is a {type(value).__name__}; log numbers or one-element tensors") from None
    return float(value)


def is_finite(value: float) -> bool:
    return math.isfinite(value)
