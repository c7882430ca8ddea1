"""Engine bugs found by the differential fuzzer (tests/fuzz), minimised to small reproducers.

Each test is marked xfail(strict=True) while the bug is open, so the suite stays green; when
the engine is fixed the test passes, strict xfail turns that into a failure, and the mark (and
the seeds listed for it in test_fuzz.py's KNOWN_BUG_SEEDS) should be removed.
"""

import logging
import sys
import warnings

import pytest
import torch

import magpy
from conftest import assert_stats, break_ids, check


# ---------------------------------------------------------------------------------------------
# 1. A replayed op inside `try` that raises is not caught by the function's own handler.
#
# The first call captures the `try` body without an exception. A later call with the same
# guards (same shapes and dtypes) makes the op raise at replay time, because whether it raises
# depends on tensor data: an index tensor's values, the size of a boolean-mask selection. Eager
# runs the `except` branch; the compiled callable let the exception escape to the caller.
# Fixed: such a step hands the call to eager execution ([Note: replay errors inside try]).
# All 12 mismatching fuzzer seeds of 0..1999 reduce to this (31, 341, 542, 841, 890, 1038,
# 1146, 1226, 1324, 1514, 1566, 1657), e.g. seed 31 to
#     try:
#         z9 = x.index_select(0, idx)
#     except IndexError:
#         pass
# and seed 341 to the same with `x[x > 0].view(-1, 2)` and `except Exception`.
# (test_errors.py::test_op_raising_at_replay_inside_try_reaches_the_handler covers the first.)

def try_index(x, idx):
    try:
        return x[idx]
    except IndexError:
        return x * 0


def try_masked_view(y):
    z = y[y > 0]
    try:
        return z.view(-1, 2)
    except RuntimeError:
        return z + 1


def try_index_with_effects(x, idx, log):
    log.append("before")
    try:
        y = x.index_select(0, idx)
        log.append("after")
    except IndexError:
        y = x - 1
        log.append("handler")
    return y


def test_try_catches_index_error_raised_at_replay():
    x = torch.arange(4.0)
    check(try_index, [(x, torch.tensor([1])), (x, torch.tensor([9]))])


def test_try_catches_view_error_of_masked_selection_at_replay():
    # two positive values: view(-1, 2) works; three: it raises (same guards: shape [5])
    a = torch.tensor([1.0, 2.0, -1.0, -2.0, -3.0])
    b = torch.tensor([1.0, 2.0, 3.0, -2.0, -3.0])
    check(try_masked_view, [a, b])


def test_try_handler_runs_and_effects_match_when_replayed_op_raises():
    x = torch.arange(4.0)
    check(try_index_with_effects, [(x, torch.tensor([1]), []), (x, torch.tensor([9]), [])])


# ---------------------------------------------------------------------------------------------
# 2. Not a mismatch (results are right), but reported by the engine as its own bug: a read of
# an unbound local in the user's code (UnboundLocalError, raised in eager too) was recorded as
# MB099 "magpy could not follow this code (read of a local with no value)" with the hint
# "please report this", where any other exception raised by the user's code is an ordinary
# break (MB006 / MB003). Found by the fuzzer in generated programs that read a variable
# assigned only in a branch that did not run.

def reads_unbound_local(x, flag):
    if flag:
        y = x * 2
    return x + y  # noqa: F821 (UnboundLocalError when flag is false, in eager too)


# The same for a closure cell read before it is assigned (fuzz seeds 500419, 500431, 501031,
# 501108: a generator over a tensor named only later in the function), in the compiled frame's
# own cell (UnboundLocalError) and in a cell an inner function reads (NameError).
def reads_own_cell_early(x, flag):
    if flag:
        u = x * 2
    y = u + x  # noqa: F821 (UnboundLocalError when flag is false, in eager too)
    h = lambda: u  # noqa: E731 (makes u a cell)
    return y, h()


def reads_free_cell_early(x, flag):
    def h():
        return u * 3  # NameError until u is assigned below
    if flag:
        u = x + 1  # noqa: F841
    return h()


@pytest.mark.parametrize("fn, exc, name", [(reads_unbound_local, UnboundLocalError, "y"),
                                           (reads_own_cell_early, UnboundLocalError, "u"),
                                           (reads_free_cell_early, NameError, "u")])
