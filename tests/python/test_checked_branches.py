"""Branches on tensor data whose other side only raises ([Note: branches to a raise]): argument
checks and asserts stay in the graph as replay checks; a call whose data fails the check raises
exactly what eager raises; any other branch on data, or one after a visible effect, still breaks
(MB001). Every call is compared against eager.

PYTEST_DONT_REWRITE: the `assert` statements in the compiled functions must stay Python's own."""

import pytest
import torch

import magpy
from conftest import assert_raises_like_eager, assert_stats, break_ids, check


def validated(x, w):
    if torch.isnan(x).any():
        raise ValueError(f"input of shape {tuple(x.shape)} has NaNs")
    y = x @ w
    assert (y.abs() < 1e4).all(), "activations blew up"
    n = int((y > 100).sum().item())
    if n != 0:
        raise RuntimeError(f"{n} activations over 100")
    return torch.tanh(y)


def good():
    return torch.randn(3, 4), torch.randn(4, 2) * 0.1


def test_argument_checks_and_asserts_stay_in_one_graph():
    cf = check(validated, [good() for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)
    plan = "".join(magpy.explain(cf).replay_code())
    assert plan.count("check(bool(") == 3, plan


@pytest.mark.parametrize("bad, exc", [
    (lambda: (torch.tensor([[float("nan")] * 4] * 3), torch.ones(4, 2)), ValueError),
    (lambda: (torch.full((3, 4), 1e5), torch.ones(4, 2)), AssertionError),
    (lambda: (torch.full((3, 4), 30.0), torch.ones(4, 2)), RuntimeError),
])
def test_a_failing_check_raises_as_eager_and_the_graph_is_kept(bad, exc):
    cf = check(validated, [good() for _ in range(2)])
    assert_raises_like_eager(validated, bad, exc, compiled=cf)
    e = magpy.explain(cf)
    assert any("a replay check failed" in r for r in e.recompile_reasons), e.recompile_reasons
    check(validated, [good() for _ in range(2)], compiled=cf)
    assert_stats(cf, hits=3, entries=1)  # the good inputs still replay the one graph


def test_assert_on_data_with_fullgraph_compiles():
    def f(x):
        assert (x >= 0).all()
        return x.sqrt()

    cf = check(f, [torch.rand(5) for _ in range(2)], fullgraph=True)
    assert_stats(cf, graphs=1, breaks=0)
    with pytest.raises(AssertionError):
        cf(-torch.ones(5))


class Positive(torch.nn.Module):
    """A check in a callee (nn.Module.forward) after the caller's ops."""

    def forward(self, x):
        if not (x > 0).all():
            raise ValueError("expected positive values")
        return x.log()


def test_check_inside_an_inlined_module():
    m = torch.nn.Sequential(torch.nn.Softplus(), Positive(), torch.nn.Linear(4, 2))
    cf = check(m, [torch.randn(3, 4) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)


def branch_both_ways(x):
    if x.sum() > 0:
        return x * 2
    return x - 1


def test_a_branch_that_does_not_raise_still_breaks():
    cf = check(branch_both_ways, [torch.ones(3), -torch.ones(3), torch.ones(3)])
    assert break_ids(cf) == ["MB001"]


def test_a_check_after_a_write_breaks():
    def f(x, stats):
        stats.append(x.mean())  # visible before the check: giving up there would lose it
        if torch.isnan(x).any():
            raise ValueError("NaN")
        return x * 2

    state = []
    check(f, [(torch.randn(3), state) for _ in range(3)])
    cf = check(f, [(torch.randn(3), []) for _ in range(3)])
    assert break_ids(cf) == ["MB001"]


def test_an_inplace_op_before_the_check_breaks():
    def f(x):
        x.mul_(2)
        assert (x < 100).all()
        return x + 1

    cf = check(f, [torch.randn(3) for _ in range(3)])
    assert break_ids(cf) == ["MB001"]


def test_a_raise_caught_in_the_frame_is_not_a_check():
    def f(x):
        try:
            if (x < 0).any():
                raise ValueError("negative")
            y = x.sqrt()
        except ValueError:
            y = x.abs().sqrt()
        return y

    cf = check(f, [torch.rand(3), -torch.rand(3), torch.rand(3)])
    assert "MB001" in break_ids(cf) or "MB006" in break_ids(cf)


def test_a_number_from_data_checked_before_a_raise():
    def f(x, limit):
        total = x.sum().item()
        if total > limit:
            raise OverflowError(f"sum {total:.1f} over {limit}")
        return x / limit

    cf = check(f, [(torch.rand(4), 10.0) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)
    assert_raises_like_eager(f, lambda: (torch.full((4,), 5.0), 10.0), OverflowError)
