"""Idioms of torch 2 and Python 3.12's standard library, written out so they run here.

The device run on Python 3.12 with torch 2.11 (tests/gpu/lease.sh) found code shapes that the
CPU machines' torch 1.13 and Python 3.11 do not have: torch 2's Module._call_impl iterates
`(*_global_forward_hooks.items(), *self._forward_hooks.items())` inside a closure with
`nonlocal`; TransformerEncoderLayer.forward tests `F._canonical_mask(None, ...) is not None`;
3.12's dataclasses.asdict tests `type(obj) in _ATOMIC_TYPES`, a frozenset of classes. Each test
here has the same shape in code of its own, compared with eager.
"""

import collections
import types

import torch
import torch.nn as nn

from conftest import assert_stats, check

_GLOBAL_PRE = collections.OrderedDict()
_GLOBAL_FWD = collections.OrderedDict()
_ALWAYS = collections.OrderedDict()


class Torch2Call(nn.Module):
    """A module whose __call__ has the structure of torch 2's Module._call_impl."""

    def __call__(self, *args, **kwargs):
        forward_call = self.forward
        if not (self._forward_hooks or self._forward_pre_hooks or _GLOBAL_PRE or _GLOBAL_FWD):
            return forward_call(*args, **kwargs)
        result = None
        called_always = set()

        def inner():
            nonlocal result, args, kwargs
            if _GLOBAL_PRE or self._forward_pre_hooks:
                for hook_id, hook in (*_GLOBAL_PRE.items(), *self._forward_pre_hooks.items()):
                    args_result = hook(self, args)
                    if args_result is not None:
                        if not isinstance(args_result, tuple):
                            args_result = (args_result,)
                        args = args_result
            result = forward_call(*args, **kwargs)
            if _GLOBAL_FWD or self._forward_hooks:
                for hook_id, hook in (*_GLOBAL_FWD.items(), *self._forward_hooks.items()):
                    if hook_id in _ALWAYS:
                        called_always.add(hook_id)
                    hook_result = hook(self, args, result)
                    if hook_result is not None:
                        result = hook_result
            return result

        try:
            return inner()
        except Exception:
            for hook_id, hook in _GLOBAL_FWD.items():
                if hook_id in _ALWAYS and hook_id not in called_always:
                    hook(self, args, result)
            raise


class Block(Torch2Call):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class Net(Torch2Call):
    def __init__(self):
        super().__init__()
        self.a, self.b = Block(), Block()
        self.feats = []

    def forward(self, x):
        return self.b(self.a(x)).sum(-1)


def test_hooks_run_by_a_torch2_style_call_impl_are_traced():
    torch.manual_seed(0)
    m = Net()
    m.a.register_forward_pre_hook(lambda mod, inputs: (inputs[0] * 2,))
    m.a.register_forward_hook(lambda mod, inputs, out: out + inputs[0].sum())
    m.b.register_forward_hook(lambda mod, inputs, out: m.feats.append(out.detach()))
    n = []

    def snapshot():
        n.append(len(m.feats))
        return len(m.feats)

    def restore(k):
        del m.feats[k:]

    cf = check(m, [torch.randn(2, 3) for _ in range(3)], snapshot=snapshot, restore=restore)
    assert_stats(cf, graphs=1, breaks=0, hits=2)
    assert len(m.feats) == 3  # once per compiled call, none lost



def test_a_hook_that_records_and_replaces_the_output_inside_the_call_impl_try():
    # torch 2 runs a module with hooks inside `try: ... except Exception: ...; raise`: the
    # hook's append is a visible write, and `out * 0` after it is in that try. It cannot raise
    # on new data, so it is captured ([Note: steps that cannot raise on new data]).
    torch.manual_seed(0)
    m = Net()
    seen = []
    m.a.register_forward_hook(lambda mod, inputs, out: (seen.append(1), out * 0 + 1)[1])
    cf = check(m, [torch.randn(2, 3) for _ in range(3)], snapshot=lambda: len(seen),
               restore=lambda k: seen.__delitem__(slice(k, None)))
    assert_stats(cf, graphs=1, breaks=0, hits=2)
    assert len(seen) == 3


def test_a_pre_hook_that_records_before_leaf_modules_inside_the_call_impl_try():
    # the pre-hook's append is visible, and the block's Linear runs after it inside the try:
    # a leaf module of torch.nn is let through with its parameters and attributes guarded
    torch.manual_seed(0)
    m = Net()
    seen = []
    m.a.register_forward_pre_hook(lambda mod, inputs: seen.append(1))

    def mutate(i):
        if i == 3:  # replaced by an inference tensor: a guard miss, not a replay that raises
            with torch.inference_mode():
                w = m.a.lin.weight.detach().clone()
            m.a.lin.weight = nn.Parameter(w, requires_grad=False)

    cf = check(m, [torch.randn(2, 3) for _ in range(5)], mutate=mutate,
               snapshot=lambda: len(seen), restore=lambda k: seen.__delitem__(slice(k, None)))
    e = assert_stats(cf, graphs=2, breaks=0, hits=3)
    assert any("lin._parameters" in g or "lin.weight" in g for g in map(str, e.guards)), e.guards

def test_dict_items_unpacked_into_a_tuple_and_iterated():
    # the rows are pairs the dict views make, holding objects (not constants)
    a = collections.OrderedDict(x=torch.tanh, y=lambda t: t * 2)
    b = {"z": nn.ReLU()}

    def f(t):
        for name, fn in (*a.items(), *b.items()):
            if name in ("x", "z"):
                t = fn(t) - 0.5
            else:
                t = fn(t)
        return t

    cf = check(f, [torch.randn(4) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)


def _canonical(mask, target_type):
    # torch 2's F._canonical_mask: None stays None, a bool mask becomes an additive one
    if mask is not None:
        if not torch.is_floating_point(mask):
            mask = torch.zeros_like(mask, dtype=target_type).masked_fill_(mask, float("-inf"))
    return mask


def _none_or_dtype(t):
    return None if t is None else t.dtype


# torch's own Python helpers are recorded as ops, not traced: these stand for F's
_canonical.__module__ = _none_or_dtype.__module__ = "torch.nn.functional"


def test_a_torch_helper_giving_none_for_constant_arguments_is_not_a_break():
    def layer(x, mask=None, other=None):
        m = _canonical(mask, x.dtype if _none_or_dtype(other) is None else _none_or_dtype(other))
        if m is not None:
            x = x + m
        return x.softmax(-1)

    mask = torch.tensor([[True, False, False]])
    cf = check(layer, [torch.randn(2, 3) for _ in range(3)] + [(torch.randn(2, 3), mask)] * 2)
    assert_stats(cf, graphs=2, breaks=0, hits=3)


_ATOMIC = frozenset({types.NoneType, bool, int, float, str, complex, bytes, type, range})
_KINDS = {int, float}  # a set of classes that the program changes between calls


def test_in_a_frozenset_or_set_of_classes_is_known():
    def f(x, v):
        if type(v) in _ATOMIC:  # 3.12's dataclasses._asdict_inner
            x = x * 2
        if type(v) not in _KINDS:
            x = x - 1
        return x

    def mutate(i):
        if i == 3:
            _KINDS.add(list)

    try:
        cf = check(f, [(torch.randn(2), v) for v in (2.0, 2.0, [1], [1], [1], 2.0)],
                   mutate=mutate)
        e = assert_stats(cf, breaks=0)
        assert (e.cache_hits, e.cache_misses) == (2, 4)  # the set changed: calls 3 and 5 recompile
    finally:
        _KINDS.discard(list)
