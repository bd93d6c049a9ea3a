"""Load the user's project file as a real module and check the setup/step contract.

The entry file is imported under its own name with its folder on sys.path, so
`from model import Net` works, tracebacks show the user's file and line, and the
hot-swapper can patch the very module objects the training code uses.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable
from collections.abc import Iterator, Sequence

from workbench.engine.hotswap.syntax_trees import parse
from workbench.errors import ContractError

CONTRACT_HINT = "A vram-bench project defines setup(bench) and step(state, bench); see README.md, 'The user contract'."

_REQUIRED = {"setup": ("bench",), "step": ("state", "bench")}
_OPTIONAL = {"evaluate": ("state", "bench")}


@dataclass
class Project:
    """A loaded project: its entry module and the folder that is watched."""

    entry: Path
    root: Path
    module: ModuleType
    argv: tuple[str, ...] = ()  # the project's own arguments (`vram-bench run train.py -- ARGS`)
    _modules_cache: tuple[tuple[int, str | None], dict[Path, ModuleType]] | None = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        return f"{self.root.name}/{self.entry.name}"

    def function(self, name: str) -> Callable[..., Any] | None:
        """Looked up on every call, so a re-bound name is seen at once."""
        if name in _OPTIONAL:
            return optional_hook(self.module.__dict__, name)
        fn = self.module.__dict__.get(name)
        return fn if callable(fn) else None

    @contextlib.contextmanager
    def as_script(self) -> Iterator[None]:
        """sys.argv as `python train.py ARGS` gives it, while module code runs again (`x`, a rebuild's import-time
        lines); under torchrun the script's own `init_process_group` is skipped again, as at its import."""
        from workbench.engine.import_time_group import inits_skipped_again

        with script_argv(self.entry, self.argv), inits_skipped_again():
            yield

    def relative(self, path: Path | str) -> str:
        try:
            return str(Path(path).resolve().relative_to(self.root))
        except ValueError:
            return str(path)

    def owns(self, path: Path | str) -> bool:
        return is_project_file(Path(path), self.root)

    def modules(self) -> dict[Path, ModuleType]:
        """Every imported module whose file lives in the project folder.

        Scanning sys.modules (thousands of entries once torch is in) is cached until it
        changes: its length and newest key tell, in O(1).
        """
        key = (len(sys.modules), next(reversed(sys.modules), None))
        cached = self._modules_cache
        if cached is None or cached[0] != key:
            cached = (key, {path: module for path, module in _modules_under(self.root)})
            self._modules_cache = cached
        return dict(cached[1])


# The source each project module was imported from, read as it was imported. A save made while
# setup() is still running (it may take minutes) must be diffed against what actually ran, not
# against the file as it is when the reloader first looks at it.
IMPORTED_SOURCES: dict[Path, str] = {}


class _RecordingLoader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname: str):  # type: ignore[override]
        try:
            IMPORTED_SOURCES[Path(self.path).resolve()] = importlib.util.decode_source(self.get_data(self.path))
        except (OSError, UnicodeDecodeError):
            pass
        return super().get_code(fullname)


class _SourceRecorder:
    """A meta path finder that lets project modules import as usual, remembering their source."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if (
            spec is not None
            and isinstance(spec.loader, importlib.machinery.SourceFileLoader)
            and spec.origin
            and is_project_file(Path(spec.origin), self.root)
        ):
            spec.loader = _RecordingLoader(spec.loader.name, spec.loader.path)
        return spec


def _install_recorder(root: Path) -> None:
    for finder in list(sys.meta_path):
        if isinstance(finder, _SourceRecorder):
            sys.meta_path.remove(finder)
    sys.meta_path.insert(0, _SourceRecorder(root))


def _remove_recorder(root: Path) -> None:
    for finder in list(sys.meta_path):
        if isinstance(finder, _SourceRecorder) and finder.root == root:
            sys.meta_path.remove(finder)
    for path in [p for p in IMPORTED_SOURCES if p.is_relative_to(root)]:
        del IMPORTED_SOURCES[path]


@contextlib.contextmanager
def script_argv(entry: Path, argv: Sequence[str]) -> Iterator[None]:
    """Let module code that parses sys.argv at import see its own arguments, not vram-bench's."""
    saved = sys.argv
    sys.argv = [str(entry), *argv]
    try:
        yield
    finally:
        sys.argv = saved


def read_source(path: Path) -> str:
    """A Python file's text as Python reads it: its coding cookie (`# -*- coding: latin-1 -*-`) or UTF-8,
    with universal newlines (what the parser sees, so positions agree)."""
    return importlib.util.decode_source(path.read_bytes())


