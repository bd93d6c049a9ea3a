"""Resume of a 124M-parameter snapshot: from process start to the first training step done, and peak memory.

A GPT-2 124M model with AdamW (after one step, so the optimizer has state) is snapshotted
with vram-bench's writer. Then each variant runs in a fresh process, from `python` starting
to the first training step done (forward, backward, AdamW step on a (1, 64) batch):

- fresh: no resume; build model + optimizer with their normal initialization, one step (baseline A);
- naive: normal initialization, `torch.load` of the whole file, `load_state_dict` for the
  model and the optimizer, one step (baseline B);
- old way: normal initialization, then vram-bench's `load_snapshot` (CRC-32 check, mapped
  `torch.load`) and `apply_snapshot` without an init log (what `--resume` did before it skipped
  initialization);
- vram-bench: what the worker does now: setup() inside `skipping_init()`, `load_snapshot`
  (CRC-32 check of every member, then `torch.load(mmap=True, weights_only=True)`),
  `apply_snapshot(..., init_log=log)`, one step;
- proposed (not in workbench/, measured to show what two changes would give): vram-bench's
  resume with the CRC-32 computed on a reused buffer (`os.preadv` + `zlib.crc32`) instead of
  through `zipfile` (a new 8 MB bytes object per read), and the mapped tensors made private at
  once with `madvise(MADV_POPULATE_WRITE)` instead of page by page in the first step (where
  each page faults twice: read-mapped by the forward pass, then copied on the optimizer's write).

Time is split into interpreter start + imports, construct, verify (CRC-32), map + apply (or
load), first step. Memory is sampled at 200 Hz from /proc/self/status (anonymous and
file-backed apart), above the process's RSS after its imports (the "pre-start baseline"), as
x the snapshot file's size: peak until ready to step, and peak through the first step.

The page cache is warm: every variant runs once unmeasured, then `--repeat` rounds (order
rotated each round); figures are medians. With `--session` (the default), the same thing
user-visibly: `python -m workbench run train.py --headless --device cpu` on a project whose
setup() builds the same model, with and without `--resume`, timed from the process start to
its first `step` event on stdout, its memory sampled from outside through /proc/PID/status.

    python bench/resume_memory.py [--size 124M] [--repeat 3] [--no-session] [--json]
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

VARIANTS = ("fresh", "naive", "old way", "vram-bench", "proposed")
BATCH, SEQ = 1, 64

CHILD = r"""
import json, resource, sys, threading, time
exec_at = time.time()
import torch
from torch.nn import functional as F
from pathlib import Path
from workbench.tools.loadbench_worker import GPT2, config, read_status
from workbench.engine.actions.snapshot import apply_snapshot, load_snapshot, snapshots_in
from workbench.engine.actions.snapshot_integrity import verify_snapshot
from workbench.engine.init_skipping import skipping_init

variant, path, size, batch, seq = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
import workbench


class Phases:
    # Peak anonymous / file-backed / RSS of each phase, sampled at 200 Hz on a thread and at every phase boundary.
    def __init__(self):
        self.phase, self.peaks, self.lock, self.stop = "start", {}, threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def sample(self):
        now = read_status()
        with self.lock:
            peak = self.peaks.setdefault(self.phase, {"anon": 0, "file": 0, "rss": 0})
            for k in peak:
                peak[k] = max(peak[k], now[k])
        return now

    def enter(self, phase):
        self.sample()
        use = resource.getrusage(resource.RUSAGE_SELF)
        cpu = use.ru_utime + use.ru_stime
        faults[self.phase] = faults.get(self.phase, 0) + use.ru_minflt
        cpu_seconds[self.phase] = cpu_seconds.get(self.phase, 0.0) + cpu
        faults[phase], cpu_seconds[phase] = -use.ru_minflt, -cpu
        self.phase = phase
        self.sample()

    def run(self):
        while not self.stop.wait(0.005):
            self.sample()