def test_a_read_before_assignment_is_not_an_internal_engine_error(fn, exc, name):
    magpy.reset()
    cf = magpy.compile(fn)
    for _ in range(2):
        with pytest.raises(exc):
            fn(torch.ones(2), False)
        with pytest.raises(exc):
            cf(torch.ones(2), False)
        check(fn, [(torch.ones(2), True)], compiled=cf)
    e = magpy.explain(cf)
    assert "MB099" not in break_ids(cf), str(e)
    assert "MB006" in break_ids(cf), str(e)
    assert any(f"`{name}` is read before it is assigned" in b.reason for b in e.breaks), str(e)
    assert not any("engine error" in n for n in e.notes), str(e)


# Fuzz seed 24197: `torch.sub(g, x, out=t)` resizes t to g's batch; once that batch was a
# symbolic dim, `t.shape[0]` afterwards was recorded as the size t had in the capture.
OUT_SRC = torch.randn(1, 4)


def out_then_reads_its_size(x):
    t = torch.empty(0)
    torch.sub(OUT_SRC, x, out=t)
    return t.mul_(t.shape[0])


def test_out_tensor_takes_the_results_symbolic_size():
    def resize(i):
        b = [1, 2, 3, 4, 2, 4][i]
        OUT_SRC.resize_(b, 4).copy_(torch.full((b, 4), float(i)))

    cf = check(out_then_reads_its_size, [torch.randn(4) for _ in range(6)], mutate=resize)
    assert magpy.explain(cf).cache_entries <= 2


# Fuzz seed 34493 (a crash): `lst.copy()` gave a list value with no object behind it during the
# capture, and `copy += [...]` then read its type through a null pointer.
def copy_then_extend(x, lst):
    out = lst.copy()
    out.insert(0, x * 2)
    out += [x.pow(2)]
    return torch.stack(out).sum(0)


def test_a_copied_list_extended_with_plus_equals():
    lst = [torch.randn(3), torch.randn(3)]
    cf = check(copy_then_extend, [(torch.randn(3), lst) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0)
    assert len(lst) == 2


# Fuzz seed 44613 (torchscript, a wrong result): a region that updated a view of an input in
# place ran to its end under the tracer, then making its graph failed (one of its outputs was a
# list); the backend ran the region's steps again, so the input was updated twice.
class Holder:
    def __init__(self):
        self.buf = torch.arange(5.0)


def updates_a_view_of_an_input(x, holder):
    parts = [torch.sin(x), x]  # a list output of the region: not traceable
    view = holder.buf.reshape(-1)
    for _ in range(2):
        view.add_(view.flip(0))
    return parts, view[[0, 1]].amin(dim=0)


def test_a_region_whose_trace_fails_after_running_keeps_its_results():
    eager_h, compiled_h = Holder(), Holder()
    cf = magpy.compile(updates_a_view_of_an_input, backend="torchscript")
    for _ in range(4):
        x = torch.randn(2, 5)
        want = updates_a_view_of_an_input(x, eager_h)
        got = cf(x, compiled_h)
        assert torch.equal(got[1], want[1])
        assert torch.equal(compiled_h.buf, eager_h.buf)
    # Since regions are cut until no list they build is used after them (the list here was
    # used by the result tuple, which a first cut left outside), the trace no longer fails:
    # the graph covers the sin and the in-place updates, the list stays with the plan.
    notes = magpy.explain(cf).notes
    assert not any("tracing failed" in n for n in notes), notes
    assert magpy.explain(cf).graphs[0]["backend_summary"].startswith("1 TorchScript graph covering 8 of 8")


# Fuzz seed 106876 (an MB099 internal break, no wrong result): `d.setdefault(k, default)` on a
# dict that already held k with `default` itself as its value was taken for an insertion,
# because the value returned was the default object. The guards then said "no key k", so the
# entry never hit, and a later call whose keys changed met an iteration the capture could not
# follow. Whether the key was there is now read before the call.
SHARED = torch.randn(5)


def setdefault_then_keys(x, d):
    t = d.setdefault("c", SHARED)
    return x + t, list(d.keys())


@pytest.mark.parametrize("existing", [None, "same", "other"])
def test_setdefault_of_a_key_already_holding_the_default(existing):
    worlds = []
    for _ in range(2):
        d = {"a": torch.randn(5)}
        if existing:
            d["c"] = SHARED if existing == "same" else torch.ones(5)
        worlds.append(d)
    magpy.reset()
    cf = magpy.compile(setdefault_then_keys)
    for i in range(6):
        if i == 4:
            for d in worlds:
                d["b"] = torch.zeros(5)
        x = torch.randn(3, 5)
        want = setdefault_then_keys(x, worlds[0])
        got = cf(x, worlds[1])
        assert torch.equal(got[0], want[0]) and got[1] == want[1]
        assert list(worlds[1]) == list(worlds[0])
        assert (worlds[1]["c"] is SHARED) == (existing != "other")
    # call 0 (inserting, unless the key is there), call 1 (the key is there), call 4 (new key)
    assert_stats(cf, breaks=0, misses=3 if existing is None else 2,
                 hits=3 if existing is None else 4)


# Fuzz seed 113647 (a wrong result, both backends): the size of `-x[x > 0]` was replayed as
# the number of the first call. Unary operators (-t, +t, ~t) did not pass on that their
# operand's shape depends on data, so `.size(0)` became a constant. Now every recorded step
# whose argument has a data-dependent shape gives a result that has one too (Capture::record).
def _masked(x):
    return x[x > 0]


DATA_SHAPED = {
    "neg_size": lambda x: (-_masked(x)).size(0),
    "pos_shape": lambda x: (+_masked(x)).shape[0],
    "invert_numel": lambda x: (~(_masked(x) > 1)).numel(),
    "neg_len": lambda x: len(-_masked(x)),
    "masked_select_neg": lambda x: (-torch.masked_select(x, x > 0)).size(0),
    "unique_neg": lambda x: (-torch.unique(x.round())).size(0),
    "neg_then_view": lambda x: (-_masked(x)).view(-1, 1).shape,
    "neg_in_list_stack": lambda x: torch.stack([-_masked(x), _masked(x)]).shape,
    "neg_sort_values": lambda x: torch.sort(-_masked(x))[0].size(0),
    "neg_slice_bound": lambda x: x.flatten()[: (-_masked(x)).size(0)],
    "seed_113647": lambda x: (lambda t: (t, t.size(0)))(-_masked(x)),
}


@pytest.mark.parametrize("name", sorted(DATA_SHAPED))
def test_sizes_after_an_op_on_a_data_dependent_shape_are_read_at_replay(name):
    fn = DATA_SHAPED[name]
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(3, 5, generator=gen) for _ in range(6)]
    assert len({int((x > 0).sum()) for x in xs}) > 1  # the mask keeps a different count
    cf = check(fn, xs)
    assert_stats(cf, breaks=0, graphs=1, hits=5)


