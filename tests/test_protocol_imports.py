"""The protocol is what a front end imports: the standard library only, never torch, Textual or the engine."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "textual", "rich", "numpy", "psutil", "pynvml")


def imported_by(code: str) -> list[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_the_replay_and_the_mirror_import_neither_torch_nor_textual_nor_the_engine():
    modules = imported_by(
        "import workbench.protocol.events, workbench.protocol.history, workbench.protocol.mirror, workbench.protocol.payloads"
    )
    assert not [m for m in modules if m.split(".")[0] in HEAVY]
    engine = [m for m in modules if m.startswith("workbench") and m not in ("workbench", "workbench.protocol.events")
              and not m.startswith("workbench.protocol")]
    assert not engine, engine


def test_no_module_of_the_protocol_imports_torch_or_textual():
    modules = imported_by(
        "import importlib, pkgutil, workbench.protocol as p\n"
        "for m in pkgutil.iter_modules(p.__path__): importlib.import_module('workbench.protocol.' + m.name)"
    )
    assert "workbench.protocol.mirror" in modules
    assert not [m for m in modules if m.split(".")[0] in HEAVY]
