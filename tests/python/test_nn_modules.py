"""nn.Module: built-in leaf modules recorded as ops, user modules traced into."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import magpy
from conftest import (assert_same, assert_stats, break_ids, check, equal, module_state,
                      restore_module)

torch.manual_seed(0)


def leaf_cases():
    return {
        "linear": (lambda: nn.Linear(4, 3), lambda: torch.randn(2, 4)),
        "conv2d": (lambda: nn.Conv2d(2, 3, 3, padding=1), lambda: torch.randn(1, 2, 5, 5)),
        "layernorm": (lambda: nn.LayerNorm(4), lambda: torch.randn(3, 4)),
        "embedding": (lambda: nn.Embedding(10, 3), lambda: torch.randint(0, 10, (2, 5))),
        "gelu": (lambda: nn.GELU(), lambda: torch.randn(3, 4)),
        "softmax": (lambda: nn.Softmax(dim=-1), lambda: torch.randn(3, 4)),
        "maxpool": (lambda: nn.MaxPool2d(2), lambda: torch.randn(1, 2, 4, 4)),
        "sequential": (lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)),
                       lambda: torch.randn(3, 4)),
    }


@pytest.mark.parametrize("name", sorted(leaf_cases()))
def test_builtin_module_compiled_directly(name):
    make_module, make_input = leaf_cases()[name]
    m = make_module()
    cf = check(m, [make_input(), make_input(), make_input()])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.norm = nn.LayerNorm(d)
        self.scale = 0.5

    def forward(self, x):
        h = F.gelu(self.fc1(self.norm(x)))
        return x + self.fc2(h) * self.scale


class Stack(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
        self.head = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, 1))

    def forward(self, x, return_hidden=False):
        hidden = []
        for blk in self.blocks:
            x = blk(x)
            hidden.append(x)
        out = self.head(x)
        if return_hidden:
            return out, hidden
        return out


@pytest.mark.parametrize("n", [1, 3])
def test_user_module_with_module_list_and_sequential(n):
    m = Stack(4, n)
    x = torch.randn(2, 4)
    cf = check(m, [x, x * 2, torch.randn(5, 4)])
    e = assert_stats(cf, graphs=2, breaks=0, hits=1, misses=2)
    assert any("L['self'].blocks" in g for g in e.guards)


def test_module_forward_keyword_argument():
    from conftest import Call
    m = Stack(4, 2)
    x = torch.randn(2, 4)
    cf = check(m, [Call(x), Call(x, return_hidden=True), Call(x * 2, return_hidden=True),
                   Call(x)])
    assert_stats(cf, graphs=2, hits=2, misses=2)


class Indexer(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
        self.layers = nn.ModuleList([nn.Linear(3, 3) for _ in range(3)])

    def forward(self, x):
        a = self.seq[0](x)
        b = self.seq[-1](a)
        c = self.layers[1](x) + self.layers[-1](x)
        return b, c * len(self.layers)


def test_indexing_sequential_and_module_list():
    m = Indexer()
    cf = check(m, [torch.randn(2, 3), torch.randn(2, 3)])
    assert_stats(cf, graphs=1, breaks=0, hits=1, misses=1)


class TrainEval(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = self.drop(self.bn(self.fc(x)))
        if self.training:
            return y * 2
        return y


def test_train_eval_switch_recompiles_and_state_matches():
    m = TrainEval()
    x = torch.randn(4, 3)

    def mutate(i):
        m.train(i not in (2, 3))

    cf = check(m, [x, x * 2, x, x + 1, x], mutate=mutate, seed=123,
               snapshot=lambda: module_state(m), restore=lambda s: restore_module(m, s))
    e = assert_stats(cf, graphs=2, breaks=0, hits=3, misses=2)
    assert len(e.recompile_reasons) == 1
    assert ".training`: expected True, got False" in e.recompile_reasons[0]


def test_batchnorm_running_stats_updated_on_every_replay():
    m = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    calls = [torch.randn(5, 3) for _ in range(4)]
    cf = check(m, calls, snapshot=lambda: module_state(m), restore=lambda s: restore_module(m, s))
    assert_stats(cf, graphs=1, hits=3, misses=1)
    assert int(m[1].num_batches_tracked) == 4


def test_dropout_rng_matches_eager_with_same_seed():
    def f(x, p):
        return F.dropout(x, p=p, training=True) + torch.rand_like(x)

    x = torch.ones(50)
    cf = check(f, [(x, 0.3), (x, 0.3), (x, 0.3)], seed=7)
    assert_stats(cf, graphs=1, hits=2, misses=1)


def test_parameters_updated_in_place_between_calls_are_seen():
    m = Block(4)
    x = torch.randn(3, 4)

    def mutate(i):
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(0.9).add_(0.01 * i)

    cf = check(m, [x, x, x, x], mutate=mutate)
    assert_stats(cf, graphs=1, hits=3, misses=1)


class Manual(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 4))
        self.register_buffer("shift", torch.zeros(3))
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(F.linear(x, self.weight) + self.shift)


def test_replacing_parameter_with_other_shape_recompiles():
    m = Manual()
    x = torch.randn(2, 4)

    def mutate(i):
        if i == 2:
            m.weight = nn.Parameter(torch.randn(5, 4))
            m.shift = torch.zeros(5)

    cf = check(m, [x, x, x, x], mutate=mutate)
    e = assert_stats(cf, graphs=2, hits=2, misses=2)
    assert e.recompile_reasons == ["tensor `L['self'].weight` dim 0: expected 3, got 5; now dynamic: "
                                  "L['self'].weight dim 0, L['self'].shift dim 0"]


def test_replacing_submodule_recompiles():
    m = Manual()
    x = torch.randn(2, 4)

    relu, tanh = m.act, nn.Tanh()

    def mutate(i):
        m.act = tanh if i >= 2 else relu

    cf = check(m, [x, x, x, x], mutate=mutate)
    e = assert_stats(cf, graphs=2, hits=2, misses=2)
    assert e.recompile_reasons[0].startswith("`L['self'].act`")


def test_module_attribute_scalar_change_recompiles():
    m = Block(4)
    x = torch.randn(2, 4)

    def mutate(i):
        m.scale = 0.25 if i >= 1 else 0.5

    cf = check(m, [x, x, x], mutate=mutate)
    e = assert_stats(cf, graphs=2, hits=1, misses=2)
    assert e.recompile_reasons == ["`L['self'].scale`: expected 0.5, got 0.25; now dynamic: L['self'].scale"]


def test_forward_hook_on_submodule_added_later():
    m = Stack(4, 2)
    x = torch.randn(2, 4)
    seen = []

    def hook(mod, inp, out):
        seen.append(1)
        return out * 0

    handle = []

    def mutate(i):
        if i == 2:
            handle.append(m.blocks[0].register_forward_hook(hook))

    try:
        cf = check(m, [x, x, x, x], mutate=mutate)
    finally:
        for h in handle:
            h.remove()
    e = magpy.explain(cf)
    # the guards notice the hook, and the recompiled call traces it ([Note: module hooks])
    assert break_ids(cf) == []
    assert "blocks._modules[0]`: expected no hooks" in e.recompile_reasons[0]
    assert_stats(cf, graphs=2, hits=2, misses=2)
    assert seen == [1] * 4  # calls 2 and 3, once in each world
    assert len(seen) == 4  # eager and compiled, calls 2 and 3


def test_hook_on_compiled_top_module_still_runs():
    m = Block(4)
    calls = []
    h = m.register_forward_pre_hook(lambda mod, inp: calls.append(1))
    try:
        cf = check(m, [torch.randn(2, 4), torch.randn(2, 4)])
    finally:
        h.remove()
    assert len(calls) == 4
    assert_stats(cf, graphs=1, hits=1, misses=1)


def test_backward_through_compiled_module_matches_eager():
    torch.manual_seed(1)
    m = Stack(4, 2)
    m_ref = Stack(4, 2)
    m_ref.load_state_dict(m.state_dict())
    magpy.reset()
    cf = magpy.compile(m)
    for _ in range(3):
        x = torch.randn(3, 4)
        m.zero_grad()
        m_ref.zero_grad()
        lc = cf(x).pow(2).sum()
        le = m_ref(x).pow(2).sum()
        assert_same(lc, le)  # (bit for bit, but within rounding where a backend fuses kernels)
        lc.backward()
        le.backward()
        for (n, p), q in zip(m.named_parameters(), m_ref.parameters()):
            assert_same(p.grad, q.grad, n)
    assert_stats(cf, graphs=1, hits=2, misses=1)


def test_compile_bound_method_of_module():
    m = Block(4)

    class Holder:
        def __init__(self):
            self.k = 3.0

        def run(self, x):
            return m(x) * self.k

    h = Holder()
    cf = check(h.run, [torch.randn(2, 4), torch.randn(2, 4)])
    assert_stats(cf, graphs=1, hits=1, misses=1)


def test_explain_names_the_module():
    m = Block(4)
    cf = check(m, [torch.randn(2, 4)])
    e = magpy.explain(cf)
    assert "Block" in e.name
    assert e.graph_count == 1 and e.op_count >= 5


def test_no_grad_mode_call_of_module_is_separate_entry():
    m = Block(4)
    x = torch.randn(2, 4)
    magpy.reset()
    cf = magpy.compile(m)
    y1 = cf(x)
    with torch.no_grad():
        y2 = cf(x)
        y3 = cf(x)
    assert y1.requires_grad and not y2.requires_grad and not y3.requires_grad
    assert equal(y1.detach(), m(x).detach()) and equal(y2, y3)
    e = assert_stats(cf, graphs=2, hits=1, misses=2)
    assert e.recompile_reasons == ["grad mode: expected torch.is_grad_enabled() == True"]


class Inner(nn.Module):
    def forward(self, x):
        return x * 2


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x) + 1


def test_global_forward_hook_registered_after_capture():
    m = Outer()
    x = torch.ones(2)
    handles = []

    def mutate(i):
        if i == 1:
            handles.append(torch.nn.modules.module.register_module_forward_hook(
                lambda mod, inp, out: out * 10 if isinstance(mod, Inner) else None))

    try:
        check(m, [x, x], mutate=mutate)
    finally:
        for h in handles:
            h.remove()


class Sub(nn.Module):
    def forward(self, x):
        return x + 1


class Top(nn.Module):
    def __init__(self):
        super().__init__()
        self.sub = Sub()

    def forward(self, x):
        return self.sub(x) * 2


def test_submodule_forward_replaced_on_instance():
    m = Top()

    def mutate(i):
        if i == 1:
            m.sub.forward = lambda x: x + 100

    check(m, [torch.zeros(2), torch.zeros(2)], mutate=mutate)


def test_compiled_function_called_inside_compiled_function():
    inner = magpy.compile(Sub())

    def outer(x):
        return inner(x) * 3

    cf = check(outer, [torch.randn(2), torch.randn(2), torch.randn(2)])
    # a CompiledFunction is not a callee the monitor knows: the outer function runs eagerly
    assert_stats(cf, breaks=1)
    assert break_ids(cf) == ["MB003"]
    assert magpy.explain(inner).graph_count == 1


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 3, batch_first=True)
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, x):
        a, weights = self.attn(x, x, x)
        out, (h, c) = self.lstm(a)
        return out[:, -1] + h[0], c.sum(), weights


def test_leaf_modules_returning_tuples_unpacked():
    m = Recurrent().eval()
    cf = check(m, [torch.randn(2, 5, 4), torch.randn(2, 5, 4), torch.randn(2, 6, 4)])
    e = assert_stats(cf, graphs=2, breaks=0, hits=1, misses=2)
    assert e.notes == []


def test_module_attribute_passthrough_on_compiled_module():
    m = Manual()
    cf = magpy.compile(m, backend="eager")
    assert cf.weight is m.weight and cf.act is m.act
    assert cf._orig is m
    assert "Manual" in repr(cf) and "eager" in repr(cf)
    check(m, [torch.randn(2, 4)], compiled=cf)


class CellSelf(nn.Module):
    """forward's comprehension reads `self`, so `self` is a cell in its frame."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.k = 2

    def forward(self, x):
        return sum(self.fc(z) * self.k for z in [x, x * 2]) if False else \
            [self.fc(z) * self.k for z in (x, x + 1)]


