"""The fx backends: each pure tensor stretch of a plan becomes a torch.fx GraphModule, run as
Python (fx) or compiled by torch.compile (inductor, cudagraphs: torch >= 2, cudagraphs on a
GPU). Every test compares against eager, and checks from the report what really ran. The
whole suite also runs on the fx backend (ctest pytest_engine_fx)."""

import re

import pytest
import torch
import torch.nn as nn

import magpy
import magpy._fx

from conftest import check


def runs(cf):
    """(graph runs, eager runs) summed over every graph of every entry."""
    g = e = 0
    for gr in magpy.explain(cf).graphs:
        for m in re.finditer(r"(\d+) graph runs, (\d+) eager runs", gr.get("backend_summary", "")):
            g += int(m.group(1))
            e += int(m.group(2))
    return g, e


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.proj = nn.Linear(8, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x, states):
        h, c = states
        y = self.proj(torch.relu(self.fc(x))) * 0.5 + h
        a, b = y.chunk(2, dim=-1)
        y = torch.cat([a.sigmoid(), b.tanh()], -1)[:, :4] + c.sum()
        return self.norm(y + x)


def test_regions_become_fx_graphs_that_match_eager():
    m = Block()
    calls = [(torch.randn(3, 4), (torch.randn(3, 4), torch.randn(1))) for _ in range(3)]
    cf = check(m, calls, backend="fx")
    graph_runs, eager_runs = runs(cf)
    assert graph_runs >= 2 and eager_runs == 0
    e = magpy.explain(cf)
    assert e.notes == []
    (text,) = e.graphs[0]["backend_graphs"]
    assert "def forward" in text and "torch.cat" in text and "self.m0" in text  # the module


def test_a_module_swapped_for_another_gets_a_graph_of_its_own():
    # modules and other non-tensor inputs are constants of a graph, which is keyed by them
    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            return self.inner(x).relu() * 2

    m = Holder()
    cf = magpy.compile(m, backend="fx")
    x = torch.randn(2, 4)
    for _ in range(3):
        assert torch.equal(cf(x), m(x))
    m.inner = nn.Linear(4, 4)  # same guards (type, no hooks), another module
    for _ in range(3):
        assert torch.equal(cf(x), m(x))
    assert runs(cf)[1] == 0


def wrap_graphs(monkeypatch, wrap):
    """Each region runs `wrap(graph)` instead of its graph."""
    real = magpy._fx.compile_region

    def compile_region(steps, sample, backend):
        gm, text, tensors = real(steps, sample, backend)
        return wrap(gm), text, tensors

    monkeypatch.setattr(magpy._fx, "compile_region", compile_region)


def test_a_graph_that_fails_to_run_falls_back_to_its_steps_with_a_note(monkeypatch):
    def f(x):
        return (x + 1).relu() * 3

    def crash(*args):
        raise RuntimeError("the compiled kernel crashed")

    wrap_graphs(monkeypatch, lambda gm: crash)
    cf = magpy.compile(f, backend="fx")
    x = torch.randn(5)
    for _ in range(4):
        assert torch.equal(cf(x), f(x))
    notes = magpy.explain(cf).notes
    assert any("fx graph 0 failed to run (RuntimeError: the compiled kernel crashed)" in n
               for n in notes), notes
    assert runs(cf)[0] == 0


def test_a_program_error_inside_a_graph_is_the_programs_and_keeps_the_graph():
    def f(x, y):
        return (x * 2) @ (y + 1)

    cf = magpy.compile(f, backend="fx")
    a, b = torch.randn(2, 3), torch.randn(3, 2)
    for _ in range(3):
        assert torch.equal(cf(a, b), f(a, b))
    with pytest.raises(RuntimeError) as eager:
        f(torch.randn(2, 3), torch.randn(4, 2))
    with pytest.raises(RuntimeError) as compiled:
        cf(torch.randn(2, 3), torch.randn(4, 2))
    assert str(compiled.value) == str(eager.value)
    assert not any("failed to run" in n for n in magpy.explain(cf).notes)


