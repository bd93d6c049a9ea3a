"""`vram-bench load-bench`: how much host memory and time each way of loading weights costs.

Loading a checkpoint the obvious way holds two copies of the weights in RAM (the
randomly initialised model and the loaded state dict); building on the meta
device and memory-mapping the file avoids both. This command measures that for
GPT-2-shaped models instead of quoting it: it writes a random, seeded checkpoint
once (never timed), then loads it with each method in a fresh child process
(`workbench/tools/loadbench_worker.py`) so no method inherits another's peaks.

Host memory is reported as anonymous and file-backed separately: mmap'd weights
are file-backed page cache the kernel can drop and re-read, and plain RSS would
make them look as costly as a private copy. Every figure is "above the baseline"
of a process that has only imported torch (and created the CUDA context).

This module never imports torch: the parent only checks the machine, starts the
children and prints what they report, so `--help` and the error paths are instant.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from workbench.cli import positive_int
from workbench.errors import UserError

PROG = "vram-bench load-bench"
FORMAT = 1  # manifest format; a checkpoint written by another format is rewritten, not reused
SEED = 1234
RESULT_PREFIX = "LOADBENCH-RESULT "  # the one stdout line a child prints; anything else there is ignored
MiB = 1024**2
GiB = 1024**3
BASELINE_ALLOWANCE = 512 * MiB  # RAM a child needs before loading anything (Python + torch)
DISK_MARGIN = 64 * MiB


@dataclass(frozen=True)
class GPTConfig:
    """A GPT-2 shape. Vocabulary and context are GPT-2's; the lm_head is tied to the token embedding."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int = 50257
    n_ctx: int = 1024

    def parameters(self) -> int:
        """Parameter count (the tied lm_head counted once, as in GPT-2's published sizes)."""
        d = self.n_embd
        per_block = (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (2 * d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
        return self.vocab_size * d + self.n_ctx * d + self.n_layer * per_block + 2 * d

    def tensors(self) -> int:
        """Number of tensors in the state dict (one file each in the per-tensor layout)."""
        return 2 + 12 * self.n_layer + 2

    def model_bytes(self) -> int:
        return 4 * self.parameters()  # fp32


CONFIGS: dict[str, GPTConfig] = {
    "124M": GPTConfig("124M", n_layer=12, n_embd=768, n_head=12),
    "355M": GPTConfig("355M", n_layer=24, n_embd=1024, n_head=16),
    "774M": GPTConfig("774M", n_layer=36, n_embd=1280, n_head=20),
    "1558M": GPTConfig("1558M", n_layer=48, n_embd=1600, n_head=25),
}
# For the tests, not shown in --help: big enough (93 MB) that two copies vs none is unmistakable.
HIDDEN_CONFIGS: dict[str, GPTConfig] = {"tiny": GPTConfig("tiny", n_layer=2, n_embd=384, n_head=6)}


@dataclass(frozen=True)
class Method:
    key: str
    label: str
    ram_factor: float  # host RAM it needs, in checkpoint sizes (for the up-front check)
    summary: str


METHODS: tuple[Method, ...] = (
    Method("naive", "naive", 2.0, "build (random init), torch.load, load_state_dict"),
    Method("sequential", "sequential copy", 2.0, "build, torch.load(mmap=True), param.copy_ one by one"),
    Method("to_empty", "meta + to_empty", 2.0, "build on meta, to_empty, torch.load, load_state_dict"),
    Method("mmap_assign", "meta + mmap + assign", 1.0, "build on meta, torch.load(mmap=True), load_state_dict(assign=True)"),
    Method("per_tensor", "one file per tensor", 1.0, "build on meta, torch.load(mmap=True) each tensor file, assign"),
)
METHOD_BY_KEY = {m.key: m for m in METHODS}

EXAMPLES = """\
methods (--methods, comma-separated; default all, in this order):
  naive         build the model (random init), sd = torch.load(path), model.load_state_dict(sd)
  sequential    build, sd = torch.load(path, mmap=True), param.copy_(sd[name]) one parameter at a time
  to_empty      build on the meta device, model.to_empty(device), load_state_dict(torch.load(path))
  mmap_assign   build on meta, load_state_dict(torch.load(path, mmap=True), assign=True)
  per_tensor    build on meta, one file per tensor: torch.load(file, mmap=True) and assign each

examples:
  vram-bench load-bench                                     GPT-2 124M, every method, on the GPU if there is one
  vram-bench load-bench --size 774M --device cpu --repeat 3  median times of 3 runs per method
  vram-bench load-bench --size 1558M --dir /scratch/ckpt     keep the checkpoint there (reused next time)
  vram-bench load-bench --methods naive,mmap_assign --json | jq '.methods[] | {method, load_s, peak_anon_bytes}'

Each method runs in its own process. Memory is sampled from /proc/self/status at about 200 Hz
and shown above the baseline of a process that has only imported torch; anonymous memory
(private copies) and file-backed memory (mmap'd weights, droppable page cache) separately.
"load s" ends with the model on the device; "ready s" also reads every weight once (the
correctness checksum), which is when mmap'd weights are paged in. The page cache is warm.
"""


# --------------------------------------------------------------------------- checkpoint files


def checkpoint_paths(directory: Path, cfg: GPTConfig) -> tuple[Path, Path, Path]:
    """(single file, per-tensor folder, manifest): named after the size so a user's own files are never touched."""
    stem = f"gpt2-{cfg.name}"
    return directory / f"{stem}.pt", directory / f"{stem}-tensors", directory / f"{stem}.manifest.json"


def reusable_checkpoint(directory: Path, cfg: GPTConfig, need_per_tensor: bool) -> dict[str, Any] | None:
    """The manifest of a complete checkpoint for `cfg` already in `directory`, or None (write it again)."""
    single, tensor_dir, manifest_path = checkpoint_paths(directory, cfg)
    try:
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("format") != FORMAT or manifest.get("config") != asdict(cfg) or manifest.get("seed") != SEED:
            return None
        if single.stat().st_size != manifest["checkpoint_bytes"]:
            return None
        if need_per_tensor:
            files = manifest.get("per_tensor_files") or {}
            if len(files) != cfg.tensors():
                return None
            for name, size in files.items():
                if (tensor_dir / name).stat().st_size != size:
                    return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return manifest


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def check_disk(directory: Path, cfg: GPTConfig, per_tensor: bool) -> None:
    """Refuse before writing anything if the checkpoint (and its per-tensor copy) cannot fit."""
    need = cfg.model_bytes() * (2 if per_tensor else 1) + DISK_MARGIN
    where = _existing_ancestor(directory)
    free = shutil.disk_usage(where).free
    if free < need:
        what = "the checkpoint and its one-file-per-tensor copy need" if per_tensor else "the checkpoint needs"
        raise UserError(
            f"not enough free disk space in {where}: GPT-2 {cfg.name} {what} about {_fmt_bytes(need)}, "
            f"but {_fmt_bytes(free)} is free.",
            hint="Point --dir at a larger disk, or pick a smaller --size.",
        )


def check_ram(cfg: GPTConfig, methods: list[Method]) -> None:
    """Refuse before starting if the hungriest chosen method cannot fit in available RAM (it would swap or be killed)."""
    import psutil

    worst = max(methods, key=lambda m: m.ram_factor)
    need = int(cfg.model_bytes() * worst.ram_factor) + BASELINE_ALLOWANCE
    available = psutil.virtual_memory().available
    if available < need:
        lighter = [m.key for m in METHODS if m.ram_factor < worst.ram_factor]
        hint = f"Pick a smaller --size, or run only --methods {','.join(lighter)}." if lighter else "Pick a smaller --size."
        raise UserError(
            f"not enough RAM for GPT-2 {cfg.name}: the {worst.label} method needs about {_fmt_bytes(need)} "
            f"({worst.ram_factor:g}x the {_fmt_bytes(cfg.model_bytes())} checkpoint plus torch), "
            f"but {_fmt_bytes(available)} is available.",
            hint=hint,
        )


def warm_page_cache(paths: list[Path]) -> None:
    """Read a reused checkpoint once so every method finds it in the page cache, as after a fresh write."""
    buf = bytearray(8 * MiB)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


# --------------------------------------------------------------------------- children


def _child_env() -> dict[str, str]:
    """The children import this checkout's `workbench`, whatever the current directory."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@dataclass
class ChildOutcome:
    result: dict[str, Any] | None
    returncode: int
    stderr_tail: str


def run_child(args: list[str], progress: ProgressLine) -> ChildOutcome:
    """Run the worker with `args`, redrawing the progress line while it runs; its result is its RESULT_PREFIX line."""
    cmd = [sys.executable, "-m", "workbench.tools.loadbench_worker", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_child_env())
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                progress.redraw()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    result = None
    for line in out.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX) :])
    tail = "\n".join(err.strip().splitlines()[-20:])
    return ChildOutcome(result, proc.returncode, tail)


def _death_message(outcome: ChildOutcome) -> str:
    """Why a child gave no result, in one line."""
    code = outcome.returncode
    if code < 0:
        why = f"the process was killed by signal {-code}" + (" (out of memory?)" if code == -9 else "")
    else:
        why = f"the process exited with code {code} without a result"
    last = outcome.stderr_tail.strip().splitlines()[-1:] or [""]
    return f"{why}: {last[0]}" if last[0] else why


# --------------------------------------------------------------------------- progress


class ProgressLine:
    """Methods done / total, the current step and elapsed time on stderr (stdout stays clean for --json).

    On a terminal it is one line redrawn in place; otherwise (a log, a test) a line per step.
    """

    WIDTH = 20

    def __init__(self, total: int, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.total = total
        self.done = 0
        self.current = ""
        self.start = time.monotonic()
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False

    def begin(self, what: str) -> None:
        self.current = what
        if self.tty:
            self.redraw()
        else:
            self._line(f"[{self.done}/{self.total}] {what} ...")

    def end(self, note: str, counts: bool = True) -> None:
        if counts:
            self.done += 1
        if not self.tty:
            self._line(f"[{self.done}/{self.total}] {self.current}: {note}")
        self.current = ""
        self.redraw()

    def redraw(self) -> None:
        if not self.tty:
            return
        filled = round(self.WIDTH * self.done / max(self.total, 1))
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        text = f"\rload-bench [{bar}] {self.done}/{self.total}  {self.current}  {self._elapsed()}\x1b[K"
        self.stream.write(text)
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.start:.1f}s"

    def _line(self, text: str) -> None:
        self.stream.write(f"load-bench {self._elapsed():>7} {text}\n")
        self.stream.flush()


# --------------------------------------------------------------------------- the command


def _size(text: str) -> GPTConfig:
    cfg = CONFIGS.get(text.upper()) or HIDDEN_CONFIGS.get(text.lower())
    if cfg is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(CONFIGS)}")
    return cfg


def _methods(text: str) -> list[Method]:
    keys = [k.strip().lower().replace("-", "_") for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in METHOD_BY_KEY]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(
            f"unknown method {', '.join(map(repr, unknown)) or '(none given)'}; choose from {','.join(METHOD_BY_KEY)}"
        )
    chosen = set(keys)
    return [m for m in METHODS if m.key in chosen]


def _device(text: str) -> str:
    if re.fullmatch(r"auto|cpu|cuda(:\d+)?", text):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not auto, cpu or cuda[:N]")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Compare memory-efficient ways of loading weights into a GPT-2-shaped model (random, seeded weights):\n"
            "peak host memory (anonymous and file-backed), peak device memory and load time, each method in its own process."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--size", type=_size, default=CONFIGS["124M"], metavar="{" + ",".join(CONFIGS) + "}",
                        help="GPT-2 size (default 124M: 475 MiB of fp32 weights; 1558M is 5.8 GiB)")
    parser.add_argument("--methods", type=_methods, default=list(METHODS), metavar="LIST",
                        help="comma-separated subset of: " + ",".join(METHOD_BY_KEY) + " (default: all)")
    parser.add_argument("--device", type=_device, default="auto", metavar="auto|cpu|cuda",
                        help="where the loaded model goes (default auto: cuda if available)")
    parser.add_argument("--dir", type=Path, metavar="PATH",
                        help="write the checkpoint here and keep it (reused by later runs); default a temp dir removed afterwards")
    parser.add_argument("--repeat", type=positive_int, default=1, metavar="N",
                        help="run each method N times (each in a fresh process): median times, highest peaks (default 1)")
    parser.add_argument("--json", action="store_true", help="print machine-readable results on stdout instead of the table")
    return parser


def main(argv: list[str]) -> int:
    """Run the benchmark; 0 if every method loaded correctly, 1 if one failed, 2 for a usage error."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or argparse's own usage error (exit 2)
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    try:
        return _run(args)
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    cfg: GPTConfig = args.size
    methods: list[Method] = args.methods
    per_tensor = any(m.key == "per_tensor" for m in methods)
    keep = args.dir is not None
    directory = Path(args.dir) if keep else Path(tempfile.gettempdir())

    manifest = reusable_checkpoint(directory, cfg, per_tensor) if keep else None
    if manifest is None:
        check_disk(directory, cfg, per_tensor)
    check_ram(cfg, methods)

    if keep:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create --dir {directory}: {exc.strerror}.", hint="Pick a folder you can write to.") from None
    else:
        directory = Path(tempfile.mkdtemp(prefix="vram-bench-load-"))
    single, tensor_dir, manifest_path = checkpoint_paths(directory, cfg)

    progress = ProgressLine(len(methods) * args.repeat)
    started = _dt.datetime.now(_dt.timezone.utc).astimezone()
    prepared: dict[str, Any] = {}
    results: list[dict[str, Any]] = []
    device = "cpu"
    try:
        # One child probes torch and the device (failing fast on --device cuda without a GPU) and writes the
        # checkpoint. With a reused checkpoint on the CPU there is nothing to ask it, so it is skipped.
        if manifest is None or args.device != "cpu":
            writing = manifest is None
            progress.begin(f"writing the {cfg.name} checkpoint" if writing else "checking the device")
            child_args = ["prepare", "--size", cfg.name, "--dir", str(directory), "--device", args.device]
            if writing:
                child_args.append("--write")
                if per_tensor:
                    child_args.append("--per-tensor")
            outcome = run_child(child_args, progress)
            if outcome.result is None:
                raise UserError(f"preparing the checkpoint failed: {_death_message(outcome)}.")
            if outcome.result.get("error"):
                raise UserError(outcome.result["error"])
            prepared = outcome.result
            progress.end(f"done in {prepared['write_s']:.1f} s" if writing else prepared["device"], counts=False)
        if manifest is not None:
            # A fresh write leaves the files in the page cache; a reused one is read once so every method
            # starts from the same warm cache (the first would otherwise pay for the disk alone).
            progress.begin("reading the reused checkpoint into the page cache")
            warm_page_cache([single] + ([tensor_dir / n for n in manifest["per_tensor_files"]] if per_tensor else []))
            progress.end("done", counts=False)
        else:
            manifest = json.loads(manifest_path.read_text())
        device = prepared.get("device", "cpu")

        # Round-robin over the methods, so a slow stretch of a noisy machine is shared rather than one method's.
        runs: dict[str, list[dict[str, Any]]] = {m.key: [] for m in methods}
        for rep in range(args.repeat):
            for method in methods:
                progress.begin(method.label + (f" (run {rep + 1}/{args.repeat})" if args.repeat > 1 else ""))
                outcome = run_child(
                    ["load", "--method", method.key, "--size", cfg.name, "--dir", str(directory), "--device", device],
                    progress,
                )
                result = outcome.result or {"ok": False, "error": _death_message(outcome)}
                runs[method.key].append(result)
                progress.end(f"{result['load_s']:.2f} s" if result.get("ok") else f"FAILED: {result.get('error')}")
        results = [combine_runs(m, runs[m.key], manifest["checkpoint_bytes"]) for m in methods]
    finally:
        progress.close()
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)

    report = _report(cfg, manifest, prepared, results, device, started, directory if keep else None)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_table(report))
    return 0 if all(r.get("ok") for r in results) else 1


