"""Request round-trip latency of the magpy kernel against Debian's ipykernel and xeus-python.

    /usr/bin/python3 bench/kernel_latency.py [--binary build/kernel/magpy-kernel] [-n 200]
        [--json out.json] [--compare OTHER-BUILD/magpy-kernel]

For each kernel and each request (`pass`, a print, a small display), the time from sending
execute_request to receiving both the execute_reply and the closing `idle` status (so every
output is in). The three kernels run side by side and are measured in interleaved rounds of
`--round` requests, after a warm-up, so drift hits all of them alike. Prints median and p90
in milliseconds and writes JSON. Not a test.

Then magpy against each peer, paired by round (each round's median against the peer's median in
the same round, so load that comes and goes hits both): the median of the per-round ratios
magpy/peer with a bootstrap 95% interval over rounds, and in how many rounds magpy was faster.
"Faster" holds where the whole interval lies below 1.

The `in-kernel` column is the kernel's own share of the round trip: from the `date` of its
`busy` status to that of its `idle` status (both stamped by the kernel; the rest is ZeroMQ and
jupyter_client in this process, which costs every kernel alike). Header dates are read from
the raw strings: xeus 2.4.1 writes the fraction of a second without leading zeros
(`...:49.9707Z` for 9707 us), which jupyter_client's own date parsing reads as 0.9707 s.
"""

import argparse
import calendar
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time

import jupyter_client.session
from jupyter_client.manager import start_new_kernel

# Keep header dates as the kernels wrote them (see the module docstring); parsed by header_time.
jupyter_client.session.extract_dates = lambda obj: obj

REQUESTS = {
    "pass": "pass",
    "print": "print('hello, world')",
    "display": "display(HTML('<b>hi</b>'))",
}
SETUP = "from IPython.display import HTML, display"


def magpy_spec_dir(binary, compare=None):
    """A temporary kernelspec for exactly this binary (not whatever is installed), and one
    named magpy-bench-compare for the binary to compare with, if any."""
    root = tempfile.mkdtemp(prefix="magpy-kernel-bench-")
    for name, path in (("magpy-bench", binary), ("magpy-bench-compare", compare)):
        if path is None:
            continue
        spec = os.path.join(root, "kernels", name)
        os.makedirs(spec)
        with open(os.path.join(spec, "kernel.json"), "w") as f:
            json.dump({"argv": [os.path.abspath(path), "-f", "{connection_file}"],
                       "display_name": "magpy (bench)", "language": "python",
                       "interrupt_mode": "signal"}, f)
    return root


def header_time(date):
    """Seconds since the epoch of a header's ISO 8601 `date`, its fraction read as a count of
    microseconds when it has fewer than 6 digits (xeus 2.4.1), as one otherwise."""
    if not isinstance(date, str):  # already a datetime (another jupyter_client)
        return date.timestamp()
    date = date.strip()
    offset = 0
    if date.endswith("Z"):
        date = date[:-1]
    elif len(date) > 6 and date[-6] in "+-" and date[-3] == ":":
        sign = 1 if date[-6] == "+" else -1
        offset = sign * (int(date[-5:-3]) * 3600 + int(date[-2:]) * 60)
        date = date[:-6]
    whole, _, frac = date.partition(".")
    t = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) - offset
    if frac:
        t += int(frac) / 1e6 if len(frac) < 6 else float("0." + frac)
    return t