@pytest.mark.parametrize("backend", ["inductor", "cudagraphs"])
def test_compiling_backends_that_cannot_run_here_say_why_and_run_eagerly(backend):
    why = magpy._fx.unavailable(backend)
    if why is None:
        pytest.skip(f"{backend} runs here (torch {torch.__version__}): tests/gpu covers it")

    def f(x):
        return torch.sin(x) * 2 + 1

    cf = magpy.compile(f, backend=backend)
    x = torch.randn(4)
    for _ in range(3):
        assert torch.equal(cf(x), f(x))
    notes = magpy.explain(cf).notes
    assert any(why in n and "running it with the eager backend" in n for n in notes), notes
    assert backend in magpy.backends()


def _compiling_cases():
    """(backend, device) pairs that run here; the others are skipped with their reason."""
    for backend in ("inductor", "cudagraphs"):
        why = magpy._fx.unavailable(backend)
        if why:
            yield pytest.param(backend, None, marks=pytest.mark.skip(reason=why))
            continue
        if backend == "inductor":
            yield backend, "cpu"
        if torch.cuda.is_available():
            yield backend, "cuda"


@pytest.mark.parametrize("backend,device", list(_compiling_cases()))
def test_compiling_backends_run_their_graphs_and_match_eager(backend, device):
    torch.manual_seed(0)
    m = Block().to(device)
    calls = [(torch.randn(3, 4, device=device),
              (torch.randn(3, 4, device=device), torch.randn(1, device=device)))
             for _ in range(4)]
    cf = magpy.compile(m, backend=backend)
    for x, states in calls:
        torch.testing.assert_close(cf(x, states), m(x, states), rtol=1.3e-6, atol=1e-5)
    graph_runs, eager_runs = runs(cf)
    e = magpy.explain(cf)
    assert e.notes == [] and graph_runs >= 3 and eager_runs == 0, (e.notes, graph_runs)


@pytest.mark.skipif(magpy._fx.unavailable("cudagraphs") is not None,
                    reason=str(magpy._fx.unavailable("cudagraphs")))
def test_cudagraphs_results_are_not_overwritten_by_the_next_replay():
    # a CUDA graph writes its outputs to the same memory on every replay: magpy hands out copies
    def f(x):
        return (x * 2).sin() + 1

    cf = magpy.compile(f, backend="cudagraphs")
    xs = [torch.randn(64, device="cuda") for _ in range(5)]
    results = [cf(x) for x in xs]
    for x, r in zip(xs, results):
        torch.testing.assert_close(r, f(x), rtol=1.3e-6, atol=1e-5)
    assert runs(cf)[0] >= 3 and magpy.explain(cf).notes == []


@pytest.fixture
def inductor_stand_in(monkeypatch):
    """The inductor path on any torch: compile_fx replaced by the flat GraphModule itself, with
    the versions it was asked for recorded."""
    compiled = []

    def stand_in(backend):
        def compile(gm, inputs):
            compiled.append([tuple(t.shape) for t in inputs])
            return (lambda *args: list(gm(*args))), False  # (callable, clone its outputs)
        return compile

    monkeypatch.setattr(magpy._fx, "unavailable", lambda backend: None)
    monkeypatch.setattr(magpy._fx, "_inductor", stand_in)
    return compiled


def test_inductor_compiles_each_input_shape_once_with_list_inputs_flattened(inductor_stand_in):
    def f(xs, w):
        y = torch.cat(xs, 0) * w  # xs: a list of tensors, one placeholder per tensor
        return (y + xs[1].sum()).relu()

    cf = magpy.compile(f, backend="inductor", dynamic=True)
    for n in (2, 2, 3, 3, 2):
        xs = [torch.randn(n, 3), torch.randn(1, 3)]
        w = torch.randn(3)
        assert torch.equal(cf(xs, w), f(xs, w))
    assert magpy.explain(cf).notes == []
    # one version per set of input shapes, reused when they come back
    assert sorted(shapes[:3] for shapes in inductor_stand_in) == [[(2, 3), (1, 3), (3,)],
                                                                  [(3, 3), (1, 3), (3,)]]
    assert runs(cf)[1] == 0


