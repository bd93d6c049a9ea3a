"""LoRA in plain torch: a frozen linear layer plus a trainable low-rank update.

    y = x @ W.T + b + (x @ A.T @ B.T) * (alpha / rank)

W and b are the pretrained layer's weights, frozen. A is (rank, in_features)
and B is (out_features, rank): rank * (in + out) trainable numbers instead of
in * out, and the update they make, B @ A, has rank at most `rank`. B starts at
zero, so a freshly added adapter changes nothing: the model computes exactly
what the frozen base computes until training moves B.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class LoRALinear(nn.Module):
    """An nn.Linear's frozen `weight` and `bias`, plus trainable `lora_A` and `lora_B`.

    It takes over the Linear's own parameter objects under their own names, so
    the model's state_dict keeps the base's keys (`fc1.weight`, `fc1.bias`):
    a base checkpoint still loads, and a rebuild (R) matches the frozen weights
    by name. A wrapper holding the Linear as a submodule would rename them to
    `fc1.base.weight`.
    """

    def __init__(self, linear, rank, alpha):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.rank = rank
        self.scale = alpha / rank
        out_features, in_features = linear.weight.shape
        device = linear.weight.device
        self.lora_A = nn.Parameter(torch.empty(rank, in_features, device=device))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, device=device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # what nn.Linear uses for its weight

    def forward(self, x):
        return F.linear(x, self.weight, self.bias) + (x @ self.lora_A.T @ self.lora_B.T) * self.scale

    def extra_repr(self):
        out_features, in_features = self.weight.shape
        return f"in_features={in_features}, out_features={out_features}, rank={self.rank}, scale={self.scale:g}"


def add_lora(model, targets, rank, alpha):
    """Freeze every parameter of `model`, then turn each nn.Linear named in `targets`
    (attributes of `model`) into a LoRALinear. Returns the model."""
    model.requires_grad_(False)
    for name in targets:
        layer = getattr(model, name)
        if not isinstance(layer, nn.Linear):
            raise TypeError(f"{name} is a {type(layer).__name__}, not an nn.Linear: LoRA adapts Linear layers")
        setattr(model, name, LoRALinear(layer, rank, alpha))
    return model
