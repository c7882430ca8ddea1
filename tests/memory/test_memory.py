"""Memory: cache-hit calls do not grow the process, and magpy keeps no extra references to the
user's inputs, modules or functions."""

import gc
import sys
import weakref

import torch
from torch import nn

import magpy


def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def f(x, y):
    return torch.relu(x + y) * 2


def test_100k_cache_hits_do_not_grow_the_process():
    magpy.reset()
    cf = magpy.compile(f)
    x, y = torch.randn(4), torch.randn(4)
    for _ in range(2000):  # warm up allocators and caches
        cf(x, y)
    gc.collect()
    before = rss_kb()
    objects_before = len(gc.get_objects())
    for _ in range(100_000):
        cf(x, y)
    gc.collect()
    grown = rss_kb() - before
    assert grown < 2048, f"RSS grew by {grown} kB over 100,000 cache hits"
    assert len(gc.get_objects()) - objects_before < 100
    ex = magpy.explain(cf)
    assert ex.cache_hits >= 102_000 - 1 and ex.graph_count == 1


def test_inputs_refcounts_unchanged_after_calls():
    magpy.reset()
    cf = magpy.compile(f)
    x, y = torch.randn(3), torch.randn(3)
    cf(x, y)  # capture
    rx, ry = sys.getrefcount(x), sys.getrefcount(y)
    for _ in range(1000):
        cf(x, y)
    assert (sys.getrefcount(x), sys.getrefcount(y)) == (rx, ry)


def test_cache_does_not_keep_module_or_function_alive():
    magpy.reset()

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x).relu()

    m = M()
    cm = magpy.compile(m)
    x = torch.randn(2, 3)
    cm(x)
    cm(x)
    lin_ref = weakref.ref(m.lin)
    m.lin = nn.Linear(3, 3)  # the old submodule is only referenced by guards now
    gc.collect()
    assert lin_ref() is None, "a guard kept a replaced submodule alive"
    assert torch.equal(cm(x), m(x))  # and the identity guard notices the replacement

    def g(t):
        return t * 3

    cg = magpy.compile(g)
    cg(x)
    g_ref, cg_ref = weakref.ref(g), weakref.ref(cg)
    del g, cg
    gc.collect()
    assert g_ref() is None and cg_ref() is None
