"""Finetune LoRA adapters on a frozen base model that setup() pretrains first.

setup() pretrains a small MLP on task A for a few hundred steps (a second or
two on a CPU), freezes it, and turns chosen layers into LoRA layers (lora.py).
step() then trains only the adapters on task B: the same labelling rule, seen
through a rank-6 change of the input space. The loss starts where the frozen
base stands on task B and falls as the adapters learn the change. README.md
has a tour: change the adapters' rank, rebuild, read the memory breakdown.
"""

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lora import LoRALinear, add_lora
from model import MLP

# --- Tunables: plain literals, re-bound live when you save. ------------------
LR = 1e-2            # copied into the optimizer by step() on every step
BATCH_SIZE = 256     # read by the data generator on every batch

# --- Tasks and base model: only setup() reads these (save, then press R). ----
IN_FEATURES = 32
WIDTH = 128
CLASSES = 10
SHIFT_RANK = 6       # task B sees the inputs through identity + a rank-6 matrix
PRETRAIN_STEPS = 300
PRETRAIN_LR = 0.01
VAL_ROWS = 4096
SEED = 0

# The pretrained base's weights per configuration, so a rebuild (R) does not pretrain again.
_PRETRAINED = {}


@dataclass(frozen=True)
class Task:
    """Labels from a fixed random 'teacher' network that looks at the inputs through `lens`."""

    teacher_in: torch.Tensor
    teacher_out: torch.Tensor
    lens: torch.Tensor  # (in, in): the identity for task A; identity + a rank-SHIFT_RANK matrix for task B

    def labels(self, x):
        return (torch.tanh(x @ self.lens @ self.teacher_in) @ self.teacher_out).argmax(dim=1)


def make_tasks(seed):
    """Task A and task B from one seed, on the CPU (a few KiB)."""
    g = torch.Generator().manual_seed(seed)
    teacher_in = torch.randn(IN_FEATURES, 16, generator=g) / IN_FEATURES**0.5
    teacher_out = torch.randn(16, CLASSES, generator=g) / 4
    basis = torch.linalg.qr(torch.randn(IN_FEATURES, SHIFT_RANK, generator=g)).Q
    shift = basis @ torch.randn(SHIFT_RANK, IN_FEATURES, generator=g) / SHIFT_RANK**0.5
    identity = torch.eye(IN_FEATURES)
    return Task(teacher_in, teacher_out, identity), Task(teacher_in, teacher_out, identity + shift)


def batches(task, device, rows):
    """Endless (inputs, labels) batches of fresh Gaussian rows drawn from the generator `rows`. BATCH_SIZE is read
    for every batch."""
    while True:
        x = torch.randn(BATCH_SIZE, IN_FEATURES, generator=rows)
        yield x.to(device), task.labels(x).to(device)


def pretrain(task, device):
    """PRETRAIN_STEPS AdamW steps on `task` with a cosine learning rate; returns the trained MLP."""
    model = MLP(IN_FEATURES, WIDTH, CLASSES).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR)
    data = batches(task, device, torch.Generator().manual_seed(SEED + 1))
    started = time.perf_counter()
    # Matrices this small gain nothing from a second CPU thread, and on a busy
    # machine two threads waiting for each other made pretraining ten times slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    loss = torch.tensor(float("nan"))
    try:
        for i in range(PRETRAIN_STEPS):
            for group in opt.param_groups:
                group["lr"] = PRETRAIN_LR * 0.5 * (1 + math.cos(math.pi * i / PRETRAIN_STEPS))
            x, y = next(data)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    print(f"pretrained the base on task A: {PRETRAIN_STEPS} steps in {time.perf_counter() - started:.1f} s, "
          f"last loss {loss.item():.2f}")
    return model


def pretrained_base(task, device):
    """The MLP pretrained on task A, frozen. Pretrained once per configuration; a rebuild gets a copy."""
    key = (SEED, IN_FEATURES, WIDTH, CLASSES, PRETRAIN_STEPS, PRETRAIN_LR, str(device))
    if key in _PRETRAINED:
        print("reusing the base pretrained earlier in this session")
    else:
        _PRETRAINED[key] = {k: v.detach().cpu().clone() for k, v in pretrain(task, device).state_dict().items()}
    model = MLP(IN_FEATURES, WIDTH, CLASSES).to(device)
    model.load_state_dict(_PRETRAINED[key])
    return model.requires_grad_(False)


def setup(bench):
    """Runs once, and again on a rebuild (R). Everything returned here lives for the whole session."""
    torch.manual_seed(SEED)
    task_a, task_b = make_tasks(SEED)
    model = pretrained_base(task_a, bench.device)

    # The adapters. Written here rather than as module constants, so that
    # editing them changes setup(): vram-bench holds the save back as
    # "needs rebuild" until you press R.
    add_lora(model, targets=("fc1",), rank=4, alpha=8.0)

    trainable = [p for p in model.parameters() if p.requires_grad]
    # The adapters only: frozen weights get no optimizer state. No weight decay:
    # it would pull the adapters toward zero, and so the model back toward the base.
    opt = torch.optim.AdamW(trainable, lr=LR, weight_decay=0.0)
    x_val = torch.randn(VAL_ROWS, IN_FEATURES, generator=torch.Generator().manual_seed(SEED + 2))
    # The rows' random stream is in the state: a snapshot keeps where it is, so a resumed run reads the batches
    # the run would have read next (the generator below starts over, but draws from where `rows` was).
    rows = torch.Generator().manual_seed(SEED + 3)
    return {
        "model": model,
        "opt": opt,
        "rows": rows,
        "data": batches(task_b, bench.device, rows),
        "val": (x_val.to(bench.device), task_b.labels(x_val).to(bench.device)),
        # Chart rows, so the chart shows which adapters each stretch of the loss was trained with.
        "sizes": {
            "rank": max(m.rank for m in model.modules() if isinstance(m, LoRALinear)),
            "trainable_params": sum(p.numel() for p in trainable),
            "frozen_params": sum(p.numel() for p in model.parameters() if not p.requires_grad),
        },
    }


def step(state, bench):
    """One AdamW step on a task-B batch; only the adapters get gradients."""
    model, opt = state["model"], state["opt"]
    for group in opt.param_groups:
        group["lr"] = LR
    x, y = next(state["data"])
    # zero_grad before backward rather than after the step: the adapters'
    # gradients then stay allocated between steps, where the breakdown (b) sees them.
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    bench.log(lr=LR, **state["sizes"])
    return loss.detach()


def evaluate(state, bench):
    """Loss and accuracy on held-out task-B rows (key e, or --eval-every N)."""
    model = state["model"]
    x, y = state["val"]
    with torch.no_grad():
        logits = model(x)
    return {
        "val_loss": F.cross_entropy(logits, y).item(),
        "val_accuracy": (logits.argmax(dim=1) == y).float().mean().item(),
    }
