"""`plan_reload` on real modules imported from tmp files, and the patches it plans.

Each test imports a module from source, keeps references to live objects, plans
a reload against an edited source, applies the patches, and checks that the
live objects (not fresh copies) now behave like the new source.
"""

from __future__ import annotations

import __future__
import itertools
import sys
import textwrap
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from conftest import import_file, line_of
from workbench.engine.hotswap.deleted_names import RemoveDeleted
from workbench.engine.hotswap.patches import ReplaceCode, RunInNamespace, SetAttribute, apply_all, undo_all
from workbench.engine.hotswap.planner import ChangeSet, ReloadError, plan_reload
from workbench.engine.session import REQUIRED_FUNCTIONS

_counter = itertools.count()

Loader = Callable[..., tuple[types.ModuleType, Path]]


@pytest.fixture
def load_module(tmp_path: Path) -> Iterator[Loader]:
    """Import `source` from a file in tmp_path as a real module (registered in sys.modules)."""
    names: list[str] = []

    def load(source: str, name: str | None = None) -> tuple[types.ModuleType, Path]:
        name = name or f"wb_planner_mod_{next(_counter)}"
        names.append(name)
        return import_file(tmp_path, name, source), tmp_path / f"{name}.py"

    sys.path.insert(0, str(tmp_path))
    try:
        yield load
    finally:
        sys.path.remove(str(tmp_path))
        for name in names:
            sys.modules.pop(name, None)


def plan(module: types.ModuleType, path: Path, old: str, new: str, **kwargs) -> ChangeSet:  # type: ignore[no-untyped-def]
    new = textwrap.dedent(new)
    path.write_text(new, encoding="utf-8")
    return plan_reload(module, path, textwrap.dedent(old), new, **kwargs)


def reload(module: types.ModuleType, path: Path, old: str, new: str, **kwargs) -> ChangeSet:  # type: ignore[no-untyped-def]
    changeset = plan(module, path, old, new, **kwargs)
    apply_all(changeset.patches)
    return changeset


# --------------------------------------------------------------------------- moved code

MOVED_OLD = """\
def helper():
    return 1


def boom():
    raise ValueError("here")


class Thing:
    def value(self):
        return 5
"""

MOVED_NEW = """\
# Three new comment lines at the top
# push every definition down,
# without changing any of them.


def helper():
    return 1


def boom():
    raise ValueError("here")


class Thing:

    def value(self):
        return 5
"""


def test_moved_functions_are_not_changes_but_get_their_new_line_numbers(load_module: Loader) -> None:
    module, path = load_module(MOVED_OLD)
    helper, boom, value = module.helper, module.boom, module.Thing.value
    changeset = reload(module, path, MOVED_OLD, MOVED_NEW)
    assert changeset.changed == []
    assert module.helper is helper and module.boom is boom and module.Thing.value is value
    assert helper.__code__.co_firstlineno == line_of(MOVED_NEW, "def helper")
    assert value.__code__.co_firstlineno == line_of(MOVED_NEW, "def value")
    # Tracebacks point at the line that is in the file now.
    with pytest.raises(ValueError) as info:
        boom()
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].filename == str(path)
    assert frames[-1].lineno == line_of(MOVED_NEW, 'raise ValueError("here")')


# --------------------------------------------------------------------------- functions


def test_body_and_default_argument_changes_patch_the_same_function(load_module: Loader) -> None:
    old = """\
    def scaled(x, factor=2, *, offset=0):
        \"\"\"old doc\"\"\"
        return x * factor + offset
    """
    new = """\
    def scaled(x, factor=3, *, offset=10):
        \"\"\"new doc\"\"\"
        return x * factor + offset
    """
    module, path = load_module(old)
    scaled = module.scaled
    assert scaled(1) == 2
    changeset = reload(module, path, old, new)
    assert changeset.changed == ["scaled"]
    assert module.scaled is scaled
    assert scaled(1) == 13
    assert scaled.__defaults__ == (3,) and scaled.__kwdefaults__ == {"offset": 10}
    assert scaled.__doc__ == "new doc"


