#include "capture/callee_rules.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include "python/py_ref.h"
#include "guards/guard_tree.h"
#include "python/torch_api.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <unordered_set>

namespace magpy {

namespace {

std::string module_of(PyObject* o) {
    PyObject* m = PyObject_GetAttrString(o, "__module__");
    if (!m) {
        PyErr_Clear();
        return {};
    }
    std::string s = PyUnicode_Check(m) ? py::str_of(m) : "";
    Py_DECREF(m);
    return s;
}

// The module a C function belongs to: its __module__, else the module it is bound to.
std::string cfunction_module(PyCFunctionObject* cf) {
    if (cf->m_module && PyUnicode_Check(cf->m_module)) return py::str_of(cf->m_module);
    if (cf->m_self && PyModule_Check(cf->m_self)) {
        if (const char* n = PyModule_GetName(cf->m_self)) return n;
        PyErr_Clear();
    }
    return {};
}

// TorchScript helpers that eager code calls: their answer is fixed when not scripting/tracing.
bool is_eager_fact(const std::string& op) {
    return op == "is_scripting" || op == "is_tracing" || op == "_get_tracing_state" ||
           op == "annotate" || op == "_unwrap_optional";
}

// What the torch build and the machine offer: the same answer for the whole process, so a
// constant of the capture (torch.compile folds them too). torch.distributed.is_initialized()
// is not one of them: init_process_group may come after the capture.
bool is_process_fact(const std::string& module, const std::string& op) {
    if (module == "torch.cuda")
        return op == "is_available" || op == "_is_compiled" || op == "device_count" ||
               op == "is_bf16_supported";
    if (module == "torch.distributed" || module == "torch.backends.cudnn" ||
        module == "torch.backends.mps" || module == "torch.backends.mkldnn" ||
        module == "torch.backends.openmp" || module == "torch.backends.mkl")
        return op == "is_available" || op == "is_built";
    return false;
}

// The itertools types followed (Monitor::itertools_call).
const std::unordered_set<std::string> kIterTools = {
    "product", "chain", "combinations", "combinations_with_replacement", "permutations",
    "islice", "pairwise", "zip_longest", "repeat", "accumulate", "starmap"};

// re's functions, and the methods of its Pattern and Match objects, that give a value from
// their arguments (a match, a string, a list of them): folded over constants. Not finditer
// and scanner, which give iterators.
const std::unordered_set<std::string> kRegexFolds = {
    "match", "fullmatch", "search", "sub", "subn", "split", "findall", "compile", "escape",
    "group", "groups", "groupdict", "start", "end", "span", "expand"};

const std::unordered_set<std::string> kPureBuiltins = {
    "abs", "min", "max", "round", "divmod", "pow", "ord", "chr", "repr", "hash", "callable",
    "sum", "any", "all", "sorted", "format", "ascii", "bin", "hex", "oct", "id", "vars"};

}  // namespace

bool reads_caller_frame(PyObject* callable, size_t nargs) {
    bool no_args = nargs == 0 || nargs == SIZE_MAX;
    if (callable == reinterpret_cast<PyObject*>(&PySuper_Type)) return no_args;
    PyObject* fn = PyMethod_Check(callable) ? PyMethod_GET_FUNCTION(callable) : callable;
    if (PyCFunction_Check(fn)) {
        auto* cf = reinterpret_cast<PyCFunctionObject*>(fn);
        const std::string m = cfunction_module(cf);
        const std::string name = cf->m_ml->ml_name;
        if (m == "builtins")
            return name == "locals" || name == "globals" || name == "eval" || name == "exec" ||
                   name == "breakpoint" || ((name == "vars" || name == "dir") && no_args);
        if (m == "sys") return starts_with(name, "_getframe");
        return m == "_warnings";
    }
    if (PyFunction_Check(fn)) {
        PyObject* mod = PyFunction_GET_MODULE(fn);
        std::string m = mod && PyUnicode_Check(mod) ? py::str_of(mod) : std::string();
        return m == "logging" || starts_with(m, "logging.") || m == "inspect" ||
               m == "traceback" || m == "warnings" || m == "pdb" || m == "bdb";
    }
    return false;
}

bool is_metadata_query(const std::string& n, size_t nargs) {
    static const std::unordered_set<std::string> kMeta = {
        "size", "dim", "ndimension", "numel", "nelement", "stride", "is_contiguous",
        "is_floating_point", "is_complex", "element_size", "get_device", "is_signed",
        "storage_offset", "__len__", "is_tensor"};
    if (n == "type") return nargs <= 1;  // x.type() names the type; x.type(dtype) converts
    return kMeta.count(n) != 0;
}

bool is_global_state_query(const std::string& n) {
    static const std::unordered_set<std::string> kGlobal = {
        "get_default_dtype", "is_grad_enabled", "is_inference_mode_enabled",
        "is_autocast_enabled", "is_autocast_cpu_enabled", "are_deterministic_algorithms_enabled",
        "is_anomaly_enabled", "get_num_threads", "is_compiling"};
    // and torch's other switches of the same shape (torch.backends.mha.get_fastpath_enabled)
    return kGlobal.count(n) != 0 ||
           ((starts_with(n, "is_") || starts_with(n, "get_")) && ends_with(n, "_enabled"));
}

bool reads_strides(const std::string& n) {
    return n == "stride" || n == "is_contiguous" || n == "storage_offset";
}

bool has_data_dependent_shape(const std::string& n, size_t nargs) {
    if (n == "where") return nargs == 1;  // torch.where(cond) is nonzero(cond) as a tuple
    static const std::unordered_set<std::string> kDyn = {
        "nonzero", "unique", "unique_consecutive", "masked_select", "argwhere",
        "repeat_interleave", "bincount", "nonzero_static"};
    return kDyn.count(n) != 0;
}

// Ops that draw from the generator, by name without a trailing `_` (normal, normal_): every
// aten operator LibTorch tags nondeterministic_seeded (binomial, _standard_gamma,
// native_dropout: a review probe found such draws taken for pure ops), and the Python
// functions of torch.nn and torch.nn.init that draw through them.
static bool is_random_op(const std::string& base) {
    static const std::unordered_set<std::string> kRandom = [] {
        std::unordered_set<std::string> names = {
            "dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d",
            "dropout3d", "rrelu", "gumbel_softmax", "fractional_max_pool2d",
            "fractional_max_pool3d", "fractional_max_pool2d_with_indices",
            "fractional_max_pool3d_with_indices", "uniform", "normal", "trunc_normal",
            "xavier_uniform", "xavier_normal", "kaiming_uniform", "kaiming_normal", "orthogonal",
            "sparse", "rand", "randn", "randint", "randperm"};
        auto& dispatcher = c10::Dispatcher::singleton();
        for (const c10::OperatorName& op : dispatcher.getAllOpNames()) {
            if (op.name.rfind("aten::", 0) != 0) continue;
            auto handle = dispatcher.findOp(op);
            if (!handle || !handle->hasTag(at::Tag::nondeterministic_seeded)) continue;
            std::string name = op.name.substr(6);
            names.insert(has_inplace_suffix(name) ? name.substr(0, name.size() - 1) : name);
        }
        return names;
    }();
    return kRandom.count(base) != 0;
}

// F.batch_norm(training=True) and F.instance_norm update the running statistics they are given.
static bool updates_statistics(const std::string& base) {
    return base == "batch_norm" || base == "instance_norm";
}

static std::string without_inplace_suffix(const std::string& n) {
    return has_inplace_suffix(n) ? n.substr(0, n.size() - 1) : n;
}

// A module of one of torch.nn's own classes named in `names` (exact types: a subclass may
// override what the name promises).
static bool torch_nn_module_of(PyObject* module, const std::unordered_set<std::string>& names) {
    PyTypeObject* t = Py_TYPE(module);
    PyObject* dict = py::type_dict(t);
    PyObject* mod = dict ? PyDict_GetItemString(dict, "__module__") : nullptr;  // borrowed
    return mod && PyUnicode_Check(mod) && starts_with(py::str_of(mod), "torch.nn.modules.") &&
           names.count(t->tp_name) != 0;
}

bool module_raises_only_on_metadata(PyObject* module) {
    static const std::unordered_set<std::string> kSafe = {
        "Linear", "Bilinear", "Identity", "Flatten", "Conv1d", "Conv2d", "Conv3d",
        "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "ReLU", "ReLU6", "LeakyReLU",
        "ELU", "SELU", "CELU", "GELU", "SiLU", "Mish", "Sigmoid", "Tanh", "Hardtanh",
        "Hardswish", "Hardsigmoid", "Softmax", "LogSoftmax", "Softplus", "Softsign",
        "Tanhshrink", "LayerNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
        "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "MaxPool1d", "MaxPool2d", "MaxPool3d",
        "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
        "AdaptiveAvgPool3d"};
    return torch_nn_module_of(module, kSafe);
}

bool op_raises_only_on_metadata(const std::string& op) {
    static const std::unordered_set<std::string> kSafe = {
        // pointwise
        "add", "sub", "subtract", "mul", "multiply", "true_divide", "neg", "negative", "abs",
        "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "square",
        "reciprocal", "sign", "sgn", "floor", "ceil", "round", "trunc", "frac", "sin", "cos",
        "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "erf", "erfc", "erfinv",
        "sigmoid", "logit", "relu", "relu6", "gelu", "silu", "mish", "elu", "selu", "celu",
        "leaky_relu", "hardtanh", "hardswish", "hardsigmoid", "softplus", "softsign",
        "tanhshrink", "threshold", "logsigmoid", "clamp", "clip", "clamp_min", "clamp_max",
        "maximum", "minimum", "fmax", "fmin", "lerp", "addcmul", "addcdiv", "nan_to_num",
        "masked_fill", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
        "logical_not", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
        "isnan", "isinf", "isfinite", "float", "half", "double", "bfloat16", "type_as", "detach",
        "clone", "contiguous", "zeros_like", "ones_like", "full_like", "empty_like",
        "rand_like", "randn_like", "new_zeros", "new_ones", "new_full", "new_empty",
        "zeros", "ones", "full", "empty", "eye", "arange", "linspace", "rand", "randn",
        // shapes and views (their sizes are constants: symbolic ones are refused apart)
        // (not view, view_as, unflatten: they raise on strides, which the guards do not fix)
        "reshape", "reshape_as", "flatten", "squeeze",
        "unsqueeze", "transpose", "permute", "t", "expand", "expand_as", "repeat", "tile",
        "movedim", "swapaxes", "chunk", "split", "unbind", "cat", "concat", "stack", "hstack",
        "vstack", "broadcast_to", "flip", "roll", "tril", "triu", "pad",
        // reductions, products, layers
        "sum", "mean", "prod", "amax", "amin", "argmax", "argmin", "std", "var", "norm",
        "logsumexp", "cumsum", "cumprod", "softmax", "log_softmax", "topk", "sort", "argsort",
        "linear", "bilinear", "matmul", "mm", "bmm", "mv", "addmm", "addmv", "baddbmm",
        "einsum", "outer", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
        "conv_transpose2d", "conv_transpose3d", "batch_norm", "layer_norm", "group_norm",
        "rms_norm", "dropout", "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d",
        "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
        "adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
        "adaptive_max_pool3d", "interpolate", "scaled_dot_product_attention", "normalize",
        "cosine_similarity", "pairwise_distance", "mse_loss", "l1_loss", "smooth_l1_loss",
        "huber_loss", "binary_cross_entropy_with_logits", "kl_div"};
    return kSafe.count(without_inplace_suffix(op)) != 0;
}

// A leaf module's boolean attribute (training, inplace ...); false when it has none.
static bool module_flag(PyObject* module, const char* name) {
    PyObject* v = PyObject_GetAttrString(module, name);
    if (!v) {
        PyErr_Clear();
        return false;
    }
    bool on = PyObject_IsTrue(v) == 1;
    Py_DECREF(v);
    PyErr_Clear();
    return on;
}

// Whether a module called in training mode draws random numbers: dropout and RReLU, one with
// a `dropout` probability of its own (MultiheadAttention, the RNNs), or one holding such a
// submodule in training mode (TransformerEncoderLayer; a review probe: its call ran again
// after a failed replay check drew twice, as its draws were not saved and put back).
static bool draws_like_dropout(PyObject* module, int depth = 0) {
    std::string type = Py_TYPE(module)->tp_name;
    if (type.find("Dropout") != std::string::npos || type.find("RReLU") != std::string::npos)
        return true;
    if (depth > 8) return true;  // (too deep to look into: taken to draw)
    PyObject** dictptr = _PyObject_GetDictPtr(module);
    PyObject* d = dictptr ? *dictptr : nullptr;
    if (!d || !PyDict_Check(d)) return false;
    PyObject* p = PyDict_GetItemString(d, "dropout");
    if (p && (PyFloat_Check(p) || PyLong_Check(p)) && PyObject_IsTrue(p) == 1) return true;
    PyObject* subs = PyDict_GetItemString(d, "_modules");
    if (!subs || !PyDict_Check(subs)) return false;
    Py_ssize_t pos = 0;
    PyObject *k, *sub;
    while (PyDict_Next(subs, &pos, &k, &sub))
        if (sub != Py_None && module_flag(sub, "training") && draws_like_dropout(sub, depth + 1))
            return true;
    return false;
}

// torch.nn's own modules whose forward never reads `training` (convolutions, linear layers,
// activations without noise, pooling, the norms without running statistics, padding): the
// capture needs no guard on the flag of one (exact types only: a subclass may read it).
bool leaf_module_ignores_training(PyObject* module) {
    static const std::unordered_set<std::string> kIgnore = {
        "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
        "Linear", "Bilinear", "Identity", "Flatten", "Unflatten", "ReLU", "ReLU6", "LeakyReLU",
        "PReLU", "ELU", "SELU", "CELU", "GELU", "SiLU", "Mish", "Sigmoid", "Tanh", "Hardtanh",
        "Hardswish", "Hardsigmoid", "Softmax", "LogSoftmax", "Softplus", "Softsign",
        "Tanhshrink", "Threshold", "GLU", "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d",
        "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d",
        "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "LayerNorm", "GroupNorm",
        "Embedding", "Upsample", "PixelShuffle", "PixelUnshuffle", "ZeroPad2d", "ConstantPad1d",
        "ConstantPad2d", "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d",
        "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d"};
    return torch_nn_module_of(module, kIgnore);
}

bool op_draws(const CalleeInfo& c, PyObject* callable, PyObject* kwnames,
              PyObject* const* kwvalues) {
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; ++i) {
        std::string k = py::str_of(PyTuple_GET_ITEM(kwnames, i));
        if ((k == "out" || k == "generator") && kwvalues[i] != Py_None) return false;
    }
    if (c.kind == CallKind::RandomDraw) {  // the `random` module's generator, not one of the user's
        static PyObject* shared = [] {
            PyObject* m = PyImport_ImportModule("random");
            PyObject* inst = m ? PyObject_GetAttrString(m, "_inst") : nullptr;
            Py_XDECREF(m);
            PyErr_Clear();
            return inst;  // kept for the process
        }();
        PyObject* self = PyMethod_Check(callable)      ? PyMethod_GET_SELF(callable)
                         : PyCFunction_Check(callable) ? PyCFunction_GET_SELF(callable)
                                                       : nullptr;
        return shared && self == shared;
    }
    if (c.kind == CallKind::LeafModule)
        return module_flag(callable, "training") && draws_like_dropout(callable);
    return c.kind == CallKind::TorchOp && is_random_op(without_inplace_suffix(c.op));
}

