"""Errors: bad compile() arguments, exceptions raised by the user's code (on capture and on
replay), the state they leave behind, and reference counts of everything passed in."""

import gc
import time
import sys
import traceback
import weakref

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import magpy
from conftest import Call, assert_raises_like_eager, assert_stats, check

LOG = []


def test_compile_non_callable_raises_type_error():
    with pytest.raises(TypeError) as err:
        magpy.compile(3)
    msg = str(err.value)
    assert "3" in msg and "int" in msg and "not callable" in msg
    with pytest.raises(TypeError, match="str"):
        magpy.compile("relu")


def test_unknown_backend_raises_value_error():
    with pytest.raises(ValueError) as err:
        magpy.compile(torch.relu, backend="no-such-backend")
    assert "no-such-backend" in str(err.value)
    assert "available: " in str(err.value) and "eager" in str(err.value)


def test_backends_lists_eager():
    assert "eager" in magpy.backends()


@pytest.mark.parametrize("kwargs,exc", [
    (dict(backend=None), TypeError),
    (dict(backend=3), TypeError),
    (dict(dynamic="yes"), TypeError),
    (dict(cache_limit=0), ValueError),
])
def test_invalid_options(kwargs, exc):
    def f(x):
        return x

    with pytest.raises(exc):
        magpy.compile(f, **kwargs)


def test_explain_of_non_compiled_raises_type_error():
    with pytest.raises(TypeError, match="magpy.compile"):
        magpy.explain(lambda x: x)


def test_compile_of_compiled_unwraps():
    def f(x):
        return x + 1

    cf = magpy.compile(magpy.compile(f))
    check(f, [torch.ones(2), torch.ones(2)], compiled=cf)
    assert cf.__name__ == "f" and cf._orig is f
    assert_stats(cf, graphs=1, hits=1, misses=1)


def user_function_that_raises(x, fail):
    LOG.append("before")
    y = x * 2
    if fail:
        raise ValueError("user error %d" % y.shape[0])
    return y


def failing_callee(x):
    return x.view(-1, 7)


def outer_calls_failing_callee(x):
    return failing_callee(x + 1)


def test_exception_on_capture_propagates_with_user_traceback():
    LOG.clear()
    magpy.reset()
    cf = magpy.compile(user_function_that_raises)
    x = torch.randn(3)
    with pytest.raises(ValueError, match="user error 3") as err:
        cf(x, True)
    tb = "".join(traceback.format_exception(err.value))
    assert "user_function_that_raises" in tb
    assert 'raise ValueError("user error %d" % y.shape[0])' in tb
    assert LOG == ["before"]  # the statement before the raise ran exactly once
    assert magpy.explain(cf).cache_entries == 0
    # later calls work and are compared against eager
    LOG.clear()
    check(user_function_that_raises, [(x, False), (x, False)], compiled=cf)
    assert LOG == ["before"] * 4
    assert magpy.explain(cf).graph_count == 1
    assert magpy.explain(cf).break_count == 0  # the user's error is not a graph break


def checked_linear(x, w):
    if x.dim() != 2:
        raise ValueError(f"expected a 2-d input, got {x.dim()}-d")  # no rule for ValueError()
    if x.shape[1] != w.shape[0]:
        raise RuntimeError("size mismatch %d vs %d" % (x.shape[1], w.shape[0]))
    return (x @ w).view(-1, 3)


@pytest.mark.parametrize("bad, exc", [
    (lambda: (torch.randn(4), torch.randn(4, 3)), ValueError),      # a branch into a raise
    (lambda: (torch.randn(2, 5), torch.randn(4, 3)), RuntimeError),
    (lambda: (torch.randn(2, 4), torch.randn(4, 2)), RuntimeError),  # the op itself raises
])
@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_call_that_raises_raises_the_users_error_even_with_fullgraph(bad, exc, fullgraph):
    """[Note: calls that raise]: no GraphBreakError, no break reported, no break site left."""
    cf = assert_raises_like_eager(checked_linear, bad, exc, fullgraph=fullgraph)
    assert_stats(cf, breaks=0, entries=0)
    check(checked_linear, [(torch.randn(3, 4), torch.randn(4, 3))] * 2, compiled=cf)
    assert_stats(cf, graphs=1, breaks=0, hits=1)  # one whole graph, not segments


