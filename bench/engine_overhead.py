"""Engine overhead benchmark: eager call time, magpy cache-hit time, first-call (capture) time.

Targets (issue 2): a cache hit within 1.1x of eager for the tiny function; capture within 5x of
eager. Everything is measured side by side in one run; medians over interleaved repeats.

    /usr/bin/python3 bench/engine_overhead.py [--json results.json] [--quick]
"""

import argparse
import json
import statistics
import time

import torch
from torch import nn

import magpy


def tiny(x, y):
    a = x + y
    b = a * x
    c = torch.sin(b)
    return c - y


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 128)
        self.fc3 = nn.Linear(128, 10)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        x = self.pool(x).flatten(1)
        return self.fc(x)


def per_call(fn, args, n):
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn(*args)
    return (time.perf_counter_ns() - t0) / n


def capture_time(make, args, reps):
    """First call of a freshly compiled callable (capture + compile), against one eager call."""
    times = []
    for _ in range(reps):
        magpy.reset()
        cf = magpy.compile(make())
        t0 = time.perf_counter_ns()
        cf(*args)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times)


def bench(name, fn, args, n, reps):
    cf = magpy.compile(fn)
    cf(*args)  # capture
    ex = magpy.explain(cf)
    assert ex.graph_count == 1, f"{name}: expected one graph, got {ex}"
    eager, hit = [], []
    for _ in range(reps):  # interleaved, so drift affects both equally
        eager.append(per_call(fn, args, n))
        hit.append(per_call(cf, args, n))
    e, h = statistics.median(eager), statistics.median(hit)
    first_eager = statistics.median(per_call(fn, args, 1) for _ in range(reps))
    cap = capture_time(lambda: fn, args, reps)
    return {"name": name, "eager_us": e / 1e3, "hit_us": h / 1e3, "hit_ratio": h / e,
            "capture_us": cap / 1e3, "capture_ratio": cap / first_eager,
            "ops": ex.op_count, "guards": len(ex.guards)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    scale = 0.2 if a.quick else 1.0
    cases = [
        ("tiny (4 ops, 1-element)", tiny, (torch.randn(1), torch.randn(1)), 20000),
        ("MLP 64-128-128-10, batch 8", MLP().eval(), (torch.randn(8, 64),), 5000),
        ("CNN 2 conv + bn, 3x32x32, batch 2", CNN().eval(), (torch.randn(2, 3, 32, 32),), 500),
    ]
    rows = []
    with torch.no_grad():
        for name, fn, args, n in cases:
            rows.append(bench(name, fn, args, max(50, int(n * scale)), 7))
    print(f"{'function':36} {'eager us':>9} {'hit us':>9} {'hit/eager':>9} "
          f"{'capture us':>11} {'capture/eager':>13} {'ops':>4} {'guards':>6}")
    for r in rows:
        print(f"{r['name']:36} {r['eager_us']:9.2f} {r['hit_us']:9.2f} {r['hit_ratio']:9.3f} "
              f"{r['capture_us']:11.1f} {r['capture_ratio']:13.2f} {r['ops']:4d} {r['guards']:6d}")
    print("targets: tiny hit/eager <= 1.10; capture/eager <= 5")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