def load_project(path: Path | str, argv: Sequence[str] = ()) -> Project:
    """Import the entry file and validate it; every failure is a ContractError naming file:line.

    `argv` is what the project sees after its own path in sys.argv while it is imported.
    """
    entry = resolve_entry(path)
    root = entry.parent
    _evict_other_projects(root)
    with script_argv(entry, argv):
        module = _import_entry(entry, root)
    project = Project(entry=entry, root=root, module=module, argv=tuple(argv))
    try:
        check_contract(module.__dict__, entry)
        source = IMPORTED_SOURCES.get(entry)
        if source is not None:
            check_contract_names_kept(source, entry)
    except ContractError:
        unload_project(project)
        raise
    return project


def resolve_entry(path: Path | str) -> Path:
    """The project's entry file, absolute: PATH itself, or PATH/train.py for a folder."""
    entry = Path(path).expanduser()
    if entry.is_dir():
        candidate = entry / "train.py"
        if not candidate.is_file():
            raise ContractError(
                "is a folder without a train.py.", file=entry, hint="Pass the project's entry file, e.g. vram-bench run path/to/train.py."
            )
        entry = candidate
    if not entry.exists():
        raise ContractError("no such file.", file=entry, hint="Check the path, e.g. vram-bench run path/to/train.py.")
    if entry.suffix != ".py":
        raise ContractError("is not a Python file.", file=entry, hint="Pass the project's .py entry file.")
    return entry.resolve()


def check_contract(namespace: dict[str, Any], entry: Path) -> None:
    """setup(bench) and step(state, bench) exist and accept those arguments (evaluate: see optional_hook)."""
    for name, params in _REQUIRED.items():
        fn = namespace.get(name)
        if fn is None:
            raise ContractError(f"defines no {name}({', '.join(params)}) function.", file=entry, hint=CONTRACT_HINT)
        _check_signature(fn, name, params, entry)


def check_contract_names_kept(source: str, entry: Path) -> None:
    """No function declares `global step` (or `global setup`) and binds it: a script's loop counter ported as
    `global step; step += 1` inside `step()` (found porting makemore) replaces the function vram-bench calls with a
    number after one step, and its first sign is a TypeError about a function in the user's own arithmetic."""
    try:
        tree = parse(source, str(entry))
    except SyntaxError:
        return  # the import or the reload's own compile says so
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        declared = {name for node in ast.walk(function) if isinstance(node, ast.Global) for name in node.names}
        for name in declared & _REQUIRED.keys():
            bindings = (node for node in ast.walk(function) if isinstance(node, ast.Name) and node.id == name
                        and isinstance(node.ctx, (ast.Store, ast.Del)))
            binding = next(bindings, None)
            if binding is not None:
                raise ContractError(
                    f"{function.name}() declares `global {name}` and binds it: that global is "
                    f"your {name}({', '.join(_REQUIRED[name])}) function, which vram-bench calls; after it runs, "
                    f"`{name}` would be a value, not the function.",
                    file=entry,
                    line=binding.lineno,
                    hint="Rename the variable (a step counter: `iter_num`, `global_step`) and run again.",
                )


def optional_hook(namespace: dict[str, Any], name: str) -> Callable[..., Any] | None:
    """An optional contract function (`evaluate`), only if it takes the contract's arguments.

    Real trainers often have an `evaluate(data_source)` of their own: it is theirs, not a
    vram-bench hook, and must neither stop the session nor be called with the wrong arguments.
    """
    fn = namespace.get(name)
    if not callable(fn):
        return None
    try:
        _check_signature(fn, name, _OPTIONAL[name], Path("?"))
    except ContractError:
        return None
    return fn


def ignored_hooks(namespace: dict[str, Any]) -> list[str]:
    """Sentences for optional functions that exist with another signature (said once at start)."""
    notes = []
    for name, params in _OPTIONAL.items():
        fn = namespace.get(name)
        if fn is not None and optional_hook(namespace, name) is None:
            try:
                shown = f"{name}{inspect.signature(fn)}"
            except (TypeError, ValueError):
                shown = f"{name}"
            notes.append(
                f"{shown} is not vram-bench's {name}({', '.join(params)}), so vram-bench does not call it "
                f"(e and --eval-every do nothing); define {name}({', '.join(params)}) to use them"
            )
    return notes


