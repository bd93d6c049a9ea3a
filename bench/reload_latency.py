"""Save-to-applied latency: how long from writing a file to the `reload` event, and to the first step on the new code.

Baseline, measured in the same run: what a restart would cost instead (importing
the project and running `setup()` again), so the figure that matters is the ratio.

    python bench/reload_latency.py                 # default sample (tiny_gpt), 50 saves
    python bench/reload_latency.py --project tiny  # a 1 ms step: the reload machinery alone
    python bench/reload_latency.py --atomic        # editor-style saves: temp file + rename
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from workbench.protocol.events import Reload, Step  # noqa: E402
from workbench.engine.project import load_project  # noqa: E402
from workbench.engine.session import Session, SessionConfig  # noqa: E402

MARK = "BENCH_MARK = 0"

TINY = textwrap.dedent(
    f"""
    import torch
    {MARK}

    def setup(bench):
        model = torch.nn.Linear(64, 64)
        return {{"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}}

    def step(state, bench):
        x = torch.randn(32, 64)
        loss = state["model"](x).pow(2).mean()
        loss.backward(); state["opt"].step(); state["opt"].zero_grad()
        bench.log(mark=BENCH_MARK)
        return loss
    """
)


def make_project(kind: str, folder: Path) -> Path:
    if kind == "tiny":
        folder.mkdir(parents=True)
        (folder / "train.py").write_text(TINY)
        return folder / "train.py"
    shutil.copytree(REPO / "sample_projects" / "tiny_gpt", folder, ignore=shutil.ignore_patterns(".vram-bench", "__pycache__"))
    entry = folder / "train.py"
    source = entry.read_text()
    # The benchmark's own marker: a constant logged every step, so we see when new code runs.
    source = source.replace("\ndef step(state, bench):", f"\n{MARK}\n\n\ndef step(state, bench):", 1)
    source = source.replace("def step(state, bench):\n", "def step(state, bench):\n    bench.log(mark=BENCH_MARK)\n", 1)
    entry.write_text(source)
    return entry


def save(path: Path, text: str, atomic: bool) -> None:
    if atomic:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    else:
        path.write_text(text)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(round(q * (len(ordered) - 1))), len(ordered) - 1)]


def restart_cost(entry: Path) -> float:
    """Seconds to import the project and run setup() again: the baseline a hot swap replaces."""
    from workbench.engine.bench import Bench
    from workbench.engine.project import unload_project

    started = time.perf_counter()
    project = load_project(entry)
    project.module.setup(Bench(torch.device("cpu"), entry.parent / ".vram-bench"))
    elapsed = time.perf_counter() - started
    unload_project(project)
    return elapsed


def run(kind: str, saves: int, atomic: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        entry = make_project(kind, Path(tmp) / kind)
        baseline = restart_cost(entry)
        session = Session(load_project(entry), SessionConfig(device=torch.device("cpu"), memory_event_interval=0))
        events = session.bus.subscribe(maxlen=1_000_000)
        session.start()
        session.wait_until_watching()
        original = entry.read_text()
        to_event: list[float] = []
        to_step: list[float] = []
        step_ms: list[float] = []
        try:
            while not any(isinstance(e, Step) for e in events.wait(1.0)):
                pass
            for i in range(1, saves + 1):
                text = original.replace(MARK, f"BENCH_MARK = {i}")
                written = time.time()
                save(entry, text, atomic)
                reload_at = step_at = None
                deadline = time.monotonic() + 10
                while (reload_at is None or step_at is None) and time.monotonic() < deadline:
                    for e in events.wait(0.05):
                        if isinstance(e, Reload) and e.ok and e.changed and reload_at is None:
                            reload_at = e.time
                        elif isinstance(e, Step):
                            step_ms.append(e.ms)
                            if step_at is None and e.scalars.get("mark") == i:
                                step_at = e.time
                if reload_at is None or step_at is None:
                    raise RuntimeError(f"save {i} was not applied within 10 s")
                to_event.append((reload_at - written) * 1000)
                to_step.append((step_at - written) * 1000)
                time.sleep(0.25)  # separate saves, as a person would
        finally:
            session.close()
    median_event = statistics.median(to_event)
    return {
        "project": kind,
        "saves": saves,
        "atomic_rename": atomic,
        "median_step_ms": round(statistics.median(step_ms), 2),
        "save_to_reload_event_ms": {
            "median": round(median_event, 1),
            "p95": round(percentile(to_event, 0.95), 1),
            "min": round(min(to_event), 1),
            "max": round(max(to_event), 1),
        },
        "save_to_first_new_step_ms": {
            "median": round(statistics.median(to_step), 1),
            "p95": round(percentile(to_step, 0.95), 1),
        },
        "baseline_restart_ms": round(baseline * 1000, 1),
        "restart_over_hot_swap": round(baseline * 1000 / median_event, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", choices=["tiny_gpt", "tiny"], default="tiny_gpt")
    parser.add_argument("--saves", type=int, default=50)
    parser.add_argument("--atomic", action="store_true", help="save via temp file + rename, as many editors do")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.project, args.saves, args.atomic)
    result["machine"] = f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}"
    result["date"] = time.strftime("%Y-%m-%d")
    if args.json:
        print(json.dumps(result, indent=2))
        return
    e, s = result["save_to_reload_event_ms"], result["save_to_first_new_step_ms"]
    print(f"project {result['project']} ({'atomic rename' if args.atomic else 'in-place write'}), {args.saves} saves, "
          f"median step {result['median_step_ms']} ms")
    print(f"  save -> reload event:     median {e['median']} ms, p95 {e['p95']} ms (min {e['min']}, max {e['max']})")  # type: ignore[index]
    print(f"  save -> first new step:   median {s['median']} ms, p95 {s['p95']} ms")  # type: ignore[index]
    print(f"  baseline restart (import + setup): {result['baseline_restart_ms']} ms "
          f"-> hot swap is {result['restart_over_hot_swap']}x faster")
    print(f"  {result['machine']}, {result['date']}")


if __name__ == "__main__":
    main()
