"""Backend benchmark: per model, time per call of eager PyTorch, magpy with each of its backends
and the torch.jit variants (trace, script, freeze, optimize_for_inference) side by side.

    /usr/bin/python3 bench/backends.py [--quick [--all-batches]] [--filter NAME[,NAME]] [--systems NAME[,NAME]]
        [--repeats N] [--grad] [--threads N] [--device cpu|cuda] [--in-process] [--list] [-v]
        [--json out.json] [--plot out.png] [--plot-log]

Systems: `eager`; `magpy-<backend>` for every name in `magpy._magpy.backends()` (whatever the
build lists: `eager`, `torchscript`, ...); `jit.trace`, `jit.script`, `jit.trace+freeze` and
`jit.trace+optimize` (torch.jit.optimize_for_inference of the trace: freezing plus conv/bn
folding and MKLDNN layouts on CPU); a system that fails to build or run is recorded as
"n/a: <reason>". On a machine with CUDA and torch >= 2 also `torch.compile` and
`torch.compile(reduce-overhead)`. Models and batch sizes: bench/models.py. Inference under
torch.no_grad() unless --grad. By default each (model, batch) runs in its own worker process
(`--in-process` to run all in this one), so what one model leaves in the allocator does not move
the next model's figures, and a crash costs one model's rows ("n/a: worker exited with ...").

Per (model, batch, system):
  time/call   median over --repeats interleaved rounds; in each round every system runs one
              sample of n calls (n chosen per system so a sample takes ~50 ms, ~10 ms with
              --quick), the systems in a rotating order so drift hits all of them alike; every
              system is warmed up first (5 calls, which covers torch.jit's profiling runs).
  speedup     eager time / system time, from the same rounds.
  first call  build + first call of a fresh object after magpy.reset() (magpy.compile + the
              capturing call; torch.jit.trace/script/freeze + first call; for eager, one
              call), median of 3 (1 with --quick). One-time initialisation of torch.jit and of
              magpy is paid before the first model, on a tiny module.
  spread      (slowest - fastest sample) / median: the noise of this row.
  pf/call     minor page faults per timed call (getrusage). A system that keeps more
              intermediates alive at once raises peak memory past what glibc keeps mapped, so
              every call maps and zeroes fresh pages; this column shows when that is the cost.
  max|diff|   largest absolute difference from the eager output, over the first call and a
              warmed-up call; FAILED unless torch.allclose(rtol=1e-4, atol=1e-5), or, on a
              GPU (where eager's convolutions and matrix products run in TF32 and a compiled
              system may pick other kernels), unless the output is as close to a float64 run
              of the model as eager's own output is (at most twice eager's error, plus atol).
  graphs/brk  magpy only: magpy.explain() graph and break counts after the timed calls.
  guard us    magpy only, from magpy.explain(cf) timings_ns where the report has per-phase
  replay us   timings ("-" where it has not): guard-checking time per call and replay time
              per cache hit (running the compiled graph, its ops included), over the timed
              calls (means). ms/call minus these is the rest of the call path.
  kern/call   --device cuda only: kernels launched per call and their summed device time per
  GPU us      call, over 20 calls after the timed rounds, recorded by magpy's CUPTI profiler
              (by torch.profiler, also CUPTI, where magpy is not importable; the JSON says
              which). Copies and memsets are counted apart in the JSON.
The JSON has, besides, every sample, calls per sample, magpy's cache hits, eager calls and
backend notes, and the machine (CPU, cores, versions, date, load average at start and end).
Then the geometric-mean speedup of each system over the rows where it ran and was correct, the
per-row ratios magpy-torchscript / jit.trace and magpy-torchscript-freeze /
jit.trace+optimize_for_inference (the torch.jit path doing the same work), and the CPU targets
for each of the two backends as PASS/FAIL lines: geomean speedup >= 1.3x; at most 5% slower
than its torch.jit counterpart on every row (SKIP where magpy lacks that backend).
"""

