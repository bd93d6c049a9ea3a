"""Two ranks under torchrun (gloo on CPU): what vram-bench's lockstep costs, each figure beside its baseline.

- Steps/s of a 2-rank DDP MLP run by `vram-bench run --nproc-per-node 2 --headless` against the
  same model and loop under plain `torchrun` (no vram-bench), interleaved rounds, median ratio
  (target >= 98%). Both count steps/s between 20% and 100% of the steps from their own timestamps
  (steady state: the first fifth holds imports, warm-up and vram-bench's first-steps measurements).
  Four step sizes: `--model small` (64 -> 256 -> 1, batch 64: about 1.5-2 ms a step on 2 cores, the
  worst case for any per-step cost), `--model issue` (128 -> 256 -> 256 -> 1, batch 64: about 3 ms, the step the
  issue's figures were measured on), `--model mid` (128 -> 512 -> 512 -> 1, batch 128: about 6 ms) and
  `--model medium` (512 -> 2048 -> 2048 -> 1, batch 256: about 100 ms, a step shaped like real training). The CPU both sides used per step (every process of the
  run, from getrusage) is shown beside it, and the time between two steps on rank 0 (from one step's
  return to the next one's start, timed inside the step function on both sides): what vram-bench adds
  to every step, whatever the step's size, so the ratio for other step sizes can be read off it.
- Save -> applied: from writing the file to the `reload` event (the event's own time: after every rank
  applied), 2 ranks against 1 process (`vram-bench run --headless`) on the same project, median of N
  saves each (target <= 1.5x). The reload event's `ms` (the watcher's sighting -> applied) is shown too.
  A change applies at the next step boundary, so a save waits half a step on average: the 1-process
  baseline runs twice, with every core (its steps are shorter than a rank's here, where 2 ranks share
  2 cores) and with one intra-op thread, as torchrun runs each rank (OMP_NUM_THREADS=1): the same step
  as a rank's. Where 2 ranks share the cores (this 2-core VM), a rank's step is still longer than that
  process's, and a longer step is a longer wait for its boundary: the third baseline, the one the target
  is read against, is that process with each step slept out to the 2-rank run's median step (as on GPUs,
  where each rank has a device of its own and its step is the single process's step), so the ratio is
  what the lockstep adds. Each run's median step (ms) is shown. The saves come at every point of a step:
  after each applied change, a seeded wait of 0.3 s plus up to two steps.

    python bench/distributed.py [--rounds 5] [--steps 3000] [--model small] [--saves 10] [--exchange-ms 250]
    python bench/distributed.py --rounds 0 --model medium --saves 8     # save -> applied only
    python bench/distributed.py --rounds 0 --saves 16 --functions 400   # ... of a 2,400-line file

`--exchange-ms` sets VRAM_BENCH_EXCHANGE_MS for the vram-bench runs: how far apart the ranks' control exchanges
are while training (shorter: a save applies sooner, at more CPU per second).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from workbench.engine.lockstep import DEFAULT_EXCHANGE_MS  # noqa: E402  (the default the runs below get)

MODEL = textwrap.dedent(
    """
    import json
    import time

    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    LR = 0.01


    WIDTHS = __WIDTHS__
    BATCH = __BATCH__


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(WIDTHS, WIDTHS[1:]))

        def forward(self, x):
            for layer in self.layers[:-1]:
                x = torch.relu(layer(x))
            return self.layers[-1](x)


    def build(rank, ddp=True):
        torch.manual_seed(0)
        model = Net()
        if ddp:
            model = DDP(model)
        return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=LR),
                "data": torch.Generator().manual_seed(rank)}


    def train_step(state):
        x = torch.randn(BATCH, WIDTHS[0], generator=state["data"])
        loss = (state["model"](x) - x.sum(1, keepdim=True)).pow(2).mean()
        state["opt"].zero_grad()
        loss.backward()
        state["opt"].step()
        return loss


    ENTERED, LEFT, CPU = [], [], []


    def timed_step(state, steps, name, rank):
        # train_step, keeping the time from the last step's return to this one's start: what runs between two steps
        # (the harness, and for vram-bench its bookkeeping and the exchanges), written to NAME-RANK.json at the end.
        ENTERED.append(time.perf_counter())
        cpu = time.thread_time()
        loss = train_step(state)
        CPU.append(time.thread_time() - cpu)
        LEFT.append(time.perf_counter())
        if len(LEFT) == steps:
            gaps = sorted(ENTERED[i] - LEFT[i - 1] for i in range(max(1, steps // 5), steps))
            inside = sorted(LEFT[i] - ENTERED[i] for i in range(max(1, steps // 5), steps))
            with open(f"{name}-{rank}.json", "w") as out:
                cpu = CPU[steps // 5:]
                json.dump({"median_us": gaps[len(gaps) // 2] * 1e6, "mean_us": sum(gaps) / len(gaps) * 1e6,
                           "inside_median_us": inside[len(inside) // 2] * 1e6,
                           "inside_mean_us": sum(inside) / len(inside) * 1e6,
                           "inside_p99_us": inside[len(inside) * 99 // 100] * 1e6,
                           "inside_cpu_mean_us": sum(cpu) / len(cpu) * 1e6}, out)
        return loss
    """
)

UNDER_VRAM_BENCH = textwrap.dedent(
    """
    import os
    import time
    from model import build, timed_step, train_step


    def setup(bench):
        return build(bench.rank, ddp=bench.world_size > 1)


    # Read once, at import: three lookups of os.environ a step cost this side alone 0.4 % of a 3 ms step on 2 ranks
    # (py-spy), which the plain loop never paid.
    STEPS = int(os.environ.get("BENCH_STEPS", "0"))
    STEP_MS = float(os.environ.get("BENCH_STEP_MS", "0"))
    EXTRA_STEPS = int(os.environ.get("BENCH_TRAIN_STEPS_PER_STEP", "1")) - 1


    def step(state, bench):
        if STEPS:
            return timed_step(state, STEPS, "gaps-vram-bench", bench.rank)
        if STEP_MS:  # a single process whose step lasts as long as a rank's (see save_latencies)
            started = time.perf_counter()
            loss = train_step(state)
            time.sleep(max(0.0, STEP_MS / 1000 - (time.perf_counter() - started)))
            return loss
        for _ in range(EXTRA_STEPS):  # bench/distributed_pairs.py
            train_step(state)
        return train_step(state)
    """
)

PLAIN = textwrap.dedent(
    """
    import os, sys, time, json
    import torch
    import torch.distributed as dist
    from model import build, timed_step

    dist.init_process_group("gloo")
    state = build(dist.get_rank())
    steps = int(sys.argv[1])
    times = []
    for _ in range(steps):
        loss = timed_step(state, steps, "gaps-plain", dist.get_rank())
        float(loss)  # vram-bench reads the loss every step: the baseline does too
        times.append(time.time())
    if dist.get_rank() == 0:
        print(json.dumps(times))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # not destroy_process_group(): gloo sometimes aborts (SIGABRT) a rank whose peer tore the group down first
    """
)


MODELS = {"small": ([64, 256, 1], 64), "issue": ([128, 256, 256, 1], 64), "mid": ([128, 512, 512, 1], 128),
          "medium": ([512, 2048, 2048, 1], 256)}


def children_cpu() -> float:
    """CPU seconds of every finished child process so far (a run's processes are all waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def steps_per_second(times: list[float]) -> float:
    measured = times[len(times) // 5 :]
    return (len(measured) - 1) / (measured[-1] - measured[0])


def torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def between_steps(folder: Path, name: str) -> float:
    """Rank 0's median microseconds between one step's return and the next one's start (see `timed_step`)."""
    return json.loads((folder / f"{name}-0.json").read_text())["median_us"]


def inside_steps(folder: Path, name: str) -> dict[str, float]:
    """Rank 0's microseconds inside the loop's own step, from its start to its return (median, mean, 99th percentile)
    and the CPU time it took (mean): if the time grows under vram-bench and the CPU time does not, the step waited."""
    return {k: v for k, v in json.loads((folder / f"{name}-0.json").read_text()).items() if k.startswith("inside_")}


def plain_round(folder: Path, steps: int) -> tuple[float, float, float]:
    """(steps/s, CPU ms per step, us between steps) of the loop under plain torchrun."""
    cpu = children_cpu()
    done = torchrun(["plain.py", str(steps)], folder)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    rate = steps_per_second(json.loads(done.stdout.strip().splitlines()[-1]))
    return rate, (children_cpu() - cpu) / steps * 1000, between_steps(folder, "gaps-plain")


def vram_bench_round(folder: Path, steps: int) -> tuple[float, float, float]:
    """(steps/s, CPU ms per step, us between steps) of the same loop under vram-bench (events to a file, as a script
    would keep them)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "BENCH_STEPS": str(steps)}
    cpu = children_cpu()
    with (folder / "events.out").open("w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "workbench", "run", "train.py", "--headless", "--nproc-per-node", "2", "--max-steps", str(steps),
             "--no-watch"],
            cwd=folder, env=env, stdout=out, stderr=subprocess.PIPE, text=True, timeout=600, stdin=subprocess.DEVNULL,
        )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    events = map(json.loads, (folder / "events.out").read_text().splitlines())
    times = [e["time"] for e in events if e["event"] == "step" and e.get("rank") == 0]
    return steps_per_second(times), (children_cpu() - cpu) / steps * 1000, between_steps(folder, "gaps-vram-bench")


def save_latencies(folder: Path, nproc: int, saves: int, threads: int | None = None,
                   step_ms: float | None = None) -> tuple[list[float], list[float], float]:
    """Start a session, save `saves` edits to LR: for each, ms from the write to the reload event (applied everywhere),
    and the event's own `ms` (the watcher's sighting -> applied); then the median step's ms while saving.
    `threads`: OMP_NUM_THREADS for a single process (torchrun sets 1 for each of several ranks). `step_ms`: each
    step sleeps out the rest of that many ms after training, so a single process's steps last as long as a rank's."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if step_ms is not None:
        env["BENCH_STEP_MS"] = str(step_ms)
    extra = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "run", "train.py", "--headless", *extra], cwd=folder, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    events: list[dict] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            event = json.loads(line)
            events.append(event)
            if event["event"] == "step" and event["step"] >= 50:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(120):
            raise RuntimeError("the session did not reach step 50")
        model = folder / "model.py"
        latencies, seen_to_applied = [], []
        phase = random.Random(saves)  # the same waits for every run, so the runs compare like with like
        for i in range(saves):
            before = sum(1 for e in events if e["event"] == "reload")
            text = model.read_text()
            written = time.time()
            model.write_text(text.replace(f"LR = {0.01 + i * 0.001:.3f}", f"LR = {0.01 + (i + 1) * 0.001:.3f}")
                             if i else text.replace("LR = 0.01", "LR = 0.011"))
            deadline = time.monotonic() + 30
            while sum(1 for e in events if e["event"] == "reload") == before:
                if time.monotonic() > deadline:
                    raise RuntimeError("no reload event")
                time.sleep(0.01)
            reload = [e for e in events if e["event"] == "reload"][-1]
            if not reload["ok"]:
                raise RuntimeError(reload)
            latencies.append((reload["time"] - written) * 1000)
            seen_to_applied.append(reload["ms"])
            # Not a fixed pause: 0.3 s after an applied change is always the same point of a step, so every save would
            # wait the same part of a step for its boundary (44 ms of an 85 ms step, every time, in one run). A wait
            # drawn over two steps puts the saves at every point of a step, as a user's are.
            recent = [e["ms"] for e in events[-50:] if e["event"] == "step"]
            step_s = statistics.median(recent) / 1000 if recent else 0.1
            time.sleep(0.3 + phase.uniform(0, 2 * step_s))
        step_ms = statistics.median(e["ms"] for e in events if e["event"] == "step" and e["step"] > 50)
        return latencies, seen_to_applied, step_ms
    finally:
        proc.stdin.write("quit\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        proc.wait(60)


def helpers(count: int) -> str:
    """`count` small functions, so the saved file is as long to plan as a real trainer's (about 6 lines each)."""
    return "".join(f"\n\ndef helper_{i}(x):\n    y = x * {i} + 1\n    if y > {i}:\n        y = y - {i}\n    return y\n"
                   for i in range(count))


def project(root: Path, name: str, model: str = "small", functions: int = 0) -> Path:
    folder = root / name
    folder.mkdir()
    widths, batch = MODELS[model]
    (folder / "model.py").write_text(MODEL.replace("__WIDTHS__", repr(widths)).replace("__BATCH__", str(batch))
                                     + helpers(functions))
    (folder / "train.py").write_text(UNDER_VRAM_BENCH)
    (folder / "plain.py").write_text(PLAIN)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None, help="steps a round (default: 3000 small, 1500 mid, 300 medium)")
    parser.add_argument("--model", choices=sorted(MODELS), default="small", help="the step's size (see above)")
    parser.add_argument("--saves", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="1 round of 100 steps, 2 saves (a smoke test)")
    parser.add_argument("--exchange-ms", type=float, default=None, help="VRAM_BENCH_EXCHANGE_MS for vram-bench's runs")
    parser.add_argument("--functions", type=int, default=0,
                        help="append this many small functions to the saved file (a longer file to plan on each save)")
    args = parser.parse_args()
    if args.exchange_ms is not None:
        os.environ["VRAM_BENCH_EXCHANGE_MS"] = str(args.exchange_ms)
    if args.steps is None:
        args.steps = {"small": 3000, "mid": 1500}.get(args.model, 300)
    if args.quick:
        args.rounds, args.steps, args.saves = 1, 100, 2
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = project(root, "throughput", args.model)
        ratios, plain, ours, plain_cpu, our_cpu, plain_gap, our_gap = [], [], [], [], [], [], []
        plain_inside: list[dict[str, float]] = []
        our_inside: list[dict[str, float]] = []
        for i in range(args.rounds):
            order = (plain_round, vram_bench_round) if i % 2 == 0 else (vram_bench_round, plain_round)
            got = {fn.__name__: fn(folder, args.steps) for fn in order}
            (rate, cpu, gap), (our_rate, our_cpu_ms, our_gap_us) = got["plain_round"], got["vram_bench_round"]
            plain.append(rate)
            ours.append(our_rate)
            plain_cpu.append(cpu)
            our_cpu.append(our_cpu_ms)
            plain_gap.append(gap)
            our_gap.append(our_gap_us)
            plain_inside.append(inside_steps(folder, "gaps-plain"))
            our_inside.append(inside_steps(folder, "gaps-vram-bench"))
            ratios.append(our_rate / rate)
            print(f"  round {i + 1}: plain {rate:.1f}, vram-bench {our_rate:.1f} steps/s ({our_rate / rate:.3f}); between "
                  f"steps plain {gap:.1f}, vram-bench {our_gap_us:.1f} us", flush=True)  # a run cut short still says it
        if args.saves:
            n = args.functions
            one, one_seen, one_step = save_latencies(project(root, "one", args.model, n), 1, args.saves)
            rank, rank_seen, rank_step = save_latencies(project(root, "rank", args.model, n), 1, args.saves, threads=1)
            two, two_seen, two_step = save_latencies(project(root, "two", args.model, n), 2, args.saves)
            padded, padded_seen, padded_step = save_latencies(project(root, "padded", args.model, n), 1, args.saves,
                                                              threads=1, step_ms=two_step)
    exchange = os.environ.get("VRAM_BENCH_EXCHANGE_MS", f"{DEFAULT_EXCHANGE_MS} (default)")
    widths, batch = MODELS[args.model]
    print(f"2-rank DDP MLP ({' -> '.join(map(str, widths))}, batch {batch}, gloo), saved file + {args.functions} functions, "
          f"{args.rounds} interleaved rounds of "
          f"{args.steps} steps; exchanges every {exchange} ms")
    if args.rounds:
        print(f"  plain torchrun: median {statistics.median(plain):.1f} steps/s  {[round(x, 1) for x in plain]}")
        print(f"  vram-bench:     median {statistics.median(ours):.1f} steps/s  {[round(x, 1) for x in ours]}")
        print(f"  vram-bench / plain: median of per-round ratios {statistics.median(ratios):.3f}  "
              f"{[round(x, 3) for x in ratios]}  (target >= 0.98)")
        print(f"  CPU per step, every process of the run (start-up included): plain {statistics.median(plain_cpu):.2f} ms, "
              f"vram-bench {statistics.median(our_cpu):.2f} ms")
        step_us = 1e6 / statistics.median(plain)
        print(f"  between two steps on rank 0 (median us): plain {statistics.median(plain_gap):.1f}, vram-bench "
              f"{statistics.median(our_gap):.1f}  {[round(x) for x in our_gap]}; the difference is "
              f"{(statistics.median(our_gap) - statistics.median(plain_gap)) / step_us:.1%} of a plain step ({step_us:.0f} us)")
        for key, label in (("median", "median"), ("mean", "mean"), ("p99", "99th percentile"), ("cpu_mean", "CPU")):
            plain_values = [x[f"inside_{key}_us"] for x in plain_inside]
            our_values = [x[f"inside_{key}_us"] for x in our_inside]
            print(f"  inside the loop's step on rank 0, {label} (us; median of rounds): plain "
                  f"{statistics.median(plain_values):.1f}, vram-bench {statistics.median(our_values):.1f}  "
                  f"{[round(x) for x in our_values]}")
    if args.saves:
        print(f"save -> applied (the write -> the reload event), {args.saves} saves each; median step beside each")
        for label, got, seen, step_ms in (("1 process, every core", one, one_seen, one_step),
                                          ("1 process, 1 thread (a rank's)", rank, rank_seen, rank_step),
                                          ("1 process, a rank's step", padded, padded_seen, padded_step),
                                          ("2 ranks", two, two_seen, two_step)):
            print(f"  {label:31} median {statistics.median(got):6.1f} ms  (sighting -> applied {statistics.median(seen):5.1f} ms; "
                  f"step {step_ms:.1f} ms)  {[round(x, 1) for x in got]}")
        print(f"  2 ranks / 1 process with a rank's step: {statistics.median(two) / statistics.median(padded):.2f}x  (target <= 1.5x); "
              f"/ 1 process with a rank's thread: {statistics.median(two) / statistics.median(rank):.2f}x; "
              f"/ 1 process on every core: {statistics.median(two) / statistics.median(one):.2f}x")
    print(f"  {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
