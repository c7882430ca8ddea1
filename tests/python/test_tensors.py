"""Tensor programs: torch functions, Tensor methods and operators recorded and replayed."""

import pytest
import torch
import torch.nn.functional as F

import magpy
from conftest import assert_isolated_ok, assert_stats, break_ids, check

BINARY = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "truediv": lambda x, y: x / (y.abs() + 1),
    "pow": lambda x, y: x.abs() ** y,
    "matmul": lambda x, y: x @ y.transpose(-1, -2),
    "maximum": lambda x, y: torch.maximum(x, y),
    "where": lambda x, y: torch.where(x > y, x, y),
    "compare": lambda x, y: (x >= y, x == y, x != y, x < y),
    "cat_stack": lambda x, y: (torch.cat([x, y], dim=0), torch.stack((x, y), dim=-1)),
    "method_chain": lambda x, y: x.mul(2).add(y, alpha=3).sum(dim=-1, keepdim=True),
    "rsub_rdiv": lambda x, y: 1 - x + 2 / (y.abs() + 1) - (-x),
}

UNARY = {
    "relu": lambda x: torch.relu(x),
    "sigmoid_tanh": lambda x: torch.sigmoid(x) * torch.tanh(x),
    "exp_log": lambda x: torch.log1p(x.exp()),
    "softmax": lambda x: F.softmax(x, dim=-1),
    "reductions": lambda x: (x.sum(), x.mean(0), x.amax(dim=-1), x.std()),
    "reshape": lambda x: x.reshape(-1).view(x.shape[1], x.shape[0]).permute(1, 0).contiguous(),
    "T": lambda x: x.T * 2,
    "slicing": lambda x: (x[0], x[:, 1:], x[..., -1], x[::2, None]),
    "clamp_abs_neg": lambda x: (-x).clamp(min=-0.5, max=0.5).abs(),
    "cumsum_flip": lambda x: torch.cumsum(x, dim=1).flip(0),
    "chunk": lambda x: x.chunk(2, dim=1),
    "factories": lambda x: (torch.zeros_like(x), x.new_ones(x.shape[0]),
                            torch.arange(x.shape[1]) * 2),
}

SHAPES = [(2, 4), (3, 6)]
DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_ops(name, dtype):
    fn = BINARY[name]
    (s1, s2) = SHAPES
    a, b = torch.randn(s1, dtype=dtype), torch.randn(s1, dtype=dtype)
    c, d = torch.randn(s2, dtype=dtype), torch.randn(s2, dtype=dtype)
    cf = check(fn, [(a, b), (b, a), (c, d), (d, c), (a, b)])
    assert_stats(cf, graphs=2, breaks=0, hits=3, misses=2, entries=2)


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("shape", SHAPES)
def test_unary_ops(name, shape):
    fn = UNARY[name]
    x = torch.randn(shape)
    cf = check(fn, [x, x * 3, -x])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1, entries=1)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_integer_and_bool_tensors(dtype):
    def f(x, y):
        return x & y, x | y, x ^ y, ~x if dtype == torch.bool else x * 2 - y

    x = torch.randint(0, 2, (5,)).to(dtype)
    y = torch.randint(0, 2, (5,)).to(dtype)
    cf = check(f, [(x, y), (y, x), (x, x)])
    assert_stats(cf, graphs=1, hits=2, misses=1)


def test_integer_division_and_remainder():
    def f(x, y):
        return x // y, x % y, torch.div(x, y, rounding_mode="floor")

    x = torch.tensor([7, -7, 9, 4])
    y = torch.tensor([2, 3, -4, 5])
    cf = check(f, [(x, y), (x * 3, y), (x, y + 10)])
    assert_stats(cf, graphs=1, hits=2, misses=1)


def test_values_change_without_recompiling():
    def f(x, w):
        return torch.tanh(x @ w) + x.mean()

    w = torch.randn(3, 3)
    calls = [(torch.randn(4, 3), w) for _ in range(6)]
    cf = check(f, calls)
    assert_stats(cf, graphs=1, hits=5, misses=1)


def test_unpacking_a_tensor_and_iterating_rows():
    def f(x):
        a, b, c = x
        total = torch.zeros_like(a)
        for row in x:
            total = total + row * 2
        return a - b + c, total

    cf = check(f, [torch.randn(3, 2), torch.randn(3, 2), torch.randn(3, 5)])
    assert_stats(cf, graphs=2, hits=1, misses=2)