class HoldsCellSelf(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = CellSelf()

    def forward(self, x):
        a, b = self.inner(x)
        return a + b


def test_submodule_whose_self_is_a_cell_is_inlined():
    torch.manual_seed(0)
    m = HoldsCellSelf()
    cf = check(m, [torch.randn(2, 4) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


class DecoratedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @torch.no_grad()
    def forward(self, x):
        return self.lin(x) * 2


def test_forward_decorated_with_no_grad_is_captured_through_the_wrapper():
    torch.manual_seed(0)
    m = DecoratedForward()
    cf = check(m, [torch.randn(2, 4) for _ in range(3)])
    assert_stats(cf, misses=1, hits=2, graphs=1, breaks=0)
    assert magpy.explain(cf).report["eager_calls"] == 0
    out = cf(torch.randn(2, 4))
    assert not out.requires_grad and torch.is_grad_enabled()


# [Note: module hooks] A module with hooks is called through its traced __call__; one without
# is guarded to have none, so registering one later recompiles.

class FeatureNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3))
        self.feats = {}

    def hook_all(self):
        def make(name):
            def fn(module, inputs, output):
                self.feats[name] = output
            return fn
        return [m.register_forward_hook(make(name)) for name, m in self.body.named_children()]

    def forward(self, x):
        y = self.body(x)
        return y.mean((2, 3)), [self.feats[k] for k in sorted(self.feats)]


def test_forward_hooks_storing_features_are_traced():
    m = FeatureNet()
    m.hook_all()
    calls = [torch.randn(1, 3, 8, 8) for _ in range(4)]
    cf = check(m, calls, snapshot=lambda: dict(m.feats), restore=lambda s: m.feats.update(s) or
               [m.feats.pop(k) for k in list(m.feats) if k not in s])
    # the first call meets an empty dict, the rest one with three keys: two graphs
    assert_stats(cf, graphs=2, breaks=0, hits=2)


def test_registering_and_removing_a_hook_on_a_leaf_module_recompiles():
    m = FeatureNet()
    cf = magpy.compile(m)
    x = torch.randn(1, 3, 8, 8)
    assert equal(cf(x)[0], m(x)[0])
    handles = m.hook_all()  # hooks on the leaf convs: noticed by the guards
    m.feats.clear()
    got = cf(x)
    m.feats.clear()
    want = m(x)
    assert equal(got[0], want[0]) and len(got[1]) == 3
    assert all(equal(a, b) for a, b in zip(got[1], want[1]))
    for h in handles:
        h.remove()
    m.feats.clear()
    assert equal(cf(x)[0], m(x)[0]) and cf(x)[1] == []
    assert_stats(cf, graphs=2, breaks=0, misses=2)  # without hooks: the first entry again


def test_pre_hook_and_hook_that_replace_inputs_and_outputs():
    lin = nn.Linear(3, 3)
    lin.register_forward_pre_hook(lambda mod, inputs: (inputs[0] * 2,))
    lin.register_forward_hook(lambda mod, inputs, out: out + inputs[0].sum())
    m = nn.Sequential(lin, nn.Tanh())
    cf = check(m, [torch.randn(2, 3) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)


def test_weight_norm_pre_hook_recomputes_the_weight_each_call():
    m = nn.Sequential(nn.utils.weight_norm(nn.Conv1d(2, 3, 3, padding=1)), nn.LeakyReLU(0.1))
    conv = m[0]

    def mutate(i):
        if i == 2:
            with torch.no_grad():
                conv.weight_g.mul_(0.5)  # a training step: the next weight must follow

    cf = check(m, [torch.randn(1, 2, 5) for _ in range(4)], mutate=mutate,
               snapshot=lambda: conv.weight.detach().clone(),
               restore=lambda w: setattr(conv, "weight", w))
    assert_stats(cf, graphs=1, breaks=0, hits=3)


class Sliced(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])
        self.head = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Tanh())

    def forward(self, x):
        for blk in self.blocks[:-1]:
            x = blk(x)
        for blk in reversed(self.blocks[1::2]):
            x = blk(x) + x
        return self.head[:2](x), self.head[2:](x), len(self.blocks[1:]), self.blocks[::2]