def test_exception_in_inlined_callee_has_both_frames():
    magpy.reset()
    cf = magpy.compile(outer_calls_failing_callee)
    x = torch.randn(5)
    with pytest.raises(RuntimeError) as eager_err:
        outer_calls_failing_callee(x)
    with pytest.raises(RuntimeError) as err:
        cf(x)
    assert str(err.value) == str(eager_err.value)
    tb = "".join(traceback.format_exception(err.value))
    assert "outer_calls_failing_callee" in tb and "failing_callee" in tb
    assert magpy.explain(cf).cache_entries == 0
    cf2 = check(outer_calls_failing_callee, [torch.randn(7), torch.randn(14)])
    assert_stats(cf2, graphs=2)


def gather(x, idx):
    return x[idx] * 2


def test_exception_on_replay_same_type_and_message():
    magpy.reset()
    cf = magpy.compile(gather)
    x = torch.arange(5.0)
    assert torch.equal(cf(x, torch.tensor([1, 2])), gather(x, torch.tensor([1, 2])))
    bad = torch.tensor([7, 2])
    with pytest.raises(IndexError) as eager_err:
        gather(x, bad)
    with pytest.raises(IndexError) as err:
        cf(x, bad)
    assert str(err.value) == str(eager_err.value)
    assert_stats(cf, graphs=1, hits=1, misses=1)
    # the entry is still good afterwards
    assert torch.equal(cf(x, torch.tensor([4, 0])), gather(x, torch.tensor([4, 0])))


def test_exception_on_replay_has_user_traceback():
    magpy.reset()
    cf = magpy.compile(gather)
    x = torch.arange(5.0)
    cf(x, torch.tensor([1, 2]))
    with pytest.raises(IndexError) as err:
        cf(x, torch.tensor([7, 2]))
    tb = traceback.extract_tb(err.value.__traceback__)
    # the last frame is the user's line, exactly as when the function runs eagerly
    assert (tb[-1].name, tb[-1].lineno, tb[-1].line) == (
        "gather", gather.__code__.co_firstlineno + 1, "return x[idx] * 2")


def log_then_index(x, idx, log):
    log.append(idx.shape[0])
    return x[idx]


def test_exception_on_replay_keeps_earlier_side_effects():
    magpy.reset()
    cf = magpy.compile(log_then_index)
    x = torch.arange(5.0)
    log_e, log_c = [], []
    assert torch.equal(cf(x, torch.tensor([1]), log_c), log_then_index(x, torch.tensor([1]), log_e))
    with pytest.raises(IndexError):
        log_then_index(x, torch.tensor([9]), log_e)
    with pytest.raises(IndexError):
        cf(x, torch.tensor([9]), log_c)
    assert log_c == log_e


def test_fullgraph_error_leaves_no_entry_and_repeats():
    def f(x):
        return x * float(bool(x.sum() > 0))  # bool() of a tensor: MB002

    magpy.reset()
    cf = magpy.compile(f, fullgraph=True)
    for _ in range(2):
        with pytest.raises(magpy.GraphBreakError, match="MB002"):
            cf(torch.ones(2))
    assert magpy.explain(cf).cache_entries == 0
    cf2 = magpy.compile(f)
    assert torch.equal(cf2(torch.ones(2)), f(torch.ones(2)))
    assert magpy.explain(cf2).break_count == 1


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x, extra):
        return self.fc(x) + extra[0]


def refcounts(*objs):
    gc.collect()
    return [sys.getrefcount(o) for o in objs]