import argparse
import copy
import datetime
import gc
import json
import math
import os
import platform
import re
import statistics
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
for _p in (os.path.join(ROOT, "build", "python"), os.path.join(ROOT, "core", "python"), HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

try:
    import magpy  # noqa: E402
    MAGPY_ERROR = None
except Exception as e:  # a machine without the extension still runs the other systems
    magpy = None
    MAGPY_ERROR = f"{type(e).__name__}: {e}"

from models import MODELS  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
TARGET_GEOMEAN = 1.3        # magpy-torchscript geomean speedup over eager
TARGET_VS_TRACE = 1.05      # magpy-torchscript time / jit.trace time, on every row
WARMUP_CALLS = 5


# --------------------------------------------------------------------------------------------
# systems


class System:
    """A way of running a model. build(model, args) returns a callable; it may raise."""

    def __init__(self, name, build, reset=None, is_magpy=False):
        self.name = name
        self.build = build
        self.reset = reset or (lambda: None)
        self.is_magpy = is_magpy


def magpy_backends():
    if magpy is None:
        return []
    lister = getattr(getattr(magpy, "_magpy", None), "backends", None) or magpy.backends
    return [b for b in lister() if unavailable_backend(b) is None]


def unavailable_backend(name):
    """Why magpy's backend `name` cannot run here (it would only run eagerly), or None."""
    try:
        import magpy._fx as fx
    except ImportError:
        return None
    return fx.unavailable(name) if name in fx.BACKENDS else None


def torch_compile_available():
    major = int(torch.__version__.split(".")[0])
    return major >= 2 and hasattr(torch, "compile") and torch.cuda.is_available()


def all_systems():
    def magpy_reset():
        magpy.reset()

    systems = [System("eager", lambda m, a: m)]
    for b in magpy_backends():
        systems.append(System(f"magpy-{b}", lambda m, a, b=b: magpy.compile(m, backend=b),
                              reset=magpy_reset, is_magpy=True))
    systems += [
        System("jit.trace", lambda m, a: torch.jit.trace(m, a, check_trace=False)),
        System("jit.script", lambda m, a: torch.jit.script(m)),
        System("jit.trace+freeze",
               lambda m, a: torch.jit.freeze(torch.jit.trace(m, a, check_trace=False).eval())),
        # freeze + the inference rewrites (conv/bn folding, MKLDNN layouts on CPU): the
        # strongest torch.jit baseline, for a backend that applies them
        System("jit.trace+optimize",
               lambda m, a: torch.jit.optimize_for_inference(
                   torch.jit.trace(m, a, check_trace=False).eval())),
    ]
    if torch_compile_available():
        def dynamo_reset():
            import torch._dynamo
            torch._dynamo.reset()
        systems += [
            System("torch.compile", lambda m, a: torch.compile(m), reset=dynamo_reset),
            System("torch.compile(reduce-overhead)",
                   lambda m, a: torch.compile(m, mode="reduce-overhead"), reset=dynamo_reset),
        ]
    return systems


# --------------------------------------------------------------------------------------------
# measurement helpers


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def per_call_ns(fn, args, n, device):
    sync(device)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn(*args)
    sync(device)
    return (time.perf_counter_ns() - t0) / n


def minor_faults():
    """Minor page faults of this process so far (a diagnostic: a system that keeps more
    intermediates alive can make the allocator map fresh pages on every call)."""
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    except Exception:
        return 0


def flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flat(o)]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in flat(out[k])]
    raise TypeError(f"unsupported output type {type(out).__name__}")


def max_abs_diff(a, b):
    """Largest absolute difference between two flat lists of tensors (inf if they differ in
    number, shape or dtype)."""
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return math.inf
        if x.numel():
            worst = max(worst, (x.detach().cpu().double() - y.detach().cpu().double()).abs().max().item())
    return worst


def compare(out, ref, ref64=None):
    """(max abs diff, ok) of an output against the eager output `ref`. With `ref64` (the
    model run in float64, on a GPU) an output is also ok when it is no further from it than
    twice eager's own distance, plus atol."""
    a, b = flat(out), flat(ref)
    if len(a) != len(b) or any(x.shape != y.shape or x.dtype != y.dtype for x, y in zip(a, b)):
        return math.inf, False
    ok = all(torch.allclose(x.detach().cpu(), y.detach().cpu(), rtol=RTOL, atol=ATOL)
             for x, y in zip(a, b))
    if not ok and ref64 is not None:
        r64 = flat(ref64)
        ok = max_abs_diff(a, r64) <= 2 * max_abs_diff(b, r64) + ATOL
    return max_abs_diff(a, b), ok


def float64_reference(model, args):
    """The model's output in float64 (a copy of it, on the same device), or None."""
    try:
        m64 = copy.deepcopy(model).double()  # (TF32 applies to float32 only)
        return m64(*(a.double() if a.is_floating_point() else a for a in args))
    except Exception:  # noqa: BLE001 -- a model that has no float64 kernels: eager's check only
        return None


def short_reason(e):
    msg = str(e).strip().splitlines()
    msg = msg[0] if msg else ""
    text = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def magpy_counters(cf):
    """(explanation, report dict, timings dict, hits, calls) of a compiled callable now."""
    ex = magpy.explain(cf)
    rep = getattr(ex, "report", None) or json.loads(ex.to_json())
    timings = getattr(ex, "timings", None)
    if not isinstance(timings, dict):
        timings = rep.get("timings_ns") or rep.get("timings") or {}
    hits = rep.get("cache_hits", 0) + rep.get("resume_hits", 0)
    calls = rep.get("calls") or hits + rep.get("cache_misses", 0)
    return ex, rep, dict(timings), hits, calls


