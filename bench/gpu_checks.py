"""The checks only a CUDA machine can make, run end to end through the real CLI: one script, one report.

A session lent a GPU runs this (plus `pytest -m cuda`) and pastes the report into its note. Each
check prints PASS or FAIL with the figures it compared, and the exit code is the number of FAILs.

- gauges: the probe's numbers next to `nvidia-smi`'s for the same moment (device used, this
  process's used memory), with a known 4 GiB block held;
- session: `vram-bench run --headless --device cuda` on a small project: memory events carry the
  GPU, `profile 2` writes a trace with CUDA kernels and `self_cuda_ms` in its top ops,
  `memory-snapshot` writes a memory_viz pickle, `cleanup` returns cached blocks;
- oom: the same project asks for 1 TiB at step 8: the session pauses with reason `out of memory`
  and dumps a memory snapshot (`--record-memory`); saving the fix resumes it, the model intact;
- nccl: a DDP project under `--nproc-per-node` (one rank per visible GPU): the training group is
  NCCL, a saved `forward` is applied and the steps run it.
- fsdp1: FSDP1 (FullyShardedDataParallel) under NCCL: a sharded snapshot, a refused rebuild, and a resume that goes
  on as a run that never stopped.

    python bench/gpu_checks.py [--out DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FAILS: list[str] = []
DEVICE = "cuda"  # --device cpu runs the session checks' plumbing on a machine without a GPU (the CUDA checks then fail)

PROJECT = '''
import torch
from torch import nn

WIDTH = 2048
OOM_AT = {oom_at}   # a step that asks for 1 TiB; 0: never


def setup(bench):
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH)).to(bench.device)
    return {{"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-3)}}


def step(state, bench):
    if OOM_AT and bench.step + 1 == OOM_AT:
        torch.empty(2**40, dtype=torch.uint8, device=bench.device)
    x = torch.randn(256, WIDTH, device=bench.device)
    loss = state["model"](x).pow(2).mean()
    state["opt"].zero_grad(set_to_none=True)
    loss.backward()
    state["opt"].step()
    return {{"loss": loss}}
'''


def check(name: str, ok: bool, detail: str) -> None:
    print(f"  {'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        FAILS.append(name)


def smi(*query: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True)
    return [[cell.strip() for cell in line.split(",")] for line in out.stdout.strip().splitlines() if line.strip()]


def gauges() -> None:
    import torch

    from workbench.engine.memory.device import TorchNvmlProbe

    print("== gauges against nvidia-smi", flush=True)
    probe = TorchNvmlProbe()
    block = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    gpu = probe.gpus()[0]
    used_mib = int(smi("--query-gpu=memory.used", "-i", "0")[0][0])
    apps = {int(pid): int(mib) for pid, mib in smi("--query-compute-apps=pid,used_memory")}
    mib = 2**20
    print(f"  probe: allocated {gpu.allocated / mib:.0f} MiB, reserved {gpu.reserved / mib:.0f} MiB, "
          f"device_used {gpu.device_used / mib if gpu.device_used else None} MiB, process_used "
          f"{gpu.process_used / mib if gpu.process_used else None} MiB, total {gpu.device_total / mib if gpu.device_total else None} MiB, "
          f"limit {gpu.limit} ({gpu.limit_source})")
    print(f"  nvidia-smi: memory.used {used_mib} MiB, compute apps {apps} (this pid {os.getpid()})")
    check("allocated covers the 4 GiB block", gpu.allocated >= block.numel(), f"{gpu.allocated / mib:.0f} MiB")
    check("device_used matches nvidia-smi within 64 MiB",
          gpu.device_used is not None and abs(gpu.device_used / mib - used_mib) <= 64,
          f"probe {gpu.device_used and gpu.device_used / mib:.0f} vs smi {used_mib} MiB")
    mine = apps.get(os.getpid())
    if mine is None:
        print("  (nvidia-smi lists no compute app for this pid: a container's pid namespace)")
    else:
        check("process_used matches nvidia-smi's per-process figure within 64 MiB",
              gpu.process_used is not None and abs(gpu.process_used / mib - mine) <= 64,
              f"probe {gpu.process_used and gpu.process_used / mib:.0f} vs smi {mine} MiB")
    check("context and others = device_used - reserved is positive and under 2 GiB",
          gpu.device_used is not None and 0 < gpu.device_used - gpu.reserved < 2 * 2**30,
          f"{(gpu.device_used or 0) / mib - gpu.reserved / mib:.0f} MiB")
    del block
    torch.cuda.empty_cache()


class Headless:
    """One `python -m workbench run --headless` process, its events read on a thread."""

    def __init__(self, entry: Path, *extra: str) -> None:
        cmd = [sys.executable, "-m", "workbench", "run", str(entry), "--headless", "--device", DEVICE, *extra]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                print(f"  (not JSON on stdout: {line.rstrip()[:200]})")

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def wait_for(self, predicate, timeout: float, what: str, seen: bool = False) -> dict[str, Any] | None:
        """The next event that matches (or, with `seen`, one already read while waiting for another)."""
        if seen:
            match = next((e for e in self.seen if predicate(e)), None)
            if match is not None:
                return match
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                event = self.events.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self.events.empty():
                    break
                continue
            self.seen.append(event)
            if event.get("event") == "error":
                print(f"  (error event: {event.get('where')}: {str(event.get('message'))[:300]})")
            if predicate(event):
                return event
        print(f"  (timed out waiting for {what})")
        return None

    def finish(self, timeout: float = 60) -> int:
        try:
            self.send("quit")
        except (BrokenPipeError, OSError):
            pass
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        assert self.proc.stderr is not None
        err = self.proc.stderr.read()
        if code not in (0, None):
            print(f"  (exit {code}; stderr tail: {err[-800:]})")
        return code


def is_event(kind: str, **fields: Any):
    return lambda e: e.get("event") == kind and all(e.get(k) == v for k, v in fields.items())


def session_checks(folder: Path, out: Path) -> None:
    print("== a headless session on cuda: memory events, profiler, memory snapshot, cleanup", flush=True)
    entry = folder / "train.py"
    entry.write_text(PROJECT.format(oom_at=0))
    run = Headless(entry)
    step = run.wait_for(lambda e: e.get("event") == "step" and e["step"] >= 20, 120, "step 20")
    check("steps on cuda with gpu fields", bool(step and step.get("gpu") is not None and step.get("peak_allocated")),
          f"step event {step and {k: step.get(k) for k in ('step', 'ms', 'gpu', 'peak_allocated')}}")
    memory = run.wait_for(lambda e: e.get("event") == "memory" and e.get("gpus"), 10, "a memory event with gpus")
    gpu0 = (memory or {}).get("gpus", [{}])[0]
    check("memory event reads the GPU", bool(gpu0.get("allocated") and gpu0.get("device_used") and gpu0.get("utilization") is not None),
          f"{ {k: gpu0.get(k) for k in ('name', 'allocated', 'reserved', 'device_used', 'process_used', 'utilization', 'temperature', 'power_watts', 'limit_source')} }")
    run.send("profile 2")
    done = run.wait_for(is_event("profile", status="done"), 120, "profile done")
    trace = Path(done["trace"]) if done and done.get("trace") else None
    if trace and not trace.is_absolute():
        trace = folder / trace
    kernels = 0
    if trace and trace.exists():
        raw = trace.read_bytes()
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        kernels = sum(1 for e in data.get("traceEvents", []) if e.get("cat") == "kernel")
        if trace.stat().st_size < 16 * 2**20:
            shutil.copy(trace, out / trace.name)
    top = (done or {}).get("top_ops") or []
    check("profiler traces CUDA kernels", kernels > 0, f"{kernels} kernel events in {trace}")
    check("top ops carry self_cuda_ms", any((op.get("self_cuda_ms") or 0) > 0 for op in top),
          f"{[(op['name'], op.get('self_cuda_ms')) for op in top[:4]]}")
    run.send("memory-snapshot")
    snap = run.wait_for(is_event("memory_snapshot"), 60, "memory_snapshot")
    path = Path(snap["path"]) if snap else None
    if path and not path.is_absolute():
        path = folder / path
    ok = bool(path and path.exists() and path.read_bytes()[:2] == b"\x80\x04")
    check("memory snapshot written (pickle protocol 4)", ok, f"{path}, {snap and snap.get('bytes')} bytes, summary {snap and snap.get('summary', [])[:3]}")
    if ok and path.stat().st_size < 16 * 2**20:
        shutil.copy(path, out / "memory_snapshot.pickle")
    run.send("cleanup")
    clean = run.wait_for(is_event("cleanup"), 60, "cleanup")
    check("cleanup reports per-GPU before/after", bool(clean and "cuda:0.reserved" in clean.get("before", {})),
          f"freed {clean and clean.get('freed_bytes')}, before {clean and clean.get('before')}, after {clean and clean.get('after')}")
    code = run.finish()
    check("quit exits 0", code == 0, f"exit {code}")


def oom_checks(folder: Path) -> None:
    print("== out of memory on purpose: pause, snapshot, fix by saving, go on", flush=True)
    entry = folder / "train.py"
    entry.write_text(PROJECT.format(oom_at=8))
    run = Headless(entry, "--record-memory")
    paused = run.wait_for(is_event("paused", reason="out of memory"), 120, "paused for out of memory")
    check("OOM pauses the session (not a crash)", paused is not None, f"{paused}")
    dump = run.wait_for(is_event("memory_snapshot", reason="oom"), 30, "the OOM memory snapshot", seen=True)
    check("OOM dumps a memory snapshot", dump is not None, f"{dump and (dump.get('path'), dump.get('bytes'))}")
    time.sleep(0.5)
    entry.write_text(PROJECT.format(oom_at=0))
    reload = run.wait_for(is_event("reload"), 30, "the reload of the fix")
    check("the fix is applied", bool(reload and reload.get("ok")), f"{reload and {k: reload.get(k) for k in ('ok', 'changed', 'ms')}}")
    resumed = run.wait_for(lambda e: e.get("event") == "step" and e["step"] >= 12, 60, "steps after the fix")
    check("training goes on after the OOM with the same model", resumed is not None, f"step {resumed and resumed['step']}")
    errors = [e for e in run.seen if e.get("event") == "error" and e.get("where") == "step"]
    if errors:
        print(f"  the OOM error event: {errors[0].get('message', '')[:400]}")
    code = run.finish()
    check("quit exits 0", code == 0, f"exit {code}")


DDP_PROJECT = '''
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(1024, 1024)
        self.b = nn.Linear(1024, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def setup(bench):
    model = DDP(Net().to(bench.device), device_ids=[bench.local_rank])
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=1e-3)}


def step(state, bench):
    x = torch.randn(256, 1024, device=bench.device)
    loss = state["model"](x).pow(2).mean()
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    return loss
'''


def nccl_checks(folder: Path, nproc: int) -> None:
    print(f"== under torchrun with NCCL: {nproc} rank(s), DDP, a save applied on every rank", flush=True)
    entry = folder / "train.py"
    entry.write_text(DDP_PROJECT)
    run = Headless(entry, "--nproc-per-node", str(nproc))
    start = run.wait_for(is_event("start"), 120, "start")
    check("the training group is NCCL", bool(start and start.get("backend") == "nccl" and start.get("world_size") == nproc),
          f"{start and {k: start.get(k) for k in ('rank', 'world_size', 'backend', 'device')}}")
    run.wait_for(lambda e: e.get("event") == "step" and e["step"] >= 20, 120, "step 20")
    entry.write_text(DDP_PROJECT.replace("torch.relu(self.a(x))", "torch.tanh(self.a(x))"))
    reload = run.wait_for(is_event("reload"), 60, "the reload")
    check("the save is applied under NCCL", bool(reload and reload.get("ok") and reload.get("changed") == ["Net.forward"]),
          f"{reload and {k: reload.get(k) for k in ('ok', 'changed', 'ms', 'code_version')}}")
    after = run.wait_for(lambda e: e.get("event") == "step" and e.get("code_version") == 1, 60, "a step on the new code")
    check("steps run the new code", after is not None, f"{after and {k: after.get(k) for k in ('step', 'ms', 'rank')}}")
    code = run.finish()
    check("quit exits 0", code == 0, f"exit {code}")


def edited(source: str, *edits: tuple[str, str]) -> str:
    """`source` with each (old, new) replaced; an old text missing is the check's own mistake, said at once."""
    for old, new in edits:
        assert old in source, f"not in the project: {old!r}"
        source = source.replace(old, new)
    return source


