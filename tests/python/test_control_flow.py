"""Static control flow: branches and loops decided by guarded Python values, unrolled."""

import pytest
import torch
import torch.nn as nn

import magpy
from conftest import Call, assert_stats, check


@pytest.mark.parametrize("flag", [True, False])
def test_branch_on_flag(flag):
    def f(x, flag):
        if flag:
            return x.relu()
        else:
            return x.sigmoid()

    x = torch.randn(4)
    cf = check(f, [(x, flag), (x * 2, flag), (x, not flag), (x, flag)])
    e = assert_stats(cf, graphs=2, hits=2, misses=2)
    assert e.recompile_reasons == [f"`L['flag']`: expected {flag}, got {not flag}"]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_branch_on_shape(n):
    def f(x):
        if x.shape[0] > 2:
            return x[:2] * 2
        elif x.dim() == 2 and x.size(1) == 1:
            return x.squeeze(1)
        return x + 1

    cf = check(f, [torch.randn(n, 1), torch.randn(n, 1), torch.randn(n, 2)])
    assert_stats(cf, graphs=2, hits=1, misses=2)


def test_branch_on_is_none_and_not_none():
    def f(x, mask=None, bias=None):
        if mask is not None:
            x = x.masked_fill(mask, 0.0)
        if bias is None:
            return x
        return x + bias

    x = torch.randn(4)
    m = x > 0
    cf = check(f, [Call(x), Call(x, m), Call(x, bias=x), Call(x, m, x), Call(x * 3),
                   Call(x, mask=m, bias=x)])
    assert_stats(cf, graphs=4, hits=2, misses=4)


def test_branch_on_dtype_and_isinstance():
    def f(x, y):
        if x.dtype == torch.float64:
            x = x.float()
        if isinstance(y, torch.Tensor):
            return x * y
        if isinstance(y, (int, float)):
            return x + y
        return x

    x = torch.randn(3)
    cf = check(f, [(x, x), (x.double(), x), (x, 2), (x, 2.5), (x, "s"), (x.double(), x)])
    assert_stats(cf, graphs=5, hits=1, misses=5)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.use_residual = True

    def forward(self, x):
        y = self.fc(x)
        if self.training:
            y = y * 0.5
        if self.use_residual:
            y = y + x
        return y


def test_branch_on_module_flags():
    m = Net()
    x = torch.randn(2, 3)

    def mutate(i):
        m.train(i % 2 == 0)
        m.use_residual = i < 4

    cf = check(m, [x, x, x, x, x, x], mutate=mutate)
    assert_stats(cf, graphs=4, hits=2, misses=4)


@pytest.mark.parametrize("n", [0, 1, 4])
def test_for_range_unrolled(n):
    def f(x, n):
        for i in range(n):
            x = x * 2 + i
        return x

    cf = check(f, [(torch.randn(3), n), (torch.randn(3), n), (torch.randn(3), n + 1)])
    e = assert_stats(cf, graphs=2, hits=1, misses=2)
    assert e.graphs[-1]["op_count"] == 2 * n


def test_while_loop_on_python_int():
    def f(x, steps):
        i = 0
        while i < steps:
            x = torch.tanh(x)
            i += 1
        return x, i

    cf = check(f, [(torch.randn(3), 3), (torch.randn(3), 3), (torch.randn(3), 2)])
    assert_stats(cf, graphs=2, hits=1, misses=2)


def test_break_continue_and_early_return():
    def f(x, limit):
        for i in range(10):
            if i % 2 == 1:
                continue
            if i >= limit:
                break
            x = x + i
        if limit > 5:
            return x * 100
        return x

    cf = check(f, [(torch.zeros(2), 4), (torch.ones(2), 4), (torch.zeros(2), 8)])
    assert_stats(cf, graphs=2, hits=1, misses=2)


def test_nested_loops_over_lists_and_tuples():
    def f(xs, weights):
        out = []
        for x in xs:
            acc = torch.zeros_like(x)
            for w in weights:
                acc = acc + x * w
            out.append(acc)
        return out

    a = torch.randn(2)
    cf = check(f, [([a, a * 2], (1.0, 2.0)), ([a * 3, a], (1.0, 2.0)), ([a], (1.0, 2.0))])
    assert_stats(cf, graphs=2, hits=1, misses=2)


def test_conditional_expression_and_boolean_operators():
    def f(x, a, b):
        scale = 2.0 if a and not b else 3.0
        shift = (a or b) and 1.0
        return x * scale + (shift or 0.0)

    x = torch.randn(3)
    cf = check(f, [(x, True, False), (x, True, False), (x, False, False), (x, True, True)])
    assert_stats(cf, graphs=3, hits=1, misses=3)


def test_branch_on_container_truthiness_and_len():
    def f(x, extras):
        if extras:
            for e in extras:
                x = x + e
        if len(extras) > 1:
            x = x * 2
        return x

    x = torch.randn(2)
    cf = check(f, [(x, []), (x, []), (x, [x]), (x, [x, x]), (x, [x * 2, x])])
    assert_stats(cf, graphs=3, hits=2, misses=3)