def test_inductor_gives_up_on_a_region_after_eight_input_shapes(inductor_stand_in):
    def f(x):
        return (x * 2).sin() + 1

    cf = magpy.compile(f, backend="inductor", dynamic=True)
    for n in range(1, 12):
        x = torch.randn(n)
        assert torch.equal(cf(x), f(x))
    assert len(inductor_stand_in) == 8
    assert any("more than 8 different input shapes" in n for n in magpy.explain(cf).notes)


def test_an_interrupt_while_a_graph_runs_reaches_the_caller_and_keeps_the_graph(monkeypatch):
    def f(x):
        return (x + 1).relu() * 3

    interrupt = [False]

    def interruptible(gm):
        def run(*args):
            if interrupt[0]:
                interrupt[0] = False
                raise KeyboardInterrupt
            return gm(*args)
        return run

    wrap_graphs(monkeypatch, interruptible)
    cf = magpy.compile(f, backend="fx")
    x = torch.randn(5)
    for _ in range(3):
        assert torch.equal(cf(x), f(x))
    interrupt[0] = True
    with pytest.raises(KeyboardInterrupt):
        cf(x)
    assert torch.equal(cf(x), f(x))
    assert magpy.explain(cf).notes == [] and runs(cf)[1] == 0


@pytest.mark.skipif(magpy._fx.unavailable("cudagraphs") is not None,
                    reason=str(magpy._fx.unavailable("cudagraphs")))
def test_cudagraphs_keeps_an_output_that_is_a_view_of_an_input_a_view():
    # a CUDA graph's outputs live in its own buffers: a region whose output shares memory with
    # an input runs as inductor without CUDA graphs, so the view stays a view as in eager
    def f(x):
        y = x.view(2, -1)
        z = (x * 2).sin() + 1
        return y, z

    cf = magpy.compile(f, backend="cudagraphs")
    for _ in range(4):
        x = torch.randn(8, device="cuda")
        y, z = cf(x)
        torch.testing.assert_close(z, (x * 2).sin() + 1, rtol=1.3e-6, atol=1e-5)
        assert y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert magpy.explain(cf).notes == []


@pytest.mark.parametrize("change", ["replaced", "frozen"])
def test_inductor_compiles_again_when_a_module_parameter_changes(inductor_stand_in, change):
    # a compiled version holds the parameter objects it was compiled with, and is specialised
    # on their metadata (freezing a layer changes what it computes gradients for)
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    cf = magpy.compile(m, backend="inductor")
    x = torch.randn(2, 4)
    for _ in range(3):
        assert torch.equal(cf(x), m(x))
    assert len(inductor_stand_in) == 1
    if change == "replaced":
        m[0].weight = nn.Parameter(torch.randn(4, 4))
    else:
        m[0].weight.requires_grad_(False)
    for _ in range(2):
        assert torch.equal(cf(x), m(x))
    assert len(inductor_stand_in) == 2
    with torch.no_grad():
        m[0].bias.add_(1.0)  # in place: the same object, seen without compiling again
    assert torch.equal(cf(x), m(x)) and len(inductor_stand_in) == 2