bool op_has_effects(const CalleeInfo& c, PyObject* callable, PyObject* kwnames,
                    PyObject* const* kwvalues) {
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; ++i) {
        std::string k = py::str_of(PyTuple_GET_ITEM(kwnames, i));
        if (k == "out" && kwvalues[i] != Py_None) return true;
        if (k == "inplace" && PyObject_IsTrue(kwvalues[i]) == 1) return true;
        if (k == "generator" && kwvalues[i] != Py_None) return true;
    }
    if (c.kind == CallKind::LeafModule) {
        if (module_flag(callable, "inplace")) return true;
        if (!module_flag(callable, "training")) return false;
        return module_flag(callable, "track_running_stats") || draws_like_dropout(callable);
    }
    if (c.kind == CallKind::Print || c.kind == CallKind::Warn || c.kind == CallKind::Log)
        return true;  // output the user sees
    if (c.kind == CallKind::RandomDraw) return true;  // advances the generator's state
    const std::string& n = c.op;
    // loss.backward(), torch.autograd.backward(...): gradients accumulate into .grad
    if (c.kind == CallKind::TorchOp && (c.changes_state || n == "backward" || n == "zero_grad"))
        return true;
    // The generators' state read: not pure (a trace would bake it in), kept in order with
    // the draws around it
    if (c.kind == CallKind::TorchOp && (n == "get_rng_state" || n == "get_rng_state_all" ||
                                        n == "get_state" || n == "initial_seed"))
        return true;
    if (without_inplace_suffix(n) != n) return true;
    // torch.set_default_dtype, use_deterministic_algorithms, set_num_threads,
    // torch._C._set_grad_enabled: process state no plan puts back when it declines
    if (c.kind == CallKind::TorchOp &&
        (starts_with(n, "set_") || starts_with(n, "use_") || starts_with(n, "_set_")))
        return true;
    return is_random_op(n) || updates_statistics(n);
}