@pytest.mark.parametrize("path", ["graph", "break", "exception"])
def test_refcounts_of_inputs_unchanged(path):
    def graph_fn(x, extra, m):
        return m(x, extra) * 2

    def break_fn(x, extra, m):
        return m(x, extra) * float(bool(m(x, extra).sum() > 0))

    def exc_fn(x, extra, m):
        m(x, extra)
        raise KeyError("boom")

    fn = {"graph": graph_fn, "break": break_fn, "exception": exc_fn}[path]
    m = Small()
    x = torch.randn(2, 3)
    extra = [torch.ones(3)]
    magpy.reset()
    cf = magpy.compile(fn)

    def call():
        try:
            expected = fn(x, extra, m)
        except KeyError as err:
            expected = err
        try:
            actual = cf(x, extra, m)
        except KeyError as err:
            actual = err
        if isinstance(expected, KeyError):
            assert isinstance(actual, KeyError) and actual.args == expected.args
        else:
            assert torch.equal(actual, expected)

    call()  # capture (first entry), then steady state
    call()
    call()  # a break costs two captures; graph backends build on the first replay
    before = refcounts(x, extra, extra[0], m, m.fc, m.fc.weight, fn)
    for _ in range(200):
        call()
    after = refcounts(x, extra, extra[0], m, m.fc, m.fc.weight, fn)
    assert after == before
    e = magpy.explain(cf)
    if path == "graph":
        assert e.graph_count == 1 and e.cache_hits == 202
    elif path == "break":
        # a segment up to the break, and the rest resumed after it: two hits per call
        # (the first calls capture it)
        assert e.graph_count == 2 and e.break_count == 1 and e.cache_hits == 201 and e.resume_hits == 200
    else:
        assert e.cache_entries == 0 and e.cache_misses == 203


def test_results_are_not_leaked():
    def f(x):
        return x * 2, [x + 1]

    magpy.reset()
    cf = magpy.compile(f)
    x = torch.randn(2)
    cf(x)
    out, lst = cf(x)
    assert torch.equal(out, x * 2) and torch.equal(lst[0], x + 1)
    ref = weakref.ref(out)
    assert sys.getrefcount(lst) == 2
    del out, lst
    gc.collect()
    assert ref() is None


def test_compiled_module_does_not_keep_module_alive_after_release():
    m = Small()
    ref = weakref.ref(m)
    cf = magpy.compile(m)
    x = torch.randn(2, 3)
    assert torch.equal(cf(x, [1.0]), m(x, [1.0]))
    assert magpy.explain(cf).graph_count == 1
    del cf, m
    gc.collect()
    assert ref() is None


def test_wrong_arity_raises_like_eager():
    def f(x, y):
        return x + y

    magpy.reset()
    cf = magpy.compile(f)
    with pytest.raises(TypeError) as e1:
        f(torch.ones(1))
    with pytest.raises(TypeError) as e2:
        cf(torch.ones(1))
    assert str(e1.value) == str(e2.value)
    check(f, [Call(torch.ones(1), torch.ones(1))], compiled=cf)


def test_refcounts_restored_after_captures_and_reset():
    m = Small()
    extra = [torch.ones(3)]

    def fn(x, extra, m):
        return m(x, extra) * 2

    magpy.reset()
    cf = magpy.compile(fn, dynamic=False)
    objs = (extra, extra[0], m, m.fc, m.fc.weight, fn, Small, Small.forward)
    before = refcounts(*objs)
    for n in range(1, 11):  # 8 captures, then eager calls past the cache limit
        x = torch.randn(n, 3)
        assert torch.equal(cf(x, extra, m), fn(x, extra, m))
    assert_stats(cf, graphs=8, entries=8, misses=10)
    magpy.reset()
    assert refcounts(*objs) == before


# [Note: replay errors inside try] An op captured inside a try block can raise only at replay,
# on new data with the same guards (an index tensor's values). Eager runs the handler; so must
# the compiled call: the plan gives up (nothing visible has happened yet) and the frame runs
# eagerly. An in-try op after a visible write is not captured (MB014).

def _try_note(cf):
    return [n for n in magpy.explain(cf).notes if "inside a try block raised" in n]


def test_op_raising_at_replay_inside_try_reaches_the_handler():
    def f(x, idx):
        try:
            return x.index_select(0, idx)
        except IndexError:
            return x * 0

    x = torch.randn(4)
    cf = check(f, [(x, torch.tensor([0, 1])), (x, torch.tensor([1, 2])), (x, torch.tensor([1, 9])),
                   (x, torch.tensor([2, 3]))])
    e = assert_stats(cf, graphs=1, breaks=0, hits=3, misses=1)
    assert _try_note(cf), str(e)


