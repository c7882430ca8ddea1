"""`super()` in traced code ([Note: super] in core/src/capture/monitor.cpp): the base method is
found as super() finds it, guarded through type(self)'s MRO, and traced, so a module that
extends a built-in or a base module of the user's is one graph. Every test compares with eager
on every call."""

import torch
import torch.nn.functional as F
from torch import nn

import magpy
from conftest import check


def graphs_and_breaks(cf):
    e = magpy.explain(cf)
    return len(e.graphs), [b.reason_id for b in e.breaks]


class LayerNorm2d(nn.LayerNorm):
    """ConvNeXt-style: a built-in module's forward called through super() on permuted input."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x)

    def scale(self, x):
        return x * 2


class Child(Base):
    def forward(self, x):
        return super().forward(x).relu() + super(Child, self).scale(x)


class Mixin(nn.Module):
    def forward(self, x):
        return super().forward(x) + 1  # the next class in the MRO, not a base of Mixin


class Diamond(Mixin, Base):
    def forward(self, x):
        return super().forward(x) * 3


def test_super_forward_of_a_builtin_module_is_one_graph():
    cf = check(LayerNorm2d(8).eval(), [torch.randn(2, 8, 4, 4) for _ in range(3)])
    assert graphs_and_breaks(cf) == (1, [])


def test_zero_and_two_argument_super():
    cf = check(Child().eval(), [torch.randn(2, 8) for _ in range(3)])
    assert graphs_and_breaks(cf) == (1, [])


def test_super_follows_the_mro_of_the_objects_class():
    cf = check(Diamond().eval(), [torch.randn(2, 8) for _ in range(3)])
    assert graphs_and_breaks(cf) == (1, [])


def test_replacing_the_base_method_recompiles():
    m = Child().eval()
    magpy.reset()
    cf = magpy.compile(m)
    x = torch.randn(2, 8)
    assert torch.equal(cf(x), m(x))
    assert torch.equal(cf(x), m(x))
    original = Base.scale
    try:
        Base.scale = lambda self, x: x * 5
        assert torch.equal(cf(x), m(x))  # the guard on the lookup fails: a new capture
        assert magpy.explain(cf).report["captures"] == 2
    finally:
        Base.scale = original
    assert torch.equal(cf(x), m(x))


class Scaler:
    def __init__(self, k):
        self.k = k


class Doubler(Scaler):
    def __init__(self, bias):
        super().__init__(2.0)
        self.bias = bias


def test_super_init_of_an_object_made_in_the_call():
    def f(x):
        d = Doubler(0.5)
        return x * d.k + d.bias

    cf = check(f, [torch.randn(3) for _ in range(3)])
    assert graphs_and_breaks(cf) == (1, [])


class PropBase(nn.Module):
    @property
    def width(self):
        return 4


class PropChild(PropBase):
    def forward(self, x):
        return F.relu(x) + super().width


def test_super_attribute_that_is_not_a_method_breaks_and_stays_correct():
    cf = check(PropChild(), [torch.randn(3) for _ in range(3)])
    assert "MB007" in graphs_and_breaks(cf)[1]
