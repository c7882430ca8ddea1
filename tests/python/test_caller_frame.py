"""Calls that read the frame calling them, at a graph break ([Note: calls that read their
caller's frame] in core/src/capture/segment.cpp). A replay plan runs in place of the user's
frame, so such a call made from the plan would see the frame's caller: `locals()` listed the
caller's names, `eval` could not see the function's locals, `sys._getframe()` named the wrong
function, and logging reported the caller's line. They now run in the resume code, a frame
with the original's name, lines, locals and closure; the graphs before them are kept."""

import io
import logging
import sys
import warnings

import torch
from torch import nn

import magpy
from conftest import check


def notes(cf):
    return magpy.explain(cf).notes


def assert_goes_on_as_plain_python(cf, name):
    assert any("goes on as plain Python" in n and name in n for n in notes(cf)), notes(cf)
    e = magpy.explain(cf)
    assert len(e.graphs) >= 1, e  # the ops before the break are still a graph


def test_locals_lists_the_functions_own_names():
    def f(x):
        y = x + 1
        names = sorted(locals())
        return names, y * 2

    cf = check(f, [torch.ones(2), torch.randn(2), torch.randn(2)])
    assert cf(torch.ones(2))[0] == ["x", "y"]
    assert_goes_on_as_plain_python(cf, "locals")


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


def test_logging_reports_the_functions_name_and_line():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(funcName)s:%(lineno)d:%(message)s"))
    log = logging.getLogger("magpy.test.caller_frame")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        def step(x):
            y = x.relu()
            log.info("shape %s", tuple(y.shape))
            return y + 1

        expected_line = step.__code__.co_firstlineno + 2
        magpy.reset()
        cf = magpy.compile(step)
        for _ in range(3):
            x = torch.randn(3)
            assert torch.equal(cf(x), step(x))
        lines = out.getvalue().splitlines()
        assert len(lines) == 6
        assert set(lines) == {"step:%d:shape (3,)" % expected_line}
        assert_goes_on_as_plain_python(cf, "info")
    finally:
        log.removeHandler(handler)


def test_warnings_point_at_the_functions_line():
    def g(x):
        y = x.relu()
        warnings.warn("careful")
        return y + 1

    expected_line = g.__code__.co_firstlineno + 2
    magpy.reset()
    cg = magpy.compile(g)
    for _ in range(3):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            cg(torch.randn(3))
        assert [(str(w.message), w.filename, w.lineno) for w in got] == [
            ("careful", __file__, expected_line)]
