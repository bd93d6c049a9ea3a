"""Running under torchrun: which rank this process is, its device, and the process groups.

torch.distributed.run (torchrun) starts one process per rank and tells each who it is in its
environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT). vram-bench
creates the default process group before `setup()` (NCCL on CUDA, gloo on CPU) unless the
user's code already did, and always a separate gloo group for its own control messages
(workbench/engine/lockstep.py), so a busy NCCL stream never holds a pause or a reload back.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from workbench.engine.control_plane import ControlPlane
from workbench.errors import UserError

DEFAULT_CONTROL_TIMEOUT = timedelta(minutes=30)  # a rank may spend minutes in a step or a snapshot


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job, as torchrun's environment says."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def rank_info_from_env(env: dict[str, str] | None = None) -> RankInfo | None:
    """The rank facts torchrun sets; None when this process was not started by a launcher."""
    env = dict(os.environ if env is None else env)
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
    except ValueError:
        raise UserError(
            f"RANK={env.get('RANK')!r}, WORLD_SIZE={env.get('WORLD_SIZE')!r} are not whole numbers: start vram-bench "
            "with torchrun (or vram-bench run --nproc-per-node N), which sets them."
        ) from None
    if not 0 <= rank < world:
        raise UserError(f"RANK={rank} is outside WORLD_SIZE={world}.")
    return RankInfo(rank=rank, local_rank=local, world_size=world, local_world_size=local_world)


def rank_device(info: RankInfo, spec: str) -> torch.device:
    """`auto` and `cuda` mean this rank's own GPU (cuda:LOCAL_RANK); cpu stays cpu."""
    spec = spec.strip().lower()
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return torch.device("cpu")
    if spec != "cuda":
        raise UserError(
            f"--device {spec} under torchrun: each rank takes its own GPU (cuda:LOCAL_RANK), so pass --device cuda, "
            "cpu or auto; choose GPUs with CUDA_VISIBLE_DEVICES."
        )
    if not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but torch.cuda.is_available() is False on this machine.",
                        hint="Use --device cpu (gloo) or auto.")
    count = torch.cuda.device_count()
    if info.local_rank >= count:
        raise UserError(
            f"local rank {info.local_rank} has no GPU of its own: {count} visible on this node, "
            f"{info.local_world_size} ranks started here. Start at most {count} processes per node (--nproc-per-node)."
        )
    return torch.device("cuda", info.local_rank)


class ProcessGroups:
    """The default group (the user's training collectives) and vram-bench's gloo control group."""

    def __init__(self, info: RankInfo, device: torch.device, control_timeout: timedelta = DEFAULT_CONTROL_TIMEOUT) -> None:
        self.info = info
        self.device = device
        self.control_timeout = control_timeout
        self.created_default = False
        self.control: dist.ProcessGroup | None = None

    def start(self) -> None:
        """Before the project is imported: the default group (unless the user made it) and the control group."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if not dist.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            kwargs = {"device_id": self.device} if backend == "nccl" else {}
            dist.init_process_group(backend=backend, **kwargs)
            self.created_default = True
        self.control = dist.new_group(backend="gloo", timeout=self.control_timeout)

    @contextlib.contextmanager
    def running(self) -> Iterator[ProcessGroups]:
        """The groups are started lazily (`role()`), after the project is imported, and always closed."""
        try:
            yield self
        finally:
            self.close()

    def role(self) -> RankRole:
        if self.control is None:
            self.start()
        return RankRole.of(self)

    @property
    def backend(self) -> str:
        return str(dist.get_backend()) if dist.is_initialized() else "none"

    def close(self) -> None:
        """Destroy what vram-bench created (the user's own default group is theirs to destroy)."""
        if not dist.is_initialized():
            return
        try:
            if self.created_default:
                dist.destroy_process_group()
            elif self.control is not None:
                dist.destroy_process_group(self.control)
        except Exception:  # noqa: BLE001 - at exit, a group torn down already (a peer gone) is not an error
            pass
        self.control = None


@dataclass(frozen=True)
class RankRole:
    """What a session needs to know of the job: its rank, the control plane, the training group's backend."""

    info: RankInfo
    plane: ControlPlane
    backend: str

    @classmethod
    def of(cls, groups: ProcessGroups) -> RankRole:
        assert groups.control is not None, "start the process groups first"
        return cls(groups.info, ControlPlane(groups.control, groups.info.rank, groups.info.world_size), groups.backend)
