"""The user contract (setup(bench) / step(state, bench)) and the errors that explain it.

Each mistake is checked twice: through `load_project` (the exception and its
fields) and through the real CLI in a subprocess (exit code 2, one line on
stderr naming file:line, no traceback unless --debug). The CLI subprocesses are
run one per test (each imports torch: a couple of seconds).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import workbench
from conftest import TRAIN_PY, line_of, make_project
from workbench.errors import ContractError, UserError
from workbench.engine.project import load_project

# --------------------------------------------------------------------------- projects

NO_SETUP = """\
def step(state, bench):
    return 1.0
"""

NO_STEP = """\
def setup(bench):
    return {}
"""

ONE_ARG_STEP = """\
def setup(bench):
    return {}


def step(state):
    return 1.0
"""

NO_ARG_SETUP = """\
def setup():
    return {}


def step(state, bench):
    return 1.0
"""

SETUP_NOT_A_FUNCTION = """\
setup = 3


def step(state, bench):
    return 1.0
"""

SYNTAX_ERROR = """\
import torch


def setup(bench):
    return {}


def step(state, bench)
    return 1.0
"""

RAISES_AT_IMPORT = """\
import torch

RATE = 1 / 0


def setup(bench):
    return {}


def step(state, bench):
    return 1.0
"""

IMPORTS_BROKEN_MODULE = """\
from helpers import thing


def setup(bench):
    return {}


def step(state, bench):
    return thing
"""

BROKEN_HELPERS = """\
thing = 1
missing_name + 1
"""

SETUP_RAISES = """\
import torch


def setup(bench):
    torch.manual_seed(0)
    raise ValueError("no data here")


def step(state, bench):
    return 1.0
"""


# --------------------------------------------------------------------------- load_project


@pytest.fixture(autouse=True)
def _restore_sys_path():
    """Keep tests apart even if a load leaves sys.path changed (test_failed_import_leaves_sys_path_alone checks it does not)."""
    saved = list(sys.path)
    yield
    sys.path[:] = saved


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "train.py"
    with pytest.raises(ContractError) as info:
        load_project(missing)
    assert info.value.file == str(missing)
    assert "no such file" in info.value.message
    assert str(info.value).startswith(f"{missing}: no such file.")
    assert isinstance(info.value, UserError)


def test_folder_without_train_py(tmp_path: Path) -> None:
    root = make_project(tmp_path, {"model.py": "X = 1\n"})
    with pytest.raises(ContractError) as info:
        load_project(root)
    assert info.value.file == str(root)
    assert "is a folder without a train.py" in str(info.value)


def test_folder_with_train_py_loads_it(tmp_path: Path) -> None:
    from workbench.engine.project import unload_project

    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    project = load_project(root)
    try:
        assert project.entry == (root / "train.py").resolve()
        assert project.root == root.resolve()
        assert callable(project.function("step")) and callable(project.function("setup"))
    finally:
        unload_project(project)


def test_not_a_python_file(tmp_path: Path) -> None:
    path = tmp_path / "train.txt"
    path.write_text("def setup(bench): pass\n")
    with pytest.raises(ContractError, match="is not a Python file"):
        load_project(path)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (NO_SETUP, "defines no setup(bench) function."),
        (NO_STEP, "defines no step(state, bench) function."),
    ],
    ids=["no-setup", "no-step"],
)
def test_missing_function(tmp_path: Path, source: str, expected: str) -> None:
    root = make_project(tmp_path, {"train.py": source})
    with pytest.raises(ContractError) as info:
        load_project(root / "train.py")
    assert info.value.message == expected
    assert info.value.file == str((root / "train.py").resolve())
    assert "setup(bench) and step(state, bench)" in info.value.hint
    entry = str((root / "train.py").resolve())
    assert not any(getattr(m, "__file__", None) == entry for m in list(sys.modules.values()))


@pytest.mark.parametrize(
    ("source", "name", "shown"),
    [(ONE_ARG_STEP, "step", "step(state)"), (NO_ARG_SETUP, "setup", "setup()")],
    ids=["step(state)", "setup()"],
)
def test_wrong_signature_names_the_def_line(tmp_path: Path, source: str, name: str, shown: str) -> None:
    root = make_project(tmp_path, {"train.py": source})
    with pytest.raises(ContractError) as info:
        load_project(root / "train.py")
    err = info.value
    assert err.line == line_of(source, f"def {name}(")
    assert err.file == str((root / "train.py").resolve())
    assert f"{shown} does not match the contract" in err.message
    wanted = "step(state, bench)" if name == "step" else "setup(bench)"
    assert wanted in err.message
    assert f"train.py:{err.line}: " in str(err)


def test_setup_that_is_not_a_function(tmp_path: Path) -> None:
    root = make_project(tmp_path, {"train.py": SETUP_NOT_A_FUNCTION})
    with pytest.raises(ContractError) as info:
        load_project(root / "train.py")
    assert "setup is a int, not a function" in info.value.message


STEP_COUNTER_NAMED_STEP = """\
step = 0


def setup(bench):
    return {}


