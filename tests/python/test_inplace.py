"""In-place tensor operations: on inputs, on views of inputs, on locals, on module buffers."""

import pytest
import torch
import torch.nn as nn

import magpy
from conftest import assert_stats, check, module_state, restore_module

INPLACE = {
    "add_": lambda x, y: x.add_(y),
    "mul_scalar": lambda x, y: x.mul_(2).sub_(1),
    "fill_": lambda x, y: x[1:].fill_(7.0),
    "zero_copy": lambda x, y: (x.zero_(), y.copy_(x + 1)),
    "clamp_": lambda x, y: x.clamp_(-0.1, 0.1),
    "masked_fill_": lambda x, y: x.masked_fill_(y > 0, 0.0),
    "index_add_": lambda x, y: x.index_add_(0, torch.tensor([0, 0]), y[:2]),
}


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_method_on_inputs(name):
    op = INPLACE[name]

    def f(x, y):
        op(x, y)
        return x * 1, y

    calls = [(torch.randn(4), torch.randn(4)) for _ in range(3)]
    cf = check(f, calls)
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_augmented_assignment_on_input_mutates_caller_tensor():
    def f(x, y):
        x += y
        x *= 2
        x -= 1
        x /= 4
        return x

    calls = [(torch.randn(3), torch.randn(3)) for _ in range(3)]
    cf = check(f, calls)
    assert_stats(cf, graphs=1, hits=2, misses=1)


def test_augmented_assignment_result_is_same_object():
    def f(x, y):
        x += y
        return x

    magpy.reset()
    cf = magpy.compile(f)
    for _ in range(3):
        x = torch.zeros(2)
        out = cf(x, torch.ones(2))
        assert out is x and torch.equal(x, torch.ones(2))
    assert_stats(cf, graphs=1, hits=2, misses=1)


@pytest.mark.parametrize("index", [0, -1, slice(1, 3), (slice(None), 1)])
@pytest.mark.parametrize("value", ["tensor", "int", "float"])
def test_setitem_on_input(index, value):
    def f(x, v):
        x[index] = v
        return x.sum()

    make = {"tensor": torch.tensor, "int": int, "float": float}[value]
    calls = [(torch.randn(4, 3), make(5.0)), (torch.randn(4, 3), make(5.0))]
    cf = check(f, calls)
    assert_stats(cf, graphs=1, hits=1, misses=1)


def test_setitem_literal_int():
    def f(x):
        x[0] = 1
        x[1, 1:] = 2.5
        return x

    cf = check(f, [torch.zeros(2, 3), torch.randn(2, 3)])
    assert_stats(cf, graphs=1, hits=1, misses=1)


def test_setitem_with_boolean_mask_and_tensor_value():
    def f(x, m, v):
        x[m] = v
        return x

    x = torch.arange(6.0)
    cf = check(f, [(x, x > 2, torch.tensor(0.0)), (x, x < 2, torch.tensor(9.0)),
                   (x, x == 3, torch.tensor(1.5))])
    assert_stats(cf, graphs=1, hits=2, misses=1)


def test_inplace_on_view_of_input():
    def f(x):
        row = x[1]
        row.mul_(10)
        x[:, 0].add_(1)
        return x.t()

    cf = check(f, [torch.randn(3, 3), torch.randn(3, 3)])
    assert_stats(cf, graphs=1, hits=1, misses=1)


def test_inplace_on_local_does_not_touch_input():
    def f(x):
        y = x.clone()
        y.add_(5)
        y[0] = 0
        return y

    calls = [torch.randn(3), torch.randn(3)]
    cf = check(f, calls)
    assert_stats(cf, graphs=1, hits=1, misses=1)


def test_inplace_on_tensor_inside_input_list():
    def f(xs):
        xs[0].add_(1)
        xs[1].mul_(xs[0])
        return xs[1].sum()

    cf = check(f, [[torch.randn(2), torch.randn(2)], [torch.randn(2), torch.randn(2)]])
    assert_stats(cf, graphs=1, hits=1, misses=1)


def test_same_tensor_passed_twice_inplace():
    def f(a, b):
        a.add_(1)
        return b * 2

    magpy.reset()
    cf = magpy.compile(f)
    for _ in range(3):
        t = torch.zeros(2)
        te = torch.zeros(2)
        assert torch.equal(cf(t, t), f(te, te))
        assert torch.equal(t, te)
    assert_stats(cf, graphs=1, hits=2, misses=1)


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(3))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.total.add_(x.sum(0))
        self.steps += 1
        return x - self.total / self.steps


def test_buffer_updates_in_place_every_call():
    m = Counter()
    calls = [torch.randn(2, 3) for _ in range(4)]
    cf = check(m, calls, snapshot=lambda: module_state(m), restore=lambda s: restore_module(m, s))
    assert_stats(cf, graphs=1, hits=3, misses=1)
    assert int(m.steps) == 4


def test_inplace_on_module_output_and_passed_module():
    lin = nn.Linear(3, 3)

    def f(m, x):
        y = m(x)
        y.relu_()
        y[:, 0] = -1.0
        return y.detach()

    cf = check(f, [(lin, torch.randn(2, 3)), (lin, torch.randn(2, 3))])
    assert_stats(cf, graphs=1, hits=1, misses=1)


def test_requires_grad_leaf_inplace_error_matches_eager():
    def f(x):
        x.add_(1)
        return x

    magpy.reset()
    cf = magpy.compile(f)
    x = torch.randn(2, requires_grad=True)
    with pytest.raises(RuntimeError) as eager_err:
        f(x)
    with pytest.raises(RuntimeError) as comp_err:
        cf(x)
    assert str(comp_err.value) == str(eager_err.value)
    assert magpy.explain(cf).cache_entries == 0


def test_replay_code_is_valid_python_for_in_place_operators_and_lambdas():
    import ast

    f = lambda x, y: x.clone().__iadd__(y) * 2  # noqa: E731
    def g(x, y):
        z = x.clone()
        z += y
        z *= 2
        return z

    for fn in (f, g):
        cf = check(fn, [(torch.randn(3), torch.randn(3))])
        for code in magpy.explain(cf).replay_code():
            ast.parse(code)  # raises SyntaxError if not Python
    code = "\n".join(magpy.explain(cf).replay_code())
    assert "operator.iadd(" in code and "operator.imul(" in code, code
