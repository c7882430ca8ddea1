"""warnings.warn and a Logger's info() & co replayed as steps of the plan ([Note: effects that
read the caller's frame] in core/src/capture/monitor.cpp). Both name the frame that called
them (or one `stacklevel` above) in what they emit; the capture finds that frame while it runs,
and the replay files the warning and makes the record as if from it, with the filters, the
warning registry, the logger's level and its handlers consulted at replay. Every test compares
what eager and compiled calls emit, field by field, and the function stays one graph."""

import contextlib
import io
import logging
import warnings

import pytest
import torch
from torch import nn

import magpy
from conftest import assert_stats, break_ids


def warned(fn, calls, mode="always"):
    """Runs fn on each argument tuple under a fresh warnings filter `mode`; returns what was
    warned as (message, category, file, line, module) and the results."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter(mode)
        results = [fn(*args) for args in calls]
    return [(str(w.message), w.category, w.filename, w.lineno) for w in got], results


def same_warnings(fn, calls, mode="always", compiled=None):
    """fn eagerly, then compiled: the same warnings and the same results. Returns the
    compiled function and the warnings."""
    want, eager = warned(fn, calls, mode)
    cf = compiled or magpy.compile(fn)
    got, results = warned(cf, calls, mode)
    assert got == want
    for r, e in zip(results, eager):
        torch.testing.assert_close(r, e, rtol=0, atol=0)
    return cf, got


def helper_that_warns(x):
    warnings.warn("helper_that_warns is deprecated", DeprecationWarning, stacklevel=2)
    return x * 2


def test_a_warning_keeps_the_function_one_graph_and_names_its_line():
    def f(x):
        y = x.relu()
        warnings.warn("f is deprecated; use g", FutureWarning)
        return y + 1

    calls = [(torch.randn(3),) for _ in range(3)]
    cf, got = same_warnings(f, calls)
    line = f.__code__.co_firstlineno + 2
    assert got == [("f is deprecated; use g", FutureWarning, __file__, line)] * 3
    assert_stats(cf, graphs=1, breaks=0, hits=2)


def test_stacklevel_two_in_a_callee_names_the_line_that_called_it():
    def f(x):
        y = x + 1
        y = helper_that_warns(y)  # stacklevel=2 points here
        return y.sin()

    cf, got = same_warnings(f, [(torch.randn(3),) for _ in range(3)])
    assert {w[3] for w in got} == {f.__code__.co_firstlineno + 2}
    assert_stats(cf, graphs=1, breaks=0)


def test_stacklevel_past_the_compiled_function_names_each_callers_line():
    """A site above the compiled function is looked up at replay: two call sites, two lines."""
    def f(x):
        warnings.warn("called from", UserWarning, stacklevel=2)
        return x * 3

    def from_two_places(fn):
        def run(x):
            a = fn(x)  # line A
            b = fn(x)  # line B
            return a + b
        return run

    cf = magpy.compile(f)
    want, _ = warned(from_two_places(f), [(torch.ones(2),)] * 3)
    got, _ = warned(from_two_places(cf), [(torch.ones(2),)] * 3)
    assert got == want
    assert len({w[3] for w in got}) == 2
    assert_stats(cf, graphs=1, breaks=0, hits=5)


def test_a_module_forward_warning_at_stacklevel_two_names_module_call():
    class Old(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            warnings.warn("Old is deprecated", FutureWarning, stacklevel=2)
            return self.lin(x)

    m = Old()
    cf, got = same_warnings(m, [(torch.randn(2, 4),) for _ in range(3)])
    assert len(got) == 3
    assert_stats(cf, graphs=1, breaks=0)


def test_the_default_filter_warns_once_per_line_through_the_module_registry():
    def f(x):
        warnings.warn("once per line", UserWarning)
        return x + 1

    cf, got = same_warnings(f, [(torch.randn(2),) for _ in range(4)], mode="default")
    assert len(got) == 1
    registry = f.__globals__["__warningregistry__"]
    assert ("once per line", UserWarning, f.__code__.co_firstlineno + 1) in registry
    assert_stats(cf, graphs=1, breaks=0)


def test_a_filter_turned_to_error_raises_at_replay_after_the_effects_before_it():
    def f(x, log):
        log.append("before")
        warnings.warn("now an error", RuntimeWarning)
        log.append("after")
        return x + 1

    def run(fn):
        log = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(2):
                fn(torch.ones(2), log)
            warnings.simplefilter("error")
            with pytest.raises(RuntimeWarning, match="now an error"):
                fn(torch.ones(2), log)
        return log

    cf = magpy.compile(f)
    assert run(cf) == run(f) == ["before", "after"] * 2 + ["before"]


def test_a_warning_after_a_graph_break_is_filed_where_eager_files_it():
    def f(x):
        if x.sum() > 0:  # a branch on data: a break, then a resumed capture
            x = x + 1
        warnings.warn("after the break", UserWarning, stacklevel=2)
        warnings.warn("after the break, here", UserWarning)
        return x * 2

    cf, got = same_warnings(f, [(torch.ones(3),) for _ in range(3)])
    assert len(got) == 6
    assert break_ids(cf) == ["MB001"]


def test_a_warning_whose_message_is_not_a_string_still_breaks():
    def f(x):
        warnings.warn(DeprecationWarning("an instance"))
        return x + 1

    cf, _ = same_warnings(f, [(torch.ones(2),) for _ in range(3)])
    assert break_ids(cf)


@contextlib.contextmanager
def recording_logger(name, level=logging.INFO):
    """A logger whose records are written as `level funcName file:lineno message [user]`."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter(
        "%(levelname)s %(funcName)s %(filename)s:%(lineno)d %(message)s"))
    log = logging.getLogger(name)
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
    try:
        yield log, out
    finally:
        log.removeHandler(handler)


