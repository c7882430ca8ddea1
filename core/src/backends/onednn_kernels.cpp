// [Note: oneDNN kernels] in core/NOTES.md says why and when; this file does the rewriting.
//
// [SECTION] reading the traced types  [SECTION] timing  [SECTION] rewriting
#include "backends/onednn_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/jit/ir/constants.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

namespace magpy {

namespace {

namespace jit = torch::jit;

std::vector<int64_t> sizes_of(const c10::TensorTypePtr& t) { return *t->sizes().concrete_sizes(); }

const c10::Symbol kLinear = c10::Symbol::fromQualString("aten::linear");
const c10::Symbol kConvolution = c10::Symbol::fromQualString("aten::_convolution");
const c10::Symbol kConv2d = c10::Symbol::fromQualString("aten::conv2d");
const c10::Symbol kToMkldnn = c10::Symbol::fromQualString("aten::to_mkldnn");
const c10::Symbol kToDense = c10::Symbol::fromQualString("aten::to_dense");
const c10::Symbol kMkldnnLinear = c10::Symbol::fromQualString("aten::mkldnn_linear");
const c10::Symbol kMkldnnConvolution = c10::Symbol::fromQualString("aten::mkldnn_convolution");

// [SECTION] reading the traced types ------------------------------------------------------------
// A trace gives every tensor value its complete type: sizes, strides, dtype, device.

c10::TensorTypePtr float_cpu(jit::Value* v) {
    c10::TensorTypePtr t = v->type()->cast<c10::TensorType>();
    if (!t || t->scalarType() != at::kFloat || !t->device() || !t->device()->is_cpu() ||
        !t->sizes().concrete_sizes() || !t->strides().concrete_sizes())
        return nullptr;
    std::vector<int64_t> sizes = *t->sizes().concrete_sizes();
    if (std::find(sizes.begin(), sizes.end(), 0) != sizes.end()) return nullptr;  // empty: eager
    return t;
}

bool contiguous(const c10::TensorTypePtr& t) {
    std::vector<int64_t> sizes = sizes_of(t), strides = *t->strides().concrete_sizes();
    int64_t expect = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
        if (sizes[i] != 1 && strides[i] != expect) return false;
        expect *= sizes[i];
    }
    return true;
}

bool is_none(jit::Value* v) { return v->type()->kind() == c10::TypeKind::NoneType; }

std::optional<std::vector<int64_t>> const_ints(jit::Value* v) {
    if (c10::optional<c10::IValue> iv = jit::toIValue(v)) {
        if (iv->isIntList()) return iv->toIntVector();
        return std::nullopt;
    }
    if (v->node()->kind() != c10::prim::ListConstruct) return std::nullopt;
    std::vector<int64_t> out;
    for (jit::Value* in : v->node()->inputs()) {
        c10::optional<c10::IValue> iv = jit::toIValue(in);
        if (!iv || !iv->isInt()) return std::nullopt;
        out.push_back(iv->toInt());
    }
    return out;
}

c10::optional<c10::IValue> constant(jit::Value* v) { return jit::toIValue(v); }

std::string joined(const std::vector<int64_t>& xs) {
    std::string s = "[";
    for (int64_t x : xs) s += std::to_string(x) + ",";
    return s + "]";
}

// [SECTION] timing -------------------------------------------------------------------------------
// Which kernel is faster depends on the BLAS torch was built with and on the shapes: Debian's
// torch uses the reference BLAS, where oneDNN's GEMM is 20x faster for a 64x512x512 linear; a
// torch with MKL may be faster than oneDNN for small ones. So each (op, shapes, thread count)
// is timed once per process on random data, and oneDNN is used only when clearly faster.

constexpr double kMargin = 1.2;        // oneDNN must be this much faster
constexpr double kBudgetMs = 60.0;     // per kernel timed, after one warm-up run

double best_ms(const std::function<void()>& run) {
    using clock = std::chrono::steady_clock;
    run();
    double best = 1e300, total = 0;
    for (int i = 0; i < 3 && total < kBudgetMs; ++i) {
        auto t0 = clock::now();
        run();
        double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
        best = std::min(best, ms);
        total += ms;
    }
    return best;
}

bool onednn_faster(const std::string& key, const std::function<void()>& eager,
                   const std::function<void()>& onednn) {
    static std::unordered_map<std::string, bool> decided;
    std::string k = key + " threads " + std::to_string(at::get_num_threads());
    auto it = decided.find(k);
    if (it != decided.end()) return it->second;
    bool faster = false;
    try {
        at::NoGradGuard no_grad;
        double e = best_ms(eager);
        double o = best_ms(onednn);
        e = std::min(e, best_ms(eager));  // both before and after: drift favours neither
        faster = o * kMargin < e;
    } catch (const std::exception&) {
        faster = false;  // a kernel that fails here is not used
    }
    decided.emplace(std::move(k), faster);
    return faster;
}

// From a generator of our own: the timing must not move torch's global random state, which
// the program's next draw would then see.
at::Tensor random(const std::vector<int64_t>& sizes) {
    static at::Generator gen = at::detail::createCPUGenerator(0);
    return at::randn(sizes, gen);
}

c10::optional<at::Tensor> random_bias(jit::Value* bias) {
    if (is_none(bias)) return c10::nullopt;
    return random(sizes_of(float_cpu(bias)));
}

// [SECTION] rewriting ----------------------------------------------------------------------------
// Both kernels read the weights as they are at the call (dense tensors, converted inside the
// call), so a write to a weight between calls, even through `.data`, is seen as eager sees it.

bool grad_blocks(bool grad_mode, std::initializer_list<jit::Value*> tensors) {
    if (!grad_mode) return false;
    for (jit::Value* v : tensors) {
        if (is_none(v)) continue;
        c10::TensorTypePtr t = v->type()->cast<c10::TensorType>();
        if (!t || t->requiresGrad().value_or(true)) return true;
    }
    return false;
}

void replace(jit::Node* n, jit::Value* by) {
    by->setType(n->output()->type());
    n->output()->replaceAllUsesWith(by);
    n->destroy();
}

// aten::linear(x, w, b) -> to_dense(mkldnn_linear(to_mkldnn(x), to_mkldnn(w), to_mkldnn(b)))
bool move_linear(jit::Graph& graph, jit::Node* n, bool grad_mode) {
    if (n->inputs().size() != 3) return false;
    jit::Value *x = n->input(0), *w = n->input(1), *b = n->input(2);
    c10::TensorTypePtr xt = float_cpu(x), wt = float_cpu(w);
    if (!xt || !wt || xt->dim() < 2 || wt->dim() != 2) return false;
    if (!is_none(b)) {  // F.linear also takes a bias that broadcasts: only [out] moves
        c10::TensorTypePtr bt = float_cpu(b);
        if (!bt || sizes_of(bt) != std::vector<int64_t>{sizes_of(wt)[0]}) return false;
    }
    if (grad_blocks(grad_mode, {x, w, b})) return false;
    // One row (a batch of one): the product reads the weight once, and oneDNN first reorders
    // all of it, so it cannot be clearly faster; timed anyway, noise decided, and a process
    // whose allocator then faulted the reordered copy in on every call ran 3.5x slower.
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < sizes_of(xt).size(); ++d) rows *= sizes_of(xt)[d];
    if (rows < 2) return false;
    at::Tensor X = random(sizes_of(xt)), W = random(sizes_of(wt));
    c10::optional<at::Tensor> B = random_bias(b);
    std::string key = "linear " + joined(sizes_of(xt)) + joined(sizes_of(wt)) + (B ? " bias" : "");
    bool faster = onednn_faster(
        key, [&] { at::linear(X, W, B); },
        [&] {
            c10::optional<at::Tensor> Bm;
            if (B) Bm = B->to_mkldnn();
            at::mkldnn_linear(X.to_mkldnn(), W.to_mkldnn(), Bm).to_dense();
        });
    if (!faster) return false;
    jit::WithInsertPoint at(n);
    auto mk = [&](jit::Value* v) { return graph.insert(kToMkldnn, {v}); };
    jit::Value* y = graph.insert(kMkldnnLinear, {mk(x), mk(w), is_none(b) ? b : mk(b)});
    replace(n, graph.insert(kToDense, {y}));
    return true;
}

