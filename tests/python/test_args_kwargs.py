"""How the compiled function is called: positional, keyword, defaults, *args, **kwargs."""

import pytest
import torch

import magpy
from conftest import Call, assert_isolated_ok, assert_stats, check


def target(x, y, scale=1.0, *, shift=0.0):
    return (x + y) * scale + shift


@pytest.mark.parametrize("call", [
    Call(torch.ones(2), torch.ones(2)),
    Call(torch.ones(2), y=torch.ones(2)),
    Call(x=torch.ones(2), y=torch.ones(2), scale=3.0),
    Call(torch.ones(2), torch.ones(2), 2.0, shift=-1.0),
    Call(torch.ones(2), torch.ones(2), shift=5.0, scale=0.5),
])
def test_calling_conventions(call):
    cf = check(target, [call, call, call])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_positional_and_keyword_spellings_share_an_entry():
    x = torch.randn(2)
    cf = check(target, [Call(x, x, 2.0), Call(x, x, scale=2.0), Call(x=x, y=x, scale=2.0)])
    assert_stats(cf, graphs=1, hits=2, misses=1)


def test_default_vs_explicit_different_value():
    x = torch.randn(2)
    cf = check(target, [Call(x, x), Call(x, x, 1.0), Call(x, x, 2.0), Call(x, x, shift=1.0)])
    e = assert_stats(cf, graphs=3, hits=1, misses=3)
    # a miss is explained against the most recently used entry
    assert e.recompile_reasons == ["`L['scale']`: expected 1.0, got 2.0; now dynamic: L['scale']",
                                   "`L['shift']`: expected 0.0, got 1.0; now dynamic: L['shift']"]


def test_positional_only_parameters():
    def f(x, y, /, z=1):
        return x * y + z

    x = torch.randn(3)
    cf = check(f, [Call(x, x), Call(x, x, z=1), Call(x, x, 4)])
    assert_stats(cf, graphs=2, hits=1, misses=2)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_star_args_length_guarded(n):
    def f(*args):
        out = args[0]
        for a in args:
            out = out * a
        return out, len(args)

    xs = [torch.randn(3) for _ in range(n + 1)]
    cf = check(f, [Call(*xs[:n]), Call(*xs[1:n + 1]), Call(*xs[:n + 1]), Call(*xs[:n])])
    e = assert_stats(cf, graphs=2, hits=2, misses=2)
    assert e.recompile_reasons == [f"len(L['args']): expected {n}, got {n + 1}"]


def test_star_args_sliced():
    def f(*args):
        out = args[0]
        for a in args[1:]:
            out = out + a
        return out

    t = torch.randn(2)
    cf = check(f, [Call(t, t, t), Call(t, t * 2, t)])
    assert_stats(cf, graphs=1, breaks=0, hits=1, misses=1)


def test_star_args_unpacked():
    def f(x, *rest):
        a, b = rest
        return x + a * b

    t = torch.randn(2)
    cf = check(f, [Call(t, t, t), Call(t, t * 2, t), Call(t, 1.0, 2.0)])
    assert_stats(cf, graphs=2, hits=1, misses=2)


def test_kwargs_values_and_keys_guarded():
    def f(x, **kwargs):
        return x * kwargs["a"] + kwargs["b"]

    x = torch.randn(3)
    cf = check(f, [Call(x, a=2.0, b=1.0), Call(x * 2, b=1.0, a=2.0), Call(x, a=3.0, b=1.0),
                   Call(x, a=2.0, b=1.0, c=5)])
    e = assert_stats(cf, graphs=2, hits=2, misses=2)
    assert e.recompile_reasons == ["`L['kwargs']['a']`: expected 2.0, got 3.0; now dynamic: L['kwargs']['a']"]


def test_kwargs_tensor_shape_change():
    def f(**kw):
        return kw["x"].sum(0) + kw["y"]

    cf = check(f, [Call(x=torch.randn(2, 3), y=1.0), Call(x=torch.randn(2, 3), y=1.0),
                   Call(x=torch.randn(4, 3), y=1.0)])
    e = assert_stats(cf, graphs=2, hits=1, misses=2)
    assert e.recompile_reasons == ["tensor `L['kw']['x']` dim 0: expected 2, got 4; "
                                  "now dynamic: L['kw']['x'] dim 0"]


def test_forwarding_two_star_args_to_callee():
    def f(*args):
        return target(*args)

    x = torch.randn(2)
    cf = check(f, [Call(x, x), Call(x, x * 2), Call(x * 3, x)])
    assert_stats(cf, graphs=1, hits=2, misses=1)


def test_forwarding_three_star_args_to_callee():
    assert_isolated_ok("""
        def target(a, b, c):
            return a + b * c

        def f(*args):
            return target(*args)

        cf = magpy.compile(f)
        x = torch.randn(2)
        for i in range(3):
            assert same(cf(x, x + i, x), f(x, x + i, x))
        print("OK")
    """)


def test_forwarding_star_args_and_kwargs_to_callee():
    def f(*args, **kwargs):
        return target(*args, **kwargs)

    x = torch.randn(2)
    cf = check(f, [Call(x, x, shift=1.0), Call(x, x * 2, shift=1.0)])
    assert_stats(cf, graphs=1, breaks=0, hits=1, misses=1)


def test_forwarding_kwargs_only_to_callee():
    def f(x, **kwargs):
        return target(x, x, **kwargs)

    x = torch.randn(2)
    cf = check(f, [Call(x, scale=2.0), Call(x * 2, scale=2.0)])
    assert_stats(cf, graphs=1, breaks=0, hits=1, misses=1)


def test_forwarding_star_args_and_kwargs_guards_keyword_values():
    def f(*args, **kwargs):
        return target(*args, **kwargs)

    x = torch.randn(2)
    cf = check(f, [Call(x, x, shift=1.0), Call(x, x * 2, shift=1.0), Call(x, x, shift=2.0)])
    e = assert_stats(cf, graphs=2, breaks=0, hits=1, misses=2)
    assert e.recompile_reasons == ["`L['kwargs']['shift']`: expected 1.0, got 2.0; now dynamic: L['kwargs']['shift']"]


def test_wrong_arguments_raise_like_eager():
    magpy.reset()
    cf = magpy.compile(target)
    x = torch.randn(2)
    for bad in (Call(x), Call(x, x, 1.0, 2.0), Call(x, x, bogus=1)):
        with pytest.raises(TypeError) as e_eager:
            target(*bad.args, **bad.kwargs)
        with pytest.raises(TypeError) as e_comp:
            cf(*bad.args, **bad.kwargs)
        assert str(e_comp.value) == str(e_eager.value)
    assert magpy.explain(cf).cache_entries == 0
    assert torch.equal(cf(x, x), target(x, x))


def test_mutable_default_argument_list_read():
    def f(x, extra=[1.0, 2.0]):  # noqa: B006
        return x * extra[0] + extra[1]

    x = torch.randn(3)
    cf = check(f, [Call(x), Call(x * 2), Call(x, [3.0, 4.0])])
    assert_stats(cf, graphs=2, hits=1, misses=2)