def _check_signature(fn: Any, name: str, params: tuple[str, ...], entry: Path) -> None:
    wanted = f"{name}({', '.join(params)})"
    code = getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None
    line = code.co_firstlineno if code is not None else None
    file = code.co_filename if code is not None else entry
    if not callable(fn):
        raise ContractError(f"{name} is a {type(fn).__name__}, not a function; define {wanted}.", file=entry, hint=CONTRACT_HINT)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and odd callables: trust the user
    try:
        signature.bind(*([None] * len(params)))
    except TypeError:
        raise ContractError(
            f"{name}{signature} does not match the contract: it must accept {len(params)} argument(s), {wanted}.",
            file=file,
            line=line,
            hint="Fix the signature and run again.",
        ) from None


def _import_entry(entry: Path, root: Path) -> ModuleType:
    module_name = _module_name_for(entry)
    added_to_path = str(root) not in sys.path
    if added_to_path:
        sys.path.insert(0, str(root))
    _install_recorder(root)
    spec = importlib.util.spec_from_file_location(module_name, entry, loader=_RecordingLoader(module_name, str(entry)))
    if spec is None or spec.loader is None:
        raise ContractError("cannot be imported as a Python module.", file=entry)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        _forget(module_name, root, added_to_path)
        raise ContractError(
            f"syntax error: {exc.msg}.", file=exc.filename or entry, line=exc.lineno, hint="Fix it and run again."
        ) from exc
    except BaseException as exc:  # noqa: BLE001 - any failure at import is the user's to see
        _forget(module_name, root, added_to_path)
        file, line = deepest_frame_in(exc, root) or (str(entry), None)
        raise ContractError(
            f"importing {entry.name} raised {type(exc).__name__}: {exc}.", file=file, line=line, hint="Fix it and run again."
        ) from exc
    return module


def _module_name_for(entry: Path) -> str:
    """The file's own name, unless that would shadow an unrelated module already imported."""
    name = entry.stem
    existing = sys.modules.get(name)
    if existing is None or getattr(existing, "__file__", None) == str(entry):
        return name
    return f"_vram_bench_{name}"


def _forget(module_name: str, root: Path, added_to_path: bool) -> None:
    _remove_recorder(root)
    sys.modules.pop(module_name, None)
    _remove_modules_under(root)
    if added_to_path and str(root) in sys.path:
        sys.path.remove(str(root))


def deepest_frame_in(exc: BaseException, root: Path) -> tuple[str, int] | None:
    """The innermost traceback frame inside the project folder: where the user should look."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return exc.filename, exc.lineno or 0
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            Path(frame.filename).resolve().relative_to(root)
        except ValueError:
            continue
        found = (frame.filename, frame.lineno or 0)
    return found


_loaded_roots: set[Path] = set()


def _evict_other_projects(root: Path) -> None:
    """A second project in the same process must not see the first one's `model` module."""
    for other in list(_loaded_roots):
        if other != root:
            _remove_modules_under(other)
            _loaded_roots.discard(other)
    _loaded_roots.add(root)


def is_project_file(path: Path, root: Path) -> bool:
    """Inside the project folder, but not in hidden folders (.vram-bench, .venv), installed packages, or vram-bench."""
    resolved = path.resolve()
    try:
        rel = resolved.relative_to(root)
    except ValueError:
        return False
    if resolved.is_relative_to(_WORKBENCH_DIR):
        return False  # running from a checkout of vram-bench itself: never patch the workbench
    return not any(part.startswith(".") or part in _NOT_PROJECT_DIRS for part in rel.parts[:-1])


_WORKBENCH_DIR = Path(__file__).resolve().parent.parent  # the whole package, not only the engine


_NOT_PROJECT_DIRS = {"site-packages", "dist-packages", "__pycache__", "node_modules"}


def _modules_under(root: Path) -> list[tuple[Path, ModuleType]]:
    # A cheap string test first: resolving thousands of paths (torch imports many modules)
    # would cost syscalls, each a chance to lose the GIL to a busy training thread.
    prefix = str(root) + os.sep
    found = []
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file.endswith(".py") and file.startswith(prefix):
            path = Path(file)
            if is_project_file(path, root):
                found.append((path, module))
    return found


def _remove_modules_under(root: Path) -> None:
    doomed = {id(module) for _, module in _modules_under(root)}
    for name, module in list(sys.modules.items()):
        if id(module) in doomed:
            del sys.modules[name]


def unload_project(project: Project) -> None:
    """Forget the project's modules and sys.path entry (sessions in tests share one process)."""
    _remove_recorder(project.root)
    _remove_modules_under(project.root)
    _loaded_roots.discard(project.root)
    try:
        sys.path.remove(str(project.root))
    except ValueError:
        pass