// A 2-D convolution, traced as aten::_convolution (torch 1.x) or aten::conv2d: its parts, when
// oneDNN's dense-in, dense-out kernel computes exactly it.
struct Conv {
    jit::Value *x, *w, *b, *stride, *padding, *dilation, *groups;
    std::vector<int64_t> s, p, d;
    int64_t g = 1;
};

std::optional<Conv> conv_parts(jit::Node* n) {
    bool full = n->kind() == kConvolution;
    if (n->inputs().size() != (full ? 13u : 7u)) return std::nullopt;
    Conv c{n->input(0), n->input(1), n->input(2), n->input(3), n->input(4), n->input(5),
           n->input(full ? 8 : 6), {}, {}, {}, 1};
    c10::TensorTypePtr xt = float_cpu(c.x), wt = float_cpu(c.w);
    if (!xt || !wt || xt->dim() != 4 || wt->dim() != 4 || !contiguous(xt) || !contiguous(wt))
        return std::nullopt;
    if (!is_none(c.b) && !float_cpu(c.b)) return std::nullopt;
    auto s = const_ints(c.stride), p = const_ints(c.padding), d = const_ints(c.dilation);
    c10::optional<c10::IValue> g = constant(c.groups);
    if (!s || !p || !d || !g || !g->isInt() || s->size() != 2 || p->size() != 2 || d->size() != 2)
        return std::nullopt;
    if (full) {
        c10::optional<c10::IValue> transposed = constant(n->input(6));
        auto out_pad = const_ints(n->input(7));
        if (!transposed || !transposed->isBool() || transposed->toBool() || !out_pad) return std::nullopt;
        for (int64_t o : *out_pad)
            if (o != 0) return std::nullopt;
    }
    c.s = *s;
    c.p = *p;
    c.d = *d;
    c.g = g->toInt();
    return c;
}