def test_slices_of_module_lists_and_sequentials():
    m = Sliced()
    cf = magpy.compile(m)
    for _ in range(3):
        x = torch.randn(2, 4)
        got, want = cf(x), m(x)
        for a, b in zip(got[:3], want[:3]):
            assert a == b if isinstance(a, int) else equal(a, b)
        # a slice that leaves the call is a new ModuleList of the same modules, as eagerly
        assert type(got[3]) is nn.ModuleList and got[3] is not m.blocks
        assert [id(b) for b in got[3]] == [id(b) for b in want[3]]
    assert_stats(cf, graphs=1, breaks=0, hits=2)


class LateralHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.lateral = nn.ModuleDict({f"p{i}": nn.Linear(4, 4) for i in range(2, 5)})

    def forward(self, x, log):
        out = []
        for i, stage in enumerate(self.stages[:-1], start=2):
            x = stage(x)
            out.append(self.lateral[f"p{i}"](x))
            if log and x.sum() > 1e9:  # a break with the slice's iterator live
                x = x * 0
        return out


@pytest.mark.parametrize("log", [False, True])
def test_module_dict_by_key_and_a_sliced_module_list_live_at_a_break(log):
    m = LateralHeads()
    cf = check(m, [(torch.randn(2, 4), log) for _ in range(4)])
    e = magpy.explain(cf)
    assert e.break_count == (1 if log else 0)
    if not log:
        assert e.graph_count == 1
    m.lateral["p3"] = nn.Linear(4, 4)  # another module under the key: guarded
    check(m, [(torch.randn(2, 4), log)], compiled=cf)