# Fuzz seed 163290 (torchscript): a result laid out unlike eager's. `x.contiguous()` returns `x`
# itself when `x` is contiguous, and the tracer then takes later uses of `x` for uses of that
# result, so the trace made on the first (contiguous) call computed `x.sub(l)` from
# `x.contiguous()`. Its key did not hold strides, so a transposed `x` ran the same graph and got
# a contiguous result where eager keeps `x`'s layout. Strides are now part of a trace's key.
SELF_RETURNING = {
    "contiguous": lambda x: x.contiguous(),
    "channels_last": lambda x: x.contiguous(memory_format=torch.channels_last),
    "to_channels_last": lambda x: x.to(memory_format=torch.channels_last),
}


@pytest.mark.parametrize("name", sorted(SELF_RETURNING))
def test_an_op_that_returns_its_input_for_one_layout_keeps_later_layouts(name):
    same = SELF_RETURNING[name]
    log = {}

    def fn(x, l):
        kept = same(x)
        log["k"] = x.sub(l)
        return torch.exp(log["k"].clamp(max=3.0)), kept.sum()

    plain = torch.randn(2, 3, 4, 5)
    other = torch.randn(2, 4, 5, 3).permute(0, 3, 1, 2)  # channels-last strides
    strange = torch.randn(5, 4, 3, 2).permute(3, 2, 1, 0)  # neither
    orders = [(plain, plain, other, other, strange, plain), (other, other, plain, strange, plain,
                                                            other)]
    for backend, xs in [(b, xs) for b in ("eager", "torchscript") for xs in orders]:
        magpy.reset()  # a fresh cache for each backend and order
        cf = magpy.compile(fn, backend=backend)
        for x in xs:
            l = torch.randn(5)
            got = cf(x, l)
            got_k = log["k"]
            want = fn(x, l)
            assert got_k.stride() == log["k"].stride() == x.stride(), (backend, x.stride())
            assert got[0].stride() == want[0].stride()
            assert torch.allclose(got[0], want[0]) and torch.allclose(got[1], want[1])
        assert_stats(cf, breaks=0, graphs=1, hits=5)


