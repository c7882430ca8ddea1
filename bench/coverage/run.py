"""Coverage benchmark: how many real programs magpy captures whole, and whether it stays correct.

Every program of the corpora (`corpus_*.py` in this folder; see README.md) runs through
`magpy.compile` for a few calls with fresh, identical inputs, and its results are compared with
the eager results. One line per program, then totals and the graph-break reasons by frequency.

    /usr/bin/python3 bench/coverage/run.py [--quick] [--filter SUBSTR] [--json OUT]
        [--no-grad] [--corpus NAME] [--in-process] [--verbose] [--list]

By default the programs run in a worker subprocess, restarted after a crash (segfault, abort)
or a time-out, so one bad program is reported and the run goes on. `--in-process` runs them in
this process (simpler to debug; a crash ends the run).
"""

import argparse
import collections
import copy
import faulthandler
import gc
import importlib
import json
import math
import os
import platform
import re
import select
import signal
import subprocess
import sys
import tempfile
import random
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
for _p in (HERE, os.path.join(ROOT, "build", "python"), os.path.join(ROOT, "core", "python")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

import magpy  # noqa: E402
from corpus import split_args  # noqa: E402

CORPORA = ("corpus_torchvision", "corpus_programs")



# --------------------------------------------------------------------------------------------
# corpus


def load_programs(corpora):
    programs, seen = [], {}
    for name in corpora:
        mod = importlib.import_module(name)
        for p in mod.programs():
            if p.name in seen:
                raise SystemExit(f"duplicate program name {p.name!r} in {name} and {seen[p.name]}")
            seen[p.name] = name
            programs.append(p)
    return programs


def select_programs(programs, quick, filters):
    out = []
    for p in programs:
        if quick and not p.quick:
            continue
        if filters and not any(f in p.name for f in filters):
            continue
        out.append(p)
    return out


# --------------------------------------------------------------------------------------------
# comparison of eager and compiled results


class Comparison:
    """Walks two nested results; the verdict is exact, close (allclose) or mismatch."""

    def __init__(self, rtol, atol):
        self.rtol, self.atol = rtol, atol
        self.exact = True
        self.mismatch = None
        self.max_diff = 0.0
        self.tensors = 0

    def fail(self, path, why):
        if self.mismatch is None:
            self.mismatch = f"{path}: {why}"

    def tensor(self, a, e, path):
        self.tensors += 1
        if not isinstance(a, torch.Tensor):
            return self.fail(path, f"expected a tensor, got {type(a).__name__}")
        for attr in ("dtype", "shape", "device", "requires_grad", "layout"):
            if getattr(a, attr) != getattr(e, attr):
                return self.fail(path, f"{attr} {getattr(a, attr)} vs eager {getattr(e, attr)}")
        if e.is_quantized:
            a, e = a.dequantize(), e.dequantize()
        a, e = a.detach(), e.detach()
        if torch.equal(a, e):
            return
        self.exact = False
        if a.is_floating_point() or a.is_complex():
            if torch.allclose(a, e, rtol=self.rtol, atol=self.atol, equal_nan=True):
                finite = torch.isfinite(e) & torch.isfinite(a)
                if finite.any():
                    d = (a[finite] - e[finite]).abs().max().item()
                    self.max_diff = max(self.max_diff, d)
                return
            finite = torch.isfinite(e) & torch.isfinite(a)
            d = (a[finite] - e[finite]).abs().max().item() if finite.any() else float("nan")
            return self.fail(path, f"values differ (max abs diff {d:.3g}, "
                                   f"rtol={self.rtol}, atol={self.atol})")
        return self.fail(path, "values differ")

    def compare(self, a, e, path="result"):
        if self.mismatch is not None:
            return
        if isinstance(e, torch.Tensor):
            return self.tensor(a, e, path)
        if type(a) is not type(e):
            return self.fail(path, f"type {type(a).__name__} vs eager {type(e).__name__}")
        if isinstance(e, (list, tuple)):
            if len(a) != len(e):
                return self.fail(path, f"length {len(a)} vs eager {len(e)}")
            for i, (x, y) in enumerate(zip(a, e)):
                self.compare(x, y, f"{path}[{i}]")
            return
        if isinstance(e, dict):
            if list(a.keys()) != list(e.keys()):
                return self.fail(path, f"keys {list(a.keys())} vs eager {list(e.keys())}")
            for k in e:
                self.compare(dict.__getitem__(a, k), dict.__getitem__(e, k), f"{path}[{k!r}]")
            if type(e) not in (dict, collections.OrderedDict) and hasattr(e, "__dict__"):
                self.compare(vars(a), vars(e), f"{path}.__dict__")  # a ModelOutput's fields
            return
        if isinstance(e, float) and math.isnan(e):
            if not math.isnan(a):
                self.fail(path, f"{a!r} vs eager nan")
            return
        if isinstance(e, (int, float, complex, str, bytes, bool, type(None), torch.Size,
                          torch.dtype, torch.device)):
            if a != e:
                self.fail(path, f"{a!r} vs eager {e!r}")
            return
        if isinstance(e, torch.nn.Module) or callable(e):
            if a is not e:
                self.fail(path, f"{a!r} is not {e!r}")
            return
        if hasattr(e, "__dict__"):
            self.compare(vars(a), vars(e), f"{path}.__dict__")
            return
        if a != e:
            self.fail(path, f"{a!r} vs eager {e!r}")

    @property
    def verdict(self):
        if self.mismatch is not None:
            return "mismatch"
        return "exact" if self.exact else "close"


# --------------------------------------------------------------------------------------------
# one program


def _short_exc(exc):
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 600 else text[:600] + "..."


def _user_frame(tb_exc):
    """The innermost frame of a traceback, as 'file:line in function'."""
    frames = traceback.extract_tb(tb_exc.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    return f"{os.path.relpath(f.filename, ROOT) if f.filename.startswith(ROOT) else f.filename}" \
           f":{f.lineno} in {f.name}"


_STAGE_LOG = None  # the worker's log: stage markers, so that a crash can be placed


# --vary-batch: the calls' batch sizes, from the inputs' own batch size B (a size of 1 or 0 is
# specialised by magpy as by torch.compile, so going from 1 to 2 is one recompile either way)
def batch_sizes(b):
    return [b, b + 1, b + 2, b + 1]


def _tensors(value, out):
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensors(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _tensors(v, out)
    return out


def shared_batch(raw):
    """The first dimension every tensor of the inputs shares (None if they share none)."""
    sizes = {t.shape[0] for t in _tensors(raw, []) if t.dim() >= 1}
    return sizes.pop() if len(sizes) == 1 else None


def with_batch(value, n):
    """The inputs with every tensor's first dimension made n: its rows taken in turn (a
    rotation, so rows do not simply repeat in place), keeping dtype, layout and requires_grad."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return value
        b = value.shape[0]
        rows = torch.tensor([(i + i // b) % b for i in range(n)], dtype=torch.long)
        out = value.detach().index_select(0, rows).contiguous()
        return out.requires_grad_(value.requires_grad) if value.is_leaf else out
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(with_batch(v, n) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(with_batch(v, n) for v in value)
    if isinstance(value, dict):
        return type(value)((k, with_batch(v, n)) for k, v in value.items())
    if hasattr(value, "args") and hasattr(value, "kwargs"):  # corpus.Args
        value = copy.copy(value)
        value.args, value.kwargs = with_batch(value.args, n), with_batch(value.kwargs, n)
    return value


def _stage(what):
    if _STAGE_LOG is not None:
        _STAGE_LOG.write(f"--- {what}\n")
        _STAGE_LOG.flush()


def run_program(prog, opts):
    """Run one program eagerly and through magpy; a JSON-able result dict. Never raises."""
    r = dict(name=prog.name, group=prog.group, note=prog.note, status="ok", full_graph=False,
             graphs=None, breaks=None, break_ids=[], break_list=[], first_reason="",
             verdict=None, detail="", max_diff=0.0, cache_hits=None, cache_misses=None,
             recompile_reasons=[], notes=[], error="", error_where="", stage="",
             calls=prog.calls, grad=not opts.no_grad, times={}, warnings=[], explain="",
             batches=None)
    if prog.skip:
        r.update(status="skipped", detail=prog.skip)
        return r
    if prog.slow and not opts.slow:
        r.update(status="skipped", detail=f"slow: {prog.slow} (run with --slow)")
        return r
    t_start = time.perf_counter()
    magpy.reset()
    grad_ctx = torch.no_grad if opts.no_grad else torch.enable_grad
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _run_program(prog, opts, r, grad_ctx)
        except Exception as exc:  # a bug in this runner: still report it per program
            r.update(status="runner-error", error=_short_exc(exc), error_where=_user_frame(exc))
        msgs = []
        for w in caught:
            m = f"{w.category.__name__}: {str(w.message).splitlines()[0][:200]}"
            if m not in msgs:
                msgs.append(m)
        r["warnings"] = msgs[:5]
    magpy.reset()
    gc.collect()
    r["times"]["total"] = time.perf_counter() - t_start
    return r


def _run_program(prog, opts, r, grad_ctx):
    times = r["times"]
    if opts.vary_batch:
        torch.manual_seed(prog.seed + 1)
        b = shared_batch(prog.inputs())
        if b is None:
            r.update(status="skipped", detail="--vary-batch: the inputs' tensors share no "
                                              "first dimension to vary")
            return
        r["batches"] = batch_sizes(b)
        r["calls"] = len(r["batches"])
    # build
    t = time.perf_counter()
    _stage("build")
    try:
        torch.manual_seed(prog.seed)
        fn = prog.make()
        if isinstance(fn, torch.nn.Module) and not prog.train:
            fn.eval()
        fn_c = fn
        if prog.separate_worlds:
            torch.manual_seed(prog.seed)
            fn_c = prog.make()
            if isinstance(fn_c, torch.nn.Module) and not prog.train:
                fn_c.eval()
    except Exception as exc:
        r.update(status="build-error", stage="build", error=_short_exc(exc),
                 error_where=_user_frame(exc))
        return
    times["build"] = time.perf_counter() - t

    _stage("compile")
    try:
        cf = magpy.compile(fn_c, backend=opts.backend)
    except Exception as exc:
        r.update(status="magpy-error", stage="compile", error=_short_exc(exc),
                 error_where=_user_frame(exc))
        return

    cmp = Comparison(prog.rtol, prog.atol)
    eager_t, magpy_t = [], []
    for i in range(r["calls"]):
        torch.manual_seed(prog.seed + 1 + i)
        raw = prog.inputs()
        if r["batches"]:
            raw = with_batch(raw, r["batches"][i])
        eager_in = copy.deepcopy(raw)
        magpy_in = copy.deepcopy(raw)
        ea, ek = split_args(eager_in)
        ma, mk = split_args(magpy_in)
        def timed_call(who, callee, args, kwargs, times_out):
            """Runs one call with this call's seed; (True, result) or (False, None) after
            recording the error in `r`."""
            torch.manual_seed(prog.seed + 1000 + i)
            random.seed(prog.seed + 1000 + i)  # Python's random too (LayerDrop draws)
            _stage(f"{who} call {i + 1}")
            t = time.perf_counter()
            try:
                with grad_ctx():
                    out = callee(*args, **kwargs)
            except Exception as exc:
                r.update(status=f"{who}-error", stage=f"{who} call {i + 1}",
                         error=_short_exc(exc), error_where=_user_frame(exc))
                return False, None
            times_out.append(time.perf_counter() - t)
            return True, out

        ok, expected = timed_call("eager", fn, ea, ek, eager_t)
        if not ok:
            break
        ok, actual = timed_call("magpy", cf, ma, mk, magpy_t)
        if not ok:
            break
        _stage(f"compare {i + 1}")
        cmp.compare(actual, expected, f"call {i + 1}: result")
        cmp.compare((ma, mk), (ea, ek), f"call {i + 1}: arguments after the call")
        if cmp.mismatch is not None:
            r["status"] = "mismatch"
            break
    if eager_t:
        times["eager_first"], times["magpy_first"] = eager_t[0], magpy_t[0] if magpy_t else None
    if len(magpy_t) > 1:
        times["eager_later"] = min(eager_t[1:])
        times["magpy_later"] = min(magpy_t[1:])
    if r["status"] in ("ok", "mismatch"):
        r["verdict"] = cmp.verdict
        r["detail"] = cmp.mismatch or ""
        r["max_diff"] = cmp.max_diff
    if r["status"] == "eager-error":
        call = int(r["stage"].split()[-1])
        if r["batches"] and call > 1:  # the first dimension the inputs share is not a batch
            r.update(status="skipped", detail=f"--vary-batch: eager raised at batch size "
                                              f"{r['batches'][call - 1]}: {r['error'][:120]}")
        return  # a problem of the program or its inputs: magpy's report says nothing useful
    _stage("explain")
    try:
        e = magpy.explain(cf)
    except Exception as exc:
        if r["status"] == "ok":
            r.update(status="magpy-error", stage="explain", error=_short_exc(exc),
                     error_where=_user_frame(exc))
        return
    r["graphs"], r["breaks"] = e.graph_count, e.break_count
    # every call one graph, no break (recompiles add entries, each one graph)
    r["full_graph"] = e.break_count == 0 and e.graph_count >= 1 and e.graph_count == e.cache_entries
    r["break_list"] = [dict(reason_id=b.reason_id, reason=b.reason, hint=b.hint,
                            filename=b.filename, lineno=b.lineno, function=b.function)
                       for b in e.breaks]
    ids = []
    for b in e.breaks:
        if b.reason_id not in ids:
            ids.append(b.reason_id)
    r["break_ids"] = ids
    r["first_reason"] = e.breaks[0].reason if e.breaks else ""
    r["cache_hits"], r["cache_misses"] = e.cache_hits, e.cache_misses
    r["recompile_reasons"] = list(e.recompile_reasons)
    r["notes"] = list(e.notes)
    r["ops"] = e.op_count
    r["guards"] = len(e.guards)
    if opts.verbose and (not r["full_graph"] or r["status"] != "ok"):
        text = str(e)
        cut = text.find("\n  replay plan:")
        r["explain"] = text if cut < 0 else text[:cut] + "\n  (replay plan left out)"


# --------------------------------------------------------------------------------------------
# output


def _fmt_time(s):
    return f"{s:6.1f}s" if s is not None else "      "


def program_line(r):
    name = r["name"]
    if r["status"] == "skipped":
        return f"{name:<50} SKIP   {r['detail']}"
    full = "yes" if r["full_graph"] else "no "
    g = "-" if r["graphs"] is None else r["graphs"]
    b = "-" if r["breaks"] is None else r["breaks"]
    hm = "" if r["cache_hits"] is None else f"{r['cache_hits']}h/{r['cache_misses']}m"
    if r["status"] in ("ok", "mismatch"):
        res = r["verdict"].upper() if r["verdict"] == "mismatch" else r["verdict"]
    else:
        res = r["status"].upper()
    ids = ",".join(r["break_ids"])
    reason = r["first_reason"].replace("\n", " ")
    if len(reason) > 90:
        reason = reason[:87] + "..."
    line = (f"{name:<50} {full}  g={g!s:<2} b={b!s:<2} {hm:<8} {res:<12}"
            f"{_fmt_time(r['times'].get('total'))}  {ids}{'  ' if ids else ''}{reason}")
    return line.rstrip()


def _stack_summary(log_tail, frames=4):
    """From a worker log: the fatal error line and the innermost Python frames."""
    lines = log_tail.splitlines()
    start = None
    for i, l in enumerate(lines):
        if l.startswith("Fatal Python error"):
            start = i
    if start is None:
        for i, l in enumerate(lines):
            if l.startswith(("Current thread", "Thread 0x", "Stack (most")):
                start = i
    if start is None:
        return []
    out, n = [], 0
    for l in lines[start:]:
        l = l.strip()
        if l.startswith("File "):
            n += 1
            if n <= frames:
                out.append(l)
        elif l.startswith(("Fatal Python error", "Current thread", "Thread 0x", "Stack (most")):
            out.append(l)
    return out


def detail_lines(r, verbose):
    out = []
    if r["status"] not in ("ok", "skipped"):
        if r["error"]:
            out.append(f"    ! {r['stage']}: {r['error']}")
            if r["error_where"]:
                out.append(f"      at {r['error_where']}")
        if r["detail"]:
            out.append(f"    ! {r['detail']}")
        out.extend("      " + l for l in _stack_summary(r.get("log_tail", "")))
    if r["breaks"] and verbose:
        for b in r["break_list"]:
            where = f"{b['filename']}:{b['lineno']} in {b['function']}" if b["filename"] else ""
            out.append(f"    [{b['reason_id']}] {b['reason']}" + (f"  at {where}" if where else ""))
    calls = r["calls"]
    if r.get("batches") and r["cache_misses"] is not None and r["cache_misses"] > 2:
        out.append(f"    ? compiled {r['cache_misses']} times over batch sizes {r['batches']}; "
                   f"recompiled because: {'; '.join(r['recompile_reasons'])[:300]}")
    elif (r["status"] == "ok" and r["cache_hits"] is not None and r["full_graph"]
            and not r.get("batches") and r["cache_hits"] < calls - 1):
        out.append(f"    ? {r['cache_hits']} cache hits in {calls} same-shape calls; "
                   f"recompiled because: {'; '.join(r['recompile_reasons'])[:300]}")
    if verbose:
        for n in r["notes"]:
            out.append(f"    note: {n}")
        if r.get("explain"):
            out.extend("    | " + l for l in r["explain"].splitlines())
    return out


def totals(results):
    ran = [r for r in results if r["status"] != "skipped"]
    n = len(ran)
    full = sum(1 for r in ran if r["full_graph"] and r["status"] == "ok")
    t = dict(programs=n, skipped=len(results) - n, full_graph=full,
             full_graph_pct=(100.0 * full / n) if n else 0.0,
             with_breaks=sum(1 for r in ran if r["breaks"]),
             breaks=sum(r["breaks"] or 0 for r in ran),
             exact=sum(1 for r in ran if r["verdict"] == "exact"),
             close=sum(1 for r in ran if r["verdict"] == "close"),
             mismatches=sum(1 for r in ran if r["status"] == "mismatch"),
             magpy_errors=sum(1 for r in ran if r["status"] == "magpy-error"),
             eager_errors=sum(1 for r in ran if r["status"] == "eager-error"),
             build_errors=sum(1 for r in ran if r["status"] == "build-error"),
             crashes=sum(1 for r in ran if r["status"] == "crash"),
             timeouts=sum(1 for r in ran if r["status"] == "timeout"),
             runner_errors=sum(1 for r in ran if r["status"] == "runner-error"),
             internal_breaks=sum(1 for r in ran if "MB099" in r["break_ids"]),
             no_cache_hit=sum(1 for r in ran if r["status"] == "ok" and r["cache_hits"] == 0
                              and r["calls"] > 1 and not r.get("batches")),
             # --vary-batch: captured whole in every call and compiled at most twice
             varied=sum(1 for r in ran if r.get("batches")),
             at_most_two_compiles=sum(1 for r in ran if r.get("batches") and
                                      r["status"] == "ok" and r["cache_misses"] is not None
                                      and r["cache_misses"] <= 2),
             full_and_at_most_two=sum(1 for r in ran if r.get("batches") and
                                      r["status"] == "ok" and r["full_graph"] and
                                      r["cache_misses"] is not None and r["cache_misses"] <= 2),
             time_s=sum(r["times"].get("total", 0.0) for r in ran))
    t["errors"] = (t["magpy_errors"] + t["eager_errors"] + t["build_errors"] + t["crashes"]
                   + t["timeouts"] + t["runner_errors"])
    return t


_ACCESS_PATH = re.compile(r"\b[LG]\[[^\]]*\](?:\.\w+|\[[^\]]*\])*")
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")


def reason_kind(text):
    """A break reason without its program-specific parts (access paths, addresses)."""
    text = _ACCESS_PATH.sub("<path>", text.replace("\n", " "))
    return _ADDRESS.sub("0x...", text)


def reason_table(results):
    """[(id, reason kind, breaks, programs, examples)] by programs, then breaks."""
    by_key = collections.OrderedDict()
    for r in results:
        for b in r["break_list"]:
            key = (b["reason_id"], reason_kind(b["reason"]))
            ent = by_key.setdefault(key, dict(breaks=0, programs=[]))
            ent["breaks"] += 1
            if r["name"] not in ent["programs"]:
                ent["programs"].append(r["name"])
    rows = [(k[0], k[1], v["breaks"], len(v["programs"]), v["programs"])
            for k, v in by_key.items()]
    rows.sort(key=lambda x: (-x[3], -x[2], x[0], x[1]))
    return rows


def id_table(results):
    counts = collections.Counter()
    progs = collections.defaultdict(list)
    for r in results:
        for b in r["break_list"]:
            counts[b["reason_id"]] += 1
            if r["name"] not in progs[b["reason_id"]]:
                progs[b["reason_id"]].append(r["name"])
    return sorted(((i, counts[i], progs[i]) for i in counts), key=lambda x: (-len(x[2]), x[0]))


def print_summary(results, out=sys.stdout):
    t = totals(results)
    p = lambda s="": print(s, file=out)  # noqa: E731
    p()
    p("=" * 100)
    p(f"programs:    {t['programs']} run, {t['skipped']} skipped")
    p(f"full graph:  {t['full_graph']}/{t['programs']} ({t['full_graph_pct']:.1f}%)   "
      f"with breaks: {t['with_breaks']} programs, {t['breaks']} breaks")
    p(f"correctness: {t['exact']} exact, {t['close']} close (allclose), "
      f"{t['mismatches']} mismatches")
    p(f"errors:      {t['errors']}  (magpy {t['magpy_errors']}, eager {t['eager_errors']}, "
      f"build {t['build_errors']}, crash {t['crashes']}, timeout {t['timeouts']}, "
      f"runner {t['runner_errors']});  MB099 internal breaks in {t['internal_breaks']} programs")
    if t["varied"]:
        p(f"batch sizes: {t['varied']} programs called with batch sizes B, B+1, B+2, B+1 "
          f"(--vary-batch): {t['full_and_at_most_two']} full graph and compiled at most twice, "
          f"{t['at_most_two_compiles']} compiled at most twice")
    if t["no_cache_hit"]:
        p(f"cache:       {t['no_cache_hit']} programs had no cache hit in repeated same-shape calls")
    p(f"time:        {t['time_s']:.0f}s in programs")
    bad = [r for r in results if r["status"] not in ("ok", "skipped")]
    if bad:
        p()
        p("problems:")
        for r in bad:
            why = r["error"] or r["detail"]
            p(f"  {r['name']:<48} {r['status']:<12} {why[:160]}")
    skipped = [r for r in results if r["status"] == "skipped"]
    if skipped:
        p()
        p("skipped:")
        for r in skipped:
            p(f"  {r['name']:<48} {r['detail']}")
    ids = id_table(results)
    if ids:
        p()
        p("break reasons by id:")
        p(f"  {'id':<6} {'programs':>8} {'breaks':>7}  {'what':<38} examples")
        for i, n, progs in ids:
            ex = ", ".join(progs[:3]) + (f", +{len(progs) - 3}" if len(progs) > 3 else "")
            p(f"  {i:<6} {len(progs):>8} {n:>7}  {magpy.BREAK_REASONS.get(i, '?'):<38} {ex}")
        p()
        p("break reasons by text (access paths shown as <path>):")
        p(f"  {'id':<6} {'programs':>8} {'breaks':>7}  reason  [examples]")
        for i, text, nb, npg, progs in reason_table(results):
            text = text if len(text) <= 110 else text[:107] + "..."
            ex = ", ".join(progs[:2]) + (f", +{len(progs) - 2}" if len(progs) > 2 else "")
            p(f"  {i:<6} {npg:>8} {nb:>7}  {text}  [{ex}]")
    return t


# --------------------------------------------------------------------------------------------
# worker subprocess and its supervisor


def worker_main(opts):
    """Run the named programs; report on the result fd as JSON lines."""
    global _STAGE_LOG
    _STAGE_LOG = sys.stdout
    faulthandler.enable(all_threads=False)
    if hasattr(signal, "SIGUSR1"):
        # the supervisor asks for the stack before it kills a program that timed out
        faulthandler.register(signal.SIGUSR1, all_threads=False)
    out = os.fdopen(opts.worker_fd, "w", buffering=1)
    with open(opts.worker_names) as f:
        names = json.load(f)
    progs = {p.name: p for p in load_programs(opts.corpus)}
    out.write(json.dumps({"event": "ready"}) + "\n")
    for name in names:
        out.write(json.dumps({"event": "start", "name": name}) + "\n")
        out.flush()
        print(f"=== {name}", flush=True)
        sys.stderr.flush()
        r = run_program(progs[name], opts)
        out.write(json.dumps({"event": "result", "result": r}) + "\n")
        out.flush()
    out.write(json.dumps({"event": "done"}) + "\n")
    out.close()


class Supervisor:
    """Runs programs in a worker process; a crash or time-out costs one program, not the run."""

    def __init__(self, opts, argv_opts, programs, on_result):
        self.opts = opts
        self.argv_opts = argv_opts
        self.by_name = {p.name: p for p in programs}
        self.on_result = on_result
        self.logdir = tempfile.mkdtemp(prefix="magpy-coverage-")
        self.workers = 0
        self.kept_log = False

    def run(self, names):
        pending = list(names)
        while pending:
            pending = self._one_worker(pending)

    def _crash_result(self, name, status, detail, log_path, log_pos):
        prog = self.by_name[name]
        tail = ""
        try:
            with open(log_path, "rb") as f:
                text = f.read().decode("utf-8", "replace")
            # the worker writes "=== <name>" to its log before each program
            at = text.rfind(f"=== {name}\n")
            tail = text[at if at >= 0 else log_pos:][-3000:]
        except OSError:
            pass
        self.kept_log = True
        stage = "worker"
        for l in tail.splitlines():
            if l.startswith("--- "):
                stage = l[4:]
        return dict(name=name, group=prog.group, note=prog.note, status=status,
                    full_graph=False, graphs=None, breaks=None, break_ids=[], break_list=[],
                    first_reason="", verdict=None, detail="", max_diff=0.0, cache_hits=None,
                    cache_misses=None, recompile_reasons=[], notes=[], error=detail,
                    error_where=f"worker log {log_path}", stage=stage, calls=prog.calls,
                    grad=not self.opts.no_grad, times={}, warnings=[], explain="",
                    log_tail=tail)

    def _one_worker(self, pending):
        self.workers += 1
        names_path = os.path.join(self.logdir, f"names-{self.workers}.json")
        log_path = os.path.join(self.logdir, f"worker-{self.workers}.log")
        with open(names_path, "w") as f:
            json.dump(pending, f)
        rfd, wfd = os.pipe()
        log = open(log_path, "wb")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker-fd", str(wfd),
               "--worker-names", names_path] + self.argv_opts
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, pass_fds=(wfd,),
                                start_new_session=True)
        os.close(wfd)
        log.close()
        buf = b""
        current, started, log_pos = None, None, 0
        done = set()
        rest = list(pending)
        eof = False
        try:
            while True:
                if current is not None:
                    limit = self.opts.timeout or self.by_name[current].timeout
                    wait = max(0.0, started + limit - time.monotonic())
                else:
                    wait = 600.0  # worker start-up (imports) or between programs
                ready, _, _ = select.select([rfd], [], [], wait)
                if not ready:
                    # time-out: ask for the Python stack, then end the worker (our own
                    # child, by its process group)
                    try:
                        if hasattr(signal, "SIGUSR1") and current is not None:
                            os.kill(proc.pid, signal.SIGUSR1)
                            time.sleep(1.0)
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait()
                    if current is None:
                        name = rest[0]
                        self.on_result(self._crash_result(
                            name, "crash", "worker did not start in 600s", log_path, 0))
                        return rest[1:]
                    self.on_result(self._crash_result(
                        current, "timeout", f"no result after {limit:.0f}s; worker killed",
                        log_path, log_pos))
                    return [n for n in rest if n not in done and n != current]
                chunk = os.read(rfd, 1 << 16)
                if not chunk:
                    eof = True
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    msg = json.loads(line)
                    ev = msg["event"]
                    if ev == "start":
                        current, started = msg["name"], time.monotonic()
                        try:
                            log_pos = os.path.getsize(log_path)
                        except OSError:
                            log_pos = 0
                    elif ev == "result":
                        done.add(msg["result"]["name"])
                        self.on_result(msg["result"])
                        current = None
                    elif ev == "done":
                        current = None
        finally:
            os.close(rfd)
        rc = proc.wait()
        left = [n for n in rest if n not in done]
        if current is not None or (eof and left):
            name = current if current is not None else left[0]
            if rc < 0:
                try:
                    what = f"worker killed by signal {signal.Signals(-rc).name}"
                except ValueError:
                    what = f"worker killed by signal {-rc}"
            else:
                what = f"worker exited with status {rc}"
            self.on_result(self._crash_result(name, "crash", what, log_path, log_pos))
            return [n for n in left if n != name]
        return []


# --------------------------------------------------------------------------------------------
# main


def engine_identity():
    """The git commit of the checkout (and whether core/ has uncommitted changes) and the build
    time of the _magpy extension: the engine changes often, so results name the engine."""
    out = dict(commit="?", core_dirty=None, extension_built="?")
    try:
        import _magpy
        out["extension_built"] = time.strftime(
            "%Y-%m-%d %H:%M:%S", time.localtime(os.path.getmtime(_magpy.__file__)))
    except Exception:
        pass
    try:
        git = ["git", "-C", ROOT]
        out["commit"] = subprocess.run(git + ["rev-parse", "--short", "HEAD"], text=True,
                                       capture_output=True, timeout=10).stdout.strip() or "?"
        status = subprocess.run(git + ["status", "--porcelain", "--", "core", "CMakeLists.txt"],
                                text=True, capture_output=True, timeout=10).stdout
        out["core_dirty"] = bool(status.strip())
    except Exception:
        pass
    return out


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the representative subset only")
    ap.add_argument("--filter", action="append", default=[], metavar="SUBSTR",
                    help="only programs whose name contains SUBSTR (repeat for any of several)")
    ap.add_argument("--json", metavar="OUT", help="write every result and the totals here")
    ap.add_argument("--slow", action="store_true",
                    help="also run the programs marked slow (listed as skipped otherwise)")
    ap.add_argument("--no-grad", action="store_true",
                    help="run eager and compiled calls under torch.no_grad()")
    ap.add_argument("--corpus", action="append", default=None, metavar="MODULE",
                    help=f"corpus modules to load (default: {', '.join(CORPORA)})")
    ap.add_argument("--in-process", action="store_true",
                    help="run in this process (no protection against crashes)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per program before its worker is killed (default: per program)")
    ap.add_argument("--verbose", "-v", action="store_true",
                    help="print each break, the notes, and magpy.explain() for programs with breaks")
    ap.add_argument("--vary-batch", action="store_true",
                    help="call each program with batch sizes B, B+1, B+2, B+1 (the first "
                         "dimension its input tensors share) instead of same-shape calls")
    ap.add_argument("--backend", default="eager",
                    help="magpy backend to compile with (default: eager, which replays the same "
                         "kernels, so results are exact; others may differ within each "
                         "program's tolerance)")
    ap.add_argument("--list", action="store_true", help="list the selected programs and exit")
    ap.add_argument("--worker-fd", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--worker-names", help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if not opts.corpus:
        opts.corpus = list(CORPORA)
    return opts


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    opts = parse(argv)
    if opts.worker_fd is not None:
        worker_main(opts)
        return 0

    programs = select_programs(load_programs(opts.corpus), opts.quick, opts.filter)
    if opts.list:
        for p in programs:
            flags = ("quick " if p.quick else "") + ("SKIP " if p.skip else "") + \
                ("slow " if p.slow else "")
            print(f"{p.name:<50} {flags}{p.note}")
        print(f"{len(programs)} programs")
        return 0

    import torchvision
    engine = engine_identity()
    print(f"magpy coverage: {len(programs)} programs ({'quick' if opts.quick else 'full'}"
          f"{', filter ' + '|'.join(opts.filter) if opts.filter else ''}), "
          f"grad {'off (torch.no_grad)' if opts.no_grad else 'on'}, "
          f"{'batch sizes varied, ' if opts.vary_batch else ''}"
          f"{'backend ' + opts.backend + ', ' if opts.backend != 'eager' else ''}"
          f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"magpy {magpy.__version__}, {torch.get_num_threads()} threads, "
          f"{'in-process' if opts.in_process else 'worker subprocess'}")
    print(f"engine: commit {engine['commit']}"
          f"{' + uncommitted core/ changes' if engine['core_dirty'] else ''}, "
          f"_magpy built {engine['extension_built']}")
    print(f"{'program':<50} full  graphs/breaks cache   result         time  break ids, first reason")
    print("-" * 100)
    sys.stdout.flush()

    results = []

    def on_result(r):
        results.append(r)
        print(program_line(r))
        for l in detail_lines(r, opts.verbose):
            print(l)
        sys.stdout.flush()

    t0 = time.perf_counter()
    if opts.in_process:
        warnings.simplefilter("ignore")
        for p in programs:
            on_result(run_program(p, opts))
    else:
        # pass the options the worker needs (not the selection: it gets the names)
        argv_opts = []
        for c in opts.corpus:
            argv_opts += ["--corpus", c]
        if opts.no_grad:
            argv_opts.append("--no-grad")
        if opts.slow:
            argv_opts.append("--slow")
        if opts.verbose:
            argv_opts.append("--verbose")
        if opts.vary_batch:
            argv_opts.append("--vary-batch")
        argv_opts += ["--backend", opts.backend]
        sup = Supervisor(opts, argv_opts, programs, on_result)
        sup.run([p.name for p in programs])
        if sup.kept_log:
            print(f"\nworker logs (crashes, time-outs): {sup.logdir}")
        else:
            for f in os.listdir(sup.logdir):
                os.unlink(os.path.join(sup.logdir, f))
            os.rmdir(sup.logdir)
    wall = time.perf_counter() - t0

    t = print_summary(results)
    print(f"wall time:   {wall:.0f}s")
    if opts.json:
        meta = dict(torch=torch.__version__, torchvision=torchvision.__version__,
                    magpy=magpy.__version__, python=platform.python_version(),
                    threads=torch.get_num_threads(), quick=opts.quick, filter=opts.filter,
                    grad=not opts.no_grad, slow=opts.slow, corpora=opts.corpus, wall_s=wall,
                    vary_batch=opts.vary_batch, backend=opts.backend,
                    engine=engine,
                    date=time.strftime("%Y-%m-%d %H:%M:%S"))
        by_text = [dict(reason_id=i, reason=text, breaks=nb, programs=npg, examples=progs[:5])
                   for i, text, nb, npg, progs in reason_table(results)]
        with open(opts.json, "w") as f:
            json.dump(dict(meta=meta, totals=t, break_reasons=by_text, results=results), f,
                      indent=1)
        print(f"json:        {opts.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
