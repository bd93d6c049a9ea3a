"""A tiny character-level GPT in plain PyTorch (the tiny_gpt sample's model).

Everything is written out by hand (no nn.MultiheadAttention, no
F.scaled_dot_product_attention) so the math is right there to read and to
edit while the model trains. Nothing here knows about DistributedDataParallel:
train.py wraps the model. Save this file and vram-bench swaps the changed
methods into the live model on every rank, at the same step: the weights stay,
the new code runs from the next step on.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position only sees the past.

    Try editing `forward` while training runs: change the score scale, add a
    temperature, print a shape once. Parameters and buffers keep their values.
    """

    def __init__(self, n_embd, n_head, block_size, dropout):
        super().__init__()
        assert n_embd % n_head == 0, "n_embd must be divisible by n_head"
        self.n_head = n_head
        self.head_dim = n_embd // n_head
        # Separate q/k/v projections: slower than one fused matmul, easier to read.
        self.query = nn.Linear(n_embd, n_embd, bias=False)
        self.key = nn.Linear(n_embd, n_embd, bias=False)
        self.value = nn.Linear(n_embd, n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        # No mask buffer (tiny_gpt keeps one): DDP broadcasts a model's buffers
        # from rank 0 before every forward, so the mask is made in forward.

    def forward(self, x):
        B, T, C = x.shape
        # (B, T, C) -> (B, n_head, T, head_dim)
        q = self.query(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.key(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = self.value(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)

        # Scaled dot-product scores; 1/sqrt(head_dim) keeps the softmax from saturating.
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        # Lower-triangular mask: row t may look at columns 0..t.
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        weights = F.softmax(scores, dim=-1)
        weights = self.attn_drop(weights)

        out = weights @ v                                  # (B, n_head, T, head_dim)
        out = out.transpose(1, 2).contiguous().view(B, T, C)  # re-join the heads
        return self.resid_drop(self.proj(out))


class MLP(nn.Module):
    """Position-wise feed-forward: widen 4x, GELU, project back."""

    def __init__(self, n_embd, dropout):
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.proj = nn.Linear(4 * n_embd, n_embd)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)).

    Pre-norm (LayerNorm before each sub-layer) trains stably without warmup,
    which matters when you are changing the learning rate by hand.
    """

    def __init__(self, n_embd, n_head, block_size, dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, dropout)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class TinyGPT(nn.Module):
    """Token + position embeddings, a stack of Blocks, a final LayerNorm and a
    linear head that predicts the next character."""

    def __init__(self, vocab_size, block_size=64, n_embd=64, n_head=4, n_layer=2, dropout=0.0):
        super().__init__()
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            [Block(n_embd, n_head, block_size, dropout) for _ in range(n_layer)]
        )
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        """GPT-2 style init (normal, std 0.02): small logits at the start, so the
        first loss is close to ln(vocab_size)."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None):
        """idx: (B, T) token ids. Returns the mean cross-entropy loss when
        `targets` (B, T) is given, else the logits (B, T, vocab_size)."""
        B, T = idx.shape
        assert T <= self.block_size, f"sequence length {T} > block_size {self.block_size}"
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))

    def generate(self, idx, max_new_tokens, temperature=1.0):
        """Sample `max_new_tokens` characters after `idx` (B, T), one at a time,
        feeding back at most the last block_size characters.

        Uses `with torch.no_grad()` rather than the @torch.no_grad() decorator:
        a decorated function is a wrapper, and hot-swapping a wrapper's code
        would keep calling the old body.
        """
        with torch.no_grad():
            for _ in range(max_new_tokens):
                context = idx[:, -self.block_size:]
                logits = self(context)[:, -1, :] / temperature
                probs = F.softmax(logits, dim=-1)
                next_id = torch.multinomial(probs, num_samples=1)
                idx = torch.cat([idx, next_id], dim=1)
        return idx
