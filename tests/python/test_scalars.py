"""Python scalars and strings: guarded by value, folded into the graph as constants."""

import math

import pytest
import torch

import magpy

from conftest import assert_stats, check


def affine(x, a, b):
    return x * a + b


@pytest.mark.parametrize("a,b,a2", [
    (2, 3, 5),
    (0.5, -1.25, 0.75),
    (-3, 0.0, 4),
    (True, 1, False),
    (1e-3, 1e3, 2e-3),
])
def test_scalar_args_are_constants_and_guarded_by_value(a, b, a2):
    x = torch.randn(4, 3)
    cf = check(affine, [(x, a, b), (x * 2, a, b), (x, a2, b), (x, a, b)])
    e = assert_stats(cf, graphs=2, breaks=0, hits=2, misses=2, entries=2)
    # a number that changed becomes dynamic (read at replay) in the next capture; bools stay
    # guarded by value
    dynamic = "" if isinstance(a, bool) else "; now dynamic: L['a']"
    assert e.recompile_reasons == [f"`L['a']`: expected {a!r}, got {a2!r}{dynamic}"]
    assert f"L['a'] == {a!r}" in e.guards


def test_int_float_bool_of_equal_value_are_distinct_entries():
    x = torch.randn(3)
    cf = check(affine, [(x, 1, 0), (x, 1.0, 0), (x, True, 0), (x, 1, 0)])
    e = assert_stats(cf, graphs=3, hits=1, misses=3)
    assert len(e.recompile_reasons) == 2


def test_float_guard_distinguishes_signed_zero_and_keeps_nan():
    x = torch.tensor([1.0, -1.0, 0.0])

    def f(x, s):
        return x / (s + 1.0) + s

    cf = check(f, [(x, 0.0), (x, -0.0), (x, float("nan")), (x, float("nan")), (x, 0.0)])
    assert_stats(cf, graphs=3, hits=2, misses=3)


def test_python_arithmetic_is_folded():
    def f(x, n, m):
        k = n * 3 + m // 2 - n % 2
        scale = k ** 2 / 7
        return x * scale + k

    x = torch.randn(5)
    cf = check(f, [(x, 4, 9), (x + 1, 4, 9), (x, 5, 9)])
    e = assert_stats(cf, graphs=2, hits=1, misses=2)
    # two recorded ops per graph: x * scale, + k
    assert all(g["op_count"] == 2 for g in e.graphs)


@pytest.mark.parametrize("value", [0, 1, 7, -2])
def test_scalar_from_shape_arithmetic(value):
    def f(x, v):
        n = x.shape[0] * x.shape[1] + v
        return x.sum() / n, n

    cf = check(f, [(torch.randn(2, 3), value), (torch.randn(2, 3), value),
                   (torch.randn(3, 3), value)])
    assert_stats(cf, graphs=2, hits=1, misses=2)


def test_function_returning_only_python_values():
    def f(x, a):
        return x.shape[0] + a, x.dim(), x.numel(), x.dtype

    cf = check(f, [(torch.randn(2, 3), 1), (torch.randn(2, 3), 1), (torch.randn(4, 3), 1)])
    assert_stats(cf, graphs=2, hits=1, misses=2)


@pytest.mark.parametrize("mode,other", [("add", "mul"), ("mul", "sub"), ("sub", "add")])
def test_string_argument_selects_branch(mode, other):
    def f(x, y, mode):
        if mode == "add":
            return x + y
        elif mode == "mul":
            return x * y
        return x - y

    x, y = torch.randn(3), torch.randn(3)
    cf = check(f, [(x, y, mode), (y, x, mode), (x, y, other), (x, y, mode)])
    e = assert_stats(cf, graphs=2, hits=2, misses=2)
    assert e.recompile_reasons == [f"`L['mode']`: expected {mode!r}, got {other!r}"]


def test_math_and_pure_builtins_on_constants():
    def f(x, d, a, b):
        scale = 1.0 / math.sqrt(d)
        lo = min(a, b)
        hi = max(a, b)
        return (x * scale).clamp(lo, hi) + abs(a - b) + round(2.6)

    x = torch.randn(4, 4) * 3
    cf = check(f, [(x, 16, -1.0, 1.0), (x * 2, 16, -1.0, 1.0), (x, 64, -1.0, 1.0),
                   (x, 64, 2.0, -2.0)])
    assert_stats(cf, graphs=3, hits=1, misses=3)


@pytest.mark.parametrize("dtype,other", [(torch.float32, torch.float64),
                                         (torch.int64, torch.float16)])
def test_dtype_argument_is_a_guarded_constant(dtype, other):
    def f(x, dt):
        return x.to(dt) * 2

    x = torch.arange(6.0).reshape(2, 3)
    cf = check(f, [(x, dtype), (x + 1, dtype), (x, other), (x, dtype)])
    assert_stats(cf, graphs=2, hits=2, misses=2)


def test_none_argument_guarded():
    def f(x, bias):
        if bias is None:
            return x * 2
        return x * 2 + bias

    x = torch.randn(3)
    cf = check(f, [(x, None), (x, None), (x, torch.ones(3)), (x, torch.zeros(3)), (x, None)])
    e = assert_stats(cf, graphs=2, hits=3, misses=2)
    assert len(e.recompile_reasons) == 1