def test_op_raising_at_replay_in_a_callee_called_inside_try_reaches_the_handler():
    def pick(x, idx):
        return x[idx] * 2

    def f(x, idx):
        try:
            y = pick(x, idx)
        except IndexError:
            y = x.sum()
        return y + 1

    x = torch.arange(5.0)
    cf = check(f, [(x, torch.tensor([1])), (x, torch.tensor([7])), (x, torch.tensor([4]))])
    assert_stats(cf, graphs=1, breaks=0, hits=2)
    assert _try_note(cf)


def test_op_raising_at_replay_outside_try_raises_after_earlier_writes():
    # No handler in the function: the error leaves the call, after the writes before it, once.
    def f(x, idx, log):
        log.append("before")
        y = x.index_select(0, idx)
        log.append("after")
        return y

    x = torch.randn(4)
    cf = check(f, [(x, torch.tensor([1]), []), (x, torch.tensor([3]), [])])
    assert_stats(cf, graphs=1, breaks=0, hits=1)
    logs = [], []
    for fn, log in zip((f, cf), logs):
        with pytest.raises(IndexError, match="index out of range"):
            fn(x, torch.tensor([9]), log)
    assert logs[0] == logs[1] == ["before"]
    assert_stats(cf, hits=2, misses=1)
    assert not _try_note(cf)


@pytest.mark.parametrize("write", ["append", "inplace", "slot", "own_generator"])
def test_op_inside_try_after_a_visible_write_is_not_captured(write):
    class Box:
        __slots__ = ("n", "gen")  # a slot is not a dict entry: its write is not undone

    def f(x, idx, log, box):
        if write == "append":
            log.append(1)
        elif write == "inplace":
            x.add_(1)
        elif write == "slot":
            box.n = 1
        else:  # a generator of the user's: its state is theirs to see
            x = x + torch.rand(4, generator=box.gen)
        try:
            return x[idx]
        except IndexError:
            return x.sum()

    box_e, box_c = Box(), Box()
    box_e.gen = torch.Generator().manual_seed(0)
    x = torch.arange(4.0)
    gen_state = (lambda: box_e.gen.get_state(), lambda s: box_e.gen.set_state(s))
    cf = check(f, [(x, torch.tensor([1]), [], box_e), (x, torch.tensor([8]), [], box_e)],
               pin=(box_e,), seed=0, snapshot=gen_state[0], restore=gen_state[1])
    assert "MB014" in [b.reason_id for b in magpy.explain(cf).breaks], str(magpy.explain(cf))
    b = next(b for b in magpy.explain(cf).breaks if b.reason_id == "MB014")
    assert "try block" in b.reason and b.hint
    # the compiled callable still gives eager's answers, with the handler's write order
    log = []
    bx, be = Box(), Box()
    bx.gen, be.gen = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    y = cf(x.clone(), torch.tensor([9]), log, bx)
    assert torch.equal(y, f(x.clone(), torch.tensor([9]), [], be))
    assert log == ([1] if write == "append" else [])
    del box_c


def test_keyboard_interrupt_during_capture_reaches_the_program():
    # Signal handlers run inside the engine too (repr() checks signals): the interrupt must
    # still stop the program, leave no tracer, and leave no break site behind.
    import _thread
    import threading

    def spin(n):
        i = 0
        while i < n:
            i += 1
        return torch.ones(2) * i

    cf = magpy.compile(spin)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        cf(50_000_000)
    timer.join()
    assert time.monotonic() - t0 < 30
    assert sys.gettrace() is None
    assert torch.equal(cf(1000), spin(1000))
    assert torch.equal(cf(1000), spin(1000))
    e = magpy.explain(cf)
    assert e.cache_hits == 1 and e.graph_count == 1
    assert any("interrupted" in b.reason for b in e.breaks)


class Flag:
    """A truth value with its own __bool__, which counts its calls."""

    calls = 0

    def __init__(self, on):
        self.on = on

    def __bool__(self):
        Flag.calls += 1
        return self.on


