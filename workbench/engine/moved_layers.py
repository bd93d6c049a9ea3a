"""Layers that moved in a numbered container (`nn.Sequential`, `nn.ModuleList`) keep their trained weights.

A rebuild carries tensors over by name, and a resume loads them by name. Inserting one `nn.Dropout` into the
DCGAN generator's `nn.Sequential` renumbered every layer after it: `main.3` (a ConvTranspose2d) became `main.4`,
where the old `main.4` was a BatchNorm. Matched by name, a rebuild dropped 16 trained tensors, called 3 changed in
shape and initialized 16 anew, though every trained layer was still there. So where a numbered container's children
differ, old and new children are aligned by what they hold (their tensors' names and shapes), as difflib aligns
lines, and a tensor is looked up under its aligned old name. Only the state_dict's keys and shapes are used, so a
snapshot, which has no modules, is aligned the same way. A child the alignment pairs with nothing is new: it is
never matched to whatever held its number before.
"""

from __future__ import annotations

from collections.abc import Mapping
from difflib import SequenceMatcher
from typing import Any

Shapes = dict[str, tuple[int, ...]]


def shapes_of(tensors: Mapping[str, Any]) -> Shapes:
    """A state_dict's keys with their tensors' shapes (entries that are not tensors, such as extra state, left out)."""
    return {key: tuple(value.shape) for key, value in tensors.items() if hasattr(value, "shape")}


def match_moved(old: Shapes, new: Mapping[str, Any], model: str) -> tuple[dict[str, str | None], str | None]:
    """Each key of the state_dict `new` with the old key it is matched to (None: it is new and matches nothing),
    and the note naming the layers that moved, or the wrapper whose prefix the two sides differ by (None: neither,
    so every key keeps its own name). `model`: what the note calls the model. What a rebuild, a resume and a sharded
    resume each ask."""
    old_of, new_of, wrapper = _without_wrappers(list(old), list(new))
    new_shapes = shapes_of(new)
    paths, moves = aligned_names({plain: old[key] for plain, key in old_of.items()},
                                 {plain: new_shapes[key] for plain, key in new_of.items() if key in new_shapes})
    matched: dict[str, str | None] = {}
    for plain, key in new_of.items():
        was = old_name(paths, plain) if paths else plain
        matched[key] = None if was is None else old_of.get(was, was if wrapper is None else key)
    notes = [note for note in (wrapper and f"{model}: {wrapper}", moves and moved_note(model, moves)) if note]
    return matched, "; ".join(notes) or None


# Prefixes a wrapper adds to every key of the model it wraps: torch.compile's OptimizedModule (`_orig_mod.`, anywhere
# a compiled submodule sits) and DistributedDataParallel's or DataParallel's `module.` (at the front). A snapshot of a
# compiled model could not be resumed into the same model uncompiled (every key "missing", every saved one
# "unexpected"), nor one taken under torchrun's DDP into a single process that does not wrap it.
_COMPILED = "_orig_mod"
_PARALLEL = "module."


def _without_wrappers(old: list[str], new: list[str]) -> tuple[dict[str, str], dict[str, str], str | None]:
    """(plain key -> old key, plain key -> new key, the note's words) where the two sides differ only by a wrapper's
    prefix; otherwise each side's keys as they are, and None."""
    same = ({key: key for key in old}, {key: key for key in new}, None)
    old_plain, new_plain = {_uncompiled(k): k for k in old}, {_uncompiled(k): k for k in new}
    if len(old_plain) != len(old) or len(new_plain) != len(new):
        return same  # two keys that differ only by the prefix: not a wrapper's
    was, now = (any(_COMPILED in key.split(".") for key in keys) for keys in (old, new))
    how = []
    if was != now:
        how.append(f"compiled with torch.compile {'before, not now' if was else 'now, not before'} (`{_COMPILED}.`)")
    elif was and set(old) != set(new):
        how.append(f"compiled with torch.compile at another place (`{_COMPILED}.`)")
    if old_plain and new_plain:
        old_parallel, new_parallel = (all(k.startswith(_PARALLEL) for k in keys) for keys in (old_plain, new_plain))
        if old_parallel and not any(k.startswith(_PARALLEL) for k in new_plain):
            old_plain = {k[len(_PARALLEL):]: v for k, v in old_plain.items()}
            how.append(f"wrapped in DistributedDataParallel before, not now (`{_PARALLEL}`)")
        elif new_parallel and not any(k.startswith(_PARALLEL) for k in old_plain):
            new_plain = {k[len(_PARALLEL):]: v for k, v in new_plain.items()}
            how.append(f"wrapped in DistributedDataParallel now, not before (`{_PARALLEL}`)")
    if not how or not set(old_plain) & set(new_plain):
        return same
    return old_plain, new_plain, f"its tensors were matched by name without a wrapper's prefix: {'; '.join(how)}"


