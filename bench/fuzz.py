"""Differential fuzzing as a benchmark: generated programs, eager vs magpy.compile.

Each seed gives one random program (tests/fuzz/gen.py) that runs in two worlds, eager and
compiled, for several calls with external state mutated between calls; every result, argument,
global and object is compared (tests/fuzz/runner.py). Prints throughput (programs/s),
mismatches (with the program and a reproduction command), capture statistics and graph breaks
by reason id (from magpy.explain()).

    /usr/bin/python3 bench/fuzz.py [--seconds N | --count N] [--seed S] [--calls C]
        [--in-process] [--timeout T] [--json OUT] [--save DIR] [--verbose]

By default the programs run in a worker subprocess, restarted after a crash (segfault, abort)
or a hang (no program finished within --timeout seconds): the seed is reported and the run
goes on. `--in-process` runs them in this process (a crash ends the run). Exit status 1 if
anything mismatched, crashed or hung.
"""

import argparse
import collections
import json
import os
import platform
import select
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
FUZZ = os.path.join(ROOT, "tests", "fuzz")
for _p in (FUZZ, os.path.join(ROOT, "build", "python"), os.path.join(ROOT, "core", "python")):
    if _p not in sys.path:
        sys.path.insert(0, _p)


def _reason_titles():
    """Short texts of the break reason ids (magpy.BREAK_REASONS; imported when needed, so the
    parent process does not load torch before the workers start)."""
    import magpy
    return magpy.BREAK_REASONS


def result_record(r):
    return {"seed": r.seed, "ok": r.ok, "graphs": r.graphs, "hits": r.hits, "misses": r.misses,
            "resume_hits": r.resume_hits, "resume_misses": r.resume_misses,
            "breaks": r.breaks, "exceptions": r.exceptions, "seconds": r.seconds,
            "gen_error": r.gen_error,
            "report": r.report() if not r.ok else ""}


# ---------------------------------------------------------------------- worker

def worker(first, calls):
    """Run seeds first, first+1, ... forever; one JSON line per program on stdout."""
    import faulthandler
    faulthandler.enable()
    from runner import run_program
    out = sys.stdout
    sys.stdout = sys.stderr  # programs may print; keep the protocol stream clean
    seed = first
    while True:
        out.write(json.dumps(result_record(run_program(seed, calls))) + "\n")
        out.flush()
        seed += 1


