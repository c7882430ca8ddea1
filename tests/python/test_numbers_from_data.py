"""Python numbers read from tensor data (`t.item()`, `int(t)`, `float(t)`) inside a capture:
the read is a replay step, arithmetic, formatting and writes of the number are replayed, and
only code that needs the number itself (a branch, range(), a shape) breaks. Every test
compares against eager on every call, external state included."""

import copy
import os

import pytest
import torch
import torch.nn.functional as F

import magpy
from conftest import assert_stats, break_ids, check


class Meter:
    """The ImageNet example's AverageMeter."""

    def __init__(self):
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def state(self):
        return (self.val, self.avg, self.sum, self.count)


def test_item_into_meters_is_one_graph_and_updates_like_eager():
    meters = {"loss": Meter(), "acc": Meter()}

    def f(x, y):
        loss = F.mse_loss(x, y)
        acc = (x.argmax(-1) == y.argmax(-1)).float().mean()
        meters["loss"].update(loss.item(), x.size(0))
        meters["acc"].update(acc.item() * 100.0, x.size(0))
        return loss

    def snapshot():
        return {k: m.state() for k, m in meters.items()}

    def restore(s):
        for k, st in s.items():
            meters[k].val, meters[k].avg, meters[k].sum, meters[k].count = st

    xs = [(torch.randn(4, 3), torch.randn(4, 3)) for _ in range(8)]
    cf = check(f, xs, snapshot=snapshot, restore=restore)
    # the meters' running sums and counts change every call: after they changed once they are
    # read at replay (automatic dynamic numbers), so the cache settles
    e = magpy.explain(cf)
    assert e.break_count == 0 and e.cache_misses <= 3 and e.cache_hits + e.cache_misses == 8, e
    assert "now dynamic: closure['meters']['loss'].sum" in e.recompile_reasons[0]
    assert any("type(closure['meters']['acc'].sum) is float" in g for g in e.guards)


def test_numbers_from_data_in_arithmetic_rounding_and_return():
    def f(x):
        total = x.sum().item()
        n = int(x.numel() * x.abs().max())
        m = float(x.mean())
        return x * total, round(total, 3), n, abs(m) + 1.5, max(total, m), x[0] * m

    cf = check(f, [torch.randn(5) for _ in range(6)])
    assert_stats(cf, graphs=1, breaks=0, hits=5, misses=1)


def test_formatting_a_number_from_data_is_replayed():
    log = []

    def f(x):
        loss = (x ** 2).mean()
        log.append(f"loss={loss.item():.4f} n={x.numel()} {loss.item()!r:>12}")
        return loss

    def snapshot():
        return list(log)

    def restore(s):
        log[:] = s

    cf = check(f, [torch.randn(3) for _ in range(4)], snapshot=snapshot, restore=restore)
    assert_stats(cf, graphs=1, breaks=0, hits=3, misses=1)


def test_stats_dict_written_by_key_and_read_back():
    stats = {"n": 2, "loss_sum": 1.0}

    def f(x):
        loss = x.abs().mean()
        n = (x > 0).sum().item()
        stats["n"] = stats.get("n", 0) + n
        stats["loss_sum"] = stats["loss_sum"] + float(loss) * n
        stats.setdefault("history", []).append(round(loss.item(), 6))
        stats["mean"] = stats["loss_sum"] / max(stats["n"], 1)
        return loss, stats.get("mean"), "history" in stats

    def snapshot():
        return copy.deepcopy(stats)

    def restore(s):
        stats.clear()
        stats.update(s)

    cf = check(f, [torch.randn(6) for _ in range(5)], snapshot=snapshot, restore=restore)
    # the first call makes "history" (absent: guarded), later calls find it
    assert_stats(cf, graphs=2, breaks=0, hits=3, misses=2)


def test_whole_dict_read_after_a_keyed_write_still_breaks():
    def f(x, d):
        d["a"] = x.sum().item()
        return x * len(d)

    cf = check(f, [(torch.randn(2), {"b": 1}), (torch.randn(2), {"b": 2, "c": 3})])
    assert break_ids(cf)[0] == "MB008"


