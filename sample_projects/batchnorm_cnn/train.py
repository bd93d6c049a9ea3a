"""Classify synthetic 16x16 images with a small BatchNorm + Dropout CNN.

vram-bench calls `setup(bench)` once and then `step(state, bench)` over and
over; `evaluate(state, bench)` runs on the key e (or --eval-every N). Save this
file or model.py while it trains: the changed code is swapped into the live
session, and the model keeps its weights, its BatchNorm running statistics and
its train/eval mode. See README.md for the tour.
"""

import torch
import torch.nn.functional as F

from model import SmallCNN

LR = 5e-3          # read by step() every step
BATCH_SIZE = 64    # read by the data generator on each batch
NOISE = 0.7        # pixel noise, drawn afresh for every batch
SEED = 0

# --- Data and model shape: only setup() reads these (restart to change). -----
SIZE = 16          # images are SIZE x SIZE, one channel
TRAIN_IMAGES = 4096
VAL_IMAGES = 512
CLASSES = ("horizontal", "vertical", "diagonal", "anti-diagonal", "box", "plus")


def draw_shapes():
    """Every clean image there is: each kind of shape at each position, as a
    (classes, positions, positions, SIZE, SIZE) tensor of 0s and 1s."""
    centres = torch.arange(3, SIZE - 3).float()
    yy, xx = torch.meshgrid(torch.arange(SIZE).float(), torch.arange(SIZE).float(), indexing="ij")
    # Offsets of every pixel from the shape's centre, for every (row, column) of the centre.
    dy, dx = torch.broadcast_tensors(yy - centres[:, None, None, None], xx - centres[None, :, None, None])
    return torch.stack([
        dy.abs() < 1,                                               # horizontal line
        dx.abs() < 1,                                               # vertical line
        (dx - dy).abs() < 1,                                        # diagonal
        (dx + dy).abs() < 1,                                        # anti-diagonal
        torch.maximum(dx.abs(), dy.abs()) == 2,                     # box outline
        ((dx.abs() < 1) | (dy.abs() < 1)) & (dx.abs() + dy.abs() < 5),  # small plus
    ]).float()


def make_images(count, generator):
    """Synthetic images, no download: one line or shape per image at a random
    place; the label is which kind of shape it is. The noise comes later."""
    shapes = draw_shapes()
    labels = torch.randint(len(CLASSES), (count,), generator=generator)
    row, col = torch.randint(shapes.shape[1], (2, count), generator=generator)
    return shapes[labels, row, col].unsqueeze(1), labels


def batches(images, labels):
    """Endless random batches with fresh noise, so the model cannot memorize it.
    BATCH_SIZE and NOISE are read for every batch."""
    while True:
        index = torch.randint(len(images), (BATCH_SIZE,), device=images.device)
        x = images[index]
        yield x + NOISE * torch.randn_like(x), labels[index]


def setup(bench):
    """Runs once. Everything returned here lives for the whole session."""
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    images, labels = make_images(TRAIN_IMAGES + VAL_IMAGES, generator)
    val = images[TRAIN_IMAGES:] + NOISE * torch.randn(images[TRAIN_IMAGES:].shape, generator=generator)
    images, labels, val = images.to(bench.device), labels.to(bench.device), val.to(bench.device)
    model = SmallCNN(len(CLASSES)).to(bench.device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    return {
        "model": model,
        "opt": opt,
        "data": batches(images[:TRAIN_IMAGES], labels[:TRAIN_IMAGES]),
        "val": (val, labels[TRAIN_IMAGES:]),  # the same noisy images at every evaluate
    }


def step(state, bench):
    """One optimizer step, and three chart rows about the model's mode and BatchNorm statistics."""
    model, opt = state["model"], state["opt"]
    for group in opt.param_groups:
        group["lr"] = LR
    x, y = next(state["data"])
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()

    bn = model.block1.bn
    bench.log(
        train_mode=model.training,                  # 1 in train mode, 0 in eval mode
        bn_batches=bn.num_batches_tracked,          # batches BatchNorm has learned its statistics from
        bn_var=bn.running_var.mean(),               # its running variance (1.0 when the model was built)
    )
    return loss


def evaluate(state, bench):
    """Loss and accuracy on the held-out images, in eval mode (key e, or --eval-every N)."""
    model = state["model"]
    x, y = state["val"]
    model.eval()    # BatchNorm uses its running statistics, Dropout is off
    with torch.no_grad():
        logits = model(x)
    model.train()   # back to training mode for the next step
    return {
        "val_loss": F.cross_entropy(logits, y).item(),
        "val_accuracy": (logits.argmax(dim=1) == y).float().mean().item(),
    }
