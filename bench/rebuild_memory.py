"""Rebuild x5 with a module-global model: what the process holds after each rebuild, against one model and its optimizer.

A script-style project (written to a temp folder) keeps its model and optimizer in
module globals, as many real trainers do:

    def setup(bench):
        global MODEL, OPT
        MODEL = Net(); OPT = torch.optim.AdamW(MODEL.parameters())
        return {"model": MODEL, "opt": OPT}

`step` uses MODEL and OPT (zero_grad, forward, backward, opt.step), so after a step the
gradients stay allocated, as in a trainer that zeroes them at the top of the step.

A real `Session` runs in this process, paused, one step at a time. Each round: save an edit
to `Net.__init__` (held back: it needs a rebuild), send `rebuild`, wait for the `rebuild`
event, send `cleanup`, run one step.

Baseline, measured in the same run: one model plus its optimizer state, the bytes of the
parameters, gradients and AdamW's exp_avg / exp_avg_sq after the first step, counted from
the tensors. Memory is this process's RSS above its RSS before setup(), read at each stage and
sampled at about 200 Hz on a thread for the peaks; VmHWM (reset before setup through
/proc/self/clear_refs) checks the sampled peak. Live `Net` and optimizer instances are counted
with weak references that the project's own constructor and setup() register.

    python bench/rebuild_memory.py                          # 6 x Linear(4096, 4096): 100.7M params, 403 MB
    python bench/rebuild_memory.py --width 1024 --depth 96  # the same size in 4 MB tensors (C heap, not mmap)
    python bench/rebuild_memory.py --no-cleanup             # rebuild and step only: no `cleanup` command
    python bench/rebuild_memory.py --rounds 5 --json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from workbench.protocol.events import Cleanup, Error, Event, Exit, Rebuild, Rebuilt, Reload, RunCleanup, Setup, Step, StepOnce  # noqa: E402
from workbench.tools.loadbench_worker import read_status, reset_high_water_mark  # noqa: E402  (/proc/self/status, as load-bench reads it)
from workbench.engine.project import load_project  # noqa: E402
from workbench.engine.session import Session, SessionConfig  # noqa: E402

MB = 1e6

REGISTRY_PY = """\
import weakref

NETS = weakref.WeakSet()  # every Net built, held weakly: the benchmark counts the ones still alive
OPTS = weakref.WeakSet()
"""

TRAIN_PY = """\
import torch

import live_objects

WIDTH = {width}
DEPTH = {depth}
BATCH = {batch}
MODEL = None
OPT = None


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])
        self.tag = 0
        live_objects.NETS.add(self)

    def forward(self, x):
        return self.layers(x)


def setup(bench):
    global MODEL, OPT
    MODEL = Net()
    OPT = torch.optim.AdamW(MODEL.parameters(), lr=1e-4)
    live_objects.OPTS.add(OPT)
    return {{"model": MODEL, "opt": OPT}}


def step(state, bench):
    OPT.zero_grad(set_to_none=True)
    loss = MODEL(torch.randn(BATCH, WIDTH)).pow(2).mean()
    loss.backward()
    OPT.step()
    return loss
