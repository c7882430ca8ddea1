"""Training steps compiled whole: backward(), optimizer and scheduler steps are recorded as ops
whose effects the capture cannot see inside ([Note: library calls that change state]). They
must run exactly once per call, and what they change must be read afresh after them.
Found by a review probe: gradients doubled and learning rates read stale."""

import copy
import functools
import operator
import types
import weakref
import warnings

import pytest
import torch

import magpy
from conftest import equal

warnings.filterwarnings("ignore", message=".*lr_scheduler.*")


class Trainer:
    def __init__(self, gamma=0.5):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(3, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.5, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=gamma)
        self.step_no = 0
        self.lrs = []

    def train_step(self, x, y):
        self.opt.zero_grad()
        loss = (self.model(x) - y).square().mean()
        loss.backward()
        self.opt.step()
        self.sched.step()
        self.step_no += 1
        self.lrs.append(self.opt.param_groups[0]["lr"])  # read after sched.step()
        if self.step_no % 2 == 0:  # a counter that becomes dynamic, checked after the steps
            return loss.detach(), "logged"
        return loss.detach(), "quiet"


def state(t):
    return ([p.detach().clone() for p in t.model.parameters()], t.sched.last_epoch,
            t.sched._step_count, t.step_no, list(t.lrs))  # (opt._step_count: torch < 2 only)


def test_optimizer_and_scheduler_steps_run_once_and_their_writes_are_read_after_them():
    eager, comp = Trainer(), Trainer()
    step = magpy.compile(comp.train_step)
    for i in range(8):
        x, y = torch.randn(4, 3), torch.randn(4, 1)
        want, got = eager.train_step(x, y), step(x, y)
        assert equal(got[0], want[0]) and got[1] == want[1], i
        (pe, *se), (pc, *sc) = state(eager), state(comp)
        assert all(equal(a, b) for a, b in zip(pe, pc)), i
        assert se == sc, i
    r = magpy.explain(step)
    assert r.cache_hits >= 4
    # a read of param_groups after a step that may write them is where the capture breaks:
    # after sched.step() (torch 1.13), or, where the scheduler's step is Python the capture
    # follows (torch 2.11, the device run), its own read after opt.step()
    assert any(b.reason_id == "MB008" and ("StepLR" in b.reason or "SGD.step" in b.reason)
               for b in r.breaks), r.breaks


def test_backward_runs_once_when_a_later_check_fails():
    # `i % 2` becomes dynamic after two calls: its branch is checked at replay, after
    # backward() ran; a failed check must not capture again (backward would run twice).
    def step(w, i):
        (w * 2.0).sum().backward()
        if i % 2 == 1:
            w.grad = None
        return i

    cf = magpy.compile(step)
    we, wc = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    for i in range(6):
        assert step(we, i) == cf(wc, i)
        assert (we.grad is None) == (wc.grad is None), i
        if we.grad is not None:
            assert equal(we.grad, wc.grad), i


def test_autograd_backward_on_a_data_dependent_size_branch():
    def step(w, x):
        loss = (w * x).sum()
        torch.autograd.backward([loss])
        pos = x[x > 0]
        if pos.shape[0] > 1:
            return pos.sum()
        return pos.mean()

    cf = magpy.compile(step)
    we, wc = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    for x in ([1.0, -1.0, 2.0], [3.0, -1.0, 2.0], [-1.0, -1.0, 2.0], [1.0, 1.0, 1.0]):
        x = torch.tensor(x)
        assert equal(step(we, x), cf(wc, x))
        assert equal(we.grad, wc.grad)


def test_scheduler_state_returned_after_its_step():
    def make():
        w = torch.zeros(1, requires_grad=True)
        w.grad = torch.ones(1)
        opt = torch.optim.SGD([w], lr=1.0)
        return w, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    def step(opt, sched):
        opt.step()
        sched.step()
        return opt.param_groups[0]["lr"], sched.last_epoch, sched._step_count

    (we, oe, se), (wc, oc, sc) = make(), make()
    cf = magpy.compile(step)
    for i in range(5):
        assert step(oe, se) == cf(oc, sc), i
        assert equal(we, wc), i


