"""The memory_lab sample: every flip in its README is a live save, a new row in the versions table, and an effect.

One real session trains the sample (copied to a tmp folder) and makes the
README's edits in order, each as a real save of train.py. After each save the
new code version runs a few steps (the first steps of every version are the
ones measured with saved-tensor hooks), and its row must name the constant and
move `saved_bytes_per_step` the way the README says. Step times are recorded
but not asserted: on a shared 2-core machine they are too noisy to order.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from tests.conftest import is_event, save

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_projects" / "memory_lab"
README = SAMPLE / "README.md"

STEPS_PER_VERSION = 3  # == versions.SAVED_MEASURE_STEPS: every step this test waits for is measured

# The values train.py ships with.
ORIGINAL = {"AMP": "False", "CHECKPOINT": "False", "ACCUM_STEPS": "1", "OFFLOAD_ACTIVATIONS": "False", "BATCH_SIZE": "1024"}

# The README's tour, save by save: the line(s) after the edit. The README must show exactly these blocks, in this order.
TOUR: list[tuple[str, ...]] = [
    ("CHECKPOINT = True",),
    ("CHECKPOINT = False",),
    ("AMP = True",),
    ("AMP = False",),
    ("BATCH_SIZE = 256",),
    ("BATCH_SIZE = 1024",),
    ("ACCUM_STEPS = 4",),
    ("ACCUM_STEPS = 1",),
    ("OFFLOAD_ACTIVATIONS = True",),
    ("OFFLOAD_ACTIVATIONS = False",),
    ("AMP = True", "CHECKPOINT = True"),
]

_FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
_ASSIGNMENT = re.compile(r"^[A-Z][A-Z0-9_]* = [^#()]+$")


def readme_edits() -> list[tuple[str, ...]]:
    """The README's fenced python blocks made only of `NAME = literal` lines: the edits it tells the user to save."""
    blocks = []
    for body in _FENCE.findall(README.read_text(encoding="utf-8")):
        lines = tuple(line.strip() for line in body.strip().splitlines())
        if lines and all(_ASSIGNMENT.match(line) for line in lines):
            blocks.append(lines)
    return blocks


def apply_edit(source: str, line: str) -> str:
    """Change the value on the constant's line in place, keeping its comment, like an editor would."""
    name, value = line.split(" = ")
    edited, count = re.subn(rf"^({name} = )\S+", lambda m: m.group(1) + value, source, flags=re.M)
    assert count == 1, f"train.py must have exactly one `{name} = ...` line"
    return edited


def table(rows: list[dict]) -> str:
    """The versions table as text, for failure messages."""
    out = []
    for r in rows:
        saved = "n/a" if r["saved_bytes_per_step"] is None else f"{r['saved_bytes_per_step'] / 1e6:.2f}MB"
        out.append(
            f"v{r['version']:<2} {','.join(r['changed']) or '(start)':<24} steps={r['steps']:<3} "
            f"ms={r['median_step_ms']} saved={saved} "
            f"loss={r['mean_loss']} delta={r['delta']!r}"
        )
    return "\n".join(out)


def test_the_readme_shows_exactly_the_edits_the_tour_makes():
    assert readme_edits() == TOUR
    source = (SAMPLE / "train.py").read_text(encoding="utf-8")
    for name, value in ORIGINAL.items():
        assert re.search(rf"^{name} = {value}(\s|$)", source, re.M), f"train.py should start with {name} = {value}"
    # Every flip is put back before the next one, so each row compares against the starting code.
    for flip, back in zip(TOUR[0:10:2], TOUR[1:10:2]):
        name = flip[0].split(" = ")[0]
        assert back == (f"{name} = {ORIGINAL[name]}",), (flip, back)


