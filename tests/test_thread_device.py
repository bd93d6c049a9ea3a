"""Each thread that runs the project's code takes the session's GPU as its current CUDA device
(workbench/engine/thread_device.py). This machine has no GPU: `torch.cuda.set_device` is the seam recorded here; the
wiring is checked on a real session's real threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

import workbench.engine.session as session_module
import workbench.engine.worker as worker_module
from workbench.engine.thread_device import use_on_this_thread


def recorder(calls: list[tuple[str, object]], when: dict[str, float] | None = None) -> Callable[..., None]:
    def record(device: object) -> None:
        calls.append((threading.current_thread().name, device))
        if when is not None:
            when.setdefault(threading.current_thread().name, time.time())
    return record


def test_a_gpu_with_an_index_becomes_the_calling_threads_device_and_cpu_touches_no_cuda(monkeypatch) -> None:
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(torch.cuda, "set_device", recorder(calls))
    use_on_this_thread(torch.device("cpu"))
    use_on_this_thread(torch.device("cuda"))  # no index: CUDA's own choice stays
    assert calls == []
    worker = threading.Thread(target=use_on_this_thread, args=(torch.device("cuda", 1),), name="rank-thread")
    worker.start()
    worker.join()
    assert calls == [("rank-thread", torch.device("cuda", 1))]


def test_the_training_and_reload_threads_take_the_sessions_device_before_running_project_code(
        start_session, monkeypatch) -> None:
    calls: list[tuple[str, object]] = []
    when: dict[str, float] = {}
    monkeypatch.setattr(worker_module, "use_on_this_thread", recorder(calls, when))
    monkeypatch.setattr(session_module, "use_on_this_thread", recorder(calls, when))
    live = start_session()
    live.wait_running()
    device = live.session.bench.device
    assert ("vram-bench-training", device) in calls
    assert ("vram-bench-reload", device) in calls
    setup_began = live.events.of("setup")[0].time
    assert when["vram-bench-training"] <= setup_began  # before setup() builds anything
