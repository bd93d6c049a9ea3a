"""The child process of `vram-bench load-bench`: one per method, so no method inherits another's peaks.

`python -m workbench.tools.loadbench_worker prepare ...` probes torch and the device and writes the
checkpoint; `... load --method M ...` loads it one way while a thread samples this process's
memory. Each prints one `LOADBENCH-RESULT {json}` line on stdout for the parent
(`workbench/tools/loadbench.py`), which owns the CLI and the report.

The model is GPT-2 in plain torch: token and position embeddings, blocks of
LayerNorm / attention (c_attn 3x, c_proj) / LayerNorm / MLP (c_fc 4x, c_proj),
a final LayerNorm, and the lm_head tied to the token embedding (logits are
`F.linear(h, wte.weight)`, as in GPT-2). Tying by reuse rather than by a second
`lm_head` Parameter keeps one tensor per weight, so no method has to restore a
tie that meta/to_empty/assign loading would silently break. Linear weights are
`nn.Linear` layout (out, in), not Hugging Face's transposed Conv1D.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from workbench.tools.loadbench import (
    CONFIGS,
    FORMAT,
    HIDDEN_CONFIGS,
    RESULT_PREFIX,
    SEED,
    GPTConfig,
    checkpoint_paths,
)

SAMPLE_HZ = 200.0

# --------------------------------------------------------------------------- the model


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 with GPT-2's initialisation (normal 0.02, residual projections scaled by 1/sqrt(2 n_layer)).

    Built normally it pays for that random init (twice, as nanoGPT does: nn.Linear's own, then
    GPT-2's); built under `torch.device("meta")` it allocates and initialises nothing.
    """

    def __init__(self, cfg: GPTConfig) -> None:
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
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # the tied lm_head


def config(name: str) -> GPTConfig:
    return CONFIGS.get(name) or HIDDEN_CONFIGS[name]


# --------------------------------------------------------------------------- checksums