int op_inplace_target(const CalleeInfo& c, PyObject* callable, PyObject* kwnames,
                      PyObject* const* kwvalues, size_t npos) {
    if (npos == 0) return -1;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    bool inplace_kw = false;
    for (Py_ssize_t i = 0; i < nkw; ++i) {
        std::string k = py::str_of(PyTuple_GET_ITEM(kwnames, i));
        if ((k == "out" && kwvalues[i] != Py_None) || (k == "generator" && kwvalues[i] != Py_None))
            return -1;
        inplace_kw = inplace_kw || (k == "inplace" && PyObject_IsTrue(kwvalues[i]) == 1);
    }
    if (c.kind == CallKind::LeafModule) {
        std::string type = Py_TYPE(callable)->tp_name;
        if (module_flag(callable, "training") && type.find("Norm") != std::string::npos)
            return -1;  // running statistics
        return module_flag(callable, "inplace") ? 0 : -1;
    }
    if (c.kind != CallKind::TorchOp) return -1;
    std::string base = without_inplace_suffix(c.op);
    if (updates_statistics(base)) return -1;
    return base != c.op || inplace_kw ? 0 : -1;
}

bool is_metadata_attribute(const char* n) {
    static const std::unordered_set<std::string> kAttrs = {
        "shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_sparse",
        "is_quantized", "layout", "is_leaf", "is_meta", "is_mkldnn", "is_complex", "is_nested"};
    // is_leaf of an input is not part of the tensor check: the monitor guards it separately.
    return kAttrs.count(n) != 0;
}