def fast_verify(path):
    # Each member's CRC-32 from the local header's data offset, read into one reused buffer per thread.
    import os, zipfile, zlib
    from concurrent.futures import ThreadPoolExecutor
    with zipfile.ZipFile(path) as archive:
        members = [m for m in archive.infolist() if not m.is_dir()]
    local = threading.local()
    def damaged(m):
        if not hasattr(local, "fd"):
            local.fd, local.buf = os.open(path, os.O_RDONLY), memoryview(bytearray(8 << 20))
        header = os.pread(local.fd, 30, m.header_offset)
        pos = m.header_offset + 30 + int.from_bytes(header[26:28], "little") + int.from_bytes(header[28:30], "little")
        end, crc = pos + m.compress_size, 0
        while pos < end:
            n = os.preadv(local.fd, [local.buf[: min(len(local.buf), end - pos)]], pos)
            crc, pos = zlib.crc32(local.buf[:n], crc), pos + n
        return m.filename if crc != m.CRC or m.compress_type != 0 else None
    with ThreadPoolExecutor(2) as pool:
        bad = [name for name in pool.map(damaged, members) if name]
    if bad:
        raise RuntimeError(f"CRC mismatch: {bad[:3]}")
    import workbench.engine.actions.snapshot_integrity as integrity
    stat = path.stat()
    integrity._verified.add((str(path), stat.st_size, stat.st_mtime_ns))  # load_snapshot's own check: done


def populate(tensors):
    # Copy-on-write pages of the mapped snapshot made private now, in one call per storage (Linux >= 5.14).
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    spans = set()
    for t in tensors:
        storage = t.untyped_storage()
        start = storage.data_ptr()
        spans.add((start & ~4095, (start + storage.nbytes() + 4095) & ~4095))
    for a, b in sorted(spans):
        if libc.madvise(ctypes.c_void_p(a), ctypes.c_size_t(b - a), 23):  # MADV_POPULATE_WRITE
            raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE)")


def train_step(model, opt):
    opt.zero_grad(set_to_none=True)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.cfg.vocab_size, (batch, seq + 1), generator=g)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    return float(loss)


faults = {}  # page faults (minor) per phase: on a VM each first touch of a page costs microseconds
cpu_seconds = {}  # user + system CPU of the whole process per phase: less sensitive than wall time to a busy machine
cfg = config(size)
torch.manual_seed(0)
marks = {"exec": exec_at, "imported": time.time()}
baseline = read_status()
phases = Phases()
phases.thread.start()
phases.enter("construct")
if variant in ("vram-bench", "proposed"):
    with skipping_init() as log:  # as the worker runs setup() for --resume
        model = GPT2(cfg)
        marks["model"] = time.time()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
else:
    log = None
    model = GPT2(cfg)
    marks["model"] = time.time()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
state = {"model": model, "opt": opt}
marks["construct"] = time.time()
report = None
if variant in ("vram-bench", "old way"):
    phases.enter("verify")
    verify_snapshot(path, snapshots_in(path.parent))  # what load_snapshot does first (then skips: checked once a process)
    marks["verify"] = time.time()
    phases.enter("map + apply")
    report = apply_snapshot(state, load_snapshot(path), path, init_log=log)
elif variant == "proposed":
    phases.enter("verify")
    fast_verify(path)
    marks["verify"] = time.time()
    phases.enter("map + apply")
    report = apply_snapshot(state, load_snapshot(path), path, init_log=log)
    populate([p for p in model.parameters()] + [v for s in opt.state.values() for v in s.values()
                                                if torch.is_tensor(v) and v.dim() > 0])
elif variant == "naive":
    marks["verify"] = marks["construct"]
    phases.enter("map + apply")
    payload = torch.load(path, weights_only=True)
    model.load_state_dict(payload["modules"]["model"])
    opt.load_state_dict(payload["optimizers"]["opt"])
    del payload
else:
    marks["verify"] = marks["construct"]
    phases.enter("map + apply")
marks["apply"] = time.time()
ready = phases.sample()
phases.enter("first step")
loss = train_step(model, opt)
marks["step"] = time.time()
after = phases.sample()
phases.enter("end")
phases.stop.set()
phases.thread.join()
pre = {k: 0 for k in ("anon", "file", "rss")}
for name in ("construct", "verify", "map + apply"):
    for k in pre:
        pre[k] = max(pre[k], phases.peaks.get(name, pre)[k])
