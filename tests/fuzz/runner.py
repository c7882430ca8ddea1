"""Differential runner: each generated program runs in two worlds, eager and compiled.

A world is the program's source executed into a fresh module namespace (same torch seed, so the
same tensors, weights and objects): two worlds are deep, independent copies of all the state the
program can reach (executing the source twice copies everything, classes and functions included,
which copy.deepcopy would share). For call i, in each world: `mutate(i)` (i > 0), `make_args(i)`, then the call
(eager `fn`, or `magpy.compile(fn)` in the other world), each step after `torch.manual_seed` with
the same seed. After each call the runner compares, between the worlds:

* the outcome: the return value, or the exception's type;
* the arguments after the call (in-place changes to tensors, lists and dicts passed in);
* the program's module state (globals, the objects, list, dict and module it keeps);
* aliasing: which compared values are the same object (a returned list that is the caller's
  list, a tensor returned as is) and which tensors share storage.

Tensors are compared on dtype, shape, strides, storage offset, requires_grad and values (equal,
or allclose with rtol=1e-6, atol=1e-7: the eager backend replays the same kernels).
"""

import contextlib
import functools
import io
import linecache
import math
import os
import sys
import time
import traceback
import types
import warnings
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
for _p in (HERE, os.path.join(ROOT, "core", "python"), os.path.join(ROOT, "build", "python")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import magpy  # noqa: E402
from gen import generate  # noqa: E402

# torch's warnings filed once per process in C++ (TORCH_WARN_ONCE: torch 2's "Converting a
# tensor with requires_grad=True to a scalar" in float(t)) would reach only the world that ran
# first, eager (fuzz seed 369 on the device machine): every one is filed every time instead.
torch.set_warn_always(True)

RTOL = 1e-6
ATOL = 1e-7
N_CALLS = 6


@dataclass
class Mismatch:
    call: int
    diffs: list

    def __str__(self):
        return f"call {self.call}:\n" + "\n".join("    " + d for d in self.diffs[:20])


@dataclass
class Result:
    seed: int
    source: str
    mismatches: list = field(default_factory=list)
    breaks: list = field(default_factory=list)     # reason ids, one per recorded break
    graphs: int = 0
    hits: int = 0
    misses: int = 0
    resume_hits: int = 0                           # calls of code after a graph break
    resume_misses: int = 0
    exceptions: int = 0                            # calls that raised (in both worlds)
    gen_error: str = ""                            # the program itself did not load
    seconds: float = 0.0

    @property
    def ok(self):
        return not self.mismatches and not self.gen_error

    def report(self):
        lines = [f"=== magpy fuzz mismatch: seed {self.seed} "
                 f"(magpy.compile(fn, cache_limit={cache_limit_for(self.seed)})) ==="]
        if self.gen_error:
            lines.append("generator error: " + self.gen_error)
        for m in self.mismatches:
            lines.append(str(m))
        lines.append("--- program ---")
        lines.append(self.source)
        lines.append(f"--- reproduce: /usr/bin/python3 tests/fuzz/run.py --seed {self.seed} "
                     f"--count 1 -v")
        return "\n".join(lines)


# ---------------------------------------------------------------------- worlds

def make_world(source, seed, tag):
    name = f"magpy_fuzz_{tag}_{seed}"
    filename = f"<magpy-fuzz-{seed}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    mod = types.ModuleType(name)
    mod.__file__ = filename
    torch.manual_seed(seed)
    exec(compile(source, filename, "exec"), mod.__dict__)
    return mod


def world_state(mod):
    """The module state the program can change (its globals, minus code and imports)."""
    out = {}
    for k, v in mod.__dict__.items():
        if k.startswith("_") or k in ("torch", "nn"):
            continue
        if isinstance(v, (types.ModuleType, type)) or callable(v) and not isinstance(
                v, torch.nn.Module) and k != "HELPER":
            continue
        out[k] = v
    # class attributes the program may change
    if hasattr(mod, "Obj"):
        out["Obj.__dict__"] = {k: v for k, v in vars(mod.Obj).items() if not k.startswith("__")}
    return out


def _seed(base, i, step):
    return (base * 1000003 + i * 17 + step) % (2 ** 62)


def run_call(mod, f, i, base):
    """One call in one world: (mutate outcome, args, kwargs, outcome, what it printed).

    Grad mode is process-wide torch state that `mutate` may change: each world keeps its own
    and it is swapped in around the world's steps."""
    torch.set_grad_enabled(mod.__dict__.get("__fuzz_grad__", True))
    try:
        return _run_call(mod, f, i, base)
    finally:
        mod.__dict__["__fuzz_grad__"] = torch.is_grad_enabled()
        torch.set_grad_enabled(True)


def _run_call(mod, f, i, base):
    if i > 0:
        torch.manual_seed(_seed(base, i, 1))
        try:
            mod.mutate(i)
            mut = ("ok", None)
        except Exception as e:  # noqa: BLE001
            mut = ("exc", e)
    else:
        mut = ("ok", None)
    torch.manual_seed(_seed(base, i, 2))
    args, kwargs = mod.make_args(i)
    torch.manual_seed(_seed(base, i, 3))
    grad = torch.is_grad_enabled()
    printed = io.StringIO()  # what the call printed and warned is part of what it did
    autocast = getattr(mod, "AUTOCAST_SEQ", None)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter(getattr(mod, "WARN_MODE", "always"))
        try:
            with contextlib.redirect_stdout(printed), \
                    torch.autocast("cpu", dtype=torch.bfloat16,
                                   enabled=bool(autocast and autocast[i])):
                out = ("ok", f(*args, **kwargs))
        except Exception as e:  # noqa: BLE001
            out = ("exc", e)
    if torch.is_grad_enabled() != grad:
        out = ("grad-mode-changed", out)
    # the warnings filed in the program's file (the same in both worlds) or, through a
    # stacklevel, in this one, with the line they name
    printed.write("".join(f"[{w.category.__name__} at {w.filename}:{w.lineno}] {w.message}\n"
                          for w in warned if w.filename in (mod.__file__, __file__)))
    return mut, args, kwargs, out, printed.getvalue()


# ---------------------------------------------------------------------- comparison

class Comparer:
    """Walks two values in parallel, collecting differences as strings."""

    def __init__(self):
        self.diffs = []
        self.ids_a, self.ids_b = {}, {}
        self.st_a, self.st_b = {}, {}

    def diff(self, path, msg):
        if len(self.diffs) < 50:
            self.diffs.append(f"{path}: {msg}")

    def identity(self, a, b, path):
        """Same-object structure: returns True if already visited (stop walking)."""
        pa, pb = self.ids_a.get(id(a)), self.ids_b.get(id(b))
        if pa is None and pb is None:
            self.ids_a[id(a)] = (path, a)
            self.ids_b[id(b)] = (path, b)
            return False
        if pa is None or pb is None or pa[0] != pb[0]:
            ea = "same object as " + pa[0] if pa else "a new object"
            eb = "same object as " + pb[0] if pb else "a new object"
            self.diff(path, f"aliasing differs: eager is {ea}, compiled is {eb}")
        return True

    def storage(self, a, b, path):
        if a.numel() == 0 or b.numel() == 0 or a.layout != torch.strided:
            return
        try:
            sa, sb = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
        except Exception:  # noqa: BLE001
            return
        ma, mb = self.st_a.get(sa), self.st_b.get(sb)
        if ma is None and mb is None:
            self.st_a[sa] = (path, sb)
            self.st_b[sb] = (path, sa)
            return
        if ma is None or mb is None or ma[1] != sb or mb[1] != sa:
            self.diff(path, "storage sharing differs: eager shares with "
                            f"{ma[0] if ma else 'nothing'}, compiled with "
                            f"{mb[0] if mb else 'nothing'}")

    def tensor(self, a, b, path):
        if type(a) is not type(b):
            return self.diff(path, f"type {type(a).__name__} vs {type(b).__name__}")
        for attr in ("dtype", "shape", "requires_grad", "device"):
            if getattr(a, attr) != getattr(b, attr):
                return self.diff(path, f"{attr} {getattr(a, attr)} (eager) vs "
                                       f"{getattr(b, attr)} (compiled)")
        if a.layout == torch.strided and a.numel() > 0:
            if a.stride() != b.stride():
                self.diff(path, f"stride {a.stride()} (eager) vs {b.stride()} (compiled)")
            if a.storage_offset() != b.storage_offset():
                self.diff(path, f"storage_offset {a.storage_offset()} (eager) vs "
                                f"{b.storage_offset()} (compiled)")
        self.storage(a, b, path)
        ad, bd = a.detach(), b.detach()
        if torch.equal(ad, bd):
            return
        if ad.is_floating_point() or ad.is_complex():
            if torch.allclose(ad, bd, rtol=RTOL, atol=ATOL, equal_nan=True):
                return
            with torch.no_grad():
                err = (ad - bd).abs()
                err = err[~torch.isnan(err)]
                worst = err.max().item() if err.numel() else float("nan")
            return self.diff(path, f"values differ (max abs diff {worst:.3g})\n"
                                   f"      eager:    {_short(ad)}\n      compiled: {_short(bd)}")
        self.diff(path, f"values differ\n      eager:    {_short(ad)}\n"
                        f"      compiled: {_short(bd)}")

    def walk(self, a, b, path):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
                return self.diff(path, f"{_tname(a)} (eager) vs {_tname(b)} (compiled)")
            if self.identity(a, b, path):
                return
            return self.tensor(a, b, path)
        if isinstance(a, BaseException) or isinstance(b, BaseException):
            if type(a).__name__ != type(b).__name__:
                self.diff(path, f"{_tname(a)}: {a!s:.200} (eager) vs {_tname(b)}: {b!s:.200}"
                                " (compiled)")
            return
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            if type(a) is not type(b):
                return self.diff(path, f"{_tname(a)} (eager) vs {_tname(b)} (compiled)")
            for attr in ("dtype", "shape", "strides"):
                if getattr(a, attr) != getattr(b, attr):
                    return self.diff(path, f"{attr} {getattr(a, attr)} (eager) vs "
                                           f"{getattr(b, attr)} (compiled)")
            if not np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
                self.diff(path, f"values differ\n      eager:    {a!r:.200}\n"
                                f"      compiled: {b!r:.200}")
            return
        ua, ub = _user_type(a), _user_type(b)
        if ua or ub:
            if _qual(a) != _qual(b):
                return self.diff(path, f"type {_qual(a)} vs {_qual(b)}")
            if self.identity(a, b, path):
                return
            if isinstance(a, torch.nn.Module):
                ta, tb = vars(a).get("training"), vars(b).get("training")
                if ta != tb:
                    self.diff(path + ".training", f"{ta} vs {tb}")
                # hook dicts are keyed by process-wide handle ids: compare the hooks only
                da = {k: list(v.values()) if k.endswith("hooks") else v
                      for k, v in vars(a).items() if k != "training"}
                db = {k: list(v.values()) if k.endswith("hooks") else v
                      for k, v in vars(b).items() if k != "training"}
                return self.walk_dict(da, db, path + ".__dict__", ordered=False)
            if isinstance(a, dict):  # a dict subclass: its items too, in order
                self.walk_dict(dict(a.items()), dict(b.items()), path + ".<items>", ordered=True)
            return self.walk_dict(vars(a), vars(b), path + ".__dict__", ordered=False)
        if type(a) is not type(b):
            return self.diff(path, f"type {_tname(a)} (eager) vs {_tname(b)} (compiled): "
                                   f"{_short(a)} vs {_short(b)}")
        if isinstance(a, (list, dict)):
            if self.identity(a, b, path):
                return
        if isinstance(a, (list, tuple)):
            if len(a) != len(b):
                return self.diff(path, f"len {len(a)} (eager) vs {len(b)} (compiled)\n"
                                       f"      eager:    {_short(a)}\n"
                                       f"      compiled: {_short(b)}")
            for k, (x, y) in enumerate(zip(a, b)):
                self.walk(x, y, f"{path}[{k}]")
            return
        if isinstance(a, dict):
            return self.walk_dict(a, b, path, ordered=True)
        if isinstance(a, float):
            if a == b or (math.isnan(a) and math.isnan(b)):
                return
            if math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL):
                return
            return self.diff(path, f"{a!r} (eager) vs {b!r} (compiled)")
        if isinstance(a, property):  # a class's dict: the same accessors
            return self.walk((a.fget, a.fset, a.fdel), (b.fget, b.fset, b.fdel), path)
        if isinstance(a, functools.cached_property):
            return self.walk((a.func, a.attrname), (b.func, b.attrname), path)
        if isinstance(a, types.FunctionType):
            if a.__qualname__ != b.__qualname__:
                self.diff(path, f"function {a.__qualname__} vs {b.__qualname__}")
            return
        if isinstance(a, (int, str, bool, type(None), complex, bytes, torch.dtype,
                          torch.device, torch.Size)):
            if a != b:
                self.diff(path, f"{a!r} (eager) vs {b!r} (compiled)")
            return
        if a != b:
            self.diff(path, f"{_short(a)} (eager) vs {_short(b)} (compiled)")

    def walk_dict(self, a, b, path, ordered):
        ka, kb = list(a.keys()), list(b.keys())
        if (ka if ordered else sorted(map(str, ka))) != (kb if ordered else sorted(map(str, kb))):
            return self.diff(path, f"keys {ka} (eager) vs {kb} (compiled)")
        for k in ka:
            self.walk(a[k], b[k], f"{path}[{k!r}]")