bool is_op_attribute(const char* n) {
    static const std::unordered_set<std::string> kOps = {"T", "mT", "H", "mH", "real", "imag",
                                                         "data"};
    return kOps.count(n) != 0;
}

bool is_namedtuple_type(PyTypeObject* t) {
    if (t == &PyTuple_Type || !PyType_IsSubtype(t, &PyTuple_Type)) return false;
    PyObject* fields = _PyType_Lookup(t, PyUnicode_InternFromString("_fields"));
    PyObject* make = _PyType_Lookup(t, PyUnicode_InternFromString("_make"));
    return fields && PyTuple_Check(fields) && make;
}

int namedtuple_field(PyTypeObject* t, PyObject* name) {
    if (!is_namedtuple_type(t)) return -1;
    PyObject* fields = _PyType_Lookup(t, PyUnicode_InternFromString("_fields"));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fields); ++i) {
        int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(fields, i), name, Py_EQ);
        if (eq < 0) PyErr_Clear();
        if (eq == 1) return static_cast<int>(i);
    }
    return -1;
}

// The code of collections.namedtuple's generated _replace and _asdict (shared by every
// namedtuple class), looked up once.
static bool is_namedtuple_method(PyCodeObject* code, const char* name) {
    static PyObject* sample = [] {
        PyObject* collections = PyImport_ImportModule("collections");
        PyObject* t = collections ? PyObject_CallMethod(collections, "namedtuple", "ss", "_T", "a")
                                  : nullptr;
        Py_XDECREF(collections);
        if (!t) PyErr_Clear();
        return t;  // kept for the process
    }();
    if (!sample) return false;
    PyObject* fn = PyObject_GetAttrString(sample, name);
    if (!fn) {
        PyErr_Clear();
        return false;
    }
    bool same = PyFunction_Check(fn) &&
                reinterpret_cast<PyFunctionObject*>(fn)->func_code == reinterpret_cast<PyObject*>(code);
    Py_DECREF(fn);
    return same;
}

PyTypeObject* user_class_base(PyTypeObject* t) {
    if (Py_TYPE(t) != &PyType_Type || !(t->tp_flags & Py_TPFLAGS_HEAPTYPE)) return nullptr;
    // (attributes in __dict__, or in the slots of __slots__)
    if (t->tp_finalize || t->tp_getattro != PyObject_GenericGetAttr) return nullptr;
    // Every base but object is a Python class, or the C classes of one mapping: dict, or
    // OrderedDict (and its base dict). Instances have that base's layout.
    bool dict = false, ordered = false;
    PyObject* mro = t->tp_mro;
    for (Py_ssize_t i = 0; mro && i < PyTuple_GET_SIZE(mro); ++i) {
        auto* b = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i));
        if ((b->tp_flags & Py_TPFLAGS_HEAPTYPE) || b == &PyBaseObject_Type) continue;
        if (b == &PyDict_Type) dict = true;
        else if (b == torch_api().ordered_dict_type) ordered = true;
        else return nullptr;
    }
    if (ordered && !dict) return nullptr;
    PyTypeObject* base = ordered ? torch_api().ordered_dict_type
                         : dict  ? &PyDict_Type
                                 : &PyBaseObject_Type;
    if (t->tp_new != base->tp_new) return nullptr;
    // Setting an attribute is the generic store, or a __setattr__ of the class's in Python,
    // traced as a method ([Note: hooks of objects made in the call] in monitor.cpp).
    if (t->tp_setattro != PyObject_GenericSetAttr) {
        // (A __delattr__ of the class's never runs in a capture: `del obj.name` breaks.)
        static PyObject* set_name = PyUnicode_InternFromString("__setattr__");  // kept
        PyObject* set = _PyType_Lookup(t, set_name);
        if (!set || (set != _PyType_Lookup(&PyBaseObject_Type, set_name) && !PyFunction_Check(set)))
            return nullptr;
    }
    return base;
}

bool is_plain_user_class(PyTypeObject* t) { return user_class_base(t) != nullptr; }

PyTypeObject* layout_base(PyTypeObject* type) {
    while (type && (type->tp_flags & Py_TPFLAGS_HEAPTYPE)) type = type->tp_base;
    return type;
}

PyTypeObject* imported_type(const char* module, const char* name) {
    PyObject* mod = PyImport_ImportModule(module);
    PyObject* t = mod ? PyObject_GetAttrString(mod, name) : nullptr;
    Py_XDECREF(mod);
    if (!t || !PyType_Check(t)) {
        PyErr_Clear();
        Py_XDECREF(t);
        return nullptr;
    }
    return reinterpret_cast<PyTypeObject*>(t);  // kept for the process's life
}

