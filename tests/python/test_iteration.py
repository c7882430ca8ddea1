"""Iteration: zip, enumerate, reversed, dicts and their views, module containers.

Loops are unrolled along the executed path; what decided the trip count (lengths, key order)
is guarded, and every result is compared with eager.
"""

import itertools
import operator

import pytest
import torch

import magpy
from torch import nn

from conftest import Call, assert_stats, break_ids, check


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([nn.Linear(3, 3) for _ in range(3)])
        self.norms = nn.ModuleList([nn.LayerNorm(3) for _ in range(3)])
        self.heads = nn.ModuleDict({"a": nn.Linear(3, 1), "b": nn.Linear(3, 2)})

    def forward(self, x):
        for i, (c, n) in enumerate(zip(self.convs, self.norms)):
            x = n(c(x)) * (i + 1)
        for layer in reversed(self.convs):
            x = layer(x)
        out = {k: h(x) for k, h in self.heads.items()}
        return out["a"] + out["b"].sum(-1, keepdim=True)


def test_module_containers_zip_enumerate_reversed_items():
    m = Stack()
    cf = check(m, [torch.randn(2, 3), torch.randn(2, 3)])
    assert_stats(cf, graphs=1, breaks=0, hits=1, misses=1)


def test_module_list_grown_after_capture_recompiles():
    m = Stack()

    def mutate(i):
        if i == 2:
            m.convs.append(nn.Linear(3, 3))
            m.norms.append(nn.LayerNorm(3))

    x = torch.randn(2, 3)
    cf = check(m, [x, x, x], mutate=mutate)
    e = assert_stats(cf, graphs=2, breaks=0, hits=1, misses=2)
    assert e.recompile_reasons[0].startswith("len(L['self'].convs._modules)")


def test_zip_of_lists_of_different_lengths():
    def f(xs, ys):
        return [a * b for a, b in zip(xs, ys)]

    t = torch.ones(2)
    cf = check(f, [([t, t * 2], [t, t, t]), ([t, t * 3], [t, t, t]), ([t, t * 3], [t, t])])
    assert_stats(cf, graphs=2, breaks=0, hits=1, misses=2)


def test_enumerate_with_start_and_tensor_rows():
    def f(x):
        total = x[0] * 0
        for i, row in enumerate(x, 1):
            total = total + row * i
        return total

    cf = check(f, [torch.randn(3, 2), torch.randn(3, 2)])
    assert_stats(cf, graphs=1, breaks=0, hits=1, misses=1)


def test_dict_items_keys_values_get():
    def f(losses, w):
        total = 0
        for name, value in losses.items():
            total = total + value * w.get(name, 1.0)
        n = len([k for k in losses.keys()])
        return total / n + sum([v.sum() for v in losses.values()])

    a, b = torch.ones(1), torch.ones(1) * 2
    cf = check(f, [({"ce": a, "l1": b}, {"ce": 0.5}), ({"ce": b, "l1": a}, {"ce": 0.5}),
                   ({"ce": a, "l1": b}, {"ce": 0.5, "l1": 3.0})])
    e = assert_stats(cf, graphs=2, breaks=0, hits=1, misses=2)
    assert e.recompile_reasons == ["`L['w']`: expected no key 'l1', found one (3.0)"]


def test_fresh_dict_iteration_in_insertion_order():
    def f(x):
        d = {"b": x * 2}
        d["a"] = x + 1
        return torch.stack([v for v in d.values()] + [d[k] for k in d])

    cf = check(f, [torch.randn(2), torch.randn(2)])
    assert_stats(cf, graphs=1, breaks=0, hits=1, misses=1)


def test_reversed_range_and_list():
    def f(x, xs):
        out = x
        for i in reversed(range(3)):
            out = out * (i + 1)
        for t in reversed(xs):
            out = out - t
        return out

    t = torch.ones(2)
    cf = check(f, [Call(t, [t, t * 2]), Call(t * 3, [t, t * 2])])
    assert_stats(cf, graphs=1, breaks=0, hits=1, misses=1)


