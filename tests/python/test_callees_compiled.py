"""Callees compiled on their own: a break inside a callee ends the caller's segment before the
call, and the call runs the callee as a compiled callable of its own (its own captures,
segments and cache entries) instead of running all of it eagerly. See [Note: callees compiled
on their own] in core/src/hook/frame_hook.cpp. Every call is compared with eager."""

import copy
import json
import sys

import pytest
import torch
from torch import nn

import magpy
from conftest import check, module_state, restore_module


def captures(ex):
    """Captures made by a compiled callable and by every callee it compiled on its own."""
    return ex.report["captures"] + sum(captures(c) for c in ex.callees)


def test_a_callee_that_broke_inside_runs_compiled_on_its_own():
    def post(y):
        z = y * 2 + 1
        if z.sum() > 0:  # a branch on tensor data: breaks inside post
            z = z - 3
        return z.relu() * 5

    def f(x):
        a = x.sin()
        b = post(a)
        return b.cos() + a

    xs = [torch.full((4,), v) for v in (1.0, -1.0, 0.5, -2.0, 1.5, -0.5, 2.0, -1.5)]
    cf = check(f, xs)
    ex = magpy.explain(cf)
    assert [b.function for b in ex.breaks] == ["test_a_callee_that_broke_inside_runs_compiled_on_its_own.<locals>.post"]
    # the caller's first segment calls post through magpy.compiled_call
    assert any("magpy.compiled_call(G['post'], v0)" in code or "magpy.compiled_call(" in code
               for code in ex.replay_code())
    assert [c.name for c in ex.callees] == [
        "test_a_callee_that_broke_inside_runs_compiled_on_its_own.<locals>.post"]
    callee = ex.callees[0]
    # post's own segments: before the branch, then each way on from it (both were taken)
    assert callee.graph_count >= 3, callee
    assert callee.break_count == 1 and callee.breaks[0].reason_id == "MB001"
    assert callee.report["calls"] >= 4
    assert "callee " in str(ex) and "magpy explanation of" in str(ex).split("callee ", 1)[1]
    # settled: neither the caller nor the callee captures again
    before = captures(ex)
    for x in xs:
        assert torch.equal(cf(x), f(x))
    assert captures(magpy.explain(cf)) == before


def test_effects_in_a_compiled_callee_happen_once_and_in_order(capsys):
    log = []

    def helper(y, tag):
        log.append(("helper in", tag))
        print("helper", tag, file=sys.stdout)
        log.append(("helper out", tag))
        return y + 1

    def f(x):
        log.append("f starts")
        a = helper(x * 2, "first")
        log.append("between")
        b = helper(a, "second")
        log.append("f ends")
        return a * b

    check(f, [torch.randn(3) for _ in range(6)], snapshot=lambda: list(log),
          restore=lambda s: log.__setitem__(slice(None), s))
    assert capsys.readouterr().out.split("\n")[:-1] == ["helper first", "helper second"] * 12


def test_submodules_of_one_class_are_compiled_per_instance():
    class Gate(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.lin = nn.Linear(n, n)
            self.opened = 0

        def forward(self, h):
            h = self.lin(h)
            if h.mean() > 0:
                self.opened += 1
                h = h.relu()
            return h

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.g1 = Gate(4)
            self.g2 = Gate(4)
            self.out = nn.Linear(4, 2)

        def forward(self, x):
            return self.out(self.g2(self.g1(x) * 2))

    torch.manual_seed(0)
    m = Net()
    xs = [torch.randn(3, 4) * s for s in (1, -1, 3, -3, 1, -1, 2, -2)]
    cf = check(m, xs, snapshot=lambda: module_state(m), restore=lambda s: restore_module(m, s))
    ex = magpy.explain(cf)
    assert [c.name.rsplit(".", 1)[-1] for c in ex.callees] == ["Gate", "Gate"]
    assert all(c.report["calls"] >= 4 and c.graph_count >= 2 for c in ex.callees), ex


def test_callees_nest():
    def inner(y):
        if y.max() > 1:
            return y / y.max()
        return y

    def middle(y):
        return inner(y * 3) + 1

    def f(x):
        return middle(x.abs()).sum()

    cf = check(f, [torch.randn(5) * s for s in (1, 0.1, 2, 0.2, 1, 0.1, 3, 0.1, 1, 0.2)])
    ex = magpy.explain(cf)
    assert [c.name.rsplit(".", 1)[-1] for c in ex.callees] == ["middle"]
    assert [c.name.rsplit(".", 1)[-1] for c in ex.callees[0].callees] == ["inner"]
    assert ex.callees[0].callees[0].graph_count >= 2


def test_an_exception_in_a_compiled_callee_reaches_the_caller():
    def check_positive(y, strict):
        total = y.sum()
        if total < 0:  # breaks: the rest of check_positive is its own segment
            if strict:
                raise ValueError("negative total")
            return -y
        return y

    def f(x, strict):
        return check_positive(x + 1, strict) * 2

    cf = magpy.compile(f)
    pos, neg = torch.full((3,), 1.0), torch.full((3,), -5.0)
    for _ in range(4):
        assert torch.equal(cf(pos, True), f(pos, True))
        assert torch.equal(cf(neg, False), f(neg, False))
        with pytest.raises(ValueError, match="negative total") as compiled_err:
            cf(neg, True)
        with pytest.raises(ValueError, match="negative total"):
            f(neg, True)
        # the traceback still shows the user's line inside check_positive
        assert any(fr.name == "check_positive" for fr in compiled_err.traceback)
    assert magpy.explain(cf).callees[0].name.endswith("check_positive")


def test_a_standard_library_callee_runs_as_it_is():
    def f(x):
        a = x * 2
        s = json.dumps(a.tolist())
        b = copy.deepcopy(a)
        return a + b + len(s)

    cf = check(f, [torch.randn(3) for _ in range(5)])
    ex = magpy.explain(cf)
    assert ex.break_count >= 1  # json and copy break inside (their own files)
    assert ex.callees == []
    assert not any("compiled_call" in code for code in ex.replay_code())


def test_fullgraph_raises_at_a_break_inside_a_callee():
    def helper(y):
        return y * 2 if y.sum() > 0 else y

    def f(x):
        return helper(x) + 1

    cf = magpy.compile(f, fullgraph=True)
    with pytest.raises(magpy.GraphBreakError, match="MB001"):
        cf(torch.ones(2))
    assert magpy.explain(cf).callees == []
