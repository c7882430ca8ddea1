"""Calls of the user's own Python functions: traced into and inlined into one graph."""

import functools
import sys

import pytest
import torch

import helper_mod
import magpy
from conftest import Call, assert_stats, break_ids, check


def double(x):
    return x * 2


def add_then(x, y, scale=1.0):
    return (x + y) * scale


def two_outputs(x):
    return x.sum(0), x.mean(0)


def deep(x, n):
    if n == 0:
        return x
    return deep(x + 1, n - 1) * 2


def star_callee(*args, **kwargs):
    out = args[0]
    for a in args[1:]:
        out = out + a
    return out * kwargs["k"]


def kwonly_callee(x, *, alpha, beta=3):
    return x * alpha + beta


def gen_helper(x):
    yield x


helper = double


def test_nested_helpers_inline_into_one_graph():
    def f(x, y):
        a = double(x)
        s, m = two_outputs(a + y)
        return add_then(s, m, scale=0.5), double(double(y))

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    cf = check(f, [(x, y), (y, x), (torch.randn(5, 4), torch.randn(5, 4))])
    e = assert_stats(cf, graphs=2, breaks=0, hits=1, misses=2)
    assert all(g["op_count"] >= 7 for g in e.graphs)


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_recursion_unrolled(depth):
    def f(x, n):
        return deep(x, n)

    x = torch.randn(2)
    cf = check(f, [(x, depth), (x * 2, depth), (x, depth + 1)])
    assert_stats(cf, graphs=2, hits=1, misses=2)


def test_callee_default_arguments_used_and_given():
    def f(x, y):
        return add_then(x, y), add_then(x, y, 3.0), add_then(x, y=y, scale=-1.0)

    x, y = torch.randn(3), torch.randn(3)
    cf = check(f, [(x, y), (y, x)])
    assert_stats(cf, graphs=1, hits=1, misses=1)


def test_callee_default_changed_recompiles():
    def f(x, y):
        return add_then(x, y)

    x, y = torch.randn(3), torch.randn(3)
    old = add_then.__defaults__

    def mutate(i):
        add_then.__defaults__ = (2.0,) if i >= 2 else old

    try:
        cf = check(f, [(x, y), (y, x), (x, y), (y, x)], mutate=mutate)
    finally:
        add_then.__defaults__ = old
    e = assert_stats(cf, graphs=2, hits=2, misses=2)
    assert "__defaults__[0]" in e.recompile_reasons[0]


def test_callee_with_star_args_and_kwargs():
    def f(x, y, z):
        return star_callee(x, y, z, k=2), star_callee(x, k=3)

    a = torch.randn(2)
    cf = check(f, [(a, a, a), (a, a * 2, a)])
    assert_stats(cf, graphs=1, hits=1, misses=1)


def test_call_with_star_unpacking_of_local_containers():
    def f(x, y):
        args = (x, y)
        return add_then(*args), add_then(*[x, y, 2.0])

    a = torch.randn(2)
    cf = check(f, [(a, a), (a, a + 1)])
    assert_stats(cf, graphs=1, hits=1, misses=1)


def test_call_with_double_star_unpacking_of_local_dict():
    def f(x, y):
        args = (x, y)
        kw = {"scale": 4.0}
        return add_then(*args, **kw)

    a = torch.randn(2)
    cf = check(f, [(a, a), (a, a + 1)])
    assert_stats(cf, graphs=1, breaks=0, hits=1, misses=1)


def test_keyword_only_callee():
    def f(x):
        return kwonly_callee(x, alpha=2), kwonly_callee(x, alpha=0.5, beta=1)

    cf = check(f, [torch.randn(2), torch.randn(2)])
    assert_stats(cf, graphs=1, hits=1, misses=1)


def test_function_passed_as_argument_guarded_by_identity():
    def f(g, x):
        return g(x) + 1

    x = torch.randn(3)
    cf = check(f, [(double, x), (double, x * 2), (torch.relu, x), (torch.sin, x), (double, x)])
    e = assert_stats(cf, graphs=3, hits=2, misses=3)
    assert "expected the same object" in e.recompile_reasons[0]


def test_global_helper_replaced_recompiles():
    def f(x):
        return helper(x) - 1

    mod = sys.modules[__name__]
    x = torch.randn(3)

    def mutate(i):
        mod.helper = torch.neg if i == 2 else double

    try:
        cf = check(f, [x, x * 3, x, x], mutate=mutate)
    finally:
        mod.helper = double
    e = assert_stats(cf, graphs=2, hits=2, misses=2)
    assert e.recompile_reasons[0].startswith("`G['helper']`: expected the same object")