def tensor_checksum(t: torch.Tensor) -> dict[str, Any]:
    """Exact, order-independent fingerprint of an fp32 tensor: its bit patterns summed mod 2**32, plus 8 samples.

    Reading every element is also what pages mmap'd weights in. int32 sums wrap, so the
    result does not depend on how the reduction is split across threads, and unlike a
    float64 sum it allocates no full-size temporary that would show up in the peaks.
    """
    bits = t.detach().reshape(-1).view(torch.int32)
    n = bits.numel()
    picks = sorted({i * (n - 1) // 7 for i in range(8)}) if n else []
    idx = torch.tensor(picks, dtype=torch.long, device=bits.device)
    return {
        "shape": list(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "sum_i32": int(bits.sum(dtype=torch.int32)),
        "samples": bits[idx].tolist(),
    }


def check_model(model: nn.Module, expected: dict[str, dict[str, Any]], device: torch.device) -> tuple[int, list[str]]:
    """Checksum every parameter (reading all of it) and compare with the manifest; (tensors checked, problems)."""
    problems: list[str] = []
    params = dict(model.named_parameters())
    for name in sorted(set(expected) - set(params)):
        problems.append(f"{name}: missing from the model")
    for name in sorted(set(params) - set(expected)):
        problems.append(f"{name}: not in the checkpoint")
    checked = 0
    for name, p in params.items():
        want = expected.get(name)
        if want is None:
            continue
        if p.device != device:
            problems.append(f"{name}: on {p.device}, not {device}")
            continue
        got = tensor_checksum(p)
        probe()
        checked += 1
        if got != {k: want[k] for k in got}:
            diff = [k for k in got if got[k] != want[k]]
            problems.append(f"{name}: {', '.join(diff)} differ from the checkpoint")
    return checked, problems


# --------------------------------------------------------------------------- memory sampling


_STATUS_FIELDS = {b"VmRSS": "rss", b"RssAnon": "anon", b"RssFile": "file", b"VmHWM": "hwm"}


def read_status() -> dict[str, int]:
    """This process's RSS, anonymous and file-backed resident memory and RSS high-water mark, in bytes."""
    try:
        with open("/proc/self/status", "rb") as f:
            data = f.read()
    except OSError:  # not Linux: psutil's shared memory is the nearest thing to file-backed
        import psutil

        info = psutil.Process().memory_info()
        shared = getattr(info, "shared", 0)
        return {"rss": info.rss, "anon": max(info.rss - shared, 0), "file": shared, "hwm": 0}
    out = {"rss": 0, "anon": 0, "file": 0, "hwm": 0}
    for line in data.splitlines():
        key, _, rest = line.partition(b":")
        field = _STATUS_FIELDS.get(key)
        if field:
            out[field] = int(rest.split()[0]) * 1024  # kB
    return out


def reset_high_water_mark() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the kernel's exact peak covers only the load."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def probe() -> None:
    """Take a sample now, from the loading thread (a no-op outside a PeakSampler).

    The loaders call it at their phase boundaries (after torch.load, before dropping the
    state dict, after each tensor): on a busy 2-core machine the sampler thread can miss a
    peak that lasts a few milliseconds, and these are exactly the moments peaks happen.
    """
    sampler = PeakSampler.active
    if sampler is not None:
        sampler.sample()


class PeakSampler:
    """Samples `/proc/self/status` at about 200 Hz on a daemon thread and keeps the peaks.

    A thread rather than the kernel's VmHWM alone because VmHWM is one number: it cannot
    say whether the peak was private copies (anonymous) or mmap'd file pages.
    """

    active: PeakSampler | None = None

    def __init__(self, hz: float = SAMPLE_HZ) -> None:
        self.interval = 1.0 / hz
        self.peak = {"rss": 0, "anon": 0, "file": 0}
        self.samples = 0  # every sample, the loaders' probes included
        self.thread_samples = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loadbench-sampler", daemon=True)
        self._start = 0.0
        self._lock = threading.Lock()

    def sample(self) -> None:
        now = read_status()
        with self._lock:
            for key in self.peak:
                self.peak[key] = max(self.peak[key], now[key])
            self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()
            self.thread_samples += 1

    def __enter__(self) -> PeakSampler:
        self._start = time.perf_counter()
        self.sample()
        self._thread.start()
        PeakSampler.active = self
        return self

    def __exit__(self, *exc: object) -> None:
        PeakSampler.active = None
        self._stop.set()
        self._thread.join()
        self.sample()
        self.seconds = time.perf_counter() - self._start


# --------------------------------------------------------------------------- the methods

Loader = Callable[[GPTConfig, Path, Path, torch.device], nn.Module]


def load_naive(cfg: GPTConfig, single: Path, tensor_dir: Path, device: torch.device) -> nn.Module:
    """The tutorial way: a randomly initialised model plus a full loaded copy, then move it."""
    model = GPT2(cfg)
    probe()
    sd = torch.load(single, weights_only=True)
    probe()
    model.load_state_dict(sd)
    probe()
    del sd
    return model.to(device)


def load_sequential(cfg: GPTConfig, single: Path, tensor_dir: Path, device: torch.device) -> nn.Module:
    """Build on the device, copy from an mmap'd state dict one parameter at a time: no second private copy."""
    with torch.device(device):
        model = GPT2(cfg)
    probe()
    sd = torch.load(single, mmap=True, weights_only=True)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(sd.pop(name))
            probe()
    if sd:
        raise RuntimeError(f"unexpected keys in the checkpoint: {', '.join(list(sd)[:5])}")
    del sd
    return model


def load_to_empty(cfg: GPTConfig, single: Path, tensor_dir: Path, device: torch.device) -> nn.Module:
    """Skip the random init (meta, then uninitialised storage), but still load a full private copy."""
    with torch.device("meta"):
        model = GPT2(cfg)
    model.to_empty(device=device)
    probe()
    sd = torch.load(single, weights_only=True)
    probe()
    model.load_state_dict(sd)
    probe()
    del sd
    return model


def load_mmap_assign(cfg: GPTConfig, single: Path, tensor_dir: Path, device: torch.device) -> nn.Module:
    """Parameters become the mmap'd tensors themselves: no copy, no init; pages load when first read."""
    with torch.device("meta"):
        model = GPT2(cfg)
    sd = torch.load(single, mmap=True, weights_only=True)
    model.load_state_dict(sd, assign=True)
    del sd
    probe()
    model = model.to(device)
    probe()
    return model


def load_per_tensor(cfg: GPTConfig, single: Path, tensor_dir: Path, device: torch.device) -> nn.Module:
    """One mmap'd file per tensor, assigned one at a time: on a GPU each mapping is dropped after its copy."""
    with torch.device("meta"):
        model = GPT2(cfg)
    for name, meta_param in list(model.named_parameters()):
        tensor = torch.load(tensor_dir / f"{name}.pt", mmap=True, weights_only=True)
        if tensor.shape != meta_param.shape:
            raise RuntimeError(f"{name}: file has shape {tuple(tensor.shape)}, the model wants {tuple(meta_param.shape)}")
        module_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(module_name), leaf, nn.Parameter(tensor.to(device), requires_grad=meta_param.requires_grad))
        del tensor
        probe()
    return model


LOADERS: dict[str, Loader] = {
    "naive": load_naive,
    "sequential": load_sequential,
    "to_empty": load_to_empty,
    "mmap_assign": load_mmap_assign,
    "per_tensor": load_per_tensor,
}

META_METHODS = frozenset({"to_empty", "mmap_assign", "per_tensor"})
WARMUP_CONFIG = GPTConfig("warmup", n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_ctx=8)


def meta_warmup() -> dict[str, Any]:
    """Pay, before the baseline, what the first meta-device model in a process costs, and say how much.

    Torch's Python meta kernels import on first use (about 800 modules, sympy among them:
    1.5 s and 70 MB here). That is a fixed cost per process, not a cost of the weights, so it
    is kept out of the comparison and reported on its own.
    """
    before = read_status()
    start = time.perf_counter()
    with torch.device("meta"):
        model = GPT2(WARMUP_CONFIG)
    model.to_empty(device="cpu")
    seconds = time.perf_counter() - start
    return {"meta_warmup_s": seconds, "meta_warmup_anon_bytes": max(read_status()["anon"] - before["anon"], 0)}


# --------------------------------------------------------------------------- commands


def emit(result: dict[str, Any]) -> None:
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()


def resolve_device(spec: str) -> torch.device:
    """auto -> the current GPU or the CPU; cuda without a GPU is a sentence for the user, not a traceback."""
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(
            f"--device {spec}: CUDA is not available on this machine (torch {torch.__version__} sees no GPU). "
            "Use --device cpu, or auto to use a GPU only when there is one."
        )
    index = torch.cuda.current_device() if spec in ("auto", "cuda") else int(spec.split(":")[1])
    if index >= torch.cuda.device_count():
        raise ValueError(f"--device {spec}: there are only {torch.cuda.device_count()} GPUs (cuda:0 to cuda:{torch.cuda.device_count() - 1}).")
    return torch.device("cuda", index)


def _save_synced(obj: object, path: Path) -> None:
    """torch.save, then fsync: the kernel flushing gigabytes of dirty pages while the first method loads would slow it."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def write_checkpoint(cfg: GPTConfig, directory: Path, per_tensor: bool) -> dict[str, Any]:
    """Random seeded weights, saved once as one torch.save file (and one file per tensor); manifest last.

    Every tensor is made random, biases and LayerNorms too, so a tensor a method failed to
    load cannot pass the checksum by matching its fresh init.
    """
    single, tensor_dir, manifest_path = checkpoint_paths(directory, cfg)
    manifest_path.unlink(missing_ok=True)  # no manifest = incomplete, while we write
    torch.manual_seed(SEED)
    model = GPT2(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p), alpha=0.02)
    sd = model.state_dict()
    tmp = single.with_suffix(".pt.tmp")
    _save_synced(sd, tmp)
    os.replace(tmp, single)
    files: dict[str, int] = {}
    shutil.rmtree(tensor_dir, ignore_errors=True)
    if per_tensor:
        tensor_dir.mkdir()
        for name, tensor in sd.items():
            path = tensor_dir / f"{name}.pt"
            _save_synced(tensor, path)
            files[path.name] = path.stat().st_size
    manifest = {
        "format": FORMAT,
        "config": dataclasses.asdict(cfg),
        "seed": SEED,
        "parameters": sum(t.numel() for t in sd.values()),
        "checkpoint": single.name,
        "checkpoint_bytes": single.stat().st_size,
        "per_tensor_dir": tensor_dir.name if per_tensor else None,
        "per_tensor_files": files or None,
        "per_tensor_bytes": sum(files.values()) if per_tensor else None,
        "tensors": {name: tensor_checksum(t) for name, t in sd.items()},
    }
    tmp_manifest = manifest_path.with_suffix(".json.tmp")
    tmp_manifest.write_text(json.dumps(manifest))
    os.replace(tmp_manifest, manifest_path)
    return manifest


def cmd_prepare(args: argparse.Namespace) -> int:
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        emit({"error": str(exc)})
        return 3
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "write_s": None,
    }
    if args.write:
        start = time.perf_counter()
        write_checkpoint(config(args.size), Path(args.dir), args.per_tensor)
        info["write_s"] = time.perf_counter() - start
    emit(info)
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    cfg = config(args.size)
    device = torch.device(args.device)
    single, tensor_dir, manifest_path = checkpoint_paths(Path(args.dir), cfg)
    manifest = json.loads(manifest_path.read_text())
    cuda = device.type == "cuda"
    result: dict[str, Any] = {"ok": False, "torch": torch.__version__, "gpu": None, "meta_warmup_s": None, "meta_warmup_anon_bytes": None}

    # Everything a process pays before loading goes into the baseline: the CUDA context, torch's thread pool.
    torch.manual_seed(SEED + 1)  # a fresh init that is not the checkpoint's
    torch.ones(64).add_(1)
    device_base = 0
    if cuda:
        torch.cuda.set_device(device)
        torch.ones(1, device=device).add_(1)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        device_base = torch.cuda.memory_allocated(device)
        result["gpu"] = torch.cuda.get_device_name(device)
    if args.method in META_METHODS:
        result.update(meta_warmup())
    hwm_reset = reset_high_water_mark()
    baseline = read_status()
    result["baseline"] = {k: baseline[k] for k in ("rss", "anon", "file")}

    try:
        with PeakSampler() as sampler:
            start = time.perf_counter()
            model = LOADERS[args.method](cfg, single, tensor_dir, device)
            if cuda:
                torch.cuda.synchronize(device)
            load_s = time.perf_counter() - start
            checked, problems = check_model(model, manifest["tensors"], device)
            if cuda:
                torch.cuda.synchronize(device)
            ready_s = time.perf_counter() - start
    except Exception as exc:  # a method that fails is a result, not a crash of the benchmark
        traceback.print_exc()
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        result["error"] = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        emit(result)
        return 1

    end = read_status()
    peak_rss = max(sampler.peak["rss"], end["hwm"] if hwm_reset else 0)
    result.update(
        ok=not problems,
        error=(f"{len(problems)} tensors do not match the checkpoint: " + "; ".join(problems[:3])) if problems else None,
        load_s=load_s,
        ready_s=ready_s,
        peak_anon_bytes=max(sampler.peak["anon"] - baseline["anon"], 0),
        peak_file_bytes=max(sampler.peak["file"] - baseline["file"], 0),
        peak_rss_bytes=max(peak_rss - baseline["rss"], 0),
        peak_rss_source="VmHWM" if hwm_reset else "sampled",
        peak_device_bytes=(torch.cuda.max_memory_allocated(device) - device_base) if cuda else None,
        device_note=None if cuda else "no CUDA device in use",
        tensors_checked=checked,
        mismatches=problems[:20],
        samples=sampler.samples,
        sample_hz=sampler.thread_samples / sampler.seconds if sampler.seconds else None,
    )
    emit(result)
    return 0 if result["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.tools.loadbench_worker", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser("prepare", help="probe torch and the device; with --write, write the checkpoint")
    prepare.add_argument("--write", action="store_true")
    prepare.add_argument("--per-tensor", action="store_true")
    load = sub.add_parser("load", help="load the checkpoint one way and report the peaks")
    load.add_argument("--method", choices=sorted(LOADERS), required=True)
    for p in (prepare, load):
        p.add_argument("--size", choices=sorted([*CONFIGS, *HIDDEN_CONFIGS]), required=True)
        p.add_argument("--dir", required=True)
        p.add_argument("--device", required=True)
    args = parser.parse_args(argv)
    return cmd_prepare(args) if args.command == "prepare" else cmd_load(args)


if __name__ == "__main__":
    sys.exit(main())