class Pool:
    """One worker subprocess, restarted at the next seed after a crash or a hang."""

    def __init__(self, calls, timeout):
        self.calls, self.timeout = calls, timeout
        self.proc = None
        self.buf = b""

    def start(self, seed):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--seed", str(seed),
               "--calls", str(self.calls)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.buf = b""
        self.err = b""

    def stop(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def next(self, seed):
        """The record of `seed` (the worker runs seeds in order)."""
        if self.proc is None:
            self.start(seed)
        deadline = time.monotonic() + self.timeout
        out_fd = self.proc.stdout.fileno()
        fds = [out_fd, self.proc.stderr.fileno()]
        while b"\n" not in self.buf:
            wait = deadline - time.monotonic()
            if wait <= 0:
                self.stop()
                return {"seed": seed, "ok": False, "hang": True,
                        "report": f"=== seed {seed}: no result within {self.timeout} s "
                                  "(killed) ===\n" + self.err.decode(errors="replace")[-3000:]}
            ready, _, _ = select.select(fds, [], [], wait)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if fd != out_fd:
                    self.err = (self.err + chunk)[-20000:]
                    if not chunk:
                        fds.remove(fd)
                    continue
                self.buf += chunk
                if not chunk:
                    rc = self.proc.wait()
                    self.proc = None
                    return {"seed": seed, "ok": False, "crash": True,
                            "report": f"=== seed {seed}: the worker died (exit {rc}) ===\n"
                                      + self.err.decode(errors="replace")[-3000:]}
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


# ---------------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--seconds", type=float, help="run for this long (default: 60)")
    g.add_argument("--count", type=int, help="run this many programs")
    ap.add_argument("--seed", type=int, default=0, help="first seed (then seed+1, ...)")
    ap.add_argument("--calls", type=int, default=6, help="calls per program")
    ap.add_argument("--in-process", action="store_true", help="no worker subprocess")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds one program may take in the worker before it is a hang")
    ap.add_argument("--json", help="write the totals and per-seed records here")
    ap.add_argument("--save", help="write each mismatching program's report to DIR/SEED.txt")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per program")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.seed, args.calls)
        return 0
    if args.seconds is None and args.count is None:
        args.seconds = 60.0

    pool = None
    if args.in_process:
        from runner import run_program

        def one(seed):
            return result_record(run_program(seed, args.calls))
    else:
        pool = Pool(args.calls, args.timeout)
        one = pool.next

    records = []
    t0 = time.perf_counter()
    seed = args.seed
    try:
        while True:
            if args.count is not None and len(records) >= args.count:
                break
            if args.seconds is not None and time.perf_counter() - t0 >= args.seconds:
                break
            rec = one(seed)
            records.append(rec)
            if args.verbose:
                state = "ok" if rec["ok"] else ("CRASH" if rec.get("crash") else
                                                "HANG" if rec.get("hang") else "MISMATCH")
                print(f"seed {seed}: {state}  graphs {rec.get('graphs', 0)} "
                      f"hits {rec.get('hits', 0)} breaks {rec.get('breaks', [])}", flush=True)
            if not rec["ok"]:
                print(rec["report"], flush=True)
                if args.save:
                    os.makedirs(args.save, exist_ok=True)
                    with open(os.path.join(args.save, f"{seed}.txt"), "w") as f:
                        f.write(rec["report"])
            seed += 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        if pool is not None:
            pool.stop()
    wall = time.perf_counter() - t0
    return summarize(records, wall, args)


def summarize(records, wall, args):
    n = len(records)
    bad = [r for r in records if not r["ok"]]
    crashes = [r["seed"] for r in bad if r.get("crash")]
    hangs = [r["seed"] for r in bad if r.get("hang")]
    gen_errors = [r["seed"] for r in bad if r.get("gen_error")]
    mismatches = [r["seed"] for r in bad if r["seed"] not in set(crashes + hangs + gen_errors)]
    done = [r for r in records if "graphs" in r]
    whole = sum(1 for r in done if r["graphs"] and not r["breaks"])
    with_graph = sum(1 for r in done if r["graphs"])
    hits = sum(r["hits"] for r in done)
    misses = sum(r["misses"] for r in done)
    rhits = sum(r.get("resume_hits", 0) for r in done)
    rmisses = sum(r.get("resume_misses", 0) for r in done)
    exc = sum(r["exceptions"] for r in done)
    by_reason = collections.Counter()
    progs_by_reason = collections.Counter()
    for r in done:
        by_reason.update(r["breaks"])
        progs_by_reason.update(set(r["breaks"]))
    first = records[0]["seed"] if records else args.seed
    pct = (lambda k: f"{100.0 * k / n:.1f}%") if n else (lambda k: "-")
    print()
    print(f"magpy fuzz: seeds {first}..{first + n - 1} ({n} programs, {args.calls} calls each) "
          f"in {wall:.1f} s: {n / wall if wall else 0:.1f} programs/s "
          f"({'worker subprocess' if not args.in_process else 'in-process'}; "
          f"python {platform.python_version()})")
    print(f"  mismatches: {len(mismatches)}" + (f"  seeds {mismatches[:50]}" if mismatches else ""))
    print(f"  crashes: {len(crashes)}" + (f"  seeds {crashes}" if crashes else "") +
          f"   hangs: {len(hangs)}" + (f"  seeds {hangs}" if hangs else "") +
          f"   generator errors: {len(gen_errors)}" +
          (f"  seeds {gen_errors}" if gen_errors else ""))
    print(f"  captured whole (graphs, no break): {whole} ({pct(whole)});  "
          f"with at least one graph: {with_graph} ({pct(with_graph)})")
    print(f"  cache: {hits} hits, {misses} misses;  after breaks: {rhits} hits, "
          f"{rmisses} misses;  calls that raised (both worlds): {exc}")
    print("  breaks by reason (break records / programs with it):")
    for rid, k in sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0])):
        title = _reason_titles().get(rid, "")
        print(f"    {rid}  {title:<40} {k:6d} / {progs_by_reason[rid]}")
    if not by_reason:
        print("    (none)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"programs": n, "seconds": wall,
                       "programs_per_second": n / wall if wall else 0,
                       "calls": args.calls, "first_seed": first, "mismatch_seeds": mismatches,
                       "crash_seeds": crashes, "hang_seeds": hangs,
                       "generator_error_seeds": gen_errors, "captured_whole": whole,
                       "with_graph": with_graph, "cache_hits": hits, "cache_misses": misses,
                       "resume_hits": rhits, "resume_misses": rmisses, "raised_calls": exc,
                       "breaks_by_reason": dict(by_reason),
                       "programs_by_reason": dict(progs_by_reason),
                       "records": [{k: v for k, v in r.items() if k != "report"} for r in records]},
                      f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
