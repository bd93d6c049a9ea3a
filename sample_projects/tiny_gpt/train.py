"""Train a tiny character-level GPT on Shakespeare (Macbeth + Julius Caesar).

vram-bench calls `setup(bench)` once and then `step(state, bench)` over and
over. Save this file (or model.py) while it runs and the changed functions and
constants are swapped into the live session: the model, optimizer and data
iterator keep going. See README.md for edits to try.
"""

import math
from pathlib import Path

import torch

from model import TinyGPT

# --- Tunables: plain literals, so saving a new value re-binds them live. -----
LR = 3e-3           # read by step() every step; edit and save to change it now
BATCH_SIZE = 32     # read by the data generator on each batch
EVAL_BATCHES = 8    # batches of held-out text per evaluate()
SEED = 1337

# --- Model shape: only used by setup(), so changes need a restart. -----------
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


def batches(data, device):
    """Endless random (x, y) batches of BLOCK_SIZE characters from `data`;
    y is x shifted by one, i.e. the next character at every position."""
    while True:
        ix = torch.randint(len(data) - BLOCK_SIZE - 1, (BATCH_SIZE,))
        x = torch.stack([data[i:i + BLOCK_SIZE] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + BLOCK_SIZE] for i in ix])
        yield x.to(device), y.to(device)


def setup(bench):
    """Runs once. Everything returned here lives for the whole session."""
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
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    return {
        "model": model,
        "opt": opt,
        "chars": chars,
        "stoi": stoi,
        "train": batches(data[:n_train], bench.device),
        "val": batches(data[n_train:], bench.device),
    }


def step(state, bench):
    """One optimisation step. Return a loss, or a dict of scalars with "loss"."""
    model, opt = state["model"], state["opt"]
    # Apply the current LR every step so that editing `LR = ...` takes effect
    # on the very next step after you save.
    for group in opt.param_groups:
        group["lr"] = LR
    bench.log(lr=LR)

    x, y = next(state["train"])
    loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()  # detached: the value only, no autograd graph attached


def evaluate(state, bench):
    """Mean loss on the held-out 10%, plus a short sample of generated text.

    No-grad is a `with` block, not a decorator, so that edits to this function
    hot-swap cleanly (a decorator would wrap it and keep the old body alive).
    """
    model = state["model"]
    model.eval()  # no dropout while measuring
    try:
        with torch.no_grad():
            losses = [model(*next(state["val"])).item() for _ in range(EVAL_BATCHES)]
        val_loss = sum(losses) / len(losses)

        # A peek at what the model writes, starting from a newline: saved to
        # .vram-bench/tiny_gpt_sample.txt (overwritten each evaluation).
        start = torch.tensor([[state["stoi"]["\n"]]], device=bench.device)
        out = model.generate(start, max_new_tokens=300)[0].tolist()
        bench.run_dir.mkdir(parents=True, exist_ok=True)
        (bench.run_dir / "tiny_gpt_sample.txt").write_text(
            "".join(state["chars"][i] for i in out), encoding="utf-8"
        )
    finally:
        model.train()  # back to training mode even if something above failed
    return {"val_loss": val_loss, "val_ppl": math.exp(val_loss)}