def test_tuple_of_ints_argument():
    def f(x, shape):
        return x.reshape(shape) + 1

    x = torch.arange(12.0)
    cf = check(f, [(x, (3, 4)), (x * 2, (3, 4)), (x, (4, 3)), (x, (2, 2, 3))])
    assert_stats(cf, graphs=3, hits=1, misses=3)


def test_scalars_in_tensor_factories():
    def f(n, v):
        return torch.full((n, 2), v) + torch.arange(n).unsqueeze(1)

    cf = check(f, [(3, 1.5), (3, 1.5), (4, 1.5), (4, 2.5)])
    assert_stats(cf, graphs=3, hits=1, misses=3)


def test_string_formatting_of_constants_is_allowed():
    def f(x, name):
        key = f"{name}_{x.shape[0]}"
        return {key: x + 1}

    cf = check(f, [(torch.randn(2), "a"), (torch.randn(2), "a"), (torch.randn(2), "b")])
    assert_stats(cf, graphs=2, hits=1, misses=2)


# --- automatic dynamic numbers ---------------------------------------------------------------

def test_changing_number_is_read_at_replay_after_one_recompile():
    def f(x, step, lr):
        return x * lr / (1 + step), step + 1, lr * 0.5

    x = torch.randn(3)
    cf = check(f, [(x, i, 0.1 * (i + 1)) for i in range(10)])
    e = assert_stats(cf, graphs=2, breaks=0, hits=8, misses=2)
    assert e.recompile_reasons[0].endswith("now dynamic: L['step'], L['lr']")


def test_dynamic_number_that_python_needs_is_guarded_by_value_again():
    def f(x, n):
        out = x
        for _ in range(n):  # the loop needs n itself
            out = out * 2
        return out + n

    x = torch.randn(3)
    cf = check(f, [(x, 1), (x, 2), (x, 2), (x, 3), (x, 3)])
    e = assert_stats(cf, graphs=3, breaks=0, hits=2, misses=3)
    assert "L['n'] == 2" in e.guards and "L['n'] == 3" in e.guards


def test_branch_on_a_dynamic_number_is_checked_at_replay():
    def f(x, k):
        y = x * k
        if k > 2:
            return y + 1
        return y - 1

    x = torch.randn(3)
    cf = check(f, [(x, 1), (x, 2), (x, 0), (x, 1), (x, 5), (x, 7), (x, 4)])
    e = magpy.explain(cf)
    assert e.break_count == 0 and e.graph_count <= 3


def test_dynamic_number_sizes_a_tensor():
    def f(x, n):
        z = torch.zeros(n, 2)
        return z + x[:1], z.shape[0] * 2, x.new_ones(n + 1).sum()

    x = torch.randn(3, 2)
    cf = check(f, [(x, 2), (x, 3), (x, 4), (x, 5), (x, 4)])
    assert magpy.explain(cf).break_count == 0


def test_builtins_over_a_dynamic_number_are_replayed():
    # an EMA-style warm-up: min(), max(), abs(), round(), math.*, int() and float() of a number
    # that changes every call are computed at replay instead of guarding it by value again
    def f(x, step, decay):
        d = min(decay, (1 + step) / (10 + step))
        w = max(1, int(step / 3)) + abs(-step) + round(step * 0.37, 2)
        return x * d + math.sqrt(step + 1) + float(step) / w, d

    x = torch.randn(3)
    cf = check(f, [(x, i, 0.999) for i in range(12)])
    e = assert_stats(cf, graphs=2, breaks=0, hits=10, misses=2)
    assert e.recompile_reasons == ["`L['step']`: expected 0, got 1; now dynamic: L['step']"]
    assert "L['decay'] == 0.999" in e.guards


def test_step_counter_on_a_module_costs_one_recompile():
    class Warmup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.steps = 0

        def forward(self, x):
            self.steps += 1
            return self.lin(x) * min(1.0, self.steps / 5)

    m, ref = Warmup(), Warmup()
    ref.load_state_dict(m.state_dict())
    cf = magpy.compile(m)
    x = torch.randn(2, 4)
    for i in range(8):
        torch.testing.assert_close(cf(x), ref(x), rtol=0, atol=0)
        assert m.steps == ref.steps == i + 1
    assert_stats(cf, graphs=2, breaks=0, hits=6, misses=2)


def test_builtin_result_that_python_needs_guards_its_dynamic_number_again():
    def f(x, n):
        k = max(1, n // 2)
        return x[:k] * 2  # slicing with a replayed number

    def g(x, n):
        if max(1, n // 2) > 2:  # a branch on it: checked at replay, never wrong
            return x + 1
        return x - 1

    x = torch.randn(8)
    check(f, [(x, i) for i in range(1, 9)])
    cf = check(g, [(x, i) for i in [1, 2, 3, 4, 5, 6, 7, 8, 2, 5]])
    assert magpy.explain(cf).break_count == 0


def test_dynamic_off_keeps_numbers_guarded_by_value():
    def f(x, k):
        return x * k

    x = torch.randn(2)
    cf = check(f, [(x, 1), (x, 2), (x, 3)], dynamic=False)
    assert_stats(cf, graphs=3, hits=0, misses=3)
