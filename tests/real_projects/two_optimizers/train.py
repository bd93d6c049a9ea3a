"""A GAN-shaped trainer with two optimizers made in two places.

The generator's optimizer is made in `setup` with the models. The
discriminator's is made by the first `step` that needs it and kept in the
state (`state["opt_d"]`), as trainers that build optimizers lazily do.
"""

import torch
import torch.nn as nn

latent_dim = 4
data_dim = 2
batch_size = 32
lr_g = 2e-3
lr_d = 1e-3


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(latent_dim, 16), nn.ReLU(), nn.Linear(16, data_dim))

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(data_dim, 16)
        self.act = nn.LeakyReLU(0.2)
        self.out = nn.Linear(16, 1)

    def forward(self, x):
        return self.out(self.act(self.hidden(x)))


def real_batch():
    angle = torch.rand(batch_size) * 6.283
    return torch.stack([angle.cos(), angle.sin()], dim=1) * 2.0  # points on a circle


def setup(bench):
    torch.manual_seed(0)
    G, D = Generator().to(bench.device), Discriminator().to(bench.device)
    opt_g = torch.optim.Adam(G.parameters(), lr=lr_g, betas=(0.5, 0.999))
    return {"G": G, "D": D, "opt_g": opt_g}


def step(state, bench):
    G, D, opt_g = state["G"], state["D"], state["opt_g"]
    if "opt_d" not in state:
        state["opt_d"] = torch.optim.Adam(D.parameters(), lr=lr_d, betas=(0.5, 0.999))
    opt_d = state["opt_d"]
    bce = nn.functional.binary_cross_entropy_with_logits
    ones, zeros = torch.ones(batch_size, 1), torch.zeros(batch_size, 1)

    fake = G(torch.randn(batch_size, latent_dim, device=bench.device))
    loss_d = bce(D(real_batch().to(bench.device)), ones) + bce(D(fake.detach()), zeros)
    opt_d.zero_grad(set_to_none=True)
    loss_d.backward()
    opt_d.step()

    loss_g = bce(D(fake), ones)
    opt_g.zero_grad(set_to_none=True)
    loss_g.backward()
    opt_g.step()
    return {"loss": loss_g + loss_d, "loss_d": loss_d, "loss_g": loss_g, "slope": D.act.negative_slope}