# --------------------------------------------------------------------------- report

PEAK_KEYS = ("peak_anon_bytes", "peak_file_bytes", "peak_rss_bytes", "peak_device_bytes")


def combine_runs(method: Method, runs: list[dict[str, Any]], checkpoint_bytes: int) -> dict[str, Any]:
    """One method's row from its runs: median times (load time is noisy), highest peaks (what you must provision)."""
    failed = [r for r in runs if not r.get("ok")]
    if failed:
        result = dict(failed[0])
    else:
        result = dict(sorted(runs, key=lambda r: r["load_s"])[len(runs) // 2])
        result["load_s"] = statistics.median(r["load_s"] for r in runs)
        result["ready_s"] = statistics.median(r["ready_s"] for r in runs)
        for key in PEAK_KEYS:
            values = [r[key] for r in runs if r.get(key) is not None]
            result[key] = max(values) if values else None
        result["anon_x_checkpoint"] = result["peak_anon_bytes"] / checkpoint_bytes
    result = {"method": method.key, "label": method.label, **result, "repeat": len(runs)}
    if len(runs) > 1:
        result["runs"] = [{k: r.get(k) for k in ("ok", "error", "load_s", "ready_s", *PEAK_KEYS)} for r in runs]
    return result



def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(prepared: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    import psutil

    torch_version = prepared.get("torch") or next((r["torch"] for r in results if r.get("torch")), None)
    return {
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch_version,
        "gpu": prepared.get("gpu") or next((r["gpu"] for r in results if r.get("gpu")), None),
    }


def _report(
    cfg: GPTConfig,
    manifest: dict[str, Any],
    prepared: dict[str, Any],
    results: list[dict[str, Any]],
    device: str,
    started: _dt.datetime,
    kept_in: Path | None,
) -> dict[str, Any]:
    return {
        "size": cfg.name,
        "config": asdict(cfg),
        "lm_head": "tied to the token embedding",
        "parameters": cfg.parameters(),
        "dtype": "float32",
        "model_bytes": cfg.model_bytes(),
        "checkpoint_bytes": manifest["checkpoint_bytes"],
        "per_tensor_bytes": manifest.get("per_tensor_bytes"),
        "per_tensor_files": len(manifest.get("per_tensor_files") or {}) or None,
        "checkpoint_written_s": prepared.get("write_s"),
        "checkpoint_dir": str(kept_in) if kept_in else None,
        "device": device,
        "page_cache": "warm",
        "sample_hz": 200,
        "repeat": max((r.get("repeat", 1) for r in results), default=1),
        "date": started.isoformat(timespec="seconds"),
        "machine": machine_info(prepared, results),
        "methods": results,
    }


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.0f} MiB"


def format_table(report: dict[str, Any]) -> str:
    """The human-readable report: context lines, one row per method, and what the columns mean."""
    m = report["machine"]
    ram = _fmt_bytes(m["ram_bytes"])
    lines = [
        f"GPT-2 {report['size']}: {report['parameters']:,} parameters, fp32, lm_head tied; model {_fmt_bytes(report['model_bytes'])}",
        f"checkpoint {_fmt_bytes(report['checkpoint_bytes'])} (one torch.save file)"
        + (f"; one file per tensor: {report['per_tensor_files']} files, {_fmt_bytes(report['per_tensor_bytes'])}"
           if report.get("per_tensor_files") else ""),
        f"device {report['device']}; machine: {m['cpu']}, {m['cores']} cores, {ram} RAM"
        + (f", {m['gpu']}" if m.get("gpu") else "")
        + f"; {m['os']}; Python {m['python']}, torch {m['torch']}",
        f"date {report['date']}; page cache warm; host memory sampled at ~{report['sample_hz']} Hz"
        + (f"; each method run {report['repeat']} times: median times, highest peaks" if report["repeat"] > 1 else ""),
        "",
    ]
    header = ["method", "load s", "ready s", "peak anon", "peak file", "peak RSS", "peak device", "anon x ckpt"]
    rows: list[list[str]] = []
    failures: list[str] = []
    for r in report["methods"]:
        if not r.get("ok"):
            rows.append([r["label"], "FAILED", "", "", "", "", "", ""])
            failures.append(f"  {r['label']}: {r.get('error')}")
            continue
        rows.append([
            r["label"],
            f"{r['load_s']:.2f}",
            f"{r['ready_s']:.2f}",
            _fmt_bytes(r["peak_anon_bytes"]),
            _fmt_bytes(r["peak_file_bytes"]),
            _fmt_bytes(r["peak_rss_bytes"]),
            _fmt_bytes(r.get("peak_device_bytes")),
            f"{r['anon_x_checkpoint']:.2f}x",
        ])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip()

    lines.append(fmt(header))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(fmt(row) for row in rows)
    ok = [r for r in report["methods"] if r.get("ok")]
    if ok:
        base = ok[0]["baseline"]
        lines += [
            "",
            f"Memory: peak above a process that has only imported torch (RSS {_fmt_bytes(base['rss'])}).",
            "  anon: private copies; file: mmap'd checkpoint pages (page cache the kernel can drop);",
            "  peak RSS: the kernel's high-water mark (VmHWM), anon and file together.",
            "Time: load s from model construction until it is on the device; ready s adds reading",
            "  every weight once (the correctness checksum), which is when mmap'd weights are paged in.",
        ]
        warm = [r for r in ok if r.get("meta_warmup_s") is not None]
        if warm:
            w = warm[0]
            lines += [
                f"Not counted above: the first meta-device model in a process costs {w['meta_warmup_s']:.2f} s and",
                f"  {_fmt_bytes(w['meta_warmup_anon_bytes'])} once (torch imports its meta kernels); the meta methods pay it before the baseline.",
            ]
    if failures:
        lines += ["", "failed:", *failures]
    if report.get("checkpoint_dir"):
        lines += ["", f"checkpoint kept in {report['checkpoint_dir']} (reused by the next run with the same --dir)"]
    return "\n".join(lines)