# Fuzz seed 250528: a warning at stacklevel 2 after a bridge named the bridge's frame (line -1)
# instead of the function's caller. A frame-reading call (`stack_info=True` logging) made the
# rest of the call go on through a bridge, and the bridge called the rest, so its frame sat
# between the caller and the rest of the function. A bridge now returns the rest, which runs
# once the bridge frame has gone ([Note: bridges] in magpy/_resume.py).
def warn_after_a_bridge(x, log):
    log.info("the stack", stack_info=True)  # not replayed: a bridge
    try:
        warnings.warn("from the caller", FutureWarning, stacklevel=2)
        y = x + 1
    except RuntimeError:
        y = x
    return y, sys._getframe(1).f_code.co_name  # the caller, in eager


def calls_it(fn, x, log):
    return fn(x, log)  # the line stacklevel=2 names


@pytest.mark.parametrize("backend", ["eager", "torchscript"])
def test_a_warning_after_a_bridge_names_the_functions_caller(backend):
    log = logging.getLogger("magpy.test.fuzz250528")
    log.addHandler(logging.NullHandler())
    log.propagate = False
    cf = magpy.compile(warn_after_a_bridge, backend=backend)
    for _ in range(3):
        x = torch.randn(3)
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            compiled = calls_it(cf, x, log)
            eager = calls_it(warn_after_a_bridge, x, log)
        assert [(w.filename, w.lineno) for w in got[:1]] == [(w.filename, w.lineno)
                                                             for w in got[1:]]
        assert got[0].filename == __file__
        assert compiled[1] == eager[1] == "calls_it"
        assert torch.equal(compiled[0], eager[0])


# Fuzz seed 252632 (torchscript): a warning shown once per line (the "default" filter) showed
# again after each region was traced. The backend traced under warnings.catch_warnings(),
# which resets every module's warning registry. It now intercepts only TracerWarnings and
# leaves the filters' version, and so the registries, as they were.
def warns_between_regions(x):
    for _ in range(3):
        x = (x * 2).relu().sum(0, keepdim=True).expand(4, 3) + x
        warnings.warn("once per line", UserWarning)
    return x


def test_a_warning_once_per_line_stays_once_across_traces():
    def shown(fn):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("default")
            for n in (4, 4, 4):
                fn(torch.randn(n, 3))
        return [str(w.message) for w in got]

    assert shown(warns_between_regions) == ["once per line"]
    assert shown(magpy.compile(warns_between_regions, backend="torchscript")) == ["once per line"]


# Fuzz seed 465556 (torchscript): `t / s` with a float argument that had become dynamic gave
# -inf where eager gives inf once `s` went from -0.0 to 0.0. A trace bakes the number in, and
# the backend looked a trace up by `==` on such numbers, for which -0.0 == 0.0. Traces (and
# guards) now compare constants with `same_constant`: floats by their bits, NaN equal to NaN.
def divide_by(x, s=0.5):
    return G_ROWS / s, x + 1


G_ROWS = torch.randn(2, 4)


@pytest.mark.parametrize("backend", ["eager", "torchscript"])
def test_a_dynamic_float_that_changes_sign_of_zero_is_not_the_same_constant(backend):
    cf = check(divide_by, [(torch.randn(3), s) for s in
                           (0.5, -0.0, -0.0, 0.0, 0.0, -0.0, float("nan"), float("nan"))],
               backend=backend)
    assert magpy.explain(cf).break_count == 0


# Fuzz seed 330913 (both backends): a warning that an op's C++ code files (`masked_fill_` on
# an expanded tensor: "Use of masked_fill_ on expanded tensors is deprecated") named the caller
# of the compiled function at replay, not the user's line: the op ran from the plan, in C, so
# the innermost Python frame was the caller's; TorchScript graphs logged it to stderr instead.
# Fixed: each step runs under a frame that stands for the one that ran it ([Note: site
# frames] in replay/plan.cpp), and a TorchScript graph's warnings are filed at the step whose op
# they name ([Note: warnings from a graph] in torchscript_backend.cpp).
def fills_an_expanded_view(x):
    t = x.unsqueeze(0).expand(2, -1)
    t.masked_fill_(t > 0.5, 3.0)
    return t