def magpy_figures(cf, before=None):
    """graphs, breaks, cache hits, eager calls, backend notes, and guard and replay ns per call
    where the report has per-phase timings (None where it has not). With `before` (the
    magpy_counters of the same callable earlier), timings are over the calls since then."""
    ex, rep, timings, hits, calls = magpy_counters(cf)
    if before is not None:
        _, _, t0, h0, c0 = before
        timings = {k: v - t0.get(k, 0) if isinstance(v, (int, float)) else v
                   for k, v in timings.items()}
        hits, calls = hits - h0, calls - c0

    def phase(word, per):
        keys = [k for k in timings if word in k.lower()]
        if not keys:
            return None
        if any("per_call" in k.lower() for k in keys):
            return sum(float(timings[k]) for k in keys if "per_call" in k.lower())
        return sum(float(timings[k]) for k in keys) / per if per else None

    guard = phase("guard", calls)     # guards are checked on every call
    replay = phase("replay", hits)    # graphs are replayed on hits
    notes = sorted({g.get("backend_note", "") for g in rep.get("graphs", [])} - {""})
    return {"graphs": ex.graph_count, "breaks": ex.break_count, "cache_hits": ex.cache_hits,
            "cache_misses": ex.cache_misses, "calls": calls, "eager_calls": rep.get("eager_calls"),
            "break_reasons": sorted({b.reason_id for b in ex.breaks}),
            "backend_notes": notes, "guard_ns_per_call": guard, "replay_ns_per_hit": replay,
            "guard_replay_ns": None if guard is None and replay is None
            else (guard or 0.0) + (replay or 0.0),
            "timings_ns": {k: timings[k] for k in sorted(timings)}}