def round_trip(kc, code):
    """(round trip ms, in-kernel ms: busy to idle by the kernel's own header dates)."""
    t0 = time.perf_counter()
    msg_id = kc.execute(code, store_history=False)
    got_reply = got_idle = False
    busy = idle = None
    while not (got_reply and got_idle):
        if not got_reply:
            msg = kc.get_shell_msg(timeout=30)
            if msg["parent_header"].get("msg_id") == msg_id:
                got_reply = True
                if msg["content"]["status"] != "ok":
                    raise RuntimeError("%r failed: %s" % (code, msg["content"]))
            continue
        msg = kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status":
            if msg["content"]["execution_state"] == "busy":
                busy = msg["header"]["date"]
            elif msg["content"]["execution_state"] == "idle":
                idle = msg["header"]["date"]
                got_idle = True
    elapsed = (time.perf_counter() - t0) * 1e3
    in_kernel = (header_time(idle) - header_time(busy)) * 1e3 if busy and idle else float("nan")
    return elapsed, in_kernel


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def compare_rounds(mine, theirs, round_size, resamples=2000):
    """Paired comparison of two sample lists taken in the same interleaved rounds: (median of
    per-round median ratios mine/theirs, its bootstrap 95% interval, rounds where mine was
    faster, rounds)."""
    def round_medians(xs):
        return [statistics.median(xs[i:i + round_size]) for i in range(0, len(xs), round_size)]
    ratios = [a / b for a, b in zip(round_medians(mine), round_medians(theirs))]
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                  for _ in range(resamples))
    return (statistics.median(ratios), (percentile(boot, 0.025), percentile(boot, 0.975)),
            sum(r < 1 for r in ratios), len(ratios))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--binary", default=os.path.join(here, "..", "build", "kernel", "magpy-kernel"),
                    help="the magpy-kernel executable (default: build/kernel/magpy-kernel)")
    ap.add_argument("--compare", metavar="BINARY",
                    help="another magpy-kernel build to measure in the same run (row magpy-compare)")
    ap.add_argument("-n", type=int, default=200, help="requests per kernel and request kind")
    ap.add_argument("--round", type=int, default=20, help="requests per interleaved round")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    for path in (args.binary, args.compare):
        if path is not None and not os.access(path, os.X_OK):
            sys.exit("kernel_latency: %s is not an executable; build it (scripts/build.sh) or "
                     "pass --binary" % path)

    root = magpy_spec_dir(args.binary, args.compare)
    os.environ["JUPYTER_PATH"] = root + os.pathsep + os.environ.get("JUPYTER_PATH", "")
    ipython_dir = tempfile.mkdtemp(prefix="magpy-kernel-bench-ipython-")
    os.environ["IPYTHONDIR"] = ipython_dir
    kernels = {"magpy": "magpy-bench", "ipykernel": "python3", "xeus-python": "xpython"}
    if args.compare:
        kernels["magpy-compare"] = "magpy-bench-compare"
    clients = {}
    try:
        for label, name in kernels.items():
            try:
                clients[label] = start_new_kernel(kernel_name=name, startup_timeout=120)
            except Exception as e:  # a missing peer is reported, not fatal
                print("kernel_latency: skipping %s (%s: %s)" % (label, type(e).__name__, e))
        for label, (km, kc) in clients.items():
            round_trip(kc, SETUP)
            for code in REQUESTS.values():
                for _ in range(args.warmup):
                    round_trip(kc, code)
        samples = {label: {req: [] for req in REQUESTS} for label in clients}
        inside = {label: {req: [] for req in REQUESTS} for label in clients}
        done = 0
        while done < args.n:
            batch = min(args.round, args.n - done)
            for req, code in REQUESTS.items():
                for label, (km, kc) in clients.items():
                    for _ in range(batch):
                        total, in_kernel = round_trip(kc, code)
                        samples[label][req].append(total)
                        inside[label][req].append(in_kernel)
            done += batch
    finally:
        for km, kc in clients.values():
            kc.stop_channels()
            km.shutdown_kernel(now=True)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(ipython_dir, ignore_errors=True)

    rows = []
    print("request round trip (execute_request -> reply and idle), ms, n=%d each" % args.n)
    print("%-14s %-8s %8s %8s %10s" % ("kernel", "request", "median", "p90", "in-kernel"))
    for label in clients:
        for req in REQUESTS:
            xs = samples[label][req]
            ks = [x for x in inside[label][req] if x == x]  # not NaN
            row = {"kernel": label, "request": req, "n": len(xs),
                   "median_ms": statistics.median(xs), "p90_ms": percentile(xs, 0.9),
                   "in_kernel_median_ms": statistics.median(ks) if ks else None}
            rows.append(row)
            print("%-14s %-8s %8.3f %8.3f %10s" % (
                label, req, row["median_ms"], row["p90_ms"],
                "%.3f" % row["in_kernel_median_ms"] if ks else "n/a"))
    comparisons = []
    if "magpy" in clients:
        print("\nmagpy / peer, paired by round of %d (median of round ratios, bootstrap 95%% "
              "interval; < 1: magpy faster)" % args.round)
        for peer in clients:
            if peer == "magpy":
                continue
            for req in REQUESTS:
                ratio, (lo, hi), wins, rounds = compare_rounds(
                    samples["magpy"][req], samples[peer][req], args.round)
                verdict = ("faster" if hi < 1 else "slower" if lo > 1 else "no clear difference")
                comparisons.append({"peer": peer, "request": req, "ratio": ratio,
                                    "ci95": [lo, hi], "rounds_faster": wins, "rounds": rounds,
                                    "verdict": verdict})
                print("magpy/%-14s %-8s %6.3f  [%.3f, %.3f]  faster in %d/%d rounds: %s" % (
                    peer, req, ratio, lo, hi, wins, rounds, verdict))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"python": platform.python_version(), "machine": platform.machine(),
                       "cpus": os.cpu_count(), "rows": rows, "comparisons": comparisons},
                      f, indent=2)
        print("kernel_latency: wrote", args.json)


if __name__ == "__main__":
    main()
