"""Peak memory while a rebuild adds a layer to a trained GPT-2 124M: this code against an older commit, same run.

A project (written to a temp folder) defines GPT-2 124M in its train.py; setup() returns
{"model": GPT(...), "opt": AdamW(...)}; step() zeroes the gradients (set_to_none), runs a
(1, 64) batch forward and backward and steps AdamW, so after a step the model has
gradients and AdamW has exp_avg / exp_avg_sq. A real `Session` runs in a child process,
paused, one step at a time:

1. setup, one step (the optimizer now has state);
2. save an edit to `GPT.__init__` that adds a transformer block (`range(cfg.n_layer)` ->
   `range(cfg.n_layer + 1)`), held for rebuild;
3. RSS is read and the kernel's high-water mark reset (`/proc/self/clear_refs`), then
   `rebuild` is sent; the peak until the `rebuild` event is the larger of the 200 Hz
   samples and VmHWM;
4. one more step on the rebuilt model (13 blocks).

The figure: the peak during the rebuild above the RSS just before it, as x the state's
size (parameters + AdamW state, counted from the tensors after the first step; gradients
shown apart). Each code runs in its own process with PYTHONPATH at its checkout (checked
through `workbench.__file__`): `--before PATH` is a clean `git worktree` of the older commit.

    git worktree add /tmp/before a709b59
    python bench/rebuild_peak.py --before /tmp/before [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

REPO = Path(__file__).resolve().parent.parent
MB = 1e6

TRAIN_PY = """\
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class Config:
    vocab_size: int = 50257
    n_ctx: int = 1024
    n_layer: int = 12
    n_embd: int = 768
    n_head: int = 12


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_ctx, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def setup(bench):
    torch.manual_seed(0)
    model = GPT(Config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return {"model": model, "opt": opt}


def step(state, bench):
    model, opt = state["model"], state["opt"]
    opt.zero_grad(set_to_none=True)
    tokens = torch.randint(0, model.cfg.vocab_size, (1, 65))
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    return loss
"""

BEFORE_EDIT = "self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))"
AFTER_EDIT = "self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer + 1))"


class PhaseSampler:
    """RSS at about 200 Hz on a daemon thread, the peak of each named phase (as in rebuild_memory.py)."""

    def __init__(self, read_status: Callable[[], dict[str, int]], hz: float = 200.0) -> None:
        self.read_status, self.interval = read_status, 1.0 / hz
        self.phase, self.peaks, self.samples = "start", {}, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rebuild-peak-sampler", daemon=True)

    def sample(self) -> int:
        rss = self.read_status()["rss"]
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss)
        self.samples += 1
        return rss

    def enter(self, phase: str) -> None:
        self.sample()
        self.phase = phase
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Events:
    def __init__(self, session: Any) -> None:
        self.subscription = session.bus.subscribe(maxlen=1_000_000)
        self.seen: list[Any] = []

    def wait_for(self, predicate: Callable[[Any], bool], what: str, timeout: float = 600.0) -> Any:
        from workbench.protocol.events import Error, Exit

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
    """Parameters, gradients and AdamW state of the live model, counted from the tensors."""
    model, opt = state["model"], state["opt"]
    params = list(model.parameters())
    size = lambda t: t.numel() * t.element_size()
    return {
        "params": sum(size(p) for p in params),
        "grads": sum(size(p.grad) for p in params if p.grad is not None),
        "exp_avg": sum(size(s["exp_avg"]) for s in opt.state.values() if "exp_avg" in s),
        "exp_avg_sq": sum(size(s["exp_avg_sq"]) for s in opt.state.values() if "exp_avg_sq" in s),
    }


def child(code: Path) -> dict[str, Any]:
    """One session on `code`'s workbench: setup, a step, the edit, the rebuild, a step."""
    sys.path.insert(0, str(code))
    import gc

    import torch

    import workbench
    from workbench.protocol.events import (
        Error,
        Exit,
        Rebuild,
        Rebuilt,
        Reload,
        Setup,
        Step,
        StepOnce,
    )
    from workbench.tools.loadbench_worker import read_status, reset_high_water_mark
    from workbench.engine.project import load_project
    from workbench.engine.session import Session, SessionConfig

    if not Path(workbench.__file__).resolve().is_relative_to(code.resolve()):
        raise RuntimeError(f"workbench was imported from {workbench.__file__}, not from {code}")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "gpt"
        root.mkdir()
        entry = root / "train.py"
        entry.write_text(TRAIN_PY)
        project = load_project(entry)
        session = Session(project, SessionConfig(device=torch.device("cpu"), start_paused=True, memory_event_interval=0))
        events = Events(session)
        try:
            with PhaseSampler(read_status) as sampler:
                session.start()
                if not session.wait_until_watching(30.0):
                    raise RuntimeError("the watcher did not start within 30 s")
                events.wait_for(lambda e: isinstance(e, Setup) and e.status == "done", "setup done")
                session.send(StepOnce())
                events.wait_for(lambda e: isinstance(e, Step), "the first step")
                state = session.worker.user_state
                sizes = tensor_bytes(state)
                parameters = sum(p.numel() for p in state["model"].parameters())
                del state
                entry.write_text(TRAIN_PY.replace(BEFORE_EDIT, AFTER_EDIT))
                held = events.wait_for(lambda e: isinstance(e, Reload) and e.file == "train.py", "the reload")
                if not held.needs_rebuild:
                    raise RuntimeError(f"the edit to GPT.__init__ was not held for rebuild: {held}")
                time.sleep(0.5)  # the reload thread and the memory sampler settle
                gc.collect()
                sampler.enter("idle")
                before = sampler.sample()
                hwm_reset = reset_high_water_mark()
                sampler.enter("rebuild")
                session.send(Rebuild())
                rebuilt = events.wait_for(lambda e: isinstance(e, Rebuilt), "the rebuild")
                sampler.sample()
                hwm = read_status()["hwm"]
                if not rebuilt.ok:
                    raise RuntimeError(f"rebuild failed: {rebuilt.error}")
                after_rebuild = read_status()["rss"]
                sampler.enter("step")
                session.send(StepOnce())
                stepped = events.wait_for(lambda e: isinstance(e, Step), "the step after the rebuild")
                after_step = sampler.sample()
                blocks = len(session.worker.user_state["model"].h)
                new_sizes = tensor_bytes(session.worker.user_state)
        finally:
            session.close()
    errors = [e.message for e in events.seen if isinstance(e, Error)]
    sampled = sampler.peaks["rebuild"]
    return {
        "code": str(code), "workbench": workbench.__file__, "parameters": parameters, "sizes": sizes,
        "state_bytes": sizes["params"] + sizes["exp_avg"] + sizes["exp_avg_sq"],
        "rss_before": before, "peak_sampled": sampled - before,
        "peak_hwm": (hwm - before) if hwm_reset else None,
        "peak": max(sampled, hwm if hwm_reset else 0) - before,
        "after_rebuild": after_rebuild - before, "after_step": after_step - before,
        "rebuild_s": rebuilt.seconds, "carried": rebuilt.tensors_carried,
        "optimizer_states": rebuilt.optimizer_states_carried, "new": len(rebuilt.new),
        "blocks": blocks, "step_loss": stepped.loss, "new_sizes": new_sizes, "errors": errors,
        "exited": any(isinstance(e, Exit) for e in events.seen),
    }


def commit_of(path: Path) -> str:
    out = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         check=False)
    dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no", "workbench"],
                           capture_output=True, text=True, check=False)
    return out.stdout.strip() + (" (workbench/ has uncommitted edits)" if dirty.stdout.strip() else "")


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def run_child(code: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(code)], capture_output=True,
                         text=True, env=env, cwd=tempfile.gettempdir(), check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the child on {code} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="a clean checkout of the older commit (git worktree add)")
    parser.add_argument("--after", type=Path, default=REPO, help="the checkout measured as 'after' (default: this one)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    codes = {"after": args.after} if args.before is None else {"before": args.before, "after": args.after}
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in codes}
    loads = [load_average()]
    for round_ in range(args.repeat):
        labels = list(codes) if round_ % 2 == 0 else list(reversed(codes))
        for label in labels:
            runs[label].append(run_child(codes[label]))
        loads.append(load_average())
    result: dict[str, Any] = {"machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
                              "date": time.strftime("%Y-%m-%d"), "load_averages": loads, "codes": {}}
    for label, rows in runs.items():
        state = rows[0]["state_bytes"]
        result["codes"][label] = {
            "commit": commit_of(codes[label]), "rows": rows, "state_bytes": state, "sizes": rows[0]["sizes"],
            "parameters": rows[0]["parameters"],
            "peak_median": statistics.median(r["peak"] for r in rows), "peak_max": max(r["peak"] for r in rows),
            "peak_over_state": max(r["peak"] for r in rows) / state,
            "rebuild_s": statistics.median(r["rebuild_s"] for r in rows),
        }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    any_row = next(iter(runs.values()))[0]
    s = any_row["sizes"]
    print(f"GPT-2 {any_row['parameters'] / 1e6:.1f}M + AdamW after one step; state (params + AdamW state) "
          f"{any_row['state_bytes'] / MB:.0f} MB = params {s['params'] / MB:.0f} + exp_avg {s['exp_avg'] / MB:.0f} "
          f"+ exp_avg_sq {s['exp_avg_sq'] / MB:.0f}; gradients {s['grads'] / MB:.0f} MB besides")
    print(f"{'code':<8} {'commit':<10} {'RSS before':>10} {'peak above it, per run (sampled / VmHWM)':>48} {'x state':>8} "
          f"{'after rebuild':>13} {'after step':>10} {'rebuild s':>9} {'carried':>7} {'new':>4} {'blocks':>6}")
    for label, c in result["codes"].items():
        for r in c["rows"]:
            hwm = f"{r['peak_hwm'] / MB:.0f}" if r["peak_hwm"] is not None else "n/a"
            print(f"{label:<8} {c['commit'][:10]:<10} {r['rss_before'] / MB:>7.0f} MB {r['peak'] / MB:>25.0f} MB "
                  f"({r['peak_sampled'] / MB:.0f} / {hwm}) {r['peak'] / c['state_bytes']:>8.3f} "
                  f"{r['after_rebuild'] / MB:>10.0f} MB {r['after_step'] / MB:>7.0f} MB {r['rebuild_s']:>9.2f} "
                  f"{r['carried']:>7} {r['new']:>4} {r['blocks']:>6}" + (f"  errors: {r['errors']}" if r["errors"] else ""))
    for label, c in result["codes"].items():
        print(f"{label}: peak above RSS before the rebuild, worst of {len(c['rows'])}: {c['peak_max'] / MB:.0f} MB = "
              f"{c['peak_over_state']:.3f}x the state; median rebuild {c['rebuild_s']:.2f} s")
    if len(result["codes"]) == 2:
        b, a = result["codes"]["before"], result["codes"]["after"]
        print(f"after / before: peak {a['peak_max'] / b['peak_max']:.3f}x, rebuild time {a['rebuild_s'] / b['rebuild_s']:.2f}x")
    print(f"{result['machine']}, {result['date']}, load averages {' | '.join(loads)}")


if __name__ == "__main__":
    main()