def gpu_kernels(fn, args, calls=20):
    """Kernels per call and their summed device time per call over `calls` calls, recorded by
    magpy's CUPTI profiler (torch.profiler, itself CUPTI through Kineto, where magpy is not
    importable). Copies and memsets are counted apart. None where nothing can be recorded."""
    torch.cuda.synchronize()
    if magpy is not None and magpy.profiler_status().get("available"):
        _magpy = magpy._magpy
        _magpy.profiler_flush()  # drop what an earlier sample left
        if not _magpy.profiler_start():
            return None
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
        _magpy.profiler_stop()
        recs = _magpy.profiler_flush()
        kernels = [r for r in recs if r["kind"] == "kernel"]
        copies = [r for r in recs if r["kind"] in ("memcpy", "memset")]
        ns = sum(r["end_ns"] - r["start_ns"] for r in kernels)
        source = "magpy CUPTI"
    else:
        from torch.profiler import profile as tprofile, ProfilerActivity
        with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*args)
            torch.cuda.synchronize()
        evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        kernels = [e for e in evs if "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
        copies = [e for e in evs if e not in kernels]
        ns = sum(e.time_range.elapsed_us() * 1000 for e in kernels)
        source = "torch.profiler"
    return {"kernels_per_call": len(kernels) / calls, "copies_per_call": len(copies) / calls,
            "kernel_us_per_call": ns / calls / 1e3, "source": source}


# --------------------------------------------------------------------------------------------
# one (model, batch)


def first_call(system, model, args, reps, device):
    """Median time of build + first call on a fresh object after a reset, and the output."""
    times, out = [], None
    for _ in range(reps):
        system.reset()
        gc.collect()
        sync(device)
        t0 = time.perf_counter_ns()
        fn = system.build(model, args)
        out = fn(*args)
        sync(device)
        times.append(time.perf_counter_ns() - t0)
        del fn
    return statistics.median(times), out


def bench_config(spec, batch, desc, systems, opts):
    device = opts.device
    model = spec.make().to(device)
    args = tuple(a.to(device) for a in spec.inputs(batch))
    rows = {s.name: {"model": spec.name, "batch": batch, "input": desc, "system": s.name,
                     "status": "ok", "reason": ""} for s in systems}
    ref = model(*args)
    ref = model(*args)
    ref64 = float64_reference(model, args) if device == "cuda" else None

    # first call: fresh objects after a reset, one system at a time
    for s in systems:
        r = rows[s.name]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t, out = first_call(s, model, args, opts.first_reps, device)
            r["first_call_ms"] = t / 1e6
            r["max_abs_diff"], ok = compare(out, ref, ref64)
            if not ok:
                r["status"], r["reason"] = "FAILED", "first call differs from eager"
        except Exception as e:
            r["status"], r["reason"] = "n/a", short_reason(e)
            if opts.verbose:
                traceback.print_exc()
    for s in systems:
        s.reset()

    # steady state: build every system afresh, warm up, check, calibrate
    live = []
    for s in systems:
        r = rows[s.name]
        if r["status"] == "n/a":
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn = s.build(model, args)
                for _ in range(WARMUP_CALLS - 1):
                    fn(*args)
                out = fn(*args)
            diff, ok = compare(out, ref, ref64)
            r["max_abs_diff"] = max(r.get("max_abs_diff", 0.0), diff)
            if not ok and r["status"] == "ok":
                r["status"], r["reason"] = "FAILED", "warmed-up call differs from eager"
            one = min(per_call_ns(fn, args, 1, device) for _ in range(3))
            n = max(1, min(100000, round(opts.sample_s * 1e9 / max(one, 1.0))))
            live.append((s, fn, n))
            r["calls_per_sample"] = n
        except Exception as e:
            r["status"], r["reason"] = "n/a", short_reason(e)
            if opts.verbose:
                traceback.print_exc()

    # interleaved rounds
    samples = {s.name: [] for s, _, _ in live}
    faults = {s.name: 0 for s, _, _ in live}
    counters = {s.name: magpy_counters(fn) for s, fn, _ in live if s.is_magpy}
    gc.collect()
    for k in range(opts.repeats):
        shift = k % len(live) if live else 0
        for s, fn, n in live[shift:] + live[:shift]:
            f0 = minor_faults()
            samples[s.name].append(per_call_ns(fn, args, n, device))
            faults[s.name] += minor_faults() - f0
    for s, fn, n in live:
        r = rows[s.name]
        r["time_ms"] = statistics.median(samples[s.name]) / 1e6
        r["samples_ms"] = [x / 1e6 for x in samples[s.name]]
        r["minor_faults_per_call"] = faults[s.name] / (n * opts.repeats)
        r["spread"] = (max(samples[s.name]) - min(samples[s.name])) / statistics.median(
            samples[s.name])
        if s.is_magpy:
            r["magpy"] = magpy_figures(fn, counters[s.name])
        if device == "cuda":
            try:
                r["gpu"] = gpu_kernels(fn, args)
            except Exception as e:
                r["gpu"] = None
                r["gpu_error"] = short_reason(e)
    eager_t = rows["eager"].get("time_ms")
    for r in rows.values():
        if eager_t and r.get("time_ms"):
            r["speedup"] = eager_t / r["time_ms"]
    del live
    return [rows[s.name] for s in systems]


# --------------------------------------------------------------------------------------------
# report


def fmt(x, spec, dash="-"):
    return dash if x is None else format(x, spec)


def fmt_ms(x):
    if x is None:
        return "-"
    return f"{x:.4f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.1f}"


def pct(x):
    return "-" if x is None else f"{x * 100:.0f}%"


def print_table(rows):
    w = max([18] + [len(r["system"]) for r in rows])
    hdr = (f"{'model':13} {'batch':>5} {'input':15} {'system':{w}} {'ms/call':>9} {'speedup':>8} "
           f"{'spread':>6} {'pf/call':>7} {'first ms':>9} {'max|diff|':>9} {'status':7} "
           f"{'graphs/brk':>10} {'guard us':>8} {'replay us':>9}"
           + (f" {'kern/call':>9} {'GPU us':>8}" if any("gpu" in r for r in rows) else ""))
    print(hdr)
    print("-" * len(hdr))
    last = None
    for r in rows:
        key = (r["model"], r["batch"])
        if last is not None and key != last:
            print()
        last = key
        m = r.get("magpy")
        gb = f"{m['graphs']}/{m['breaks']}" if m else "-"
        us = (lambda k: fmt(m[k] / 1e3 if m and m[k] is not None else None, ".2f"))
        status = r["status"]
        line = (f"{r['model']:13} {r['batch']:5d} {r['input']:15} {r['system']:{w}} "
                f"{fmt_ms(r.get('time_ms')):>9} "
                f"{fmt(r.get('speedup'), '.2f') + ('x' if r.get('speedup') else ''):>8} "
                f"{pct(r.get('spread')):>6} {fmt(r.get('minor_faults_per_call'), '.0f'):>7} "
                f"{fmt_ms(r.get('first_call_ms')):>9} {fmt(r.get('max_abs_diff'), '.1e'):>9} "
                f"{status:7} {gb:>10} {us('guard_ns_per_call'):>8} "
                f"{us('replay_ns_per_hit'):>9}")
        if "gpu" in r:
            g = r["gpu"] or {}
            line += (f" {fmt(g.get('kernels_per_call'), '.1f'):>9}"
                     f" {fmt(g.get('kernel_us_per_call'), '.1f'):>8}")
        if r["reason"]:
            line += f"  {r['reason']}" if status == "n/a" else f"  ({r['reason']})"
        if m and m["backend_notes"]:
            line += "  note: " + "; ".join(m["backend_notes"])
        print(line)


def summarize(rows, system_names):
    geo = {}
    for name in system_names:
        sp = [r["speedup"] for r in rows if r["system"] == name and r["status"] == "ok"
              and r.get("speedup")]
        total = len({(r["model"], r["batch"]) for r in rows})
        geo[name] = {"geomean_speedup": geomean(sp), "rows": len(sp), "of": total}
    return geo


# Each magpy TorchScript backend against the torch.jit path that does the same work: plain
# graphs against jit.trace, frozen inference graphs against trace + optimize_for_inference.
PAIRS = [("magpy-torchscript", "jit.trace"), ("magpy-torchscript-freeze", "jit.trace+optimize")]


def vs_trace(rows, system="magpy-torchscript", ref="jit.trace"):
    out = []
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["batch"]), {})[r["system"]] = r
    for (model, batch), d in by.items():
        a, b = d.get(system), d.get(ref)
        ratio = None
        if a and b and a["status"] == "ok" and b["status"] == "ok" and a.get("time_ms") \
                and b.get("time_ms"):
            ratio = a["time_ms"] / b["time_ms"]
        out.append({"model": model, "batch": batch, "ratio": ratio,
                    "system_status": a["status"] if a else "absent",
                    "trace_status": b["status"] if b else "absent"})
    return out


