"""Train the tiny character-level GPT under DistributedDataParallel, one process per rank.

    vram-bench run train.py --headless --nproc-per-node 2

starts two ranks (gloo on a CPU, NCCL with one GPU per rank). vram-bench creates
the default process group before `setup(bench)` runs; every rank builds the same
model, wraps it in DDP and draws its own batches, and DDP averages the gradients
so the replicas stay identical. Save this file (or model.py) while it runs and
every rank applies the change at the same step. See README.md for edits to try.
"""

import math
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model import TinyGPT

# --- Tunables: plain literals, so saving a new value re-binds them live. -----
LR = 3e-3           # read by step() every step; edit and save to change it now
BATCH_SIZE = 16     # sequences per rank per step: the global batch is BATCH_SIZE * world_size
GRAD_CLIP = 1.0     # clip the (already averaged) gradient's norm to this
EVAL_BATCHES = 8    # batches of held-out text per evaluate(), on each rank
SEED = 1337

# --- Model shape: only used by setup(), so changes need a rebuild (R). -------
BLOCK_SIZE = 64
N_EMBD = 64
N_HEAD = 4
N_LAYER = 2
DROPOUT = 0.0

# A call on the right-hand side, so this one is not re-bound on reload.
DATA_FILE = Path(__file__).resolve().parent / "data" / "shakespeare.txt"


def load_text():
    """Read the training text and build a character vocabulary from it."""
    text = DATA_FILE.read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    return text, chars, stoi


def batches(data, device, generator):
    """Endless random (x, y) batches of BLOCK_SIZE characters from `data`, drawn
    with this rank's own `generator`; y is x shifted by one character."""
    while True:
        ix = torch.randint(len(data) - BLOCK_SIZE - 1, (BATCH_SIZE,), generator=generator)
        x = torch.stack([data[i:i + BLOCK_SIZE] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + BLOCK_SIZE] for i in ix])
        yield x.to(device), y.to(device)


def setup(bench):
    """Runs once on every rank (and again on every rank at the same step on R).

    Every rank seeds torch the same way, so every rank builds the same weights;
    DDP's constructor also broadcasts rank 0's to the others. Only the batches
    differ: each rank's generator is seeded by its rank.
    """
    torch.manual_seed(SEED)
    text, chars, stoi = load_text()
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n_train = int(0.9 * len(data))  # 90/10 train/validation split
    model = TinyGPT(
        vocab_size=len(chars),
        block_size=BLOCK_SIZE,
        n_embd=N_EMBD,
        n_head=N_HEAD,
        n_layer=N_LAYER,
        dropout=DROPOUT,
    ).to(bench.device)
    if dist.is_initialized():  # under --nproc-per-node; run alone, it trains as one process
        # device_ids only on a GPU (one per rank). The only buffer is the causal
        # mask, a constant: no need to broadcast it again before every forward.
        device_ids = [bench.device.index] if bench.device.type == "cuda" else None
        model = DDP(model, device_ids=device_ids)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    train_gen = torch.Generator().manual_seed(SEED + bench.rank)
    val_gen = torch.Generator().manual_seed(SEED + 1000 + bench.rank)
    return {
        "model": model,
        "opt": opt,
        "chars": chars,
        "stoi": stoi,
        "train": batches(data[:n_train], bench.device, train_gen),
        "val": batches(data[n_train:], bench.device, val_gen),
    }


def step(state, bench):
    """One optimisation step on this rank's batch; backward() averages the
    gradients across ranks. Returns the loss and the norms of the (averaged)
    gradient and of the weights."""
    model, opt = state["model"], state["opt"]
    # Apply the current LR every step so that editing `LR = ...` takes effect
    # on the very next step after you save (on every rank: they all reload at once).
    for group in opt.param_groups:
        group["lr"] = LR
    bench.log(lr=LR)

    x, y = next(state["train"])
    loss = model(x, y)  # this rank's batch: the loss differs from rank to rank
    loss.backward()  # DDP all-reduces (averages) the gradients here
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    opt.step()
    opt.zero_grad(set_to_none=True)
    # The same on every rank: the same averaged gradients update the same weights.
    with torch.no_grad():
        weight_norm = torch.stack([p.norm() for p in model.parameters()]).norm()
    return {"loss": loss.detach(), "grad_norm": grad_norm, "weight_norm": weight_norm}


def evaluate(state, bench):
    """Mean loss on this rank's held-out batches, plus (rank 0) a short sample
    of generated text.

    It runs the plain model inside DDP (`.module`): no gradients, so nothing to
    synchronize, and no rank waits for another.
    """
    model = state["model"]
    raw = model.module if isinstance(model, DDP) else model
    raw.eval()  # no dropout while measuring
    try:
        with torch.no_grad():
            losses = [raw(*next(state["val"])).item() for _ in range(EVAL_BATCHES)]
        val_loss = sum(losses) / len(losses)
        if bench.is_main:  # one writer for the shared run folder
            start = torch.tensor([[state["stoi"]["\n"]]], device=bench.device)
            out = raw.generate(start, max_new_tokens=300)[0].tolist()
            bench.run_dir.mkdir(parents=True, exist_ok=True)
            (bench.run_dir / "ddp_gpt_sample.txt").write_text(
                "".join(state["chars"][i] for i in out), encoding="utf-8"
            )
    finally:
        raw.train()  # back to training mode even if something above failed
    return {"val_loss": val_loss, "val_ppl": math.exp(val_loss)}