def test_a_function_held_elsewhere_sees_the_new_code(load_module: Loader) -> None:
    old = """\
    def helper():
        return "old"
    """
    module, path = load_module(old, name=f"wb_planner_lib_{next(_counter)}")
    user, _ = load_module(f"from {module.__name__} import helper\n\ndef call():\n    return helper()\n")
    held = module.helper
    assert user.call() == "old"
    reload(module, path, old, old.replace('"old"', '"new"'))
    assert held() == "new"
    assert user.call() == "new"
    assert user.helper is held


def test_added_function_and_constant_are_bound_in_the_live_module(load_module: Loader) -> None:
    old = """\
    LIMIT = 1

    def use():
        return LIMIT
    """
    new = """\
    LIMIT = 2
    EXTRA = [1, 2]

    def use():
        return LIMIT + added()

    def added():
        return len(EXTRA)
    """
    module, path = load_module(old)
    use = module.use
    changeset = reload(module, path, old, new)
    assert set(changeset.changed) == {"LIMIT", "EXTRA", "use", "added"}
    assert use() == 4
    assert module.added.__globals__ is module.__dict__


def test_removed_function_leaves_the_module_and_a_rollback_puts_it_back(load_module: Loader) -> None:
    old = "def keep():\n    return 1\n\n\ndef gone():\n    return 2\n"
    module, path = load_module(old)
    gone = module.gone
    changeset = reload(module, path, old, "def keep():\n    return 1\n")
    assert "gone" not in vars(module)  # as a restart: a forgotten call site raises NameError
    (removal,) = [p for p in changeset.patches if isinstance(p, RemoveDeleted)]
    assert removal.notes == ["removed gone (deleted from the file)"] and removal.removed == ["gone"]
    undo_all(changeset.patches)
    assert module.gone is gone


def test_call_statements_are_not_rerun(load_module: Loader) -> None:
    old = 'SIZE = int("3")\nITEMS = list(range(SIZE))\n'
    new = 'SIZE = int("5")\nITEMS = list(range(SIZE))\n'
    module, path = load_module(old)
    changeset = reload(module, path, old, new)
    assert changeset.changed == []
    assert module.SIZE == 3 and module.ITEMS == [0, 1, 2]
    assert len(changeset.notes) == 2
    assert changeset.notes[0].startswith('line 1: `SIZE = int("5")` was not re-run')
    assert changeset.notes[1].endswith("(line(s) 2)")  # x runs ITEMS too, if SIZE changed: it is made from SIZE
    apply_all([patch for _, patch in changeset.statements])
    assert module.SIZE == 5 and module.ITEMS == [0, 1, 2, 3, 4]


def test_no_grad_decorated_function_is_patched_inside_its_wrapper(load_module: Loader) -> None:
    old = """\
    import torch

    @torch.no_grad()
    def measure(t):
        return (t * 2).sum(), torch.is_grad_enabled()
    """
    module, path = load_module(old)
    wrapper = module.measure
    inner = wrapper.__wrapped__
    t = torch.ones(3, requires_grad=True)
    assert wrapper(t)[0].item() == 6.0
    changeset = reload(module, path, old, old.replace("t * 2", "t * 3"))
    assert changeset.changed == ["measure"]
    assert module.measure is wrapper and wrapper.__wrapped__ is inner
    value, grad_enabled = wrapper(t)
    assert value.item() == 9.0
    assert grad_enabled is False and value.requires_grad is False


# --------------------------------------------------------------------------- classes

CLASS_OLD = """\
class Base:
    def describe(self):
        return "base"


class Child(Base):
    def describe(self):
        return "child:" + super().describe()

    def legacy(self):
        return "legacy"

    def plain(self):
        return 1
"""