def test_the_signature_a_compiled_version_is_keyed_by():
    key = magpy._fx._key
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    assert key([a, b]) == key([torch.zeros(2, 3), torch.ones(2, 3)])
    assert key([a, a]) != key([a, b])  # the same memory twice
    assert key([a, a[0]]) != key([a, b[0]])  # a view of an earlier input
    for other in (a.double(), a.t(), a.reshape(3, 2), a[:, 1:], a.clone().requires_grad_()):
        assert key([other]) != key([a])
    with_grad = key([a])
    with torch.no_grad():
        assert key([a]) != with_grad  # grad mode
    with pytest.raises(TypeError, match="item 1 is a int, not a tensor"):
        key([a, 3])
    lin = nn.Linear(2, 2)
    pins = [(lin._parameters, "weight", lin.weight)]
    before = magpy._fx._pins_key(pins)
    assert magpy._fx._pins_key(pins) == before
    lin.weight.requires_grad_(False)
    assert magpy._fx._pins_key(pins) != before
    lin.weight = nn.Parameter(torch.ones(2, 2))
    assert magpy._fx._pins_key(pins) is None
    lin.bias = None  # a None entry is pinned too, and a parameter registered since is seen
    pins = [(lin._parameters, "bias", None)]
    before = magpy._fx._pins_key(pins)
    lin.register_parameter("extra", nn.Parameter(torch.ones(1)))
    assert magpy._fx._pins_key(pins) != before
    lin.bias = nn.Parameter(torch.ones(2))
    assert magpy._fx._pins_key(pins) is None


def test_a_graph_that_changed_an_input_and_then_failed_is_not_run_again():
    # a review probe: the recorded steps ran again after the graph failed, and the caller's
    # tensor was changed twice
    def f(x, idx):
        v = x[0:2]
        v.mul_(2)
        return (x[idx] * 3).sin()

    cf = magpy.compile(f, backend="fx")
    for _ in range(3):
        cf(torch.ones(4, 3), torch.tensor([0, 1]))
    xe, xc = torch.ones(4, 3), torch.ones(4, 3)
    with pytest.raises(IndexError):
        f(xe, torch.tensor([0, 9]))
    with pytest.raises(IndexError):
        cf(xc, torch.tensor([0, 9]))
    assert torch.equal(xe, xc)


# [Note: fx backends] magpy-cudagraphs marks the modules' parameters and buffers as static
# inputs of its CUDA graphs (magpy._fx.compile_with_static_parameters). On the CPU machines
# inductor and CUDA graphs are absent: stand-ins for compile_fx and compile_fx_inner check
# what is asked of them, and one that keeps its first inputs checks the fallback.

class _TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.n = nn.Linear(3, 3), nn.BatchNorm1d(3).eval()

    def forward(self, x):
        return (self.n(self.a(x)).relu(),)


def _stand_ins(inputs_first=False, refuses=False):
    """compile_fx and compile_fx_inner stand-ins. compile_fx lifts the held tensors before the
    graph's inputs (or, `inputs_first`, after them: positions the marking gets wrong), and
    the "CUDA graph" keeps the first values of an input marked static that is not held."""
    asked, own = [], []

    def compile_fx_inner(graph, example_inputs, **kwargs):
        static = list(kwargs.get("static_input_idxs", ()))
        if refuses and static:
            raise TypeError("compile_fx_inner() got an unexpected keyword argument")
        asked.append(static)
        first = []

        def run(*args):  # the graph's own inputs; held tensors are read where they are
            if any(i in static for i in own):
                first[:] = first or [t.clone() for t in args]
                args = first
            return graph(*args)
        return run

    def compile_fx(gm, inputs, inner_compile=None, config_patches=None):
        held = list(gm.parameters()) + list(gm.buffers())  # (no tied weights here)
        order = list(inputs) + held if inputs_first else held + list(inputs)
        own[:] = range(len(inputs)) if inputs_first else range(len(held), len(order))
        fake = [torch.empty_like(t) for t in order]
        return (inner_compile or compile_fx_inner)(gm, fake, static_input_idxs=[])
    return compile_fx, compile_fx_inner, asked


def _static_case(module, x, **how):
    torch.manual_seed(0)
    gm = torch.fx.symbolic_trace(module)
    compile_fx, compile_fx_inner, asked = _stand_ins(**how)
    before = magpy._fx.static_parameters.copy()
    run = magpy._fx.compile_with_static_parameters(gm, [x], compile_fx, compile_fx_inner, {})
    for _ in range(3):
        y = torch.randn_like(x)
        torch.testing.assert_close(run(y)[0], gm(y)[0])
    return asked, list((magpy._fx.static_parameters - before).elements())


