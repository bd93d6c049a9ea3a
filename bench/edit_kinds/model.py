"""Fixture for bench/edit_kinds.py: the model side of a tiny vram-bench project.

Every definition here is the "before" of some edit kind; bench/edit_kinds.py
edits one of them per case (by exact text replacement) in a copy of this folder.
"""

import dataclasses

import torch
from torch import nn


class Base(nn.Module):
    def describe(self):
        return "base"


class Mixin:
    def mixin_tag(self):
        return "mixin"


@dataclasses.dataclass
class Config:
    lr: float = 0.05
    depth: int = 2


class Net(Base):
    KIND = "old"

    def __init__(self, d=4):
        super().__init__()
        self.lin = nn.Linear(d, 1)

    def forward(self, x):
        return self.lin(x)

    def label(self):
        return "old"

    def label_super(self):
        return "old+" + super().describe()

    def legacy(self):
        return "legacy"

    @staticmethod
    def smethod():
        return "old"

    @classmethod
    def cmethod(cls):
        return "old:" + cls.__name__

    @property
    def prop(self):
        return "old"


def forward_hook(module, inputs, output):
    module.hook_seen = "old"
