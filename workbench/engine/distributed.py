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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from workbench.engine.control_group import new_control_group
from workbench.engine.control_plane import ControlPlane
from workbench.engine.doorbell import Doorbell
from workbench.engine.prepare_ahead import P, PrepareAhead
from workbench.errors import UserError

DEFAULT_CONTROL_TIMEOUT = timedelta(minutes=30)  # a rank may spend minutes in a step or a snapshot
DEFAULT_COLLECTIVE_TIMEOUT = timedelta(minutes=5)  # the training group's: how long a rank waits for one that failed

# What a rank's step error says when the training group's collective failed (a peer stopped joining, timed out,
# went away): gloo's and NCCL's words. Such a group is dead: every later collective on it fails.
_DEAD_GROUP_MARKERS = (
    "Timed out waiting",
    "Connection closed by peer",
    "Application timeout caused pair closure",
    "Watchdog caught collective operation timeout",
    "NCCL communicator was aborted",
    "Connection reset by peer",
)


def is_dead_group_error(exc: BaseException) -> bool:
    """A step error that means the training group's collective failed, not the user's code.

    torch.distributed raises RuntimeErrors (DistBackendError and the like); an OSError with the same words comes from
    Python's own sockets (a DataLoader whose workers were killed: "Connection reset by peer"), not from the group."""
    return isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in _DEAD_GROUP_MARKERS)


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job, as torchrun's environment says."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    restart: int = 0  # torchrun's restarts of every rank so far (--max-restarts): 0 in the first attempt
    max_restarts: int = 0  # how many restarts torchrun may make (its --max-restarts)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_error_hint(exc: BaseException) -> str:
    """What to do about a setup() error vram-bench's own set-up causes ("" for any other error)."""
    if isinstance(exc, (ValueError, RuntimeError)) and "initialize the default process group twice" in str(exc):
        return (" (vram-bench made the default process group before setup() ran, from torchrun's environment: "
                "drop this call, or make it only `if not torch.distributed.is_initialized()`)")
    return ""


def rank_info_from_env(env: dict[str, str] | None = None) -> RankInfo | None:
    """The rank facts torchrun sets; None when this process was not started by a launcher."""
    env = dict(os.environ if env is None else env)
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        max_restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    except ValueError:
        raise UserError(
            f"RANK={env.get('RANK')!r}, WORLD_SIZE={env.get('WORLD_SIZE')!r} are not whole numbers: start vram-bench "
            "with torchrun (or vram-bench run --nproc-per-node N), which sets them."
        ) from None
    if not 0 <= rank < world:
        raise UserError(f"RANK={rank} is outside WORLD_SIZE={world}.")
    return RankInfo(rank=rank, local_rank=local, world_size=world, local_world_size=local_world, restart=restart,
                    max_restarts=max_restarts)