def _uncompiled(key: str) -> str:
    return ".".join(part for part in key.split(".") if part != _COMPILED)


def aligned_names(old: Shapes, new: Shapes) -> tuple[dict[str, str | None], list[str]]:
    """(new module path -> old module path, or None for a child new in a realigned container, for each module whose
    path changed; the moves, as `old -> new`). Both empty when no numbered container changed."""
    paths: dict[str, str | None] = {}
    moves: list[str] = []
    _align(old, new, "", "", paths, moves)
    return paths, moves


def old_name(paths: dict[str, str | None], name: str) -> str | None:
    """The old key of the new key `name` (`main.4.weight` -> `main.3.weight`); None if it is new."""
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
            f"were matched by position, not by number: {shown}")


def _align(old: Shapes, new: Shapes, old_path: str, new_path: str,
           paths: dict[str, str | None], moves: list[str]) -> None:
    old_children, new_children = _children(old), _children(new)
    pairs: dict[str, str | None] = {key: key for key in new_children if key in old_children}
    # (a layer without tensors, a Dropout, has no keys: the numbers skip it, and its insertion shows as new numbers)
    if _numbered(old_children) and _numbered(new_children):
        old_signatures = [tuple(child.items()) for child in old_children.values()]
        new_signatures = [tuple(child.items()) for child in new_children.values()]
        if list(old_children) != list(new_children) or old_signatures != new_signatures:
            pairs = _aligned(list(old_children), list(new_children), old_signatures, new_signatures)
    for new_key, old_key in pairs.items():
        child_new = f"{new_path}.{new_key}" if new_path else new_key
        if old_key is None:
            paths[child_new] = None
            continue
        child_old = f"{old_path}.{old_key}" if old_path else old_key
        if child_old != child_new:
            paths[child_new] = child_old
            if old_key != new_key:
                moves.append(f"{child_old} -> {child_new}")
        _align(old_children[old_key], new_children[new_key], child_old, child_new, paths, moves)


def _children(keys: Shapes) -> dict[str, Shapes]:
    """Each submodule's keys, relative to it, in order: `{"3": {"weight": ..., "bias": ...}}` from `3.weight`, ..."""
    children: dict[str, Shapes] = {}
    for key, shape in keys.items():
        head, dot, rest = key.partition(".")
        if dot:
            children.setdefault(head, {})[rest] = shape
    return children


def _aligned(old_keys: list[str], new_keys: list[str], old_signatures: list[Any],
             new_signatures: list[Any]) -> dict[str, str | None]:
    """Each new child's old key, or None: runs of the same layers pair up; a run changed in place (as many
    layers on both sides, a width edited) pairs in order; an inserted or removed run pairs with nothing."""
    pairs: dict[str, str | None] = dict.fromkeys(new_keys)
    matcher = SequenceMatcher(None, old_signatures, new_signatures, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            pairs.update({new_keys[j1 + k]: old_keys[i1 + k] for k in range(j2 - j1)})
    return pairs


def _numbered(children: dict[str, Shapes]) -> bool:
    return bool(children) and all(key.isdigit() for key in children)
