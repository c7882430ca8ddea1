"""The torchscript backend: pure tensor stretches of a plan run as torch::jit graphs.

Every test compares against eager execution, and checks from the report that the graphs really
ran (the backend summary counts graph runs and eager runs per graph)."""

import copy
import json
import re
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import magpy

from conftest import Call, check


def report(cf):
    return json.loads(magpy._magpy.report_json(cf))


def runs(cf):
    """(graph runs, eager runs) summed over every graph of every entry."""
    g = e = 0
    for gr in report(cf)["graphs"]:
        for m in re.finditer(r"(\d+) graph runs, (\d+) eager runs", gr.get("backend_summary", "")):
            g += int(m.group(1))
            e += int(m.group(2))
    return g, e


def ts(fn, **kw):
    return magpy.compile(fn, backend="torchscript", **kw)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 16)
        self.b = nn.Linear(16, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).softmax(-1)


class Block(nn.Module):
    """Attention with chunk(), a causal mask, cat of heads, layer norm and a residual."""

    def __init__(self, d=8, heads=2):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.heads = heads

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        outs = []
        for h in range(self.heads):
            s = slice(h * C // self.heads, (h + 1) * C // self.heads)
            att = (q[..., s] @ k[..., s].transpose(-2, -1)) / (C // self.heads) ** 0.5
            att = att.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")).softmax(-1)
            outs.append(att @ v[..., s])
        return x + self.proj(torch.cat(outs, dim=-1))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        y = F.relu(self.bn(self.conv(x)))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


def test_mlp_runs_one_graph_from_the_second_call():
    m = MLP().eval()
    cf = ts(m)
    x = torch.randn(4, 6)
    for _ in range(4):
        assert torch.equal(cf(x), m(x))
    (g,) = report(cf)["graphs"]
    assert g["backend"] == "torchscript"
    assert g["backend_summary"].startswith("1 TorchScript graph covering 4 of 4 ops")
    assert "aten::linear" in g["backend_graphs"][0] and "aten::softmax" in g["backend_graphs"][0]
    # call 1 captures, call 2 traces (its result comes from the traced run), calls 3-4 replay
    assert runs(cf) == (2, 0)


def test_attention_block_with_chunk_cat_and_mask():
    m = Block().eval()
    cf = ts(m)
    for x in [torch.randn(2, 5, 8)] * 3 + [torch.randn(3, 4, 8)] * 3:
        assert torch.allclose(cf(x), m(x), rtol=1e-5, atol=1e-6)
    g, e = runs(cf)
    assert g >= 2 and e == 0


def test_convnet_eval_and_train_modes():
    m = ConvNet()
    cf = check(m.eval(), [torch.randn(2, 3, 8, 8)] * 4, compiled=ts(m))
    assert runs(cf)[0] >= 2
    m.train()  # batch norm updates its running stats in training: an effect, not in a graph
    cf = ts(m)
    ref = ConvNet()
    ref.load_state_dict(m.state_dict())
    ref.train()
    for _ in range(3):
        x = torch.randn(2, 3, 8, 8)
        assert torch.allclose(cf(x), ref(x), atol=1e-6)
    assert torch.allclose(m.bn.running_mean, ref.bn.running_mean)
    assert torch.equal(m.bn.num_batches_tracked, ref.bn.num_batches_tracked)


def test_parameter_replaced_or_updated_in_place_between_calls():
    m = MLP().eval()
    cf = ts(m)
    x = torch.randn(2, 6)
    for i in range(6):
        if i == 3:
            m.a.weight = nn.Parameter(torch.randn(16, 6))
        if i == 4:
            with torch.no_grad():
                m.b.bias.add_(1.0)
        assert torch.equal(cf(x), m(x))
    assert runs(cf)[0] >= 4


def test_module_attribute_change_retraces():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.LeakyReLU(0.1)
            self.ln = nn.LayerNorm(4)

        def forward(self, x):
            return self.act(self.ln(x) * 3)

    m = M().eval()
    cf = ts(m)
    x = torch.randn(3, 4)
    for i in range(6):
        if i == 3:
            m.act.negative_slope = 0.5
            m.ln.eps = 0.5
        assert torch.equal(cf(x), m(x)), i
    assert "2 traces" in report(cf)["graphs"][0]["backend_summary"]


def test_forward_hook_on_a_leaf_module_is_noticed_and_traced():
    m = MLP().eval()
    cf = ts(m)
    x = torch.randn(2, 6)
    seen = []
    for i in range(5):
        if i == 2:
            m.a.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
        assert torch.equal(cf(x), m(x))
    assert seen == [torch.Size([2, 16])] * (2 * 3)  # both worlds on calls 2, 3, 4
    e = magpy.explain(cf)
    assert any("expected no hooks" in r for r in e.recompile_reasons)
    assert e.graph_count == 2 and e.break_count == 0


def test_new_shapes_get_their_own_trace_up_to_a_limit():
    def f(x):
        return (x.sin() * 2).cos()

    cf = ts(f, dynamic=False, cache_limit=20)
    for n in range(2, 14):
        for _ in range(2):
            x = torch.randn(n)
            assert torch.equal(cf(x), f(x))
    # each size is its own cache entry (dynamic=False), each with one region and one trace
    assert all("1 traces" in g["backend_summary"] for g in report(cf)["graphs"])


def test_many_shapes_in_one_region_fall_back_to_eager_after_the_limit():
    def f(x):
        return (x.sin() * 2).cos()

    cf = ts(f, dynamic=True)
    for n in range(2, 14):
        for _ in range(2):
            x = torch.randn(n, 3)
            assert torch.equal(cf(x), f(x))
    notes = magpy.explain(cf).notes
    assert any("more than 8 different input shapes" in n for n in notes), notes
    g, e = runs(cf)
    assert g > 0 and e > 0


def test_error_in_a_graph_raises_the_users_error_at_their_line():
    emb = nn.Embedding(5, 3)

    def f(idx):
        y = emb(idx) * 2  # line of interest
        return y.sum(-1)

    cf = ts(f)
    ok = torch.tensor([0, 1, 4])
    for _ in range(3):
        assert torch.equal(cf(ok), f(ok))
    bad = torch.tensor([0, 9, 1])
    with pytest.raises(IndexError) as eager_err:
        f(bad)
    with pytest.raises(IndexError) as compiled_err:
        cf(bad)
    assert str(compiled_err.value) == str(eager_err.value)
    lines = [fr.lineno for fr in compiled_err.traceback if fr.name == "f"]
    assert f.__code__.co_firstlineno + 1 in [ln + 1 for ln in lines]
    assert torch.equal(cf(ok), f(ok))  # the graph is still used afterwards
    # calls: capture, trace, graph, graph failed -> steps ran eagerly and raised, graph
    assert runs(cf) == (2, 1)


def test_error_inside_try_reaches_the_handler():
    emb = nn.Embedding(5, 3)

    def f(idx):
        try:
            y = emb(idx).relu() * 2
        except IndexError:
            return torch.zeros(1)
        return y

    check(f, [Call(torch.tensor([0, 1])), Call(torch.tensor([2, 3])), Call(torch.tensor([7])),
              Call(torch.tensor([4]))], compiled=ts(f))


def test_gradients_match_eager():
    torch.manual_seed(0)
    m1 = MLP()
    m2 = MLP()
    m2.load_state_dict(m1.state_dict())
    cf = ts(m2)
    for _ in range(4):
        x = torch.randn(5, 6)
        m1.zero_grad()
        m2.zero_grad()
        m1(x).pow(2).sum().backward()
        cf(x).pow(2).sum().backward()
        for p1, p2 in zip(m1.parameters(), m2.parameters()):
            assert torch.allclose(p1.grad, p2.grad, rtol=1e-5, atol=1e-7)
    assert runs(cf)[0] >= 2


def test_same_tensor_twice_is_its_own_trace():
    def f(a, b):
        return (a * 2 + b).tanh() - a

    cf = ts(f)
    x, y = torch.randn(3), torch.randn(3)
    for args in [(x, y), (x, y), (x, x), (x, x), (x, y), (y, y)]:
        assert torch.equal(cf(*args), f(*args))
    assert "2 traces" in report(cf)["graphs"][0]["backend_summary"]


def test_views_of_inputs_keep_aliasing():
    def f(x):
        v = x.view(-1)
        return v, (v * 2).exp()

    cf = ts(f)
    for _ in range(3):
        x = torch.randn(2, 3)
        v, y = cf(x)
        assert v.data_ptr() == x.data_ptr() and torch.equal(y, f(x)[1])
        v[0] = 100.0
        assert x[0, 0] == 100.0


def test_tensor_subclass_input_runs_eagerly():
    class Sub(torch.Tensor):
        pass

    def f(x):
        return (x + 1).relu() * 2

    cf = ts(f)
    for _ in range(3):
        x = torch.randn(3).as_subclass(Sub)
        out = cf(x)
        assert type(out) is Sub and torch.equal(out, f(x))


def test_user_warnings_from_ops_are_still_issued():
    def f(x):
        return F.softmax(x).relu() * 2  # implicit dim: UserWarning from torch

    cf = ts(f)
    x = torch.randn(2, 3)
    for _ in range(3):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert torch.equal(cf(x), f(x))
        assert sum("Implicit dimension" in str(a.message) for a in w) >= 1


def test_dynamic_sizes_read_in_python_still_match():
    def f(x):
        b = x.shape[0]
        return (x.view(b, -1) * 2).sum(1) + b

    cf = ts(f)
    for n in [2, 2, 3, 4, 5, 5]:
        x = torch.randn(n, 2, 2)
        assert torch.equal(cf(x), f(x))


def test_lstm_cell_loop():
    cell = nn.LSTMCell(4, 5)

    def f(xs):
        h = torch.zeros(xs.shape[1], 5)
        c = torch.zeros(xs.shape[1], 5)
        for t in range(xs.shape[0]):
            h, c = cell(xs[t], (h, c))
        return h.relu()

    cf = ts(f)
    for _ in range(4):
        xs = torch.randn(6, 2, 4)
        assert torch.allclose(cf(xs), f(xs), atol=1e-6)
    assert runs(cf)[0] >= 2


def test_every_call_is_timed_by_phase():
    m = MLP().eval()
    cf = ts(m)
    x = torch.randn(2, 6)
    with magpy.profile() as p:  # no GPU here: the block runs as it is, and says why
        for _ in range(6):
            cf(x)
    assert isinstance(p.status, str) and p.status
    e = magpy.explain(cf)
    t = e.timings
    assert set(t) == {"capture", "compile", "guard", "replay"}
    assert t["capture"] > 0 and t["guard"] > 0 and t["replay"] > 0
    # the trace on the first hit counts as compile time, not replay
    assert t["compile"] > 0
    (entry,) = e.report["cache_entries"]
    assert entry["compile_ns"] == t["compile"] and entry["replay_ns"] == t["replay"]
    assert e.profiler["status"] == magpy.profiler_status()["status"]
    assert "us/hit" in str(e) and "TorchScript graph" in str(e)
    if not torch.cuda.is_available():
        assert e.kernels == {} and not e.profiler["available"]


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.bn(self.conv(x))
        out += x  # in place on a temporary of the graph
        return self.relu(out)  # inplace=True, on a temporary too


def test_in_place_ops_on_temporaries_stay_in_the_graph():
    m = Residual().eval()
    cf = check(m, [torch.randn(1, 3, 6, 6) for _ in range(4)], compiled=ts(m))
    (g,) = report(cf)["graphs"]
    assert g["backend_summary"].startswith("1 TorchScript graph covering 4 of 4 ops")
    assert runs(cf)[0] >= 2


def test_in_place_change_of_an_input_through_a_view_happens_once():
    def f(x):
        v = x.t()
        v.mul_(2)  # changes x
        return (v + 1).relu()

    cf = check(f, [torch.randn(3, 2) for _ in range(5)], compiled=ts(f))
    assert runs(cf)[0] >= 3


def test_freeze_backend_folds_batch_norm_and_follows_weight_changes():
    torch.manual_seed(0)
    m = Residual().eval()
    m.bn.running_mean.uniform_(-1, 1)
    m.bn.running_var.uniform_(0.5, 2)
    cf = magpy.compile(m, backend="torchscript-freeze")
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        for i in range(8):
            if i == 4:
                m.conv.weight.mul_(2)  # in place: the folded graph must notice
            if i == 6:
                m.conv.bias = nn.Parameter(torch.randn(3))  # replaced
            assert torch.allclose(cf(x), m(x), rtol=1e-5, atol=1e-5), i
    g = report(cf)["graphs"][0]
    assert "aten::batch_norm" not in g["backend_graphs"][0]  # folded into the convolution
    assert "3 traces" in g["backend_summary"]


def test_an_unused_op_that_raises_still_raises():
    """Fuzz seed 7062: the executor drops ops whose results nothing uses; the graph returns
    them so an index out of range still reaches the handler (and the user, outside try)."""
    g_t = torch.randn(3)

    def f(x, idx):
        try:
            t4 = g_t * 2
            z5 = x[idx].sum()  # noqa: F841  (unused)
        except Exception:
            t4 = g_t - 1
        return torch.add(x, t4, alpha=0.5).exp()

    def h(x, idx):
        y = x * 2
        x[idx].sum()  # unused, outside try
        return y.relu()

    calls = [Call(torch.randn(4, 3), torch.tensor(i)) for i in ([0, 1], [0, 1], [0, 7], [1, 0], [1, 9])]
    check(f, calls, compiled=ts(f))
    cf = ts(h)
    for c in calls:
        try:
            expected = h(*c.args)
        except IndexError as e:
            with pytest.raises(IndexError, match=str(e)[:20]):
                cf(*c.args)
            continue
        assert torch.equal(cf(*c.args), expected)


def test_outputs_require_grad_exactly_as_in_eager():
    """Fuzz seed 7691: autodiff subgraphs marked every output as requiring grad."""
    lin = nn.Linear(3, 4)

    def f(x):
        t1 = torch.stack((torch.exp(x[0] @ torch.ones(3, 4)), torch.maximum(lin.bias, lin.bias)))
        t2 = x * 2
        return t1, t2, (x * t2.abs()), torch.logsumexp(t2, dim=1)

    cf = ts(f)
    for _ in range(6):
        x = torch.randn(2, 3)
        got, want = cf(x), f(x)
        assert [t.requires_grad for t in got] == [t.requires_grad for t in want]
        assert all(torch.allclose(a, b) for a, b in zip(got, want))
    assert runs(cf)[0] >= 4


def test_plain_backend_does_not_freeze_so_writes_through_data_are_seen():
    # `p.data.mul_()` changes a parameter without bumping its version counter: a frozen graph
    # cannot notice it, so only torchscript-freeze folds module tensors (the user's promise).
    torch.manual_seed(0)
    m = Residual().eval()
    cf = ts(m)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        for i in range(6):
            if i >= 3:
                m.conv.weight.data.mul_(1.5)
            assert torch.allclose(cf(x), m(x), rtol=1e-5, atol=1e-5), i
    g = report(cf)["graphs"][0]
    assert "aten::batch_norm" in g["backend_graphs"][0]  # not folded: weights are inputs


def test_tracing_sees_tracer_warnings_and_leaves_user_warnings_to_their_filters():
    """magpy._effects.TracerWarningLog (the backend's view of warnings while it traces): every
    TracerWarning is seen, even at a line whose registry entry would have suppressed it, and
    other warnings follow the user's filters and "once per line" registries."""
    import sys
    import types
    import warnings

    from magpy._effects import TracerWarningLog
    from torch.jit import TracerWarning

    mod = types.ModuleType("magpy_test_tracer_site")
    exec("import warnings\n"
         "def check(category):\n"
         "    warnings.warn('depends on data', category)\n", vars(mod))
    sys.modules[mod.__name__] = mod
    try:
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("default")
            mod.check(TracerWarning)  # shown once, then in the module's registry
            mod.check(UserWarning)
            for _ in range(2):
                with TracerWarningLog() as log:
                    mod.check(TracerWarning)
                    mod.check(UserWarning)  # already shown at this line: not again
                assert [m for m, _, _ in log.seen] == ["depends on data"]
        assert [w.category for w in shown] == [TracerWarning, UserWarning]
        assert warnings.showwarning is warnings._showwarning_orig
    finally:
        del sys.modules[mod.__name__]


# Debian's torch is built with the reference BLAS, where oneDNN's kernels are many times faster
# for these shapes: there the timing must choose them.
GENERIC_BLAS = "BLAS_INFO=generic" in torch.__config__.show()


class Wide(nn.Module):
    """Linear layers big enough, and 1x1 convolutions at batch 1, for oneDNN to pay off."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(64, 128, 1)
        self.dw = nn.Conv2d(128, 128, 3, padding=1, groups=128, bias=False)
        self.fc1 = nn.Linear(128, 512)
        self.fc2 = nn.Linear(512, 256)

    def forward(self, x):
        y = self.dw(torch.relu(self.conv(x))).mean((2, 3))
        return self.fc2(torch.relu(self.fc1(y.expand(64, -1))))


def onednn_summary(cf):
    return " ".join(g.get("backend_summary", "") for g in report(cf)["graphs"])


def test_onednn_kernels_read_weights_live_so_writes_through_data_are_seen():
    # Moved kernels convert the weights inside each call: nothing is frozen, so even a write
    # through `.data` (no version bump) reaches the next call, as in eager.
    torch.manual_seed(0)
    m = Wide().eval()
    cf = ts(m)
    x = torch.randn(1, 64, 14, 14)
    with torch.no_grad():
        for i in range(6):
            if i >= 3:
                m.fc1.weight.data.mul_(0.5)
                m.conv.weight.data.add_(0.1)
            assert torch.allclose(cf(x), m(x), rtol=1e-4, atol=1e-5), i
        graph = report(cf)["graphs"][0]["backend_graphs"][0]
    summary = onednn_summary(cf)
    assert runs(cf) == (4, 0)  # call 1 captures, call 2 traces
    if GENERIC_BLAS:
        assert "oneDNN kernels (measured faster here) for 2 of 2 linear ops" in summary
        assert "aten::mkldnn_linear" in graph and "aten::linear" not in graph
        assert re.search(r"([1-9]) of 2 convolutions", summary), summary
        assert "aten::mkldnn_convolution" in graph


def test_onednn_kernels_are_not_used_where_autograd_records():
    torch.manual_seed(0)
    m = Wide()
    ref = Wide()
    ref.load_state_dict(m.state_dict())
    cf = ts(m)
    for _ in range(3):
        x = torch.randn(1, 64, 6, 6)
        cf(x).square().sum().backward()
        ref(x).square().sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)
    assert "oneDNN" not in onednn_summary(cf)
    assert "mkldnn" not in report(cf)["graphs"][0]["backend_graphs"][0]


def test_onednn_kernels_leave_other_layouts_and_dtypes_to_eager():
    # channels_last input and float64: the rewrite only takes contiguous float32 convolutions
    torch.manual_seed(0)
    m = Wide().eval()
    cf = ts(m)
    with torch.no_grad():
        x = torch.randn(1, 64, 14, 14).to(memory_format=torch.channels_last)
        for _ in range(3):
            out, want = cf(x), m(x)
            assert torch.allclose(out, want, rtol=1e-4, atol=1e-5)
        graph = report(cf)["graphs"][0]["backend_graphs"][0]
        assert "mkldnn_convolution" not in graph
        m64 = Wide().double().eval()
        cf64 = ts(m64)
        x64 = torch.randn(1, 64, 14, 14, dtype=torch.float64)
        for _ in range(3):
            assert torch.equal(cf64(x64), m64(x64))
        assert "oneDNN" not in onednn_summary(cf64)


def test_onednn_timing_leaves_the_global_random_state_alone():
    # The one-off timing runs on random tensors of its own: the program's draws after the call
    # that traced must be the ones eager gives.
    torch.manual_seed(0)
    m = Wide().eval()

    def f(x):
        return m(x), torch.rand(2)

    cf = ts(f)
    x = torch.randn(1, 64, 11, 11)  # sizes no other test times (timings are kept per process)
    with torch.no_grad():
        for i in range(3):
            torch.manual_seed(i)
            want = f(x)
            after_eager = torch.rand(3)
            torch.manual_seed(i)
            got = cf(x)
            after = torch.rand(3)
            assert torch.equal(got[1], want[1]) and torch.equal(after, after_eager), i
            assert torch.allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_a_leaf_made_in_a_region_keeps_requiring_grad():
    # a review probe: the graph executor's outputs lost requires_grad from the third call on
    def f(x):
        w = torch.zeros(3, requires_grad=True)
        v = x.detach().requires_grad_()
        return ((w + v) * 2).sum(), w, v

    cf = ts(f)
    for i in range(5):
        s, w, v = cf(torch.randn(3))
        assert s.requires_grad and w.requires_grad and w.is_leaf, i
        s.backward()
        assert torch.equal(w.grad, torch.full((3,), 2.0)) and torch.equal(v.grad, w.grad), i


def test_a_leaf_made_by_requires_grad_alone_keeps_requiring_grad():
    # a review probe: the tracer does not record requires_grad_(), so the graph's types did
    # not show the leaf; an adversarial step's autograd.grad failed from the third call on
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def attack(x):
        x_adv = (x + 0.01 * torch.sign(x)).detach().requires_grad_()
        g, = torch.autograd.grad(m(x_adv).sum(), x_adv)
        return (x_adv + 0.1 * g.sign()).detach(), x_adv

    cf = ts(attack)
    for i in range(5):
        x = torch.randn(4, 3)
        (want, we), (got, ge) = attack(x), cf(x)
        assert ge.requires_grad and ge.is_leaf, i
        assert torch.allclose(got, want), i


@pytest.mark.parametrize("backend", ["torchscript", "torchscript-freeze"])
def test_outputs_made_of_constants_are_new_tensors_each_call(backend):
    # a review probe: the executor folded them into one constant, and a caller that used one
    # as an accumulator changed what later calls returned
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3)

    def f(x):
        return x * 2, torch.zeros(3), torch.ones(3, 3).tril() + 1, lin.weight * 2

    cf = magpy.compile(f, backend=backend)
    with torch.no_grad():
        for i in range(5):
            want = f(torch.ones(3))
            got = cf(torch.ones(3))
            assert all(torch.equal(a, b) for a, b in zip(want, got)), i
            for t in got[1:]:
                t.add_(1.0)


def test_a_frozen_weight_the_graph_returns_stays_the_callers():
    # a review probe: the returned (transposed) weight was the frozen graph's own constant, so
    # changing it changed every later output
    torch.manual_seed(0)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x), self.lin.weight.t().contiguous(), self.lin.bias.view(3)

    me = M()
    mc = copy.deepcopy(me)
    cf = magpy.compile(mc, backend="torchscript-freeze")
    x = torch.randn(2, 3)
    with torch.no_grad():
        for i in range(5):
            (ye, wte, be), (yc, wtc, bc) = me(x), cf(x)
            assert torch.allclose(ye, yc, atol=1e-5), i
            wte.zero_()
            wtc.zero_()
            be.add_(1.0)  # a view of the bias: eager changes the model's bias
            bc.add_(1.0)
            assert torch.equal(me.lin.bias, mc.lin.bias), i


@pytest.mark.parametrize("change", ["class", "numpy attribute"])
def test_a_leaf_module_changed_between_calls_is_traced_again(change):
    # a review probe: the trace key held leaf modules by identity only, and left out module
    # attributes that are not plain Python numbers
    import numpy as np

    def make():
        return nn.Sequential(nn.Linear(3, 3), nn.LeakyReLU(np.float64(0.01)), nn.Linear(3, 2))

    torch.manual_seed(0)
    me = make()
    mc = copy.deepcopy(me)
    cf = ts(mc)
    x = torch.randn(4, 3)
    with torch.no_grad():
        for i in range(6):
            if i == 3:
                for m in (me, mc):
                    if change == "class":
                        m[1].__class__ = nn.Sigmoid
                    else:
                        m[1].negative_slope = np.float64(0.5)
            assert torch.allclose(me(x), cf(x), atol=1e-6), i


@pytest.mark.parametrize("backend", ["torchscript", "torchscript-freeze"])
def test_outputs_made_of_constants_keep_their_aliasing(backend):
    # a review probe: each output made of constants was copied on its own, so a buffer and a
    # view of it came back as two unrelated tensors
    def f(x):
        buf = torch.zeros(4)
        head = buf[:2]
        a = torch.arange(6.).view(2, 3)
        filled = torch.zeros(4)
        front = filled[:2]
        front.copy_(x)  # filled from the input in place: not a constant
        return buf, head, a, a[0], torch.ones(3).expand(2, 3), filled, front, x * 2

    cf = magpy.compile(f, backend=backend)
    with torch.no_grad():
        for i in range(5):
            x = torch.randn(2)
            buf, head, a, a0, ex, filled, front, _ = cf(x)
            buf.add_(100)
            a.mul_(2)
            filled.add_(100)
            assert torch.equal(head, torch.full((2,), 100.0)), i
            assert torch.equal(a0, torch.tensor([0.0, 2.0, 4.0])), i
            assert ex.stride() == (0, 1), i
            assert torch.equal(front, x + 100), i


@pytest.mark.parametrize("backend", ["torchscript", "torchscript-freeze"])
def test_changes_inside_leaf_modules_are_seen_on_every_call(backend):
    # A module's part of the trace key is kept while the dicts it was read from are unchanged
    # ([Note: module state by dict versions]); what changes without any of them changing (a
    # list's items, a tensor in place or re-pointed, a hook dict filled) must still be seen.
    # Each change comes after calls that ran the graph, so the kept parts are in use.
    changes = [
        lambda m: m[4].size.__setitem__(slice(None), [12, 9]),  # a list, in place
        lambda m: m[1].running_mean.add_(1.0),
        lambda m: setattr(m[1].running_var, "data", torch.arange(3.0) + 0.5),
        lambda m: setattr(m[1], "eps", 0.25),
        lambda m: setattr(m[3], "weight", nn.Parameter(torch.full((2, 3, 1, 1), 0.3))),
        lambda m: m[3]._parameters.__setitem__("bias", nn.Parameter(torch.ones(2))),
        lambda m: setattr(m[1], "__dict__", dict(m[1].__dict__, eps=0.5)),
        lambda m: m[2].register_forward_hook(lambda mod, inp, out: out * 2),
    ]
    torch.manual_seed(0)
    me = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"),
                       nn.BatchNorm2d(3), nn.ReLU(), nn.Conv2d(3, 2, 1),
                       nn.Upsample(size=[10, 10])).eval()
    mc = copy.deepcopy(me)
    cf = magpy.compile(mc, backend=backend)
    x = torch.randn(1, 2, 8, 8)
    with torch.no_grad():
        for c, change in enumerate([None] + changes):
            if change:
                change(me)
                change(mc)
            for i in range(4):
                ye, yc = me(x), cf(x)
                assert ye.shape == yc.shape and torch.allclose(ye, yc, atol=1e-5), (c, i)
    g, e = runs(cf)
    assert g >= 2 * len(changes) and e == 0, (g, e)  # the graphs ran between the changes


@pytest.mark.parametrize("backend", ["torchscript", "torchscript-freeze"])
def test_lists_in_leaf_modules_are_read_again_every_call(backend):
    # review probes: a list of numpy ints compared by identity missed an item changed in
    # place; once its items became plain ints, a kept key still compared it by identity; a
    # list of tensors inside _buffers was kept with its old tensors (freed: a crash); a list
    # holding itself recursed without end
    import gc

    import numpy as np
    torch.manual_seed(0)

    def make():
        m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Upsample(size=[np.int64(6)]))
        m[1].meta = [1]
        m[1].meta.append(m[1].meta)
        return m

    me = make()
    me[0].load_state_dict(make()[0].state_dict())
    mc = copy.deepcopy(me)
    mc[0]._buffers["extra"] = [torch.zeros(3)]
    cf = magpy.compile(mc, backend=backend)
    x = torch.randn(1, 3, 4)
    with torch.no_grad():
        for i in range(12):
            if i == 3:
                me[2].size[0] = mc[2].size[0] = np.int64(7)
            if i == 6:
                me[2].size[:] = mc[2].size[:] = [9]
            if i >= 8:
                mc[0]._buffers["extra"][0] = torch.zeros(i + 5, dtype=torch.float64)
                gc.collect()
            ye, yc = me(x), cf(x)
            assert ye.shape == yc.shape and torch.allclose(ye, yc, atol=1e-6), i


def test_parametrizations_of_the_users_own_class_follow_their_state():
    # a review probe: a parametrization's forward runs inside the trace, and the state it
    # read by identity (a dict changed in place) or from __slots__ went stale
    import torch.nn.utils.parametrize as P

    class ScaleDict(nn.Module):
        def __init__(self):
            super().__init__()
            self.cfg = {"s": 2.0}

        def forward(self, w):
            return w * self.cfg["s"]

    class ScaleSlot(nn.Module):
        __slots__ = ("k",)

        def __init__(self):
            super().__init__()
            self.k = 2.0

        def forward(self, w):
            return w * self.k

    class ScaleClass(nn.Module):
        k = 2.0

        def forward(self, w):
            return w * type(self).k

    def bump(p):
        if isinstance(p, ScaleDict):
            p.cfg["s"] = 5.0
        elif isinstance(p, ScaleSlot):
            p.k = 5.0
        else:
            ScaleClass.k += 1.0

    for cls in (ScaleDict, ScaleSlot, ScaleClass):
        torch.manual_seed(0)
        me = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        mc = copy.deepcopy(me)
        for m in (me, mc):
            P.register_parametrization(m[0], "weight", cls())
        cf = ts(mc)
        x = torch.randn(3, 4)
        with torch.no_grad():
            for i in range(6):
                if i == 3:
                    bump(me[0].parametrizations.weight[0])
                    if cls is not ScaleClass:
                        bump(mc[0].parametrizations.weight[0])
                assert torch.allclose(me(x), cf(x), atol=1e-5), (cls.__name__, i)


@pytest.mark.parametrize("backend", ["torchscript", "torchscript-freeze"])
def test_state_of_a_users_parametrization_class_is_followed(backend):
    # review probes: a class-level dict changed in place, and the class's bases reassigned,
    # left a kept key (and its trace) in use; numpy -0.0 and 0.0 were one key
    import numpy as np
    import torch.nn.utils.parametrize as P

    class BaseA(nn.Module):
        k = 2.0

    class BaseB(nn.Module):
        k = 5.0

    class Scale(BaseA):
        def forward(self, w):
            return w * self.k

    class Table(nn.Module):
        cfg = {"s": 2.0}

        def forward(self, w):
            return w * self.cfg["s"]

    for cls, change in ((Scale, lambda: setattr(Scale, "__bases__", (BaseB,))),
                        (Table, lambda: Table.cfg.__setitem__("s", 5.0))):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        P.register_parametrization(m[0], "weight", cls())
        cf = magpy.compile(m, backend=backend)
        x = torch.randn(3, 4)
        with torch.no_grad():
            for i in range(6):
                if i == 3:
                    change()
                assert torch.allclose(m(x), cf(x), atol=1e-5), (cls.__name__, i)

    def f(x, s):
        return x / s

    cf = magpy.compile(f, backend=backend)
    x = torch.ones(2)
    with torch.no_grad():
        for s in [np.float64(0.0)] * 3 + [np.float64(-0.0)] * 3 + [np.float32(-0.0)] * 2:
            assert torch.equal(cf(x, s), f(x, s)), s


def test_modules_that_hold_themselves_do_not_crash():
    # a review probe: a module in its own _modules overflowed the stack (hook keys, keys)
    for backend in ("eager", "torchscript"):
        m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
        m[1]._modules["me"] = m[1]
        cf = magpy.compile(m, backend=backend)
        x = torch.randn(2, 3)
        with torch.no_grad():
            for _ in range(3):
                assert torch.equal(m(x), cf(x))


class _Halve(nn.Module):  # a parametrization of this (user) module, for the test below
    def forward(self, w):
        return w / 2


def test_a_trace_outlives_changes_to_globals_that_are_not_torchs():
    # review probes: a warning shown while tracing (the warnings module rebinds a global), and
    # a parametrization defined in a module whose globals a loop rebinds, made every call
    # retrace, and the region ran eagerly for good after eight traces
    import torch.nn.utils.parametrize as P

    m = nn.Sequential(nn.Linear(4, 4), nn.Softmax(dim=1))
    P.register_parametrization(m[0], "weight", _Halve())
    cf = ts(m)
    x = torch.randn(3, 4)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with torch.no_grad():
            for i in range(6):
                globals()["_LOOP_VALUE"] = i  # as a loop at the top of a script does
                assert torch.allclose(cf(x), m(x), atol=1e-6), i
    assert runs(cf)[0] >= 3 and "1 traces" in report(cf)["graphs"][0]["backend_summary"]


@pytest.mark.parametrize("backend", ["torchscript", "torchscript-freeze"])
def test_a_warning_from_torchs_python_code_is_given_on_every_call(backend):
    # a review probe: F.softmax without dim warned while tracing only; under "always" eager
    # warns on every call, and under "error" (as pytest -W error) it raises
    def f(x):
        return F.softmax(x * 2) + 1

    magpy.reset()
    cf = magpy.compile(f, backend=backend)
    x = torch.randn(3, 4)
    for _ in range(4):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert torch.allclose(cf(x), f(x))
        assert len(caught) == 2 and "dim" in str(caught[0].message), caught
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning):
            cf(x)
    assert any("warning from Python code" in n for n in magpy.explain(cf).notes)


@pytest.mark.parametrize("backend", ["torchscript", "torchscript-freeze", "fx"])
def test_torch_code_replaced_after_the_trace_is_run_as_replaced(backend):
    # [Note: code a trace ran]: review probes replaced F.relu (which nn.ReLU.forward calls),
    # nn.LayerNorm.forward, torch.Tensor.unflatten (which nn.Unflatten calls) and
    # Tensor.__add__ after the capture, and the old trace ran on; under fx, torch.relu replaced
    # by a wrapper of the original made the generated code (which names torch.relu) apply it twice
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.LayerNorm(4), nn.Unflatten(1, (2, 2)))

    def f(x):
        return torch.relu(m(x)) + 1

    cf = magpy.compile(f, backend=backend)
    x = torch.randn(3, 4)
    saved = [(F, "relu"), (nn.LayerNorm, "forward"), (torch.Tensor, "unflatten"),
             (torch.Tensor, "__add__"), (torch, "relu")]
    originals = [getattr(owner, name) for owner, name in saved]
    unflatten, add, trelu = originals[2:]
    replacements = [lambda t, inplace=False: t * 100, lambda self, t: t - 1,
                    lambda t, d, s: unflatten(t, d, s) * 3, lambda a, b: add(add(a, b), 10),
                    lambda t: trelu(t) + 7]
    try:
        with torch.no_grad():
            for step in range(len(saved) + 1):
                for _ in range(3):
                    assert torch.allclose(cf(x), f(x), atol=1e-6), step
                if step < len(saved):
                    setattr(*saved[step], replacements[step])
    finally:
        for (owner, name), original in zip(saved, originals):
            setattr(owner, name, original)


# A review probe: tensors made under torch.inference_mode() (inputs, or a model's weights)
# used by a call outside it aborted the process: the trace key read their version counters,
# which inference tensors do not have (an uncaught c10::Error). Such regions run their steps.
@pytest.mark.parametrize("backend", ["torchscript", "torchscript-freeze", "eager", "fx"])
@pytest.mark.parametrize("made", ["inputs", "model", "constant"])
def test_inference_tensors_used_outside_inference_mode(backend, made):
    torch.manual_seed(0)
    with torch.inference_mode(made == "model"):
        m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    with torch.inference_mode(made == "inputs"):
        xs = [torch.randn(3, 4) for _ in range(3)]
    with torch.inference_mode():
        table = torch.arange(2.0)

    def f(x):
        return m(x) + table * 2  # (a global inference tensor the call reads)

    cf = magpy.compile(f if made == "constant" else m, backend=backend)
    with torch.no_grad():
        for x in xs:
            want = f(x) if made == "constant" else m(x)
            assert torch.allclose(cf(x), want)
    with torch.inference_mode():
        table.add_(1)  # an in-place change no version counter records
    with torch.no_grad():  # (outside inference mode: the same guards pass)
        x = xs[0]
        assert torch.allclose(cf(x), f(x) if made == "constant" else m(x))


# A review probe: freezing converted convolutions to MKLDNN, whose graph ends in to_dense: a
# contiguous output where eager's convolutions keep a channels_last layout.
class _ToChannelsLast(nn.Module):
    def forward(self, x):
        return x.contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("where", ["input", "model", "forward"])
def test_freeze_keeps_channels_last_outputs(where):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()
    if where == "model":
        m = m.to(memory_format=torch.channels_last)
    if where == "forward":  # (the layout is made inside the call)
        m = nn.Sequential(_ToChannelsLast(), *m)
    cf = magpy.compile(m, backend="torchscript-freeze")
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(2, 3, 10, 10)
            if where == "input":
                x = x.to(memory_format=torch.channels_last)
            want, got = m(x), cf(x)
            assert torch.allclose(got, want, atol=1e-5)
            assert got.stride() == want.stride()
            assert got.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("backend", ["torchscript", "torchscript-freeze"])
def test_adding_an_integer_zero_turns_minus_zero_to_zero_as_in_eager(backend):
    # [Note: x + 0]: LibTorch's peephole pass dropped `y + 0`, so -0.0 stayed -0.0
    def f(x):
        with torch.no_grad():
            y = x * 1.0
            return 1.0 / (y + 0), (x.long() + 0) * 2, (y.sum() + 0) * 2

    magpy.reset()
    cf = magpy.compile(f, backend=backend)
    for _ in range(5):
        x = torch.tensor([-0.0, 1.0, -2.0])
        got, want = cf(x), f(x)
        for g, w in zip(got, want):  # (the 0-dim sum stays float32)
            assert g.dtype == w.dtype and torch.equal(g, w), (g, w)
