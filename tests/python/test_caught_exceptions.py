"""Exceptions raised and caught in the frame we trace ([Note: exceptions caught in the frame]):
followed when the guards decide that the instruction raises (unpacking a sequence of known
length, `view` on tensors of guarded sizes and strides), so the except clause becomes part of
the graph; anything else still runs eagerly (MB006). Every call is compared against eager."""

import sys

import pytest
import torch

import magpy
from conftest import assert_stats, break_ids, check


def unbatched_ok(x):
    try:
        b, c, n = x.shape
        unbatched = False
    except ValueError:
        x = x.unsqueeze(0)
        b, c, n = x.shape
        unbatched = True
    y = x.sum(-1).view(b, c) * n
    return y.squeeze(0) if unbatched else y


def test_unpacking_that_raises_is_followed_into_the_handler():
    calls = [torch.randn(3, 4), torch.randn(3, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 4)]
    cf = check(unbatched_ok, calls)
    assert_stats(cf, graphs=2, breaks=0, entries=2)  # one per rank (guarded)


def view_or_reshape(x):
    try:
        flat = x.view(x.size(0), -1)
    except RuntimeError:
        flat = x.reshape(x.size(0), -1)
    return flat * 2


def test_view_that_raises_falls_back_like_eager():
    t = torch.randn(4, 3, 5)
    calls = [t.transpose(1, 2), t.transpose(1, 2) + 0, t.transpose(1, 2), t.contiguous()]
    cf = check(view_or_reshape, calls)
    assert_stats(cf, breaks=0)
    # strides decide it: the non-contiguous and the contiguous input have entries of their own
    assert magpy.explain(cf).cache_entries >= 2


def test_sizes_that_change_still_decide_the_view():
    calls = [torch.randn(n, 3, 5).transpose(1, 2) for n in (2, 3, 4, 5)]
    calls += [torch.randn(n, 1, 5).transpose(1, 2) for n in (2, 3)]  # a size-1 dim: view works
    check(view_or_reshape, calls)


def test_exception_bound_with_as_and_read():
    def f(x, dims):
        try:
            a, b = dims
        except ValueError as e:
            msg = str(e)
            a, b = len(msg) % 3 + 1, 2
        return x * a + b

    check(f, [(torch.randn(2), (1, 2)), (torch.randn(2), (1, 2, 3)), (torch.randn(2), (1, 2, 3))])


def test_handler_that_does_not_match_lets_the_error_through():
    def f(x):
        try:
            a, b = x.shape
        except KeyError:
            return x
        return x * a

    cf = magpy.compile(f)
    for _ in range(2):
        with pytest.raises(ValueError, match="not enough values to unpack"):
            cf(torch.randn(3))
    assert cf(torch.randn(2, 3)).shape == (2, 3)


def test_a_break_inside_the_except_clause_runs_eagerly():
    def f(x):
        try:
            a, b = x.shape
        except ValueError:
            print("unbatched", file=sys.stderr)  # I/O to a file object: a break
            a, b = 1, x.shape[0]
        return x.reshape(a, b) + 1

    cf = check(f, [torch.randn(3) for _ in range(3)])
    assert "MB005" in break_ids(cf)


def test_exceptions_the_guards_do_not_decide_still_run_eagerly():
    def f(x, idx):
        try:
            return x.index_select(0, idx)
        except IndexError:
            return x + 1

    cf = check(f, [(torch.randn(3), torch.tensor([5])), (torch.randn(3), torch.tensor([1])),
                   (torch.randn(3), torch.tensor([5]))])
    assert "MB006" in break_ids(cf)


def test_exception_raised_in_a_callee_and_caught_by_the_caller_runs_eagerly():
    def inner(x):
        a, b = x.shape
        return x * a

    def f(x):
        try:
            return inner(x)
        except ValueError:
            return x - 1

    cf = check(f, [torch.randn(3) for _ in range(3)])
    assert "MB006" in break_ids(cf)


LOG = [1.0, 2.0]
CACHE = {"hit": 3.0}


def test_index_and_key_errors_on_guarded_containers_are_followed():
    LOG[:] = [1.0, 2.0]
    CACHE.clear()
    CACHE["hit"] = 3.0

    def f(x):
        try:
            a = LOG[2]
        except IndexError:
            a = -1.0
        try:
            b = CACHE["miss"]
        except KeyError:
            b = CACHE["hit"]
        return x * a + b

    def grow(i):
        if i == 2:
            LOG.append(5.0)   # now LOG[2] exists: the guard on the length notices
        if i == 3:
            CACHE["miss"] = 7.0

    cf = check(f, [torch.randn(2) for _ in range(4)], mutate=grow)
    assert_stats(cf, breaks=0)
    assert magpy.explain(cf).cache_entries >= 2


