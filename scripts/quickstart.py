"""The quick-start demo run by scripts/main-job.sh: compile a small model, run it, explain it."""

import torch
from torch import nn

import magpy


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.scale = 0.5

    def forward(self, x):
        h = self.layers(x)
        return torch.softmax(h * self.scale, dim=-1)


def main():
    torch.manual_seed(0)
    model = TinyNet().eval()
    compiled = magpy.compile(model)
    x = torch.randn(8, 16)
    with torch.no_grad():
        for _ in range(3):
            out = compiled(x)
            assert torch.equal(out, model(x)), "compiled result differs from eager"
        model.scale = 2.0  # a guarded attribute changes: magpy recompiles and says why
        out = compiled(x)
        assert torch.equal(out, model(x))
    print(magpy.explain(compiled))


if __name__ == "__main__":
    main()