def targets(rows, geo, names, quick):
    sub = " (quick subset)" if quick else ""
    res = []
    for ts, ref in PAIRS:
        if ts not in names:
            why = (f"{ts} was not selected (--systems)" if ts[6:] in magpy_backends() else
                   f"magpy has no '{ts[6:]}' backend (backends: {magpy_backends()})")
            if MAGPY_ERROR:
                why = f"magpy not importable: {MAGPY_ERROR}"
            res.append({"target": f"{ts} geomean speedup over eager >= {TARGET_GEOMEAN}x",
                        "result": "SKIP", "detail": why})
            res.append({"target": f"{ts} at most {TARGET_VS_TRACE:.2f}x {ref} time on every model",
                        "result": "SKIP", "detail": why})
            continue
        g = geo[ts]
        ok_all = g["rows"] == g["of"]
        v = g["geomean_speedup"]
        res.append({"target": f"{ts} geomean speedup over eager >= {TARGET_GEOMEAN}x",
                    "result": "PASS" if v is not None and v >= TARGET_GEOMEAN and ok_all else "FAIL",
                    "detail": f"geomean {fmt(v, '.3f')}x over {g['rows']} of {g['of']} rows{sub}"
                    + ("" if ok_all else "; some rows n/a or FAILED")})
        vt = vs_trace(rows, ts, ref)
        bad = [x for x in vt if x["ratio"] is None and x["trace_status"] == "ok"
               or x["ratio"] is not None and x["ratio"] > TARGET_VS_TRACE]
        worst = max((x["ratio"] for x in vt if x["ratio"] is not None), default=None)
        res.append({"target": f"{ts} at most {TARGET_VS_TRACE:.2f}x {ref} time on every model",
                    "result": "FAIL" if bad or worst is None else "PASS",
                    "detail": f"worst ratio {fmt(worst, '.3f')}"
                    + ("; over the limit or not measured: "
                       + ", ".join(f"{x['model']}/b{x['batch']}" for x in bad) if bad else "")
                    + sub})
    return res


def gpu_targets(rows, names):
    """On the GPU: each magpy system at least at parity with torch.compile (the faster of its
    two modes, side by side in the same rounds) on every row."""
    res = []
    refs = [n for n in names if n.startswith("torch.compile")]
    mine = [n for n in names if n.startswith("magpy-")]
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["batch"]), {})[r["system"]] = r
    # and magpy with the backend a user would pick for that model: its fastest one that ran
    # and matched eager
    best = "magpy (fastest backend)"
    for d in by.values():
        ok = [d[n] for n in mine if n in d and d[n]["status"] == "ok" and d[n].get("time_ms")]
        if ok:
            d[best] = min(ok, key=lambda r: r["time_ms"])
    for ts in mine + ([best] if len(mine) > 1 else []):
        if not refs:
            res.append({"target": f"{ts} at parity with torch.compile on every model",
                        "result": "SKIP", "detail": "torch.compile did not run"})
            continue
        bad, worst = [], None
        for (model, batch), d in by.items():
            a = d.get(ts)
            ref_ms = min((d[n]["time_ms"] for n in refs if n in d and d[n]["status"] == "ok"
                          and d[n].get("time_ms")), default=None)
            if not a or a["status"] != "ok" or not a.get("time_ms") or ref_ms is None:
                bad.append(f"{model}/b{batch}")
                continue
            ratio = a["time_ms"] / ref_ms
            worst = ratio if worst is None else max(worst, ratio)
            if ratio > 1.0:
                bad.append(f"{model}/b{batch} {ratio:.2f}x"
                           + (f" ({a['system']})" if ts == best else ""))
        res.append({"target": f"{ts} at parity with torch.compile on every model",
                    "result": "FAIL" if bad else "PASS",
                    "detail": f"worst time ratio to the faster torch.compile {fmt(worst, '.3f')}"
                    + ("; behind or not measured: " + ", ".join(bad) if bad else "")})
    return res