def test_callee_from_another_module_reads_its_globals():
    def f(x):
        return helper_mod.scaled(x)

    x = torch.randn(3)

    def mutate(i):
        helper_mod.set_factor(5.0 if i == 2 else 2.0)

    try:
        cf = check(f, [x, x + 1, x, x], mutate=mutate)
    finally:
        helper_mod.set_factor(2.0)
    e = assert_stats(cf, graphs=2, hits=2, misses=2)
    assert "FACTOR" in e.recompile_reasons[0] and "expected 2.0, got 5.0" in e.recompile_reasons[0]


def test_lambda_global_and_local_calls():
    square = lambda t: t * t  # noqa: E731

    def f(x, g):
        return g(x) + 1

    x = torch.randn(3)
    cf = check(f, [(x, square), (x * 2, square)])
    assert_stats(cf, graphs=1, hits=1, misses=1)


def test_generator_callee_breaks():
    def f(x):
        return next(gen_helper(x)) + 1

    cf = check(f, [torch.randn(2), torch.randn(2)])
    assert_stats(cf, breaks=1)
    assert break_ids(cf) == ["MB004"]  # a generator not run to its end


def test_functools_partial_passed_in_is_called_through():
    # func(*p.args, *args, **{**p.keywords, **kwargs}), its parts guarded
    def f(g, x):
        return g(x)

    p = functools.partial(add_then, y=torch.ones(2))
    cf = check(f, [(p, torch.randn(2)), (p, torch.randn(2))])
    assert_stats(cf, graphs=1, breaks=0, hits=1, misses=1)


def test_partials_of_torch_functions_user_functions_and_keywords_overridden():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.act = functools.partial(torch.nn.functional.gelu, approximate="tanh")
            self.norm = functools.partial(torch.nn.functional.layer_norm, normalized_shape=(3,))
            self.mix = functools.partial(add_then, scale=2.0)
            self.pos = functools.partial(add_then, torch.ones(3))

        def forward(self, x):
            h = self.norm(self.act(x))
            return self.mix(h, x) + self.mix(h, y=x, scale=0.5) + self.pos(h)

    cf = check(Net(), [torch.randn(2, 3) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_a_partial_replaced_between_calls_is_seen():
    holder = {"f": functools.partial(add_then, scale=2.0)}

    def f(x):
        return holder["f"](x, x)

    def change(i):
        if i == 2:
            holder["f"] = functools.partial(add_then, scale=3.0)
        if i == 3:
            holder["f"] = functools.partial(torch.add, alpha=2)  # another func

    cf = check(lambda x: f(x), [torch.randn(2) for _ in range(5)], mutate=change)
    assert magpy.explain(cf).break_count == 0


def test_callee_exception_free_path_after_recompile():
    def f(x, n):
        out = x
        for _ in range(n):
            out = double(out)
        return out

    x = torch.randn(2)
    cf = check(f, [Call(x, 0), Call(x, 2), Call(x, n=2), Call(x, 2)])
    e = assert_stats(cf, graphs=2, hits=2, misses=2)
    assert e.recompile_reasons == ["`L['n']`: expected 0, got 2; now dynamic: L['n']"]


def test_callee_kwdefaults_changed_recompiles():
    def f(x):
        return kwonly_callee(x, alpha=1)

    old = dict(kwonly_callee.__kwdefaults__)

    def mutate(i):
        kwonly_callee.__kwdefaults__ = {"beta": 10} if i == 1 else dict(old)

    try:
        check(f, [torch.zeros(2), torch.zeros(2)], mutate=mutate)
    finally:
        kwonly_callee.__kwdefaults__ = old


class Star:
    def loss(self, a, b, scale=1.0, **kw):
        return (a - b).pow(2).mean() * scale + kw.get("extra", 0)

    def __call__(self, x, **kwargs):
        return self.loss(x, x * 0.5, **kwargs)


def test_bound_method_called_with_star_star_kwargs():
    s = Star()
    cf = check(s.__call__, [Call(torch.randn(3), scale=2.0), Call(torch.randn(3), scale=2.0)],
               pin=[s])
    assert_stats(cf, breaks=0, hits=1)


def starred_unpack(x):
    a, *rest = x.unbind(0)
    *init, last = [1, 2, 3]
    return a + sum(rest), init, last


def test_starred_unpacking():
    cf = check(starred_unpack, [torch.randn(4, 2)] * 2)
    assert_stats(cf, breaks=0, hits=1)


def method_taken_then_called(x, shape):
    f = x.reshape
    return f(*shape), (x + 1).view(*shape)


def test_tensor_method_read_as_attribute_then_called():
    cf = check(method_taken_then_called, [(torch.randn(6), (2, 3))] * 2)
    assert_stats(cf, breaks=0, hits=1)


class Noise(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.strength = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.full((), float(i))) for i in range(3)])

    def forward(self, x):
        for i, s in enumerate(self.strength):
            x = x + s * i
        return x