def test_each_flip_is_a_new_version_with_its_effect(start_session, tmp_path):
    files = {path.name: path.read_text(encoding="utf-8") for path in SAMPLE.glob("*.py")}
    live = start_session(files)
    live.wait_for(is_event("setup", status="done"), timeout=60)
    first = live.events.steps(STEPS_PER_VERSION, timeout=60)
    source = files["train.py"]
    versions = live.session.telemetry.versions
    last_steps = {}

    for version, lines in enumerate(TOUR, start=1):
        for line in lines:
            source = apply_edit(source, line)
        save(live.entry, source)
        reload = live.wait_for(is_event("reload", code_version=version), timeout=30)
        names = {line.split(" = ")[0] for line in lines}
        assert reload.ok and set(reload.changed) == names, reload
        last_steps[version] = live.events.steps(STEPS_PER_VERSION, lambda e, v=version: e.code_version == v, timeout=60)

    rows = versions.rows()
    shown = table(rows)
    assert [r["version"] for r in rows] == list(range(len(TOUR) + 1)), shown
    assert rows[0]["changed"] == (), shown
    for row, lines in zip(rows[1:], TOUR):
        assert set(row["changed"]) == {line.split(" = ")[0] for line in lines}, shown
        assert row["steps"] >= STEPS_PER_VERSION and row["median_step_ms"] > 0, shown
    saved = [r["saved_bytes_per_step"] for r in rows]
    assert all(isinstance(s, int) for s in saved), shown
    base = saved[0]
    assert base > 20e6, f"the model should save tens of MB of activations per step\n{shown}"

    # Every row that puts a flag back (v2, v4, ... v10) measures what the starting code did.
    for version in range(2, 11, 2):
        assert abs(saved[version] - base) <= 0.02 * base, f"v{version} should be back at the start's figure\n{shown}"

    # v1 CHECKPOINT = True: only each block's input is kept; the rest is recomputed in backward.
    assert saved[1] < 0.3 * saved[0], shown
    assert "saved activations" in rows[1]["delta"] and rows[1]["delta"].startswith("-"), shown
    # v3 AMP = True: the matmuls' inputs and outputs are bf16, 2 bytes instead of 4 (LayerNorm stays fp32).
    assert saved[3] < 0.7 * saved[2], shown
    # v5 BATCH_SIZE = 256: activations scale with the rows in the batch.
    assert saved[5] < 0.3 * saved[4], shown
    assert all(e.scalars["batch_size"] == 256 for e in last_steps[5])
    # v7 ACCUM_STEPS = 4: saved/step counts all four micro-batches, so it is no more than the whole batch's
    # (often less: a micro-batch's tensors can reuse the storage the previous one freed, counted once);
    # what is alive at once is one micro-batch, at most a third of the whole batch's figure.
    assert saved[7] <= 1.02 * saved[6], shown
    assert saved[7] / 4 < 0.35 * saved[6], shown
    assert all(e.scalars["accum_steps"] == 4 and e.scalars["batch_size"] == 1024 for e in last_steps[7])
    # v9 OFFLOAD_ACTIVATIONS = True: on CPU there is no memory direction to assert (the copies stay in the same
    # RAM); only that the flag is live and the model still trains.
    assert all(e.scalars["offload"] == 1.0 and math.isfinite(e.loss) for e in last_steps[9])
    assert all(e.scalars["offload"] == 0.0 for e in last_steps[10])
    # v11 AMP and CHECKPOINT together: below either one alone.
    assert saved[11] < min(saved[1], saved[3]), shown
    assert all(e.scalars["amp"] == 1.0 and e.scalars["checkpoint"] == 1.0 for e in last_steps[11])

    # The model kept training across all eleven saves (never restarted: the step count only grew).
    assert rows[-1]["mean_loss"] < first[0].loss - 0.5, shown
    assert last_steps[len(TOUR)][-1].step > first[-1].step + len(TOUR) * STEPS_PER_VERSION - 1

    exported = json.loads(versions.export(tmp_path / "export", "json").read_text())
    assert [r["saved_bytes_per_step"] for r in exported] == saved