class _Square(nn.Module):  # one (3, 3) weight: an input of the same shape passes the checks
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3, bias=False)

    def forward(self, x):
        return (self.lin(x) * 2,)


def test_cudagraphs_marks_the_lifted_parameters_and_buffers_static():
    asked, outcome = _static_case(_TwoLayers(), torch.randn(4, 3))
    # Linear's weight and bias, BatchNorm's weight, bias, running_mean, running_var and
    # num_batches_tracked, in the order compile_fx lifts them; x (index 7) is not static
    assert asked == [list(range(7))] and outcome == ["marked"]


def test_cudagraphs_falls_back_when_the_marking_would_keep_old_inputs():
    # lifted after the inputs: index 0 is x, which the marking took for the weight
    asked, outcome = _static_case(_Square(), torch.randn(3, 3), inputs_first=True)
    assert asked == [[0], []]  # checked on new inputs, then compiled unmarked
    assert outcome == ["unmarked: the marked graph kept old inputs"]


def test_cudagraphs_falls_back_when_compile_fx_takes_no_marking():
    asked, outcome = _static_case(_TwoLayers(), torch.randn(4, 3), refuses=True)
    assert asked == [[]] and len(outcome) == 1 and outcome[0].startswith("unmarked: TypeError")


def test_cudagraphs_marks_nothing_where_positions_are_uncertain():
    m = _TwoLayers()
    gm = torch.fx.symbolic_trace(m)
    x = torch.randn(4, 3)
    assert len(magpy._fx._lifted(gm, [x])) == 7
    assert magpy._fx._lifted(gm, [m.a.weight]) is None  # an input that is a parameter
    tied = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    tied[1].weight = tied[0].weight
    assert magpy._fx._lifted(torch.fx.symbolic_trace(tied), [x]) is None


def test_the_pins_key_holds_each_parameters_address():
    m = nn.Linear(3, 3)
    pins = [(m._parameters, "weight", m.weight)]
    before = magpy._fx._pins_key(pins)
    with torch.no_grad():
        m.weight.mul_(2)  # in place: the same memory
    # (the per-call form compares as it reads: the same answer as comparing the signatures)
    assert magpy._fx._pins_key(pins) == before and magpy._fx._pins_key(pins, before) is True
    m.weight.data = torch.randn(3, 3)  # moved: a CUDA graph would read the old memory
    assert magpy._fx._pins_key(pins) != before and magpy._fx._pins_key(pins, before) is False
    now = magpy._fx._pins_key(pins)
    m.weight.requires_grad_(False)
    assert magpy._fx._pins_key(pins, now) is False
    m.weight = nn.Parameter(m.weight.detach().clone())  # another object under the name
    assert magpy._fx._pins_key(pins) is None and magpy._fx._pins_key(pins, now) is False
    assert magpy._fx._pins_key([], magpy._fx._pins_key([])) is True
    with pytest.raises(TypeError, match="signature"):
        magpy._fx._pins_key(pins, "not bytes")


@pytest.mark.skipif(magpy._fx.unavailable("cudagraphs") is not None,
                    reason=str(magpy._fx.unavailable("cudagraphs")))
def test_cudagraphs_reads_parameters_updated_in_place_or_moved():
    # the parameters are static inputs of the CUDA graph: an in-place update is read where it
    # lands, and a parameter moved to other memory (p.data = ...) compiles again
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).cuda()
    cf = magpy.compile(m, backend="cudagraphs")
    before = magpy._fx.static_parameters.copy()
    with torch.no_grad():
        for step in range(6):
            x = torch.randn(4, 8, device="cuda")
            if step == 3:
                m[0].weight.mul_(2)
            if step == 4:
                m[2].weight.data = torch.randn(8, 8, device="cuda")
            torch.testing.assert_close(cf(x), m(x), rtol=1.3e-6, atol=1e-5)
    assert runs(cf)[0] >= 4 and magpy.explain(cf).notes == []
    # compiled twice (the move), both times with the parameters marked static
    assert dict(magpy._fx.static_parameters - before) == {"marked": 2}