def _user_type(v):
    t = type(v)
    return t.__module__.startswith("magpy_fuzz_") or isinstance(v, torch.nn.Module)


def _qual(v):
    return type(v).__qualname__


def _tname(v):
    return type(v).__name__


def _short(v, n=300):
    try:
        s = repr(v)
    except Exception:  # noqa: BLE001
        s = f"<{type(v).__name__}>"
    s = " ".join(s.split())
    return s if len(s) <= n else s[:n] + "..."


def compare_worlds(ea, eb):
    """ea/eb: dicts of what each world exposes after a call. Returns a list of diffs."""
    c = Comparer()
    for k in ea:
        c.walk(ea[k], eb[k], k)
    return c.diffs


# ---------------------------------------------------------------------- one program

def cache_limit_for(seed):
    """Most programs get the default cache limit; some a tiny one (the cache-limit path)."""
    return (8, 8, 8, 8, 8, 8, 1, 2)[(seed * 2654435761 >> 7) % 8]


def run_program(seed, n_calls=N_CALLS, compile_fn=None, source=None):
    """Generate the program for `seed`, run it eager and compiled, and compare every call.

    The program, its inputs and its mutations are a function of the seed; so is the outcome
    (mismatch or not) with a deterministic engine. The engine's cache statistics can vary a
    little with the process's history (observed: hit/miss counts of programs that break on a
    generator expression), so only the comparison is asserted on."""
    t0 = time.perf_counter()
    if source is None:
        source = generate(seed, n_calls)
    res = Result(seed, source)
    if compile_fn is None:
        limit = cache_limit_for(seed)
        backend = os.environ.get("MAGPY_FUZZ_BACKEND", "eager")
        compile_fn = lambda f: magpy.compile(f, backend=backend, cache_limit=limit)  # noqa: E731
    try:
        wa = make_world(source, seed, "eager")
        wb = make_world(source, seed, "compiled")
    except Exception:  # noqa: BLE001
        res.gen_error = traceback.format_exc(limit=3)
        return res
    magpy.reset()
    cf = compile_fn(wb.fn)
    grad = torch.is_grad_enabled()
    try:
        for i in range(n_calls):
            try:
                ma, args_a, kw_a, out_a, printed_a = run_call(wa, wa.fn, i, seed)
                mb, args_b, kw_b, out_b, printed_b = run_call(wb, cf, i, seed)
            except Exception:  # noqa: BLE001  (make_args failed: not a valid program)
                res.gen_error = traceback.format_exc(limit=3)
                break
            if out_a[0] == "exc":
                res.exceptions += 1
            ea = {"mutate": ma, "result": out_a, "printed": printed_a, "args": args_a,
                  "kwargs": kw_a, "state": world_state(wa)}
            eb = {"mutate": mb, "result": out_b, "printed": printed_b, "args": args_b,
                  "kwargs": kw_b, "state": world_state(wb)}
            try:
                diffs = compare_worlds(ea, eb)
            except Exception:  # noqa: BLE001  (a value the comparer cannot walk)
                res.gen_error = traceback.format_exc(limit=3)
                break
            if diffs:
                for tag, out in (("eager", out_a), ("compiled", out_b)):
                    if out[0] == "exc":
                        e = out[1]
                        diffs.append(f"({tag} raised {type(e).__name__}: {str(e)[:300]})")
                res.mismatches.append(Mismatch(i, diffs))
                break  # later calls start from diverged state
    finally:
        try:
            e = magpy.explain(cf)
            res.breaks = [b.reason_id for b in e.breaks]
            res.graphs, res.hits, res.misses = e.graph_count, e.cache_hits, e.cache_misses
            res.resume_hits = getattr(e, "resume_hits", 0)
            res.resume_misses = getattr(e, "resume_misses", 0)
        except TypeError:
            pass  # a stand-in compile_fn (tests of the runner itself)
        magpy.reset()
        torch.set_grad_enabled(grad)
    res.seconds = time.perf_counter() - t0
    return res


def run_many(seeds, n_calls=N_CALLS, compile_fn=None, on_result=None):
    out = []
    for s in seeds:
        r = run_program(s, n_calls, compile_fn)
        out.append(r)
        if on_result is not None:
            on_result(r)
    return out
