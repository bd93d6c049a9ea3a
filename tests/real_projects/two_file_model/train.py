"""Training entry for a model defined in its own module (`from model import GPT, GPTConfig`)."""

import torch

from model import GPT, GPTConfig

learning_rate = 1e-3
weight_decay = 0.1
batch_size = 4

# A fixed input the step runs the first block on, so what Block.forward computes shows in the chart.
PROBE = torch.linspace(-1.0, 1.0, 2 * 8 * 16).view(2, 8, 16)


def get_batch(config):
    ix = torch.randint(config.vocab_size, (batch_size, 1))
    x = (ix + torch.arange(config.block_size)) % config.vocab_size  # count up from a random start
    return x, (x + 1) % config.vocab_size


def setup(bench):
    torch.manual_seed(0)
    model = GPT(GPTConfig()).to(bench.device)
    optimizer = model.configure_optimizers(weight_decay, learning_rate)
    return {"model": model, "optimizer": optimizer}


def step(state, bench):
    model, optimizer = state["model"], state["optimizer"]
    x, y = get_batch(model.config)
    _, loss = model(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        probe = model.transformer.h[0](PROBE).sum()
    return {"loss": loss, "probe": probe, "n_layer": float(model.config.n_layer)}