def machine_info(opts):
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "loadavg_at_start": load,
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "device": opts.device, "magpy_backends": magpy_backends()}
    if magpy is not None:
        info["magpy"] = getattr(magpy, "__version__", "?")
    else:
        info["magpy_error"] = MAGPY_ERROR
    if opts.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        import torchvision
        info["torchvision"] = torchvision.__version__
    except Exception:
        pass
    return info


def busy(info, opts):
    """Whether the 1-minute load average says other processes competed for the cores."""
    start = (info.get("loadavg_at_start") or [0])[0]
    end = (info.get("loadavg_at_end") or [0])[0]
    return max(start + opts.threads, end) > (os.cpu_count() or 1) + 0.5


def plot(path, rows, names, log, info):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = []
    for r in rows:
        key = (r["model"], r["batch"])
        if key not in configs:
            configs.append(key)
    shown = [n for n in names if n != "eager"]
    by = {(r["model"], r["batch"], r["system"]): r for r in rows}
    width = 0.8 / max(1, len(shown))
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(configs) + 3), 5))
    for i, name in enumerate(shown):
        xs, ys, hatches = [], [], []
        for j, (m, b) in enumerate(configs):
            r = by.get((m, b, name))
            if r and r.get("speedup"):
                xs.append(j + (i - (len(shown) - 1) / 2) * width)
                ys.append(r["speedup"])
                hatches.append("//" if r["status"] != "ok" else "")
        bars = ax.bar(xs, ys, width, label=name)
        for bar, h in zip(bars, hatches):
            bar.set_hatch(h)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels([f"{m}\nb{b}" for m, b in configs], fontsize=8)
    ax.set_ylabel("speedup over eager (x)")
    if log:
        from matplotlib.ticker import FormatStrFormatter
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FormatStrFormatter("%.2g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%.2g"))
    where = f", {info['gpu']}" if info.get("gpu") else ""
    ax.set_title(f"speedup over eager, torch {info.get('torch', '?')}{where}, "
                 f"{'grad' if rows and rows[0].get('grad') else 'no_grad'} (hatched: FAILED)",
                 fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------


def prime(systems, device):
    """Build and call every system once on a tiny module, so one-time lazy initialisation (of
    torch.jit, of the magpy engine) is not charged to the first model's first call."""
    tiny = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval().to(device)
    x = torch.randn(2, 4, device=device)
    for s in systems:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn = s.build(tiny, (x,))
                for _ in range(3):
                    fn(x)
        except Exception:
            pass
        s.reset()


WORKER_TIMEOUT_S = 900


def worker_argv(key, out, opts):
    argv = [sys.executable, os.path.abspath(__file__), "--worker", key, "--worker-out", out,
            "--repeats", str(opts.repeats), "--threads", str(opts.threads),
            "--device", opts.device]
    for flag in ("quick", "all_batches", "grad", "verbose"):
        if getattr(opts, flag):
            argv.append("--" + flag.replace("_", "-"))
    if opts.systems:
        argv += ["--systems", opts.systems]
    return argv


def run_worker(spec, batch, desc, names, opts):
    """Run one (model, batch) in a fresh interpreter; its rows. If the worker dies (a CUDA
    error leaves the whole process unusable), every system is run again in a worker of its own
    beside eager, so the one that died is named and the others keep their figures."""
    rows, why = run_one_worker(spec, batch, desc, names, opts)
    if rows is not None:
        return rows
    alone = [n for n in names if n != "eager"]
    if len(alone) < 2:
        return [{"model": spec.name, "batch": batch, "input": desc, "system": n,
                 "status": "n/a", "reason": why} for n in names]
    print(f"# {spec.name}/b{batch}: each system again, alone beside eager", file=sys.stderr)
    got = {}
    for n in alone:
        rows_n, why_n = run_one_worker(spec, batch, desc, ["eager", n], opts, only=n)
        if rows_n is None:
            if opts.device == "cuda":  # once more, each launch waited for: where it faulted
                _, why_b = run_one_worker(spec, batch, desc, ["eager", n], opts, only=n,
                                          env={"CUDA_LAUNCH_BLOCKING": "1"})
                why_n += f" (with CUDA_LAUNCH_BLOCKING=1: {why_b or 'ran'})"
            got[n] = {"model": spec.name, "batch": batch, "input": desc, "system": n,
                      "status": "n/a", "reason": "run alone, " + why_n}
            continue
        for r in rows_n:
            r["run_alone"] = True
            if r["system"] == n or "eager" not in got:
                got.setdefault(r["system"], r)
    if "eager" not in got:  # eager itself died in every worker
        got["eager"] = {"model": spec.name, "batch": batch, "input": desc, "system": "eager",
                        "status": "n/a", "reason": why}
    return [got[n] for n in names]


def run_one_worker(spec, batch, desc, names, opts, only=None, env=None):
    """(rows, None) from a worker running `names` (or only eager and `only`), or (None, why).
    `env`: variables to set in the worker's environment."""
    import subprocess
    import tempfile
    fd, out = tempfile.mkstemp(prefix="magpy-bench-", suffix=".json")
    os.close(fd)
    try:
        argv = worker_argv(f"{spec.name}/b{batch}", out, opts)
        if only:
            argv += ["--systems", "=" + only]
        try:
            proc = subprocess.run(argv, env=dict(os.environ, **(env or {})),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  timeout=WORKER_TIMEOUT_S)
            rc, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, err = "timeout", (e.stderr or b"").decode(errors="replace") \
                if isinstance(e.stderr, bytes) else (e.stderr or "")
        if opts.verbose and err:
            sys.stderr.write(err)
        if rc == 0:
            with open(out) as f:
                text = f.read()
            if text:
                return json.loads(text), None
        tail = [l for l in (err or "").strip().splitlines() if l.strip()]
        # the exception's own line ("torch.AcceleratorError: CUDA error: ..."), not the advice
        # lines CUDA errors end with
        key = next((l for l in reversed(tail) if re.match(r"[\w.]*(Error|Exception)\b.*:", l)),
                   next((l for l in reversed(tail) if "Error" in l), tail[-1] if tail else ""))
        why = ("worker " + (f"timed out after {WORKER_TIMEOUT_S} s" if rc == "timeout"
                            else f"exited with {rc}")
               + (f": {key.strip()[:140]}" if key else ""))
        print(f"# {spec.name}/b{batch}{' ' + only if only else ''}"
              f"{''.join(f' {k}={v}' for k, v in (env or {}).items())}: {why}", file=sys.stderr)
        for line in tail[-25:]:  # where it died: the end of the worker's traceback
            print(f"#   {line.rstrip()[:200]}", file=sys.stderr)
        return None, why
    finally:
        os.unlink(out)


def worker_main(opts, systems, configs):
    want = [c for c in configs if f"{c[0].name}/b{c[1]}" == opts.worker]
    if len(want) != 1:
        raise SystemExit(f"--worker {opts.worker!r}: no such model/batch")
    spec, batch, desc = want[0]
    with torch.set_grad_enabled(opts.grad):
        prime(systems, opts.device)
        rows = bench_config(spec, batch, desc, systems, opts)
    marking = getattr(getattr(magpy, "_fx", None), "static_parameters", None)
    if marking:  # magpy-cudagraphs: whether its graphs read the parameters in place
        for r in rows:
            if r["system"] == "magpy-cudagraphs":
                r["static_parameters"] = dict(marking)
        if opts.verbose:
            print(f"# {spec.name}/b{batch} magpy-cudagraphs parameters: {dict(marking)}",
                  file=sys.stderr)
    with open(opts.worker_out, "w") as f:
        json.dump(rows, f)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="5 rounds of ~10 ms samples, 1 first-call rep, batch 1 only")
    ap.add_argument("--all-batches", action="store_true",
                    help="with --quick: every batch size, the first one of every model before "
                         "the others (a run cut short by a time limit has whole batch sizes)")
    ap.add_argument("--filter", help="comma-separated substrings of model names (or model/bN)")
    ap.add_argument("--systems", help="comma-separated substrings of system names "
                                      "(eager is always run)")
    ap.add_argument("--repeats", type=int, help="interleaved rounds (default 9, 5 with --quick)")
    ap.add_argument("--grad", action="store_true", help="run with grad enabled (default no_grad)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1: steadier figures)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json")
    ap.add_argument("--plot", help="write a PNG of speedup over eager per model and system")
    ap.add_argument("--plot-log", action="store_true", help="log-scale y axis in --plot")
    ap.add_argument("--list", action="store_true", help="list models and systems and exit")
    ap.add_argument("--from-json", metavar="JSON",
                    help="print the table (and --plot) of an earlier run's JSON, e.g. one "
                         "brought back from the GPU machine or cut short, and exit")
    ap.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of n/a")
    ap.add_argument("--in-process", action="store_true",
                    help="run every model in this process (default: one worker subprocess per "
                         "model and batch, so allocator and cache state left by one model does "
                         "not move the next one's figures, and a crash is one row of n/a)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)        # MODEL/bN: run one, write rows
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    opts.repeats = opts.repeats or (5 if opts.quick else 9)
    if opts.from_json:
        with open(opts.from_json) as f:
            saved = json.load(f)
        print_table(saved["rows"])
        if opts.plot:
            plot(opts.plot, saved["rows"], saved["systems"], opts.plot_log, saved["machine"])
        return 0
    opts.sample_s = 0.01 if opts.quick else 0.05
    opts.first_reps = 1 if opts.quick else 3
    if opts.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available")
    torch.set_num_threads(opts.threads)

    systems = all_systems()
    if opts.systems:
        want = [w.strip() for w in opts.systems.split(",") if w.strip()]
        # "=NAME" is that system alone; a plain entry is a substring of names
        systems = [s for s in systems if s.name == "eager" or any(
            s.name == w[1:] if w.startswith("=") else w in s.name for w in want)]
    names = [s.name for s in systems]

    filters = [f.strip() for f in (opts.filter or "").split(",") if f.strip()]
    configs = []
    for spec in MODELS.values():
        batches = spec.quick_batches if opts.quick and not opts.all_batches else spec.batches
        for i, (batch, desc) in enumerate(batches):
            key = f"{spec.name}/b{batch}"
            if filters and not any(f in spec.name or f == key for f in filters):
                continue
            configs.append((i, spec, batch, desc))
    if opts.quick and opts.all_batches:
        configs.sort(key=lambda c: c[0])  # stable: models in their order within each size
    configs = [c[1:] for c in configs]
    if opts.worker:
        return worker_main(opts, systems, configs)
    if opts.list:
        for spec in MODELS.values():
            print(f"{spec.name:13} {spec.note}; batches "
                  + ", ".join(f"{b} ({d})" for b, d in spec.batches))
        print("systems:", ", ".join(names))
        return 0
    if not configs:
        ap.error(f"--filter {opts.filter!r} selects no model (models: {', '.join(MODELS)})")

    info = machine_info(opts)
    print(f"# {info['cpu']}, {info['cores']} cores, torch {info['torch']} "
          f"({opts.threads} thread{'s' if opts.threads != 1 else ''}), python {info['python']}, "
          f"{'grad enabled' if opts.grad else 'no_grad'}, device {opts.device}, "
          f"{opts.repeats} rounds")
    print(f"# systems: {', '.join(names)}")
    if magpy is None:
        print(f"# magpy not importable: {MAGPY_ERROR}")
    print()

    t_start = time.perf_counter()
    rows = []
    with torch.set_grad_enabled(opts.grad):
        if opts.in_process:
            prime(systems, opts.device)
        for spec, batch, desc in configs:
            t0 = time.perf_counter()
            if opts.in_process:
                got = bench_config(spec, batch, desc, systems, opts)
            else:
                got = run_worker(spec, batch, desc, names, opts)
            for r in got:
                r["grad"] = opts.grad
            rows += got
            if opts.json:  # rows so far: a run cut short by a time limit keeps what it measured
                with open(opts.json, "w") as f:
                    json.dump({"machine": info, "systems": names, "rows": rows,
                               "partial": True}, f, indent=2)
            print(f"# {spec.name}/b{batch} done ({time.perf_counter() - t0:.1f} s)",
                  file=sys.stderr, flush=True)

    print_table(rows)
    geo = summarize(rows, names)
    print()
    print("geometric-mean speedup over eager (rows where the system ran and matched eager):")
    for name in names:
        g = geo[name]
        print(f"  {name:32} {fmt(g['geomean_speedup'], '.3f'):>7}x   "
              f"({g['rows']} of {g['of']} rows)")
    for ts, ref in PAIRS:
        vt = vs_trace(rows, ts, ref) if ts in names else []
        if not vt:
            continue
        print()
        print(f"{ts} time / {ref} time (target <= {TARGET_VS_TRACE:.2f}):")
        for x in vt:
            print(f"  {x['model']:13} b{x['batch']:<4} "
                  + (f"{x['ratio']:.3f}" if x["ratio"] is not None else
                     f"n/a ({ts} {x['system_status']}, {ref} {x['trace_status']})"))
    tg = targets(rows, geo, names, opts.quick)
    if opts.device == "cuda":
        tg += gpu_targets(rows, names)
    print()
    for t in tg:
        print(f"{t['result']}: {t['target']} -- {t['detail']}")
    failed = [r for r in rows if r["status"] == "FAILED"]
    if failed:
        print("FAILED correctness: " + ", ".join(
            f"{r['system']} on {r['model']}/b{r['batch']}" for r in failed))
    elapsed = time.perf_counter() - t_start
    try:
        info["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    print(f"# {elapsed:.1f} s; load average at start {info.get('loadavg_at_start')}, "
          f"at end {info.get('loadavg_at_end')}"
          + (" -- the load average says other work was running: figures may be noisy"
             if busy(info, opts) else ""))

    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"machine": info,
                       "config": {"quick": opts.quick, "repeats": opts.repeats,
                                  "sample_s": opts.sample_s, "first_call_reps": opts.first_reps,
                                  "warmup_calls": WARMUP_CALLS, "threads": opts.threads,
                                  "grad": opts.grad, "filter": opts.filter,
                                  "isolation": "process per config" if not opts.in_process
                                  else "one process",
                                  "rtol": RTOL, "atol": ATOL},
                       "systems": names, "rows": rows, "geomean": geo,
                       "vs_jit": {ts: vs_trace(rows, ts, ref) for ts, ref in PAIRS
                                  if ts in names},
                       "targets": tg, "elapsed_s": elapsed},
                      f, indent=2)
    if opts.plot:
        plot(opts.plot, rows, names, opts.plot_log, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
