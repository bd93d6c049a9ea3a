"""Memory lab: flip a memory-saving technique on and off while a model trains.

vram-bench calls `setup(bench)` once and then `step(state, bench)` over and
over. The five constants below are plain literals, so saving a new value
re-binds them in the running session, and `step` reads them on every call:
the next step already uses the new setting. Press `v` in the workbench to see
what each version of the code cost (steps/s, activation memory) next to the
previous one. README.md walks through each flip.
"""

import contextlib

import torch
import torch.nn.functional as F

from model import ResidualMLP

# --- Memory techniques: edit one, save, press v. -----------------------------
AMP = False                  # bf16 autocast: activations saved in 2 bytes, not 4
CHECKPOINT = False           # activation checkpointing per block (recompute in backward)
ACCUM_STEPS = 1              # split each batch into this many micro-batches
OFFLOAD_ACTIVATIONS = False  # autograd's saved tensors go to host memory (save_on_cpu)
BATCH_SIZE = 1024            # rows per optimizer step, all micro-batches together
LR = 1e-3                    # read by step() every step

# --- Model and data shape: only setup() reads these (restart to change). -----
IN_FEATURES = 64
WIDTH = 160
DEPTH = 8
CLASSES = 10
TRAIN_ROWS = 32768
VAL_ROWS = 4096
SEED = 0


def make_data(rows, generator):
    """Synthetic classification, no download: Gaussian inputs labelled by a
    fixed random two-layer 'teacher' network that the model has to imitate."""
    teacher_in = torch.randn(IN_FEATURES, 256, generator=generator) / IN_FEATURES**0.5
    teacher_out = torch.randn(256, CLASSES, generator=generator) / 16
    x = torch.randn(rows, IN_FEATURES, generator=generator)
    y = (torch.tanh(x @ teacher_in) @ teacher_out).argmax(dim=1)
    return x, y


def batches(x, y):
    """Endless random batches. BATCH_SIZE is read for every batch, so saving a
    new value changes the very next batch."""
    while True:
        index = torch.randint(len(x), (BATCH_SIZE,), device=x.device)
        yield x[index], y[index]


def setup(bench):
    """Runs once. Everything returned here lives for the whole session."""
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    x, y = make_data(TRAIN_ROWS + VAL_ROWS, generator)
    x, y = x.to(bench.device), y.to(bench.device)
    model = ResidualMLP(IN_FEATURES, WIDTH, DEPTH, CLASSES).to(bench.device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    return {
        "model": model,
        "opt": opt,
        "data": batches(x[:TRAIN_ROWS], y[:TRAIN_ROWS]),
        "val": (x[TRAIN_ROWS:], y[TRAIN_ROWS:]),
    }


def offloading(device):
    """`save_on_cpu` when OFFLOAD_ACTIVATIONS is on: every tensor autograd saves
    for backward is copied to host memory and copied back when backward needs
    it. Pinned host memory makes those copies fast, but only exists with CUDA."""
    if not OFFLOAD_ACTIVATIONS:
        return contextlib.nullcontext()
    return torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")


def step(state, bench):
    """One optimizer step over BATCH_SIZE rows, in ACCUM_STEPS micro-batches."""
    model, opt = state["model"], state["opt"]
    for group in opt.param_groups:
        group["lr"] = LR

    x, y = next(state["data"])
    loss_sum = torch.zeros((), device=bench.device)
    # Gradient accumulation: forward and backward one micro-batch at a time, so
    # only one micro-batch's activations are alive at once. Each micro-batch's
    # loss is weighted by its share of the rows, so the summed gradients equal
    # the gradient of the whole batch and LR needs no change.
    for xs, ys in zip(x.chunk(ACCUM_STEPS), y.chunk(ACCUM_STEPS)):
        with offloading(bench.device), torch.autocast(bench.device.type, dtype=torch.bfloat16, enabled=AMP):
            logits = model(xs, checkpoint=CHECKPOINT)
        loss = F.cross_entropy(logits.float(), ys) * (len(xs) / len(x))
        loss.backward()
        loss_sum += loss.detach()  # no .item() here: on a GPU that would wait for each micro-batch
    opt.step()
    opt.zero_grad(set_to_none=True)

    # The settings this step ran with, as chart rows (True shows as 1).
    bench.log(amp=AMP, checkpoint=CHECKPOINT, accum_steps=ACCUM_STEPS,
              offload=OFFLOAD_ACTIVATIONS, batch_size=len(x))
    return {"loss": loss_sum}


def evaluate(state, bench):
    """Loss and accuracy on the held-out rows (key e, or --eval-every N)."""
    model = state["model"]
    x, y = state["val"]
    with torch.no_grad():
        logits = model(x).float()
    return {
        "val_loss": F.cross_entropy(logits, y).item(),
        "val_accuracy": (logits.argmax(dim=1) == y).float().mean().item(),
    }