def test_ring_buffer_pointer_read_with_int_is_one_graph():
    # MoCo's queue: ptr = int(self.queue_ptr); queue[:, ptr:ptr + n] = keys.T
    class Queue(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("queue", torch.zeros(3, 8))
            self.register_buffer("ptr", torch.zeros(1, dtype=torch.long))

        def forward(self, keys):
            n = keys.shape[0]
            ptr = int(self.ptr)
            self.queue[:, ptr:ptr + n] = keys.T
            self.ptr[0] = (ptr + n) % self.queue.shape[1]
            return self.queue.clone(), ptr

    q = Queue()

    def snapshot():
        return (q.queue.clone(), q.ptr.clone())

    def restore(s):
        q.queue.copy_(s[0])
        q.ptr.copy_(s[1])

    cf = check(q, [torch.randn(2, 3) for _ in range(7)], snapshot=snapshot, restore=restore)
    assert_stats(cf, graphs=1, breaks=0, hits=6, misses=1)


def test_branch_on_a_number_from_data_still_breaks_and_takes_both_ways():
    def f(x):
        s = x.sum().item()
        if s > 0:
            return x * s
        return x - s

    xs = [torch.randn(4) + (1 if i % 2 else -1) for i in range(8)]
    cf = check(f, xs)
    assert break_ids(cf) == ["MB001"]


@pytest.mark.parametrize("use", ["range", "list_index", "shape_branch"])
def test_code_that_needs_the_number_itself_breaks(use):
    def f(x):
        k = int(x.abs().sum().item()) % 3
        if use == "range":
            out = x
            for _ in range(k):
                out = out * 2
            return out
        if use == "list_index":
            return [x, x * 2, x * 3][k]
        # a shape made from the number, then a branch on that shape
        return x * 2 if torch.zeros(k + 1).shape[0] > 1 else x

    xs = [torch.tensor([0.5, 0.2]), torch.tensor([1.5, 0.2]), torch.tensor([2.5, 0.1])] * 2
    cf = check(f, xs)
    assert magpy.explain(cf).break_count >= 1


def test_shape_decided_by_a_number_from_data_is_not_baked_in():
    def f(x):
        s = (x.abs().sum() * 4).item()
        y = F.interpolate(x[None, None], scale_factor=1.0 + (s % 1.0), mode="nearest")
        return y, y.shape[-1]

    xs = [torch.rand(4) for _ in range(6)]
    cf = check(f, xs)
    # y's size is read at replay too: one graph, whatever size the data makes
    assert_stats(cf, graphs=1, breaks=0, hits=5, misses=1)


def test_number_from_data_crosses_a_break_as_a_float():
    def f(x):
        s = x.sum().item()
        os.getpid()  # no capture rule: the break
        return x * s

    cf = check(f, [torch.randn(3) for _ in range(6)])
    assert break_ids(cf) == ["MB003"]


def test_fullgraph_accepts_item_in_arithmetic():
    def f(x):
        return x * x.sum().item() + float(x.max())

    cf = magpy.compile(f, fullgraph=True)
    for _ in range(3):
        x = torch.randn(4)
        assert torch.equal(cf(x), f(x))


def test_numbers_of_tolist_slice_and_loop_like_int_of_an_item():
    # NLP code: per-sample lengths as Python ints (found by a probe: `lengths.tolist()[i]` as a
    # slice bound broke, where `int(lengths[i])` did not)
    def per_sample_means(h, lengths):
        out = []
        for i, n in enumerate(lengths.tolist()):
            out.append(h[i, :n].mean(0))
        return torch.stack(out), sum(lengths.tolist())

    calls = [(torch.randn(3, 5, 4), torch.tensor([5, 2, 3])),
             (torch.randn(3, 5, 4), torch.tensor([1, 4, 3])),
             (torch.randn(3, 5, 4), torch.tensor([2, 2, 5]))]
    cf = check(per_sample_means, calls)
    assert_stats(cf, graphs=1, breaks=0, hits=2)


def test_tolist_of_a_tensor_whose_length_changes():
    # with the batch dynamic, tolist() fixes the length again, as iterating the tensor does:
    # one capture per batch size, never a break
    def longest(h, lengths):
        return h[:, :max(lengths.tolist())].sum(1)

    calls = [(torch.randn(b, 6, 4), torch.randint(1, 6, (b,))) for b in (2, 3, 4, 3)]
    cf = check(longest, calls)
    assert_stats(cf, breaks=0, hits=1)