def test_a_branch_into_a_raise_calls_a_users_bool_once_like_eager():
    def f(x, flag):
        if flag:
            raise ValueError("flag set")
        return x + 1

    for on in (False, True):
        magpy.reset()
        cf = magpy.compile(f)
        Flag.calls = 0
        try:
            f(torch.ones(2), Flag(on))
        except ValueError:
            pass
        eager_calls = Flag.calls
        Flag.calls = 0
        try:
            cf(torch.ones(2), Flag(on))
        except ValueError:
            pass
        assert Flag.calls == eager_calls == 1


def test_op_inside_try_after_a_global_draw_is_captured_and_the_handler_draws_as_eager():
    # [Note: draws before a check]: the plan gives up when x[idx] raises, puts the generators
    # back, and the frame that runs again draws the same numbers eager draws.
    import random

    def f(x, idx):
        x = x + torch.rand(4) + random.random()
        try:
            return x[idx]
        except IndexError:
            return x.sum() + torch.rand(1)

    x = torch.arange(4.0)
    calls = [(x, torch.tensor([1])), (x, torch.tensor([2])), (x, torch.tensor([8])),
             (x, torch.tensor([3])), (x, torch.tensor([9]))]
    cf = check(f, calls, seed=0, snapshot=lambda: random.getstate(),
               restore=lambda s: random.setstate(s))
    assert "MB014" not in [b.reason_id for b in magpy.explain(cf).breaks], str(magpy.explain(cf))
    assert _try_note(cf)  # the handler ran eagerly after the plan declined


# [Note: steps that cannot raise on new data] After a visible write, steps in a try block that
# can raise only on what the guards fix (shapes, dtypes) are captured: they raise at replay
# where they raised in the capture, or never. torch 2's Module._call_impl puts a module with
# hooks in such a try (test_newer_library_idioms.py).
def test_ops_inside_try_after_a_write_that_cannot_raise_on_new_data_are_captured():
    def f(x, log, w):
        log.append(len(log))
        try:
            y = torch.relu(F.linear(x, w)) * 2 + x[:, 0:1] - x.T.sum(0).unsqueeze(-1).mean()
            y = F.layer_norm(y, y.shape[-1:]) @ torch.ones(3, 2)
            z = (y > 0).float().softmax(-1), torch.cat([y, y], 1).reshape(2, -1)
        except RuntimeError:
            z = None
        return z

    calls = [(torch.randn(2, 3), [], torch.randn(3, 3)) for _ in range(3)]
    cf = check(f, calls)
    assert_stats(cf, graphs=1, breaks=0, hits=2)


@pytest.mark.parametrize("op", ["index", "floordiv", "sized", "gather"])
def test_ops_inside_try_after_a_write_that_may_raise_on_new_data_still_break(op):
    # an index tensor's values, integer division by zero, a size read from data
    def f(x, i, log):
        log.append(1)
        try:
            if op == "index":
                return x[i]
            if op == "floordiv":
                return x.long() // i
            if op == "sized":
                return x.view(int(i.sum()) + 2, -1)
            return x.gather(0, i)
        except (IndexError, RuntimeError, ZeroDivisionError):
            return None

    x = torch.arange(4.0)
    cf = check(f, [(x, torch.tensor([1]), []), (x, torch.tensor([0]), [])])
    assert "MB014" in [b.reason_id for b in magpy.explain(cf).breaks], str(magpy.explain(cf))


def test_a_view_inside_try_after_a_write_raises_on_strides_the_guards_do_not_fix():
    # (x * 2) keeps x's layout: its view(-1) raises for a transposed x of the same shape
    def f(x, log):
        log.append(1)
        try:
            return (x * 2).view(-1)
        except RuntimeError:
            return x.sum()

    log_e, log_c = [], []
    cf = magpy.compile(f)
    x = torch.arange(4.0).reshape(2, 2)
    for arg in (x, x, x.t(), x.t()):
        want, got = f(arg, log_e), cf(arg, log_c)
        assert torch.equal(got, want) and log_c == log_e
    assert "MB014" in [b.reason_id for b in magpy.explain(cf).breaks], str(magpy.explain(cf))


class _Radd:
    def __radd__(self, other):  # Python of the user's, run by `t + r` at replay
        if float(other.sum()) < 0:
            raise ValueError("negative")
        return other


def _inference_ones():
    with torch.inference_mode():
        return torch.ones(3)


