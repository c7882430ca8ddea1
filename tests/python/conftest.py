"""Shared helpers for the magpy behaviour suite.

Every test compares a compiled callable against the plain (eager) callable on every call:

* inputs are deep-copied per world, so in-place changes to arguments are compared too;
* external state the function changes (globals, attributes, lists passed in) is compared with
  `snapshot`/`restore`: the state is snapshotted, the eager call runs, its resulting state is
  recorded, the state is restored, the compiled call runs, and both end states must match;
* `mutate(i)` runs before call i (both worlds) and changes external state to prove that the
  guards notice.
"""

import copy
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
for p in (os.path.join(ROOT, "core", "python"), os.path.join(ROOT, "build", "python")):
    if p not in sys.path:
        sys.path.insert(0, p)

import magpy  # noqa: E402

# MAGPY_TEST_BACKEND=torchscript runs the whole suite through another backend: every comparison
# with eager then checks that backend (ctest runs it as pytest_engine_torchscript).
_TEST_BACKEND = os.environ.get("MAGPY_TEST_BACKEND")
if _TEST_BACKEND:
    _compile = magpy.compile

    def _compile_with_backend(fn_or_module, backend=_TEST_BACKEND, *args, **kwargs):
        return _compile(fn_or_module, backend, *args, **kwargs)

    magpy.compile = _compile_with_backend

# Backends that generate their own kernels (inductor) may fuse and reorder floating-point
# arithmetic and use vectorised math functions: their results are compared within a relative
# 1e-4 (inductor's own tests allow as much), everything else bit-for-bit.
_TOLERANCE = (1e-4, 1e-5) if _TEST_BACKEND in ("inductor", "cudagraphs") else (0, 0)


@pytest.fixture(autouse=True)
def _fresh_magpy():
    """Every test starts (and ends) with empty caches and default torch state."""
    magpy.reset()
    grad = torch.is_grad_enabled()
    dtype = torch.get_default_dtype()
    yield
    torch.set_grad_enabled(grad)
    torch.set_default_dtype(dtype)
    magpy.reset()


class Call:
    """Positional and keyword arguments of one call."""

    def __init__(self, *args, **kwargs):
        self.args = args
        self.kwargs = kwargs

    def __repr__(self):
        return f"Call(*{self.args!r}, **{self.kwargs!r})"


def _pinned_memo(obj, memo):
    """Objects that keep their identity across copies (modules, functions, classes)."""
    if isinstance(obj, torch.nn.Module) or callable(obj) and not isinstance(obj, torch.Tensor):
        memo[id(obj)] = obj
        return
    if isinstance(obj, (list, tuple)):
        for o in obj:
            _pinned_memo(o, memo)
    elif isinstance(obj, dict):
        for o in obj.values():
            _pinned_memo(o, memo)


def fresh_copy(obj, pin=()):
    """A deep copy in which modules, functions and `pin` objects are shared, not copied."""
    memo = {}
    _pinned_memo(obj, memo)
    for p in pin:
        memo[id(p)] = p
    return copy.deepcopy(obj, memo)


def equal(a, b):
    """torch.equal, or for backends that generate their own kernels, equal within their
    tolerance (above): for tests that compare tensors of eager and compiled runs by hand."""
    if _TOLERANCE == (0, 0):
        return torch.equal(a, b)
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(
        a.detach(), b.detach(), rtol=_TOLERANCE[0], atol=_TOLERANCE[1], equal_nan=True)


