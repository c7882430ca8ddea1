"""map(f, xs) ([Note: map]): the calls of a Python function that map's next() makes from C are
traced like callees; pure builtins over constants are folded; everything else breaks with a
message. Also the iterators a consumer takes whole (`dict(zip(k, v))`). Every test compares
against eager on every call."""

import torch
from torch import nn

import magpy
from conftest import assert_raises_like_eager, assert_stats, break_ids, check


class Heads(nn.Module):
    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.heads = heads

    def _split(self, x):
        b, t, c = x.shape
        return x.view(b, t, self.heads, c // self.heads).transpose(1, 2)

    def forward(self, x):
        q, k, v = map(self._split, self.qkv(x).chunk(3, dim=-1))
        return (q @ k.transpose(-1, -2)).softmax(-1) @ v


def test_map_of_a_bound_method_unpacked():
    m = Heads()
    cf = check(m, [torch.randn(2, 5, 8) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_map_inside_a_submodule_called_twice():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Heads(), Heads()

        def forward(self, x):
            return self.b(self.a(x).transpose(1, 2).flatten(2)) + 1

    cf = check(Two(), [torch.randn(1, 4, 8) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def square_plus_one(t):
    return t * t + 1


def test_map_consumed_by_sum_list_for_zip_and_enumerate():
    def f(xs, ys):
        total = sum(map(square_plus_one, xs))
        pairs = [a - b for a, b in zip(map(square_plus_one, xs), ys)]
        for i, z in enumerate(map(lambda p, q: p * q, xs, ys)):
            total = total + i * z
        return total, pairs, list(map(square_plus_one, ys))

    calls = [([torch.randn(3) for _ in range(3)], [torch.randn(3) for _ in range(2)])
             for _ in range(3)]
    cf = check(f, calls)
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_map_of_pure_builtins_over_constants_is_folded():
    def f(x, names):
        h, w = map(int, x.shape[-2:])
        tag = "-".join(map(str.upper, names))
        return x.reshape(h * w), tag, [s + 1 for s in map(float, (1, 2))]

    cf = check(f, [(torch.randn(3, 4), ["a", "b"]) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_map_of_torch_ops_and_modules_records_each_call():
    act = torch.nn.GELU()

    def f(xs, ys):
        kept = list(map(torch.relu, xs))  # the list holds what the calls returned
        total = sum(map(torch.nn.functional.silu, xs))  # made again: nothing keeps them
        a, b = map(torch.exp, xs)
        looped = [y * 2 for y in map(act, ys)]
        pairs = tuple(map(torch.add, xs, ys))
        return torch.stack(kept) * 2, total, a - b, looped, pairs, kept[0] is not None

    cf = check(f, [([torch.randn(3) for _ in range(2)], [torch.randn(3) for _ in range(2)])
                   for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_map_of_ops_with_effects_or_draws_breaks_with_a_hint():
    def inplace(xs):
        return list(map(torch.Tensor.mul_, xs, [2, 3]))

    def draws(xs):
        return torch.stack(list(map(torch.nn.functional.dropout, xs)))

    for fn, seed in [(inplace, None), (draws, 0)]:
        cf = check(fn, [([torch.randn(3) for _ in range(2)],) for _ in range(3)], seed=seed)
        text = str(magpy.explain(cf))
        assert "MB003" in break_ids(cf) and "is called from C" in text and "list comprehension" in text


def test_map_used_partly_breaks_and_is_correct():
    def f(xs):
        m = map(square_plus_one, xs)
        return next(m) + sum(m)

    cf = check(f, [([torch.randn(2) for _ in range(3)],) for _ in range(3)])
    assert magpy.explain(cf).break_count >= 1


def test_map_over_a_list_that_grows_before_it_is_consumed():
    def f(xs, extra):
        m = map(square_plus_one, xs)
        xs.append(extra)  # map's iterator sees the new item
        return list(m)

    cf = check(f, [([torch.randn(2), torch.randn(2)], torch.randn(2)) for _ in range(3)])
    assert "MB003" in break_ids(cf)
    assert "goes over other items" in str(magpy.explain(cf))


def test_two_maps_of_one_function_zipped():
    def f(xs, ys):
        return [a + b for a, b in zip(map(square_plus_one, xs), map(square_plus_one, ys))]

    calls = [([torch.randn(2) for _ in range(3)], [torch.randn(2) for _ in range(3)])
             for _ in range(3)]
    cf = check(f, calls)  # distinct items: each call's arguments say which map made it
    assert_stats(cf, graphs=1, breaks=0)

    def g(xs):  # the same items: which map a call belongs to is not known
        return [a + b for a, b in zip(map(square_plus_one, xs), map(square_plus_one, xs))]

    cf = check(g, [([torch.randn(2) for _ in range(2)],) for _ in range(3)])
    assert "two maps of square_plus_one" in str(magpy.explain(cf))


def test_exception_inside_a_mapped_function_is_raised_like_eager():
    def f(xs):
        return list(map(lambda x: x.view(5), xs))

    cf = assert_raises_like_eager(f, lambda: ([torch.randn(3)],), RuntimeError)
    # The user's error is not a graph break ([Note: calls that raise]), and nothing is cached.
    assert break_ids(cf) == [] and magpy.explain(cf).cache_entries == 0
    check(f, [[torch.randn(5), torch.randn(5)]] * 2, compiled=cf)


def test_dict_of_zip_and_star_zip():
    def f(names, outs):
        d = dict(zip(names, outs))
        cols = list(zip(*[(o, o * 2) for o in outs]))
        return d["b"] * 3, cols, {**d, "c": outs[0]}

    cf = check(f, [(["a", "b"], [torch.randn(2), torch.randn(2)]) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_dict_built_from_pairs_with_a_repeated_key_keeps_the_last_value():
    def f(x):
        d = dict([("k", x), ("j", x * 2), ("k", x + 1)])
        e = dict(zip(["u", "u"], [x, x * 3]))
        return d["k"], list(d), e["u"], len(e)

    cf = check(f, [torch.randn(2) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


class Chain(nn.Module):
    """functools.reduce over a ModuleList with a lambda, and over partial products with a
    method: f is called from C with what the call before returned ([Note: map], fold)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def _gate(self, acc, t):
        return acc * torch.sigmoid(t)

    def forward(self, x):
        import functools
        h = functools.reduce(lambda acc, block: block(acc).relu() + acc, self.blocks, x)
        g = functools.reduce(self._gate, [h, x, h * 2])
        only = functools.reduce(lambda a, b: a + b, [g])  # one item: f is never called
        empty = functools.reduce(lambda a, b: a + b, [], x)  # no items: the initial value
        return h, g, only is g, empty is x


def test_functools_reduce_with_a_python_function_is_traced():
    m = Chain()
    cf = check(m, [torch.randn(2, 4) for _ in range(3)], pin=(m,))
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_an_exception_inside_a_reduced_function_is_raised_like_eager():
    import functools

    def f(x, ks):
        return functools.reduce(lambda acc, k: acc + x[k], ks, x.sum())

    assert_raises_like_eager(f, lambda: (torch.randn(3), [0, 7]), IndexError)


def test_any_all_of_a_map_of_a_torch_op_breaks():
    # how far any()/all() went depends on the results: not a constant of the capture
    def f(xs):
        return any(map(torch.any, xs)), all(map(torch.any, xs))

    calls = [[torch.zeros(2), torch.ones(2)], [torch.zeros(2), torch.zeros(2)], [torch.ones(2)],
             [torch.ones(2), torch.ones(2)]]
    cf = check(f, [(c,) for c in calls])
    assert "MB003" in break_ids(cf)


def test_a_map_or_generator_read_again_gives_only_what_is_left():
    def twice(xs):
        m = map(square_plus_one, xs)
        return list(m), list(m)

    def after_zip(xs):
        m = map(torch.neg, xs)
        g = (x * 2 for x in xs)
        it = iter(xs)
        return list(zip(m, [1])), list(m), list(zip(g, [1, 2])), list(g), list(zip(it, [1])), list(it)

    for fn in (twice, after_zip):
        cf = check(fn, [([torch.randn(2) for _ in range(3)],) for _ in range(3)])
        assert_stats(cf, graphs=1, breaks=0, hits=2)


def test_iterators_a_zip_took_an_item_from_on_ending_or_never_asked():
    def nested(xs):
        m1, m2 = map(torch.neg, xs), map(torch.abs, xs)
        list(zip([1], zip(m1, m2)))  # the inner zip is not asked again after [1] runs out
        return list(m1), list(m2)

    def enumerated(xs):
        m = map(torch.neg, xs)
        g = (x * 2 for x in xs)
        list(zip(enumerate(m), [1]))
        list(zip(enumerate(g), [1]))
        return list(m), list(g)

    def unpacked_at_once(xs):
        m = map(torch.neg, xs)
        d = dict(zip(["a", "b"], m))
        n = map(torch.neg, xs)
        pairs = (lambda *p: p)(*zip([1], n))
        return d, list(m), pairs, list(n)

    for fn in (nested, enumerated, unpacked_at_once):
        cf = check(fn, [([torch.randn(2) for _ in range(3)],) for _ in range(3)])
        assert_stats(cf, graphs=1, breaks=0, hits=2)


def test_a_generator_reading_an_iterator_that_a_zip_also_reads_breaks():
    def f(xs):
        it = iter(xs)
        g = (x + 100 for x in it)
        return list(zip(it, g)), list(it)

    def g_(xs):
        it = iter(xs)
        g = (x + 100 for x in it)
        out = [(a, b) for a, b in zip(it, g)]
        return out, list(it)

    for fn in (f, g_):
        for n in (2, 3, 4):
            cf = check(fn, [([torch.tensor([float(j)]) for j in range(n)],) for _ in range(3)])
            assert "MB004" in break_ids(cf)


def test_an_iterator_read_on_in_the_same_frame_after_a_zip_loop_broke():
    def f(xs):
        it = iter(xs)
        head = []
        for a, k in zip(it, range(5)):
            head.append(a * k)
            if k == 1:
                break
        body = [b + 1 for b in [next(it)]]
        rest = []
        for b in it:  # the rest, in the same frame
            rest.append(b - 1)
        return head, body, rest

    cf = check(f, [([torch.randn(2) for _ in range(5)],) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)
