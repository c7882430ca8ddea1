"""bench/backends.py runs end to end: a quick run on the MLP writes its table and its JSON.

Not a timing test: it checks that the harness works (eager and magpy-eager rows with positive
times, results equal to eager, the table and the target lines printed), not the figures.
"""

import json
import os
import subprocess
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BENCH = os.path.join(ROOT, "bench", "backends.py")


def test_quick_mlp_run(tmp_path):
    out = tmp_path / "backends.json"
    import _magpy  # the build the tests run against (build/, or build-gpu/ on the device)
    env = dict(os.environ, PYTHONNOUSERSITE="1", PYTHONPATH=os.pathsep.join(
        [os.path.join(ROOT, "core", "python"), os.path.dirname(os.path.abspath(_magpy.__file__))]))
    # systems that build in a second anywhere (torch.compile and magpy-inductor compile C++ for
    # a minute on a CPU): the harness is what this checks
    proc = subprocess.run([sys.executable, BENCH, "--quick", "--filter", "mlp", "--systems",
                           "magpy-eager,magpy-torchscript,magpy-fx,jit.trace", "--json", str(out)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]

    # the printed table: header, one line per system, the geomean block and the target lines
    assert "ms/call" in proc.stdout and "speedup" in proc.stdout, log[-4000:]
    lines = proc.stdout.splitlines()
    assert any(l.startswith("mlp") and " eager " in l for l in lines), log[-4000:]
    assert any(l.startswith("mlp") and " magpy-eager " in l for l in lines), log[-4000:]
    assert "geometric-mean speedup" in proc.stdout
    assert any(l.startswith(("PASS:", "FAIL:", "SKIP:")) for l in lines), log[-4000:]

    report = json.loads(out.read_text())
    for key in ("cpu", "cores", "torch", "python", "date"):
        assert report["machine"].get(key), key
    rows = {r["system"]: r for r in report["rows"]}
    assert {r["model"] for r in report["rows"]} == {"mlp"}
    for name in ("eager", "magpy-eager"):
        assert name in rows, sorted(rows)
        r = rows[name]
        assert r["status"] == "ok", r
        assert r["time_ms"] > 0 and r["first_call_ms"] > 0, r
        assert r["max_abs_diff"] <= 1e-5, r
        assert r["speedup"] > 0, r
    m = rows["magpy-eager"]["magpy"]
    assert m["graphs"] == 1 and m["breaks"] == 0, m
    assert m["cache_hits"] > 0, m
    # every system selected that magpy lists is benchmarked
    for b in report["machine"]["magpy_backends"]:
        if b in ("eager", "torchscript", "torchscript-freeze", "fx"):
            assert f"magpy-{b}" in rows, sorted(rows)
    assert not any("inductor" in name or "torch.compile" in name for name in rows), sorted(rows)
    # every other row either ran or says why not
    for r in report["rows"]:
        assert r["status"] in ("ok", "FAILED", "n/a"), r
        if r["status"] == "n/a":
            assert r["reason"], r


def _bench_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_backends", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_dead_worker_is_run_again_one_system_at_a_time(monkeypatch):
    # on the H200 a worker died of a CUDA error (an illegal memory access) and took every
    # system's rows with it: each system is then run alone beside eager, and only the one that
    # dies again loses its row, with the reason
    bench = _bench_module()
    calls = []

    def fake(spec, batch, desc, names, opts, only=None, env=None):
        calls.append((only, env))
        if only in (None, "magpy-b"):
            return None, "worker exited with 1: torch.AcceleratorError: CUDA error"
        return [{"model": spec.name, "batch": batch, "input": desc, "system": n,
                 "status": "ok", "time_ms": 2.0 if n == "eager" else 1.0} for n in names], None
    monkeypatch.setattr(bench, "run_one_worker", fake)
    spec = bench.MODELS["mlp"]
    opts = types.SimpleNamespace(device="cuda")
    rows = bench.run_worker(spec, 1, "x", ["eager", "magpy-a", "magpy-b", "magpy-c"], opts)
    # the one that died alone runs once more with each launch waited for, for its traceback
    assert calls == [(None, None), ("magpy-a", None), ("magpy-b", None),
                     ("magpy-b", {"CUDA_LAUNCH_BLOCKING": "1"}), ("magpy-c", None)]
    by = {r["system"]: r for r in rows}
    assert [r["system"] for r in rows] == ["eager", "magpy-a", "magpy-b", "magpy-c"]
    assert by["eager"]["status"] == by["magpy-a"]["status"] == by["magpy-c"]["status"] == "ok"
    assert by["magpy-a"]["run_alone"] and by["eager"]["run_alone"]
    assert by["magpy-b"]["status"] == "n/a" and "run alone" in by["magpy-b"]["reason"] \
        and "AcceleratorError" in by["magpy-b"]["reason"] \
        and "CUDA_LAUNCH_BLOCKING=1: worker exited" in by["magpy-b"]["reason"]


def test_systems_equals_name_selects_that_system_alone():
    import _magpy
    env = dict(os.environ, PYTHONNOUSERSITE="1", PYTHONPATH=os.pathsep.join(
        [os.path.join(ROOT, "core", "python"), os.path.dirname(os.path.abspath(_magpy.__file__))]))
    got = {}
    for arg in ("=magpy-torchscript", "magpy-torchscript"):
        proc = subprocess.run([sys.executable, BENCH, "--systems", arg, "--list"],
                              capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got[arg] = next(l for l in proc.stdout.splitlines() if l.startswith("systems:"))
    assert got["=magpy-torchscript"] == "systems: eager, magpy-torchscript"
    assert "magpy-torchscript-freeze" in got["magpy-torchscript"]