def test_loop_over_tensor_rows_with_python_index():
    def f(x):
        out = []
        for i, row in zip(range(x.shape[0]), x):
            out.append(row * i)
        return torch.stack(out)

    cf = check(f, [torch.randn(3, 2), torch.randn(3, 2), torch.randn(4, 2)])
    e = assert_stats(cf, graphs=2, breaks=0, hits=1, misses=2)
    # the size became symbolic, but range() needs the number: the second capture guards it
    assert e.recompile_reasons == ["tensor `L['x']` dim 0: expected 3, got 4; "
                                   "now dynamic: L['x'] dim 0"]
    assert "size=[4, 2]" in "\n".join(e.guards)


def test_loop_over_tensor_rows_with_counter():
    def f(x):
        out = []
        i = 0
        for row in x:
            out.append(row * i)
            i += 1
        return torch.stack(out)

    cf = check(f, [torch.randn(3, 2), torch.randn(3, 2), torch.randn(4, 2)])
    assert_stats(cf, graphs=2, hits=1, misses=2)


def test_chained_comparison_and_membership():
    def f(x, k):
        if 0 < x.shape[0] <= 3 and k in ("a", "b"):
            return x * 2
        if x.shape[0] in (4, 5):
            return x - 1
        return x

    cf = check(f, [(torch.randn(2), "a"), (torch.randn(2), "b"), (torch.randn(4), "a"),
                   (torch.randn(9), "z"), (torch.randn(2), "a")])
    assert_stats(cf, graphs=4, hits=1, misses=4)


def recursive_root(x, n):
    if n == 0:
        return x
    return recursive_root(x * 2, n - 1) + n


@pytest.mark.parametrize("n", [0, 2, 4])
def test_recursion_into_the_compiled_function_itself(n):
    cf = check(recursive_root, [(torch.randn(2), n), (torch.randn(2), n), (torch.randn(2), n + 1)])
    assert_stats(cf, graphs=2, hits=1, misses=2)


def test_torchscript_helpers_fold_in_eager_code():
    # torchvision-style guards around TorchScript-only code paths
    def f(x):
        if not torch.jit.is_scripting() and not torch.jit.is_tracing():
            x = x + 1
        y = torch.jit.annotate(torch.Tensor, x * 2)
        return y if torch._C._get_tracing_state() is None else x

    cf = check(f, [torch.randn(2), torch.randn(2)])
    assert_stats(cf, graphs=1, breaks=0, hits=1, misses=1)


def test_a_loop_too_long_to_unroll_runs_eagerly_with_a_reason():
    def f(x, n):
        for _ in range(n):
            x = x + 1
        return x

    cf = check(f, [(torch.zeros(2), 25000), (torch.zeros(2), 25000), (torch.ones(2), 3)])
    e = magpy.explain(cf)
    assert [b.reason_id for b in e.breaks] == ["MB015"]
    assert "more than 20000 operations" in e.breaks[0].reason
    assert e.graph_count == 1   # the short loop is one graph; the long one is an eager entry


def test_match_statements_on_strings_shapes_classes_and_dataclasses():
    import dataclasses

    @dataclasses.dataclass
    class Spec:
        kind: str
        scale: float = 1.0

    def f(x, mode, spec, layer):
        match mode:
            case "gelu":
                x = torch.nn.functional.gelu(x)
            case "relu" | "relu6":
                x = x.relu()
        match x.shape:
            case (b, n):
                x = x * n
            case (b, c, n):
                x = x.sum(1) * n
        match spec:
            case Spec("mul", scale=s):
                x = x * s
            case Spec(kind=k) if k.startswith("add"):
                x = x + len(k)
        match layer:
            case torch.nn.Linear(in_features=4):
                x = layer(x)
            case torch.nn.Module():
                x = x - 1
        match (1, x):
            case (int(one), t):
                x = t + one
        return x

    lin, relu = torch.nn.Linear(4, 4), torch.nn.ReLU()
    calls = [(torch.randn(2, 4), "gelu", Spec("mul", 2.0), lin),
             (torch.randn(2, 4), "gelu", Spec("mul", 2.0), lin),
             (torch.randn(2, 3, 4), "relu6", Spec("add_one"), relu),
             (torch.randn(2, 3, 4), "relu6", Spec("add_one"), relu)]
    cf = check(f, calls)
    assert_stats(cf, graphs=2, breaks=0, hits=2, misses=2)


def test_match_of_mapping_patterns():
    def f(x, cfg):
        match cfg:
            case {"scale": s, "shift": b}:
                return x * s + b
            case {"scale": s}:
                return x * s
        return x

    calls = [(torch.randn(2), {"scale": 2.0})] * 2 + [(torch.randn(2), {"scale": 2.0, "shift": 1.0})] * 2 + \
        [(torch.randn(2), {"other": 1})] * 2
    cf = check(f, calls)
    assert_stats(cf, graphs=3, breaks=0, hits=3, misses=3)