"""

class PhaseSampler:
    """Samples RSS at about 200 Hz on a daemon thread and keeps the peak of each named phase."""

    def __init__(self, hz: float = 200.0) -> None:
        self.interval = 1.0 / hz
        self.phase = "start"
        self.peaks: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rebuild-memory-sampler", daemon=True)

    def sample(self) -> int:
        rss = read_status()["rss"]
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss)
        self.samples += 1
        return rss

    def enter(self, phase: str) -> None:
        self.sample()  # the end of the previous phase belongs to it
        self.phase = phase
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> PhaseSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Events:
    def __init__(self, session: Session) -> None:
        self.subscription = session.bus.subscribe(maxlen=1_000_000)
        self.seen: list[Event] = []

    def wait_for(self, predicate: Callable[[Event], bool], what: str, timeout: float = 600.0) -> Event:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.subscription.wait(0.05):
                self.seen.append(event)
                if predicate(event):
                    return event
                if isinstance(event, Error):
                    print(f"  (error event while waiting for {what}: {event.where}: {event.message})", file=sys.stderr)
                if isinstance(event, Exit):
                    raise RuntimeError(f"the session exited while waiting for {what}")
        raise RuntimeError(f"no {what} within {timeout} s")


def tensor_bytes(state: dict[str, Any]) -> dict[str, int]:
    """Parameters, gradients and optimizer state of the live model, counted from the tensors."""
    model, opt = state["model"], state["opt"]
    params = list(model.parameters())
    size = lambda t: t.numel() * t.element_size()  # noqa: E731
    out = {
        "params": sum(size(p) for p in params),
        "grads": sum(size(p.grad) for p in params if p.grad is not None),
        "exp_avg": sum(size(s["exp_avg"]) for s in opt.state.values() if "exp_avg" in s),
        "exp_avg_sq": sum(size(s["exp_avg_sq"]) for s in opt.state.values() if "exp_avg_sq" in s),
    }
    out["total"] = sum(out.values())
    return out


def run(width: int, depth: int, batch: int, rounds: int, cleanup: bool = True) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "global_model"
        root.mkdir()
        (root / "live_objects.py").write_text(REGISTRY_PY)
        entry = root / "train.py"
        source = TRAIN_PY.format(width=width, depth=depth, batch=batch)
        entry.write_text(source)

        project = load_project(entry)
        registry = sys.modules["live_objects"]
        session = Session(project, SessionConfig(device=torch.device("cpu"), start_paused=True, memory_event_interval=0))
        events = Events(session)

        def alive() -> tuple[int, int]:
            return len(registry.NETS), len(registry.OPTS)

        gc.collect()
        before = read_status()["rss"]
        hwm_reset = reset_high_water_mark()
        rows: list[dict[str, Any]] = []
        try:
            with PhaseSampler() as sampler:
                sampler.enter("setup")
                session.start()
                if not session.wait_until_watching(30.0):
                    raise RuntimeError("the watcher did not start within 30 s")
                events.wait_for(lambda e: isinstance(e, Setup) and e.status == "done", "setup done")
                after_setup = sampler.sample() - before
                sampler.enter("first step")
                session.send(StepOnce())
                first = events.wait_for(lambda e: isinstance(e, Step), "the first step")
                after_first_step = sampler.sample() - before
                baseline = tensor_bytes(session.worker.user_state)
                parameters = sum(p.numel() for p in session.worker.user_state["model"].parameters())
                nets, opts = alive()
                rows.append({"stage": "setup + 1 step", "rss": after_first_step, "nets": nets, "opts": opts,
                             "peak": max(sampler.peaks["setup"], sampler.peaks["first step"]) - before,
                             "step_ms": first.ms})
                for n in range(1, rounds + 1):
                    sampler.enter(f"round {n}: save")
                    source = source.replace(f"self.tag = {n - 1}", f"self.tag = {n}")
                    entry.write_text(source)
                    held = events.wait_for(lambda e: isinstance(e, Reload) and e.file == "train.py", f"round {n}: reload")
                    if not held.needs_rebuild:
                        raise RuntimeError(f"round {n}: the edit to Net.__init__ was not held for rebuild: {held}")
                    sampler.enter(f"round {n}: rebuild")
                    session.send(Rebuild())
                    rebuilt = events.wait_for(lambda e: isinstance(e, Rebuilt), f"round {n}: rebuild")
                    if not rebuilt.ok:
                        raise RuntimeError(f"round {n}: rebuild failed: {rebuilt.error}")
                    after_rebuild = sampler.sample() - before
                    sampler.enter(f"round {n}: cleanup")
                    freed = None
                    if cleanup:
                        session.send(RunCleanup())
                        freed = events.wait_for(lambda e: isinstance(e, Cleanup), f"round {n}: cleanup").freed_bytes
                    after_cleanup = sampler.sample() - before
                    sampler.enter(f"round {n}: step")
                    session.send(StepOnce())
                    stepped = events.wait_for(lambda e: isinstance(e, Step), f"round {n}: step")
                    after_step = sampler.sample() - before
                    nets, opts = alive()
                    tag = session.worker.user_state["model"].tag
                    rows.append({
                        "stage": f"rebuild {n}", "tag": tag, "after_rebuild": after_rebuild, "after_cleanup": after_cleanup,
                        "rss": after_step, "nets": nets, "opts": opts, "cleanup_freed": freed,
                        "rebuild_s": rebuilt.seconds, "carried": (rebuilt.tensors_carried, rebuilt.optimizer_states_carried),
                        "peak": max(sampler.peaks[f"round {n}: {p}"] for p in ("save", "rebuild", "cleanup", "step")) - before,
                        "peak_rebuild": sampler.peaks[f"round {n}: rebuild"] - before,
                        "step_ms": stepped.ms,
                    })
                sampler.enter("end")
                hwm = read_status()["hwm"] - before
                final = tensor_bytes(session.worker.user_state)
        finally:
            session.close()
    base = baseline["total"]
    steady = [r["rss"] for r in rows[1:]]
    peak = max(r["peak"] for r in rows)
    return {
        "width": width, "depth": depth, "batch": batch, "rounds": rounds, "cleanup": cleanup,
        "parameters": parameters,
        "baseline_bytes": baseline, "final_bytes": final,
        "rss_after_setup": after_setup, "rss_after_first_step": after_first_step,
        "rows": rows,
        "steady_max": max(steady), "steady_median": statistics.median(steady),
        "steady_over_baseline": max(steady) / base,
        "steady_over_first_step_rss": max(steady) / after_first_step,
        "peak_sampled": peak, "peak_over_baseline": peak / base,
        "peak_first_step": rows[0]["peak"], "peak_first_step_over_baseline": rows[0]["peak"] / base,
        "peak_rebuild_max": max(r["peak_rebuild"] for r in rows[1:]),
        "vmhwm_above_start": hwm if hwm_reset else None,
        "samples": sampler.samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=4096, help="features of each Linear layer (default 4096)")
    parser.add_argument("--depth", type=int, default=6, help="number of Linear(width, width) layers (default 6)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-cleanup", action="store_true", help="skip the cleanup after each rebuild (what RSS does without it)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.width, args.depth, args.batch, args.rounds, cleanup=not args.no_cleanup)
    result["machine"] = f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}"
    result["date"] = time.strftime("%Y-%m-%d")
    if args.json:
        print(json.dumps(result, indent=2))
        return
    b = result["baseline_bytes"]
    base = b["total"]
    print(f"model: {args.depth} x Linear({args.width}, {args.width}), {result['parameters'] / 1e6:.1f}M params; AdamW")
    print(f"baseline (one model + optimizer, after one step): {base / MB:.0f} MB = params {b['params'] / MB:.0f} "
          f"+ grads {b['grads'] / MB:.0f} + exp_avg {b['exp_avg'] / MB:.0f} + exp_avg_sq {b['exp_avg_sq'] / MB:.0f}")
    print(f"RSS above the start: after setup {result['rss_after_setup'] / MB:.0f} MB, after the first step "
          f"{result['rss_after_first_step'] / MB:.0f} MB ({result['rss_after_first_step'] / base:.2f}x baseline)")
    print(f"{'stage':<15} {'after rebuild':>13} {'after cleanup':>13} {'after step':>10} {'x base':>6} "
          f"{'peak':>8} {'x base':>6} {'Nets':>4} {'opts':>4} {'rebuild s':>9}")
    for r in result["rows"]:
        ar = f"{r['after_rebuild'] / MB:.0f} MB" if "after_rebuild" in r else "-"
        ac = f"{r['after_cleanup'] / MB:.0f} MB" if "after_cleanup" in r and args.no_cleanup is False else "-"
        rs = f"{r['rebuild_s']:.2f}" if "rebuild_s" in r else "-"
        print(f"{r['stage']:<15} {ar:>13} {ac:>13} {r['rss'] / MB:>7.0f} MB {r['rss'] / base:>6.2f} "
              f"{r['peak'] / MB:>5.0f} MB {r['peak'] / base:>6.2f} {r['nets']:>4} {r['opts']:>4} {rs:>9}")
    print(f"steady state after rebuilds (RSS after {'' if args.no_cleanup else 'cleanup + '}step, worst of {args.rounds}): "
          f"{result['steady_max'] / MB:.0f} MB = {result['steady_over_baseline']:.3f}x baseline, "
          f"{result['steady_over_first_step_rss']:.3f}x the RSS after the first step")
    print(f"peak during the whole run: {result['peak_sampled'] / MB:.0f} MB = {result['peak_over_baseline']:.2f}x baseline "
          f"(sampled, {result['samples']} samples); VmHWM above start: "
          + (f"{result['vmhwm_above_start'] / MB:.0f} MB" if result["vmhwm_above_start"] is not None else "n/a"))
    print(f"  {result['machine']}, {result['date']}")


if __name__ == "__main__":
    main()
