"""Shrink a mismatching fuzz program: delete statements while the mismatch stays.

    /usr/bin/python3 tests/fuzz/reduce.py --seed 1234 [--out small.py]
    /usr/bin/python3 tests/fuzz/reduce.py --file prog.py --seed 1234
    /usr/bin/python3 tests/fuzz/reduce.py --seed 1234 --break MB099

With `--break ID` the program is kept while the compiled function still records a graph break
with that reason id (for MB099, the engine's internal breaks, which are bugs but not mismatches).

Greedy block deletion: a line together with the lines indented under it is removed if the
program still loads and still mismatches (eager vs compiled) in a call at the same index with a
difference at the same place (the first diff's path, e.g. `result[0]`). Repeats until nothing
more can go, then prints the program. The seed matters (it seeds torch for both worlds), so
reduce with the seed that found the mismatch. Turning the result into a standalone test is
manual: keep `fn`, inline the values `make_args` and `mutate` produce.
"""

import argparse
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gen import generate  # noqa: E402
from runner import run_program  # noqa: E402


def signature(res, break_id=None):
    if break_id is not None:
        return ("break", break_id) if break_id in res.breaks else None
    if not res.mismatches:
        return None
    m = res.mismatches[0]
    first = m.diffs[0].split(":")[0] if m.diffs else ""
    return (m.call, first)


def block_end(lines, i):
    """Index after the block that starts at line i (the line plus deeper-indented lines)."""
    ind = len(lines[i]) - len(lines[i].lstrip())
    j = i + 1
    while j < len(lines) and (not lines[j].strip()
                              or len(lines[j]) - len(lines[j].lstrip()) > ind):
        j += 1
    return j


def split_top(expr):
    """Split `a, f(b, c), [d]` at its top-level commas."""
    parts, depth, cur = [], 0, ""
    for ch in expr:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def shorter_returns(line):
    """Versions of a `return a, b, c` line with one item fewer."""
    ind = line[:len(line) - len(line.lstrip())]
    body = line.strip()
    if not body.startswith("return "):
        return []
    items = split_top(body[len("return "):])
    if len(items) < 2:
        return []
    out = []
    for k in range(len(items)):
        rest = items[:k] + items[k + 1:]
        out.append(ind + "return " + ", ".join(rest) + ("," if len(rest) == 1 else ""))
    return out


class _Timeout(BaseException):
    """Not an Exception: the runner must not catch it as the program's own error."""


def _alarm(signum, frame):
    raise _Timeout()


def still_bad(src, seed, want, calls, limit=10.0, break_id=None):
    try:
        compile(src, "<reduce>", "exec")
    except SyntaxError:
        return False
    # deleting a loop counter's increment can make the candidate loop forever
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        res = run_program(seed, calls, source=src)
    except _Timeout:
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return not res.gen_error and signature(res, break_id) == want


def reduce_source(src, seed, calls=6, log=None, break_id=None):
    res = run_program(seed, calls, source=src)
    want = signature(res, break_id)
    if want is None:
        what = f"record a {break_id} break" if break_id else "mismatch"
        raise SystemExit(f"the program does not {what}: nothing to reduce")
    bad = lambda cand: still_bad("\n".join(cand), seed, want, calls, break_id=break_id)  # noqa: E731
    lines = src.split("\n")
    changed = True
    while changed:
        changed = False
        i = len(lines) - 1
        while i >= 0:
            if not lines[i].strip() or lines[i].lstrip().startswith(("def fn(", "import ")):
                i -= 1
                continue
            shortened = False
            for r in shorter_returns(lines[i]):
                cand = lines[:i] + [r] + lines[i + 1:]
                if bad(cand):
                    lines = cand
                    changed = shortened = True
                    break
            if shortened:
                continue  # try this line again
            j = block_end(lines, i)
            cand = lines[:i] + lines[j:]
            # a block emptied of its only statement needs a `pass`
            if i > 0 and lines[i - 1].rstrip().endswith(":") and (
                    i >= len(cand) or (len(cand[i]) - len(cand[i].lstrip()))
                    <= (len(lines[i - 1]) - len(lines[i - 1].lstrip()))):
                cand = lines[:i] + [lines[i][:len(lines[i]) - len(lines[i].lstrip())] + "pass"] \
                    + lines[j:]
                if j - i == 1 and lines[i].strip() == "pass":
                    i -= 1
                    continue
            if bad(cand):
                lines = cand
                changed = True
                if log:
                    log(f"  {len(lines)} lines")
            i = min(i, len(lines)) - 1
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--file", help="start from this source instead of generate(seed)")
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--out", help="write the reduced program here")
    ap.add_argument("--break", dest="break_id", metavar="ID",
                    help="keep the program while it records a break with this reason id")
    args = ap.parse_args(argv)
    src = open(args.file).read() if args.file else generate(args.seed, args.calls)
    small = reduce_source(src, args.seed, args.calls,
                          log=lambda m: print(m, file=sys.stderr, flush=True),
                          break_id=args.break_id)
    res = run_program(args.seed, args.calls, source=small)
    print(small)
    print("\n# " + "\n# ".join(str(m) for m in res.mismatches).replace("\n", "\n# "))
    print(f"# breaks: {res.breaks}")
    if args.out:
        with open(args.out, "w") as f:
            f.write(small)


if __name__ == "__main__":
    main()
