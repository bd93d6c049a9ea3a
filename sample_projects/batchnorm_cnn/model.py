"""A small CNN with BatchNorm and Dropout: the two layers that behave differently in train and eval mode.

In train mode, BatchNorm normalizes with the statistics of the batch and updates its
running averages (`running_mean`, `running_var`, `num_batches_tracked`); Dropout zeroes
a fraction of the features. In eval mode, BatchNorm normalizes with the running averages
and leaves them alone, and Dropout does nothing. `model.train()` / `model.eval()` switch
every submodule at once.
"""

import torch
from torch import nn


class ConvBlock(nn.Module):
    """3x3 convolution, BatchNorm, ReLU. The convolution has no bias: BatchNorm's shift replaces it."""

    def __init__(self, channels_in, channels_out):
        super().__init__()
        self.conv = nn.Conv2d(channels_in, channels_out, kernel_size=3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels_out)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class SmallCNN(nn.Module):
    """Three conv blocks (16x16 -> 8x8 -> 4x4), global pooling, Dropout, a linear head."""

    def __init__(self, classes, width=16, dropout=0.3):
        super().__init__()
        self.block1 = ConvBlock(1, width)
        self.block2 = ConvBlock(width, 2 * width)
        self.block3 = ConvBlock(2 * width, 2 * width)
        self.pool = nn.MaxPool2d(2)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.pool(self.block1(x))
        x = self.pool(self.block2(x))
        x = self.block3(x)
        x = x.mean(dim=(2, 3))  # global average pooling
        return self.head(self.dropout(x))