class CountingLinear(nn.Linear):
    """A module whose class defines __call__: it counts calls, then runs Module.__call__."""

    def __init__(self, *args):
        super().__init__(*args)
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        return super().__call__(x)


class WithCounted(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = CountingLinear(4, 4)

    def forward(self, x):
        return self.inner(x).relu() + self.inner(x)


def test_a_submodule_with_its_own_call_runs_it_on_every_call():
    # Found by a probe: the capture traced the forward only, so the count the class's __call__
    # keeps stayed at 1 (a wrong visible state, with right outputs).
    m = WithCounted()
    cf = check(m, [torch.randn(2, 4) for _ in range(3)], pin=(m,))
    calls = m.inner.calls
    cf(torch.randn(2, 4))
    assert m.inner.calls == calls + 2
    assert_stats(cf, breaks=0)


def test_giving_a_module_class_a_call_later_recompiles():
    class Plain(nn.Linear):
        pass

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Plain(4, 4)

        def forward(self, x):
            return self.inner(x)

    m = Outer()
    cf = magpy.compile(m)
    x = torch.randn(2, 4)
    cf(x)
    cf(x)
    Plain.__call__ = lambda self, t: nn.Module.__call__(self, t) * 2
    try:
        assert equal(cf(x), m(x))
        assert magpy.explain(cf).cache_entries == 2
    finally:
        del Plain.__call__


class SoloBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.relu(self.fc(x))


def test_each_layer_compiled_on_its_own_has_its_own_cache_limit():
    # Found by a probe: twelve blocks compiled one by one share SoloBlock.forward's code; the
    # cache limit counted every block's entry, so blocks 9 to 12 ran eagerly (MB013).
    blocks = [SoloBlock() for _ in range(12)]
    compiled = [magpy.compile(b) for b in blocks]
    x = torch.randn(2, 8)
    for _ in range(2):
        for b, cb in zip(blocks, compiled):
            assert equal(cb(x), b(x))
    for cb in compiled:  # each explains its own entry, not its siblings'
        assert_stats(cb, graphs=1, breaks=0, hits=1, misses=1, entries=1)


def test_entries_of_one_code_are_bounded_across_compiled_objects():
    # the engine's kMaxSharedEntries (64): past it, a new block runs eagerly, with a reason
    blocks = [SoloBlock() for _ in range(66)]
    x = torch.randn(1, 8)
    results = [(magpy.compile(b)(x), b(x)) for b in blocks]
    assert all(equal(a, e) for a, e in results)
    last = magpy.compile(blocks[-1])
    last(x)
    assert break_ids(last) == ["MB013"] and "from all its compiled objects" in str(magpy.explain(last))


def test_a_module_with_its_own_setattr_is_not_written_past_it():
    # Found by a probe: a Module subclass's own __setattr__ (here doubling ints) was taken for
    # Module's, so the replay used the value assigned, not the one stored.
    class Doubling(nn.Module):
        def __init__(self):
            super().__init__()
            self.k = 1

        def __setattr__(self, name, value):
            super().__setattr__(name, value * 2 if isinstance(value, int) else value)

        def forward(self, x):
            self.k = self.k + 1
            return x * self.k

    eager, compiled = Doubling(), Doubling()
    cf = magpy.compile(compiled)
    for _ in range(4):
        x = torch.ones(1)
        assert equal(cf(x), eager(x)) and compiled.k == eager.k
    assert "MB007" in break_ids(cf)


def test_training_flag_is_guarded_only_for_modules_whose_forward_reads_it():
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Dropout(0.5), nn.BatchNorm1d(4))
    net.eval()
    cf = check(net, [torch.randn(3, 4) for _ in range(2)])
    text = "\n".join(magpy.explain(cf).guards)
    assert "_modules[2].training == False" in text and "_modules[3].training == False" in text
    assert "_modules[0].training" not in text and "_modules[1].training" not in text
    net[0].train()  # a Linear in training mode computes the same: no new capture
    check(net, [torch.randn(3, 4)], compiled=cf)
    assert_stats(cf, graphs=1, misses=1)
    net[3].train()  # batch norm in training mode: another capture
    check(net, [torch.randn(3, 4)], compiled=cf)
    assert_stats(cf, graphs=2, misses=2)