def test_split_results_unpacked():
    def f(x):
        q, k, v = x.split(4, dim=-1)
        att = F.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
        return att @ v

    cf = check(f, [torch.randn(2, 5, 12), torch.randn(2, 5, 12), torch.randn(2, 7, 12)])
    assert_stats(cf, graphs=2, hits=1, misses=2)


def test_boolean_mask_passed_in_indexing():
    def f(x, m):
        return x[m] * 2, torch.where(m, x, torch.zeros_like(x))

    x1 = torch.tensor([1.0, -2.0, 3.0, -4.0])
    x2 = torch.tensor([-1.0, -2.0, -3.0, 4.0])
    cf = check(f, [(x1, x1 > 0), (x2, x2 > 0), (x1, x1 > 0)])
    assert_stats(cf, graphs=1, hits=2, misses=1)


def test_boolean_mask_computed_in_function_indexing():
    # Run in a child process: the engine crashes the interpreter.
    assert_isolated_ok("""
        def f(x):
            return x[x > 0] * 2
        cf = magpy.compile(f)
        for x in (torch.tensor([1.0, -2.0, 3.0, -4.0]), torch.tensor([-1.0, -2.0, -3.0, 4.0])):
            assert same(cf(x), f(x))
        print("OK")
    """)


def test_tensor_index_gather():
    def f(x, idx):
        return x[idx], x.index_select(0, idx), torch.gather(x, 0, idx.unsqueeze(1).expand(-1, 3))

    x = torch.randn(5, 3)
    cf = check(f, [(x, torch.tensor([0, 4])), (x, torch.tensor([3, 3])), (x * 2, torch.tensor([1, 2]))])
    assert_stats(cf, graphs=1, hits=2, misses=1)


def test_advanced_indexing_with_tuples_and_lists_is_one_graph():
    # the indexing of nanoGPT's top-k filter, Mixtral's expert dispatch and RPN decoding
    def f(logits, v, rows, cols):
        last = logits[:, [-1]]
        picked = logits[None, rows].reshape(-1, logits.shape[1])
        pairs = logits[rows, cols, None]
        both = logits[[0, 2]][:, [True, False, True]]
        masked = logits.clone()
        masked[masked < v[:, [-1]]] = -float("inf")
        return last, picked, pairs, both, masked

    def args(n):
        return (torch.randn(4, 3), torch.randn(4, 2), torch.randint(0, 4, (n,)),
                torch.randint(0, 3, (n,)))

    cf = check(f, [args(2), args(2), args(2)])
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_mask_inside_an_index_tuple_makes_a_data_dependent_shape():
    def f(x, m):
        y = x[:, m]
        return y * 2, y.shape[1]

    x = torch.randn(3, 4)
    m1, m2 = torch.tensor([True, False, True, True]), torch.tensor([False, False, True, False])
    cf = check(f, [(x, m1), (x, m2), (x, m1)])
    # y.shape[1] is read at replay ([Note: numbers from tensor data]): one graph for both masks
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_indexing_with_the_tuple_torch_where_returns():
    def f(x, scores):
        picked = x[torch.where(x > 0)]             # the whole tuple as the index
        rows = scores[torch.where(scores > 0.5)]  # 1-D: a tuple of one
        return picked * 2, rows.sum(), picked.shape[0]

    calls = [(torch.randn(3, 4), torch.rand(6)) for _ in range(3)]
    cf = check(f, calls)
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_autograd_through_replay_matches_eager():
    def f(x, w):
        return (torch.sigmoid(x @ w) ** 2).sum()

    magpy.reset()
    cf = magpy.compile(f)
    w0 = torch.randn(3, 2)
    for i in range(3):
        x = torch.randn(4, 3)
        we = w0.clone().requires_grad_(True)
        wc = w0.clone().requires_grad_(True)
        le = f(x, we)
        lc = cf(x, wc)
        assert torch.equal(le.detach(), lc.detach())
        assert lc.requires_grad and lc.grad_fn is not None
        le.backward()
        lc.backward()
        assert torch.equal(we.grad, wc.grad)
    assert_stats(cf, graphs=1, hits=2, misses=1)