def test_an_optional_import_that_fails_is_a_fact_of_the_process():
    def f(x):
        try:
            import magpy_no_such_module  # noqa: F401
            fused = True
        except ImportError:
            fused = False
        try:
            from math import no_such_name  # noqa: F401  (a module with no __getattr__)
        except ImportError as e:
            fused = fused or "no_such_name" in str(e) and False
        return x * 2 if not fused else x

    cf = check(f, [torch.randn(2) for _ in range(3)])
    assert_stats(cf, graphs=1, breaks=0, hits=2)


def test_an_optional_import_is_imported_once_it_can_be():
    import sys
    import types

    def f(x):
        try:
            import magpy_test_late_module
            return x * magpy_test_late_module.SCALE
        except ImportError:
            return x

    def mutate(i):
        if i == 2:
            mod = types.ModuleType("magpy_test_late_module")
            mod.SCALE = 3
            sys.modules["magpy_test_late_module"] = mod

    try:
        cf = check(f, [torch.randn(2) for _ in range(4)], mutate=mutate)
        assert_stats(cf, graphs=2, breaks=0, hits=2, misses=2)
    finally:
        sys.modules.pop("magpy_test_late_module", None)


def test_a_module_that_raises_import_error_from_its_body_breaks(tmp_path, monkeypatch):
    (tmp_path / "magpy_test_flaky.py").write_text(
        "import magpy_test_flaky_log\n"
        "magpy_test_flaky_log.runs.append(1)\n"
        "raise ImportError('not ready')\n")
    (tmp_path / "magpy_test_flaky_log.py").write_text("runs = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import magpy_test_flaky_log

    def f(x):
        try:
            import magpy_test_flaky  # noqa: F401
        except ImportError:
            return x - 1
        return x

    cf = magpy.compile(f)
    for _ in range(3):
        cf(torch.ones(1))
    assert len(magpy_test_flaky_log.runs) == 3  # its body runs at every call, as in eager
    assert magpy.explain(cf).break_count >= 1


def test_a_lazy_module_whose_getattr_raises_import_error_breaks():
    import sys
    import types

    lazy = types.ModuleType("magpy_test_lazymod")
    calls = []

    def getattr_(name):
        if name.startswith("__"):
            raise AttributeError(name)
        calls.append(name)
        raise ImportError(f"{name}: optional backend missing ({len(calls)})")

    lazy.__getattr__ = getattr_
    sys.modules["magpy_test_lazymod"] = lazy

    def f(x):
        try:
            from magpy_test_lazymod import thing  # noqa: F401
        except ImportError as e:
            return x + 1, str(e)
        return x + 2, ""

    try:
        cf = magpy.compile(f)
        for _ in range(3):
            n = len(calls)
            out = cf(torch.ones(1))
            assert out[1] == f"thing: optional backend missing ({n + 1})"  # raised anew
        assert magpy.explain(cf).break_count >= 1
    finally:
        sys.modules.pop("magpy_test_lazymod", None)


def test_a_missing_submodule_guards_its_package(tmp_path, monkeypatch):
    import builtins
    import sys

    pkg = tmp_path / "magpy_test_pkgb"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import builtins\nbuiltins.MAGPY_PKGB_RUNS += 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    builtins.MAGPY_PKGB_RUNS = 0

    def f(x):
        try:
            import magpy_test_pkgb.nosub  # noqa: F401
        except ImportError:
            return x + 1
        return x + 2

    try:
        cf = magpy.compile(f)
        for i in range(3):
            sys.modules.pop("magpy_test_pkgb", None)  # the package's body runs again
            assert torch.equal(cf(torch.ones(1)), torch.full((1,), 2.0))
            assert builtins.MAGPY_PKGB_RUNS == i + 1
    finally:
        sys.modules.pop("magpy_test_pkgb", None)
        del builtins.MAGPY_PKGB_RUNS


def test_each_call_catches_an_exception_of_its_own():
    # a review probe: a replay handed the handler the capture's exception object, so the
    # errors collected over calls were one object, and changing it changed later calls'
    def f(x, d, errors):
        try:
            v = d["scale"]
        except KeyError as e:
            errors.append(e)
            v = 1.0
        try:
            import magpy_no_such_module  # noqa: F401
        except ImportError as e:
            errors.append(e)
        return x * v

    def run(fn):
        errors = []
        for i in range(4):
            fn(torch.ones(2), {}, errors)
        errors[0].args = ("changed",)
        later = []
        fn(torch.ones(2), {}, later)
        return (len(set(map(id, errors))), [(type(e), e.args) for e in later],
                [(e.name, e.path) for e in later if isinstance(e, ImportError)])

    cf = magpy.compile(f)
    assert run(f) == run(cf)
    assert magpy.explain(cf).cache_hits >= 3
