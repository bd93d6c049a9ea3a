"""Sharded snapshots are read as plain data only, as one-file snapshots are (`weights_only=True`).

torch.distributed.checkpoint reads a snapshot's `.metadata` with `pickle.load`, and every value that is not a
tensor (a param group's `lr`, a loader's place) with `torch.load(weights_only=False)`: a snapshot folder written by
someone else could run any code at `--resume`, where a one-file snapshot cannot. So vram-bench reads both itself
first: the metadata with an unpickler that knows DCP's own metadata classes, `torch.Size`, dtypes and paths and
nothing else, and every value with `torch.load(weights_only=True)`, all before a live tensor is written. A snapshot
holding anything else is refused, named, and loads nothing.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata

from workbench.errors import UserError

METADATA = ".metadata"
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"  # its dataclasses and enums: what DCP's metadata is made of
_ALSO_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),  # where each item lies in the shard files
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout's name -> torch.strided (how torch pickles layouts)
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"), ("builtins", "frozenset"),
}


class NotPlainData(UserError):
    """A sharded snapshot holding something other than data: refused before anything is loaded."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == _METADATA_MODULE:
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        elif (module, name) in _ALSO_ALLOWED:
            return super().find_class(module, name)
        elif module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of torch.distributed.checkpoint's metadata")


def read_metadata(path: Path) -> Metadata:
    """The snapshot's DCP metadata, unpickled with nothing but DCP's own classes allowed."""
    try:
        with open(path / METADATA, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except OSError as exc:
        raise UserError(f"{path} is not a whole sharded snapshot ({METADATA}: {exc.strerror}).") from None
    except Exception as exc:  # noqa: BLE001 - refused classes, a truncated or foreign file
        raise NotPlainData(f"{path / METADATA} is not plain checkpoint metadata ({type(exc).__name__}: {exc}): "
                           "refused, nothing was loaded",
                           hint="Resume only from snapshots this project's runs wrote.") from None
    if not isinstance(metadata, Metadata):
        raise NotPlainData(f"{path / METADATA} holds a {type(metadata).__name__}, not checkpoint metadata: refused, "
                           "nothing was loaded")
    return metadata


class PlainDataReader(dcp.FileSystemReader):
    """DCP's file reader, whose metadata is read as `read_metadata` reads it (DCP's own read is `pickle.load`)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        read_metadata(Path(self.path))  # refuses what is not plain metadata before DCP unpickles the same file
        return super().read_metadata(*args, **kwargs)


class PlainDataLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, whose non-tensor values are unpickled with `weights_only=True` (DCP's own: False)."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        start = value.tell()
        try:
            torch.load(value, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - anything but plain data
            raise NotPlainData(f"the value {read_item.dest_index.fqn} is not plain data ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
        value.seek(start)
        super().load_bytes(read_item, value)  # a pickle that weights_only loads names only allowed classes


def check_values(path: Path, metadata: Metadata) -> None:
    """Read every non-tensor value of the snapshot through `PlainDataLoadPlanner` into a throwaway dict: one that is
    not plain data is refused before the real load writes any live tensor (DCP reads items in no fixed order)."""
    keys = [key for key, item in metadata.state_dict_metadata.items() if isinstance(item, BytesStorageMetadata)]
    if not keys:
        return
    throwaway: dict[str, Any] = dict.fromkeys(keys)
    try:
        dcp.load(throwaway, storage_reader=PlainDataReader(str(path)),
                 planner=PlainDataLoadPlanner(allow_partial_load=True), no_dist=True)
    except BaseException as exc:  # noqa: BLE001 - DCP wraps each rank's failure in a CheckpointException
        refused = _refusal_in(exc)
        if refused is None:
            raise
        raise NotPlainData(f"{path} holds {refused}: refused, nothing was loaded",
                           hint="Resume only from snapshots this project's runs wrote.") from None


def _refusal_in(exc: BaseException) -> str | None:
    """The NotPlainData message inside a DCP failure (its `failures` map each rank to (exception, traceback))."""
    if isinstance(exc, NotPlainData):
        return str(exc)
    for error, _ in getattr(exc, "failures", {}).values():
        if isinstance(error, NotPlainData):
            return str(error)
    return None