def test_parameter_list_iteration():
    m = Noise()
    cf = check(m, [torch.randn(3)] * 2)
    assert_stats(cf, breaks=0, hits=1)
    m.strength.append(torch.nn.Parameter(torch.ones(())))  # length guarded
    check(m, [torch.randn(3)], compiled=cf)
    assert_stats(cf, misses=2)


class Scales(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer_scale = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.full((4,), float(i + 1))) for i in range(3)])
        self.bias = torch.nn.ParameterDict({"pre": torch.nn.Parameter(torch.ones(4)),
                                            "post": torch.nn.Parameter(torch.zeros(4))})

    def forward(self, x):
        x = x + self.bias["pre"]
        for i in range(len(self.layer_scale) - 1):
            x = x * self.layer_scale[i]
        return x * self.layer_scale[-1] + self.bias["post"]


def test_parameter_list_and_dict_indexing():
    m = Scales()
    cf = check(m, [torch.randn(2, 4)] * 3)
    assert_stats(cf, graphs=1, breaks=0, hits=2)
    with torch.no_grad():
        m.layer_scale[0].mul_(3)  # read at replay, not baked in
        m.bias["post"].add_(1)
    check(m, [torch.randn(2, 4)], compiled=cf)
    assert_stats(cf, misses=1)
    m.layer_scale[2] = torch.nn.Parameter(torch.full((4,), -1.0))  # a new parameter object
    m.bias["pre"] = torch.nn.Parameter(torch.full((4,), 2.0))
    check(m, [torch.randn(2, 4)], compiled=cf)
    m.layer_scale.append(torch.nn.Parameter(torch.ones(4)))  # [-1] and len(): length guarded
    check(m, [torch.randn(2, 4)], compiled=cf)
    assert_stats(cf, misses=2)


# [Note: partials]: partials made in the call are followed as their parts; escaping ones are
# made again at replay.

def test_partial_made_in_the_call_is_called_through():
    def f(x):
        act = functools.partial(torch.nn.functional.gelu, approximate="tanh")
        mix = functools.partial(add_then, scale=2.0)
        return mix(act(x), x) + mix(x, y=x, scale=0.5)

    cf = check(f, [torch.randn(2, 3) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_partial_of_a_partial_and_of_a_partial_passed_in():
    outer = functools.partial(add_then, scale=3.0)

    def f(x, y):
        p = functools.partial(functools.partial(add_then, y), scale=0.5)  # flattened
        q = functools.partial(outer, y=y)  # of one passed in
        return p(x) + q(x) + p(x, scale=2.0)

    cf = check(f, [(torch.randn(3), torch.randn(3)) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_partial_made_in_the_call_escapes_and_is_rebuilt():
    store = {}

    def f(x):
        p = functools.partial(add_then, y=x, scale=2.0)
        store["p"] = p
        return p(x), p

    cf = magpy.compile(f)
    for _ in range(3):
        x = torch.randn(3)
        out, p = cf(x)
        assert store["p"] is p  # the one object, stored and returned
        ref_out, ref_p = f(x)
        assert torch.equal(out, ref_out)
        assert isinstance(p, functools.partial) and p.func is add_then
        assert p.args == () and set(p.keywords) == {"y", "scale"}
        assert torch.equal(p.keywords["y"], x) and p.keywords["scale"] == 2.0
        assert torch.equal(p(x), ref_p(x))
    assert_stats(cf, graphs=1, breaks=0)


def test_partial_made_in_the_call_lives_across_a_graph_break():
    def f(x):
        p = functools.partial(add_then, scale=2.0)
        h = p(x, x)
        if h.sum() > 0:  # a branch on data: a break
            h = h + 1
        return p(h, x)

    cf = check(f, [torch.randn(4) for _ in range(4)])
    assert magpy.explain(cf).break_count >= 1


class Affine:
    def __init__(self, w, b):
        self.w = w
        self.b = b

    def __call__(self, x):
        return x * self.w + self.b


def test_calling_an_object_made_in_the_call_traces_its_class_call():
    def f(x):
        a = Affine(2.0, x.mean())
        a.__call__ = lambda x: x  # an instance attribute: calls still use the class's
        return a(x) + Affine(0.5, 1.0)(x)

    def mutate(i):
        if i == 2:
            Affine.__call__ = lambda self, x: x - self.b

    old = Affine.__call__
    try:
        cf = check(f, [torch.randn(3) for _ in range(4)], mutate=mutate)
        assert_stats(cf, graphs=2, breaks=0, hits=2, misses=2)
    finally:
        Affine.__call__ = old
