"""The CPU allocator running out (a real RLIMIT_AS) takes the out-of-memory path, as CUDA's does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import make_project
from workbench.engine.memory.out_of_memory import is_out_of_memory

LEAKY_UNDER_A_LIMIT = """\
import resource
import psutil
import torch

KEPT = []


def setup(bench):
    # The address space this process has now, plus 1 GiB: a real ceiling, as a container without swap sets one.
    room = psutil.Process().memory_info().vms + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (room, resource.getrlimit(resource.RLIMIT_AS)[1]))
    model = torch.nn.Linear(4, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}


def step(state, bench):
    KEPT.append(torch.ones(64 << 20, dtype=torch.uint8))  # 64 MiB more every step, never freed
    loss = state["model"](torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return loss
"""


def test_a_leak_under_rlimit_as_pauses_with_out_of_memory_and_reports_memory(tmp_path) -> None:
    root = make_project(tmp_path, {"train.py": LEAKY_UNDER_A_LIMIT})
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "run", str(root / "train.py"), "--headless", "--no-watch"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=180,
    )
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    errors = [e for e in events if e["event"] == "error" and e["where"] == "step"]
    assert errors, proc.stderr[-2000:]
    assert errors[0]["message"].startswith("out of memory in step():") and "process RSS" in errors[0]["message"]
    assert "can't allocate memory" in errors[0]["message"]
    paused = [e for e in events if e["event"] == "paused"]
    assert paused and paused[-1]["reason"] == "out of memory", paused
    assert events[-1]["event"] == "exit" and events[-1]["reason"] == "out of memory"  # stdin closed: nobody resumes
    steps = [e["step"] for e in events if e["event"] == "step"]
    assert 5 <= len(steps) <= 20, steps  # about 1 GiB of room at 64 MiB a step


@pytest.mark.parametrize(
    "error, expected",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (MemoryError(), True),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                      "you tried to allocate 268435456 bytes. Error code 12 (Cannot allocate memory)"), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (8x4 and 5x1)"), False),
        (ValueError("can't allocate memory"), False),
    ],
)
def test_which_errors_are_out_of_memory(error: BaseException, expected: bool) -> None:
    assert is_out_of_memory(error) is expected
