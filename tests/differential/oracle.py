"""The reference: what a fresh start on some saved files would run.

One long-lived subprocess (torch is imported once) answers each request by
writing the files to a new folder, forgetting the previous project's modules,
importing train.py fresh (with the script's arguments in sys.argv, as
`python train.py ARGS` and the session's load_project give them), running
setup(bench) and one step, and returning the scalars. Answers are cached by
file contents and arguments: many sequences revisit the same versions (the
start, reverts).
"""

from __future__ import annotations

import importlib
import json
import math
import shutil
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

_ANSWER = "@oracle "  # stray output of user code can never be taken for an answer


@dataclass(frozen=True)
class Fresh:
    """A fresh start's scalars, or why it could not run (a syntax error on disk)."""

    scalars: dict[str, float]
    error: str | None = None


class Oracle:
    """Client of the oracle subprocess, with a cache."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-u", str(Path(__file__).resolve())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        self._cache: dict[tuple[tuple[tuple[str, str], ...], tuple[str, ...]], Fresh] = {}
        self.requests = 0

    def run(self, files: dict[str, str], argv: tuple[str, ...] = ()) -> Fresh:
        """A fresh start on `files`, the entry file run with the arguments `argv`."""
        key = (tuple(sorted(files.items())), tuple(argv))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps({"files": files, "argv": list(argv)}) + "\n")
        self._process.stdin.flush()
        self.requests += 1
        while True:
            line = self._process.stdout.readline()
            if not line:
                raise RuntimeError(f"the oracle process ended (exit code {self._process.poll()})")
            if line.startswith(_ANSWER):
                answer = json.loads(line[len(_ANSWER) :])
                break
        fresh = Fresh(answer.get("scalars", {}), answer.get("error"))
        self._cache[key] = fresh
        return fresh

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def __enter__(self) -> Oracle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- the subprocess


class _Bench:
    """What setup/step may use of the workbench's bench: enough for these projects."""

    def __init__(self, torch: Any) -> None:
        self.device = torch.device("cpu")
        self.step = 0
        self.run_dir = Path(tempfile.gettempdir())

    def log(self, **scalars: Any) -> None:
        pass


def _as_float(value: Any) -> float:
    if hasattr(value, "detach"):
        value = value.detach().item()
    number = float(value)
    return number if math.isfinite(number) else float("nan")


def _forget(folder: Path | None, names: set[str]) -> None:
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if name in names or (folder is not None and file.startswith(str(folder))):
            del sys.modules[name]


def run_fresh(folder: Path, torch: Any, argv: list[str] | None = None) -> dict[str, Any]:
    """Import train.py from `folder` as a new module, run setup and one step.

    While it is imported, sys.argv is what `python train.py ARGS` gives it (as the session's
    load_project(path, argv) does): module code that parses arguments at import sees `argv`.
    """
    names = {Path(p).stem for p in folder.iterdir() if p.suffix == ".py"}
    _forget(None, names)
    importlib.invalidate_caches()
    sys.path.insert(0, str(folder))
    saved_argv = sys.argv
    try:
        sys.argv = [str(folder / "train.py"), *(argv or [])]
        try:
            train = importlib.import_module("train")
        finally:
            sys.argv = saved_argv
        bench = _Bench(torch)
        state = train.setup(bench)
        out = train.step(state, bench)
        return {"scalars": {str(k): _as_float(v) for k, v in out.items()}}
    except BaseException as exc:  # noqa: BLE001 - a broken file is an answer, not a crash
        return {"error": "".join(traceback.format_exception_only(type(exc), exc)).strip()}
    finally:
        sys.path.remove(str(folder))
        _forget(folder, names)


def serve(stdin: TextIO, stdout: TextIO) -> None:
    import torch

    torch.set_num_threads(1)  # the live session runs beside this process
    sys.dont_write_bytecode = True
    root = Path(tempfile.mkdtemp(prefix="vram-bench-oracle-"))
    try:
        for count, line in enumerate(stdin):
            request = json.loads(line)
            folder = root / f"p{count}"
            folder.mkdir()
            for name, text in request["files"].items():
                (folder / name).write_text(text, encoding="utf-8")
            answer = run_fresh(folder, torch, request.get("argv", []))
            shutil.rmtree(folder, ignore_errors=True)
            stdout.write(_ANSWER + json.dumps(answer) + "\n")
            stdout.flush()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    serve(sys.stdin, sys.stdout)
