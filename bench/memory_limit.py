"""Memory limits seen before they kill (issue 15): snapshot before the kernel's kill, warning lead, false warnings.

Every leaking run is a real `python -m workbench run train.py --headless --no-watch` (stdin
closed) started inside a fresh cgroup v1 memory folder (`memory.limit_in_bytes` and
`memory.memsw.limit_in_bytes` at `--limit`, joined in `preexec_fn`), so the kernel's OOM
killer is the real one. From outside, this script reads the child's JSON events as they
arrive and polls the cgroup every 20 ms: its usage, and `memory.failcnt` (the first moment
the cgroup hit its limit).

1. snapshot: a step that keeps `--leak-mib` MiB (`torch.ones`, never freed) and sleeps
   `--leak-sleep` s, `--leak-runs` times under the default `--on-memory-limit snapshot`. For
   each run: killed by the kernel (status -9) or paused and exited 1 with a snapshot; the
   snapshot's step against the last step event (steps lost); then, outside the cgroup,
   `--resume latest --max-steps S+1` must load the snapshot at step S and run one more step
   (`--resume-checks` of the runs, evenly spread).
2. lead: growth of about 25, 50, 200 MiB/s (a step keeps rate x 0.2 s MiB and sleeps 0.2 s).
   With `--on-memory-limit warn` the run goes on to the kill: the warning's lead is the time
   from the warning event to the cgroup's first hit of its limit (and to the kill). With the
   default action the run stops before the kill, so the act's lead is the headroom left at the
   act (limit minus the cgroup's usage when the act's event arrived) over the measured rate
   (a least-squares line through the cgroup's usage in the 3 s before the act).
3. flat: a sawtooth step (1 to 6 buffers of 40 MiB, freed at the step's end: up to 240 MiB)
   for `--flat-seconds` inside its own cgroup at `--limit`; every `memory limit` event counts.

Needs root on a cgroup v1 memory hierarchy (/sys/fs/cgroup/memory).

    python bench/memory_limit.py [--leak-runs 20] [--resume-checks 20] [--rates 25,50,200] [--rate-runs 3]
                                 [--flat-seconds 300] [--only snapshot,lead,flat] [--json out.json]
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
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
V1_MEMORY = Path("/sys/fs/cgroup/memory")
MiB = 1 << 20

LEAKY = """\
import time
import torch

KEPT = []