def assert_same(actual, expected, path="result"):
    """Exact equality of results: tensors bit-for-bit (with metadata), containers recursively."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual)}"
        assert type(actual) is type(expected), f"{path}: type {type(actual)} vs {type(expected)}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} vs {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} vs {expected.shape}"
        assert actual.device == expected.device, f"{path}: device"
        assert actual.requires_grad == expected.requires_grad, f"{path}: requires_grad"
        torch.testing.assert_close(actual.detach(), expected.detach(), rtol=_TOLERANCE[0],
                                   atol=_TOLERANCE[1],
                                   equal_nan=True, msg=lambda m: f"{path}: {m}")
        return
    if isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected), f"{path}: type {type(actual)} vs {type(expected)}"
        assert len(actual) == len(expected), f"{path}: len {len(actual)} vs {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}[{i}]")
        return
    if isinstance(expected, dict):
        assert type(actual) is type(expected), f"{path}: type {type(actual)} vs {type(expected)}"
        assert list(actual.keys()) == list(expected.keys()), f"{path}: keys"
        for k in expected:
            assert_same(dict.__getitem__(actual, k), dict.__getitem__(expected, k),
                        f"{path}[{k!r}]")
        if type(expected).__module__ not in ("builtins", "collections"):
            # a dict subclass of the user's (a ModelOutput): its attributes too
            assert_same(_object_state(actual), _object_state(expected), f"{path}.<state>")
        return
    if isinstance(expected, torch.nn.Module) or callable(expected) or isinstance(expected, type):
        assert actual is expected, f"{path}: {actual!r} is not {expected!r}"
        return
    if type(expected).__module__ not in ("builtins", "torch"):
        # a user object: compare its type and its state (__dict__ and __slots__)
        assert type(actual) is type(expected), f"{path}: type {type(actual)} vs {type(expected)}"
        assert_same(_object_state(actual), _object_state(expected), f"{path}.<state>")
        return
    if isinstance(expected, float) and expected != expected:
        assert isinstance(actual, float) and actual != actual, f"{path}: {actual!r} vs nan"
        return
    assert type(actual) is type(expected), f"{path}: type {type(actual)} vs {type(expected)}"
    assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def _object_state(o):
    state = dict(getattr(o, "__dict__", {}))
    for cls in type(o).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(o, name):
                state[name] = getattr(o, name)
    return state


def check(fn, calls, *, mutate=None, snapshot=None, restore=None, seed=None, pin=(),
          compiled=None, **compile_kwargs):
    """Compile `fn` (after magpy.reset()) and compare it with eager `fn` on every call.

    calls: a list whose items are argument tuples, single non-tuple arguments, or `Call`s.
    mutate(i): changes external state before call i (applies to both worlds).
    snapshot()/restore(s): the external state the function writes (see module docstring).
    seed: if given, torch.manual_seed(seed) before each of the eager and compiled calls.
    compiled: reuse this compiled callable instead of compiling `fn` (no reset).
    Returns the compiled callable.
    """
    if compiled is None:
        magpy.reset()
        cf = magpy.compile(fn, **compile_kwargs)
    else:
        cf = compiled
    for i, c in enumerate(calls):
        if not isinstance(c, Call):
            c = Call(*c) if isinstance(c, tuple) else Call(c)
        if mutate is not None:
            mutate(i)
        eager_in = fresh_copy((c.args, c.kwargs), pin)
        comp_in = fresh_copy((c.args, c.kwargs), pin)
        before = snapshot() if snapshot else None
        if seed is not None:
            torch.manual_seed(seed)
        expected = fn(*eager_in[0], **eager_in[1])
        eager_state = snapshot() if snapshot else None
        if restore is not None:
            restore(before)
        if seed is not None:
            torch.manual_seed(seed)
        actual = cf(*comp_in[0], **comp_in[1])
        assert_same(actual, expected, f"call {i}: result")
        assert_same(comp_in, eager_in, f"call {i}: arguments after the call")
        if snapshot:
            assert_same(snapshot(), eager_state, f"call {i}: external state")
    return cf


def assert_raises_like_eager(fn, make_args, exc_type, calls=2, compiled=None, **compile_kwargs):
    """Compile `fn` (or use `compiled`) and check that each call raises `exc_type` with eager's
    message."""
    if compiled is None:
        magpy.reset()
        cf = magpy.compile(fn, **compile_kwargs)
    else:
        cf = compiled
    for _ in range(calls):
        with pytest.raises(exc_type) as eager:
            fn(*make_args())
        with pytest.raises(exc_type) as compiled:
            cf(*make_args())
        assert str(compiled.value) == str(eager.value)
    return cf


def stats(cf):
    """(graph_count, break_count, cache_hits, cache_misses, cache_entries)."""
    e = magpy.explain(cf)
    return e.graph_count, e.break_count, e.cache_hits, e.cache_misses, e.cache_entries


def assert_stats(cf, graphs=None, breaks=None, hits=None, misses=None, entries=None):
    e = magpy.explain(cf)
    got = dict(graphs=e.graph_count, breaks=e.break_count, hits=e.cache_hits,
               misses=e.cache_misses, entries=e.cache_entries)
    want = dict(graphs=graphs, breaks=breaks, hits=hits, misses=misses, entries=entries)
    for k, v in want.items():
        if v is not None:
            assert got[k] == v, f"{k}: expected {v}, got {got[k]} (all: {got})\n{e}"
    return e


def break_ids(cf):
    return [b.reason_id for b in magpy.explain(cf).breaks]


def module_state(m):
    """Visible state of a module: its state_dict (cloned), training flags, plain attributes."""
    sd = {k: v.detach().clone() for k, v in m.state_dict(keep_vars=True).items()}
    flags = [mod.training for mod in m.modules()]
    attrs = {k: copy.deepcopy(v) for k, v in vars(m).items()
             if not k.startswith("_") and k != "training"}
    return sd, flags, attrs


def restore_module(m, state):
    sd, flags, attrs = state
    with torch.no_grad():
        for k, v in m.state_dict(keep_vars=True).items():
            v.copy_(sd[k])
    for mod, f in zip(m.modules(), flags):
        mod.training = f
    for k, v in attrs.items():
        setattr(m, k, copy.deepcopy(v))


def run_isolated(source, timeout=60):
    """Run `source` in a fresh interpreter (for cases that may crash the process).

    The snippet has `torch`, `magpy` and `same(a, b)` (exact comparison) available and should
    print "OK" at the end. Returns (returncode, stdout + stderr).
    """
    import subprocess
    import textwrap
    prelude = textwrap.dedent("""
        import sys
        sys.path[:0] = [%r, %r]
        import torch, magpy
        def same(a, b):
            if isinstance(b, torch.Tensor):
                return (isinstance(a, torch.Tensor) and a.dtype == b.dtype
                        and a.shape == b.shape and torch.equal(a, b))
            if isinstance(b, (list, tuple)):
                return type(a) is type(b) and len(a) == len(b) and all(
                    same(x, y) for x, y in zip(a, b))
            return type(a) is type(b) and a == b
    """) % (os.path.join(ROOT, "core", "python"), os.path.join(ROOT, "build", "python"))
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(source)],
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def assert_isolated_ok(source):
    rc, out = run_isolated(source)
    assert rc == 0 and out.rstrip().endswith("OK"), f"exit code {rc}:\n{out[-3000:]}"
