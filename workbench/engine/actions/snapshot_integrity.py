"""A snapshot's integrity before it is loaded, and the disk space before one is written.

`torch.load` never checks the CRC-32 that the zip format stores for every member, so a
snapshot with flipped bits (a bad disk, a copy gone wrong) loads without complaint and
trains on corrupt weights. `verify_snapshot` reads every member once and checks it,
several members at a time into reused buffers (zlib computes CRCs without holding the
GIL); the pages it reads stay in the page cache, so the load that follows costs little more.

A full disk shows up inside `torch.save` as "unexpected pos 4320832 vs 4320724":
`check_free_space` says it in words before anything is written.
"""

from __future__ import annotations

import os
import shutil
import struct
import threading
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from workbench.engine.tensor_parts import strided_parts
from workbench.errors import UserError
from workbench.units import human_bytes

_CHUNK = 8 << 20
_verified: set[tuple[str, int, int]] = set()  # (path, size, mtime_ns) checked in this process


class SnapshotCorrupt(UserError):
    """A member's CRC-32 differs from the zip's record of it (or the zip itself is unreadable)."""


def verify_snapshot(path: Path, others: list[Path] | None = None) -> None:
    """Raise `SnapshotCorrupt` naming the file (and offering `others`) unless every member's CRC-32 matches."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key in _verified:
        return
    try:
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.infolist() if not m.is_dir()]
        fd = os.open(path, os.O_RDONLY)
        try:
            workers = min(4, os.cpu_count() or 1, max(1, len(members)))
            with ThreadPoolExecutor(workers, thread_name_prefix="vram-bench-crc") as pool:
                bad = [name for name in pool.map(lambda m: _member_damaged(path, fd, m), members) if name]
        finally:
            os.close(fd)
    except (zipfile.BadZipFile, OSError, EOFError, struct.error) as exc:
        raise _corrupt(path, f"it is not a readable zip ({exc})", others) from None
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise _corrupt(path, f"{len(bad)} of {len(members)} stored records fail their CRC-32 check ({shown})", others)
    _verified.add(key)


_buffers = threading.local()  # one read buffer per checking thread, reused for every chunk


def _member_damaged(path: Path, fd: int, member: zipfile.ZipInfo) -> str | None:
    """The member's name if its bytes do not match the CRC the zip recorded.

    Stored members (all of torch.save's) are read with `os.preadv` into the thread's one buffer and
    checked with `zlib.crc32`, which releases the GIL: no new bytes object per read, as `zipfile` makes."""
    if member.compress_type != zipfile.ZIP_STORED:
        try:
            with zipfile.ZipFile(path) as archive, archive.open(member) as data:
                while data.read(_CHUNK):
                    pass
        except zipfile.BadZipFile:
            return member.filename
        return None
    header = os.pread(fd, 30, member.header_offset)
    if len(header) < 30 or header[:4] != b"PK\x03\x04":
        return member.filename
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    offset = member.header_offset + 30 + name_length + extra_length
    buffer = getattr(_buffers, "data", None)
    if buffer is None:
        buffer = _buffers.data = memoryview(bytearray(_CHUNK))
    crc, left = 0, member.compress_size
    while left > 0:
        n = os.preadv(fd, [buffer[: min(left, _CHUNK)]], offset)
        if n <= 0:
            return member.filename  # the file ends inside the member: truncated
        crc = zlib.crc32(buffer[:n], crc)
        offset, left = offset + n, left - n
    return None if crc == member.CRC else member.filename


def _corrupt(path: Path, why: str, others: list[Path] | None) -> SnapshotCorrupt:
    offered = [p for p in (others or []) if p != path][:3]
    hint = (
        f"Resume from the previous one instead: --resume {offered[0]}" + (f" (others: {', '.join(p.name for p in offered[1:])})" if offered[1:] else "")
        if offered
        else "Take a new snapshot, or resume from a copy you trust."
    )
    return SnapshotCorrupt(f"snapshot {path} is damaged: {why}; nothing was loaded from it.", hint=hint)


def payload_bytes(payload: Any) -> int:
    """The bytes of every tensor storage in a payload about to be saved, each shared storage once."""
    seen: dict[int, int] = {}

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            local = getattr(value, "to_local", None)  # a DTensor (FSDP2): this rank's shard is what it holds
            if callable(local):
                value = local()
            for part in strided_parts(value):  # a sparse tensor's indices and values
                try:
                    storage = part.untyped_storage()
                    seen[storage.data_ptr() or id(storage)] = storage.nbytes()
                except (RuntimeError, NotImplementedError):  # a subclass without a plain storage: its elements, once
                    seen[id(part)] = part.numel() * part.element_size()
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk(payload)
    return sum(seen.values())


def check_free_space(folder: Path, needed: int) -> None:
    """A UserError saying "disk full" with both figures when `folder`'s file system cannot take `needed` bytes."""
    free = shutil.disk_usage(folder).free
    margin = 1 << 20  # the zip's headers and pickled structure
    if free < needed + margin:
        raise UserError(disk_full_message(folder, free, needed), hint="Free some space (or lower --keep-snapshots), then snapshot again.")


def disk_full_message(folder: Path, free: int, needed: int) -> str:
    return f"disk full: {human_bytes(free)} free in {folder}, the snapshot needs {human_bytes(needed)}"