def setup(bench):
    model = torch.nn.Linear(64, 1)
    return {{"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}}


def step(state, bench):
    KEPT.append(torch.ones({size}, dtype=torch.uint8))  # never freed
    time.sleep({sleep})
    loss = state["model"](torch.randn(8, 64)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return loss
"""

SAWTOOTH = """\
import time
import torch


def setup(bench):
    model = torch.nn.Linear(64, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def step(state, bench):
    scratch = [torch.ones(40 << 20, dtype=torch.uint8) for _ in range(1 + bench.step % 6)]  # up to 240 MiB, freed
    time.sleep(0.2)
    loss = state["model"](torch.randn(8, 64)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return loss
"""


class Cgroup:
    """A cgroup v1 memory folder with a hard limit and no swap to escape into."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.folder = V1_MEMORY / f"vram-bench-bench-{uuid.uuid4().hex[:8]}"

    def __enter__(self) -> Cgroup:
        self.folder.mkdir()
        (self.folder / "memory.limit_in_bytes").write_text(str(self.limit))
        swap = self.folder / "memory.memsw.limit_in_bytes"
        if swap.exists():
            swap.write_text(str(self.limit))
        return self

    def __exit__(self, *exc: object) -> None:
        for _ in range(100):
            try:
                self.folder.rmdir()
                return
            except OSError:
                time.sleep(0.1)

    def read(self, name: str) -> int:
        return int((self.folder / name).read_text())

    def join(self) -> None:
        (self.folder / "cgroup.procs").write_text(str(os.getpid()))


def run_observed(command: list[str], cgroup: Cgroup | None, timeout: float) -> dict[str, Any]:
    """Run `command` (inside `cgroup` when given); its events with arrival times, the cgroup's usage over time,
    the first hit of the limit and the moment it ended."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, preexec_fn=cgroup.join if cgroup else None)
    events: list[dict[str, Any]] = []
    stderr: list[str] = []

    def read_stdout() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip().startswith("{"):
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                event["_arrived"] = time.time()
                events.append(event)

    def read_stderr() -> None:
        assert proc.stderr is not None
        stderr.append(proc.stderr.read())

    readers = [threading.Thread(target=read_stdout, daemon=True), threading.Thread(target=read_stderr, daemon=True)]
    for reader in readers:
        reader.start()
    started = time.time()
    usage: list[tuple[float, int]] = []
    hit_limit: float | None = None
    while proc.poll() is None:
        now = time.time()
        if now - started > timeout:
            proc.kill()
            break
        if cgroup is not None:
            try:
                usage.append((now, cgroup.read("memory.usage_in_bytes")))
                if hit_limit is None and cgroup.read("memory.failcnt") > 0:
                    hit_limit = now
            except OSError:
                pass
        time.sleep(0.02)
    ended = time.time()
    proc.wait()
    for reader in readers:
        reader.join(timeout=5)
    return {"returncode": proc.returncode, "events": events, "stderr": "".join(stderr), "usage": usage,
            "hit_limit": hit_limit, "started": started, "ended": ended}


def session_command(train: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "workbench", "run", str(train), "--headless", "--no-watch", *extra]


def project(base: Path, name: str, source: str) -> Path:
    root = base / name
    root.mkdir(parents=True)
    (root / "train.py").write_text(source)
    return root / "train.py"


def rate_before(usage: list[tuple[float, int]], t: float, span: float = 3.0) -> float | None:
    """Bytes per second: a least-squares line through the cgroup's usage in the `span` seconds before `t`."""
    points = [(s, u) for s, u in usage if t - span <= s <= t]
    if len(points) < 5:
        return None
    mt = statistics.fmean(s for s, _ in points)
    mu = statistics.fmean(u for _, u in points)
    var = sum((s - mt) ** 2 for s, _ in points)
    return sum((s - mt) * (u - mu) for s, u in points) / var if var > 0 else None


def usage_at(usage: list[tuple[float, int]], t: float) -> int | None:
    before = [u for s, u in usage if s <= t]
    return before[-1] if before else None


def memory_limit_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "error" and e.get("where") == "memory limit"]


# --------------------------------------------------------------------------- 1. snapshot before the kill


def snapshot_runs(base: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    size = args.leak_mib * MiB
    source = LEAKY.format(size=size, sleep=args.leak_sleep)
    checks = set(round(i * args.leak_runs / args.resume_checks) for i in range(args.resume_checks)) if args.resume_checks else set()
    rows = []
    for i in range(args.leak_runs):
        train = project(base, f"leak{i}", source)
        with Cgroup(args.limit) as cgroup:
            run = run_observed(session_command(train), cgroup, timeout=180)
        events = run["events"]
        steps = [e for e in events if e["event"] == "step"]
        snapshot = next((e for e in events if e["event"] == "snapshot" and e.get("reason") == "memory limit"), None)
        act = next((e for e in memory_limit_events(events) if "writing a snapshot" in e["message"]), None)
        exit_event = next((e for e in events if e["event"] == "exit"), None)
        last_step = steps[-1]["step"] if steps else 0
        row: dict[str, Any] = {
            "run": i, "returncode": run["returncode"], "killed": run["returncode"] == -9,
            "exit_reason": exit_event["reason"] if exit_event else None,
            "last_step": last_step, "snapshot_step": snapshot["step"] if snapshot else None,
            "lost": last_step - snapshot["step"] if snapshot else last_step,
            "step_ms": statistics.median(e["ms"] for e in steps) if steps else None,
            "hit_limit": run["hit_limit"] is not None,
        }
        if act is not None:
            rate = rate_before(run["usage"], act["_arrived"])
            used = usage_at(run["usage"], act["_arrived"])
            row["rate_mib_s"] = rate / MiB if rate else None
            row["headroom_mib"] = (args.limit - used) / MiB if used is not None else None
            row["act_lead_s"] = (args.limit - used) / rate if rate and used is not None else None
        peak = max((u for _, u in run["usage"]), default=0)
        row["peak_mib"] = peak / MiB
        if snapshot is not None and i in checks:
            again = subprocess.run(session_command(train, "--resume", "latest", "--max-steps", str(snapshot["step"] + 1)),
                                   capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
            out = [json.loads(line) for line in again.stdout.splitlines() if line.strip().startswith("{")]
            resumed = next((e for e in out if e["event"] == "resume"), None)
            more = [e["step"] for e in out if e["event"] == "step"]
            row["resumed"] = bool(again.returncode == 0 and resumed and resumed["ok"] and resumed["step"] == snapshot["step"]
                                  and more and more[-1] == snapshot["step"] + 1)
        rows.append(row)
        print(f"  snapshot run {i}: {json.dumps(row)}", file=sys.stderr, flush=True)
    return rows


# --------------------------------------------------------------------------- 2. lead time


def lead_runs(base: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    sleep = 0.2
    rows = []
    for rate in args.rates:
        source = LEAKY.format(size=int(rate * sleep * MiB), sleep=sleep)
        for action in ("warn", "snapshot"):
            for i in range(args.rate_runs):
                train = project(base, f"rate{rate}-{action}-{i}", source)
                with Cgroup(args.limit) as cgroup:
                    run = run_observed(session_command(train, "--on-memory-limit", action), cgroup, timeout=300)
                events = run["events"]
                said = memory_limit_events(events)
                warn = next((e for e in said if "memory grows" in e["message"] and ": training goes on" not in e["message"]
                             and "writing a snapshot" not in e["message"]), None)
                act = next((e for e in said if "writing a snapshot" in e["message"]), None)
                steps = [e for e in events if e["event"] == "step"]
                row: dict[str, Any] = {"target_mib_s": rate, "action": action, "run": i, "returncode": run["returncode"],
                                       "killed": run["returncode"] == -9,
                                       "step_ms": statistics.median(e["ms"] for e in steps) if steps else None}
                if warn is not None:
                    measured = rate_before(run["usage"], warn["_arrived"])
                    row["rate_mib_s"] = measured / MiB if measured else None
                    row["warned_mib"] = (usage_at(run["usage"], warn["_arrived"]) or 0) / MiB
                    row["warned_after_s"] = warn["_arrived"] - run["started"]
                    if run["hit_limit"] is not None:
                        row["warn_lead_to_limit_s"] = run["hit_limit"] - warn["_arrived"]
                    if row["killed"]:
                        row["warn_lead_to_kill_s"] = run["ended"] - warn["_arrived"]
                if act is not None:
                    measured = rate_before(run["usage"], act["_arrived"])
                    used = usage_at(run["usage"], act["_arrived"])
                    row["act_headroom_mib"] = (args.limit - used) / MiB if used is not None else None
                    row["act_lead_s"] = (args.limit - used) / measured if measured and used is not None else None
                    if warn is not None:
                        row["warn_to_act_s"] = act["_arrived"] - warn["_arrived"]
                    row["rate_at_act_mib_s"] = measured / MiB if measured else None
                    snap = next((e for e in events if e["event"] == "snapshot"), None)
                    row["snapshot"] = snap is not None
                rows.append(row)
                print(f"  lead run: {json.dumps(row)}", file=sys.stderr, flush=True)
    return rows


# --------------------------------------------------------------------------- 3. flat training


def flat_run(base: Path, args: argparse.Namespace) -> dict[str, Any]:
    train = project(base, "flat", SAWTOOTH)
    with Cgroup(args.limit) as cgroup:
        run = run_observed(session_command(train, "--time-limit", f"{args.flat_seconds}s"), cgroup,
                           timeout=args.flat_seconds + 120)
    events = run["events"]
    steps = [e for e in events if e["event"] == "step"]
    exit_event = next((e for e in events if e["event"] == "exit"), None)
    usage = [u for _, u in run["usage"]]
    return {"seconds": run["ended"] - run["started"], "returncode": run["returncode"],
            "exit_reason": exit_event["reason"] if exit_event else None, "steps": steps[-1]["step"] if steps else 0,
            "memory_limit_events": len(memory_limit_events(events)),
            "messages": [e["message"] for e in memory_limit_events(events)],
            "usage_min_mib": min(usage, default=0) / MiB, "usage_max_mib": max(usage, default=0) / MiB,
            "step_ms": statistics.median(e["ms"] for e in steps) if steps else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit-gib", type=float, default=2.0)
    parser.add_argument("--leak-runs", type=int, default=20)
    parser.add_argument("--leak-mib", type=int, default=50)
    parser.add_argument("--leak-sleep", type=float, default=0.15)
    parser.add_argument("--resume-checks", type=int, default=20)
    parser.add_argument("--rates", default="25,50,200", help="MiB/s, comma-separated")
    parser.add_argument("--rate-runs", type=int, default=3)
    parser.add_argument("--flat-seconds", type=int, default=300)
    parser.add_argument("--only", default="snapshot,lead,flat")
    parser.add_argument("--json", type=Path, help="write every row here")
    args = parser.parse_args()
    args.limit = int(args.limit_gib * (1 << 30))
    args.rates = [float(r) for r in args.rates.split(",")]
    parts = args.only.split(",")
    sys.path.insert(0, str(REPO))
    os.chdir(REPO)
    result: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()}",
                              "python": platform.python_version(), "limit": args.limit}
    with tempfile.TemporaryDirectory(prefix="vram-bench-memlimit-") as tmp:
        base = Path(tmp)
        if "snapshot" in parts:
            result["snapshot"] = snapshot_runs(base, args)
        if "lead" in parts:
            result["lead"] = lead_runs(base, args)
        if "flat" in parts:
            result["flat"] = flat_run(base, args)
    result["load_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