FSDP1_PROJECT = edited(
    DDP_PROJECT,
    ("from torch.nn.parallel import DistributedDataParallel as DDP",
     "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP"),
    ("DDP(Net().to(bench.device), device_ids=[bench.local_rank])",
     "FSDP(Net().to(bench.device), device_id=bench.device)"),
    ("torch.optim.SGD(model.parameters(), lr=1e-3)", "torch.optim.AdamW(model.parameters(), lr=1e-3)"),
    ("def setup(bench):\n", "def setup(bench):\n    torch.manual_seed(0)  # every run starts from the same weights\n"),
)
FSDP1_STEPS = 16  # the straight run's length
FSDP1_SNAPSHOT_AT = 6


def fsdp1_checks(folder: Path, nproc: int) -> None:
    """FSDP1 cannot run on a CPU, so its sharded snapshot (step-N.dcp) is checked here: a run snapshotted part way and
    resumed goes on as one that never stopped, and a rebuild is refused with its reason (its state_dict() gathers
    copies). Every run uses NCCL."""
    print(f"== FSDP1 under torchrun with NCCL: {nproc} rank(s), a sharded snapshot resumed, a rebuild refused",
          flush=True)
    entry = folder / "train.py"
    entry.write_text(FSDP1_PROJECT)
    until = str(FSDP1_STEPS)

    def losses(run: Headless) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in run.seen if e.get("event") == "step" and e.get("rank", 0) == 0}

    straight = Headless(entry, "--nproc-per-node", str(nproc), "--max-steps", until)
    straight.wait_for(lambda e: e.get("event") == "step" and e["step"] >= FSDP1_STEPS, 180, f"step {until}")
    straight.finish()
    first = Headless(entry, "--nproc-per-node", str(nproc), "--paused")
    first.wait_for(is_event("setup", status="done"), 180, "setup")
    for n in range(1, FSDP1_SNAPSHOT_AT + 1):  # a step at a time (free steps run hundreds a second)
        first.send("step")
        first.wait_for(lambda e, n=n: e.get("event") == "step" and e["step"] >= n, 60, f"step {n}")
    first.send("snapshot")
    snap = first.wait_for(is_event("snapshot"), 120, "the snapshot") or {}
    check("FSDP1's snapshot is sharded (step-N.dcp)", str(snap.get("path", "")).endswith(".dcp"),
          f"{ {k: snap.get(k) for k in ('path', 'step', 'bytes')} }")
    first.send("rebuild")
    refused = first.wait_for(lambda e: e.get("event") in ("error", "rebuild"), 120, "the rebuild's answer") or {}
    said = str(refused.get("message") or refused.get("error") or "")
    check("a rebuild is refused with its reason", refused.get("ok") is not True and "FSDP1" in said,
          f"{refused.get('event')}: {said[:200]}")
    first.finish()
    at = snap.get("step") or 0
    # The snapshot taken, by its path: `latest` could be the quit's final one.
    second = Headless(entry, "--nproc-per-node", str(nproc), "--resume", str(snap.get("path")), "--max-steps", until)
    resume = second.wait_for(is_event("resume"), 180, "the resume") or {}
    second.wait_for(lambda e: e.get("event") == "step" and e["step"] >= FSDP1_STEPS, 180, f"step {until}")
    second.finish()
    check("the resume loads the sharded snapshot", resume.get("ok") is True and resume.get("step") == at,
          f"{ {k: resume.get(k) for k in ('path', 'step', 'notes')} }")
    want, got = losses(straight), losses(second)
    later = range(at + 1, FSDP1_STEPS + 1)
    same = [k for k in later if k in got and k in want and got[k] == want[k]]
    check("steps after the snapshot equal a run that never stopped's",
          0 < at < FSDP1_STEPS and len(same) == len(later),
          f"{len(same)} of {len(later)} steps equal; straight {[want.get(k) for k in later[:3]]}, "
          f"resumed {[got.get(k) for k in later[:3]]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", tempfile.gettempdir())))
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    import torch

    if DEVICE == "cuda":
        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, {time.strftime('%Y-%m-%d %H:%M')}")
        gauges()
    with tempfile.TemporaryDirectory() as tmp:
        session_checks(Path(tmp), args.out)
    with tempfile.TemporaryDirectory() as tmp:
        oom_checks(Path(tmp))
    if DEVICE == "cuda":
        with tempfile.TemporaryDirectory() as tmp:
            nccl_checks(Path(tmp), torch.cuda.device_count())
        with tempfile.TemporaryDirectory() as tmp:
            fsdp1_checks(Path(tmp), torch.cuda.device_count())
    print(f"{len(FAILS)} failed: {FAILS}" if FAILS else "all passed")
    return len(FAILS)


if __name__ == "__main__":
    sys.exit(main())
