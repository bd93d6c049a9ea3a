"""vram-bench's own messages between ranks, on a gloo group of their own.

Two kinds of exchange, both collectives every rank calls in the same order:

- the boundary exchange, once per step boundary: a fixed row of numbers per rank (its last
  step, loss, step time, code version, and how many bytes of commands it has to send),
  gathered with `all_gather_into_tensor`. It is *posted* without waiting (`async_op=True`) and
  *collected* at the next boundary, a step later, so the gather's round trip hides behind a step
  instead of costing one per step;
- the payload exchange, only when some rank has something to say (commands, a saved file's
  source, the steps it trained for rank 0's stream): the payloads padded to the longest, whose
  lengths every rank already knows from the rows. The boundary posts it without waiting too
  (`post_bytes`) and collects it a turn later; `gather_bytes` and `gather_text` (blocking) are for a
  command's own agreement (a prepare's outcome), where every rank waits for the answer anyway.

Everything crosses as numbers and bytes (UTF-8 JSON, source text): nothing is pickled, no code
object ever travels. Every rank compiles the source it receives itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

ROW = 14  # numbers per rank in a boundary exchange
# torch 2.13 renamed all_gather_into_tensor (deprecated there) to all_gather_single; vram-bench supports both.
_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
(PAYLOAD, STEP, LOSS, MS, VERSION, STATE, STEP_TIME, CADENCE, STEPS_PER_SECOND, RSS, GPU_ALLOCATED, GPU_RESERVED,
 COMMANDS, CARRIED_VERSION) = range(ROW)
MAX_PAYLOAD = 64 * 2**20  # a saved file's source, a traceback: a row claiming more is a bug, not data


class RanksLost(RuntimeError):
    """A control exchange failed: another rank died (killed, crashed) or stopped answering."""


def _lost(exc: BaseException) -> RanksLost:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return RanksLost(f"the control group failed ({text[:300]}): another rank died or stopped answering")


@dataclass(frozen=True)
class RankRow:
    """One rank's numbers at a boundary: what it last trained, and what it has to say."""

    rank: int
    payload_bytes: int
    step: int
    loss: float
    ms: float
    code_version: int
    state: int
    step_time: float  # when its last step ended (Unix seconds)
    cadence: int  # rank 0's: how many loop turns until the next exchange
    steps_per_second: float = 0.0
    rss: int = -1  # bytes; -1: not measured yet
    gpu_allocated: int = -1
    gpu_reserved: int = -1
    commands: bool = False  # its bytes hold commands (not only steps): every rank gathers them at once
    carried_version: int = -1  # >= 0: the row's step is the only one it trained since its last exchange, run on
    # this code version, and is sent nowhere else (long steps exchange every turn: no bytes needed for one step)


class BoundaryExchange:
    """One posted gather: this rank's row out, every rank's rows in once `collect` waits for it."""

    def __init__(self, group: dist.ProcessGroup, world_size: int, row: list[float], payload: bytes) -> None:
        self.payload = payload
        self._send = torch.tensor(row, dtype=torch.float64)
        self._recv = torch.empty(world_size * ROW, dtype=torch.float64)
        try:
            self._work = _gather_into(self._recv, self._send, group=group, async_op=True)
        except RuntimeError as exc:
            raise _lost(exc) from exc

    def collect(self) -> list[RankRow]:
        try:
            self._work.wait()
        except RuntimeError as exc:
            raise _lost(exc) from exc
        rows = self._recv.view(-1, ROW).tolist()
        return [
            RankRow(
                rank=r, payload_bytes=int(v[PAYLOAD]), step=int(v[STEP]), loss=v[LOSS], ms=v[MS],
                code_version=int(v[VERSION]), state=int(v[STATE]), step_time=v[STEP_TIME], cadence=int(v[CADENCE]),
                steps_per_second=v[STEPS_PER_SECOND], rss=int(v[RSS]), gpu_allocated=int(v[GPU_ALLOCATED]),
                gpu_reserved=int(v[GPU_RESERVED]), commands=v[COMMANDS] > 0, carried_version=int(v[CARRIED_VERSION]),
            )
            for r, v in enumerate(rows)
        ]