def test_gradient_accumulation_steps_every_other_call():
    eager = torch.nn.Linear(2, 1)
    comp = copy.deepcopy(eager)
    opt_e = torch.optim.Adam(eager.parameters(), lr=0.1)
    opt_c = torch.optim.Adam(comp.parameters(), lr=0.1)

    def make_step(model, opt):
        counter = {"n": 0}

        def step(x):
            loss = model(x).square().mean() / 2
            loss.backward()
            counter["n"] += 1
            if counter["n"] % 2 == 0:
                opt.step()
                opt.zero_grad()
            return loss.detach()

        return step

    se, sc = make_step(eager, opt_e), magpy.compile(make_step(comp, opt_c))
    for i in range(12):
        x = torch.randn(5, 2)
        assert equal(se(x), sc(x)), i
        for p, q in zip(eager.parameters(), comp.parameters()):
            assert equal(p, q), i
    # the counter changes every call and is tested after backward(): a break there, not a
    # guard on its value (which recompiled on every call until the cache limit)
    r = magpy.explain(sc)
    assert r.cache_hits >= 8 and any(b.reason_id == "MB001" for b in r.breaks), r


def test_gradient_clipping_over_the_parameters_generator():
    # clip_grad_norm_(model.parameters(), c) takes a generator: the op gets the list of its
    # items at replay (MB009, the whole call eager, before).
    eager = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    comp = copy.deepcopy(eager)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(comp.parameters(), lr=0.1)

    def make_step(model, opt):
        def step(x):
            opt.zero_grad()
            loss = model(x).square().mean() * 10
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
            opt.step()
            return loss.detach(), norm

        return step

    se, sc = make_step(eager, opt_e), magpy.compile(make_step(comp, opt_c))
    for i in range(5):
        x = torch.randn(6, 3)
        (le, ne), (lc, nc) = se(x), sc(x)
        assert equal(le, lc) and equal(ne, nc), i
        for p, q in zip(eager.parameters(), comp.parameters()):
            assert equal(p, q) and equal(p.grad, q.grad), i
    r = magpy.explain(sc)
    assert (r.graph_count, r.break_count) == (1, 0) and r.cache_hits == 4, r


def _sgd():
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    return m, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def test_state_the_function_wrote_or_made_is_not_read_from_its_copy_after_a_step():
    # review probe: a group's lr written by the function, then changed by sched.step(), and a
    # dict made in the call given to add_param_group, were read back from the capture's copy
    def warm(m, opt, sched, x):
        g = opt.param_groups[0]
        g["lr"] = 0.4
        m(x).sum().backward()
        opt.step()
        sched.step()
        return g["lr"], sched.last_epoch

    def add_group(m, opt, sched, x):
        d = {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.1}
        opt.add_param_group(d)
        return len(d), d.get("momentum"), sorted(d)

    for fn in (warm, add_group):
        e, c = _sgd(), _sgd()
        cf = magpy.compile(fn)
        for i in range(4):
            x = torch.randn(2, 3)
            assert fn(*e, x) == cf(*c, x), (fn.__name__, i)


def test_state_an_optimizer_closure_writes_is_read_after_the_step():
    x, y = torch.randn(5, 3), torch.randn(5, 1)

    def make():
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 1)
        return m, torch.optim.LBFGS(m.parameters(), lr=0.1, max_iter=4), []

    def step(m, opt, hist):
        def closure():
            opt.zero_grad()
            loss = (m(x) - y).square().mean()
            loss.backward()
            hist.append(loss.item())
            return loss

        opt.step(closure)
        return len(hist), hist[-1]

    e, c = make(), make()
    cf = magpy.compile(step)
    for i in range(4):
        assert step(*e) == cf(*c), i


def test_a_generator_given_to_a_torch_function_runs_between_its_steps():
    # vector_to_parameters writes each parameter the generator yields before resuming it
    def make():
        return [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]

    def f(params, vec):
        seen = []

        def gen():
            for p in params:
                yield p
                seen.append(float(p.sum()))

        torch.nn.utils.vector_to_parameters(vec, gen())
        return seen

    pe, pc = make(), make()
    cf = magpy.compile(f)
    for i in range(4):
        vec = torch.full((5,), float(i + 1))
        assert f(pe, vec) == cf(pc, vec), i


