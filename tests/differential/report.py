"""Say what went wrong in a way someone can reproduce: the seed, every edit as a diff, the events, the values."""

from __future__ import annotations

import difflib
from collections import Counter

from workbench.protocol.events import Event

from differential.generator import Save, Sequence
from differential.runner import SILENT, Result
from differential.script import ScriptSequence


def describe(event: Event) -> str:
    data = event.to_dict()
    for key in ("time", "ms", "traceback"):
        data.pop(key, None)
    name = data.pop("event")
    body = ", ".join(f"{k}={v!r}" for k, v in data.items() if v not in (None, [], (), 0.0) or k in ("ok", "code_version"))
    return f"{name}({body})"


def edits(sequence: Sequence | ScriptSequence) -> list[str]:
    """Every action, saves with a unified diff against the previous version of their file."""
    texts = sequence.initial_files()
    out = []
    for number, action in enumerate(sequence.actions, start=1):
        out.append(f"  {number}. {action.what}")
        if isinstance(action, Save):
            diff = difflib.unified_diff(
                texts[action.file].splitlines(), action.text.splitlines(), f"a/{action.file}", f"b/{action.file}", n=1, lineterm=""
            )
            out.extend(f"       {line}" for line in diff)
            texts[action.file] = action.text
    return out


def explain(result: Result) -> str:
    """A silent mismatch (or a harness problem) in full."""
    seq = result.sequence
    args = f", the script run with {' '.join(seq.argv)}" if seq.argv else ""
    lines = [f"seed {seq.seed} ({seq.family} family{args}): {result.outcome}"]
    lines.extend(f"  PROBLEM: {p}" for p in result.problems)
    lines.extend(f"  RANKS APART: {apart}" for apart in result.ranks_apart)
    lines.append("  edits:")
    lines.extend(edits(seq))
    lines.append("  checks:")
    for check in result.checks:
        marker = "SILENT" if check.verdict.silent else ("reported" if check.verdict.differing else "equal")
        lines.append(f"    after {check.action}: {marker} (against {check.against})")
        for event in check.events:
            if event.name in ("reload", "rebuild") or (event.name == "error" and not getattr(event, "is_warning", False)):
                lines.append(f"      {describe(event)}")
        if check.step_error:
            lines.append(f"      the step raised: {check.step_error}")
        for scalar, (live, fresh) in check.verdict.differing.items():
            how = "SILENT" if scalar in check.verdict.silent else f"reported by: {check.verdict.reported[scalar]!r}"
            lines.append(f"      {scalar}: live {live} != fresh {fresh}  [{how}]")
    return "\n".join(lines)


def summary(results: list[Result], seconds: float) -> str:
    counts = Counter(r.outcome for r in results)
    problems = sum(1 for r in results if r.problems)
    return (
        f"sequences run: {len(results)}\nsilent mismatches: {counts[SILENT]}\nheld/noted: {counts['held/noted']}\n"
        f"applied: {counts['applied']}\nharness problems: {problems}\nseconds: {seconds:.1f}"
    )


def failures(results: list[Result]) -> list[Result]:
    return [r for r in results if r.outcome == SILENT or r.problems]