overall = {k: max(pre[k], phases.peaks["first step"][k]) for k in pre}
print(json.dumps({
    "variant": variant, "workbench": workbench.__file__, "marks": marks, "loss": loss, "faults": {k: v for k, v in faults.items() if k not in ("start", "end")},
    "cpu": {k: v for k, v in cpu_seconds.items() if k not in ("start", "end")},
    "cpu_total": -cpu_seconds["end"],  # from the interpreter's start to the step done
    "peak_ready": {k: pre[k] - baseline[k] for k in pre},
    "peak_step": {k: overall[k] - baseline[k] for k in pre},
    "at_ready": {k: ready[k] - baseline[k] for k in pre},
    "after_step": {k: after[k] - baseline[k] for k in pre},
    "baseline": baseline,
    "mapped": report.mapped if report else None,
    "initialized": len(report.initialized) if report else None,
}))
"""

PROJECT = """\
import torch
from torch.nn import functional as F

from workbench.tools.loadbench_worker import GPT2, config

BATCH, SEQ = {batch}, {seq}


def setup(bench):
    torch.manual_seed(0)
    model = GPT2(config("{size}"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return {{"model": model, "opt": opt}}


def step(state, bench):
    model, opt = state["model"], state["opt"]
    opt.zero_grad(set_to_none=True)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.cfg.vocab_size, (BATCH, SEQ + 1), generator=g)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    return loss
"""


def make_snapshot(folder: Path, size: str) -> Path:
    import torch

    from workbench.engine.actions.snapshot import write_snapshot
    from workbench.tools.loadbench_worker import GPT2, config

    torch.manual_seed(0)
    model = GPT2(config(size))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 100, (1, 8))
    out = model(tokens)
    (out[0] if isinstance(out, tuple) else out).float().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    event = write_snapshot({"model": model, "opt": opt}, 1, 0, folder)
    return Path(event.path)


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def with_code(code: Path) -> dict[str, str]:
    """The environment that makes `import workbench` find the checkout `code` (before any installed copy)."""
    return {**os.environ, "PYTHONPATH": str(code)}


def run_variant(variant: str, path: Path, size: str, code: Path) -> dict[str, Any]:
    launched = time.time()
    out = subprocess.run([sys.executable, "-c", CHILD, variant, str(path), size, str(BATCH), str(SEQ)],
                         capture_output=True, text=True, cwd=code, env=with_code(code), check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{out.stderr[-3000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if not Path(r["workbench"]).resolve().is_relative_to(code.resolve()):
        raise RuntimeError(f"{variant} imported workbench from {r['workbench']}, not from {code}")
    m = r["marks"]
    r["times"] = {
        "start + imports": m["imported"] - launched,
        "construct": m["construct"] - m["imported"],
        "  of which the model": m["model"] - m["imported"],
        "verify": m["verify"] - m["construct"],
        "map + apply": m["apply"] - m["verify"],
        "first step": m["step"] - m["apply"],
        "total": m["step"] - launched,
    }
    return r


# --------------------------------------------------------------------------- the real session, headless


def read_proc_status(pid: int) -> dict[str, int] | None:
    fields = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file"}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in fields:
            out[fields[key]] = int(rest.split()[0]) * 1024
    return out


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of a process so far (all its threads), from /proc/PID/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_session(project: Path, resume: Path | None, code: Path) -> dict[str, Any]:
    """`python -m workbench run train.py --headless` until its first step event: (seconds to each event, peaks)."""
    cmd = [sys.executable, "-m", "workbench", "run", str(project), "--headless", "--device", "cpu",
           "--max-steps", "2" if resume else "1"]
    if resume is not None:
        cmd += ["--resume", str(resume)]
    peaks = {"anon": 0, "file": 0, "rss": 0}
    stop = threading.Event()
    launched = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, cwd=project.parent, env=with_code(code))

    def sample() -> None:
        while not stop.is_set():
            now = read_proc_status(proc.pid)
            if now:
                for k, peak in peaks.items():
                    peaks[k] = max(peak, now.get(k, 0))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    seen: dict[str, float] = {}
    events: dict[str, dict[str, Any]] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        at = time.time() - launched
        try:
            event = json.loads(line)
        except ValueError:
            continue
        name = event.get("event") or event.get("name") or event.get("type")
        key = f"{name}:{event.get('status')}" if name == "setup" else str(name)
        seen.setdefault(key, at)
        events.setdefault(key, event)
        if name == "step":
            cpu = proc_cpu_seconds(proc.pid)
            break
    stop.set()
    sampler.join()
    proc.stdout.close()
    proc.wait(timeout=120)
    err = proc.stderr.read() if proc.stderr else ""
    if "step" not in seen:
        raise RuntimeError(f"no step event from {' '.join(cmd)}; events {list(seen)}; stderr:\n{err[-3000:]}")
    if resume is not None and not events.get("resume", {}).get("ok"):
        raise RuntimeError(f"the resume failed: {events.get('resume')}")
    return {"seen": seen, "peaks": peaks, "cpu": cpu, "resume": events.get("resume"), "setup": events.get("setup:done"),
            "step_ms": events["step"].get("ms")}


def median_of(rows: list[dict[str, Any]], *keys: str) -> float:
    values = []
    for row in rows:
        value: Any = row
        for key in keys:
            value = value[key]
        values.append(value)
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="124M")
    parser.add_argument("--repeat", type=int, default=3, help="measured rounds after one warm-up round (default 3)")
    parser.add_argument("--no-session", action="store_true", help="skip the headless-session comparison")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--save", metavar="PATH", help="also write the figures as JSON to PATH")
    parser.add_argument("--code", type=Path, default=REPO,
                        help="the checkout whose workbench the variants run (default: this one); a clean "
                        "`git worktree` keeps others' uncommitted edits out of the figures")
    args = parser.parse_args()
    loads = [load_average()]
    with tempfile.TemporaryDirectory() as tmp:
        path = make_snapshot(Path(tmp) / "run", args.size)
        size = path.stat().st_size
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        for round_ in range(args.repeat + 1):
            order = VARIANTS[round_ % len(VARIANTS):] + VARIANTS[: round_ % len(VARIANTS)]
            for variant in order:
                r = run_variant(variant, path, args.size, args.code)
                if round_ > 0:  # round 0 warms the page cache and the interpreter's files
                    runs[variant].append(r)
            loads.append(load_average())
        sessions: dict[str, list[dict[str, Any]]] = {"no resume": [], "--resume": []}
        if not args.no_session:
            project = Path(tmp) / "proj" / "train.py"
            project.parent.mkdir()
            project.write_text(PROJECT.format(batch=BATCH, seq=SEQ, size=args.size))
            for round_ in range(args.repeat + 1):
                for label in (("no resume", "--resume") if round_ % 2 == 0 else ("--resume", "no resume")):
                    r = run_session(project, path if label == "--resume" else None, args.code)
                    if round_ > 0:
                        sessions[label].append(r)
                loads.append(load_average())
    result = summarize(runs, sessions, size, args, loads)
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    report(result)


def summarize(runs: dict[str, list[dict[str, Any]]], sessions: dict[str, list[dict[str, Any]]], size: int,
              args: argparse.Namespace, loads: list[str]) -> dict[str, Any]:
    commit = subprocess.run(["git", "-C", str(args.code), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    out: dict[str, Any] = {"size": args.size, "code": str(args.code), "commit": commit, "snapshot_bytes": size, "repeat": args.repeat, "load_averages": loads,
                           "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
                           "date": time.strftime("%Y-%m-%d"), "variants": {}, "sessions": {}}
    for variant, rows in runs.items():
        out["variants"][variant] = {
            "times": {k: median_of(rows, "times", k) for k in rows[0]["times"]},
            "faults": {k: median_of(rows, "faults", k) for k in rows[0]["faults"]},
            "cpu": {k: median_of(rows, "cpu", k) for k in rows[0]["cpu"]},
            "cpu_total": median_of(rows, "cpu_total"),
            "totals": [r["times"]["total"] for r in rows],
            "peak_ready": {k: max(r["peak_ready"][k] for r in rows) for k in ("anon", "file", "rss")},
            "peak_step": {k: max(r["peak_step"][k] for r in rows) for k in ("anon", "file", "rss")},
            "after_step": {k: median_of(rows, "after_step", k) for k in ("anon", "file", "rss")},
            "mapped": rows[0]["mapped"], "initialized": rows[0]["initialized"],
            "losses": sorted({round(r["loss"], 5) for r in rows}),
        }
    v = out["variants"]
    ours = v["vram-bench"]["times"]["total"]
    out["ratios"] = {
        "vram-bench / fresh": ours / v["fresh"]["times"]["total"],
        "vram-bench / naive": ours / v["naive"]["times"]["total"],
        "old way / fresh": v["old way"]["times"]["total"] / v["fresh"]["times"]["total"],
        "proposed / fresh": v["proposed"]["times"]["total"] / v["fresh"]["times"]["total"],
        "proposed / naive": v["proposed"]["times"]["total"] / v["naive"]["times"]["total"],
    }
    for label, rows in sessions.items():
        if not rows:
            continue
        out["sessions"][label] = {
            "events": {k: median_of(rows, "seen", k) for k in rows[0]["seen"] if all(k in r["seen"] for r in rows)},
            "first_step": median_of(rows, "seen", "step"),
            "first_steps": [r["seen"]["step"] for r in rows],
            "setup_done": median_of(rows, "seen", "setup:done"),
            "setup_seconds": statistics.median(r["setup"]["seconds"] for r in rows if r["setup"]),
            "resume_seconds": statistics.median(r["resume"]["seconds"] for r in rows) if rows[0]["resume"] else None,
            "step_ms": statistics.median(r["step_ms"] for r in rows),
            "cpu": statistics.median(r["cpu"] for r in rows),
            "peak": {k: max(r["peaks"][k] for r in rows) for k in ("anon", "file", "rss")},
        }
    if len(out["sessions"]) == 2:
        s = out["sessions"]
        out["ratios"]["session --resume / no resume"] = s["--resume"]["first_step"] / s["no resume"]["first_step"]
        out["ratios"]["session --resume / no resume, CPU"] = s["--resume"]["cpu"] / s["no resume"]["cpu"]
    for name in ("vram-bench", "old way", "proposed"):
        for base in ("fresh", "naive"):
            out["ratios"][f"{name} / {base}, CPU"] = v[name]["cpu_total"] / v[base]["cpu_total"]
    return out


def report(result: dict[str, Any]) -> None:
    gib, size = 2**30, result["snapshot_bytes"]
    print(f"resume of a GPT-2 {result['size']} + AdamW snapshot ({size / gib:.2f} GiB, {size / 1e6:.0f} MB), each variant "
          f"in a fresh process; medians of {result['repeat']} after a warm-up round")
    cols = ("start + imports", "construct", "  of which the model", "verify", "map + apply", "first step", "total")
    print(f"{'variant':<11} " + " ".join(f"{c:>{max(15, len(c))}}" for c in cols))
    for name, v in result["variants"].items():
        print(f"{name:<11} " + " ".join(f"{v['times'][c]:>{max(15, len(c)) - 1}.2f}s" for c in cols))
    print("page faults (minor, thousands) and CPU seconds (user + system, all threads) per phase, medians; CPU to the step done:")
    for name, v in result["variants"].items():
        print(f"{name:<11} " + ", ".join(f"{k} {n / 1e3:.0f}k {v['cpu'][k]:.2f}s" for k, n in v["faults"].items())
              + f"; total CPU {v['cpu_total']:.2f}s")
    print(f"{'variant':<11} {'peak ready: anon / file / RSS (x snap)':>44} {'peak thru step: anon / file / RSS (x snap)':>46}")
    for name, v in result["variants"].items():
        a, b = v["peak_ready"], v["peak_step"]
        print(f"{name:<11} {a['anon'] / gib:>9.2f} / {a['file'] / gib:.2f} / {a['rss'] / gib:.2f} GiB ({a['rss'] / size:.2f}x)"
              f"      {b['anon'] / gib:>9.2f} / {b['file'] / gib:.2f} / {b['rss'] / gib:.2f} GiB ({b['rss'] / size:.2f}x)"
              f"   totals {', '.join(f'{t:.2f}' for t in v['totals'])}")
    for label, s in result["sessions"].items():
        p = s["peak"]
        print(f"session {label:<10} first step event at {s['first_step']:.2f} s (runs {', '.join(f'{t:.2f}' for t in s['first_steps'])}), "
              f"setup done at {s['setup_done']:.2f} s (setup {s['setup_seconds']:.2f} s"
              + (f", resume {s['resume_seconds']:.2f} s" if s["resume_seconds"] is not None else "")
              + f"), step {s['step_ms']:.0f} ms, CPU {s['cpu']:.2f} s; events at "
              + ", ".join(f"{k} {t:.2f}" for k, t in s["events"].items() if k != "memory") + f"; peak process anon / file / RSS {p['anon'] / gib:.2f} / {p['file'] / gib:.2f} / {p['rss'] / gib:.2f} GiB")
    for k, value in result["ratios"].items():
        print(f"{k}: {value:.2f}x")
    print(f"workbench from {result['code']} ({result['commit']}); {result['machine']}, {result['date']}, load averages {' | '.join(result['load_averages'])}")


if __name__ == "__main__":
    main()