def shared_store_restart_note(info: RankInfo, env: dict[str, str] | None = None) -> str | None:
    """torchrun started by hand with --max-restarts and its store shared across attempts (its default): a restart may
    fail to connect the process groups (pytorch/pytorch#135712); `vram-bench run --max-restarts` unshares it itself."""
    env = os.environ if env is None else env
    if info.max_restarts <= 0 or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return (f"torchrun may restart the ranks (--max-restarts {info.max_restarts}) and shares its store across attempts: "
            "a restarted rank can read a dead rank's address from the attempt before and fail to connect its process "
            "groups. Start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, or use vram-bench run --max-restarts, "
            "which does.")


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

    def __init__(
        self,
        info: RankInfo,
        device: torch.device,
        collective_timeout: timedelta = DEFAULT_COLLECTIVE_TIMEOUT,
        control_timeout: timedelta = DEFAULT_CONTROL_TIMEOUT,
    ) -> None:
        self.info = info
        self.device = device
        self.collective_timeout = collective_timeout
        self.control_timeout = control_timeout
        self.created_default = False
        self.control: dist.ProcessGroup | None = None
        self.generation = 0  # how many times the groups were made again after a dead collective
        self._store = None  # the store the first default group was made from: renewals take a fresh prefix of it
        self._doorbell: Doorbell | None = None  # the current generation's (closed with its groups)
        self._ahead: PrepareAhead | None = None  # likewise
        self.skipped_inits: list[str] = []  # the project's own init_process_group calls at import (import_time_group.py)

    def make_default(self) -> None:
        """Before the project is imported: the default group, unless it exists (import_time_group.py)."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if not dist.is_initialized():
            dist.init_process_group(backend=self._backend(), timeout=self.collective_timeout, **self._device_id())
            self.created_default = True

    def start(self) -> None:
        """After the project is imported: the default group (if the import did not happen inside
        `default_group_at_import`) and the control group."""
        self.make_default()
        self._store = dist.distributed_c10d._get_default_store()
        self.control = new_control_group(self.control_timeout)

    def _backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    def _device_id(self) -> dict[str, torch.device]:
        return {"device_id": self.device} if self.device.type == "cuda" else {}

    @property
    def can_renew(self) -> bool:
        """Only a default group vram-bench made can be made again (the user's own has arguments we do not know)."""
        return self.created_default and self._store is not None

    def renew(self) -> dist.ProcessGroup:
        """After a collective failed: every group made again, on a fresh prefix of the same store (every rank at once).

        A dead gloo or NCCL group cannot be repaired, only replaced; reusing the old keys could pair a rank with
        another's stale state, so each generation has keys of its own. Returns the new control group."""
        if not self.can_renew:
            raise RuntimeError("the training group was made by the project's code, so vram-bench cannot make it again")
        self.generation += 1
        if self._doorbell is not None:
            self._doorbell.close()
        if self._ahead is not None:
            self._ahead.close()
        dist.destroy_process_group()  # every group: the default and the control group
        store = dist.PrefixStore(f"vram-bench/generation-{self.generation}", self._store)
        dist.init_process_group(backend=self._backend(), store=store, rank=self.info.rank, world_size=self.info.world_size,
                                timeout=self.collective_timeout, **self._device_id())
        self.control = new_control_group(self.control_timeout)
        return self.control

    def doorbell(self) -> Doorbell:
        """This generation's doorbell (workbench/engine/doorbell.py), on a prefix of the job's store of its own."""
        if self._doorbell is not None:
            self._doorbell.close()
        prefixed = dist.PrefixStore(f"vram-bench/doorbell-{self.generation}", self._job_store())
        self._doorbell = Doorbell(prefixed, self.info.rank, self.info.world_size, self.control_timeout)
        return self._doorbell

    def prepare_ahead(self, prepare: Callable[[str, str], P | None]) -> PrepareAhead[P]:
        """This generation's planning ahead (workbench/engine/prepare_ahead.py), on a prefix of the job's store."""
        if self._ahead is not None:
            self._ahead.close()
        prefixed = dist.PrefixStore(f"vram-bench/ahead-{self.generation}", self._job_store())
        ahead = PrepareAhead(prefixed, self.info.rank, self.info.world_size, prepare)
        self._ahead = ahead
        return ahead

    def whereabouts_store(self) -> dist.Store:
        """The ranks' places (workbench/engine/whereabouts.py), on a prefix of the job's store; one per torchrun attempt,
        so a restarted job never reads the places of the attempt before."""
        return dist.PrefixStore(f"vram-bench/where-{self.info.restart}", self._job_store())

    def _job_store(self) -> dist.Store:
        """The job's c10d store (torchrun's), under every vram-bench prefix."""
        return dist.distributed_c10d._get_default_store() if self._store is None else self._store

    @contextlib.contextmanager
    def running(self) -> Iterator[ProcessGroups]:
        """The control group is started lazily (`role()`), after the project is imported; the groups are always
        closed."""
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
        if self._doorbell is not None:
            self._doorbell.close()
        if self._ahead is not None:
            self._ahead.close()
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
    """What a session needs to know of the job: its rank, the control plane, the groups (and their backend)."""

    info: RankInfo
    plane: ControlPlane
    groups: ProcessGroups

    @property
    def backend(self) -> str:
        return self.groups.backend

    @classmethod
    def of(cls, groups: ProcessGroups) -> RankRole:
        assert groups.control is not None, "start the process groups first"
        return cls(groups.info, ControlPlane(groups.control, groups.info.rank, groups.info.world_size), groups)


def broadcast_replicated_state(state: object, namespaces: list[tuple[str, dict]]) -> int:
    """Every rank takes rank 0's weights, buffers and optimizer state (the training group; every rank at once).

    For replicated training (DDP) after a step that left the replicas apart, such as one whose gradients were never
    reduced. Walks the same modules and optimizers in the same order on every rank; returns the tensors sent.
    Sharded tensors (DTensors: FSDP2's parameters and optimizer state) are not replicas: each rank keeps its own
    shard (c10d cannot broadcast a DTensor either: it ended the session on FSDP2's recovery)."""
    from workbench.engine.memory.shards import local_shard
    from workbench.engine.state_walk import find_with_globals

    modules, optimizers = find_with_globals(state, namespaces)
    tensors: list[torch.Tensor] = []
    for name in sorted(modules):
        for _, tensor in sorted(modules[name].state_dict(keep_vars=True).items()):
            tensors.append(tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor)
    for name in sorted(optimizers):
        optimizer = optimizers[name]
        for group in optimizer.param_groups:
            for param in group["params"]:
                for _, value in sorted(optimizer.state.get(param, {}).items()):
                    if isinstance(value, torch.Tensor):
                        tensors.append(value)
    seen: set[int] = set()
    sent = 0
    for tensor in tensors:
        if id(tensor) in seen or not isinstance(tensor, torch.Tensor) or local_shard(tensor) is not None:
            continue
        seen.add(id(tensor))
        dist.broadcast(tensor, src=0)
        sent += 1
    return sent
