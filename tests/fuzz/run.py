"""Run the magpy differential fuzzer on a range of seeds and print every mismatch.

    /usr/bin/python3 tests/fuzz/run.py --seed 0 --count 200       # seeds 0..199
    /usr/bin/python3 tests/fuzz/run.py --seed 1234 --count 1 -v   # one program, print it

Exit status 1 if any program mismatched (or failed to load). The benchmark mode with
throughput and break statistics is bench/fuzz.py.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gen import generate  # noqa: E402
from runner import run_program  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--count", type=int, default=100, help="number of programs")
    ap.add_argument("--calls", type=int, default=6, help="calls per program")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print each program and its statistics")
    args = ap.parse_args(argv)
    bad = 0
    for seed in range(args.seed, args.seed + args.count):
        r = run_program(seed, args.calls)
        if args.verbose:
            print(generate(seed, args.calls))
            print(f"# seed {seed}: graphs {r.graphs} hits {r.hits} misses {r.misses} "
                  f"breaks {r.breaks} exceptions {r.exceptions} ({r.seconds * 1000:.1f} ms)")
        if not r.ok:
            bad += 1
            print(r.report(), flush=True)
    print(f"{args.count} programs, {bad} mismatching")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