# Each found by a review probe: a step in try after a write that raised at replay on what the
# guards did not fix, so the handler did not run. Now refused (MB014), or the guards fix it.
_UNFIXED = {
    # in place into memory passed in: expanded (one element for three)
    "inplace_expanded": (lambda x, log: x.add_(1), (torch.zeros(3),),
                         (torch.zeros(1).expand(3),)),
    # a 0-dim tensor read as a size
    "tensor_as_size": (lambda t, log: torch.zeros(t), (torch.tensor(2),), (torch.tensor(-1),)),
    # a one-element integer tensor read as a size (a second probe)
    "tensor1d_as_size": (lambda x, n, log: x.repeat(n), (torch.ones(3), torch.tensor([2])),
                         (torch.ones(3), torch.tensor([-1]))),
    # a user object's operator
    "python_operand": (lambda x, r, log: x + r, (torch.ones(3), _Radd()),
                       (-torch.ones(3), _Radd())),
    # an inference tensor saved for backward (now guarded)
    "inference": (lambda x, w, log: w * x, (torch.ones(3), torch.ones(3, requires_grad=True)),
                  (_inference_ones(), torch.ones(3, requires_grad=True))),
    # dimension names that do not match
    "names": (lambda x, w, log: x + w,
              (torch.ones(2, 3, names=("A", "B")), torch.ones(2, 3, names=("A", "B"))),
              (torch.ones(2, 3, names=("A", "B")), torch.ones(2, 3, names=("C", "D")))),
}


@pytest.mark.parametrize("case", sorted(_UNFIXED))
def test_steps_in_try_after_a_write_that_raise_on_what_the_guards_do_not_fix(case):
    op, good, bad = _UNFIXED[case]

    def f(*args):
        log = args[-1]
        log.append(1)
        try:
            op(*args)
            return "done"
        except Exception:
            return "handled"

    import warnings
    cf = magpy.compile(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (named tensors are a prototype)
        for args in (good, good, bad):
            log_e, log_c = [], []
            assert cf(*args, log_c) == f(*args, log_e) and log_c == log_e == [1]


def _patch_forward(m):
    def forward(x):
        raise RuntimeError("patched")
    m.forward = forward


@pytest.mark.parametrize("change", ["kernel_size_list", "forward_on_the_instance",
                                    "weight_of_another_shape"])
def test_a_leaf_module_in_try_after_a_write_is_guarded_whole(change):
    # (a second review probe) what a leaf module let through runs on is guarded: its
    # parameters, buffers and attributes, its class, and no forward set on the instance
    m = {"kernel_size_list": lambda: nn.MaxPool1d([2]),
         "forward_on_the_instance": lambda: nn.ReLU(),
         "weight_of_another_shape": lambda: nn.LayerNorm(4, elementwise_affine=False)}[change]()

    def f(x, log):
        log.append(1)
        try:
            m(x)
            return "done"
        except Exception:
            return "handled"

    cf = magpy.compile(f)
    x = torch.ones(2, 4)
    for i in range(4):
        if i == 2:
            if change == "kernel_size_list":
                m.kernel_size[0] = 9  # larger than the input
            elif change == "forward_on_the_instance":
                _patch_forward(m)
            else:
                m.weight = nn.Parameter(torch.ones(3))
        log_e, log_c = [], []
        assert cf(x, log_c) == f(x, log_e) and log_c == log_e == [1], i


def test_a_step_that_warns_in_try_after_a_write_sees_filters_changed_to_error():
    # (a second review probe) F.softmax without dim warns; a filter set to "error" after the
    # capture makes it raise, and eager's handler runs: warnings.filters is guarded
    import warnings

    def f(x, log):
        log.append(1)
        try:
            F.softmax(x)
            return "done"
        except Exception:
            return "handled"

    cf = magpy.compile(f)
    x = torch.ones(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            log_e, log_c = [], []
            assert cf(x, log_c) == f(x, log_e) == "done" and log_c == log_e
        warnings.simplefilter("error")
        log_e, log_c = [], []
        assert cf(x, log_c) == f(x, log_e) == "handled" and log_c == log_e == [1]
    e = magpy.explain(cf)
    assert e.cache_hits == 2 and any("filters" in str(g) for g in e.guards), e
