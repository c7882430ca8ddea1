"""Model zoo of bench/backends.py: each model an nn.Module in eval mode built with a fixed seed,
with an input maker per batch size.

    spec = MODELS["resnet18"]
    model = spec.make()                 # a fresh, identical model on every call (seeded)
    args = spec.inputs(batch)           # a tuple of tensors, identical on every call (seeded)

Sizes are chosen so that a full run stays sane on a 2-core CPU (see bench/README.md):

    mlp          3 linear layers 256-512-512-10, ReLU          batch 1 and 64
    transformer  one pre-norm encoder block, hand-written        batch 1 and 8, sequence 32
                 (LayerNorm, q/k/v linears, 4-head softmax
                 attention, output projection, GELU MLP), d=128
    lstm         nn.LSTMCell(64, 128) stepped in a Python        batch 1 and 32
                 for-loop over 16 time steps, linear head
    resnet18     torchvision, random weights, 224x224           batch 1; batch 8 at 112x112
    mobilenet_v2 torchvision, random weights, 224x224           batch 1; batch 8 at 112x112
    tiny_ops     128 elementwise ops on a (batch, 16) tensor     batch 1 and 64
                 (Python overhead dominates)

Every model here is captured by magpy (backend "eager") as one graph with no break, under
no_grad and with grad. The transformer block is hand-written rather than
nn.TransformerEncoderLayer: torch 1.13's layer reads `src.is_nested` on its way to the fused
"fast path", which magpy does not capture (break MB007, no ops in the graph).
"""

import math

import torch
from torch import nn


class ModelSpec:
    def __init__(self, name, build, inputs, batches, note, quick_batches=None):
        self.name = name
        self._build = build
        self._inputs = inputs
        self.batches = list(batches)            # [(batch, description)]
        self.quick_batches = quick_batches if quick_batches is not None else self.batches[:1]
        self.note = note

    def make(self):
        torch.manual_seed(0)
        return self._build().eval()

    def inputs(self, batch):
        g = torch.Generator().manual_seed(1234 + batch)
        return self._inputs(batch, g)


# --------------------------------------------------------------------------------------------
# models


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(256, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, 10)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


class EncoderBlock(nn.Module):
    """Pre-norm transformer encoder block: x + MHSA(LN(x)); x + MLP(LN(x))."""

    def __init__(self, d_model=128, heads=4, ff=512):
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.ln1 = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, ff)
        self.fc2 = nn.Linear(ff, d_model)

    def forward(self, x):
        b, s, d = x.shape
        h = self.ln1(x)
        q = self.q(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        att = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)
        o = torch.matmul(att, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(o)
        h = self.ln2(x)
        x = x + self.fc2(torch.nn.functional.gelu(self.fc1(h)))
        return x


class LSTMLoop(nn.Module):
    """An nn.LSTMCell stepped over a fixed sequence length in a Python for-loop."""

    def __init__(self, inp=64, hidden=128, steps=16):
        super().__init__()
        self.steps = steps
        self.hidden = hidden
        self.cell = nn.LSTMCell(inp, hidden)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x):
        # x: (batch, steps, inp)
        h = torch.zeros(x.shape[0], self.hidden, dtype=x.dtype, device=x.device)
        c = torch.zeros(x.shape[0], self.hidden, dtype=x.dtype, device=x.device)
        for t in range(self.steps):
            h, c = self.cell(x[:, t], (h, c))
        return self.head(h)


class TinyOps(nn.Module):
    """128 elementwise ops on a small tensor, so the per-op Python dispatch cost dominates."""

    def __init__(self, blocks=32):
        super().__init__()
        self.blocks = blocks
        self.scale = nn.Parameter(torch.randn(16) * 0.1 + 1.0)
        self.shift = nn.Parameter(torch.randn(16) * 0.1)

    def forward(self, x):
        for i in range(self.blocks):                 # 4 ops per block
            x = x * self.scale
            x = x + self.shift
            x = torch.tanh(x)
            x = x - 0.01
        return x


def _resnet18():
    import torchvision
    return torchvision.models.resnet18(weights=None)


def _mobilenet_v2():
    import torchvision
    return torchvision.models.mobilenet_v2(weights=None)


def _image(batch, g):
    side = 224 if batch == 1 else 112
    return (torch.randn(batch, 3, side, side, generator=g),)


MODELS = {s.name: s for s in [
    ModelSpec("mlp", MLP, lambda b, g: (torch.randn(b, 256, generator=g),),
              [(1, "x 256"), (64, "x 256")], "3 linear 256-512-512-10, ReLU"),
    ModelSpec("transformer", EncoderBlock, lambda b, g: (torch.randn(b, 32, 128, generator=g),),
              [(1, "seq 32 x d 128"), (8, "seq 32 x d 128")],
              "pre-norm encoder block, d 128, 4 heads, ff 512 (hand-written)"),
    ModelSpec("lstm", LSTMLoop, lambda b, g: (torch.randn(b, 16, 64, generator=g),),
              [(1, "16 steps x 64"), (32, "16 steps x 64")],
              "LSTMCell(64, 128) in a Python loop of 16 steps + linear head"),
    ModelSpec("resnet18", _resnet18, _image, [(1, "3x224x224"), (8, "3x112x112")],
              "torchvision resnet18, random weights"),
    ModelSpec("mobilenet_v2", _mobilenet_v2, _image, [(1, "3x224x224"), (8, "3x112x112")],
              "torchvision mobilenet_v2, random weights"),
    ModelSpec("tiny_ops", TinyOps, lambda b, g: (torch.randn(b, 16, generator=g),),
              [(1, "x 16"), (64, "x 16")], "128 elementwise ops (mul, add, tanh, sub) x 32"),
]}
