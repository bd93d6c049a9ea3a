"""The base model: a small MLP classifier that setup() pretrains on task A and then freezes.

Three hidden layers of width 128 (fc1, fc2, fc3) and a classifier head. It is
plain nn.Linear layers, so lora.py can wrap any of them by name.
"""

import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """in_features -> width -> width -> width -> classes, GELU between the layers."""

    def __init__(self, in_features, width, classes):
        super().__init__()
        self.fc1 = nn.Linear(in_features, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(width, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        """x: (batch, in_features) -> logits (batch, classes)."""
        x = F.gelu(self.fc1(x))
        x = F.gelu(self.fc2(x))
        x = F.gelu(self.fc3(x))
        return self.head(x)