@pytest.mark.parametrize("through", ["closure", "default"])
def test_state_a_gradient_hook_writes_during_backward_is_read_after_it(through):
    # a review probe: `backward()` ran the hook at replay, but the count read after it was the
    # one guarded at entry (the hook reaches its state through a closure or a default)
    def make():
        w = torch.ones(3, requires_grad=True)
        st = {"n": 0}

        def by_closure(g):
            st["n"] += 1
            return g

        def by_default(g, s=st):
            s["n"] += 1
            return g

        w.register_hook(by_closure if through == "closure" else by_default)
        return w, st

    def step(w, st, x):
        (w * x).sum().backward()
        return st["n"]

    e, c = make(), make()
    cf = magpy.compile(step)
    for i in range(5):
        x = torch.randn(3)
        assert step(*e, x) == cf(*c, x), i
        assert equal(e[0].grad, c[0].grad), i


def test_state_a_hook_registered_in_the_call_writes_is_read_after_backward():
    # a review probe: the hook on an intermediate, made and registered in the call, ran at
    # replay, but the length read after backward() was the one the capture saw
    def step(w, rec, x):
        y = w * x
        y.register_hook(lambda g: rec.append(1))
        y.sum().backward()
        return len(rec)

    we, wc = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    re_, rc = [], []
    cf = magpy.compile(step)
    for i in range(4):
        x = torch.randn(3)
        assert step(we, re_, x) == cf(wc, rc, x), i
        assert re_ == rc and equal(we.grad, wc.grad), i


# [Note: code that ran inside a call] The Python that backward() ran is seen as it runs: what
# it reaches (through its arguments, closures, defaults and the module globals it names) is
# read afresh after it, and the hooks of the tensors passed in are guarded.
HOOK_CALLS = 0
HOOK_STATS = {"n": 0}


def _count_global(g):
    global HOOK_CALLS
    HOOK_CALLS += 1


def _count_in_global_dict(g):
    HOOK_STATS["n"] += 1


