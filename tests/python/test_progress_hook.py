"""The engine's progress hook (what the kernel's live view shows while a cell runs)."""

import sys

import pytest
import torch

import _magpy
import magpy


@pytest.fixture
def events():
    seen = []
    _magpy._set_progress_hook(lambda event, info: seen.append((event, dict(info))))
    yield seen
    _magpy._set_progress_hook(None)


def test_capture_and_compile_are_reported_once_and_hits_are_silent(events):
    def f(x):
        return (x * 2).relu() + 1

    cf = magpy.compile(f)
    x = torch.randn(3)
    assert torch.equal(cf(x), f(x))
    assert [e for e, _ in events] == ["capture", "captured", "compile", "compiled"]
    captured = events[1][1]
    assert captured["ok"] == 1 and captured["ops"] == 3 and captured["breaks"] == 0
    assert captured["capture_ns"] > 0 and events[3][1]["compile_ns"] >= 0
    assert all(info["function"].endswith(".f") for _, info in events)  # its qualname
    events.clear()
    cf(x)
    assert events == []


def test_a_break_is_reported(events):
    def f(x):
        y = x + 1
        print("between", file=sys.stdout)  # I/O to a file object: a break
        return y * 2

    cf = magpy.compile(f)
    cf(torch.randn(2))
    captured = [info for e, info in events if e == "captured"]
    assert captured and captured[0]["breaks"] == 1


def test_a_hook_that_raises_does_not_disturb_the_call():
    def bad(event, info):
        raise RuntimeError("hook failed")

    _magpy._set_progress_hook(bad)
    try:
        cf = magpy.compile(lambda x: x + 1)
        assert torch.equal(cf(torch.ones(2)), torch.full((2,), 2.0))
    finally:
        _magpy._set_progress_hook(None)
    with pytest.raises(TypeError, match="callable or None"):
        _magpy._set_progress_hook(3)
