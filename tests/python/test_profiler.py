"""The kernel profiler through the bindings (pairs with tests/cpp/test_profiler.cpp).

Without a GPU it must say so in one line and every call must be a harmless no-op; with one
(torch.cuda.is_available()), a matmul between start and stop must show up as kernel records.
"""

import torch

import _magpy


def _status():
    s = _magpy.profiler_status()
    assert set(s) >= {"available", "status", "backend", "running", "dropped", "error"}
    assert isinstance(s["available"], bool)
    assert isinstance(s["status"], str) and s["status"] and "\n" not in s["status"]
    assert s["backend"] in ("cupti", "null")
    return s


def test_status_is_one_stable_line():
    first = _status()
    again = _status()
    assert first["status"] == again["status"]
    assert first["available"] == again["available"]
    if first["backend"] == "cupti":
        assert first["status"].startswith("CUPTI ")
    else:
        assert "CUPTI not built" in first["status"]
        assert not first["available"]


def test_without_a_gpu_everything_is_a_no_op():
    s = _status()
    if torch.cuda.is_available() and s["available"]:
        import pytest
        pytest.skip("a GPU is present: " + s["status"])
    assert not s["available"]
    if s["backend"] == "cupti":
        assert "no GPU" in s["status"], s["status"]
    for _ in range(3):
        assert _magpy.profiler_start() is False
        assert not _status()["running"]
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
        _magpy.profiler_stop()
        assert _magpy.profiler_flush() == []
    assert _status()["dropped"] == 0


def test_flush_without_start_is_empty_and_stop_is_idempotent():
    _magpy.profiler_stop()
    _magpy.profiler_stop()
    if not _status()["available"]:
        assert _magpy.profiler_flush() == []
    else:
        assert isinstance(_magpy.profiler_flush(), list)


def test_gpu_matmul_records_kernels():
    import pytest
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    s = _status()
    if s["backend"] != "cupti":
        pytest.skip("magpy was built without CUPTI: " + s["status"])
    assert s["available"], s["status"]
    a = torch.randn(512, 512, device="cuda")
    b = torch.randn(512, 512, device="cuda")
    torch.cuda.synchronize()
    _magpy.profiler_flush()  # anything from before
    assert _magpy.profiler_start() is True, _status()["error"]
    try:
        c = a @ b
        c.add_(1.0)
        host = c.sum().cpu()
        torch.cuda.synchronize()
    finally:
        _magpy.profiler_stop()
    records = _magpy.profiler_flush()
    assert float(host) == float(host)  # the work really ran
    kernels = [r for r in records if r["kind"] == "kernel"]
    assert kernels, f"no kernel records in {len(records)} records: {_status()}"
    for r in records:
        assert set(r) == {"name", "kind", "start_ns", "end_ns", "graph_id", "correlation_id",
                          "device", "stream", "bytes"}
        assert r["kind"] in ("kernel", "memcpy", "memset", "runtime")
        assert r["end_ns"] >= r["start_ns"] > 0
        assert r["graph_id"] == 0  # no compiled graph ran
    assert any(r["kind"] == "memcpy" and r["name"] == "memcpy DtoH" for r in records)
    launched = {r["correlation_id"] for r in records if r["kind"] == "runtime"}
    assert any(k["correlation_id"] in launched for k in kernels)
    # Kernel times are on the engine's clock (steady_clock, like time.monotonic_ns on Linux).
    import time
    now = time.monotonic_ns()
    assert all(abs(now - k["end_ns"]) < 60 * 10**9 for k in kernels)
    assert _status()["dropped"] == 0
