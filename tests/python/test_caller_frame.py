"""Calls that read the frame calling them, at a graph break ([Note: calls that read their
caller's frame] in core/src/capture/segment.cpp). A replay plan runs in place of the user's
frame, so such a call made from the plan would see the frame's caller: `locals()` listed the
caller's names, `eval` could not see the function's locals, `sys._getframe()` named the wrong
function. They now run in the resume code, a frame with the original's name, lines, locals
and closure; the graphs before them are kept, and where the call's statement is simple the
resume code is a bridge ([Note: bridges] in magpy/_resume.py) after which capture goes on.
(warnings.warn and logging are replayed instead: test_warn_and_log.py.)"""

import sys

import torch
from torch import nn

import magpy
from conftest import check


def notes(cf):
    return magpy.explain(cf).notes


def assert_runs_in_its_own_frame(cf, name):
    assert any("runs in the function's own frame" in n and name in n for n in notes(cf)), notes(cf)
    e = magpy.explain(cf)
    assert len(e.graphs) >= 1, e  # the ops before the break are still a graph


def test_locals_lists_the_functions_own_names():
    def f(x):
        y = x + 1
        names = sorted(locals())
        return names, y * 2

    cf = check(f, [torch.ones(2), torch.randn(2), torch.randn(2)])
    assert cf(torch.ones(2))[0] == ["x", "y"]
    assert_runs_in_its_own_frame(cf, "locals")


def test_dir_and_vars_without_arguments():
    def f(x):
        y = x - 1
        return dir(), vars()["y"] + 0

    check(f, [torch.ones(2), torch.randn(2), torch.randn(2)])


def test_eval_sees_the_functions_locals():
    def f(x):
        y = x * 2
        return eval("y + 1")

    check(f, [torch.ones(2), torch.randn(2), torch.randn(2)])


def test_getframe_names_the_function():
    def f(x):
        y = x * 2
        return sys._getframe().f_code.co_name, sys._getframe().f_lineno, y

    cf = check(f, [torch.ones(2), torch.randn(2), torch.randn(2)])
    assert cf(torch.ones(2))[0] == "f"


def test_zero_argument_super_at_a_break_calls_the_base():
    class Base(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x)

    class Child(Base):
        def forward(self, x):
            h = x.relu()
            print("h", h.sum().item(), file=sys.stdout)  # a break before super()
            return super().forward(h) + 1

    check(Child(), [torch.randn(2, 4) for _ in range(3)])


def graph_count(cf):
    return len(magpy.explain(cf).graphs)


def test_capture_goes_on_after_the_statement_through_a_bridge():
    lin = nn.Linear(4, 4)
    lines = []

    def forward(x):
        k = 3.0  # a cell (the lambda reads it), live across the bridge
        h = lin(x).relu()
        lines.append(sys._getframe().f_lineno)
        later = h.sum(-1)  # assigned after the bridge (unbound there)
        scale = lambda t: t * k  # noqa: E731
        return scale(h) + later.unsqueeze(-1)

    line = forward.__code__.co_firstlineno + 3
    cf = check(forward, [torch.randn(2, 4) for _ in range(4)])
    assert set(lines) == {line} and len(lines) == 8
    assert graph_count(cf) == 2  # before and after the frame lookup
    e = magpy.explain(cf)
    # call 1 captures up to the break, call 2 after the bridge; calls 3 and 4 replay both
    assert e.report["captures"] == 2, e


def test_a_bridge_inside_a_loop_carries_the_loops_iterator():
    lines = []

    def f(x):
        for i in range(3):
            x = x * 2 + i
            lines.append(sys._getframe().f_lineno)
            x = x.relu()
        return x

    line = f.__code__.co_firstlineno + 3
    magpy.reset()
    cf = magpy.compile(f)
    for _ in range(4):
        x = torch.randn(3)
        del lines[:]
        assert torch.equal(cf(x), f(x))
        assert lines == [line] * 6


def test_a_call_in_a_try_block_runs_the_rest_as_plain_python():
    def f(x):
        y = x + 1
        try:
            names = locals().copy()
        except KeyError:
            names = {}
        return y * len(names)

    check(f, [torch.randn(2) for _ in range(3)])


def test_eval_assigned_then_captured_after():
    def f(x):
        y = x * 2
        z = eval("y + 1")
        return (z * y).sum()

    cf = check(f, [torch.randn(3) for _ in range(4)])
    assert graph_count(cf) == 2


def test_a_bridge_runs_the_whole_statement_around_the_call():
    def f(x):
        y = x + 1
        names = sorted(locals())  # the result goes into another call, then a store
        out = torch.cat([
            x,
            eval("y + 1")])  # a statement over three lines
        return names, (out * 2).relu()

    cf = check(f, [torch.randn(3) for _ in range(5)])
    assert graph_count(cf) == 3  # before locals(), between, after eval