bool move_conv(jit::Graph& graph, jit::Node* n, const Conv& c, bool grad_mode) {
    if (grad_blocks(grad_mode, {c.x, c.w, c.b})) return false;
    c10::TensorTypePtr xt = float_cpu(c.x), wt = float_cpu(c.w);
    at::Tensor X = random(sizes_of(xt)), W = random(sizes_of(wt));
    c10::optional<at::Tensor> B = random_bias(c.b);
    std::string key = "conv " + joined(sizes_of(xt)) + joined(sizes_of(wt)) + joined(c.s) +
                      joined(c.p) + joined(c.d) + std::to_string(c.g) + (B ? " bias" : "");
    bool faster = onednn_faster(
        key, [&] { at::conv2d(X, W, B, c.s, c.p, c.d, c.g); },
        [&] { at::mkldnn_convolution(X, W, B, c.p, c.s, c.d, c.g); });
    if (!faster) return false;
    jit::WithInsertPoint at(n);
    replace(n, graph.insert(kMkldnnConvolution,
                            {c.x, c.w, c.b, c.padding, c.stride, c.dilation, c.groups}));
    return true;
}

}  // namespace

std::string OneDnnChoice::text() const {
    if (linear_moved == 0 && conv_moved == 0) return "";
    std::string s = "oneDNN kernels (measured faster here) for ";
    if (linear_moved)
        s += std::to_string(linear_moved) + " of " + std::to_string(linear) + " linear ops";
    if (linear_moved && conv_moved) s += " and ";
    if (conv_moved)
        s += std::to_string(conv_moved) + " of " + std::to_string(conv) + " convolutions";
    return s;
}

OneDnnChoice use_onednn_kernels(const std::shared_ptr<jit::Graph>& graph, bool grad_mode,
                                bool convolutions) {
    OneDnnChoice c;
    if (!at::hasMKLDNN()) return c;
    std::vector<jit::Node*> nodes(graph->nodes().begin(), graph->nodes().end());
    for (jit::Node* n : nodes) {
        if (n->kind() == kLinear) {
            ++c.linear;
            if (move_linear(*graph, n, grad_mode)) ++c.linear_moved;
        } else if (convolutions &&
                   (n->kind() == kConvolution || n->kind() == kConv2d)) {
            std::optional<Conv> parts = conv_parts(n);
            if (!parts) continue;
            ++c.conv;
            if (move_conv(*graph, n, *parts, grad_mode)) ++c.conv_moved;
        }
    }
    return c;
}

}  // namespace magpy
