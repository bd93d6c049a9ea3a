"""Leaky loop: a training loop that leaks memory, on purpose, in two ways.

The model is a small MLP learning a synthetic classification task, and it
trains fine. Two pieces of bookkeeping in `step()` keep memory they should
let go of:

1. `LOSSES` keeps every step's held-out loss as a tensor, and with it the
   loss's autograd graph: the activations of that forward pass, saved for a
   backward that never comes.
2. `FEATURE_CACHE` keeps the probe batch's features of every step, although
   the drift metric only ever reads the entry from DRIFT_LAG steps back.

README.md walks through finding both with vram-bench's memory gauges and leak
finder (key t) and fixing them by editing this file and saving, while it runs.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

LR = 1e-3            # read by step() every step
BATCH_SIZE = 256     # training rows per step
VAL_BATCH = 32       # held-out rows scored per step
SMOOTHING = 20       # the held-out loss is averaged over this many steps
DRIFT_LAG = 10       # drift compares the probe's features with those of this many steps ago

# --- Model and data shape: only setup() reads these. ------------------------
IN_FEATURES = 64
HIDDEN = 512
CLASSES = 10
TRAIN_ROWS = 16384
VAL_ROWS = 4096
PROBE_ROWS = 32
SEED = 0

# --- Bookkeeping: both of these leak. ----------------------------------------
LOSSES = []          # every step's held-out loss
FEATURE_CACHE = {}   # step -> the probe batch's features at that step

# This sample leaks on purpose. So that a session left running cannot eat the
# machine's memory, step() raises once a leak holds LEAK_LIMIT steps' worth of
# tensors (about 1 GB in all). vram-bench then pauses training and keeps the
# model; fix the leak and save, and training resumes.
LEAK_LIMIT = 5000


class Net(nn.Module):
    """Two hidden layers; `features` is the second one's output."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(IN_FEATURES, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def features(self, x):
        return F.relu(self.fc2(F.relu(self.fc1(x))))

    def forward(self, x):
        return self.head(self.features(x))


def make_data(rows, generator):
    """Synthetic classification, no download: Gaussian inputs labelled by a
    fixed random two-layer 'teacher' network that the model has to imitate."""
    teacher_in = torch.randn(IN_FEATURES, 128, generator=generator) / IN_FEATURES**0.5
    teacher_out = torch.randn(128, CLASSES, generator=generator)
    x = torch.randn(rows, IN_FEATURES, generator=generator)
    y = (torch.tanh(x @ teacher_in) @ teacher_out).argmax(dim=1)
    return x, y


def batches(x, y, size):
    """Endless random batches of `size` rows."""
    while True:
        index = torch.randint(len(x), (size,))
        yield x[index], y[index]


def setup(bench):
    """Runs once. Everything returned here lives for the whole session."""
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    x, y = make_data(TRAIN_ROWS + VAL_ROWS, generator)
    x, y = x.to(bench.device), y.to(bench.device)
    model = Net().to(bench.device)
    return {
        "model": model,
        "opt": torch.optim.AdamW(model.parameters(), lr=LR),
        "train": batches(x[:TRAIN_ROWS], y[:TRAIN_ROWS], BATCH_SIZE),
        "val": batches(x[TRAIN_ROWS:], y[TRAIN_ROWS:], VAL_BATCH),
        "probe": x[TRAIN_ROWS:TRAIN_ROWS + PROBE_ROWS],  # a fixed batch, to watch the features drift
    }


def step(state, bench):
    """One optimizer step, then two metrics for the chart."""
    model, opt = state["model"], state["opt"]
    for group in opt.param_groups:
        group["lr"] = LR

    x, y = next(state["train"])
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()

    # Held-out loss on one batch, averaged over the last SMOOTHING steps.
    xv, yv = next(state["val"])
    held_out = F.cross_entropy(model(xv), yv)
    LOSSES.append(held_out)
    recent = LOSSES[-SMOOTHING:]
    bench.log(held_out_loss=float(sum(recent) / len(recent)))

    # Drift: how far the probe batch's features moved over the last DRIFT_LAG steps.
    with torch.no_grad():
        features = model.features(state["probe"])
    FEATURE_CACHE[bench.step] = features
    before = FEATURE_CACHE.get(bench.step - DRIFT_LAG)
    if before is not None:
        bench.log(drift=float((features - before).norm() / before.norm()))

    check_leak_limit()
    return loss.detach()


def check_leak_limit():
    """The safety valve described at LEAK_LIMIT: stop before a leak grows past it."""
    graphs = len(LOSSES) if LOSSES and isinstance(LOSSES[-1], torch.Tensor) else 0
    over = []
    if graphs > LEAK_LIMIT:
        over.append(f"LOSSES holds {graphs} losses with their graphs")
    if len(FEATURE_CACHE) > LEAK_LIMIT:
        over.append(f"FEATURE_CACHE holds {len(FEATURE_CACHE)} tensors")
    if over:
        raise RuntimeError(
            f"leaky_loop stops here: {' and '.join(over)} (LEAK_LIMIT is {LEAK_LIMIT}). "
            "The leaks are on purpose: fix them as README.md shows and save, and training resumes."
        )