namespace {

// A method of Python's random.Random (of the module's hidden instance, or the user's own) that
// draws one number. `type` null: the method is known to be Random's.
bool is_random_draw(PyTypeObject* type, const std::string& method) {
    static PyTypeObject* random_type = imported_type("_random", "Random");
    static const std::unordered_set<std::string> kDraws = {
        "random", "getrandbits", "uniform", "randint", "randrange", "gauss", "normalvariate",
        "lognormvariate", "expovariate", "vonmisesvariate", "gammavariate", "betavariate",
        "paretovariate", "weibullvariate", "triangular"};
    return (!type || (random_type && PyType_IsSubtype(type, random_type))) && kDraws.count(method);
}
}  // namespace

PyTypeObject* functools_partial_type() {
    static PyTypeObject* type = imported_type("functools", "partial");
    return type;
}

// [Note: cached functions] The results of an unbounded functools.lru_cache wrapper live in a
// dict it holds: of the objects it holds (tp_traverse), the one dict that is not its __dict__.
// Keys are made as the C wrapper makes them for positional arguments: untyped, a lone int or
// str argument is its own key, otherwise the tuple of arguments; typed, the arguments and then
// their types. Null when not exactly one
// such dict is found (another implementation): the caller then does not use it.
namespace {
int collect_dict(PyObject* o, void* out) {
    if (PyDict_Check(o)) static_cast<std::vector<PyObject*>*>(out)->push_back(o);
    return 0;
}

PyObject* lru_cache_dict(PyObject* fn) {
    traverseproc traverse = Py_TYPE(fn)->tp_traverse;
    if (!traverse) return nullptr;
    std::vector<PyObject*> dicts;
    traverse(fn, collect_dict, &dicts);
    PyObject** own = _PyObject_GetDictPtr(fn);
    PyObject* found = nullptr;
    for (PyObject* d : dicts) {
        if (own && d == *own) continue;
        if (found && found != d) return nullptr;
        found = d;
    }
    return found;
}

// What the wrapper holds for the key: asked of the wrapper itself once the key is known to be
// in its cache, so that the call is a hit that cache_info() counts, as eager's call is (a
// review probe: the hits seen no longer matched eager's), and runs nothing.
PyObject* cached_result_call(PyObject* self, PyObject*) {
    PyObject* fn = PyTuple_GET_ITEM(self, 0);
    PyObject* key = PyTuple_GET_ITEM(self, 1);
    PyObject* cache = lru_cache_dict(fn);
    PyObject* v = cache ? PyDict_GetItemWithError(cache, key) : nullptr;
    if (!v) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);  // not cached (now)
        return nullptr;
    }
    return PyObject_Call(fn, PyTuple_GET_ITEM(self, 2), nullptr);
}

PyMethodDef cached_result_def = {"cached_result", cached_result_call, METH_NOARGS,
                                 "the result a functools.lru_cache wrapper holds for a key"};
}  // namespace

PyObject* cached_result_lookup(PyObject* fn, PyObject* args, bool typed) {
    py::Ref made;  // a typed key: the arguments, then their types
    PyObject* key = args;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (typed) {
        made = py::Ref::steal(PyTuple_New(2 * n));
        if (!made) return nullptr;
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* a = PyTuple_GET_ITEM(args, i);
            PyTuple_SET_ITEM(made.get(), i, Py_NewRef(a));
            PyTuple_SET_ITEM(made.get(), n + i, Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(a))));
        }
        key = made.get();
    } else if (n == 1) {
        PyObject* only = PyTuple_GET_ITEM(args, 0);
        if (PyUnicode_CheckExact(only) || PyLong_CheckExact(only)) key = only;
    }
    PyObject* cache = lru_cache_dict(fn);
    PyObject* held = cache ? PyDict_GetItemWithError(cache, key) : nullptr;
    if (!held) {  // the call just made must be in it
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_LookupError, "no cache entry found");
        return nullptr;
    }
    py::Ref self = py::Ref::steal(Py_BuildValue("(OOO)", fn, key, args));
    return self ? PyCFunction_New(&cached_result_def, self.get()) : nullptr;
}

int logger_level(const std::string& qualname) {
    static const std::pair<const char*, int> kLevels[] = {
        {"Logger.debug", 10}, {"Logger.info", 20},     {"Logger.warning", 30},
        {"Logger.error", 40}, {"Logger.critical", 50}, {"Logger.log", 0}};
    for (const auto& [name, level] : kLevels)
        if (qualname == name) return level;
    return -1;
}

static CalleeInfo classify_by_rules(PyObject* f);

CalleeInfo classify_callee(PyObject* f) {
    CalleeInfo info = classify_by_rules(f);
    if (info.kind != CallKind::TorchOp) return info;
    // torch.ops.<ns>.<op> names its namespace in __module__ ("torch._ops.<ns>"); torch's own
    // functions and tensor methods are aten's
    std::string ns = "aten";
    const auto& ops = torch_api().op_types;
    if (std::find(ops.begin(), ops.end(), Py_TYPE(f)) != ops.end()) {
        ns = module_of(f);
        ns = ns.substr(ns.rfind('.') + 1);
    }
    info.python_kernel = op_has_python_kernel(ns, info.op);
    return info;
}