def test_methods_added_removed_and_using_super(load_module: Loader) -> None:
    new = CLASS_OLD.replace('"child:"', '"CHILD:"').replace(
        '    def legacy(self):\n        return "legacy"\n\n', ""
    ) + (
        "\n    def added(self):\n"
        '        return "added+" + super().describe()\n'
        "\n    def plain_twice(self):\n"
        "        return self.plain() * 2\n"
    )
    module, path = load_module(CLASS_OLD)
    child_cls = module.Child
    instance = child_cls()
    describe = child_cls.__dict__["describe"]
    changeset = reload(module, path, CLASS_OLD, new)
    assert set(changeset.changed) == {"Child.describe", "Child.legacy (removed)", "Child.added", "Child.plain_twice"}
    assert module.Child is child_cls
    assert child_cls.__dict__["describe"] is describe
    assert instance.describe() == "CHILD:base"
    assert instance.added() == "added+base"  # super() in a method that did not exist before
    assert instance.plain_twice() == 2
    assert not hasattr(instance, "legacy")
    assert child_cls.added.__globals__ is module.__dict__


def test_a_method_that_starts_using_super_is_rebound(load_module: Loader) -> None:
    module, path = load_module(CLASS_OLD)
    instance = module.Child()
    new = CLASS_OLD.replace("    def plain(self):\n        return 1\n", "    def plain(self):\n        return super().describe()\n")
    changeset = reload(module, path, CLASS_OLD, new)
    assert changeset.changed == ["Child.plain"]
    assert instance.plain() == "base"


def test_staticmethod_classmethod_and_property_changes(load_module: Loader) -> None:
    old = """\
    class Shapes:
        unit = 1

        @staticmethod
        def area(w, h):
            return w * h

        @classmethod
        def make(cls):
            return cls.unit + 1

        @property
        def name(self):
            return "old"

        @name.setter
        def name(self, value):
            self._name = value
    """
    new = (
        old.replace("return w * h", "return w * h * 2")
        .replace("return cls.unit + 1", "return cls.unit + 10")
        .replace('return "old"', 'return "new:" + getattr(self, "_name", "")')
        .replace("self._name = value", "self._name = value.upper()")
        .replace("unit = 1", "unit = 5")
    )
    module, path = load_module(old)
    cls = module.Shapes
    shape = cls()
    descriptors = {k: cls.__dict__[k] for k in ("area", "make", "name")}
    changeset = reload(module, path, old, new)
    assert set(changeset.changed) == {"Shapes.area", "Shapes.make", "Shapes.name", "Shapes.unit"}
    assert all(cls.__dict__[k] is v for k, v in descriptors.items())
    assert cls.area(2, 3) == 12 and shape.area(1, 1) == 2
    assert cls.make() == 15 and shape.make() == 15
    shape.name = "abc"
    assert shape.name == "new:ABC"


def test_changed_class_attribute_and_module_level_instance(load_module: Loader) -> None:
    old = """\
    class Config:
        size = 2

        def doubled(self):
            return self.size * 2


    CONFIG = Config()
    """
    module, path = load_module(old)
    config = module.CONFIG
    changeset = reload(module, path, old, old.replace("size = 2", "size = 7"))
    assert changeset.changed == ["Config.size"]
    assert module.CONFIG is config and config.doubled() == 14


def test_name_error_in_a_class_body_is_a_reload_error_and_changes_nothing(load_module: Loader) -> None:
    old = """\
    LIMIT = 1

    class Config:
        size = 2

        def get(self):
            return self.size
    """
    new = """\
    LIMIT = 100

    class Config:
        size = 2
        extra = UNDEFINED_NAME + 1

        def get(self):
            return self.size * 10
    """
    module, path = load_module(old)
    snapshot = dict(module.__dict__)
    cls = module.Config
    class_dict = dict(cls.__dict__)
    code = cls.get.__code__
    with pytest.raises(ReloadError) as info:
        plan(module, path, old, new)
    assert info.value.line == line_of(new, "UNDEFINED_NAME")
    assert "NameError" in info.value.message and "UNDEFINED_NAME" in info.value.message
    assert module.__dict__.keys() == snapshot.keys()
    assert all(module.__dict__[k] is v for k, v in snapshot.items())
    assert dict(cls.__dict__) == class_dict and cls.get.__code__ is code
    assert module.LIMIT == 1 and cls().get() == 2


