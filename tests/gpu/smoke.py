"""A quick look at the engine on this interpreter before the full suite: a handful of small
programs (straight-line ops, a method call, a loop, a comprehension, a slice, super(), a branch
on a shape, a graph break that resumes, a module on the GPU), each compiled and called three
times beside eager. Prints, per program, whether the results matched and what magpy.explain()
says (graphs, breaks and their messages). Exit 1 on a mismatch.

    PYTHONPATH=core/python:build-gpu/python python3 tests/gpu/smoke.py
"""
import sys

import torch

import magpy

dev = "cuda" if torch.cuda.is_available() else "cpu"


def straight(x, w):
    return torch.relu(x @ w).sum(dim=1) * 2


def method(x):
    return x.add(1).mul(3).tanh()


def loop(x):
    for i in range(3):
        x = x * (i + 1)
    return x


def comp(xs):
    return [t * 2 for t in xs]


def slicing(x):
    n = x.shape[0]
    return x[1:n - 1] + x[: n - 2]


class Base(torch.nn.Module):
    def forward(self, x):
        return x + 1


class Child(Base):
    def forward(self, x):
        return super().forward(x) * 2


def branch(x):
    if x.shape[0] > 2:
        return x.sum()
    return x.mean()


def breaks(x):
    y = x * 2
    print("side effect")
    return y + 1


mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(dev)
big_src = "def big(x):\n" + "".join(f"    a{i} = x + {i}\n" for i in range(300)) + \
    "    return a299 * a0\n"
_ns = {"torch": torch}
exec(big_src, _ns)
big = _ns["big"]

x = torch.randn(5, 16, device=dev)
w = torch.randn(16, 8, device=dev)
cases = [
    ("straight", straight, (x, w)),
    ("method", method, (x,)),
    ("loop", loop, (x,)),
    ("comprehension", comp, ([x, x + 1],)),
    ("slice", slicing, (x,)),
    ("super", Child(), (x,)),
    ("branch", branch, (x,)),
    ("graph break", breaks, (x,)),
    ("extended arg", big, (x,)),
    ("mlp", mlp, (x,)),
]
bad = 0
for name, fn, args in cases:
    try:
        cf = magpy.compile(fn)
        ok = True
        for _ in range(3):
            ref = fn(*args)
            out = cf(*args)
            same = (torch.equal(ref, out) if isinstance(ref, torch.Tensor)
                    else all(torch.equal(a, b) for a, b in zip(ref, out)))
            ok = ok and same
        ex = magpy.explain(cf)
        msgs = "; ".join(f"[{b.reason_id}] {b.reason}" for b in ex.breaks)
        print(f"{'ok ' if ok else 'BAD'} {name:14} graphs {ex.graph_count} breaks {ex.break_count} "
              f"hits {ex.cache_hits} {msgs}"[:400])
        bad += not ok
    except Exception as e:  # report and go on: this is a survey
        print(f"ERR {name:14} {type(e).__name__}: {e}"[:400])
        bad += 1
print(f"smoke: {len(cases) - bad}/{len(cases)} programs matched eager")
sys.exit(1 if bad else 0)
