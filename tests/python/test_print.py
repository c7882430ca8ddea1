"""print() replayed as a step of the plan ([Note: print]): when every argument prints the same
text from its replayed value (numbers, strings, shapes, numbers read from tensor data, tensors
without grad), the print runs at replay in order with the other effects, and the function
stays one graph. Every test runs the same calls eagerly and compiled and compares the output
text, the results and the side effects."""

import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import magpy
from conftest import assert_stats, break_ids


def run_both(capsys, fn, calls, **compile_kwargs):
    """Runs `calls` (argument tuples) through fn and through magpy.compile(fn); returns the
    compiled function after checking that both printed the same text and returned equal
    results."""
    eager_results = [fn(*args) for args in calls]
    eager_out = capsys.readouterr().out
    cf = magpy.compile(fn, **compile_kwargs)
    results = [cf(*args) for args in calls]
    out = capsys.readouterr().out
    assert out == eager_out
    for got, want in zip(results, eager_results):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    return cf


def test_debug_prints_of_shapes_and_item_values_stay_in_one_graph(capsys):
    def f(x, y):
        feats = torch.relu(x @ x.t())
        print(f"[debug] features: {tuple(feats.shape)}")
        loss = F.mse_loss(feats.sum(1), y)
        print(f"[debug] loss={loss.item():.4f}", "step", 3)
        return loss

    calls = [(torch.randn(4, 3), torch.randn(4)) for _ in range(4)]
    cf = run_both(capsys, f, calls)
    assert_stats(cf, graphs=1, breaks=0, hits=3, misses=1)


def test_print_of_tensors_shapes_dtypes_and_containers(capsys):
    def f(x):
        print(x.shape, x.dtype, x.device)
        print(x[:2] * 2)
        print([x.shape[0], "rows"], (1.5, None, True), sep=" / ", end=" <\n")
        print()
        return x + 1

    calls = [(torch.arange(6.0).view(3, 2) + i,) for i in range(3)]
    cf = run_both(capsys, f, calls)
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_prints_interleave_with_other_effects_in_eager_order(capsys):
    log = []

    def f(x):
        log.append("start")
        y = x * 2
        print("y", y.sum().item())
        log.append(y.sum().item())
        print("done")
        return y

    calls = [(torch.tensor([1.0, 2.0]),), (torch.tensor([3.0, 4.0]),), (torch.tensor([5.0, 6.0]),)]
    for args in calls:
        f(*args)
    eager_log, eager_out = list(log), capsys.readouterr().out
    log.clear()
    cf = magpy.compile(f)
    for args in calls:
        cf(*args)
    assert log == eager_log
    assert capsys.readouterr().out == eager_out
    assert_stats(cf, graphs=1, breaks=0)


def test_print_in_a_loop_and_in_a_callee(capsys):
    def show(name, t):
        print(name, t.shape[-1])

    def f(x, n):
        for i in range(n):
            x = x * 2
            print("step", i)
        show("out", x)
        return x

    calls = [(torch.randn(2, 3), 3), (torch.randn(2, 3), 3)]
    cf = run_both(capsys, f, calls)
    assert_stats(cf, graphs=1, breaks=0, hits=1, misses=1)


def test_sizes_printed_stay_dynamic(capsys):
    def f(x):
        print("batch", x.shape[0], x.shape)
        return x.sum(0)

    calls = [(torch.randn(n, 2),) for n in (2, 3, 4, 5, 6)]
    cf = run_both(capsys, f, calls)
    # one recompile for the new size, then the printed size is read at replay
    assert_stats(cf, graphs=2, breaks=0, hits=3, misses=2)


def test_print_before_an_error_at_replay_prints_then_raises(capsys):
    def f(x, idx):
        print("selecting", idx.numel())
        return x.index_select(0, idx)

    x = torch.randn(3)
    cf = magpy.compile(f)
    cf(x, torch.tensor([1]))
    capsys.readouterr()
    with pytest.raises(IndexError) as eager:
        f(x, torch.tensor([7]))
    eager_out = capsys.readouterr().out
    with pytest.raises(IndexError) as compiled:
        cf(x, torch.tensor([7]))
    assert capsys.readouterr().out == eager_out == "selecting 1\n"
    assert str(compiled.value) == str(eager.value)


def test_print_of_a_tensor_that_requires_grad_breaks(capsys):
    def f(x):
        y = x * 2
        print(y)  # its text names grad_fn, which a compiled graph would change
        return y.sum()

    calls = [(torch.randn(3, requires_grad=True),) for _ in range(3)]
    cf = run_both(capsys, f, calls)
    assert break_ids(cf) == ["MB005"]
    assert "requires grad" in magpy.explain(cf).breaks[0].reason


def test_print_to_a_file_object_breaks(capsys):
    def f(x):
        print("to stderr", file=sys.stderr)
        return x + 1

    cf = run_both(capsys, f, [(torch.randn(2),)] * 3)
    assert break_ids(cf) == ["MB005"]
    assert "file" in magpy.explain(cf).breaks[0].reason


def test_print_of_a_module_breaks(capsys):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            print(self.fc)  # Module.__repr__ is Python code: it runs in Python
            return self.fc(x)

    net = Net()
    cf = run_both(capsys, net, [(torch.randn(1, 2),)] * 3)
    assert break_ids(cf) == ["MB005"]


def test_the_replay_plan_shows_the_print(capsys):
    def f(x):
        print("rows", x.shape[0])
        return x * 2

    cf = run_both(capsys, f, [(torch.randn(2),)] * 2)
    assert "__builtins__['print']('rows', 2)" in magpy.explain(cf).report["cache_entries"][0]["replay_python"]


def test_percent_formatting_of_sizes_and_numbers_read_from_data_is_made_at_replay(capsys):
    """"n=%d" % n with n a symbolic size or a number read from a tensor used to break (MB004);
    the text is now made at replay, as an f-string's is."""
    log = []

    def f(x, n):
        log.append("rows=%d of %s" % (x.size(0), n))
        print("positive: %d, total %d" % (int((x > 0).sum()), x.size(0) * n))
        return x * n

    calls = [(torch.randn(i), i) for i in (2, 3, 4, 5, 6)]
    cf = run_both(capsys, f, calls)
    assert log[:5] == log[5:] == ["rows=%d of %d" % (i, i) for i in (2, 3, 4, 5, 6)]
    # one recompile for the new size, then the sizes are symbolic and formatted at replay
    assert_stats(cf, graphs=2, breaks=0, hits=3, misses=2)
    assert any("'rows=%d of %s' %" in g["replay_python"]
               for g in magpy.explain(cf).report["graphs"])


def test_a_break_names_a_builtin_as_the_user_wrote_it(capsys):
    # a review probe: the reason said `print()` of __builtins__['open'] (the guards' path)
    def f(x):
        y = x * 2
        print(y.tolist(), open)
        return y

    magpy.reset()
    cf = magpy.compile(f)
    for _ in range(2):
        cf(torch.ones(2))
    reasons = [b.reason for b in magpy.explain(cf).breaks]
    assert reasons and "of open," in reasons[0] and "__builtins__" not in reasons[0], reasons