class PayloadExchange:
    """One posted gather of every rank's bytes (padded to the longest); `collect` waits and unpads."""

    def __init__(self, group: dist.ProcessGroup, world_size: int, data: bytes, lengths: list[int]) -> None:
        self.lengths = lengths
        self._longest = longest = max(lengths)
        if longest > MAX_PAYLOAD:
            raise _lost(RuntimeError(f"a rank announced {longest} bytes of control data (at most {MAX_PAYLOAD}): out of step"))
        self._work = None
        if longest == 0:
            return
        send = torch.zeros(longest, dtype=torch.uint8)
        if data:
            send[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self._recv = torch.empty(world_size * longest, dtype=torch.uint8)
        try:
            self._work = _gather_into(self._recv, send, group=group, async_op=True)
        except RuntimeError as exc:
            raise _lost(exc) from exc

    def collect(self) -> list[bytes]:
        if self._work is None:
            return [b""] * len(self.lengths)
        try:
            self._work.wait()
        except RuntimeError as exc:
            raise _lost(exc) from exc
        table = self._recv.view(len(self.lengths), self._longest)
        return [table[r, :n].numpy().tobytes() if n else b"" for r, n in enumerate(self.lengths)]


class ControlPlane:
    """The control group and this rank's place in it."""

    def __init__(self, group: dist.ProcessGroup, rank: int, world_size: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = world_size

    def post(self, row: list[float], payload: bytes, commands: bool = False) -> BoundaryExchange:
        """Post this rank's row; `commands`: the payload holds commands (not only steps)."""
        if len(row) != ROW:
            raise ValueError(f"a boundary row has {ROW} numbers, not {len(row)}")
        row = list(row)
        row[PAYLOAD] = float(len(payload))
        row[COMMANDS] = 1.0 if commands else 0.0
        return BoundaryExchange(self.group, self.world_size, row, payload)

    def post_bytes(self, data: bytes, lengths: list[int]) -> PayloadExchange:
        """Start gathering every rank's bytes without waiting; `lengths` (every rank's, from a boundary row) must be
        the same list on every rank."""
        return PayloadExchange(self.group, self.world_size, data, lengths)

    def gather_bytes(self, data: bytes, lengths: list[int] | None = None) -> list[bytes]:
        """Every rank's bytes, in rank order (blocking). `lengths`: already known from a boundary row."""
        if lengths is None:
            lengths = self._gather_number(len(data))
        return self.post_bytes(data, lengths).collect()

    def _gather_number(self, number: int) -> list[int]:
        """Every rank's integer, in rank order (one blocking collective)."""
        mine = torch.tensor([number], dtype=torch.int64)
        every = torch.empty(self.world_size, dtype=torch.int64)
        try:
            _gather_into(every, mine, group=self.group)
        except RuntimeError as exc:
            raise _lost(exc) from exc
        return [int(n) for n in every.tolist()]

    def gather_text(self, text: str | None) -> list[str | None]:
        """Every rank's text or None, in rank order (blocking): one collective of lengths when every rank has None
        (an agreement's common case: nothing to object to), a second for the text only when some rank has any."""
        data = text.encode() if text is not None else b""
        lengths = self._gather_number(len(data) if text is not None else -1)  # -1: None
        if all(n < 0 for n in lengths):
            return [None] * self.world_size
        texts = self.post_bytes(data, [max(n, 0) for n in lengths]).collect()
        return [raw.decode(errors="replace") if n >= 0 else None for raw, n in zip(texts, lengths)]

    def gather_json(self, value: Any) -> list[Any]:
        """Every rank's JSON-able value, in rank order (blocking)."""
        return [json.loads(b) if b else None for b in self.gather_bytes(json.dumps(value).encode())]

    def broadcast_json(self, value: Any) -> Any:
        """Rank 0's value on every rank (the others pass None)."""
        return self.gather_json(value if self.rank == 0 else None)[0]