def fills_in_a_helper(x):
    y = x * 2
    return fills_an_expanded_view(y) + 1


def _filed(fn, calls=4, action="always"):
    """The masked_fill_ warnings `fn` files over `calls` calls under `action`: (file, line,
    category, message) each, and the keys the calls added to this module's registry."""
    registry = globals().setdefault("__warningregistry__", {})
    registry.clear()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter(action)
        for _ in range(calls):
            fn(torch.ones(3))
    shown = [(w.filename, w.lineno, w.category, str(w.message)) for w in got
             if "masked_fill_" in str(w.message)]
    return shown, sorted(str(k) for k in registry if k != "version")


@pytest.mark.parametrize("backend", ["eager", "torchscript"])
@pytest.mark.parametrize("fn", [fills_an_expanded_view, fills_in_a_helper],
                         ids=["own_line", "inlined_callee"])
@pytest.mark.parametrize("action", ["always", "default"])
def test_a_warning_from_inside_an_op_names_the_users_line(backend, fn, action):
    eager = _filed(fn, action=action)
    assert eager[0] and eager[0][0][:2] == (__file__, fills_an_expanded_view.__code__.co_firstlineno + 2)
    assert len(eager[0]) == (4 if action == "always" else 1)
    cf = magpy.compile(fn, backend=backend)
    assert _filed(cf, action=action) == eager
    assert magpy.explain(cf).graph_count == 1 and magpy.explain(cf).break_count == 0


# Fuzz seed 582853: a warning given by a step before a point where the replay could still give
# up (here an index inside try that raises on some calls) was given twice: once by the plan,
# once more by the frame that ran eagerly for the handler. Fixed: until its last such step, a
# plan runs with warnings raised as errors, and declines when one comes ([Note: warnings before
# a decline] in replay/plan.cpp).
LOG = []


def warns_then_reads_in_try(x, i):
    copied = torch.tensor(x) * 2  # "To copy construct from a tensor ..." (C++)
    try:
        y = LOG[i]
    except IndexError:
        y = 0
    return copied + y


@pytest.mark.parametrize("backend", ["eager", "torchscript"])
@pytest.mark.parametrize("action", ["always", "default"])
def test_a_warning_before_a_decline_is_given_once(backend, action):
    def given(fn):
        LOG[:] = [1.0]
        registry = globals().setdefault("__warningregistry__", {})
        registry.clear()
        shown = []
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter(action)
            for i in (0, 0, 5, 0, 5):
                out = fn(torch.ones(3), i)
                shown.append([(w.lineno, str(w.message)[:30]) for w in got])
                got.clear()
                shown.append(out.tolist())
        return shown

    eager = given(warns_then_reads_in_try)
    assert sum(len(s) for s in eager[::2]) == (5 if action == "always" else 1)
    cf = magpy.compile(warns_then_reads_in_try, backend=backend)
    assert given(cf) == eager


# Fuzz seeds 970109, 970168, 970587, 970753, 971032 (fx): `torch.tensor(t)` warns from C++
# ("To copy construct from a tensor ..."), and in an fx graph it warned from the generated code:
# the warning named `<eval_with_key>`, not the user's line, so a filter or a log of the user's
# file never saw it. A version of an fx graph whose ops warn now runs the region's steps.
def copies_by_tensor(x):
    y = (x * 2).relu() + 1
    z = torch.tensor(y) * 3  # noqa: the line the warning must name
    return z.sum(0) + y.mean()


@pytest.mark.parametrize("backend", ["eager", "torchscript", "fx"])
@pytest.mark.parametrize("mode", ["always", "default"])
def test_a_warning_from_an_op_in_a_graph_names_the_users_line(backend, mode):
    line = copies_by_tensor.__code__.co_firstlineno + 2
    cf = magpy.compile(copies_by_tensor, backend=backend)
    xs = [torch.randn(2, 3) for _ in range(4)]
    outs = {}
    for fn in (copies_by_tensor, cf):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter(mode)
            outs[fn] = [fn(x) for x in xs]
        assert [(w.filename, w.lineno) for w in got] == [(__file__, line)] * (
            4 if mode == "always" else 1), fn
    assert all(torch.equal(a, b) for a, b in zip(outs[copies_by_tensor], outs[cf]))