class _Doubling(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        HOOK_STATS["n"] += 1
        return g * 2


def _hook_counts(kind):
    """(make, step): make() builds fresh state, step(state, x) returns what the hook wrote."""
    if kind == "leaf hook rebinds a global":
        def make():
            global HOOK_CALLS
            HOOK_CALLS = 0
            w = torch.ones(3, requires_grad=True)
            w.register_hook(_count_global)
            return w

        def step(w, x):
            (w * x).sum().backward()
            return HOOK_CALLS
    elif kind == "leaf hook writes a global dict":
        def make():
            HOOK_STATS["n"] = 0
            w = torch.ones(3, requires_grad=True)
            w.register_hook(_count_in_global_dict)
            return w

        def step(w, x):
            (w * x).sum().backward()
            return HOOK_STATS["n"]
    elif kind == "custom Function's backward":
        def make():
            HOOK_STATS["n"] = 0
            return torch.ones(3, requires_grad=True)

        def step(w, x):
            _Doubling.apply(w * x).sum().backward()
            return HOOK_STATS["n"]
    elif kind == "module backward hook":
        def make():
            torch.manual_seed(0)
            lin = torch.nn.Linear(3, 1)
            lin.calls = 0

            def hook(mod, grad_in, grad_out):
                mod.calls += 1
            lin.register_full_backward_hook(hook)
            return lin

        def step(lin, x):
            lin(x).sum().backward()
            return lin.calls
    return make, step


@pytest.mark.parametrize("kind", ["leaf hook rebinds a global", "leaf hook writes a global dict",
                                  "custom Function's backward", "module backward hook"])
def test_state_written_by_code_backward_runs_is_read_after_it(kind):
    # a review probe: each of these read the count guarded at entry on a cache hit
    make, step = _hook_counts(kind)
    outs = []
    for compiled in (False, True):
        w = make()
        f = magpy.compile(step) if compiled else step
        outs.append([f(w, torch.full((3,), float(i))) for i in range(5)])
    assert outs[0] == outs[1] == [1, 2, 3, 4, 5]


def test_a_hook_registered_between_calls_recompiles():
    # a review probe: no guard held a leaf's hooks, so a hook registered after the capture ran
    # at replay while the count read after backward() was the one guarded at entry
    def run(compiled):
        st = {"n": 0}
        w = torch.ones(3, requires_grad=True)

        def step(x):
            (w * x).sum().backward()
            return st["n"]
        f = magpy.compile(step) if compiled else step
        out = []
        for i in range(5):
            if i == 2:
                w.register_hook(lambda g: st.__setitem__("n", st["n"] + 1))
            out.append(f(torch.full((3,), float(i))))
        return out, f

    (want, _), (got, f) = run(False), run(True)
    assert got == want == [0, 0, 1, 2, 3]
    assert any("hook_ids(" in g for g in magpy.explain(f).guards)


def test_a_hook_on_an_intermediate_passed_in_is_seen():
    def run(compiled):
        st = {"n": 0}
        w = torch.ones(3, requires_grad=True)

        def step(h, x):
            (h * x).sum().backward()
            return st["n"]
        f = magpy.compile(step) if compiled else step
        out = []
        for i in range(5):
            h = w * 2
            h.register_hook(lambda g: st.__setitem__("n", st["n"] + 1))
            out.append(f(h, torch.full((3,), float(i))))
        return out

    assert run(False) == run(True) == [1, 2, 3, 4, 5]


def test_a_hook_that_writes_nothing_keeps_the_training_step_one_graph():
    def make():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        for p in model.parameters():
            p.register_hook(lambda g: g.clamp(-0.1, 0.1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x):
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step

    (me, se), (mc, sc) = make(), make()
    f = magpy.compile(sc)
    for i in range(4):
        x = torch.randn(2, 3) * 10
        assert equal(se(x), f(x)), i
        assert all(equal(a, b) for a, b in zip(me.parameters(), mc.parameters())), i
    r = magpy.explain(f)
    assert r.graph_count == 1 and not r.breaks, r.breaks


# More ways a hook reaches state, from a review of the rule above (each read the count stale)
class _HookStats:
    n = 0


_hook_module = types.ModuleType("magpy_test_hook_counters")
_hook_module.counter = 0


class _Slotted:
    __slots__ = ("inner",)

    def __init__(self):
        self.inner = {"n": 0}


def _reach(kind):
    """make() -> (w, read): a leaf whose hook counts its calls somewhere, and a reader."""
    w = torch.ones(3, requires_grad=True)
    if kind == "a C method":
        grads = []
        w.register_hook(grads.append)
        return w, lambda: len(grads)
    if kind == "a partial of a C function":
        d = {"g": None, "n": 0}
        w.register_hook(functools.partial(operator.setitem, d, "g"))
        return w, lambda: d["g"] is not None and float(d["g"].sum())
    if kind == "nonlocal":
        count = 0

        def hook(g):
            nonlocal count
            count += 1
        w.register_hook(hook)
        return w, lambda: count
    if kind == "a weak reference":
        class Owner:
            calls = 0
        owner = Owner()
        ref = weakref.ref(owner)
        w.register_hook(lambda g: setattr(ref(), "calls", ref().calls + 1))
        w._owner = owner
        return w, lambda: owner.calls
    if kind == "a class attribute":
        _HookStats.n = 0

        def hook(g):
            _HookStats.n += 1
        w.register_hook(hook)
        return w, lambda: _HookStats.n
    if kind == "a module attribute":
        _hook_module.counter = 0

        def hook(g):
            _hook_module.counter += 1
        w.register_hook(hook)
        return w, lambda: _hook_module.counter
    if kind == "__slots__":
        h = _Slotted()
        inner = h.inner
        w.register_hook(lambda g: inner.__setitem__("n", h.inner["n"] + 1))
        return w, lambda: inner["n"]


@pytest.mark.parametrize("kind", ["a C method", "a partial of a C function", "nonlocal",
                                  "a weak reference", "a class attribute", "a module attribute",
                                  "__slots__"])
def test_state_a_hook_reaches_is_read_after_backward(kind):
    outs = []
    for compiled in (False, True):
        w, read = _reach(kind)

        def step(x):
            (w * x).sum().backward()
            return read()
        f = magpy.compile(step) if compiled else step
        outs.append([f(torch.full((3,), float(i + 1))) for i in range(5)])
    assert outs[0] == outs[1]


def test_a_hook_on_a_parameter_of_a_called_module_registered_between_calls():
    def run(compiled):
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 1)
        st = {"n": 0}

        def step(x):
            m(x).sum().backward()
            return st["n"]
        f = magpy.compile(step) if compiled else step
        out = []
        for i in range(5):
            if i == 2:
                m.weight.register_hook(lambda g: st.__setitem__("n", st["n"] + 1))
            out.append(f(torch.full((2, 3), float(i + 1))))
        return out

    assert run(False) == run(True) == [0, 0, 1, 2, 3]


def test_hooks_registered_and_removed_in_each_call_do_not_recompile():
    # a review probe: the hook guard was taken during backward(), with the call's own hooks
    # still on, so it failed at every next call
    def make():
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)

        def step(x):
            hs = [p.register_hook(lambda g: g.clamp(-1, 1)) for p in m.parameters()]
            opt.zero_grad()
            m(x).sum().backward()
            opt.step()
            for h in hs:
                h.remove()
            return m.weight.sum()
        return step

    se, sc = make(), make()
    cf = magpy.compile(sc)
    for i in range(8):
        x = torch.full((2, 3), float(i))
        assert equal(se(x), cf(x)), i
    assert magpy.explain(cf).cache_hits >= 6


