"""Does a reload cost grow with the size of the change, or with the size of the project? And does it leak?

1. Latency: the same one-line edit to a function in a 50-line module and in a
   5,000-line module, in one session whose state holds a large model. The
   baseline is the small module, measured in the same run: the figure is the ratio.
2. Leaks: 500 saves in one session; process RSS growth, and live function objects
   (bounded by the version history, `--history`).

    python bench/reload_scaling.py                     # both, defaults
    python bench/reload_scaling.py --saves 20 --reloads 100 --model-mb 200
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
import textwrap
import time
import types
import warnings
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workbench.protocol.events import Reload  # noqa: E402
from workbench.engine.project import load_project  # noqa: E402
from workbench.engine.session import Session, SessionConfig  # noqa: E402


def big_module(functions: int) -> str:
    parts = ['"""A large module: many functions, one of them edited."""\n\nimport math\n\n']
    for i in range(functions):
        parts.append(
            f"def helper_{i}(x, scale=1.0):\n"
            f"    \"\"\"Helper number {i}.\"\"\"\n"
            f"    y = x * scale + {i}\n"
            f"    return math.sqrt(abs(y)) if y else 0.0\n\n\n"
        )
    parts.append("def probe():\n    return 0\n")
    return "".join(parts)


SMALL = '"""A small module."""\n\nimport math\n\n\n' + "".join(
    f"def small_{i}(x):\n    return x + {i}\n\n\n" for i in range(10)
) + "def probe():\n    return 0\n"

TRAIN = textwrap.dedent(
    """
    import torch
    import big
    import small

    MODEL_MB = {model_mb}


    def setup(bench):
        n = MODEL_MB * 1024 * 1024 // 4
        model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(max(n // (1024 * 1025), 1))])
        return {{"model": model, "heap": [{{"i": i, "name": f"obj{{i}}"}} for i in range(200_000)]}}


    def step(state, bench):
        bench.log(big=float(big.probe()), small=float(small.probe()))
        return 0.0
    """
)


def count_functions() -> int:
    gc.collect()
    with warnings.catch_warnings():  # isinstance() on some torch shims warns about deprecation
        warnings.simplefilter("ignore")
        return sum(1 for o in gc.get_objects() if isinstance(o, types.FunctionType))


def edit_latencies(session: Session, events, path: Path, saves: int) -> list[float]:
    original = path.read_text()
    out = []
    for i in range(1, saves + 1):
        text = original.replace("def probe():\n    return 0\n", f"def probe():\n    return {i}\n")
        events.drain()
        written = time.time()
        path.write_text(text)
        deadline = time.monotonic() + 10
        got = None
        while got is None and time.monotonic() < deadline:
            got = next((e for e in events.wait(0.05) if isinstance(e, Reload) and e.file == path.name and e.changed), None)
        if got is None:
            raise RuntimeError(f"save {i} of {path.name} was not applied within 10 s")
        out.append((got.time - written) * 1000)
        time.sleep(0.2)
    path.write_text(original)
    time.sleep(0.5)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--saves", type=int, default=30, help="saves per module for the latency comparison")
    parser.add_argument("--reloads", type=int, default=500, help="saves for the leak check")
    parser.add_argument("--functions", type=int, default=1000, help="functions in the big module (5 lines each)")
    parser.add_argument("--model-mb", type=int, default=400, help="size of the model held in the state")
    parser.add_argument("--history", type=int, default=50, help="versions kept for rollback")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "scaling"
        root.mkdir()
        (root / "big.py").write_text(big_module(args.functions))
        (root / "small.py").write_text(SMALL)
        (root / "train.py").write_text(TRAIN.format(model_mb=args.model_mb))
        big_lines = len((root / "big.py").read_text().splitlines())
        config = SessionConfig(device=torch.device("cpu"), memory_event_interval=0, max_history=args.history)
        session = Session(load_project(root / "train.py"), config)
        events = session.bus.subscribe(maxlen=100_000)
        session.start()
        session.wait_until_watching()
        while session.status().step < 5:
            time.sleep(0.1)
        try:
            small = edit_latencies(session, events, root / "small.py", args.saves)
            big = edit_latencies(session, events, root / "big.py", args.saves)

            process = psutil.Process()
            # Warm up (first reloads import and cache), then measure the steady state.
            edit_latencies(session, events, root / "small.py", 20)
            gc.collect()
            rss_before, functions_before = process.memory_info().rss, count_functions()
            started = time.perf_counter()
            for i in range(args.reloads):
                (root / "small.py").write_text(SMALL.replace("return x + 3\n", f"return x + {1000 + i}\n"))
                deadline = time.monotonic() + 10
                while not any(isinstance(e, Reload) and e.changed for e in events.wait(0.05)):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"reload {i} was not applied")
                time.sleep(0.03)
            leak_seconds = time.perf_counter() - started
            gc.collect()
            rss_after, functions_after = process.memory_info().rss, count_functions()
        finally:
            session.close()

    result = {
        "big_module_lines": big_lines,
        "model_mb": args.model_mb,
        "small_module_ms": {"median": round(statistics.median(small), 1), "p95": round(sorted(small)[int(0.95 * (len(small) - 1))], 1)},
        "big_module_ms": {"median": round(statistics.median(big), 1), "p95": round(sorted(big)[int(0.95 * (len(big) - 1))], 1)},
        "big_over_small": round(statistics.median(big) / statistics.median(small), 2),
        "reloads": args.reloads,
        "reload_seconds": round(leak_seconds, 1),
        "rss_growth_mb": round((rss_after - rss_before) / 2**20, 2),
        "function_objects": {"before": functions_before, "after": functions_after, "history": args.history},
        "machine": f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}",
        "date": time.strftime("%Y-%m-%d"),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"one-line edit, save -> reload event ({args.saves} saves each; state holds a {args.model_mb} MB model):")
    print(f"  50-line module:            median {result['small_module_ms']['median']} ms, p95 {result['small_module_ms']['p95']} ms")
    print(f"  {big_lines}-line module:        median {result['big_module_ms']['median']} ms, p95 {result['big_module_ms']['p95']} ms")
    print(f"  big / small:               {result['big_over_small']}x")
    print(f"{args.reloads} reloads in one session ({leak_seconds:.0f} s): RSS growth {result['rss_growth_mb']} MB; "
          f"function objects {functions_before} -> {functions_after} (history {args.history})")
    print(f"  {result['machine']}, {result['date']}")


if __name__ == "__main__":
    main()
