"""A deep residual MLP: wide enough that its activations, not its weights, fill memory.

Each block is pre-norm: x + proj(gelu(fc(norm(x)))). With a batch of 1024 rows
and width 160, one block keeps about 6.5 MB of activations for backward
(its LayerNorm's input and output, the 640-wide Linear output and the GELU
output) but holds only 0.8 MB of weights: activation memory is about eight
times the parameter memory. That is the regime where checkpointing, bf16 and
smaller micro-batches pay off.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as checkpoint_block


class Block(nn.Module):
    """Pre-norm residual MLP block: widen 4x, GELU, project back, add."""

    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.proj(F.gelu(self.fc(self.norm(x))))


class ResidualMLP(nn.Module):
    """Input projection, `depth` Blocks, a final LayerNorm and a classifier head."""

    def __init__(self, in_features, width, depth, classes):
        super().__init__()
        self.embed = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x, checkpoint=False):
        """x: (batch, in_features) -> logits (batch, classes).

        With `checkpoint=True` each block runs under activation checkpointing:
        autograd keeps only the block's input, and the block's forward runs a
        second time during backward to rebuild what it needs.
        """
        x = self.embed(x)
        for block in self.blocks:
            if checkpoint and torch.is_grad_enabled():
                x = checkpoint_block(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.norm(x))