def same_records(fn, calls, out):
    """fn eagerly, then compiled: the same log text and results. Returns the compiled
    function and the lines logged by each."""
    eager = [fn(*args) for args in calls]
    want = out.getvalue()
    out.seek(0)
    out.truncate()
    cf = magpy.compile(fn)
    results = [cf(*args) for args in calls]
    got = out.getvalue()
    assert got == want
    for r, e in zip(results, eager):
        torch.testing.assert_close(r, e, rtol=0, atol=0)
    return cf, got.splitlines()


def test_logger_calls_at_every_level_are_replayed_with_the_callers_line():
    with recording_logger("magpy.test.levels") as (log, out):
        def step(x, n):
            y = x.relu()
            log.debug("hidden: below the logger's level %d", n)
            log.info("shape %s, n=%d", tuple(y.shape), n)
            log.warning("norm of a tensor %s", y.detach().sum())
            log.log(logging.ERROR, "at level %s", "ERROR")
            log.critical("done")
            return y + n

        cf, lines = same_records(step, [(torch.randn(3), 2) for _ in range(3)], out)
        first = step.__code__.co_firstlineno
        assert lines[:4] == [
            "INFO step %s:%d shape (3,), n=2" % (__file__.split("/")[-1], first + 3),
            "WARNING step %s:%d norm of a tensor %s" % (__file__.split("/")[-1], first + 4,
                                                        lines[1].split(" tensor ")[1]),
            "ERROR step %s:%d at level ERROR" % (__file__.split("/")[-1], first + 5),
            "CRITICAL step %s:%d done" % (__file__.split("/")[-1], first + 6)]
        assert len(lines) == 12
        assert_stats(cf, graphs=1, breaks=0, hits=2)


def test_the_level_and_handlers_are_read_at_replay():
    with recording_logger("magpy.test.level_at_replay") as (log, out):
        def f(x):
            log.info("sum %s", x.sum())
            return x * 2

        cf = magpy.compile(f)
        x = torch.ones(2)
        cf(x)
        log.setLevel(logging.WARNING)  # quiet from now on: no recompile needed to notice
        cf(x)
        log.setLevel(logging.INFO)
        cf(x)
        assert out.getvalue().count("sum tensor(2.)") == 2
        assert_stats(cf, graphs=1, breaks=0, hits=2)


def test_stacklevel_and_extra_are_replayed():
    with recording_logger("magpy.test.stacklevel") as (log, out):
        out_fmt = logging.Formatter("%(funcName)s:%(lineno)d %(message)s user=%(user)s")
        log.handlers[-1].setFormatter(out_fmt)

        def f(x):
            log.info("from my caller", stacklevel=2, extra={"user": "ana"})
            return x + 1

        def caller(fn, x):
            return fn(x)

        eager = [caller(f, torch.ones(2)) for _ in range(2)]
        want = out.getvalue()
        out.seek(0)
        out.truncate()
        cf = magpy.compile(f)
        got = [caller(cf, torch.ones(2)) for _ in range(2)]
        assert out.getvalue() == want
        assert "caller:" in want and "user=ana" in want
        assert all(torch.equal(a, b) for a, b in zip(got, eager))
        assert_stats(cf, graphs=1, breaks=0)


def test_logging_without_source_file_lookup():
    with recording_logger("magpy.test.srcfile") as (log, out):
        def f(x):
            log.info("no caller")
            return x - 1

        saved = logging._srcfile
        logging._srcfile = None
        try:
            _, lines = same_records(f, [(torch.ones(2),)] * 2, out)
        finally:
            logging._srcfile = saved
        assert lines == ["INFO (unknown function) (unknown file):0 no caller"] * 2


def test_exc_info_and_loggers_that_find_their_caller_themselves_still_break():
    class Tagged(logging.Logger):
        def findCaller(self, stack_info=False, stacklevel=1):
            return "tagged.py", 1, "tagged", None

    tagged = Tagged("magpy.test.tagged")
    tagged.addHandler(logging.NullHandler())
    tagged.propagate = False
    with recording_logger("magpy.test.exc_info") as (log, out):
        def f(x):
            log.info("with a stack", stack_info=True)
            return x + 1

        def g(x):
            tagged.warning("tagged")
            return x + 1

        for fn in (f, g):
            cf = magpy.compile(fn)
            for _ in range(2):
                assert torch.equal(cf(torch.ones(2)), torch.ones(2) + 1)
            assert break_ids(cf) == ["MB005"], magpy.explain(cf)
    assert "Stack (most recent call last)" in out.getvalue()


def test_module_level_logging_functions_use_the_root_logger():
    root = logging.getLogger()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(funcName)s:%(lineno)d %(message)s"))
    saved = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        def f(x):
            logging.info("root %d", 7)
            return x * 5

        cf, lines = same_records(f, [(torch.ones(2),)] * 3, out)
        assert lines == ["f:%d root 7" % (f.__code__.co_firstlineno + 1)] * 3
        assert_stats(cf, graphs=1, breaks=0)
    finally:
        root.removeHandler(handler)
        root.setLevel(saved)
