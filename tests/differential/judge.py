"""Decide, for one step, whether every difference from a fresh start was reported.

A scalar that differs from the fresh start is reported when some reload,
rebuild or rollback event since the live state was last built fresh (the
start, or a successful rebuild) names its construct in `held`,
`needs_rebuild`, `notes`, a rebuild's `notes` or a failed reload's `error`
(nothing said before a rebuild counts after it: it runs the module
statements a reload left for x, the import-time builders and setup() anew;
a note that says something now runs as a fresh start would counts never:
ledger.AFFIRMATIONS). A name counts
when it stands as a name: `make_scale` in `make_scale.<locals>.f`,
`GPT.helper`, a class named alone (`class GPT (line 9): ...` covers its
methods), a global of the entry module (`train.opt2`); `GPT.forward` does not
cover `GPT.helper`. Anything else is a silent mismatch. Each project family
has its table of names (project.py's SCALAR_NAMES, script.py's).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from differential.project import SCALAR_NAMES

_TOLERANCE = 1e-6


@dataclass
class Verdict:
    differing: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)  # scalar -> (live, fresh)
    reported: dict[str, str] = field(default_factory=dict)  # scalar -> the text that named it
    silent: list[str] = field(default_factory=list)


def same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= _TOLERANCE * max(1.0, abs(a), abs(b))


def _patterns(name: str) -> list[re.Pattern[str]]:
    # `train.opt2` (a module global, as a rebuild names it) names `opt2`; `GPT.helper` does not name `helper`.
    found = [re.compile(rf"(?<![\w.]){re.escape(name)}(?!\w)"), re.compile(rf"(?<![\w.])train\.{re.escape(name)}(?!\w)")]
    owner = name.split(".")[0]
    if "." in name and owner[:1].isupper():  # a class named alone covers its methods; `args` alone is no name
        found.append(re.compile(rf"(?<![\w.]){re.escape(owner)}(?![\w.])"))
    return found


def naming(texts: list[str], scalar: str, names: dict[str, tuple[str, ...]] = SCALAR_NAMES) -> str | None:
    """The first text that names a construct the scalar runs (`names`: the family's table), if any."""
    patterns = [p for name in names.get(scalar, (scalar,)) for p in _patterns(name)]
    for text in texts:
        if any(p.search(text) for p in patterns):
            return text
    return None


def judge(
    live: dict[str, float], fresh: dict[str, float], texts: list[str], names: dict[str, tuple[str, ...]] = SCALAR_NAMES
) -> Verdict:
    verdict = Verdict()
    for scalar in sorted(set(live) | set(fresh)):
        a, b = live.get(scalar), fresh.get(scalar)
        if same(a, b):
            continue
        verdict.differing[scalar] = (a, b)
        text = naming(texts, scalar, names)
        if text is None:
            verdict.silent.append(scalar)
        else:
            verdict.reported[scalar] = text
    return verdict


def unchanged(live: dict[str, float], before: dict[str, float]) -> Verdict:
    """After a save that cannot run (a syntax error): the old code keeps running, so nothing may change."""
    verdict = Verdict()
    for scalar in sorted(set(live) | set(before)):
        a, b = live.get(scalar), before.get(scalar)
        if not same(a, b):
            verdict.differing[scalar] = (a, b)
            verdict.silent.append(scalar)
    return verdict