def test_syntax_error_is_a_reload_error_with_the_line(load_module: Loader) -> None:
    old = "def f():\n    return 1\n"
    module, path = load_module(old)
    with pytest.raises(ReloadError) as info:
        plan(module, path, old, "def f():\n    return 1\n\ndef g(:\n    pass\n")
    assert info.value.line == 4
    assert info.value.message.startswith("syntax error")
    assert module.f() == 1 and "g" not in module.__dict__


def test_contract_is_checked_on_reload(load_module: Loader) -> None:
    old = "def setup(bench):\n    return {}\n\n\ndef step(state, bench):\n    return 1.0\n"
    module, path = load_module(old)
    with pytest.raises(ReloadError) as info:
        plan(module, path, old, old.replace("def step(state, bench):", "def step(state):"), required=REQUIRED_FUNCTIONS)
    assert info.value.line == 5 and "does not match the contract" in info.value.message
    counted = old.replace("    return 1.0\n", "    global step\n    step = 1\n    return 1.0\n")
    with pytest.raises(ReloadError) as info:
        plan(module, path, old, counted, required=REQUIRED_FUNCTIONS)
    assert info.value.line == 7 and "declares `global step` and binds it" in info.value.message
    with pytest.raises(ReloadError, match=r"step\(\) is no longer defined"):
        plan(module, path, old, "def setup(bench):\n    return {}\n", required=REQUIRED_FUNCTIONS)
    changeset = plan(module, path, old, old.replace("return {}", "return {'a': 1}"), required=REQUIRED_FUNCTIONS)
    assert changeset.changed == ["setup"]
    assert any("setup() changed" in reason for reason in changeset.needs_rebuild)


# --------------------------------------------------------------------------- all or nothing


def test_apply_all_undoes_everything_when_one_patch_fails(load_module: Loader) -> None:
    module, _ = load_module(
        """\
        LIMIT = 1

        def f():
            return "old f"

        def g():
            return "old g"

        class Holder:
            x = 1
        """
    )
    f, g, holder = module.f, module.g, module.Holder
    f_code, g_code = f.__code__, g.__code__

    def new_f():
        return "new f"

    def make_closure():
        captured = "free variable"

        def with_freevar():
            return captured

        return with_freevar

    patches = [
        ReplaceCode.taking(f, new_f),
        SetAttribute(holder, "x", 99),
        SetAttribute(holder, "added", 5),
        RunInNamespace(compile("LIMIT = 2\nNEW_NAME = 3\n", "<test>", "exec"), module.__dict__, ("LIMIT", "NEW_NAME")),
        ReplaceCode.taking(g, make_closure()),  # CPython refuses: g has no free variables
    ]
    with pytest.raises(ValueError):
        apply_all(patches)
    assert f.__code__ is f_code and f() == "old f"
    assert g.__code__ is g_code and g() == "old g"
    assert holder.x == 1 and "added" not in holder.__dict__
    assert module.LIMIT == 1 and "NEW_NAME" not in module.__dict__

    # Without the failing patch, the same patches apply, and undo_all reverts them.
    good = patches[:-1]
    apply_all(good)
    assert f() == "new f" and holder.x == 99 and holder.added == 5 and module.LIMIT == 2 and module.NEW_NAME == 3
    undo_all(good)
    assert f() == "old f" and holder.x == 1 and "added" not in holder.__dict__
    assert module.LIMIT == 1 and "NEW_NAME" not in module.__dict__


def test_a_planned_reload_is_all_or_nothing(load_module: Loader) -> None:
    old = """\
    def first():
        return 1

    def second():
        return 2
    """
    module, path = load_module(old)
    first, second = module.first, module.second
    changeset = plan(module, path, old, old.replace("return 1", "return 10").replace("return 2", "return 20"))
    assert [type(p) for p in changeset.patches] == [ReplaceCode, ReplaceCode]

    class Boom(RuntimeError):
        pass

    class FailingPatch(ReplaceCode):
        def apply(self) -> None:
            raise Boom("patch failed")

    changeset.patches[-1] = FailingPatch(second, changeset.patches[-1].code)
    with pytest.raises(Boom):
        apply_all(changeset.patches)
    assert first() == 1 and second() == 2