# `p.grad` read by hand (clipping, norms, accumulation checks): an input before anything in
# the call changes gradients, read at replay after (it was a break, MB007, and the whole step
# ran eagerly)
def _grad_step(kind):
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def step(x):
        had = [p.grad is not None for p in m.parameters()]
        if kind == "set to none":
            for p in m.parameters():
                p.grad = None
        else:
            opt.zero_grad()
        loss = m(x).square().mean()
        loss.backward()
        norm = torch.stack([p.grad.norm() for p in m.parameters()]).norm()
        for p in m.parameters():
            if p.grad is not None:
                p.grad.clamp_(-0.5, 0.5)
        opt.step()
        return loss.detach(), norm, had
    return m, step


@pytest.mark.parametrize("kind", ["zero_grad", "set to none"])
def test_gradients_read_by_hand_in_a_training_step(kind):
    (me, se), (mc, sc) = _grad_step(kind), _grad_step(kind)
    cf = magpy.compile(sc)
    for i in range(6):
        x = torch.randn(3, 4) * (i + 1)
        (le, ne, he), (lc, nc, hc) = se(x), cf(x)
        assert equal(le, lc) and equal(ne, nc) and he == hc, i
        assert all(equal(a, b) for a, b in zip(me.parameters(), mc.parameters())), i
        assert all(equal(a.grad, b.grad) for a, b in zip(me.parameters(), mc.parameters()))
    r = magpy.explain(cf)
    # (two: the first call finds no gradients yet, the next ones find them)
    assert r.graph_count == 2 and not r.breaks and r.cache_hits >= 4, r


def test_a_gradient_that_is_none_after_backward_breaks_and_is_correct():
    def make():
        torch.manual_seed(0)
        a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)  # b is not in the loss

        def step(x):
            a(x).sum().backward()
            return [p.grad is None for p in list(a.parameters()) + list(b.parameters())]
        return step

    se, sc = make(), make()
    cf = magpy.compile(sc)
    for i in range(4):
        x = torch.randn(1, 2)
        assert se(x) == cf(x), i


def test_a_gradient_cleared_between_calls_outside_the_loss_is_read_afresh():
    # a review probe: `p.grad is not None` after backward() replayed as True for a parameter
    # outside this step's loss whose gradient the caller cleared between calls
    def make():
        torch.manual_seed(0)
        a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        b(torch.ones(1, 2)).sum().backward()  # b has gradients at first

        def step(x):
            a(x).sum().backward()
            return [p.grad is not None for p in list(a.parameters()) + list(b.parameters())]
        return b, step

    (be, se), (bc, sc) = make(), make()
    cf = magpy.compile(sc)
    for i in range(5):
        if i == 2:
            for m in (be, bc):
                for p in m.parameters():
                    p.grad = None
        x = torch.randn(1, 2)
        assert se(x) == cf(x), i


def test_gradients_of_a_loss_passed_in_are_read_afresh():
    def make():
        torch.manual_seed(0)
        ha, hb = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)

        def step(loss):
            loss.backward()
            return [p.grad is not None for p in list(ha.parameters()) + list(hb.parameters())]
        return ha, hb, step

    (ae, be, se), (ac, bc, sc) = make(), make()
    cf = magpy.compile(sc)
    for i in range(6):
        x = torch.randn(3, 2)
        for a, b in ((ae, be), (ac, bc)):
            for p in list(a.parameters()) + list(b.parameters()):
                p.grad = None
        le = (ae(x).sum() + be(x).sum()) if i % 2 == 0 else be(x).sum()
        lc = (ac(x).sum() + bc(x).sum()) if i % 2 == 0 else bc(x).sum()
        assert se(le) == cf(lc), i


# torch.utils.checkpoint runs its block's Python inside one op: a review probe found that the
# torchscript backend put it into a graph, whose failed trace ran the block again (dropout drew
# twice, a counter in the block counted twice, reentrant checkpoint over BatchNorm raised
# `unordered_map::at`), or whose trace inlined the block (backward no longer recomputed it, so
# BatchNorm's statistics moved once where eager moves them twice).
class _CountedBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                        torch.nn.Dropout(0.3))
        self.calls = 0  # forward and backward's recomputation

    def forward(self, x):
        self.calls += 1
        return self.body(x)


