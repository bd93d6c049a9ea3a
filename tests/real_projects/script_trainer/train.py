"""A script-style trainer in the shape of nanoGPT's train.py.

Config is module-level constants; a parser built at import time lets the
command line override them (`vram-bench run train.py -- --batch-size 4`);
`setup` fills the module globals `model` and `optimizer`, and `get_batch` and
`step` read them the way a script's training loop does.
"""

import argparse
import math
import sys

import torch
import torch.nn as nn
from torch.nn import functional as F

# -----------------------------------------------------------------------------
# default config values
batch_size = 8
block_size = 16
vocab_size = 32
n_embd = 32
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 20
lr_decay_iters = 200
weight_decay = 0.1
grad_clip = 1.0
seed = 1337
# -----------------------------------------------------------------------------

parser = argparse.ArgumentParser(description="a tiny script-style language model trainer")
parser.add_argument("--batch-size", type=int, default=None, help="override batch_size")
parser.add_argument("--learning-rate", type=float, default=None, help="override learning_rate")
args = parser.parse_args()
if args.batch_size is not None:
    print(f"Overriding: batch_size = {args.batch_size}")
    batch_size = args.batch_size
if args.learning_rate is not None:
    print(f"Overriding: learning_rate = {args.learning_rate}")
    learning_rate = args.learning_rate
argv_seen = list(sys.argv)

model = None
optimizer = None
data = None


class BigramLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def get_batch():
    ix = torch.randint(len(data) - block_size - 1, (batch_size,))
    x = torch.stack([data[i : i + block_size] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix])
    return x, y


def setup(bench):
    global model, optimizer, data
    torch.manual_seed(seed)
    data = (torch.arange(8192) * 7 + torch.arange(8192) // 5) % vocab_size  # a sequence with structure to learn
    model = BigramLM().to(bench.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=weight_decay)
    return {"model": model, "optimizer": optimizer}


def step(state, bench):
    lr = get_lr(bench.step)
    for group in optimizer.param_groups:
        group["lr"] = lr
    x, y = get_batch()
    _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    beta2 = optimizer.param_groups[0]["betas"][1]
    return {"loss": loss, "batch": float(x.shape[0]), "block": float(x.shape[1]), "lr": lr, "beta2": beta2}
