"""Where the shipped sample projects live, and a writable copy for installed wheels.

In a source checkout the samples are edited in place (the README's tour points
there). An installed wheel carries them inside the package, which users should
not edit, so the first run copies them to the user's data folder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import workbench

DEFAULT_SAMPLE = "tiny_gpt"
SAMPLES = {
    "tiny_gpt": "a character-level GPT learning Shakespeare (the default)",
    "batchnorm_cnn": "a CNN with BatchNorm and Dropout: state that survives reloads, and the eval-mode trap",
    "lora_finetune": "LoRA adapters on a frozen model: change the rank with a rebuild, read the breakdown",
    "leaky_loop": "a leaking loop: find the leaks with the gauges, the leak finder and cleanup, fix them live",
    "memory_lab": "activation checkpointing, AMP, batch size, accumulation, offload: switched live, compared",
    "ddp_gpt": "the tiny GPT under DistributedDataParallel: every rank swaps the same code at the same step",
}


def _checkout_samples() -> Path:
    return Path(workbench.__file__).resolve().parent.parent / "sample_projects"


def _packaged_samples() -> Path:
    return Path(workbench.__file__).resolve().parent / "_samples"


def user_samples_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "vram-bench" / "samples"


def sample_entry(name: str = DEFAULT_SAMPLE) -> tuple[Path, str | None]:
    """The sample's train.py, and a note for the user when it had to be copied first."""
    checkout = _checkout_samples() / name / "train.py"
    if checkout.is_file():
        return checkout, None
    packaged = _packaged_samples() / name
    if not (packaged / "train.py").is_file():
        raise FileNotFoundError(f"the {name} sample is missing from this installation ({packaged})")
    target = user_samples_dir() / name
    if not (target / "train.py").is_file():
        shutil.copytree(packaged, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", ".vram-bench"))
        return target / "train.py", f"copied the {name} sample to {target}: edit it there"
    return target / "train.py", None