def test_zip_with_keyword_breaks_and_is_correct():
    def f(xs, ys):
        return [a + b for a, b in zip(xs, ys, strict=True)]

    t = torch.ones(2)
    cf = check(f, [([t], [t]), ([t], [t * 2])])
    assert break_ids(cf) == ["MB003"]


def test_sum_and_max_of_tensors_replay_the_builtin():
    def f(losses, a, b):
        return sum(losses.values()) + max(a, b) + abs(a - b)

    x, y = torch.ones(1), torch.full((1,), 3.0)
    cf = check(f, [({"a": x, "b": y}, x, y), ({"a": y, "b": x}, y, x)])
    assert_stats(cf, graphs=1, breaks=0, hits=1, misses=1)


def test_builtin_turning_tensor_into_python_value_breaks():
    def f(x):
        return x * 2 if any(x > 0) else x

    cf = check(f, [torch.ones(2), -torch.ones(2)])
    assert break_ids(cf) == ["MB002"]


def test_list_and_tuple_of_views_and_iterators():
    def f(d, xs):
        keys = list(d.keys())
        pairs = list(zip(keys, xs))
        numbered = tuple(enumerate(xs))
        return [d[k] * x for k, x in pairs], len(numbered), list(d.items())[0][1]

    t = torch.ones(2)
    cf = check(f, [({"a": t, "b": t * 2}, [t, t * 3]), ({"a": t * 5, "b": t}, [t, t])])
    assert_stats(cf, graphs=1, breaks=0, hits=1, misses=1)