static CalleeInfo classify_by_rules(PyObject* f) {
    CalleeInfo info;
    const TorchApi& api = torch_api();
    if (f == reinterpret_cast<PyObject*>(&PySuper_Type)) {
        info.kind = CallKind::Super;
        info.name = info.op = "super";
        return info;
    }
    if (f == reinterpret_cast<PyObject*>(&PyBaseObject_Type)) {
        info.kind = CallKind::UserClass;  // object(): a sentinel made in the call
        info.name = info.op = "object";
        return info;
    }
    if (f == reinterpret_cast<PyObject*>(functools_partial_type())) {
        info.kind = CallKind::MakePartial;
        info.name = "functools.partial";
        info.op = "partial";
        return info;
    }
    // np.sqrt, np.log2; and numpy >= 1.25's functions (np.triu, np.ones), which are objects
    // of its own C type wrapping the Python function
    const std::string type_name = Py_TYPE(f)->tp_name;
    if (type_name == "numpy.ufunc" || type_name == "numpy._ArrayFunctionDispatcher") {
        info.kind = CallKind::PureBuiltin;
        PyObject* n = PyObject_GetAttrString(f, "__name__");
        info.op = n && PyUnicode_Check(n) ? py::str_of(n) : "ufunc";
        info.name = "numpy." + info.op;
        Py_XDECREF(n);
        PyErr_Clear();
        return info;
    }
    // operator.itemgetter(1) and attrgetter("a") fold over constants, as the pure builtins;
    // the object they make, called, is the subscript or attribute read
    const std::string made = PyType_Check(f) ? reinterpret_cast<PyTypeObject*>(f)->tp_name : "";
    if (type_name == "operator.itemgetter" || type_name == "operator.attrgetter" ||
        made == "operator.itemgetter" || made == "operator.attrgetter") {
        info.kind = made.empty() ? CallKind::Getter : CallKind::PureBuiltin;
        info.name = made.empty() ? type_name + "(...)" : made;
        info.op = (made.empty() ? type_name : made).substr(9);
        return info;
    }
    if (type_name == "functools._lru_cache_wrapper") {
        info.kind = CallKind::CachedCall;
        PyObject* q = PyObject_GetAttrString(f, "__qualname__");
        info.name = info.op = q && PyUnicode_Check(q) ? py::str_of(q) : "lru_cache function";
        Py_XDECREF(q);
        PyErr_Clear();
        return info;
    }
    if (PyFunction_Check(f)) {
        auto* fn = reinterpret_cast<PyFunctionObject*>(f);
        info.name = py::str_of(fn->func_qualname);
        std::string m = fn->func_module && PyUnicode_Check(fn->func_module)
                            ? py::str_of(fn->func_module)
                            : "";
        info.code = reinterpret_cast<PyCodeObject*>(fn->func_code);
        info.op = py::str_of(fn->func_name);
        if (api.module_member_fn(f)) {
            info.kind = CallKind::ModuleMembers;
        } else if (m == "os" && info.name == "getenv") {
            info.kind = CallKind::EnvRead;
            info.name = "os.getenv";
        } else if (m == "logging" && logger_level(info.name) >= 0) {
            info.kind = CallKind::Log;  // logger.info(...) & co
        } else if ((m == "numpy" || starts_with(m, "numpy.")) && !starts_with(m, "numpy.random")) {
            info.kind = CallKind::PureBuiltin;  // np.prod(x.shape[1:]): folded over constants
            info.name = "numpy." + info.op;
        } else if (m == "re" && kRegexFolds.count(info.op)) {
            info.kind = CallKind::PureBuiltin;  // re.match(r"layer(\d+)", name): folded over
            info.name = "re." + info.op;        // constants (its pattern cache is not state)
        } else if (m == "random" && starts_with(info.name, "Random.") &&
                   is_random_draw(nullptr, info.op)) {
            info.kind = CallKind::RandomDraw;  // random.uniform(a, b), rng.randint(1, 6)
            info.name = "random." + info.op;
        } else if (starts_with(m, "torch.nn.modules") || m == "torch.nn.utils.weight_norm" ||
                   m == "torch.nn.utils.spectral_norm" || starts_with(m, "torch.distributions") ||
                   (m == "torch.overrides" && info.op == "is_tensor_like")) {
            // module code (super().forward(x), a generator expression in a forward), the
            // hooks weight_norm and spectral_norm register, distributions' methods (they take
            // the distribution object, which an op cannot) and is_tensor_like (a type test)
            bool gen = info.code->co_flags & CO_GENERATOR;
            info.kind = gen ? CallKind::Generator : CallKind::InlineFunction;
        } else if (is_torch_module_name(m) && starts_with(m, "torch.") &&
                   (starts_with(m, "torch.jit") || starts_with(m, "torch._jit")) &&
                   is_eager_fact(info.op)) {
            info.kind = CallKind::EagerFact;
        } else if (is_process_fact(m, info.op)) {
            info.kind = CallKind::EagerFact;  // torch.cuda.is_available()
            info.process_fact = true;
            info.name = m + "." + info.op;
        } else if (is_torch_module_name(m)) {
            info.kind = CallKind::TorchOp;  // F.relu, torch.functional.*, Tensor python methods
            // optimizers and schedulers (their step wrappers live there too), but not the
            // readers of their state
            // (zero_grad writes only gradients: an effect, op_has_effects)
            info.changes_state = starts_with(m, "torch.optim") && info.op != "get_last_lr" &&
                                 info.op != "get_lr" && info.op != "state_dict" &&
                                 info.op != "zero_grad" && info.op != "__repr__";
            info.name = m == "torch.nn.functional" ? "F." + info.name : m + "." + info.name;
        } else if (m == "collections" && (is_namedtuple_method(info.code, "_replace") ||
                                          is_namedtuple_method(info.code, "_asdict"))) {
            info.kind = CallKind::NamedTupleMethod;
        } else if ((info.code->co_flags & CO_GENERATOR) &&
                   !(info.code->co_flags & (CO_COROUTINE | CO_ASYNC_GENERATOR |
                                            CO_ITERABLE_COROUTINE))) {
            info.kind = CallKind::Generator;
        } else if (!py::code_is_plain_function(info.code)) {
            info.kind = CallKind::Unsupported;
            info.name += " (a generator or coroutine)";
        } else {
            info.kind = CallKind::InlineFunction;
        }
        return info;
    }
    if (PyCFunction_Check(f)) {
        auto* cf = reinterpret_cast<PyCFunctionObject*>(f);
        info.name = cf->m_ml->ml_name;
        info.op = info.name;
        PyObject* self = cf->m_self;
        if (self && is_tensor(self)) {
            info.kind = CallKind::TorchOp;  // a bound tensor method
            info.bound_self = true;
            return info;
        }
        static PyTypeObject* autograd_function = imported_type("torch.autograd", "Function");
        if (self && PyType_Check(self) && info.op == "apply" && autograd_function &&
            PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(self), autograd_function)) {
            info.kind = CallKind::AutogradApply;
            info.name = std::string(reinterpret_cast<PyTypeObject*>(self)->tp_name) + ".apply";
            return info;
        }
        if (self && is_random_draw(Py_TYPE(self), info.op)) {
            info.kind = CallKind::RandomDraw;  // random.random()
            info.name = "random." + info.op;
            return info;
        }
        std::string m = cfunction_module(cf);
        if ((m == "numpy" || starts_with(m, "numpy.")) && !starts_with(m, "numpy.random")) {
            info.kind = CallKind::PureBuiltin;  // np.zeros, np.arange: as numpy's Python ones
            info.name = "numpy." + info.op;
            return info;
        }
        if (m == "_collections" && info.name == "_count_elements") {
            info.kind = CallKind::CountElements;  // Counter(items), counter.update(items)
            info.name = "Counter.update";
            return info;
        }
        if (m == "_warnings" && info.name == "warn") {
            info.kind = CallKind::Warn;
            info.name = "warnings.warn";
            return info;
        }
        static const std::unordered_set<std::string> kClocks = {
            "time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns",
            "process_time", "process_time_ns", "thread_time", "thread_time_ns"};
        if (m == "time" && kClocks.count(info.name)) {
            info.kind = CallKind::ClockRead;
            info.name = "time." + info.name;
            return info;
        }
        if (m.empty() && self && PyType_Check(self))
            m = module_of(self);  // torch._C._VariableFunctions methods
        if (is_torch_module_name(m)) {
            bool fact = info.op == "_get_tracing_state" || starts_with(info.op, "_has_torch_function");
            info.kind = fact ? CallKind::EagerFact : CallKind::TorchOp;
            return info;
        }
        if (m == "builtins") {
            const std::string& n = info.name;
            if (n == "len") info.kind = CallKind::Len;
            else if (n == "isinstance" || n == "issubclass") info.kind = CallKind::IsInstance;
            else if (n == "print") info.kind = CallKind::Print;
            else if (n == "hasattr" || n == "getattr" || n == "setattr") info.kind = CallKind::AttrQuery;
            else if (n == "next" || n == "iter") info.kind = CallKind::Next;
            else if (n == "input" || n == "open" || n == "breakpoint") info.kind = CallKind::IO;
            else if (kPureBuiltins.count(n)) info.kind = CallKind::PureBuiltin;
            return info;
        }
        // operator's setitem, delitem and in-place forms (iadd, ior, ...) change their first
        // argument: no rule (folding them would drop the change at replay)
        static const std::unordered_set<std::string> kMutators = {
            "setitem", "delitem", "iadd", "iand", "iconcat", "ifloordiv", "ilshift", "imod",
            "imul", "imatmul", "ior", "ipow", "irshift", "isub", "itruediv", "ixor"};
        std::string bare = starts_with(info.name, "__") && info.name.size() > 4
                               ? info.name.substr(2, info.name.size() - 4)
                               : info.name;
        if ((m == "operator" || m == "_operator") && kMutators.count(bare)) {
            info.name = "operator." + info.name;
            return info;  // Unsupported
        }
        if (m == "math" || m == "operator" || m == "_operator" ||
            (m == "_functools" && info.name == "reduce"))
            info.kind = CallKind::PureBuiltin;  // reduce(operator.mul, shape, 1)
        return info;
    }
    if (Py_TYPE(f) == &PyMethodDescr_Type) {
        PyTypeObject* owner = PyDescr_TYPE(f);
        info.name = std::string(owner->tp_name) + "." + py::str_of(PyDescr_NAME(f));
        info.op = py::str_of(PyDescr_NAME(f));
        if (reinterpret_cast<PyObject*>(owner) == api.tensor_base_type.get() ||
            PyType_IsSubtype(owner, api.tensor_type)) {
            info.kind = CallKind::TorchOp;
            info.name = info.op;
        } else if (is_random_draw(owner, info.op)) {
            info.kind = CallKind::RandomDraw;  // self.random() inside a Random method
            info.name = "random." + info.op;
        } else if (owner == &PyList_Type) {
            info.kind = CallKind::ListMethod;
            info.name = py::str_of(PyDescr_NAME(f));
        } else if (owner == &PySet_Type || owner == &PyFrozenSet_Type) {
            info.kind = CallKind::SetMethod;
            info.name = "set." + info.op;
        } else if (PyType_IsSubtype(owner, &PyDict_Type)) {
            info.kind = CallKind::DictMethod;
            info.name = py::str_of(PyDescr_NAME(f));
        } else if (std::strcmp(owner->tp_name, "numpy.ndarray") == 0) {
            // arr.astype("uint8"): recorded over arrays made from constants ([Note: numpy
            // arrays from constants] in monitor.cpp), else folded over constants
            info.kind = CallKind::PureBuiltin;
            info.name = "numpy.ndarray." + info.op;
        } else if (owner == &PyUnicode_Type || owner == &PyFloat_Type || owner == &PyLong_Type ||
                   owner == api.size_type ||
                   ((std::strcmp(owner->tp_name, "re.Match") == 0 ||
                     std::strcmp(owner->tp_name, "re.Pattern") == 0) &&
                    kRegexFolds.count(info.op))) {
            // "a,b".split(","), x.is_integer(), n.bit_length(), shape.numel()
            info.kind = CallKind::PureBuiltin;
        }
        return info;
    }
    if (Py_TYPE(f) == &PyWrapperDescr_Type) {
        // A slot of a value type called through its class (`t.dtype.__repr__()`,
        // `int.__add__(a, b)`): a function of its arguments, folded like str methods.
        PyTypeObject* owner = PyDescr_TYPE(f);
        info.op = py::str_of(PyDescr_NAME(f));
        info.name = std::string(owner->tp_name) + "." + info.op;
        static const std::unordered_set<std::string> kPureSlots = {
            "__repr__", "__str__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
            "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
            "__floordiv__", "__mod__", "__pow__", "__neg__", "__pos__", "__abs__", "__bool__",
            "__int__", "__float__", "__index__", "__len__", "__getitem__", "__contains__"};
        bool value_type = owner == &PyLong_Type || owner == &PyFloat_Type ||
                          owner == &PyBool_Type || owner == &PyUnicode_Type ||
                          owner == &PyTuple_Type || owner == &PyComplex_Type ||
                          owner == api.dtype_type || owner == api.device_type ||
                          owner == api.size_type;
        // object's own __repr__/__str__/__eq__ fold only for constants (as every pure call):
        // on anything else they would run its class's Python code, so they break.
        bool object_slot = owner == &PyBaseObject_Type &&
                           (info.op == "__repr__" || info.op == "__str__" || info.op == "__eq__" ||
                            info.op == "__ne__");
        if ((value_type && kPureSlots.count(info.op)) || object_slot)
            info.kind = CallKind::PureBuiltin;
        if (owner == &PyBaseObject_Type && info.op == "__init__")
            info.kind = CallKind::EagerFact;  // object.__init__(obj): nothing to do

        return info;
    }
    if (PyType_Check(f)) {
        auto* t = reinterpret_cast<PyTypeObject*>(f);
        info.name = t->tp_name;
        const std::string tn = t->tp_name;
        if (t == &PyZip_Type || t == &PyEnum_Type || t == &PyReversed_Type || t == &PyMap_Type ||
            (starts_with(tn, "itertools.") && kIterTools.count(tn.substr(10)))) {
            info.kind = CallKind::Iteration;
            info.op = info.name;
            return info;
        }
        if (t == &PyLong_Type || t == &PyFloat_Type || t == &PyBool_Type || t == &PyUnicode_Type ||
            t == &PyTuple_Type || t == &PyList_Type || t == &PyRange_Type ||
            t == &PySlice_Type || t == api.size_type || t == api.device_type ||
            t == api.ordered_dict_type || t == api.defaultdict_type || t == &PyDict_Type ||
            t == &PySet_Type || t == &PyFrozenSet_Type)
            info.kind = CallKind::TypeCtor;
        // np.float32(1.5), np.int64(n): folded; not the dates, which read the clock for "now"
        if (starts_with(tn, "numpy.") && tn != "numpy.ndarray" &&
            !starts_with(tn, "numpy.random") && tn != "numpy.datetime64" &&
            tn != "numpy.timedelta64")
            info.kind = CallKind::PureBuiltin;
        if (api.is_context_type(f)) info.kind = CallKind::Context;
        if (t == &PyType_Type) info.kind = CallKind::TypeOf;
        if (is_namedtuple_type(t)) {
            // The generated __new__ (defined beside _make), and no __init__ of the user's.
            PyObject* mro = t->tp_mro;
            bool plain = _PyType_Lookup(t, PyUnicode_InternFromString("__init__")) ==
                         _PyType_Lookup(&PyBaseObject_Type, PyUnicode_InternFromString("__init__"));
            for (Py_ssize_t i = 0; plain && mro && i < PyTuple_GET_SIZE(mro); ++i) {
                PyObject* d = py::type_dict(reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i)));
                if (!d || !PyDict_GetItemString(d, "__new__")) continue;
                if (PyDict_GetItemString(d, "_make")) info.kind = CallKind::NamedTuple;
                break;
            }
        }
        if (PyType_IsSubtype(t, api.module_type) &&
            starts_with(module_of(f), "torch.nn") && t != api.sequential_type &&
            t != api.module_list_type && t != api.module_dict_type)
            info.kind = CallKind::MakeModule;  // nn.CrossEntropyLoss(), nn.ReLU()
        // torch.finfo(dtype) / torch.iinfo(dtype): facts about a dtype, folded like math.*
        if (info.name == "torch.finfo" || info.name == "torch.iinfo")
            info.kind = CallKind::PureBuiltin;
        if (info.kind == CallKind::Unsupported && is_plain_user_class(t)) {
            static PyObject* init_name = PyUnicode_InternFromString("__init__");  // kept
            PyObject* init = _PyType_Lookup(t, init_name);
            // object's __init__, or dict's and OrderedDict's (items from the arguments)
            bool base_init = init == _PyType_Lookup(user_class_base(t), init_name);
            if (base_init) {
                info.kind = CallKind::UserClass;
            } else if (init && PyFunction_Check(init) &&
                       py::code_is_plain_function(reinterpret_cast<PyCodeObject*>(
                           PyFunction_GET_CODE(init)))) {
                info.kind = CallKind::UserClass;
                info.code = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(init));
            }
        }
        return info;
    }
    if (std::find(api.op_types.begin(), api.op_types.end(), Py_TYPE(f)) != api.op_types.end()) {
        // torch.ops.torchvision.roi_align(...), torch.ops.aten.add.Tensor(...): an operator
        py::Ref qual = py::Ref::steal(PyObject_GetAttrString(f, "__name__"));
        PyErr_Clear();
        info.op = qual && PyUnicode_Check(qual.get()) ? py::str_of(qual.get()) : "op";
        info.op = info.op.substr(0, info.op.find('.'));  // "add_.Tensor": its packet's name
        info.name = "torch.ops." + info.op;
        info.kind = CallKind::TorchOp;
        return info;
    }
    if (PyObject_TypeCheck(f, api.module_type)) {
        PyTypeObject* t = Py_TYPE(f);
        info.name = t->tp_name;
        std::string m = module_of(reinterpret_cast<PyObject*>(t));
        bool container = t == api.sequential_type || t == api.module_list_type ||
                         t == api.module_dict_type;
        if (starts_with(m, "torch.nn") && !container) {
            info.kind = CallKind::LeafModule;
            return info;
        }
        PyObject* fwd = PyObject_GetAttrString(reinterpret_cast<PyObject*>(t), "forward");
        if (!fwd) {
            PyErr_Clear();
            return info;
        }
        if (PyFunction_Check(fwd)) {
            info.kind = CallKind::InlineModule;
            info.code = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fwd));
        }
        Py_DECREF(fwd);  // the type keeps the function (and its code) alive
        return info;
    }
    info.name = py::type_name(f) + " object";
    return info;
}

}  // namespace magpy