def test_a_constant_derived_from_a_changed_one_is_not_silently_stale(load_module: Loader) -> None:
    old = "A = 1\nB = A * 2\n"
    module, path = load_module(old)
    changeset = reload(module, path, old, "A = 2\nB = A * 2\n")
    assert module.A == 2
    assert module.B == 4 or any("B" in note for note in changeset.notes), (module.B, changeset.notes)


# --------------------------------------------------------------------------- the file's own __future__ imports


@pytest.mark.parametrize("future", [False, True])
def test_saved_code_is_compiled_with_the_files_own_future_imports_and_no_others(load_module: Loader, future: bool) -> None:
    """vram-bench's own modules use `from __future__ import annotations`; compile() hands a caller's future imports to
    the code it compiles unless told not to, which turned the annotations of every saved function into strings and
    made a factory whose inner function alone changed look as if its own lines had changed too."""
    header = "from __future__ import annotations\n\n" if future else ""
    old = header + "import math\n\n\ndef f(x: int) -> float:\n    return math.sqrt(x)\n\n\nclass C:\n    def g(self, y: int) -> int:\n        return y\n"
    module, path = load_module(old)
    live_f, live_g = module.f, module.C.g
    new = old.replace("math.sqrt(x)", "math.sqrt(x) + 1").replace("return y", "return y + 1").replace(
        "class C:", "def added(z: float) -> None:\n    return None\n\n\nclass C:")
    reload(module, path, old, new)
    assert live_f(4) == 3.0 and live_g(None, 1) == 2  # the live objects run the saved code
    expected = "int" if future else int
    for fn, name in ((live_f, "x"), (live_g, "y"), (module.added, "z")):
        assert fn.__annotations__[name] == ("float" if name == "z" and future else float if name == "z" else expected)
        assert bool(fn.__code__.co_flags & __future__.annotations.compiler_flag) is future


def test_line_numbers_in_notes_join_runs_of_consecutive_lines() -> None:
    from workbench.engine.hotswap.scopes import line_numbers

    # makemore's parser: the add_argument lines between its comments read as ranges.
    assert line_numbers([598, 599, 600, 601, 605, 607, 608, 610]) == "598-601, 605, 607, 608, 610"
    assert line_numbers([12]) == "12" and line_numbers([]) == ""


BOUND_TWICE = textwrap.dedent(
    """
    DIM = 4


    class Wrap:
        def __init__(self, inner):
            self.inner = inner


    model = list(range(DIM))
    model = Wrap(model)
    BATCH = 2
    """
)


@pytest.mark.parametrize(("edit", "quoted"), [
    (("DIM = 4", "DIM = 6"), "`model = list(range(DIM))` uses DIM but was not re-run"),
    (("range(DIM)", "range(DIM + 1)"), "`model = list(range(DIM + 1))` was not re-run"),
], ids=["reads the changed constant", "edited"])
def test_a_note_on_a_name_bound_twice_quotes_the_statement_it_is_about(load_module: Loader, edit: tuple[str, str],
                                                                      quoted: str) -> None:
    """x-transformers' script: `model = TransformerWrapper(dim=DIM, ...)` then `model = AutoregressiveWrapper(model)`,
    one scope of two statements when a save's edited lines span them (a rollback left DIM's edit on disk, then the
    loader's line below was edited). The note named the first one's line with the second one's text."""
    old = BOUND_TWICE
    module, path = load_module(old)
    changeset = plan(module, path, old, old.replace(*edit).replace("BATCH = 2", "BATCH = 3"))
    said = " ".join(changeset.notes)
    assert f"line {line_of(old, 'model = list(range(DIM))')}: {quoted}" in said, changeset.notes
    assert "`model = Wrap(model)`" not in said, changeset.notes
