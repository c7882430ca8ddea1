"""`with` blocks over torch's context managers (no_grad, enable_grad, set_grad_enabled,
inference_mode, autocast, nullcontext) are captured: __enter__ and __exit__ are replay steps,
a step that raises leaves through __exit__ as the frame would, and grad mode after the call is
what eager leaves. Also nn.Module's member generators (parameters(), named_modules() ...),
which EMA-style updates under `@torch.no_grad()` iterate."""

import contextlib
import io

import pytest
import torch
import torch.nn as nn

import magpy
from conftest import (assert_raises_like_eager, assert_stats, break_ids, check, module_state,
                      restore_module)

lin = nn.Linear(4, 4)


def no_grad_inside(x):
    y = lin(x)
    with torch.no_grad():
        z = lin(y) * 2
        flag = torch.is_grad_enabled()
    return y + z, z.requires_grad, flag, torch.is_grad_enabled()


def test_no_grad_block_matches_eager_and_restores_grad_mode():
    cf = check(no_grad_inside, [torch.randn(2, 4) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, misses=1, hits=2)
    assert torch.is_grad_enabled()
    plan = magpy.explain(cf).report["graphs"][0]["replay_python"]
    assert "__enter__" in plan and "__exit__" in plan


def nested(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = lin(a)
        c = lin(b)
    return a.requires_grad, b, c


def test_nested_blocks():
    cf = check(nested, [torch.randn(3, 4) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)


def set_grad(x, flag):
    with torch.set_grad_enabled(flag):
        y = lin(x)
    return y, torch.is_grad_enabled()


def test_set_grad_enabled_with_a_flag_recompiles_per_value():
    calls = [(torch.randn(2, 4), f) for f in (True, False, True, False)]
    cf = check(set_grad, calls)
    assert_stats(cf, misses=2, hits=2, breaks=0)


def test_called_under_no_grad_and_outside():
    cf = magpy.compile(no_grad_inside)
    x = torch.randn(2, 4)
    with torch.no_grad():
        got = cf(x)
    want = no_grad_inside(x)
    assert got[0].requires_grad is False and want[0].requires_grad is True
    with torch.no_grad():
        want_ng = no_grad_inside(x)
    for g, w in zip(got[1:], want_ng[1:]):
        assert g == w
    assert torch.is_grad_enabled()


def raises_inside(x, idx):
    with torch.no_grad():
        y = x[idx] * 2  # IndexError at replay when idx grows past the tensor
    return y


def index_error_after_good_calls(fn):
    """fn(x, idx) compiled: three calls with idx in range match eager, then one out of range
    raises eager's IndexError with grad mode back on. Returns the compiled function and the
    compiled call's error."""
    cf = magpy.compile(fn)
    x = torch.randn(4, 3)
    for i in range(3):
        assert torch.equal(cf(x, torch.tensor([i])), fn(x, torch.tensor([i])))
    with pytest.raises(IndexError) as eager_err:
        fn(x, torch.tensor([9]))
    assert torch.is_grad_enabled()
    with pytest.raises(IndexError) as compiled_err:
        cf(x, torch.tensor([9]))
    assert torch.is_grad_enabled(), "the block's __exit__ ran, as the frame's cleanup would"
    assert str(compiled_err.value) == str(eager_err.value)
    return cf, compiled_err


def test_error_inside_block_restores_grad_mode_and_matches_eager():
    _, compiled_err = index_error_after_good_calls(raises_inside)
    # the traceback reaches the user's line
    assert any(f.name == "raises_inside" for f in compiled_err.traceback)


def try_around_block(x, idx):
    try:
        with torch.no_grad():
            y = x[idx] * 2
    except IndexError:
        y = x.sum() * 0
    return y, torch.is_grad_enabled()


def index_calls():
    """Calls with a row index; the third is out of range, so a replayed x[idx] raises."""
    x = torch.randn(4, 3)
    return [(x, torch.tensor([i])) for i in (0, 1, 7, 2)]


def test_error_inside_block_inside_try_runs_the_handler():
    check(try_around_block, index_calls())
    assert torch.is_grad_enabled()


def early_return(x, flag):
    with torch.no_grad():
        if flag:
            return x * 2
        y = x + 1
    return y * 3


def test_early_return_from_inside_the_block():
    cf = check(early_return, [(torch.randn(3), True), (torch.randn(3), False)] * 2)
    assert_stats(cf, breaks=0, misses=2, hits=2)
    assert torch.is_grad_enabled()


def loop_in_block(x, n):
    out = []
    with torch.no_grad():
        for i in range(n):
            out.append(lin(x) * i)
    return out


def test_loop_in_block():
    check(loop_in_block, [(torch.randn(2, 4), 3)] * 3)


def inference(x):
    with torch.inference_mode():
        y = lin(x) + 1
    return y


def test_inference_mode_block():
    cf = check(inference, [torch.randn(2, 4) for _ in range(3)])
    assert_stats(cf, breaks=0, hits=2)
    assert cf(torch.randn(2, 4)).is_inference()


def autocast_block(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.mm(x, w)
    return y, y.dtype, torch.mm(x, w).dtype


def test_autocast_block():
    calls = [(torch.randn(3, 4), torch.randn(4, 5)) for _ in range(3)]
    cf = check(autocast_block, calls)
    assert_stats(cf, breaks=0, hits=2)
    assert cf(*calls[0])[1] == torch.bfloat16


def reads_autocast_state_inside(x):
    with torch.autocast("cpu"):
        on = torch.is_autocast_cpu_enabled()
    return x * 2, on


def test_reading_autocast_state_inside_an_autocast_block_breaks_clearly():
    cf = check(reads_autocast_state_inside, [torch.randn(3)] * 2)
    assert "MB003" in break_ids(cf)
    assert "autocast" in magpy.explain(cf).breaks[0].reason


def null_context(x, ctx_is_none):
    with contextlib.nullcontext():
        y = x + 1
    return y


def test_nullcontext():
    cf = check(null_context, [(torch.randn(3), True)] * 2)
    assert_stats(cf, breaks=0, hits=1)


class StoredContext(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.ctx = torch.no_grad()

    def forward(self, x):
        with self.ctx:
            return self.lin(x)


def test_context_manager_held_by_the_module():
    cf = check(StoredContext(), [torch.randn(2, 4) for _ in range(3)])
    assert_stats(cf, breaks=0, hits=2)


def test_fullgraph_accepts_no_grad():
    cf = magpy.compile(no_grad_inside, fullgraph=True)
    x = torch.randn(2, 4)
    assert torch.equal(cf(x)[0], no_grad_inside(x)[0])


# --- module members and @torch.no_grad() methods (EMA, momentum encoders) ----------------------

class EMA(nn.Module):
    def __init__(self, tau=0.9):
        super().__init__()
        self.online = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
        self.target = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
        self.register_buffer("steps", torch.zeros(()))
        self.tau = tau

    @torch.no_grad()
    def update(self):
        for p_o, p_t in zip(self.online.parameters(), self.target.parameters()):
            p_t.data.mul_(self.tau).add_(p_o.data, alpha=1 - self.tau)
        for name, b in self.named_buffers():
            b.add_(1)

    def forward(self, x):
        y = self.online(x)
        self.update()
        with torch.no_grad():
            t = self.target(x)
        return (y - t).pow(2).mean()


def test_ema_update_in_a_no_grad_method_matches_eager():
    torch.manual_seed(0)
    m_eager, m_comp = EMA(), EMA()
    m_comp.load_state_dict(m_eager.state_dict())
    cf = magpy.compile(m_comp)
    for i in range(4):
        x = torch.randn(3, 4)
        want = m_eager(x)
        got = cf(x)
        assert torch.equal(got, want) and got.requires_grad == want.requires_grad
        for (k, a), (_, b) in zip(m_comp.state_dict().items(), m_eager.state_dict().items()):
            assert torch.equal(a, b), k
    assert_stats(cf, breaks=0, misses=1, hits=3)
    assert torch.is_grad_enabled()


class Members(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
        self.b[0].weight = self.a.weight  # tied: parameters() yields it once

    def forward(self, x):
        total = 0
        for p in self.parameters():
            total = total + p.sum()
        names = [n for n, _ in self.named_parameters()]
        mods = [type(m).__name__ for m in self.modules()]
        kids = [n for n, _ in self.named_children()]
        bufs = [b.shape for b in self.buffers()]
        own = list(self.parameters(recurse=False))
        return x * total, names, mods, kids, bufs, len(own)


def test_member_generators_follow_module_order_and_dedup():
    m = Members()
    cf = check(m, [torch.randn(2, 3) for _ in range(3)])
    assert_stats(cf, breaks=0, hits=2)
    # replacing a parameter (untying) fails the identity guards and recaptures
    m.b[0].weight = nn.Parameter(torch.randn(3, 3))
    check(m, [torch.randn(2, 3)], compiled=cf)
    assert magpy.explain(cf).cache_misses == 2
    # a new submodule changes the structure
    m.c = nn.Linear(3, 3)
    check(m, [torch.randn(2, 3)], compiled=cf)
    assert magpy.explain(cf).cache_misses == 3


class DataSwap(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x):
        with torch.no_grad():
            for p, q in zip(self.a.parameters(), self.b.parameters()):
                q.data = q.data * 0.5 + p.data * 0.5  # BYOL-style: a new tensor for .data
        return self.b(x)


def test_assigning_data_of_a_parameter_is_a_replayed_write():
    torch.manual_seed(0)
    m_eager, m_comp = DataSwap(), DataSwap()
    m_comp.load_state_dict(m_eager.state_dict())
    cf = magpy.compile(m_comp)
    for _ in range(4):
        x = torch.randn(2, 3)
        assert torch.equal(cf(x), m_eager(x))
        assert torch.equal(m_comp.b.weight, m_eager.b.weight)
    assert_stats(cf, breaks=0, hits=3)


# --- breaks inside with blocks ([Note: breaks inside with blocks]) and try blocks ---------------

def branch_inside_no_grad(x):
    y = lin(x)
    with torch.no_grad():
        if y.sum() > 0:  # a branch on tensor data: a break inside the block
            y = y + 1
        z = lin(y) * 2
        inside = torch.is_grad_enabled()
    return y + z, z.requires_grad, inside, torch.is_grad_enabled()


def test_a_break_inside_a_no_grad_block_resumes_inside_it():
    # inputs taking the branch both ways, alternately (`lin` is made with whatever seed the
    # tests before left, so they are picked, not assumed)
    gen = torch.Generator().manual_seed(0)
    pool = [torch.randn(2, 4, generator=gen) * 3 for _ in range(200)]
    ways = [[x for x in pool if bool(lin(x).sum() > 0) == w][:4] for w in (True, False)]
    assert all(len(w) == 4 for w in ways)
    xs = [x for pair in zip(*ways) for x in pair]
    cf = check(branch_inside_no_grad, xs)
    e = assert_stats(cf, breaks=1)
    assert break_ids(cf) == ["MB001"]
    assert e.graph_count == 3  # before the branch, and the rest from either side of it
    assert e.report["eager_calls"] == 0
    assert torch.is_grad_enabled()


def branch_in_nested_blocks(x):
    with torch.no_grad():
        y = x * 2
        with torch.enable_grad():
            if y.sum() > 0:
                y = y * x
            inner = y.requires_grad
        z = y + 1
    return z, inner, z.requires_grad, torch.is_grad_enabled()


def test_a_break_inside_nested_blocks_leaves_both_as_eager_does():
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(3, generator=gen, requires_grad=True) for _ in range(6)]
    cf = check(branch_in_nested_blocks, xs)
    assert magpy.explain(cf).report["eager_calls"] == 0
    assert torch.is_grad_enabled()


def branch_then_index(x, idx):
    with torch.no_grad():
        if x.sum() > -100:
            x = x + 1
        y = x[idx] * 2  # raises at replay for an index out of range
    return y


def test_an_error_after_a_break_inside_a_block_restores_grad_mode():
    cf, _ = index_error_after_good_calls(branch_then_index)
    assert magpy.explain(cf).graph_count == 2


def branch_then_caught(x, idx):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if x.sum() > -100:
            x = x + 1
        try:
            y = (x[idx] @ x.t()).float()  # raises at replay inside the user's try
        except IndexError:
            y = torch.zeros(1)
    return y, torch.is_autocast_cpu_enabled()


def test_a_declined_plan_after_a_break_leaves_the_block_to_the_frame():
    # The resumed plan declines (the step in try raised): the frame runs again from its start,
    # still inside the autocast block, which must be left exactly once.
    check(branch_then_caught, index_calls())
    assert not torch.is_autocast_cpu_enabled()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def io_inside_try(x, path):
    y = x * 2
    try:
        with open(path) as f:  # I/O: a break inside the try block
            text = f.read()
    except OSError:
        text = "missing"
    return y + 1, text


def test_a_break_inside_a_try_block_runs_in_the_frame_under_its_handler(tmp_path):
    present = tmp_path / "a.txt"
    present.write_text("hello")
    calls = [(torch.ones(2), str(present)), (torch.ones(2), str(tmp_path / "none")),
             (torch.ones(2), str(present))]
    cf = check(io_inside_try, calls)
    e = magpy.explain(cf)
    assert e.graph_count >= 1 and e.report["eager_calls"] == 0
    assert any("inside a try block" in n for n in e.notes)


def keyword_call_in_try(x, buf):
    y = x + 1
    try:
        print("a", "b", sep="-", end="!", file=buf)  # writes to a file: a break in the try
    except ValueError:
        pass
    return y


def test_keywords_of_a_call_that_goes_on_in_the_frame_stay_keywords():
    bufs = [io.StringIO(), io.StringIO()]
    cf = magpy.compile(keyword_call_in_try)
    for _ in range(3):
        x = torch.randn(2)
        assert torch.equal(cf(x, bufs[0]), keyword_call_in_try(x, bufs[1]))
    assert bufs[0].getvalue() == bufs[1].getvalue() == "a-b!" * 3
    e = magpy.explain(cf)
    assert break_ids(cf) == ["MB005"] and e.report["eager_calls"] == 0


# What the block's end restores was saved by __enter__ before the resumed capture began (fuzz
# seed 181219): the grad mode after an enable_grad block is the caller's, so a call made under
# no_grad must not replay the `True` a call with grad on saw after the block.
def log_after_inner_block(y, log):
    with torch.enable_grad():
        if y.abs().sum() >= 0:  # a branch on tensor data: a break
            log.append(y.size(1))
    log.append(torch.is_grad_enabled())
    z = y * 2
    return z, z.requires_grad


def under_outer_state(fn, outer, calls, make):
    """Runs fn(x, log) eagerly and compiled, both inside `outer(state)`, for each (state, rows) of
    `calls` on x = make(rows); what each world logged must match. Returns the compiled function
    and (state, compiled result, eager result) per call."""
    logs = [[], []]
    magpy.reset()
    cf = magpy.compile(fn)
    results = []
    for state, rows in calls:
        x = make(rows)
        with outer(state):
            want = fn(x, logs[0])
        with outer(state):
            got = cf(x, logs[1])
        assert logs[0] == logs[1], state
        results.append((state, got, want))
    return cf, results


def test_state_restored_after_a_block_the_resumed_capture_began_inside():
    cf, results = under_outer_state(
        log_after_inner_block, torch.set_grad_enabled,
        [(True, 4), (True, 2), (True, 3), (False, 3), (False, 5), (True, 2), (False, 2)],
        lambda rows: torch.randn(rows, 5, requires_grad=True))
    for mode, got, want in results:
        assert torch.equal(got[0], want[0]) and got[1] == want[1], mode
    assert break_ids(cf) == ["MB001"]
    assert any(".__self__.prev == " in g for g in magpy.explain(cf).guards)


def autocast_after_inner_block(x, log):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if x.abs().sum() >= 0:  # a branch on tensor data: a break inside the block
            log.append(x.size(1))
        inside = (x @ x.t()).dtype
    outside = x @ x.t()  # the caller's autocast state decides its dtype
    if outside.dtype == torch.bfloat16:
        outside = outside * 2
    return inside, outside


def test_autocast_state_restored_after_a_block_the_resumed_capture_began_inside():
    _, results = under_outer_state(
        autocast_after_inner_block,
        lambda on: torch.autocast("cpu", dtype=torch.bfloat16, enabled=on),
        [(False, 4), (False, 2), (False, 3), (True, 3), (True, 5), (False, 2)],
        lambda rows: torch.randn(rows, 3))
    for on, got, want in results:
        assert got[0] == want[0] and got[1].dtype == want[1].dtype, on
        assert torch.equal(got[1], want[1])
    assert not torch.is_autocast_cpu_enabled()


def inference_block_break(x, log):
    with torch.inference_mode():
        if x.abs().sum() >= 0:  # a branch on tensor data: a break inside the block
            log.append(x.size(1))
        y = x * 2
    return y, y.is_inference(), (x + 1).is_inference()


def test_a_break_inside_an_inference_mode_block_runs_the_rest_as_eager_does():
    # inference_mode keeps the mode to restore in a C++ object: the resumed capture stops
    # with a clear reason instead of taking the state after the block as known.
    cf, results = under_outer_state(
        inference_block_break, torch.inference_mode,
        [(False, 4), (False, 2), (False, 3), (True, 3), (False, 5)], lambda rows: torch.randn(rows, 3))
    for on, got, want in results:
        assert torch.equal(got[0], want[0]) and got[1:] == want[1:], on
    reasons = [b.reason for b in magpy.explain(cf).breaks]
    assert any("what the block's end restores is kept where it cannot be checked" in r
               for r in reasons), reasons


@contextlib.contextmanager
def logged_block(log, name):
    log.append(("enter", name))
    yield name.upper()
    log.append(("exit", name))


@contextlib.contextmanager
def maybe_no_grad(flag):
    if flag:
        with torch.no_grad():
            yield
    else:
        yield


def test_contextmanager_functions_of_the_user():
    # [Note: generator context managers]: what the generator does before and after its
    # yield is replayed around the block, in order; `as` binds what it yielded
    def f(x, log):
        with logged_block(log, "proj") as name:
            y = x * len(name)
        with maybe_no_grad(True):
            z = y + 1
        with maybe_no_grad(False):
            w = y * 2
        return z, w

    cf = check(f, [(torch.randn(3, requires_grad=True), []) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)
    log = []
    z, w = cf(torch.randn(3, requires_grad=True), log)
    assert log == [("enter", "proj"), ("exit", "proj")]
    assert not z.requires_grad and w.requires_grad


def test_contextmanager_misuse_and_breaks_inside_stay_exact():
    @contextlib.contextmanager
    def yields_twice():
        yield
        yield

    def twice(x):
        with yields_twice():
            y = x + 1
        return y

    def branch_inside(x, log):
        with logged_block(log, "b"):
            y = x * 2 if x.sum() > 0 else x * 3  # a branch on data inside the block
        return y

    assert_raises_like_eager(twice, lambda: (torch.randn(2),), RuntimeError)
    check(branch_inside, [(torch.randn(4), []) for _ in range(3)])


# --- context manager classes of the user's ([Note: user context managers]) ---------------------

class Scaled:
    """Counts its blocks and scales what runs inside them (state on the object)."""

    def __init__(self, factor):
        self.factor = factor
        self.entered = 0
        self.exited = []

    def __enter__(self):
        self.entered += 1
        return self.factor

    def __exit__(self, exc_type, exc, tb):
        self.exited.append(exc_type.__name__ if exc_type is not None else None)
        return False


class Flagged:
    """Turns a module flag on for the block and puts back what it was."""

    def __init__(self, module):
        self.module = module

    def __enter__(self):
        self.prev = self.module.flag
        self.module.flag = True
        return self

    def __exit__(self, *exc):
        self.module.flag = self.prev


class FlagNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.flag = False

    def forward(self, x):
        with Flagged(self):  # made in the call
            y = self.lin(x) * (2 if self.flag else 1)
        return y + (1 if self.flag else 0)


def test_a_context_manager_class_passed_in_is_traced_through_enter_and_exit():
    def f(x, cm):
        with cm as k:
            y = x * k
        return y + cm.entered, list(cm.exited)

    cms = [Scaled(2.0), Scaled(2.0), Scaled(3.0), Scaled(2.0)]
    cf = check(f, [(torch.randn(3), cm) for cm in cms])
    assert_stats(cf, graphs=2, breaks=0, hits=2)  # the factor is guarded (recompiles at 3.0)
    cm = Scaled(2.0)
    out, exited = cf(torch.ones(3), cm)
    assert cm.entered == 1 and cm.exited == [None] and exited == [None]
    assert torch.equal(out, torch.full((3,), 3.0))


def test_a_context_manager_made_in_the_call_restores_module_state():
    m = FlagNet().eval()
    cf = check(m, [torch.randn(2, 3) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)
    assert m.flag is False


def test_an_error_inside_a_user_block_at_replay_calls_exit_with_it():
    # x[idx] with an index out of range raises inside the block on the third call (a replay):
    # the block's __exit__ sees the IndexError, as it does in eager
    def f(x, idx, cm):
        with cm:
            y = x[idx] * 2
        return y

    x = torch.randn(4, 3)
    eager_cm, compiled_cm = Scaled(1.0), Scaled(1.0)
    magpy.reset()
    cf = magpy.compile(f)
    for i in (0, 1, 7, 2):
        idx = torch.tensor([i])
        outcomes = []
        for fn, cm in ((f, eager_cm), (cf, compiled_cm)):
            try:
                outcomes.append(fn(x, idx, cm))
            except IndexError as e:
                outcomes.append(type(e))
        assert (outcomes[0] is IndexError) == (outcomes[1] is IndexError)
        if outcomes[0] is not IndexError:
            assert torch.equal(outcomes[0], outcomes[1])
    assert eager_cm.exited == compiled_cm.exited == [None, None, "IndexError", None]
    assert eager_cm.entered == compiled_cm.entered == 4
    assert magpy.explain(cf).cache_hits >= 2


class Suppress:
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return exc_type is not None and issubclass(exc_type, KeyError)


def test_a_context_manager_that_may_suppress_breaks_with_a_hint():
    def f(x, cm):
        with cm:
            y = x + 1
        return y

    cf = check(f, [(torch.randn(2), Suppress()) for _ in range(2)])
    assert set(break_ids(cf)) == {"MB004"}
    assert "may suppress the exception" in str(magpy.explain(cf))


def test_an_error_after_a_break_inside_a_user_block_calls_exit_with_it():
    # the block was entered before the resumed capture began: it is reopened there, so an
    # error at replay still reaches __exit__ (and the normal exit is traced)
    def f(x, idx, cm):
        with cm as k:
            y = x * k
            if y.sum() > 0:  # a branch on data: the rest resumes inside the block
                y = y + 1
            z = y[idx]
        return z

    x = torch.randn(4, 3).abs()
    eager_cm, compiled_cm = Scaled(1.0), Scaled(1.0)
    magpy.reset()
    cf = magpy.compile(f)
    for i in (0, 1, 7, 2, 9, 3):
        for fn, cm in ((f, eager_cm), (cf, compiled_cm)):
            try:
                fn(x, torch.tensor([i]), cm)
            except IndexError:
                pass
    assert eager_cm.exited == compiled_cm.exited == [None, None, "IndexError", None, "IndexError",
                                                     None]
    assert eager_cm.entered == compiled_cm.entered == 6
    assert magpy.explain(cf).graph_count >= 2


class SuppressIf:
    def __init__(self):
        self.suppress = True

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        return True if self.suppress else None  # one RETURN_VALUE, reached from two constants


class SuppressOr(SuppressIf):
    def __exit__(self, et, ev, tb):
        return self.suppress or None


@pytest.mark.parametrize("cls", [SuppressIf, SuppressOr])
def test_an_exit_that_returns_a_computed_value_through_a_jump_breaks(cls):
    # found by a probe: the check looked only at the instruction before each return
    def f(x, idx, cm):
        y = x * 2
        with cm:
            y = x[idx] * 3
        return y

    x = torch.arange(12.).reshape(4, 3)
    cf = check(f, [(x, torch.tensor([i]), cls()) for i in (0, 1, 9)])
    assert set(break_ids(cf)) == {"MB004"}


class LoudAttrs:
    """Logs every attribute read through its own __getattribute__ (which `with` never uses)."""

    reads = []

    def __getattribute__(self, name):
        LoudAttrs.reads.append(name)
        return object.__getattribute__(self, name)

    def __enter__(self):
        return 2

    def __exit__(self, *exc):
        return None


def test_the_exit_of_a_user_block_is_bound_through_the_class():
    # found by a probe: the replay read obj.__exit__, which ran the class's __getattribute__
    def f(x, cm):
        with cm as k:
            y = x * k
        return y

    cm = LoudAttrs()
    cf = check(f, [(torch.randn(3), cm) for _ in range(3)], pin=(cm,))
    LoudAttrs.reads.clear()
    cf(torch.randn(3), cm)
    f(torch.randn(3), cm)
    assert LoudAttrs.reads == []


@contextlib.contextmanager
def caught_scope(log):
    log.append("in")
    try:
        yield 3
    except IndexError:
        log.append("caught")
    finally:
        log.append("finally")


def test_a_contextmanager_whose_yield_is_in_a_try_stays_exact_after_a_visible_write():
    # found by a probe: an error in the block at replay never reached the generator's handler.
    # The block's ops are inside a try of the plan's; the append before them is visible, so
    # the plan could not hand a failing call to eager execution: a break (MB014).
    def f(x, idx, log):
        y = x[0]
        with caught_scope(log) as k:
            y = x[idx] * k
        return y

    x = torch.arange(12.).reshape(4, 3)
    cf = check(f, [(x, torch.tensor([i]), []) for i in (0, 1, 9, 2)])
    assert "MB014" in break_ids(cf)


_MODE = {"name": "idle"}


@contextlib.contextmanager
def mode_scope(name, model):
    # the common shape: state set before the yield, put back in finally
    old, was = _MODE["name"], model.training
    _MODE["name"] = name
    model.eval()
    try:
        yield len(name)
    except IndexError:
        _MODE["caught"] = _MODE.get("caught", 0) + 1
    finally:
        _MODE["name"] = old
        model.train(was)


def test_a_contextmanager_whose_yield_is_in_a_try_is_captured_and_runs_its_handler():
    # Its block is one graph with the rest; where an op in the block raises on new data at
    # replay, the writes before it are put back and the call runs eagerly, so the generator's
    # handler and finally run as in eager.
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))

    def f(x, idx):
        y = x.sum()
        with mode_scope("infer", model) as k:
            y = model(x)[idx] * k + len(_MODE["name"])
        _MODE["after"] = True  # (a write: the ops after it are outside the try)
        return y * 2

    def snapshot():
        return dict(_MODE), model.training

    def restore(s):
        _MODE.clear()
        _MODE.update(s[0])
        model.train(s[1])

    x = torch.randn(4, 3)
    cf = check(f, [(x, torch.tensor([i])) for i in (0, 1, 9, 2, 7)],
               snapshot=snapshot, restore=restore)
    assert _MODE["name"] == "idle" and _MODE["caught"] == 2 and model.training
    e = magpy.explain(cf)
    assert e.break_count == 0 and e.graph_count == 1, e
    assert any("ran eagerly for its handler" in n for n in e.notes), e.notes


class GradOff:
    def __init__(self):
        self.log = []

    def __enter__(self):
        self.log.append("enter")
        self.prev = torch.is_grad_enabled()
        torch.set_grad_enabled(False)

    def __exit__(self, et, ev, tb):
        self.log.append(("exit", et.__name__ if et else None))
        torch.set_grad_enabled(self.prev)


def test_fullgraph_error_inside_a_block_leaves_through_its_exit():
    # found by a probe: the GraphBreakError was raised again inside the block's cleanup, so
    # __exit__ never ran (grad mode stayed off, for torch.no_grad() too)
    def f(x, cm):
        with cm:
            if x.sum() > 0:  # MB001
                x = x + 1
        return x

    def g(x):
        with torch.no_grad():
            if x.sum() > 0:
                x = x + 1
        return x

    cm = GradOff()
    with pytest.raises(magpy.GraphBreakError):
        magpy.compile(f, fullgraph=True)(torch.ones(2), cm)
    assert cm.log == ["enter", ("exit", "GraphBreakError")]
    assert torch.is_grad_enabled()
    with pytest.raises(magpy.GraphBreakError):
        magpy.compile(g, fullgraph=True)(torch.ones(2))
    assert torch.is_grad_enabled()


def test_fullgraph_error_runs_finally_clauses_on_its_way_out():
    # found by a probe: a GraphBreakError was raised again at the first instruction of a
    # finally clause, so its body never ran (grad mode and the log stayed as the try left them)
    log = []

    def restore(prev):
        torch.set_grad_enabled(prev)
        log.append("restored")

    def f(x, flag):
        prev = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        try:
            try:
                if x.sum() > 0:  # MB001
                    x = x + 1
            finally:
                if flag:
                    log.append("inner")
                for i in range(2):
                    log.append(i)
            return x
        finally:
            restore(prev)

    for flag in (True, False):
        log.clear()
        with pytest.raises(magpy.GraphBreakError, match="MB001"):
            magpy.compile(f, fullgraph=True)(torch.ones(2), flag)
        assert torch.is_grad_enabled()
        assert log == (["inner"] if flag else []) + [0, 1, "restored"]


def test_fullgraph_error_is_not_swallowed_by_a_finally_that_returns():
    def f(x):
        try:
            if x.sum() > 0:  # MB001
                x = x + 1
        finally:
            return x  # noqa: B012 (swallows any exception in eager)

    with pytest.raises(magpy.GraphBreakError, match="MB001"):
        magpy.compile(f, fullgraph=True)(torch.ones(2))


class FailingExit:
    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        raise ValueError("exit failed")


def test_fullgraph_error_reaches_the_caller_over_an_error_its_unwinding_raised():
    # found by a probe: an __exit__ (or finally) raising while the GraphBreakError passed
    # replaced it, so `except magpy.GraphBreakError` missed the break
    def f(x):
        with FailingExit():
            if x.sum() > 0:  # MB001
                x = x + 1
        return x

    def g(x):
        try:
            x = x * float(bool(x.sum() > 0))  # MB002
        finally:
            raise KeyError("from finally")

    for fn, other in ((f, ValueError), (g, KeyError)):
        with pytest.raises(magpy.GraphBreakError, match="MB00[12]") as info:
            magpy.compile(fn, fullgraph=True)(torch.ones(2))
        assert isinstance(info.value.__context__, other)
        assert info.value.__context__.__context__ is None  # no cycle back to the break
        assert other.__name__ in "".join(info.value.__notes__)
    # eager and the plain wrapper raise the other error, as Python does
    with pytest.raises(ValueError):
        magpy.compile(f)(torch.ones(2))


class Wrapping:
    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is not None:
            raise RuntimeError("wrapped") from ev


def test_an_exit_that_raises_at_replay_has_the_user_frame_in_its_traceback():
    # found by a probe: the error __exit__ raised during a replay's unwinding lacked the frame
    # of the compiled function, which eager's has
    import traceback

    def f(x, idx, cm):
        with cm:
            z = x[idx] * 2
        return z

    x = torch.arange(12.).reshape(4, 3)
    cf = magpy.compile(f)
    for i in (0, 1, 9):
        names = []
        for fn in (f, cf):
            try:
                fn(x, torch.tensor([i]), Wrapping())
                names.append(None)
            except RuntimeError as e:
                assert isinstance(e.__cause__, IndexError)
                names.append([fr.name for fr in traceback.extract_tb(e.__traceback__)][-2:])
        assert names[0] == names[1]
    assert names[0] == ["f", "__exit__"]
    assert magpy.explain(cf).cache_hits >= 1