class _Checkpointed(torch.nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        # (a plain Sequential is what a trace could inline)
        self.block = _CountedBlock() if reentrant else torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
        self.head = torch.nn.Linear(8, 3)
        self.reentrant = reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        return self.head(checkpoint(self.block, x, use_reentrant=self.reentrant))


@pytest.mark.parametrize("backend", ["eager", "torchscript", "fx"])
@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_block_runs_once_per_call_and_draws_as_eager(backend, reentrant):
    def step(model, opt, x, y):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    torch.manual_seed(0)
    me = _Checkpointed(reentrant)
    mc = copy.deepcopy(me)
    oe, oc = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (me, mc))
    cstep = magpy.compile(step, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (checkpoint's use_reentrant advice on newer torch)
        for i in range(4):
            torch.manual_seed(i)
            x, y = torch.randn(8, 4, requires_grad=reentrant), torch.randint(0, 3, (8,))
            torch.manual_seed(100 + i)
            want = step(me, oe, x, y)
            rng_e = torch.get_rng_state()
            torch.manual_seed(100 + i)
            got = cstep(mc, oc, x, y)
            assert torch.equal(torch.get_rng_state(), rng_e), i
            assert torch.allclose(got, want, atol=1e-6), i
            for (k, a), b in zip(me.state_dict().items(), mc.state_dict().values()):
                assert torch.allclose(a.double(), b.double(), atol=1e-6), (i, k)
            if reentrant:
                assert me.block.calls == mc.block.calls == 2 * (i + 1)  # (recomputed in backward)


@pytest.mark.parametrize("layer", [
    lambda: torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.5, batch_first=True),
    lambda: torch.nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True),
    lambda: torch.nn.LSTM(8, 8, num_layers=2, dropout=0.5, batch_first=True),
], ids=["TransformerEncoderLayer", "MultiheadAttention", "LSTM"])
def test_a_module_that_drops_out_inside_draws_once_when_its_call_runs_again(layer):
    # a review probe: only modules named *Dropout counted as draws, so when a replay check
    # after the layer failed and the call ran again, the layer drew a second time
    torch.manual_seed(0)
    inner = layer().train()

    def f(x, mask):
        out = inner(x, x, x) if isinstance(inner, torch.nn.MultiheadAttention) else inner(x)
        y = (out[0] if isinstance(out, tuple) else out)[mask]
        if y.shape[0] > 3:  # a size that depends on the mask: checked at replay
            return y * 2
        return y * 3

    magpy.reset()
    cf = magpy.compile(f)
    for k in range(6):
        torch.manual_seed(100 + k)
        x = torch.randn(2, 3, 8)
        mask = (torch.ones(2, 3, dtype=torch.bool) if k < 4 else
                torch.tensor([[True, False, False], [False] * 3]))
        torch.manual_seed(k)
        want, want_next = f(x, mask), torch.rand(1)
        torch.manual_seed(k)
        got, got_next = cf(x, mask), torch.rand(1)
        assert equal(got, want) and torch.equal(got_next, want_next), k


@pytest.mark.parametrize("change", ["requires_grad_", "resize_", ".data ="])
def test_metadata_a_gradient_hook_changes_is_read_after_backward(change):
    # a review probe: a hook run by backward() flipped requires_grad or changed the size of a
    # tensor the function reads afterwards, and the replay gave the values seen at capture
    def make():
        other = torch.zeros(3, requires_grad=True)

        def hook(g):
            if change == "requires_grad_":
                other.requires_grad_(not other.requires_grad)
            elif change == "resize_":
                other.data.resize_(other.numel() + 1).zero_()
            else:
                other.data = torch.ones(other.numel() + 1)

        def fn(w, x):
            h = w * x
            h.register_hook(hook)
            h.sum().backward()
            return other.requires_grad, other.shape[0], tuple((other * 2).shape)
        return fn

    eager_fn, compiled_fn = make(), make()
    magpy.reset()
    cf = magpy.compile(compiled_fn)
    for _ in range(4):
        x = torch.randn(3)
        want = eager_fn(torch.randn(3, requires_grad=True), x)
        assert cf(torch.randn(3, requires_grad=True), x) == want