def step(state, bench):
    global step
    if step % 10 == 0:
        print(step)
    step += 1
    return 1.0
"""


def test_a_step_counter_named_step_is_refused_before_it_replaces_the_function(tmp_path: Path) -> None:
    """makemore's loop counter `step`, ported as `global step; step += 1` inside step(): refused at load, naming the
    line that binds it, instead of a TypeError about a function in `step % 10` at the first step."""
    root = make_project(tmp_path, {"train.py": STEP_COUNTER_NAMED_STEP})
    with pytest.raises(ContractError) as info:
        load_project(root / "train.py")
    assert info.value.line == line_of(STEP_COUNTER_NAMED_STEP, "step += 1")
    assert "declares `global step` and binds it" in info.value.message and "iter_num" in str(info.value)
    # Reading a global of that name (the function itself) is no mistake.
    reads_only = STEP_COUNTER_NAMED_STEP.replace("    step += 1\n", "").replace("step = 0\n", "")
    reads_only = reads_only.replace("if step % 10 == 0:", "if callable(step):")
    make_project(tmp_path, {"train.py": reads_only}, folder="reads")
    load_project(tmp_path / "reads" / "train.py")


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    root = make_project(tmp_path, {"train.py": SYNTAX_ERROR})
    with pytest.raises(ContractError) as info:
        load_project(root / "train.py")
    err = info.value
    assert err.line == line_of(SYNTAX_ERROR, "def step(state, bench)")
    assert err.file.endswith("train.py")
    assert err.message.startswith("syntax error:")
    assert f"train.py:{err.line}: syntax error" in str(err)


def test_exception_at_import_names_file_and_line(tmp_path: Path) -> None:
    root = make_project(tmp_path, {"train.py": RAISES_AT_IMPORT})
    with pytest.raises(ContractError) as info:
        load_project(root / "train.py")
    err = info.value
    assert err.line == line_of(RAISES_AT_IMPORT, "1 / 0")
    assert Path(err.file).name == "train.py"
    assert err.message == "importing train.py raised ZeroDivisionError: division by zero."


def test_exception_in_an_imported_project_module_points_there(tmp_path: Path) -> None:
    root = make_project(tmp_path, {"train.py": IMPORTS_BROKEN_MODULE, "helpers.py": BROKEN_HELPERS})
    with pytest.raises(ContractError) as info:
        load_project(root / "train.py")
    err = info.value
    assert Path(err.file).name == "helpers.py"
    assert err.line == line_of(BROKEN_HELPERS, "missing_name")
    assert "NameError" in err.message
    assert "helpers" not in sys.modules, "a failed load left the project's helper module imported"


def test_failed_import_leaves_sys_path_alone(tmp_path: Path) -> None:
    root = make_project(tmp_path, {"train.py": RAISES_AT_IMPORT})
    with pytest.raises(ContractError):
        load_project(root / "train.py")
    try:
        assert str(root.resolve()) not in sys.path
    finally:
        while str(root.resolve()) in sys.path:
            sys.path.remove(str(root.resolve()))


def test_failed_contract_check_unloads_the_module(tmp_path: Path) -> None:
    root = make_project(tmp_path, {"train.py": ONE_ARG_STEP})
    with pytest.raises(ContractError):
        load_project(root / "train.py")
    assert str(root.resolve()) not in sys.path
    assert not any(getattr(m, "__file__", None) == str((root / "train.py").resolve()) for m in list(sys.modules.values()))


# --------------------------------------------------------------------------- the CLI


@dataclass(frozen=True)
class CliResult:
    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str

    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]

    def explain(self) -> str:
        return f"args={self.args}\nexit code {self.code}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def _run_cli(args: list[str], cwd: Path) -> CliResult:
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=90,
    )
    return CliResult(tuple(args), proc.returncode, proc.stdout, proc.stderr)


def run_cli(tmp_path: Path, *args: str, files: dict[str, str] | None = None, folder: str = "proj") -> CliResult:
    """Write `files` as a project under tmp_path/folder (if given) and run the CLI with `args`.

    `{root}` in an argument is replaced by the project folder.
    """
    root = make_project(tmp_path, files, folder=folder) if files is not None else tmp_path / folder
    return _run_cli([a.replace("{root}", str(root)) for a in args], tmp_path)


FAST = ("--headless", "--max-steps", "3")


def assert_one_line_error(result: CliResult, *fragments: str) -> str:
    """Exit 2, nothing on stdout, exactly one `vram-bench: error: ...` line on stderr, no traceback."""
    assert result.code == 2, result.explain()
    assert result.stdout == "", result.explain()
    lines = result.stderr_lines()
    assert len(lines) == 1, result.explain()
    assert lines[0].startswith("vram-bench: error: "), result.explain()
    assert "Traceback" not in result.stderr, result.explain()
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in the error line\n{result.explain()}"
    return lines[0]


def test_cli_missing_path(tmp_path: Path) -> None:
    assert_one_line_error(run_cli(tmp_path, "run", str(tmp_path / "missing" / "train.py"), *FAST), "missing/train.py: no such file.", "vram-bench run path/to/train.py")


def test_cli_folder_without_train_py(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "run", "{root}", *FAST, files={"README.md": "nothing\n"}, folder="empty_folder")
    assert_one_line_error(result, "empty_folder: is a folder without a train.py.")


def test_cli_file_without_setup(tmp_path: Path) -> None:
    assert_one_line_error(run_cli(tmp_path, "run", "{root}/train.py", *FAST, files={"train.py": NO_SETUP}), "train.py: defines no setup(bench) function.")


def test_cli_file_without_step(tmp_path: Path) -> None:
    assert_one_line_error(run_cli(tmp_path, "run", "{root}/train.py", *FAST, files={"train.py": NO_STEP}), "train.py: defines no step(state, bench) function.")


def test_cli_wrong_signature(tmp_path: Path) -> None:
    line = line_of(ONE_ARG_STEP, "def step(")
    assert_one_line_error(run_cli(tmp_path, "run", "{root}/train.py", *FAST, files={"train.py": ONE_ARG_STEP}), f"train.py:{line}: step(state) does not match the contract", "step(state, bench)")


def test_cli_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    line = line_of(SYNTAX_ERROR, "def step(state, bench)")
    assert_one_line_error(run_cli(tmp_path, "run", "{root}/train.py", *FAST, files={"train.py": SYNTAX_ERROR}), f"train.py:{line}: syntax error")


def test_cli_exception_at_import(tmp_path: Path) -> None:
    line = line_of(RAISES_AT_IMPORT, "1 / 0")
    assert_one_line_error(run_cli(tmp_path, "run", "{root}/train.py", *FAST, files={"train.py": RAISES_AT_IMPORT}), f"train.py:{line}: importing train.py raised ZeroDivisionError: division by zero.")


def test_cli_exception_in_setup_headless(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "run", "{root}/train.py", *FAST, files={"train.py": SETUP_RAISES})
    line = line_of(SETUP_RAISES, "raise ValueError")
    assert result.code == 2, result.explain()
    lines = result.stderr_lines()
    assert len(lines) == 1, result.explain()
    assert lines[0].startswith(f"vram-bench: error: train.py:{line}: setup() raised ValueError: no data here."), result.explain()
    assert "Traceback" not in result.stderr, result.explain()
    # stdout is still the protocol: JSON lines ending with an exit event, the error event names the line.
    events = [json.loads(text) for text in result.stdout.splitlines()]
    assert all("event" in e for e in events)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start"
    assert {"event": "setup", "status": "failed"}.items() <= next(e for e in events if e["event"] == "setup" and e["status"] != "running").items()
    error = next(e for e in events if e["event"] == "error")
    assert (error["where"], error["file"], error["line"]) == ("setup", "train.py", line)
    assert "ValueError: no data here" in error["traceback"]
    assert events[-1]["event"] == "exit"
    assert (events[-1]["reason"], events[-1]["code"], events[-1]["step"]) == ("setup failed", 2, 0)
    assert "step" not in kinds


def test_cli_exception_in_setup_debug_shows_traceback(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "run", "{root}/train.py", *FAST, "--debug", files={"train.py": SETUP_RAISES})
    line = line_of(SETUP_RAISES, "raise ValueError")
    assert result.code == 2, result.explain()
    assert "Traceback (most recent call last)" in result.stderr, result.explain()
    assert f'train.py", line {line}, in setup' in result.stderr, result.explain()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cli_device_cuda_without_a_gpu(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "run", "{root}/train.py", *FAST, "--device", "cuda", files={"train.py": TRAIN_PY})
    assert_one_line_error(result, "--device cuda was asked for, but torch.cuda.is_available() is False", "--device cpu")


@pytest.mark.parametrize("spec", ["tpu", "gpu0", "mps"])
def test_unknown_device_is_a_user_error(spec: str) -> None:
    from workbench.engine.session import resolve_device

    with pytest.raises(UserError, match=f"--device {spec!r}"):
        resolve_device(spec)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" AUTO ").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_cli_rejects_max_steps_zero(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "run", "{root}/train.py", "--headless", "--max-steps", "0", files={"train.py": TRAIN_PY})
    assert result.code == 2, result.explain()
    assert "--max-steps: must be at least 1" in result.stderr, result.explain()
    assert "Traceback" not in result.stderr


def test_cli_version(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "--version")
    assert result.code == 0, result.explain()
    assert result.stdout.strip() == f"vram-bench {workbench.__version__}"


def test_cli_help_shows_examples(tmp_path: Path) -> None:
    results = {name: run_cli(tmp_path, *args) for name, args in {"help": ["--help"], "run_help": ["run", "--help"]}.items()}
    for result in results.values():
        assert result.code == 0, result.explain()
        out = result.stdout
        assert "examples:" in out
        assert "vram-bench run path/to/train.py" in out
        assert "--headless" in out and "--max-steps" in out and "--device" in out
        assert "setup(bench) and step(state, bench)" in out
    assert "vram-bench run PATH" in results["help"].stdout
    assert "the project's entry file" in results["run_help"].stdout
