"""tests/tour.py itself: how a README's tour edits are read, and how a broken tour fails loudly."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.tour import TourEdit, tour_edits

REPO = Path(__file__).resolve().parent.parent

TWO_EDITS = """\
# A sample

Start it, then:

<!-- tour-edit: lr in train.py -->
```python
LR = 3e-3
```

to

```python
LR = 3e-4
```

Some prose, and a block that is not an edit:

```bash
vram-bench run train.py
```

<!--tour-edit:  scale-2  in  sub/model.py-->
```
    x = x * 2
    return x
```

```
    x = x * 3
    return x
```
"""


def readme(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "README.md"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_markers_are_read_in_order_with_their_find_and_replace_blocks(tmp_path):
    edits = tour_edits(readme(tmp_path, TWO_EDITS))
    assert edits == [
        TourEdit("lr", "train.py", "LR = 3e-3", "LR = 3e-4"),
        TourEdit("scale-2", "sub/model.py", "    x = x * 2\n    return x", "    x = x * 3\n    return x"),
    ]


def test_a_readme_without_markers_has_no_edits(tmp_path):
    assert tour_edits(readme(tmp_path, "# Nothing\n\n```python\nLR = 1\n```\n")) == []


def test_apply_replaces_the_one_occurrence_and_saves(tmp_path):
    project = tmp_path / "proj"
    (project / "sub").mkdir(parents=True)
    (project / "sub" / "model.py").write_text("def f(x):\n    x = x * 2\n    return x\n", encoding="utf-8")
    edit = tour_edits(readme(tmp_path, TWO_EDITS))[1]
    path = edit.apply(project)
    assert path == project / "sub" / "model.py"
    assert path.read_text(encoding="utf-8") == "def f(x):\n    x = x * 3\n    return x\n"


@pytest.mark.parametrize(("source", "count"), [("LR = 1e-3\n", 0), ("LR = 3e-3\nOLD_LR = 3e-3\n", 2)])
def test_apply_rejects_a_find_text_that_is_not_there_exactly_once(tmp_path, source, count):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(source, encoding="utf-8")
    edit = tour_edits(readme(tmp_path, TWO_EDITS))[0]
    with pytest.raises(AssertionError, match=rf"'LR = 3e-3' occurs {count} times in train.py, expected once"):
        edit.apply(project)
    assert (project / "train.py").read_text(encoding="utf-8") == source, "a rejected edit must not touch the file"


def test_a_marker_needs_two_blocks(tmp_path):
    text = "<!-- tour-edit: lone in train.py -->\n```python\nLR = 3e-3\n```\n\nThe end.\n"
    with pytest.raises(AssertionError, match="tour edit 'lone' needs two fenced blocks after it"):
        tour_edits(readme(tmp_path, text))


def test_a_marker_whose_second_block_comes_after_another_marker_is_rejected(tmp_path):
    text = """\
    <!-- tour-edit: first in train.py -->
    ```python
    A = 1
    ```

    <!-- tour-edit: second in train.py -->
    ```python
    A = 2
    ```

    ```python
    A = 3
    ```
    """
    with pytest.raises(AssertionError, match="tour edit 'first' is followed by another marker before its second block"):
        tour_edits(readme(tmp_path, text))


def test_repeated_names_are_rejected(tmp_path):
    block = "<!-- tour-edit: lr in train.py -->\n```python\nLR = {}\n```\n\n```python\nLR = {}\n```\n\n"
    with pytest.raises(AssertionError, match=r"tour edit names repeat: \['lr', 'lr'\]"):
        tour_edits(readme(tmp_path, block.format(1, 2) + block.format(2, 3)))


@pytest.mark.parametrize(
    ("first", "second", "message"),
    [("", "LR = 1", "has nothing to find"), ("LR = 1", "LR = 1", "changes nothing")],
)
def test_an_empty_or_idle_edit_is_rejected(tmp_path, first, second, message):
    text = f"<!-- tour-edit: idle in train.py -->\n```python\n{first}\n```\n\n```python\n{second}\n```\n"
    with pytest.raises(AssertionError, match=f"tour edit 'idle' {message}"):
        tour_edits(readme(tmp_path, text))


# Every sample whose README has a tour written as tour edits (its own test runs them in a live session).
TOURS = sorted(p.parent.name for p in (REPO / "sample_projects").glob("*/README.md") if "tour-edit:" in p.read_text(encoding="utf-8"))


def test_the_samples_with_tours_are_found():
    assert {"tiny_gpt", "leaky_loop"} <= set(TOURS)


@pytest.mark.parametrize("sample", TOURS)
def test_every_sample_tour_applies_in_order_to_a_copy_of_its_files(tmp_path, sample):
    """Text only (no session): each edit finds its text exactly once at its point of the tour."""
    root = REPO / "sample_projects" / sample
    edits = tour_edits(root / "README.md")
    assert edits, f"{sample}'s README mentions tour-edit but no marker parses"
    project = tmp_path / sample
    for name in {edit.file for edit in edits}:
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text((root / name).read_text(encoding="utf-8"), encoding="utf-8")
    for edit in edits:
        before = (project / edit.file).read_text(encoding="utf-8")
        edit.apply(project)
        after = (project / edit.file).read_text(encoding="utf-8")
        assert after != before and edit.replace in after
    for name in {edit.file for edit in edits}:  # where the tour ends, every file is valid Python again
        compile((project / name).read_text(encoding="utf-8"), name, "exec")