def test_metadata_queries_are_constants():
    def f(x):
        return x.view(x.size(0), -1) * x.dim() + x.numel() + len(x)

    cf = check(f, [torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randn(3, 3, 4),
                   torch.randn(5, 3, 4), torch.randn(7, 3, 4)])
    e = assert_stats(cf, graphs=2, hits=3, misses=2)
    assert e.recompile_reasons == ["tensor `L['x']` dim 0: expected 2, got 3; "
                                   "now dynamic: L['x'] dim 0"]
    # size(0), numel() and len() are read at replay; dim() is fixed by the rank
    assert "size=[s0, 3, 4]" in "\n".join(e.guards)
    code = "\n".join(e.replay_code())
    assert "size(L['x'], 0)" in code and "numel(L['x'])" in code


def test_stride_query_guards_strides():
    def f(x):
        if x.is_contiguous():
            return x.view(-1) + 1
        return x.reshape(-1) - 1

    x = torch.randn(3, 4)
    cf = check(f, [x, x + 1, x.t().contiguous().t(), torch.randn(3, 4)])
    e = assert_stats(cf, graphs=2, hits=2, misses=2)
    assert "strides" in e.recompile_reasons[0]


def test_strides_not_guarded_when_not_read():
    def f(x):
        return x * 2 + 1

    x = torch.randn(3, 4)
    cf = check(f, [x, x.t().contiguous().t(), x[:, ::1]])
    assert_stats(cf, graphs=1, hits=2, misses=1)


def test_parameter_subclass_is_a_different_type():
    def f(x):
        return x * 2

    t = torch.randn(3)
    p = torch.nn.Parameter(torch.randn(3), requires_grad=False)
    cf = check(f, [t, p, t, p])
    assert_stats(cf, graphs=2, hits=2, misses=2)


def test_replay_plan_lists_recorded_ops():
    def f(x, y):
        return torch.relu(x) + y * 2

    x = torch.randn(3)
    cf = check(f, [(x, x), (x, x)])
    e = assert_stats(cf, graphs=1, hits=1, misses=1)
    code = "\n".join(e.replay_code())
    assert "relu" in code and "L['y'] * 2" in code
    assert e.op_count == 3


def test_returning_an_input_returns_the_same_object():
    def f(x, y):
        return x, (y + 1, x)

    magpy.reset()
    cf = magpy.compile(f)
    for _ in range(3):
        x, y = torch.randn(2), torch.randn(2)
        out = cf(x, y)
        assert out[0] is x and out[1][1] is x and torch.equal(out[1][0], y + 1)
    assert_stats(cf, graphs=1, hits=2, misses=1)


def test_tensor_type_conversion():
    def f(x):
        return x.type(torch.float64) * 2

    check(f, [torch.ones(2), torch.zeros(2)])


def test_tensor_type_query_string():
    def f(x):
        return x.type()

    cf = check(f, [torch.ones(1), torch.zeros(1), torch.ones(1, dtype=torch.int64)])
    assert_stats(cf, graphs=2, hits=1, misses=2)


DATA_DEPENDENT = {
    "torch.unique": lambda x: x.new_zeros(torch.unique(x).shape[0]),
    "Tensor.unique": lambda x: x.new_zeros(x.unique().shape[0]),
    "torch.where(cond)": lambda x: x * len(torch.where(x > 0)[0]),
}


@pytest.mark.parametrize("name", sorted(DATA_DEPENDENT))
def test_data_dependent_shape_read_at_replay(name):
    # The size is a number read at replay, as torch.compile's unbacked sizes: one graph that
    # gives the right sizes whatever the data.
    xs = [torch.tensor([1.0, 1.0, -2.0]), torch.tensor([1.0, 3.0, 2.0]), torch.tensor([-1.0, 3.0, 3.0])]
    cf = check(DATA_DEPENDENT[name], xs)
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_nonzero_sizes_flow_into_ops_and_builtins():
    def f(x, k):
        idx = x.nonzero().squeeze(1)
        n = min(k, idx.numel())  # torchvision's postprocessing idiom
        vals, order = x[idx].topk(n)
        return idx[order], vals, x.new_zeros(len(idx), 2), n, idx.shape

    xs = [(torch.tensor([1.0, 0.0, -2.0, 0.0]), 3), (torch.tensor([1.0, 3.0, 2.0, 5.0]), 3),
          (torch.tensor([0.0, 0.0, 0.0, 4.0]), 3)]
    cf = check(f, xs)
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)


