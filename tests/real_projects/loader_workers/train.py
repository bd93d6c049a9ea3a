"""An image classifier fed by a DataLoader with persistent worker processes.

The loader and an iterator over it live in the state; the iterator is made
again when an epoch ends, as a hand-written training loop does.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from data import IMAGE_SIZE, NUM_CLASSES, ShapesDataset

batch_size = 16
learning_rate = 0.01


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, kernel_size=3, padding=1)
        self.head = nn.Linear(4 * IMAGE_SIZE * IMAGE_SIZE, NUM_CLASSES)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))


def next_batch(state):
    try:
        return next(state["batches"])
    except StopIteration:
        state["epoch"] += 1
        state["batches"] = iter(state["loader"])
        return next(state["batches"])


def setup(bench):
    torch.manual_seed(0)
    model = SmallCNN().to(bench.device)
    loader = DataLoader(
        ShapesDataset(), batch_size=batch_size, shuffle=True, num_workers=2, persistent_workers=True
    )
    return {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=0.9),
        "loader": loader,
        "batches": iter(loader),
        "epoch": 0,
    }


def step(state, bench):
    images, labels, version = next_batch(state)
    logits = state["model"](images.to(bench.device))
    loss = nn.functional.cross_entropy(logits, labels.to(bench.device))
    loss.backward()
    state["optimizer"].step()
    state["optimizer"].zero_grad(set_to_none=True)
    return {"loss": loss, "data_version": float(version.mean()), "epoch": float(state["epoch"])}