def test_iter_and_next_take_the_items_a_for_loop_would():
    layers = nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 3)])

    def f(x, xs):
        first = next(iter(xs))
        it = iter(layers)
        l0 = next(it)
        a, b = next(zip(xs, reversed(xs)))
        rest = [layer(x) for layer in it]  # the iterator goes on where next() left it
        return l0(x) + first + a * b + next(layers.parameters()).sum() + sum(rest)

    cf = check(f, [(torch.randn(3), [torch.randn(3), torch.randn(3)]) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_next_with_a_default_at_the_end_breaks():
    def f(x, xs):
        it = iter(xs)
        next(it)
        return x + (next(it, None) is None)

    cf = check(f, [(torch.randn(2), [1]) for _ in range(3)])
    assert break_ids(cf) == ["MB004"]


# sorted() of items whose order the guards fix (Monitor::sorted_items)

def test_sorted_keys_and_items_of_a_dict_passed_in():
    def by_keys(x, d):
        out = x
        for k in sorted(d):
            out = out * 2 + d[k]
        return out

    def by_items(x, d):
        return [v * x + len(k) for k, v in sorted(d.items(), reverse=True)]

    x = torch.randn(3)
    calls = [(x, {"b": torch.ones(3), "a": torch.zeros(3)})] * 2 + \
        [(x, {"b": torch.ones(3), "a": torch.zeros(3), "c": torch.full((3,), 2.0)})]
    cf = check(by_keys, calls)
    assert_stats(cf, graphs=2, breaks=0, hits=1, misses=2)  # new keys: a new capture
    cf = check(by_items, calls)
    assert_stats(cf, graphs=2, breaks=0, hits=1, misses=2)


def test_sorted_numbers_of_a_list_passed_in_recompile_when_they_change():
    def f(x, ks):
        return sum(x * k for k in sorted(ks)) + x * sorted(ks, reverse=True)[0]

    x = torch.randn(3)
    cf = check(f, [(x, [3, 1, 2]), (x, [3, 1, 2]), (x, [1, 5, 2]), (x, [1, 5, 2])])
    assert_stats(cf, breaks=0, hits=2, misses=2)


def test_sorted_tensors_break_with_the_tensor_reason():
    def f(x):
        return sorted([x.sum(), x.mean()])[0] * x

    cf = check(f, [torch.randn(3) for _ in range(3)])
    assert break_ids(cf) == ["MB002"]


# sorted/min/max with a key function: its calls from C are traced ([Note: key functions])

def test_sorted_by_a_key_of_sizes_recompiles_when_the_order_changes():
    def f(xs):
        ys = sorted(xs, key=lambda t: t.shape[0], reverse=True)
        return torch.cat(ys), ys[0] * 2

    a, b, c = torch.randn(3), torch.randn(1), torch.randn(2)
    cf = check(f, [[a, b, c], [a, b, c], [b, a, c], [torch.randn(3), torch.randn(1), torch.randn(2)]])
    assert_stats(cf, graphs=2, breaks=0, hits=2, misses=2)


def test_sorted_dict_items_and_keys_by_a_key_function():
    order = {"c": 0, "a": 1, "b": 2}

    def f(x, d):
        out = x
        for k, v in sorted(d.items(), key=lambda kv: order[kv[0]]):
            out = out * 2 + v
        ks = sorted(d, key=lambda k: -order[k])
        return out, [d[k] + 1 for k in ks], sorted(["bb", "a", "ccc"], key=len)

    def d():
        return {"a": torch.randn(2), "b": torch.randn(2), "c": torch.randn(2)}

    cf = check(f, [(torch.randn(2), d()) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)


def test_sorted_items_of_a_dict_of_constants_by_value():
    # the pairs are constants, folded into one tuple each: the key's calls from C still match
    def f(x):
        by_value = sorted({"b": 2, "a": 1, "c": 3}.items(), key=lambda kv: kv[1])
        table = {k: v for k, v in sorted({"y": 1, "x": 0}.items(), key=lambda kv: -kv[1])}
        return x * by_value[0][1] + by_value[-1][1], list(table), by_value

    cf = check(f, [torch.randn(2) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)


def test_sum_min_max_of_iterators_and_of_the_rest_of_one():
    def f(x, xs, d):
        it = iter(xs)
        first = next(it)
        rest = sum(it)  # what next() took is not in it
        return (first * 2 + rest, sum(itertools.chain([x], xs)), sum(reversed(xs)),
                sum(d.values()), max(itertools.chain([3, 1], [2])) * x,
                min(reversed([4, 2, 5])), sum(v * k for k, v in zip([1, 2], reversed(xs))))

    calls = [(torch.randn(2), [torch.randn(2) for _ in range(3)],
              {"a": torch.randn(2), "b": torch.randn(2)}) for _ in range(3)]
    cf = check(f, calls)
    assert_stats(cf, graphs=1, breaks=0, hits=2)


def test_min_max_sorted_of_dict_items_by_a_builtin_key_give_the_items_not_the_default():
    # a builtin key is folded, so no frame rebinds the pairs C code makes: they are matched by
    # their items
    def f(x, d):
        longest = max(d.items(), key=len, default=None)
        least = min({"p": 4, "q": 2}.items(), key=operator.itemgetter(1), default=None)
        ranked = sorted({"p": 4, "q": 2, "r": 3}.items(), key=operator.itemgetter(1))
        return x * least[1], longest[0], ranked

    cf = check(f, [(torch.randn(2), {"a": 1, "b": 2}) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)


def test_key_functions_over_generators(capsys):
    # max() calls the key between the generator's yields, sorted() after all of them
    def f(x, xs, names):
        widest = max((t for t in xs), key=lambda t: t.shape[-1])
        order = sorted((n for n in names), key=lambda n: -len(n))
        picked = min(((i, t) for i, t in enumerate(xs)), key=operator.itemgetter(0))
        return widest * x.sum(), order, picked[1] + 1

    calls = [(torch.randn(2), [torch.randn(2, 3), torch.randn(2, 5)], ["ab", "abc", "a"])
             for _ in range(3)]
    cf = check(f, calls)
    assert_stats(cf, graphs=1, breaks=0, hits=2)

    def noisy(x, xs):
        def gen():
            for t in xs:
                print("yield", t.shape[-1])
                yield t

        def key(t):
            print("key", t.shape[-1])
            return t.shape[-1]

        return max(gen(), key=key) * x

    calls = [(torch.randn(1), [torch.randn(1, 3), torch.randn(1, 2)])] * 3
    eager = []
    for c in calls:
        noisy(*c)
        eager.append(capsys.readouterr().out)
    cn = magpy.compile(noisy)
    for c, want in zip(calls, eager):
        cn(*c)
        assert capsys.readouterr().out == want  # the same interleaving at replay
    assert_stats(cn, graphs=1, breaks=0, hits=2)


def test_min_max_with_a_key_function_or_a_method_key():
    class Picker(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rank = {"x": 2, "y": 0, "z": 1}

        def score(self, name):
            return self.rank[name]

        def forward(self, feats):
            best = max(feats, key=self.score)
            widest = min(feats.values(), key=lambda t: -t.shape[-1])
            first = max([], key=len, default=None)
            return feats[best] * 2, widest + 1, first, max(3, 5, 4, key=lambda n: n % 3)

    m = Picker()
    feats = [{"x": torch.randn(2, 3), "y": torch.randn(2, 5), "z": torch.randn(2, 4)} for _ in range(3)]
    cf = check(m, feats)
    assert_stats(cf, graphs=1, breaks=0, hits=2)
    m.rank["y"] = 9  # the key reads it: guarded
    check(m, feats[:1], compiled=cf)
    assert_stats(cf, graphs=2, misses=2)


def test_key_function_with_a_print_prints_once_per_item_in_order(capsys):
    def f(x, names):
        def key(n):
            print("key", n)
            return len(n)
        return [x * len(n) for n in sorted(names, key=key)]

    check(f, [(torch.randn(2), ["ccc", "a", "bb"])] * 3)
    out = capsys.readouterr().out
    assert out == "key ccc\nkey a\nkey bb\n" * 6  # three eager calls, three compiled ones


def test_list_sort_with_and_without_a_key():
    def made_here(boxes):
        dets = [(b, b.shape[0]) for b in boxes]
        dets.sort(key=lambda p: p[1], reverse=True)
        names = ["b", "c", "a"]
        names.sort()
        return [p[0] * 2 for p in dets], names

    def passed_in(x, ks):
        ks.sort()  # the caller's list is sorted at replay too
        return x * ks[0]

    def keyed_passed_in(x, ks):
        ks.sort(key=lambda k: -k)
        return x * ks[0]

    cf = check(made_here, [[torch.randn(3), torch.randn(1), torch.randn(2)] for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)
    cf = check(passed_in, [(torch.randn(2), [3, 1, 2]) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)
    cf = check(keyed_passed_in, [(torch.randn(2), [3, 1, 2]) for _ in range(3)])
    assert "sorted(..., key=...)" in str(magpy.explain(cf))


def test_key_that_reads_tensor_data_breaks_with_the_tensor_reason():
    def f(xs):
        return sorted(xs, key=lambda t: t.sum())[0] * 2

    cf = check(f, [[torch.randn(3) for _ in range(3)] for _ in range(3)])
    assert "MB002" in break_ids(cf)
    assert "the order depends on data" in str(magpy.explain(cf))


def test_key_called_from_c_that_cannot_be_followed_breaks_with_a_hint():
    def f(xs):
        return sorted(xs, key=torch.numel)[0] * 2

    cf = check(f, [[torch.randn(3), torch.randn(1)] for _ in range(3)])
    assert "MB003" in break_ids(cf)
    assert "use a lambda or a def as the key" in str(magpy.explain(cf))


def itertools_mix(xs, ws):
    import itertools
    out = [xs[a] * ws[b] for a, b in itertools.product(range(2), range(len(ws)))]
    pairs = [x * y for x, y in itertools.combinations(xs, 2)]
    perms = [x - y for x, y in itertools.permutations(xs, 2)]
    singles = [t for t in itertools.product(ws)]  # 1-tuples
    chained = list(itertools.chain(xs, ws, [out[0]]))
    return out, pairs, perms, singles, chained


def test_itertools_product_combinations_permutations_chain():
    calls = [([torch.randn(2) for _ in range(3)], [torch.randn(2), torch.randn(2)])
             for _ in range(3)]
    cf = check(itertools_mix, calls)
    assert_stats(cf, graphs=1, breaks=0, hits=2)
    # a different number of items is another trip count: recompiled, not replayed wrong
    check(itertools_mix, [([torch.randn(2) for _ in range(4)], [torch.randn(2)])], compiled=cf)
    assert_stats(cf, graphs=2, hits=2, misses=2)


def more_itertools(xs, sizes, rows):
    offsets = [0] + list(itertools.accumulate(sizes))  # split points from sizes
    chunks = [xs[0][offsets[i]:offsets[i + 1]] for i in range(len(sizes))]
    firsts = list(itertools.islice(xs, 2)) + list(itertools.islice(xs, 1, None, 2))
    steps = [b - a for a, b in itertools.pairwise(xs)]
    padded = [a if b is None else a * b for a, b in itertools.zip_longest(xs, [2, 3])]
    filled = [a * b for a, b in itertools.zip_longest(xs, [2], fillvalue=-1)]
    scaled = [x * k for x, k in zip(xs, itertools.repeat(0.5, len(xs)))]
    pairs = [a @ b for a, b in itertools.combinations_with_replacement(xs, 2)]
    made = list(itertools.starmap(lambda t, k: t * k, rows))
    running = list(itertools.accumulate([1, 2, 3], initial=10))
    return chunks, firsts, steps, padded, filled, scaled, pairs, made, running


def test_more_itertools_accumulate_islice_pairwise_zip_longest_repeat_starmap():
    calls = [([torch.randn(4) for _ in range(3)], [1, 3], [(torch.randn(2), 2), (torch.randn(2), 3)])
             for _ in range(3)]
    cf = check(more_itertools, calls)
    assert_stats(cf, graphs=1, breaks=0, hits=2)
    check(more_itertools, [(calls[0][0], [2, 2], calls[0][2])], compiled=cf)  # other sizes
    assert_stats(cf, graphs=2, misses=2)


def test_itertools_that_cannot_be_followed_break_with_a_reason():
    def endless(xs):
        return [x * k for x, k in zip(xs, itertools.repeat(2))]

    def of_tensors(xs):
        return list(itertools.accumulate(xs))

    for fn, words in [(endless, "without a count"), (of_tensors, "which is not a constant")]:
        cf = check(fn, [[torch.randn(2), torch.randn(2)] for _ in range(2)])
        assert "MB003" in break_ids(cf) and words in str(magpy.explain(cf))


def test_operator_itemgetter_and_attrgetter_as_calls_and_sort_keys():
    import operator
    from collections import namedtuple

    Pair = namedtuple("Pair", "value weight")
    second = operator.itemgetter(1)

    def f(x, rows, d, p):
        best = sorted(rows, key=operator.itemgetter(1), reverse=True)
        a, b = operator.itemgetter("a", "b")(d)
        return (second([x, x * 2]) + a * b, best[0][1] * x,
                operator.attrgetter("value", "weight")(p)[1] * x,
                operator.attrgetter("shape")(x)[0] * x)

    calls = [(torch.randn(2), [("a", 1), ("b", 3)], {"a": torch.randn(2), "b": torch.randn(2)},
              Pair(torch.randn(2), 2.0)) for _ in range(3)]
    cf = check(f, calls)
    assert_stats(cf, graphs=1, breaks=0, hits=2)
    check(f, [(calls[0][0], [("a", 5), ("b", 3)]) + calls[0][2:]], compiled=cf)  # new order
    assert_stats(cf, graphs=2, misses=2)

    g = {"key": operator.itemgetter(0)}

    def pick(x, xs):
        return g["key"](xs) * x

    xs = [torch.randn(2), torch.randn(2)]
    cf = check(pick, [(torch.randn(2), xs)] * 2)
    g["key"] = operator.itemgetter(1)  # another getter: guarded by identity
    check(pick, [(torch.randn(2), xs)], compiled=cf)
    assert_stats(cf, graphs=2, misses=2)


def reduce_mix(xs, shape):
    import functools
    import operator
    n = functools.reduce(operator.mul, shape, 1)
    total = functools.reduce(operator.add, xs)
    prod = functools.reduce(torch.mul, xs, torch.ones(2))
    return total.repeat(n) + operator.mul(prod, 2).sum()


def test_functools_reduce_over_numbers_and_tensors():
    cf = check(reduce_mix, [([torch.randn(2) for _ in range(3)], (2, 3)) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)


def test_accumulate_with_a_python_function_breaks_instead_of_folding():
    offset = {"v": 1}
    seen = []

    def add_off(a, b):
        seen.append(b)
        return a + b + offset["v"]

    def f(x, sizes):
        return [x * a for a in itertools.accumulate(sizes, add_off)]

    def mutate(i):
        offset["v"] = 1 if i < 2 else 5

    cf = check(f, [(torch.ones(2), [1, 2, 3]) for _ in range(3)], mutate=mutate,
               snapshot=lambda: list(seen), restore=lambda s: seen.__setitem__(slice(None), s))
    assert magpy.explain(cf).break_count >= 1  # never folded: add_off runs at every call


def test_enumerate_taken_whole_by_dict_unpacking_and_keyed_max():
    def f(x, xs, names):
        table = dict(enumerate(names, 1))
        (i0, a), (i1, b) = enumerate(xs)
        best = max(enumerate([3, 7, 2]), key=lambda p: p[1])[0]
        e = enumerate(xs, 5)
        first = next(e)
        rest = dict(e)  # counted on from where it is
        return table, a * i1 + b, x * best, first[0], list(rest), rest[6] * 2

    cf = check(f, [(torch.randn(2), [torch.randn(2), torch.randn(2)], ["a", "b"]) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)


@pytest.mark.parametrize("wrap", [
    lambda it, names: enumerate(zip(it, names)),
    lambda it, names: zip(enumerate(it), names),
    lambda it, names: enumerate(enumerate(zip(it, names))),
], ids=["enumerate-zip", "zip-enumerate", "enumerate-enumerate-zip"])
def test_an_iterator_passed_in_loses_its_item_to_a_zip_inside_another(wrap):
    # a review probe: eager's zip took one more item from the iterator before it found the
    # names exhausted; the replay took only the items yielded
    def f(x, batches, names):
        out = x
        for item in wrap(batches, names):
            out = out + 1
        return out

    cf = magpy.compile(f)
    for call in range(4):
        ia = iter([torch.full((2,), float(v)) for v in range(10)])
        ib = iter([torch.full((2,), float(v)) for v in range(10)])
        assert torch.equal(f(torch.zeros(2), ia, ["p", "q"]), cf(torch.zeros(2), ib, ["p", "q"]))
        assert torch.equal(next(ia), next(ib)), call


# A review probe (a repetition penalty over a set of seen tokens): a loop over a set that
# breaks inside (a branch on tensor data) resumed from `iter(s).__setstate__(pos)`, which set
# iterators do not have: the second call raised AttributeError.
@pytest.mark.parametrize("made", ["passed in", "made in the call", "enumerate"])
def test_loop_over_a_set_resumed_after_a_break(made):
    def penalize(logits, seen, penalty=1.5):
        tokens = set(seen) if made == "made in the call" else seen
        it = (t for _, t in enumerate(tokens)) if made == "enumerate" else tokens
        for t in it:
            if logits[t] > 0:  # a branch on data: a break inside the loop
                logits[t] = logits[t] / penalty
            else:
                logits[t] = logits[t] * penalty
        return logits

    seen = {1, 3, 4} if made != "made in the call" else [1, 3, 4]
    cf = check(penalize, [(torch.randn(6), seen) for _ in range(4)])
    assert magpy.explain(cf).cache_hits >= 2
