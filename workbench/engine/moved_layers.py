"""Layers that moved in a numbered container (`nn.Sequential`, `nn.ModuleList`) keep their trained weights.

A rebuild carries tensors over by name. Inserting one `nn.Dropout` into the DCGAN generator's `nn.Sequential`
renumbered every layer after it: `main.3` (a ConvTranspose2d) became `main.4`, where the old `main.4` was a
BatchNorm. Matched by name, 16 trained tensors were dropped, 3 reported as changed shape and 16 initialized
anew, though every trained layer was still there. So where a numbered container's children differ, old and new
children are aligned by what they are (class and tensor shapes), as difflib aligns lines, and a tensor is looked
up under its aligned old name. A child the alignment pairs with nothing is new: it is never matched to whatever
held its number before.
"""

from __future__ import annotations

from difflib import SequenceMatcher

import torch

Signature = tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]


def old_names(old: torch.nn.Module, new: torch.nn.Module) -> tuple[dict[str, str | None], list[str]]:
    """(new module path -> old module path, or None for a child new in a realigned container; the moves, as
    `old -> new` lines), for the modules whose path changed. Empty when no numbered container changed."""
    paths: dict[str, str | None] = {}
    moves: list[str] = []
    _align(old, new, "", "", paths, moves)
    return paths, moves


def old_name(paths: dict[str, str | None], name: str) -> str | None:
    """The old state_dict key of the new key `name` (`main.4.weight` -> `main.3.weight`); None if it is new."""
    prefix = name
    while "." in prefix:
        prefix = prefix.rsplit(".", 1)[0]
        if prefix in paths:
            mapped = paths[prefix]
            return None if mapped is None else mapped + name[len(prefix):]
    return name


def moved_note(model: str, moves: list[str]) -> str:
    shown = ", ".join(moves[:6]) + (f" and {len(moves) - 6} more" if len(moves) > 6 else "")
    return (f"{model}: layers moved within a numbered container (one inserted or removed), so their trained weights "
            f"were carried by position, not by number: {shown}")


def _align(old: torch.nn.Module, new: torch.nn.Module, old_path: str, new_path: str,
           paths: dict[str, str | None], moves: list[str]) -> None:
    old_children, new_children = dict(old.named_children()), dict(new.named_children())
    pairs: dict[str, str | None] = {key: key for key in new_children if key in old_children}
    if _numbered(old_children) and _numbered(new_children):
        old_signatures, new_signatures = _signatures(old_children), _signatures(new_children)
        if old_signatures != new_signatures:
            pairs = _aligned(list(old_children), list(new_children), old_signatures, new_signatures)
    for new_key, old_key in pairs.items():
        child_new = f"{new_path}.{new_key}" if new_path else new_key
        if old_key is None:
            paths[child_new] = None
            continue
        child_old = f"{old_path}.{old_key}" if old_path else old_key
        if child_old != child_new:
            paths[child_new] = child_old
            if old_key != new_key and next(iter(new_children[new_key].state_dict()), None) is not None:
                moves.append(f"{child_old} -> {child_new}")
        _align(old_children[old_key], new_children[new_key], child_old, child_new, paths, moves)


def _aligned(old_keys: list[str], new_keys: list[str], old_signatures: list[Signature],
             new_signatures: list[Signature]) -> dict[str, str | None]:
    """Each new child's old key, or None: runs of the same layers pair up; a run changed in place (as many
    layers on both sides, a width edited) pairs in order; an inserted or removed run pairs with nothing."""
    pairs: dict[str, str | None] = dict.fromkeys(new_keys)
    matcher = SequenceMatcher(None, old_signatures, new_signatures, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            pairs.update({new_keys[j1 + k]: old_keys[i1 + k] for k in range(j2 - j1)})
    return pairs


def _numbered(children: dict[str, torch.nn.Module]) -> bool:
    return bool(children) and all(key.isdigit() for key in children)


def _signatures(children: dict[str, torch.nn.Module]) -> list[Signature]:
    return [_signature(child) for child in children.values()]


def _signature(module: torch.nn.Module) -> Signature:
    """What a layer is, for the alignment: its class and its tensors' names and shapes."""
    tensors = module.state_dict(keep_vars=True)
    return type(module).__name__, tuple((name, tuple(t.shape)) for name, t in tensors.items() if isinstance(t, torch.Tensor))
