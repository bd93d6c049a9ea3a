"""Incremental parsing: only the statements around an edit are parsed again, with the same result as a full parse."""

from __future__ import annotations

import ast
import random
import textwrap
import traceback

import pytest

from workbench.engine.hotswap.planner import ReloadError, plan_reload
from workbench.engine.hotswap.source_index import SourceIndex, diff_source

SOURCE = textwrap.dedent(
    '''
    import math

    A = 1


    def f(x):
        return x + A


    @staticmethod
    def g(x):
        """Doc."""
        return x * 2


    class C:
        def m(self):
            return 3


    B = A + 1
    '''
)


def spans(index: SourceIndex) -> list[tuple[int, int, str]]:
    return [(s.start, s.end, ast.dump(s.current_node(), include_attributes=True)) for s in index.statements]


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.replace("return x + A", "y = x\n    return y + A"),  # grow a body
        lambda s: s.replace('"""Doc."""\n', ""),  # shrink one
        lambda s: s.replace("A = 1\n", "A = 1\nZ = 5\n"),  # add a statement
        lambda s: s.replace("\n\nB = A + 1", "\n# a comment\n\nB = A + 1"),  # a comment between statements
        lambda s: s.replace("class C:", "class C(object):"),
        lambda s: "import os\n" + s,  # everything below moves
        lambda s: s + "\ndef h():\n    return 1\n",
    ],
)
def test_incremental_diff_matches_a_full_parse(edit):
    base = SourceIndex.parse(SOURCE, "m.py")
    new = edit(SOURCE)
    diff = diff_source(base, new, "m.py")
    assert not diff.full_parse
    assert spans(diff.new_index) == spans(SourceIndex.parse(new, "m.py"))
    assert len(diff.old_region) <= 2, "only the statements around the edit are parsed again"


def test_random_line_edits_always_match_a_full_parse():
    rng = random.Random(7)
    base = SourceIndex.parse(SOURCE, "m.py")
    lines = SOURCE.splitlines(keepends=True)
    for _ in range(200):
        edited = list(lines)
        i = rng.randrange(len(edited))
        choice = rng.choice(["dup", "drop", "blank", "comment"])
        if choice == "dup":
            edited.insert(i, edited[i])
        elif choice == "drop":
            del edited[i]
        elif choice == "blank":
            edited.insert(i, "\n")
        else:
            edited.insert(i, "# note\n")
        new = "".join(edited)
        try:
            full = SourceIndex.parse(new, "m.py")
        except SyntaxError:
            with pytest.raises(SyntaxError):
                diff_source(base, new, "m.py")
            continue
        assert spans(diff_source(base, new, "m.py").new_index) == spans(full)


def test_edit_that_breaks_indentation_reports_the_full_file_line():
    base = SourceIndex.parse(SOURCE, "m.py")
    broken = SOURCE.replace("A = 1\n", "A = 1\n    oops = 2\n")
    with pytest.raises(SyntaxError) as info:
        diff_source(base, broken, "m.py")
    assert info.value.lineno == broken.splitlines().index("    oops = 2") + 1


def test_functions_below_an_edit_keep_correct_traceback_lines(tmp_path):
    import importlib.util

    body = "".join(f"def f{i}():\n    return {i}\n\n\n" for i in range(50)) + "def boom():\n    raise ValueError('x')\n"
    path = tmp_path / "big.py"
    path.write_text(body)
    spec = importlib.util.spec_from_file_location("big_for_lines", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    boom = module.boom

    edited = body.replace("def f3():\n    return 3\n", "def f3():\n    x = 3\n    y = x\n    return y\n")
    path.write_text(edited)
    changeset = plan_reload(module, path, body, edited)
    assert changeset.changed == ["f3"]
    for patch in changeset.patches:
        patch.apply()
    with pytest.raises(ValueError) as info:
        boom()
    line = traceback.extract_tb(info.value.__traceback__)[-1].lineno
    assert edited.splitlines()[line - 1].strip() == "raise ValueError('x')"
    assert module.boom is boom


def test_syntax_error_in_a_big_file_is_reported_at_its_line(tmp_path):
    import importlib.util

    body = "".join(f"def f{i}():\n    return {i}\n\n\n" for i in range(50))
    path = tmp_path / "big2.py"
    path.write_text(body)
    spec = importlib.util.spec_from_file_location("big_for_errors", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(ReloadError) as info:
        plan_reload(module, path, body, body.replace("return 10\n", "return (10\n"))
    assert info.value.line == 42