def test_branch_on_a_data_dependent_size_that_flips_breaks_and_is_correct():
    def f(x):
        kept = x[x > 0]
        if kept.shape[0] == 0:  # guessed, then a break once it goes the other way (MB001)
            return x.new_zeros(1)
        return kept * 2

    xs = [torch.tensor([1.0, 0.0, -2.0]), torch.tensor([-1.0, -3.0, -2.0]), torch.tensor([1.0, 3.0, 2.0]),
          torch.tensor([-1.0, -3.0, -2.0])]
    cf = check(f, xs)
    assert break_ids(cf) == ["MB001"]
    assert ".size(0) == 0" in magpy.explain(cf).breaks[0].reason
    assert "shape depends on its data" in magpy.explain(cf).breaks[0].reason


@pytest.mark.parametrize("how", ["cat_list", "stack_tuple", "appended", "dict_values"])
def test_a_data_dependent_size_reached_through_a_container_is_never_specialised(how):
    # torchvision's batched_nms idiom: boxes = torch.cat([kept per level]); if boxes.numel() == 0.
    # The sizes of a cat of masked selections depend on the data like the selections' own
    # (this used to be specialised to the first call's size: a wrong result).
    def f(x):
        kept = x[x > 0]
        if how == "cat_list":
            boxes = torch.cat([kept, kept * 2])
        elif how == "stack_tuple":
            boxes = torch.stack((kept, kept + 1))
        elif how == "appended":
            parts = []
            parts.append(kept)
            boxes = torch.cat(parts)
        else:
            boxes = torch.cat(list({"a": kept, "b": kept}.values()))
        if boxes.numel() == 0:
            return torch.zeros(1)
        return boxes.sum(0, keepdim=True) + boxes.shape[0]

    xs = [-torch.ones(4), torch.tensor([1.0, -1.0, 2.0, 0.0]), -torch.ones(4), torch.arange(4.0)]
    cf = check(f, xs)
    assert break_ids(cf) == ["MB001"]


def test_list_of_split_pieces_is_one_graph():
    # FCOS: split_head_outputs[k] = list(head_outputs[k].split(sizes, dim=1))
    def f(x, sizes):
        pieces = list(x.split(sizes, dim=1))
        rows = tuple(x[0])
        return [p.sum(1) for p in pieces], len(rows), rows[-1] * 2

    xs = [(torch.randn(2, 5), [2, 3]), (torch.randn(2, 5), [2, 3]), (torch.randn(2, 5), [1, 4])]
    cf = check(f, xs)
    assert_stats(cf, graphs=2, breaks=0, hits=1, misses=2)


def test_layout_of_a_data_dependent_shape_breaks():
    def f(x):
        kept = x[x > 0]
        return kept * kept.stride(0)

    cf = check(f, [torch.tensor([1.0, 0.0, -2.0]), torch.tensor([1.0, 3.0, 2.0])])
    assert break_ids(cf) == ["MB010"]


def test_finfo_and_iinfo_of_a_dtype_are_constants():
    def f(x, mask):
        neg = torch.finfo(x.dtype).min
        return x.masked_fill(mask, neg) + torch.iinfo(torch.int32).bits

    x = torch.randn(4)
    cf = check(f, [(x, x > 0), (x * 2, x < 0)])
    assert_stats(cf, graphs=1, breaks=0, hits=1)


def test_operators_called_through_torch_ops():
    # torchvision calls its kernels as torch.ops.torchvision.roi_align(...) / nms(...)
    pytest.importorskip("torchvision")  # registers torch.ops.torchvision

    def f(boxes, scores, x):
        keep = torch.ops.torchvision.nms(boxes, scores, 0.5)
        y = torch.ops.aten.add.Tensor(x, x)
        torch.ops.aten.mul_.Tensor(x, 2.0)  # in place on the input: replayed as a write
        return keep, y

    def boxes():
        b = torch.rand(6, 4) * 10
        b[:, 2:] += b[:, :2]
        return b

    calls = [(boxes(), torch.rand(6), torch.randn(3)) for _ in range(3)]
    cf = check(f, calls)
    assert_stats(cf, graphs=1, breaks=0, hits=2, misses=1)
