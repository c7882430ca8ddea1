"""hasattr(obj, "name") and getattr(obj, "name", default) with a constant name: a present
attribute is read like `obj.name` and guarded the same way; an absent one is guarded absent
(`not hasattr(...)`), so adding or removing the attribute later recompiles. Every call is
compared against eager."""

import pytest
import torch
from torch import nn

import magpy
from conftest import assert_stats, break_ids, check


class Config:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class OptionalHead(nn.Module):
    def __init__(self, with_head):
        super().__init__()
        self.body = nn.Linear(4, 4)
        if with_head:
            self.head = nn.Linear(4, 2)

    def forward(self, x):
        x = self.body(x).relu()
        if hasattr(self, "head"):
            x = self.head(x)
        return x


@pytest.mark.parametrize("with_head", [True, False])
def test_hasattr_on_a_module_decides_a_branch_in_one_graph(with_head):
    m = OptionalHead(with_head)
    cf = check(m, [torch.randn(3, 4) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_an_attribute_added_later_is_seen():
    m = OptionalHead(False)
    cf = magpy.compile(m)
    x = torch.randn(3, 4)
    assert torch.equal(cf(x), m(x))
    assert torch.equal(cf(x), m(x))
    m.head = nn.Linear(4, 2)  # now present: the guard `not hasattr(...)` fails
    assert cf(x).shape == (3, 2)
    assert torch.equal(cf(x), m(x))
    del m.head
    assert torch.equal(cf(x), m(x))
    e = magpy.explain(cf)
    assert e.break_count == 0
    assert any("expected no attribute 'head'" in r for r in e.recompile_reasons), e


def test_getattr_with_a_default_on_a_config_object():
    cfg = Config(scale=2.0)

    def f(x, config):
        scale = getattr(config, "scale", 1.0)
        if getattr(config, "use_bias", False):
            x = x + 1
        return x * scale

    x = torch.randn(3)
    calls = [(x, cfg), (x, cfg), (x, Config(scale=3.0, use_bias=True)), (x, Config())]
    cf = check(f, calls)
    assert break_ids(cf) == []
    assert "not hasattr(L['config'], 'use_bias')" in str(magpy.explain(cf))


def test_getattr_and_hasattr_of_tensors_and_objects_made_in_the_call():
    class Box:
        def __init__(self, t):
            self.t = t

    def f(x):
        b = Box(x * 2)
        extra = getattr(b, "extra", None)
        y = getattr(b, "t") + (0 if extra is None else extra)
        return y * hasattr(x, "shape") + hasattr(b, "missing")

    cf = check(f, [torch.randn(3) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_getattr_of_a_none_parameter_is_none():
    lin = nn.Linear(4, 3, bias=False)

    def f(x, layer):
        bias = getattr(layer, "bias", None)
        y = x @ layer.weight.t()
        return y if bias is None else y + bias

    cf = check(f, [(torch.randn(2, 4), lin) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0)


def test_a_name_passed_in_is_guarded_by_value():
    cfg = Config(a=1.0, b=2.0)

    def f(x, key):
        return x * getattr(cfg, key)

    cf = check(f, [(torch.randn(2), "a"), (torch.randn(2), "a"), (torch.randn(2), "b")])
    assert_stats(cf, graphs=2, breaks=0, hits=1, misses=2)


def test_a_name_made_from_tensor_data_breaks():
    cfg = Config(w0=1.0, w1=2.0, w2=3.0)

    def f(x):
        return x * getattr(cfg, f"w{int(x.argmax())}")

    cf = check(f, [torch.randn(3) for _ in range(4)])
    assert "MB003" in break_ids(cf)


def test_hasattr_of_a_property_breaks():
    class WithProp:
        calls = 0

        @property
        def value(self):
            WithProp.calls += 1
            return 3.0

    obj = WithProp()

    def f(x):
        return x * 2 if hasattr(obj, "value") else x

    cf = check(f, [torch.randn(2) for _ in range(3)])
    assert break_ids(cf) == ["MB007"]