def test_a_forward_under_a_decorator_is_traced_inline_and_compiled_directly():
    # HF's @deprecate_kwarg and friends wrap forward in `def wrapped(*args, **kwargs)`: self is
    # then args[0]. Found by a review probe: the call ran eagerly (MB099).
    import functools

    def deco(func):
        @functools.wraps(func)
        def wrapped(*args, **kwargs):
            kwargs.pop("legacy", None)
            return func(*args, **kwargs)
        return wrapped

    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        @deco
        def forward(self, x, scale=1.0):
            return self.lin(x) * scale

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x, scale=2.0, legacy=True) + 1

    outer = Outer()
    for m in (outer, outer.inner):
        cf = magpy.compile(m)
        for _ in range(3):
            x = torch.randn(2, 3)
            assert equal(cf(x), m(x))
        r = magpy.explain(cf)
        assert (r.graph_count, r.break_count, r.cache_hits) == (1, 0, 2), r
        assert not r.notes


class LossHead(nn.Module):
    """An HF-style head: the loss module is made in forward, from the config."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.reduction = "mean"
        self.made = []

    def forward(self, x, labels):
        logits = self.lin(x)
        loss_fct = nn.CrossEntropyLoss(reduction=self.reduction, ignore_index=-100)
        act = nn.ReLU(inplace=True)
        drop = nn.Dropout(0.5)
        self.made.append(loss_fct)  # escapes: a new object each call, as in eager
        return loss_fct(logits.view(-1, 3), labels.view(-1)), drop(act(logits.clone()))


def test_built_in_modules_made_in_forward_are_made_again_at_each_call():
    torch.manual_seed(0)
    m = LossHead()

    def mutate(i):
        if i == 3:
            m.reduction = "sum"

    calls = [(torch.randn(5, 4), torch.tensor([0, 1, 2, 1, -100])) for _ in range(6)]
    cf = check(m, calls, mutate=mutate, seed=1, pin=(m,))
    assert_stats(cf, breaks=0)
    assert len(m.made) == 12 and len({id(x) for x in m.made}) == 12  # eager's 6 and ours


def test_a_module_made_in_forward_with_a_tensor_argument_breaks_with_a_hint():
    w = torch.tensor([1.0, 2.0, 3.0])

    def f(logits, labels):
        return nn.CrossEntropyLoss(weight=w)(logits, labels)

    cf = check(f, [(torch.randn(4, 3), torch.tensor([0, 1, 2, 1]))] * 3)
    assert "MB003" in break_ids(cf)
    assert "make the module in __init__" in magpy.explain(cf).breaks[0].hint


def test_a_forward_set_on_the_instance_is_the_one_traced():
    # PEFT/flash-attn patching (`m.forward = MethodType(f, m)`) and accelerate's hooks
    # (`m.forward = partial(new_forward, m)`): Module.__call__ calls the instance attribute.
    # Found by a review probe: MB099, or a recompile on every call.
    import functools
    import types

    def patched(self, x):
        return x * 10 + len(self._modules)

    def new_forward(module, *args, **kwargs):
        return module._old_forward(*args, **kwargs) - 3

    m = Outer()
    inner = m.inner

    def mutate(i):
        if i == 2:
            inner.forward = types.MethodType(patched, inner)
        elif i == 4:
            inner._old_forward = inner.forward
            inner.forward = functools.update_wrapper(functools.partial(new_forward, inner),
                                                     inner._old_forward)
        elif i == 6:
            inner.forward = lambda x: x * 7
        elif i == 8:
            del inner.forward  # the class's again

    calls = [torch.randn(3, 2) for _ in range(10)]
    cf = check(m, calls, mutate=mutate, pin=(m,))
    r = magpy.explain(cf)
    assert r.break_count == 0 and r.cache_hits >= 4, r


def test_compiled_module_forwards_attribute_writes_and_stays_compiled_through_eval():
    # a review probe: `cm.training = False` raised AttributeError, and
    # `magpy.compile(m).eval()` returned the plain module (the compilation silently dropped)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.5))
    cm = magpy.compile(m).eval()
    assert isinstance(cm, magpy.CompiledFunction) and not m.training
    cm.flag = 1
    assert m.flag == 1
    cm.train()
    assert m.training and m[1].training
    cm.training = False
    assert not m.training
    x = torch.randn(2, 3)
    assert equal(cm.eval().to(torch.float32)(x), m(x))
    assert magpy.explain(cm).graph_count == 1
    del cm.flag
    assert not hasattr(m, "flag")


def test_eval_then_train_inside_the_call_replays():
    # a review probe: the training flag the call wrote with m.eval() was guarded at entry,
    # so every call recompiled
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                   torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))

    def step(m, x):
        m.eval()
        with torch.no_grad():
            val = m(x)
        m.train()
        return val, m(x)

    me, mc = make(), make()
    cf = magpy.compile(step)
    for i in range(5):
        x = torch.randn(6, 4)
        torch.manual_seed(i)
        want = step(me, x)
        torch.manual_seed(i)
        got = cf(mc, x)
        assert all(equal(a, b) for a, b in zip(want, got)), i
        assert equal(me[1].running_mean, mc[1].running_mean) and mc.training, i
    assert magpy.explain(cf).cache_hits >= 4


def test_compiled_module_hands_out_its_other_methods_as_they_are():
    # a review probe: every bound method came back wrapped, and inspect.signature(cm.forward)
    # (which trainers use) raised
    import inspect
    cm = magpy.compile(torch.nn.Linear(3, 2))
    assert list(inspect.signature(cm.forward).parameters) == ["input"]
    assert inspect.ismethod(cm.forward) and cm.forward.__name__ == "forward"


def test_forward_set_on_the_instance_is_the_one_compiled():
    # a review probe: `self.forward = self._fast` in __init__ (Module.__call__ finds the
    # instance's own) left the class's placeholder as the target, and the model ran eagerly
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.forward = self._fast

        def _fast(self, x):
            return self.lin(x).relu() * 2

    m = M()
    cf = magpy.compile(m)
    for _ in range(3):
        x = torch.randn(2, 3)
        assert equal(cf(x), m(x))
    e = magpy.explain(cf)
    assert e.graph_count == 1 and e.cache_hits == 2, (e.graph_count, e.cache_hits)


def test_requires_grad_of_results_follows_the_leaf_modules_parameters():
    # a review probe: parameters frozen between calls (fine-tuning, a notebook cell) left
    # `if y.requires_grad:` on its old branch: the parameters of leaf modules were not guarded
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3), nn.Tanh())

    def f(x):
        y = m(x)
        if y.requires_grad:
            y = y + 100
        return y * 2 if y.is_leaf else y

    cf = magpy.compile(f)
    x = torch.randn(2, 3)
    for flag in (True, False, True):
        for p in m.parameters():
            p.requires_grad_(flag)
        for _ in range(3):
            assert equal(cf(x).detach(), f(x).detach()), flag


def test_a_sliced_sequential_that_leaves_the_call_is_a_sequential_with_its_keys():
    # a review probe: torch.utils.checkpoint(seq[1:], x) raised on replay (the slice was made
    # again as Sequential([modules]), which Sequential does not take)
    import torch.utils.checkpoint as cp

    seq = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))

    def f(x):
        part = seq[1:]
        return part, cp.checkpoint(part, x, use_reentrant=True)

    cf = magpy.compile(f)
    for _ in range(3):
        x = torch.randn(2, 3, requires_grad=True)
        (pe, ye), (pc, yc) = f(x), cf(x)
        assert type(pc) is nn.Sequential and list(pc._modules) == list(pe._modules) == ["1", "2"]
        assert equal(ye, yc)
