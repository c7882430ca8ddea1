"""Hand-written programs for the coverage benchmark (the `prog/` group).

This file is the place for small programs that exercise Python constructs the torchvision
models do not: loops over time steps, masks built inside the call, random sampling, control
flow on shapes and Python values, containers passed in and returned, and so on. It uses the
same entry format as `corpus_torchvision.py` (see `corpus.py` for every field):

    Program(name, make, inputs, quick=..., calls=..., note=...)

* `name`: unique, "prog/<something>"; `run.py --filter prog/` runs just this file.
* `make()`: returns the callable to compile, an `nn.Module` (put in eval mode by the runner
  unless `train=True`) or a plain function. It runs after `torch.manual_seed(seed)`.
* `inputs()`: returns the positional arguments of one call as a tuple (or `Args(...)` for
  keyword arguments too). It runs once per call, after `torch.manual_seed(seed + 1 + i)`; the
  runner deep-copies the result for the eager and the compiled run.

To add a program: write the module or function at module level, then append a `Program` to
the list in `programs()`. Keep inputs small (the whole `--quick` run should stay within a few
minutes on a 2-core machine) and mark the cheap, representative ones `quick=True`.
"""

import math

import torch
from torch import nn
import torch.nn.functional as F

from corpus import Args, Program


class CausalTransformerBlock(nn.Module):
    """Pre-norm transformer block; the causal mask is built inside forward from the length."""

    def __init__(self, dim=32, heads=4, mlp_ratio=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(),
                                 nn.Linear(mlp_ratio * dim, dim))

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GRULoop(nn.Module):
    """A GRU cell stepped over time in a Python loop; returns all states and the last one."""

    def __init__(self, inp=8, hidden=16):
        super().__init__()
        self.cell = nn.GRUCell(inp, hidden)
        self.out = nn.Linear(hidden, 4)
        self.hidden = hidden

    def forward(self, x, h=None):
        if h is None:
            h = x.new_zeros(x.shape[0], self.hidden)
        states = []
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
            states.append(h)
        return self.out(torch.stack(states, dim=1)), h


class VAE(nn.Module):
    """Encoder, reparameterisation (z = mu + eps * std, eps drawn inside), decoder."""

    def __init__(self, dim=64, hidden=32, latent=8):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU())
        self.mu = nn.Linear(hidden, latent)
        self.logvar = nn.Linear(hidden, latent)
        self.dec = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, dim))

    def reparameterise(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        return mu + torch.randn_like(std) * std

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = self.reparameterise(mu, logvar)
        recon = torch.sigmoid(self.dec(z))
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp(), dim=-1)
        return {"recon": recon, "mu": mu, "logvar": logvar, "kl": kl}


def programs():
    return [
        Program("prog/causal_transformer_block", CausalTransformerBlock,
                lambda: (torch.randn(1, 16, 32),), quick=True,
                note="mask from torch.triu inside forward"),
        Program("prog/gru_cell_loop", GRULoop,
                lambda: Args(torch.randn(2, 10, 8)), quick=True,
                note="10 time steps unrolled; h=None default"),
        Program("prog/vae_reparameterise", VAE,
                lambda: (torch.rand(4, 64),), quick=True,
                note="torch.randn_like inside; seeded identically for eager and magpy"),
    ]