# A review probe of the fx backend (each case kept a different answer than eager before its fix)

def test_a_graph_for_0_0_is_not_reused_for_minus_0_0():
    # the graphs of a region are keyed by the numbers they read: floats by their bits
    def f(x, s):
        y = x * s
        return y.exp(), y
    cf = magpy.compile(f, backend="fx")
    for s in [1.0, 2.0, 0.0, -0.0, 0.0, -0.0]:
        x = torch.ones(2)
        assert torch.equal(torch.signbit(cf(x, s)[1]), torch.signbit(f(x, s)[1])), s


class _Scaled(torch.Tensor):
    def sigmoid(self):
        return torch.Tensor.sigmoid(self) * 100  # the base method, called explicitly


def test_a_tensor_subclass_override_is_not_applied_twice():
    # the program calls torch.Tensor.sigmoid; `t.sigmoid()` in the generated code would call
    # the subclass's override again
    def f(x):
        return (x * 2).sigmoid() + 1
    cf = magpy.compile(f, backend="fx")
    for _ in range(4):
        x = torch.ones(2).as_subclass(_Scaled)
        assert torch.equal(cf(x), f(x))


def _softmax_then_in_place(x, idx):
    import torch.nn.functional as F
    v = x[0:2]
    y = F.softmax(v)  # UserWarning: implicit dimension choice
    v.mul_(2)         # in place on the input, through a view
    return y[idx] * 3  # IndexError for idx >= 2


def test_a_warning_an_error_filter_raises_stops_the_graph_where_eager_stops():
    import warnings
    cf = magpy.compile(_softmax_then_in_place, backend="fx")
    for i in range(4):
        seen = []
        for fn in (_softmax_then_in_place, cf):
            x = torch.ones(3, 2)
            with warnings.catch_warnings():
                warnings.simplefilter("error" if i >= 1 else "ignore")
                try:
                    fn(x, 0)
                    r = "returned"
                except UserWarning:
                    r = "raised"
            seen.append((r, x.tolist()))
        assert seen[0] == seen[1], i  # raised before mul_: the input unchanged


def test_warnings_before_an_error_that_stands_are_given():
    import warnings
    cf = magpy.compile(_softmax_then_in_place, backend="fx")
    for idx in [0, 1, 0, 5, 7]:
        seen = []
        for fn in (_softmax_then_in_place, cf):
            x = torch.ones(3, 2)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                try:
                    fn(x, idx)
                    r = "returned"
                except IndexError:
                    r = "IndexError"
            seen.append((r, [str(m.message)[:25] for m in w], x.tolist()))
        assert seen[0] == seen[1], idx


class _LeakyThen(nn.Module):
    def __init__(self, warn):
        super().__init__()
        self.act, self.warn = nn.LeakyReLU(0.5), warn

    def forward(self, x, w):
        y = self.act(x)
        # (F.softmax without a dim warns)
        return nn.functional.softmax(y) * 2 if self.warn else (y + w) * 2


@pytest.mark.parametrize("warn", [False, True])
def test_a_module_made_in_place_after_the_capture_is_applied_once(warn):
    # `act.inplace = True` after the capture: the graph's steps are not run again after it
    # (when it raises, or when its first run warns)
    import copy
    import warnings
    me = _LeakyThen(warn)
    mc = copy.deepcopy(me)
    cf = magpy.compile(mc, backend="fx", dynamic=True)
    for i in range(5):
        if i == 1:
            me.act.inplace = mc.act.inplace = True
        seen = []
        for fn in (me, cf):
            x = -torch.ones(2, 3)
            w = torch.ones(4) if i == 3 and not warn else torch.ones(3)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    fn(x, w)
                    r = "returned"
                except RuntimeError:
                    r = "RuntimeError"
            seen.append((r, x[0].tolist()))
        assert seen[0] == seen[1], i
