// The torchscript backend: each stretch of a plan that is pure tensor computation (a region)
// becomes one torch::jit graph, run by LibTorch's graph executor from C++. The graph is traced
// from the plan's own steps on the region's first run with given input shapes, so whatever the
// recorded callables do (torch functions, Tensor methods, built-in nn modules, F.*) lands in it
// as ATen ops. The rest of the plan (writes, Python values, the result) runs as before.
// See core/NOTES.md [Note: torchscript backend].
//
// [SECTION] keys  [SECTION] tracing  [SECTION] running  [SECTION] backend
#include "backends/backend.h"
#include "backends/onednn_kernels.h"
#include "backends/regions.h"

#include "guards/guard_tree.h"
#include "python/torch_api.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/passes/constant_pooling.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/frozen_conv_add_relu_fusion.h>
#include <torch/csrc/jit/passes/frozen_graph_optimizations.h>
#include <torch/csrc/jit/passes/frozen_linear_transpose.h>
#include <torch/csrc/jit/passes/frozen_ops_to_mkldnn.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace magpy {

namespace {

namespace jit = torch::jit;

// Traces kept per region (one per input shape set, module state ...); further ones run eagerly.
constexpr size_t kMaxSpecs = 8;
// Inputs are told apart by a linear search up to this many tensors, by a hash map beyond.
constexpr size_t kLinearSearch = 32;

// [SECTION] keys -------------------------------------------------------------------------------
// A trace holds for the inputs it was made with: the same tensor metadata (sizes, strides, dtype,
// device, requires_grad, which inputs are the same tensor), the same Python values, the same
// modules in the same state. Strides are part of it because an op may return its own input for
// one layout and a new tensor for another (`x.contiguous()`), and the tracer then takes later uses
// of `x` for uses of that op's result: a trace made with a contiguous `x` computes `x - y` from
// `x.contiguous()`, which on a transposed `x` gives a result laid out unlike eager's.
// A region's inputs are gathered into this form on every call.

// A dict the gathering read, with its version; for a module's own __dict__, the module and its
// class too ([Note: module state by dict versions]).
struct DictStamp {
    PyObject* dict;
    uint64_t version;
    PyObject* module = nullptr;
    PyTypeObject* type = nullptr;
    unsigned int type_tag = 0;  // the class's version tag (its bases and their dicts)
};

// Objects -> positions, by open addressing over one flat array that is kept between calls:
// clearing it is one fill, and nothing is allocated per entry (a std::unordered_map freed and
// allocated a node per tensor on every call: most of a large model's gathering time).
class PositionIndex {
public:
    bool empty() const { return m_used == 0; }
    void clear() {
        if (m_used == 0) return;
        std::fill(m_slots.begin(), m_slots.end(), Slot{});
        m_used = 0;
    }
    // The position of `key`, or -1 after adding it at `position`.
    int find_or_add(PyObject* key, int position) {
        if ((m_used + 1) * 2 > m_slots.size()) grow();
        size_t mask = m_slots.size() - 1;
        for (size_t i = hash(key) & mask;; i = (i + 1) & mask) {
            if (m_slots[i].key == key) return m_slots[i].position;
            if (!m_slots[i].key) {
                m_slots[i] = {key, position};
                ++m_used;
                return -1;
            }
        }
    }

private:
    struct Slot {
        PyObject* key = nullptr;
        int position = 0;
    };
    static size_t hash(PyObject* key) {
        auto k = reinterpret_cast<uintptr_t>(key) >> 4;
        return static_cast<size_t>(k * 0x9E3779B97F4A7C15ull >> 20);
    }
    void grow() {
        std::vector<Slot> old;
        old.swap(m_slots);
        m_slots.assign(std::max<size_t>(64, old.size() * 2), Slot{});
        m_used = 0;
        for (const Slot& s : old)
            if (s.key) find_or_add(s.key, s.position);
    }
    std::vector<Slot> m_slots;  // a power of two long, at most half full
    size_t m_used = 0;
};

struct Gathered {
    std::vector<PyObject*> tensors;  // unique, in order of first appearance (borrowed)
    std::vector<bool> state;         // per tensor: a module's parameter, buffer or attribute
    int module_depth = 0;            // > 0 while gathering a module's state
    std::vector<int> occurrences;    // per tensor seen: its index in `tensors`
    std::vector<PyObject*> others;   // every other value, in order (borrowed)
    std::vector<bool> by_value;      // per other: compared by value (else by identity)
    std::string untraceable;         // non-empty: these inputs cannot be traced (why)
    PositionIndex index;  // tensors -> position, once there are many
    std::vector<DictStamp>* stamps = nullptr;  // where the dicts read are noted (if anywhere)
    // Stretches [first, last) of `others` known to be the very objects the last matching key
    // saw ([Note: module state by dict versions]): Spec::matches compares only lists there.
    std::vector<std::pair<size_t, size_t>> known;
    // While gathering into a memo: a list was met, whose items (and so how it is compared, and
    // the tensors in it) can change with no dict changing; such a gathering is not kept.
    bool saw_list = false;
    std::vector<py::Ref> owned;  // values made for the key (class dict versions)

    void clear() {
        tensors.clear();
        state.clear();
        module_depth = 0;
        occurrences.clear();
        others.clear();
        by_value.clear();
        untraceable.clear();
        index.clear();
        known.clear();
        saw_list = false;
        owned.clear();
    }
};

// Containers nested deeper than this (a list that holds itself) are not plain, and are not
// walked into.
constexpr int kMaxNesting = 16;

// numpy's scalar numbers and bools (immutable, compared by value like Python's), once numpy
// has been imported; null before.
PyTypeObject* numpy_scalar_type(int which /* 0: numpy.number, 1: numpy.bool_ */) {
    static PyTypeObject* types[2] = {nullptr, nullptr};
    if (!types[0]) {
        static PyObject* name = PyUnicode_InternFromString("numpy");
        PyObject* np = PyImport_GetModule(name);
        if (!np) {
            PyErr_Clear();
            return nullptr;
        }
        PyObject* number = PyObject_GetAttrString(np, "number");
        PyObject* boolean = PyObject_GetAttrString(np, "bool_");
        Py_DECREF(np);
        if (number && boolean && PyType_Check(number) && PyType_Check(boolean)) {
            types[0] = reinterpret_cast<PyTypeObject*>(number);  // kept for the process
            types[1] = reinterpret_cast<PyTypeObject*>(boolean);
        } else {
            Py_XDECREF(number);
            Py_XDECREF(boolean);
            PyErr_Clear();
            return nullptr;
        }
    }
    return types[which];
}

bool is_plain(PyObject* o, int depth = 0) {
    if (o == Py_None || o == Py_Ellipsis || PyBool_Check(o) || PyLong_CheckExact(o) ||
        PyFloat_CheckExact(o) || PyComplex_CheckExact(o) || PyUnicode_CheckExact(o) ||
        PyBytes_CheckExact(o))
        return true;
    if (depth > kMaxNesting) return false;
    const TorchApi& api = torch_api();
    PyTypeObject* t = Py_TYPE(o);
    if (t == api.dtype_type || t == api.device_type || t == api.layout_type) return true;
    if (PySlice_Check(o)) {
        PySliceObject* s = reinterpret_cast<PySliceObject*>(o);
        return is_plain(s->start, depth + 1) && is_plain(s->stop, depth + 1) &&
               is_plain(s->step, depth + 1);
    }
    if (PyTuple_Check(o) || PyList_CheckExact(o)) {  // tuples include torch.Size
        Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
        for (Py_ssize_t i = 0; i < n; ++i)
            if (!is_plain(PySequence_Fast_GET_ITEM(o, i), depth + 1)) return false;
        return true;
    }
    if (std::strcmp(t->tp_name, "torch.memory_format") == 0) return true;
    // numpy scalars (np.float64 slopes, np.int64 sizes: a review probe changed the items of
    // a list of them in place, and a list compared by identity missed it)
    PyTypeObject* number = numpy_scalar_type(0);
    return number && (PyObject_TypeCheck(o, number) || PyObject_TypeCheck(o, numpy_scalar_type(1)));
}

// Functions and types are compared by identity: what they do does not change.
bool is_function_like(PyObject* o) {
    return PyFunction_Check(o) || PyCFunction_Check(o) || PyType_Check(o) ||
           PyObject_TypeCheck(o, &PyMethodDescr_Type) || Py_TYPE(o) == &PyWrapperDescr_Type ||
           PyMethod_Check(o);
}

bool is_exact_tensor(PyObject* o) {
    const TorchApi& api = torch_api();
    return Py_TYPE(o) == api.tensor_type || Py_TYPE(o) == api.parameter_type;
}

void gather_value(PyObject* o, Gathered& g, int depth = 0);

// `o` is or holds a list (a list's items can change in place).
bool holds_list(PyObject* o, int depth = 0) {
    if (PyList_Check(o)) return true;
    if (!PyTuple_Check(o)) return false;
    if (depth > kMaxNesting) return true;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); ++i)
        if (holds_list(PyTuple_GET_ITEM(o, i), depth + 1)) return true;
    return false;
}

// The position of tensor `o` in g.tensors, added there if it is new.
int tensor_position(PyObject* o, Gathered& g) {
    // The same tensor twice is one graph input (the pattern is part of the key). A linear
    // search while there are few tensors; past that, a hash map (filled once, then kept up).
    int at = -1;
    if (g.tensors.size() < kLinearSearch) {
        auto it = std::find(g.tensors.begin(), g.tensors.end(), o);
        if (it != g.tensors.end()) at = static_cast<int>(it - g.tensors.begin());
    } else {
        if (g.index.empty())
            for (size_t i = 0; i < g.tensors.size(); ++i)
                g.index.find_or_add(g.tensors[i], static_cast<int>(i));
        at = g.index.find_or_add(o, static_cast<int>(g.tensors.size()));
    }
    if (at < 0) {
        at = static_cast<int>(g.tensors.size());
        g.tensors.push_back(o);
        g.state.push_back(g.module_depth > 0);
    }
    return at;
}

// Why tensor `o` cannot be part of a trace's key, or empty. A subclass's __torch_function__
// would run while tracing and never again. An inference tensor (made under
// torch.inference_mode) has no version counter to tell an in-place change by (reading it
// throws), so the recorded steps run.
std::string untraceable_tensor(PyObject* o) {
    if (!is_exact_tensor(o)) return "an input is a tensor subclass (" + py::type_name(o) + ")";
    if (THPVariable_Unpack(o).is_inference())
        return "an input is an inference tensor (made under torch.inference_mode)";
    return {};
}

void add_tensor(PyObject* o, Gathered& g) {
    std::string why = untraceable_tensor(o);
    if (!why.empty()) {
        g.untraceable = std::move(why);
        return;
    }
    g.occurrences.push_back(tensor_position(o, g));
}

void add_other(PyObject* o, bool by_value, Gathered& g) {
    g.others.push_back(o);
    g.by_value.push_back(by_value);
}

// The attribute names of nn.Module's own bookkeeping, interned (compared by pointer first).
struct ModuleNames {
    PyObject* parameters = PyUnicode_InternFromString("_parameters");
    PyObject* buffers = PyUnicode_InternFromString("_buffers");
    PyObject* modules = PyUnicode_InternFromString("_modules");
    PyObject* hooks[4] = {PyUnicode_InternFromString("_forward_hooks"),
                          PyUnicode_InternFromString("_forward_pre_hooks"),
                          PyUnicode_InternFromString("_backward_hooks"),
                          PyUnicode_InternFromString("_backward_pre_hooks")};
};

const ModuleNames& module_names() {
    static const ModuleNames names;  // kept for the process
    return names;
}

bool same_name(PyObject* key, PyObject* name) {  // `name` is interned
    if (key == name) return true;
    return !PyUnicode_CHECK_INTERNED(key) && PyUnicode_CheckExact(key) &&
           PyUnicode_Compare(key, name) == 0;
}

// A class of torch's own (nn.Linear, parametrize's ParametrizationList), as opposed to one a
// user wrote.
bool torch_class(PyTypeObject* t) {
    return names_torch_module(PyDict_GetItemString(t->tp_dict, "__module__"));
}

// The name of a class attribute of a user's class that may change in place (a dict, a list,
// any object that is not a plain value, function, descriptor or class); empty when none.
// (a review probe changed a class-level dict a parametrization read)
std::string class_state(PyTypeObject* c) {
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(c->tp_dict, &pos, &k, &v)) {
        if (PyUnicode_Check(k) && (py::str_of(k) == "__annotations__" || py::str_of(k) == "__dict__" ||
                                   py::str_of(k) == "__weakref__" || py::str_of(k) == "__slots__"))
            continue;
        if (is_plain(v) || PyFunction_Check(v) || PyCFunction_Check(v) || PyType_Check(v) ||
            Py_TYPE(v)->tp_descr_get)  // methods, classmethod, staticmethod, property, slots
            continue;
        return PyUnicode_Check(k) ? py::str_of(k) : std::string("?");
    }
    return "";
}

// The attributes every nn.Module has (the hook and state-dict bookkeeping), read once from a
// bare nn.Module.
bool module_bookkeeping(PyObject* name) {
    // (not a C++ static initializer: making the module runs Python, which may switch threads,
    // and a second thread would wait on the initializer holding the GIL)
    static PyObject* names = nullptr;  // kept for the process; guarded by the GIL
    if (!names) {
        PyObject* bare = PyObject_CallNoArgs(reinterpret_cast<PyObject*>(torch_api().module_type));
        PyObject** dictptr = bare ? _PyObject_GetDictPtr(bare) : nullptr;
        PyObject* keys = dictptr && *dictptr ? PyFrozenSet_New(*dictptr) : nullptr;
        Py_XDECREF(bare);
        if (!keys) {
            PyErr_Clear();
            return false;
        }
        if (!names) names = keys;
        else Py_DECREF(keys);
    }
    int in = PySet_Contains(names, name);
    if (in < 0) PyErr_Clear();
    return in == 1;
}

// A built-in module is called as one op: its parameters, buffers and submodules are read by its
// forward, so they are inputs of the graph; its plain attributes (eps, training, p) are part of
// the key. Other attributes (the hook and state-dict bookkeeping) do not affect forward.
// A module of the user's own class met inside one (a parametrization, whose forward runs in
// the trace) may read anything it holds: its attributes must be plain values, tensors or
// modules (a review probe changed a dict attribute in place), it may keep nothing in
// __slots__, and its classes' dicts are part of the key (class attributes).
void gather_module(PyObject* m, Gathered& g) {
    add_other(m, false, g);
    // and its class (parametrize swaps it: a review probe ran the old class's trace)
    add_other(reinterpret_cast<PyObject*>(Py_TYPE(m)), false, g);
    struct Depth {
        int& d;
        ~Depth() { --d; }
    } depth{++g.module_depth};
    if (g.module_depth > 64) {  // a module that holds itself (a review probe: a crash)
        g.untraceable = "modules nested more than 64 deep";
        return;
    }
    PyObject** dictptr = _PyObject_GetDictPtr(m);
    PyObject* dict = dictptr ? *dictptr : nullptr;
    if (!dict || !PyDict_Check(dict)) {
        g.untraceable = "a module without an instance dict (" + py::type_name(m) + ")";
        return;
    }
    if (g.stamps) {
        PyTypeObject* t = Py_TYPE(m);
        static PyObject* probe = PyUnicode_InternFromString("forward");
        (void)_PyType_Lookup(t, probe);  // gives the class a valid version tag
        if (!PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG)) g.saw_list = true;  // (not kept)
        g.stamps->push_back({dict, py::dict_version(dict), m, t, t->tp_version_tag});
    }
    const TorchApi& api = torch_api();
    const bool users = !torch_class(Py_TYPE(m));
    if (users) {
        if (Py_TYPE(m)->tp_basicsize != api.module_type->tp_basicsize) {
            g.untraceable = "module " + py::type_name(m) + " keeps state in __slots__";
            return;
        }
        PyObject* mro = Py_TYPE(m)->tp_mro;
        for (Py_ssize_t i = 0; mro && i < PyTuple_GET_SIZE(mro); ++i) {
            auto* c = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i));
            if (c == api.module_type) break;
            if (!c->tp_dict || !PyDict_Check(c->tp_dict)) continue;
            std::string held = class_state(c);
            if (!held.empty()) {
                g.untraceable = "class " + std::string(c->tp_name) + " holds `" + held +
                                "`, whose changes the trace cannot see";
                return;
            }
            py::Ref version = py::Ref::steal(PyLong_FromUnsignedLongLong(py::dict_version(c->tp_dict)));
            g.owned.push_back(version);
            add_other(version.get(), true, g);
            if (g.stamps) g.stamps->push_back({c->tp_dict, py::dict_version(c->tp_dict)});
        }
    }
    const ModuleNames& names = module_names();
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        if (!PyUnicode_Check(key)) continue;
        if (PyUnicode_GET_LENGTH(key) > 0 && PyUnicode_READ_CHAR(key, 0) == '_') {
            if (same_name(key, names.parameters) || same_name(key, names.buffers) ||
                same_name(key, names.modules)) {
                if (!PyDict_Check(value)) continue;
                if (g.stamps) g.stamps->push_back({value, py::dict_version(value)});
                PyObject *k2, *v2;
                Py_ssize_t pos2 = 0;
                while (PyDict_Next(value, &pos2, &k2, &v2)) gather_value(v2, g);
                continue;
            }
            bool hook = false;
            for (PyObject* h : names.hooks) hook = hook || same_name(key, h);
            if (hook) {
                if (g.stamps && PyDict_Check(value))  // a hook added fills it in place
                    g.stamps->push_back({value, py::dict_version(value)});
                if (PyDict_Check(value) && PyDict_GET_SIZE(value) > 0)
                    g.untraceable = "module " + py::type_name(m) + " has " + py::str_of(key);
                continue;
            }
        }
        if (g.stamps && holds_list(value)) g.saw_list = true;
        if (users && !is_plain(value) && !is_tensor(value) && !module_bookkeeping(key)) {
            g.untraceable = "module " + py::type_name(m) + " holds `" + py::str_of(key) +
                            "`, a " + py::type_name(value) + " whose changes the trace cannot see";
            return;
        }
        if (is_plain(value)) add_other(value, true, g);
        else if (is_tensor(value)) add_tensor(value, g);
        else add_other(value, false, g);  // functions, numpy scalars (eps), anything else: the
                                          // same object (a review probe: np.float64 slopes
                                          // changed between calls were left out of the key)
    }
}

void gather_value(PyObject* o, Gathered& g, int depth) {
    const TorchApi& api = torch_api();
    if (is_tensor(o)) add_tensor(o, g);
    else if (PyObject_TypeCheck(o, api.module_type)) gather_module(o, g);
    else if (is_plain(o)) add_other(o, true, g);
    else if (is_function_like(o)) add_other(o, false, g);
    else if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
        // A list of tensors (torch.cat's argument made outside the region).
        if (depth > kMaxNesting) {
            g.untraceable = "an input holds lists nested more than " +
                            std::to_string(kMaxNesting) + " deep";
            return;
        }
        if (g.stamps) g.saw_list = true;
        add_other(reinterpret_cast<PyObject*>(Py_TYPE(o)), false, g);
        Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
        g.occurrences.push_back(-1 - static_cast<int>(n));  // the length, in the pattern
        for (Py_ssize_t i = 0; i < n; ++i) gather_value(PySequence_Fast_GET_ITEM(o, i), g, depth + 1);
    } else {
        g.untraceable = "an input is a " + py::type_name(o);
    }
}

// [Note: module state by dict versions] Most of a region's inputs are modules (a model's
// layers), and gathering one walks its __dict__ and its parameter, buffer and submodule dicts:
// thousands of Python objects for a model, on every call, most of them far from the cache
// after the model's own run. A module's gathering is therefore kept (its part of the key)
// together with the dicts it read and their versions (py::dict_version), and used again while
// every one of those dicts is unchanged: their values are then the same objects, so the walk
// would find what it found before. What can change without a dict changing is still read
// afresh: each tensor's metadata and version (Spec::matches), the items of lists (compared
// by value there), and whether a tensor's class is still torch's own (merge_part).
// The dicts are checked in the order they were read, each reached from one checked before it
// (the first from the module passed in, which is alive), so no freed dict is ever read; a dict
// made later at a freed one's address has a version no dict had before.
struct ModuleMemo {
    PyObject* module = nullptr;  // compared only; null: nothing kept
    uint64_t made = 0;           // how many times it was made (tells one making from another)
    std::vector<DictStamp> stamps;
    Gathered part;  // what gather_module(module) gathers, on its own

    bool holds_for(PyObject* m) const {
        if (m != module) return false;
        for (const DictStamp& d : stamps) {
            if (d.module) {
                if (Py_TYPE(d.module) != d.type ||
                    !PyType_HasFeature(d.type, Py_TPFLAGS_VALID_VERSION_TAG) ||
                    d.type->tp_version_tag != d.type_tag)
                    return false;  // (before any class dict: __bases__ may have changed)
                PyObject** dictptr = _PyObject_GetDictPtr(d.module);
                if (!dictptr || *dictptr != d.dict) return false;
            }
            if (py::dict_version(d.dict) != d.version) return false;
        }
        return true;
    }

    // Gathers module `m` afresh, noting the dicts read. False when its state cannot be
    // traced (then nothing is kept, and `part.untraceable` says why).
    bool remake(PyObject* m) {
        module = nullptr;
        ++made;
        stamps.clear();
        part.clear();
        part.stamps = &stamps;
        gather_module(m, part);
        part.stamps = nullptr;
        if (!part.untraceable.empty()) return false;
        if (!part.saw_list) module = m;  // else gathered again next call
        return true;
    }
};

// Appends a module's kept gathering to `g`, as gathering it there would have: its tensors take
// their positions among g's (one seen before keeps its own), its other values follow g's.
void merge_part(const Gathered& part, Gathered& g, std::vector<int>& positions) {
    positions.resize(part.tensors.size());
    ++g.module_depth;
    for (size_t i = 0; i < part.tensors.size(); ++i) {
        std::string why = untraceable_tensor(part.tensors[i]);  // (its class was set since)
        if (!why.empty()) {
            g.untraceable = std::move(why);
            break;
        }
        positions[i] = tensor_position(part.tensors[i], g);
    }
    --g.module_depth;
    for (int at : part.occurrences) g.occurrences.push_back(at < 0 ? at : positions[static_cast<size_t>(at)]);
    g.others.insert(g.others.end(), part.others.begin(), part.others.end());
    g.by_value.insert(g.by_value.end(), part.by_value.begin(), part.by_value.end());
}

// The key one trace was made for. Values compared by value are copied (a list may change).
struct TensorKey {
    c10::ScalarType dtype;
    c10::Device device = c10::Device(c10::kCPU);
    c10::Layout layout;
    bool requires_grad = false;
    std::vector<int64_t> sizes;
    std::vector<int64_t> strides;  // strided layouts only

    static TensorKey of(const at::Tensor& t) {
        bool strided = t.layout() == c10::kStrided;
        return {t.scalar_type(), t.device(), t.layout(), t.requires_grad(), t.sizes().vec(),
                strided ? t.strides().vec() : std::vector<int64_t>()};
    }
    bool matches(const at::Tensor& t) const {
        return t.scalar_type() == dtype && t.device() == device && t.layout() == layout &&
               t.requires_grad() == requires_grad && t.sizes().equals(sizes) &&
               (layout != c10::kStrided || t.strides().equals(strides));
    }
};

struct OtherKey {
    py::Ref value;            // by value: a copy
    py::WeakOrStrong object;  // by identity
    bool by_value = false;
};

// A copy of a value compared by value that no later change to the original reaches: lists,
// and tuples holding lists, are copied (the same object again would compare equal to itself).
py::Ref snapshot(PyObject* o) {
    const bool list = PyList_CheckExact(o);
    if (!list && !(PyTuple_CheckExact(o) && holds_list(o)))  // (plain: nested kMaxNesting at most)
        return py::Ref::borrow(o);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    py::Ref copy = py::Ref::steal(list ? PyList_New(n) : PyTuple_New(n));
    if (!copy) return {};
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* item = snapshot(PySequence_Fast_GET_ITEM(o, i)).release();
        if (list) PyList_SET_ITEM(copy.get(), i, item);
        else PyTuple_SET_ITEM(copy.get(), i, item);
    }
    return copy;
}

// A module tensor folded into an inference graph as a constant ([Note: torchscript backend]):
// the graph holds while the module holds the same tensor, unchanged in place and not re-pointed.
struct FrozenKey {
    py::WeakOrStrong object;
    uint32_t version = 0;
    const void* data = nullptr;

    static FrozenKey of(PyObject* o) {
        const at::Tensor& t = THPVariable_Unpack(o);
        return {py::WeakOrStrong::make(o), t.unsafeGetTensorImpl()->version_counter().current_version(),
                t.unsafeGetTensorImpl()->has_storage() ? t.data_ptr() : nullptr};
    }
    bool matches(PyObject* o) const {
        if (object.get() != o) return false;
        const at::Tensor& t = THPVariable_Unpack(o);
        return t.unsafeGetTensorImpl()->version_counter().current_version() == version &&
               (t.unsafeGetTensorImpl()->has_storage() ? t.data_ptr() : nullptr) == data;
    }
};

struct Spec {
    std::vector<TensorKey> tensors;
    std::vector<int> occurrences;
    std::vector<OtherKey> others;
    bool grad_mode = true;
    // Per tensor: folded into the graph (then `frozen_keys` has its key), else a graph input.
    std::vector<bool> frozen;
    std::vector<FrozenKey> frozen_keys;
    std::shared_ptr<jit::Graph> graph;
    std::unique_ptr<jit::GraphExecutor> exec;  // null: inputs like these run eagerly
    std::string eager_why;
    uint64_t runs = 0;
    // The traced run changed an input in place (an in-place op on a view of it): a failed
    // graph run cannot be repeated step by step, so its error is raised as it is.
    bool mutates_inputs = false;
    // Per output: computed from constants alone, so the executor folds it into one tensor that
    // every run returns; copied for the caller, who owns a new tensor in eager (see
    // constant_outputs)
    std::vector<bool> clone_out;
    // [Note: code a trace ran] The dicts the traced Python code was found through, with their
    // versions: the globals of every Python function the trace ran (F.relu rebound in
    // torch.nn.functional) and the class dicts of the modules it called (nn.ReLU.forward
    // replaced). A trace holds only while they are unchanged (a review probe monkeypatched
    // F.relu after the capture, and the old trace ran on).
    std::vector<std::pair<py::Ref, uint64_t>> code_dicts;

    bool matches(const Gathered& g) const {
        for (const auto& [d, version] : code_dicts)
            if (py::dict_version(d.get()) != version) return false;
        if (g.tensors.size() != tensors.size() || g.others.size() != others.size() ||
            g.occurrences != occurrences || at::GradMode::is_enabled() != grad_mode)
            return false;
        for (size_t i = 0; i < tensors.size(); ++i)
            if (!tensors[i].matches(THPVariable_Unpack(g.tensors[i]))) return false;
        for (size_t i = 0, k = 0; i < frozen.size(); ++i)
            if (frozen[i] && !frozen_keys[k++].matches(g.tensors[i])) return false;
        auto known = g.known.begin();
        for (size_t i = 0; i < others.size(); ++i) {
            const OtherKey& k = others[i];
            while (known != g.known.end() && known->second <= i) ++known;
            if (known != g.known.end() && known->first <= i) {
                // the same object as when this key last matched: only a list's items (in a
                // copy here, so never the same object) may differ
                if (!k.by_value || k.value.get() == g.others[i]) continue;
            }
            if (k.by_value != g.by_value[i]) return false;
            if (!k.by_value) {
                if (k.object.get() != g.others[i]) return false;
                continue;
            }
            if (!same_constant(k.value.get(), g.others[i])) return false;  // -0.0 is not 0.0
        }
        return true;
    }

    static std::unique_ptr<Spec> key_of(const Gathered& g) {
        auto s = std::make_unique<Spec>();
        for (PyObject* o : g.tensors) {
            s->tensors.push_back(TensorKey::of(THPVariable_Unpack(o)));
        }
        s->occurrences = g.occurrences;
        s->grad_mode = at::GradMode::is_enabled();
        s->frozen.assign(g.tensors.size(), false);
        for (size_t i = 0; i < g.others.size(); ++i) {
            OtherKey k;
            k.by_value = g.by_value[i];
            if (k.by_value) k.value = snapshot(g.others[i]);
            else k.object = py::WeakOrStrong::make(g.others[i]);
            s->others.push_back(std::move(k));
        }
        return s;
    }
};

// [SECTION] tracing ----------------------------------------------------------------------------

// Whether a tensor of `ts` is in a channels-last layout (and not also plainly contiguous).
bool any_channels_last(const std::vector<PyObject*>& ts) {
    for (PyObject* o : ts) {
        const at::Tensor& t = THPVariable_Unpack(o);
        if ((t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast) && !t.is_contiguous()) ||
            (t.dim() == 5 && t.is_contiguous(at::MemoryFormat::ChannelsLast3d) && !t.is_contiguous()))
            return true;
    }
    return false;
}

// Whether the traced graph gives a channels_last tensor (made so inside:
// `x.contiguous(memory_format=torch.channels_last)`), by the strides the trace recorded.
bool outputs_channels_last(const jit::Graph& graph) {
    std::vector<const jit::Value*> outs;
    for (const jit::Value* v : graph.outputs()) {
        if (v->node()->kind() == c10::prim::TupleConstruct)
            for (const jit::Value* in : v->node()->inputs()) outs.push_back(in);
        else
            outs.push_back(v);
    }
    for (const jit::Value* v : outs) {
        auto tt = v->type()->cast<c10::TensorType>();
        if (!tt) continue;
        auto sizes = tt->sizes().concrete_sizes();
        auto strides = tt->strides().concrete_sizes();
        if (!sizes || !strides || sizes->size() != strides->size()) continue;
        if ((sizes->size() == 4 && c10::is_channels_last_strides_2d(*sizes, *strides)) ||
            (sizes->size() == 5 && c10::is_channels_last_strides_3d(*sizes, *strides)))
            return true;
    }
    return false;
}

uint32_t version_of(PyObject* t) {
    return THPVariable_Unpack(t).unsafeGetTensorImpl()->version_counter().current_version();
}

// Functions of torch whose Python code turns traced sizes into Python numbers (the tracer hands
// sizes to Python as tensors) and nothing else: a trace is only reused for the same sizes,
// dtypes and module attributes, so what they computed holds. Anywhere else (batch norm's
// `1.0 / float(num_batches_tracked)` with momentum=None, say) the number may come from tensor
// data, and the trace is not used.
struct TrustedSite {
    std::string file;
    int first = 0, last = 0;
};

const std::vector<TrustedSite>& trusted_sites() {
    static const std::vector<TrustedSite> sites = [] {
        static const char* kFunctions[][2] = {
            {"torch.nn.modules.rnn", "RNNBase.check_input"},
            {"torch.nn.modules.rnn", "RNNBase.get_expected_hidden_size"},
            {"torch.nn.modules.rnn", "RNNBase.check_hidden_size"},
            {"torch.nn.modules.rnn", "RNNBase.check_forward_args"},
            {"torch.nn.modules.rnn", "RNNBase.forward"},
            {"torch.nn.modules.rnn", "RNN.forward"},
            {"torch.nn.modules.rnn", "LSTM.get_expected_cell_size"},
            {"torch.nn.modules.rnn", "LSTM.check_forward_args"},
            {"torch.nn.modules.rnn", "LSTM.forward"},
            {"torch.nn.modules.rnn", "GRU.forward"},
            {"torch.nn.modules.rnn", "RNNCell.forward"},
            {"torch.nn.modules.rnn", "LSTMCell.forward"},
            {"torch.nn.modules.rnn", "GRUCell.forward"},
            {"torch.nn.functional", "multi_head_attention_forward"},
            {"torch.nn.functional", "_mha_shape_check"},
            {"torch.nn.functional", "_in_projection_packed"},
            {"torch.nn.functional", "_in_projection"},
            {"torch.nn.functional", "_scaled_dot_product_attention"},
            {"torch.nn.functional", "_verify_batch_size"},
            {"torch.nn.functional", "_verify_spatial_size"},
            {"torch.nn.functional", "interpolate"},
            {"torch.nn.functional", "_pad"},
            {"torch.nn.functional", "pad"},
            {"torch.nn.modules.activation", "MultiheadAttention.forward"},
        };
        std::vector<TrustedSite> out;
        for (const auto& f : kFunctions) {
            py::Ref obj = py::Ref::steal(PyImport_ImportModule(f[0]));
            std::string path = f[1];
            for (size_t start = 0; obj && start <= path.size();) {
                size_t dot = path.find('.', start);
                std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
                obj = py::Ref::steal(PyObject_GetAttrString(obj.get(), part.c_str()));
                start = dot == std::string::npos ? path.size() + 1 : dot + 1;
            }
            py::Ref code = obj ? py::Ref::steal(PyObject_GetAttrString(obj.get(), "__code__"))
                               : py::Ref();
            PyErr_Clear();  // absent in this torch version: nothing to trust
            if (!code || !PyCode_Check(code.get())) continue;
            auto* co = reinterpret_cast<PyCodeObject*>(code.get());
            TrustedSite site{py::str_of(co->co_filename), co->co_firstlineno, co->co_firstlineno};
            py::Ref lines = py::Ref::steal(PyObject_CallMethod(code.get(), "co_lines", nullptr));
            py::Ref it = lines ? py::Ref::steal(PyObject_GetIter(lines.get())) : py::Ref();
            while (it) {
                py::Ref t = py::Ref::steal(PyIter_Next(it.get()));
                if (!t) break;
                if (PyTuple_Check(t.get()) && PyTuple_GET_SIZE(t.get()) == 3) {
                    long l = PyLong_AsLong(PyTuple_GET_ITEM(t.get(), 2));
                    if (l > site.last) site.last = static_cast<int>(l);
                }
                PyErr_Clear();
            }
            PyErr_Clear();
            out.push_back(std::move(site));
        }
        return out;
    }();
    return sites;
}

bool trusted_site(const std::string& file, long line) {
    for (const TrustedSite& s : trusted_sites())
        if (line >= s.first && line <= s.last && s.file == file) return true;
    return false;
}

// Records the TracerWarnings shown while tracing (magpy._effects.TracerWarningLog); the user's
// own warnings are shown as they would be without the trace. The tracer's warnings make the
// trace unusable unless raised at a trusted site (above).
class WarningLog {
public:
    bool begin() {
        py::Ref mod = py::Ref::steal(PyImport_ImportModule("magpy._effects"));
        m_log = mod ? py::Ref::steal(PyObject_CallMethod(mod.get(), "TracerWarningLog", nullptr))
                    : py::Ref();
        py::Ref r = m_log ? py::Ref::steal(PyObject_CallMethod(m_log.get(), "__enter__", nullptr))
                          : py::Ref();
        return static_cast<bool>(r);
    }

    // The tracer warnings raised outside the trusted sites, as "file:line: message". Keeps a
    // pending Python error as it is.
    std::vector<std::string> end() {
        std::vector<std::string> tracer;
        if (!m_log) return tracer;
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        py::Ref r = py::Ref::steal(
            PyObject_CallMethod(m_log.get(), "__exit__", "OOO", Py_None, Py_None, Py_None));
        py::Ref seen = r ? py::Ref::steal(PyObject_GetAttrString(m_log.get(), "seen")) : py::Ref();
        PyErr_Clear();
        Py_ssize_t n = seen && PyList_Check(seen.get()) ? PyList_GET_SIZE(seen.get()) : 0;
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* w = PyList_GET_ITEM(seen.get(), i);  // (message, filename, lineno)
            if (!PyTuple_Check(w) || PyTuple_GET_SIZE(w) != 3) continue;
            std::string where = py::str_of(PyTuple_GET_ITEM(w, 1));
            long lineno = PyLong_AsLong(PyTuple_GET_ITEM(w, 2));
            PyErr_Clear();
            if (!trusted_site(where, lineno))
                tracer.push_back(where + ":" + std::to_string(lineno) + ": " +
                                 py::str_of(PyTuple_GET_ITEM(w, 0)));
        }
        py::Ref others = r ? py::Ref::steal(PyObject_GetAttrString(m_log.get(), "python_warnings"))
                           : py::Ref();
        PyErr_Clear();
        m_python_warnings.clear();
        for (Py_ssize_t i = 0; others && PyList_Check(others.get()) && i < PyList_GET_SIZE(others.get()); ++i)
            m_python_warnings.push_back(py::str_of(PyList_GET_ITEM(others.get(), i)));
        PyErr_Restore(et, ev, tb);
        return tracer;
    }

    // The other warnings Python code gave through warnings.warn while tracing (after end()):
    // the graph would not give them on later calls.
    const std::vector<std::string>& python_warnings() const { return m_python_warnings; }

private:
    py::Ref m_log;
    std::vector<std::string> m_python_warnings;
};

// [Note: x + 0] LibTorch's peephole pass, run by the graph executor, drops `x + 0` when the 0
// is an integer: x's -0.0 then stays -0.0 where Python gives +0.0 (a review probe: `1 / (y +
// 0)` gave -inf for inf). When x is floating, the traced 0 becomes a 0.0 of x's dtype, the same
// sum, which the pass leaves alone (it keeps adds whose scalar is floating).
static void keep_adds_of_zero(jit::Block* block) {
    for (jit::Node* n : block->nodes()) {
        for (jit::Block* b : n->blocks()) keep_adds_of_zero(b);
        if (n->kind() != c10::Symbol::fromQualString("aten::add") || n->inputs().size() < 2)
            continue;
        c10::optional<c10::IValue> other = jit::toIValue(n->input(1));
        bool int_zero = other && ((other->isInt() && other->toInt() == 0) ||
                                  (other->isTensor() && other->toTensor().dim() == 0 &&
                                   !other->toTensor().is_floating_point() &&
                                   !other->toTensor().is_complex() &&
                                   other->toTensor().item<int64_t>() == 0));
        auto self = n->input(0)->type()->cast<c10::TensorType>();
        if (!int_zero || !self || !self->scalarType() || !at::isFloatingType(*self->scalarType()))
            continue;
        jit::WithInsertPoint here(n);
        // (of x's own dtype: a 0-dim x plus a 0-dim double would be double)
        jit::Value* zero =
            other->isTensor()
                ? block->owningGraph()->insertConstant(at::scalar_tensor(0.0, *self->scalarType()))
                : block->owningGraph()->insertConstant(0.0);
        n->replaceInput(1, zero);
    }
}

std::string first_line(const std::string& s) {
    std::string line = s.substr(0, s.find('\n'));
    return line.size() > 200 ? line.substr(0, 200) + "..." : line;
}

// [SECTION] running ----------------------------------------------------------------------------

// The marker a region raises when its steps gave up for the user's try block: the plan step
// that called the region is inside that try block too, and hands the call to eager execution.
// Autocast changes which kernels ops dispatch to; a trace made with it on or off would bake
// that in, so regions under autocast (and inference mode) run their recorded steps.
bool dispatch_mode_on() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    bool autocast = at::autocast::is_autocast_enabled(at::kCPU) ||
                    at::autocast::is_autocast_enabled(at::kCUDA);
#else
    bool autocast = at::autocast::is_cpu_enabled() || at::autocast::is_enabled();
#endif
    return autocast || c10::InferenceMode::is_enabled();
}

// [Note: warnings from a graph] The ops of a TorchScript graph run in LibTorch with no Python
// handler for their warnings, which c10 would log to stderr. The graph's run collects them
// instead. If any came, the graph is not used for those inputs again, so that later calls run
// the steps and each warning names its own line ([Note: site frames] in plan.cpp); and this
// call's outputs are dropped and the steps run instead, which gives the warnings exactly as
// eager does. Where the steps cannot run twice (the graph changed an input in place, or drew
// random numbers), the warnings are filed as torch's Python bindings file them (through
// torch::PyWarningHandler) at the site of the step whose op the message names first, or the
// region's first step. The trace ran the steps, so it filed them right already.
// Where `text` first has `word` as a whole word ("masked_fill_" in "Use of masked_fill_ on
// expanded tensors", but not "expand"), or npos.
size_t word_at(const std::string& text, const std::string& word) {
    auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    for (size_t at = text.find(word); !word.empty() && at != std::string::npos;
         at = text.find(word, at + 1)) {
        size_t end = at + word.size();
        if ((at == 0 || !ident(text[at - 1])) && (end == text.size() || !ident(text[end])))
            return at;
    }
    return std::string::npos;
}

class WarningBuffer final : public c10::WarningHandler {
public:
#if TORCH_VERSION_MAJOR >= 2
    void process(const c10::Warning& w) override { m_warnings.push_back(w); }
    const std::string& text(size_t i) const { return m_warnings[i].msg(); }
    void reissue() const {
        for (const c10::Warning& w : m_warnings) c10::warn(w);
    }
    using Guard = c10::WarningUtils::WarningHandlerGuard;
#else
    void process(const c10::SourceLocation& where, const std::string& msg,
                 bool verbatim) override {
        m_warnings.push_back({where, msg, verbatim});
    }
    const std::string& text(size_t i) const { return m_warnings[i].msg; }
    void reissue() const {
        for (const Entry& w : m_warnings) c10::Warning::warn(w.where, w.msg, w.verbatim);
    }
    using Guard = c10::Warning::WarningHandlerGuard;
#endif
    size_t size() const { return m_warnings.size(); }

private:
#if TORCH_VERSION_MAJOR >= 2
    std::vector<c10::Warning> m_warnings;
#else
    struct Entry {
        c10::SourceLocation where;
        std::string msg;
        bool verbatim;
    };
    std::vector<Entry> m_warnings;
#endif
};

// Whether the traced graph makes a tensor that requires grad from values that do not (a leaf
// of its own): the graph executor's outputs then lose the flag, and gradients with it. Seen
// in the graph's types, or (`x.detach().requires_grad_()`, which the tracer does not record)
// as an output of the traced run (`outputs`, a tuple) that requires grad where its type in
// the graph does not.
// [Note: outputs made of constants] An output of the graph that depends on no graph input
// (`torch.zeros(3)`, a causal mask from constant sizes, under freezing `lin.weight * 2`) is
// folded by the executor into a constant: every run would hand the caller the same tensor,
// which eager makes anew each call, so a caller that changes it (an accumulator) would change
// the next call's result (a review probe). Those outputs are copied after each run.
std::vector<bool> constant_outputs(const jit::Graph& graph) {
    std::unordered_map<const jit::Value*, bool> from_input;
    for (const jit::Value* in : graph.inputs()) from_input[in] = true;
    for (const jit::Node* n : graph.nodes()) {
        bool any = false;
        for (const jit::Value* in : n->inputs()) any = any || from_input[in];
        for (const jit::Value* out : n->outputs()) from_input[out] = any;
    }
    std::vector<bool> out;
    for (const jit::Value* v : graph.outputs()) out.push_back(!from_input[v]);
    return out;
}

bool makes_grad_leaf(const jit::Graph& graph, PyObject* outputs) {
    auto needs = [](const jit::Value* v) {
        c10::TensorTypePtr t = v->type()->cast<c10::TensorType>();
        return t && t->requiresGrad().value_or(false);
    };
    auto outs = graph.outputs();
    for (size_t i = 0; outputs && PyTuple_Check(outputs) && i < outs.size() &&
                       i < static_cast<size_t>(PyTuple_GET_SIZE(outputs));
         ++i) {
        PyObject* o = PyTuple_GET_ITEM(outputs, static_cast<Py_ssize_t>(i));
        if (is_exact_tensor(o) && THPVariable_Unpack(o).requires_grad() && !needs(outs[i]))
            return true;
    }
    std::unordered_set<const jit::Value*> derived;
    for (const jit::Value* in : graph.inputs())
        if (needs(in)) derived.insert(in);
    for (const jit::Node* n : graph.nodes()) {
        bool from_grad = false;
        for (const jit::Value* in : n->inputs()) from_grad = from_grad || derived.count(in);
        for (const jit::Value* out : n->outputs()) {
            if (from_grad) derived.insert(out);  // (lists of tensors too: cat, chunk)
            else if (needs(out)) return true;
        }
    }
    return false;
}

// The globals of a module of torch's own. Only those are watched: a user's module rebinds its
// globals all the time (a loop at the top of a script, every notebook cell), and so does the
// warnings module while a warning is shown (review probes: every call retraced).
bool torch_globals(PyObject* globals) {
    return names_torch_module(PyDict_GetItemString(globals, "__name__"));
}

// The globals dicts of the Python functions of torch that run while it is alive ([Note: code a
// trace ran]), by a profile function put in place of the thread's own for that time.
class CodeWatch {
public:
    CodeWatch() {
        PyThreadState* ts = PyThreadState_Get();
        m_func = ts->c_profilefunc;
        m_obj = py::Ref::borrow(ts->c_profileobj);
        m_self = py::Ref::steal(PyCapsule_New(this, nullptr, nullptr));
        if (m_self) PyEval_SetProfile(&CodeWatch::on_event, m_self.get());
        else PyErr_Clear();
    }
    ~CodeWatch() {
        if (m_self) PyEval_SetProfile(m_func, m_obj.get());
    }
    const std::vector<py::Ref>& dicts() const { return m_dicts; }

private:
    static int on_event(PyObject* self, PyFrameObject* frame, int what, PyObject*) {
        if (what != PyTrace_CALL) return 0;
        auto* w = static_cast<CodeWatch*>(PyCapsule_GetPointer(self, nullptr));
        PyObject* globals = w ? PyFrame_GetGlobals(frame) : nullptr;  // new reference
        if (!globals) {
            PyErr_Clear();
            return 0;
        }
        bool seen = false;
        for (const py::Ref& d : w->m_dicts) seen = seen || d.get() == globals;
        if (!seen && PyDict_Check(globals) && w->m_dicts.size() < 64 && torch_globals(globals))
            w->m_dicts.push_back(py::Ref::borrow(globals));
        Py_DECREF(globals);
        return 0;
    }
    Py_tracefunc m_func = nullptr;
    py::Ref m_obj, m_self;
    std::vector<py::Ref> m_dicts;
};

// The class dicts of the modules among a key's values, their bases' up to nn.Module's, and
// torch.Tensor's (its Python methods, `Tensor.unflatten`, and operators a program may rebind:
// a review probe).
void note_module_classes(const Gathered& g, std::vector<std::pair<py::Ref, uint64_t>>& out) {
    const TorchApi& api = torch_api();
    PyObject* tensor_mro = api.tensor_type->tp_mro;
    for (Py_ssize_t i = 0; tensor_mro && i < PyTuple_GET_SIZE(tensor_mro); ++i) {
        auto* c = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(tensor_mro, i));
        if (c == &PyBaseObject_Type || !c->tp_dict || !PyDict_Check(c->tp_dict)) continue;
        out.emplace_back(py::Ref::borrow(c->tp_dict), py::dict_version(c->tp_dict));
    }
    for (PyObject* o : g.others) {
        if (!PyType_Check(o) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(o), api.module_type))
            continue;
        PyObject* mro = reinterpret_cast<PyTypeObject*>(o)->tp_mro;
        for (Py_ssize_t i = 0; mro && i < PyTuple_GET_SIZE(mro); ++i) {
            PyObject* d = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i))->tp_dict;
            bool seen = false;
            for (const auto& kept : out) seen = seen || kept.first.get() == d;
            if (d && PyDict_Check(d) && !seen) out.emplace_back(py::Ref::borrow(d), py::dict_version(d));
            if (PyTuple_GET_ITEM(mro, i) == reinterpret_cast<PyObject*>(api.module_type)) break;
        }
    }
}

class Region {
public:
    Region(int number, Plan sub, size_t graph_ops, size_t steps, bool freeze)
        : m_number(number), m_freeze(freeze), m_sub(std::move(sub)), m_graph_ops(graph_ops),
          m_steps(steps) {}

    // A tuple of the region's outputs (new reference), or NULL with a Python error.
    PyObject* call(PyObject* const* args) {
        // Reused between calls (no allocation per call); the GIL is held, and a region's
        // steps never call back into another compiled function.
        Gathered& g = m_gathered;
        g.clear();
        if (m_memos.size() != m_sub_inputs) m_memos.resize(m_sub_inputs);
        const TorchApi& api = torch_api();
        if (m_last_made.size() != m_sub_inputs) m_last_made.assign(m_sub_inputs, 0);
        for (size_t i = 0; i < m_sub_inputs && g.untraceable.empty(); ++i) {
            ModuleMemo& memo = m_memos[i];
            if (!PyObject_TypeCheck(args[i], api.module_type)) {
                gather_value(args[i], g);
            } else if (memo.holds_for(args[i]) || memo.remake(args[i])) {
                size_t first = g.others.size();
                merge_part(memo.part, g, m_positions);
                if (memo.made == m_last_made[i]) g.known.emplace_back(first, g.others.size());
            } else {
                g.untraceable = memo.part.untraceable;
            }
        }
        if (!g.untraceable.empty()) return run_eagerly(args, "inputs: " + g.untraceable);
        if (dispatch_mode_on())
            return run_eagerly(args, "autocast or inference mode is on (a trace would fix "
                                     "which kernels run)");
        Spec* found = m_last && m_last->matches(g) ? m_last : nullptr;
        g.known.clear();  // they are the objects m_last saw, not any other key's
        for (size_t i = 0; i < m_specs.size() && !found; ++i)
            if (m_specs[i]->matches(g)) found = m_specs[i].get();
        if (found) {
            m_last = found;
            for (size_t i = 0; i < m_sub_inputs; ++i) m_last_made[i] = m_memos[i].made;
            return found->exec ? run_graph(*found, args, g) : run_eagerly(args, "");
        }
        if (m_specs.size() >= kMaxSpecs)
            return run_eagerly(args, "more than " + std::to_string(kMaxSpecs) +
                                         " different input shapes or module states");
        return trace(args, g);
    }

    void set_input_count(size_t n) { m_sub_inputs = n; }
    int number() const { return m_number; }
    size_t graph_ops() const { return m_graph_ops; }
    size_t steps() const { return m_steps; }
    size_t traced() const {
        size_t n = 0;
        for (const auto& s : m_specs) n += s->exec ? 1 : 0;
        return n;
    }
    uint64_t graph_runs() const {
        uint64_t n = 0;
        for (const auto& s : m_specs) n += s->runs;
        return n;
    }
    uint64_t eager_runs() const { return m_eager_runs; }
    int64_t trace_ns() const { return m_trace_ns; }
    const std::vector<std::string>& notes() const { return m_notes; }
    std::string kernels() const { return m_onednn.text(); }
    std::string graph_text() const {
        for (const auto& s : m_specs)
            if (s->graph) return s->graph->toString();
        return "";
    }

private:
    void note(const std::string& why) {
        std::string n = "torchscript graph " + std::to_string(m_number) + " runs eagerly for " +
                        "some inputs: " + why;
        if (std::find(m_notes.begin(), m_notes.end(), n) == m_notes.end() && m_notes.size() < 8)
            m_notes.push_back(n);
    }

    PyObject* run_eagerly(PyObject* const* args, const std::string& why) {
        if (!why.empty()) note(why);
        ++m_eager_runs;
        Declined d = Declined::No;
        PyObject* r = m_sub.run(args, d);
        if (!r && !PyErr_Occurred()) raise_region_declined();
        return r;
    }

    // [Note: outputs made of constants]: each storage they live in is copied once, and they
    // become views of the copy as they were of the original (a buffer and a view of it stay
    // one tensor and its view: a review probe).
    // A storage that an output computed from inputs lives in too (a buffer of zeros filled
    // from the input in place, returned with a view of it) is not a constant's: left alone.
    static void copy_constant_outputs(jit::Stack& stack, const std::vector<bool>& clone_out) {
        if (std::find(clone_out.begin(), clone_out.end(), true) == clone_out.end()) return;
        auto storage_of = [&](size_t i) -> const void* {
            return stack[i].isTensor() && stack[i].toTensor().has_storage()
                       ? stack[i].toTensor().storage().unsafeGetStorageImpl()
                       : nullptr;
        };
        std::vector<const void*> live;  // storages of outputs computed from inputs
        for (size_t i = 0; i < stack.size(); ++i)
            if (!(i < clone_out.size() && clone_out[i]) && storage_of(i)) live.push_back(storage_of(i));
        std::vector<std::pair<const void*, at::Tensor>> copies;  // storage -> its copy
        for (size_t i = 0; i < stack.size() && i < clone_out.size(); ++i) {
            if (!clone_out[i] || !storage_of(i)) continue;
            const void* storage = storage_of(i);
            if (std::find(live.begin(), live.end(), storage) != live.end()) continue;
            at::Tensor t = stack[i].toTensor();
            at::Tensor* whole = nullptr;
            for (auto& [s, c] : copies)
                if (s == storage && c.scalar_type() == t.scalar_type()) whole = &c;
            if (!whole) {
                int64_t n = static_cast<int64_t>(t.storage().nbytes()) /
                            static_cast<int64_t>(t.element_size());
                copies.emplace_back(storage, t.as_strided({n}, {1}, 0).clone());
                whole = &copies.back().second;
            }
            stack[i] = whole->as_strided(t.sizes(), t.strides(), t.storage_offset());
        }
    }

    PyObject* wrap_outputs(jit::Stack& stack, const std::vector<bool>& clone_out) {
        py::Ref out = py::Ref::steal(PyTuple_New(static_cast<Py_ssize_t>(stack.size())));
        if (!out) return nullptr;
        copy_constant_outputs(stack, clone_out);
        for (size_t i = 0; i < stack.size(); ++i) {
            if (!stack[i].isTensor()) return nullptr;
            PyObject* t = THPVariable_Wrap(stack[i].toTensor());
            if (!t) return nullptr;
            PyTuple_SET_ITEM(out.get(), static_cast<Py_ssize_t>(i), t);
        }
        return out.release();
    }

    PyObject* run_graph(Spec& s, PyObject* const* args, const Gathered& g) {
        jit::Stack stack;
        stack.reserve(g.tensors.size());
        for (size_t i = 0; i < g.tensors.size(); ++i)
            if (!s.frozen[i]) stack.emplace_back(THPVariable_Unpack(g.tensors[i]));
        std::string error;
        WarningBuffer warnings;
        try {
            WarningBuffer::Guard collect(&warnings);
            // With autograd on, the executor's autodiff subgraphs would mark every output of a
            // subgraph as requiring grad (eager: only those computed from such inputs), so the
            // graph runs op by op there; each op records its own backward, as in eager.
            jit::GraphOptimizerEnabledGuard optimize(!s.grad_mode);
            s.exec->run(stack);
        } catch (const std::exception& e) {
            if (s.mutates_inputs) {
                torch::translate_exception_to_python(std::current_exception());
                return nullptr;
            }
            error = e.what();
        }
        if (error.empty()) {
            PyObject* r = wrap_outputs(stack, s.clone_out);
            if (r) {
                ++s.runs;
                if (!warnings.size()) return r;
                // [Note: warnings from a graph]
                s.exec.reset();
                s.eager_why = "an op in it gives a warning (" + first_line(warnings.text(0)) +
                              "), so its steps run one by one and each warning names its line";
                note(s.eager_why);
                if (s.mutates_inputs || draws()) {
                    if (!file_warnings(warnings)) Py_CLEAR(r);
                    return r;
                }
                Py_DECREF(r);  // the steps run again and give their warnings at their lines
                return run_eagerly(args, "");
            }
            if (PyErr_Occurred()) return nullptr;
            error = "the graph returned something other than tensors";
        }
        // The ops failed in the graph: the steps run as the program would, which raises the
        // user's own error at their line. Nothing visible happened (a region has no effects).
        PyObject* r = run_eagerly(args, "");
        if (r) {
            // The graph failed where the program did not: never use it for these inputs again.
            s.exec.reset();
            s.eager_why = first_line(error);
            note("the graph failed where the program did not: " + s.eager_why);
        }
        return r;
    }

    bool draws() const {
        for (const Step& st : m_sub.steps())
            if (st.draws) return true;
        return false;
    }

    // [Note: warnings from a graph], when the steps cannot run again: at the step whose op
    // the message names first. False with the Python error a filter made of one.
    bool file_warnings(const WarningBuffer& warnings) {
        const std::string& text = warnings.text(0);
        const Step* at = nullptr;
        size_t first = std::string::npos;
        for (const Step& st : m_sub.steps()) {
            if (st.site < 0) continue;
            if (!at) at = &st;
            if (st.kind != StepKind::Call || st.args.empty() || !st.args[0].constant) continue;
            std::string name = callable_name(st.args[0].constant.get());
            size_t pos = word_at(text, name.substr(name.rfind('.') + 1));
            if (pos < first) {
                first = pos;
                at = &st;
            }
        }
        SiteLink site(PyThreadState_Get(), m_sub.sites());
        if (at) site.at(*at);
        try {
            torch::PyWarningHandler to_python;
            warnings.reissue();
        } catch (python_error& e) {
            e.restore();
            return false;
        }
        return true;
    }

    // Without autograd, the modules' parameters and buffers become constants of the graph, and
    // LibTorch's passes for frozen graphs fold batch norms into convolutions, fuse conv-add-relu,
    // pre-transpose linear weights and move convolutions to oneDNN (MKLDNN). The spec then also
    // holds each folded tensor's identity, version counter and data pointer.
    void optimize_for_inference(Spec& spec, const Gathered& g, std::vector<bool> keep) {
        jit::Graph& graph = *spec.graph;
        if (graph.inputs().size() != g.tensors.size()) return;
        {  // a module tensor the graph returns, or a view of it (`lin.weight.t()`), stays the
           // caller's tensor: frozen, the caller would get (and could change) the constant
            jit::AliasDb aliases(spec.graph);
            for (size_t i = 0; i < g.tensors.size(); ++i)
                for (jit::Value* out : graph.outputs())
                    if (aliases.mayContainAlias(graph.inputs()[i], out)) keep[i] = true;
        }
        bool any = false;
        for (size_t i = g.tensors.size(); i-- > 0;) {
            if (!g.state[i] || keep[i]) continue;
            const at::Tensor& t = THPVariable_Unpack(g.tensors[i]);
            jit::Value* in = graph.inputs()[i];
            jit::WithInsertPoint at_start(graph.block()->nodes().front());
            jit::Value* c = graph.insertConstant(t.detach());
            in->replaceAllUsesWith(c);
            graph.eraseInput(i);
            spec.frozen[i] = true;
            any = true;
        }
        if (!any) return;
        for (size_t i = 0; i < g.tensors.size(); ++i)
            if (spec.frozen[i]) spec.frozen_keys.push_back(FrozenKey::of(g.tensors[i]));
        bool conv = false;
        for (jit::Node* n : graph.nodes())
            conv = conv || n->kind() == c10::Symbol::fromQualString("aten::conv2d") ||
                   n->kind() == c10::Symbol::fromQualString("aten::_convolution");
        try {
            // Constant lists (strides, paddings) first: the folding passes read them.
            jit::ConstantPropagation(spec.graph);
            jit::ConstantPooling(spec.graph);
            jit::OptimizeFrozenGraph(spec.graph, /*optimize_numerics=*/true);
            jit::FuseFrozenConvAddRelu(spec.graph);
            // (not where a tensor is channels_last: the MKLDNN graph's to_dense gives
            // contiguous outputs where eager's convolutions keep that layout)
            if (conv && at::hasMKLDNN() && !any_channels_last(g.tensors) &&
                !outputs_channels_last(*spec.graph))
                jit::ConvertFrozenOpsToMKLDNN(spec.graph);
            jit::FrozenLinearTranspose(spec.graph);
            jit::EliminateDeadCode(spec.graph);
        } catch (const std::exception& e) {
            note("inference passes failed, the graph runs unoptimized: " + first_line(e.what()));
        }
    }

    PyObject* trace(PyObject* const* args, const Gathered& g) {
        auto t0 = std::chrono::steady_clock::now();
        struct AddTime {  // however trace() returns
            std::chrono::steady_clock::time_point t0;
            int64_t& total;
            ~AddTime() {
                total += std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - t0)
                             .count();
            }
        } add_time{t0, m_trace_ns};
        std::unique_ptr<Spec> spec = Spec::key_of(g);
        if (PyErr_Occurred()) return nullptr;
        jit::Stack inputs;
        std::vector<uint32_t> versions;  // to see which inputs the run changes in place
        for (PyObject* t : g.tensors) {
            inputs.emplace_back(THPVariable_Unpack(t));
            versions.push_back(version_of(t));
        }
        auto changed = [&](size_t i) { return version_of(g.tensors[i]) != versions[i]; };
        bool any_changed = false;
        WarningLog log;
        if (!log.begin()) return nullptr;
        py::Ref result;
        bool step_failed = false;
        std::string error;
        std::shared_ptr<jit::tracer::TracingState> state;
        CodeWatch watch;
        try {
            auto traced = jit::tracer::trace(
                std::move(inputs),
                [&](jit::Stack) -> jit::Stack {
                    Declined d = Declined::No;
                    PyObject* r = m_sub.run(args, d);
                    if (!r) {
                        step_failed = true;
                        throw std::runtime_error("a step failed");
                    }
                    result = py::Ref::steal(r);
                    jit::Stack out;
                    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(r); ++i) {
                        PyObject* item = PyTuple_GET_ITEM(r, i);
                        if (!is_exact_tensor(item))
                            throw std::runtime_error("an output is a " + py::type_name(item));
                        out.emplace_back(THPVariable_Unpack(item));
                    }
                    return out;
                },
                [](const torch::autograd::Variable&) { return std::string(); },
                /*strict=*/false, /*force_outplace=*/false);
            state = traced.first;
        } catch (const std::exception& e) {
            error = first_line(e.what());
        }
        for (const py::Ref& d : watch.dicts())
            spec->code_dicts.emplace_back(d, py::dict_version(d.get()));
        note_module_classes(g, spec->code_dicts);
        std::vector<std::string> tracer_warnings = log.end();
        for (size_t i = 0; i < g.tensors.size(); ++i) any_changed = any_changed || changed(i);
        if (!state && step_failed && any_changed) {
            // Inputs were changed before the failure: running the steps again would change
            // them twice, so the error stands (the program would have raised it too, unless
            // the tracer itself failed: [Note: torchscript backend]).
            if (!PyErr_Occurred()) raise_region_declined();
            return nullptr;
        }
        if (!state && result && !step_failed) {
            // The steps ran to their end under the tracer and only making the graph failed
            // (an output that is not a tensor): their results are this call's. Running them
            // again would repeat their in-place changes (fuzz seed 44613: an input's view
            // updated twice). Later calls with these inputs run the steps as recorded.
            PyErr_Clear();
            spec->eager_why = "tracing failed: " + error;
            note(spec->eager_why);
            ++m_eager_runs;
            m_specs.push_back(std::move(spec));
            return result.release();
        }
        if (!state) {
            // The steps failed (the user's error: raised as the program would) or the tracer
            // could not follow them (run them without it, and not try again for these inputs).
            // Only temporaries of the region were changed, so the steps can run again.
            PyErr_Clear();
            result = py::Ref();
            spec->eager_why = step_failed ? "" : "tracing failed: " + error;
            PyObject* r = run_eagerly(args, spec->eager_why);
            if (r && !step_failed) m_specs.push_back(std::move(spec));
            return r;
        }
        keep_adds_of_zero(state->graph->block());
        spec->graph = state->graph;
        if (!tracer_warnings.empty() || !log.python_warnings().empty()) {
            spec->eager_why =
                !tracer_warnings.empty()
                    ? "the trace depends on data (" + first_line(tracer_warnings[0]) + ")"
                    : "a step gives a warning from Python code on every call (" +
                          first_line(log.python_warnings()[0]) + "), which a graph would not";
            note(spec->eager_why);
            m_specs.push_back(std::move(spec));
            return result.release();
        }
        spec->graph = state->graph;
        spec->mutates_inputs = any_changed;
        // A leaf made in the region to require grad (`torch.zeros(3, requires_grad=True)`,
        // `x.detach().requires_grad_()`): the graph executor's outputs lose that flag (a review
        // probe: backward() failed from the third call on), so these inputs run the steps.
        if (makes_grad_leaf(*spec->graph, result.get())) {
            spec->eager_why = "a tensor made in it requires grad (a leaf of its own)";
            note(spec->eager_why);
            m_specs.push_back(std::move(spec));
            return result.release();
        }
        try {
            m_onednn = use_onednn_kernels(spec->graph, spec->grad_mode, !m_freeze);
        } catch (const std::exception& e) {
            note("moving ops to oneDNN failed, they run on eager's kernels: " +
                 first_line(e.what()));
        }
        if (!spec->grad_mode && m_freeze) {
            std::vector<bool> keep(g.tensors.size(), false);  // changed in place: stay inputs
            for (size_t i = 0; i < g.tensors.size(); ++i) keep[i] = changed(i);
            optimize_for_inference(*spec, g, keep);
        }
        spec->clone_out = constant_outputs(*spec->graph);
        try {
            spec->exec = std::make_unique<jit::GraphExecutor>(
                spec->graph, "magpy_graph_" + std::to_string(m_number));
        } catch (const std::exception& e) {
            spec->eager_why = "the graph executor refused it: " + first_line(e.what());
            note(spec->eager_why);
        }
        m_specs.push_back(std::move(spec));
        return result.release();
    }

    int m_number;
    bool m_freeze;  // torchscript-freeze: module tensors fold into inference graphs
    Plan m_sub;  // the region's steps, reading its inputs; the result is the outputs' tuple
    size_t m_sub_inputs = 0;
    size_t m_graph_ops;
    size_t m_steps;
    std::vector<std::unique_ptr<Spec>> m_specs;
    std::vector<std::string> m_notes;
    uint64_t m_eager_runs = 0;
    int64_t m_trace_ns = 0;  // tracing and making graph executors (the steps' run included)
    OneDnnChoice m_onednn;  // of the latest trace
    Gathered m_gathered;
    std::vector<ModuleMemo> m_memos;  // per input: the gathering of the module it was
    std::vector<int> m_positions;     // scratch for merge_part
    // The key that matched last, and the makings of the memos it matched (0: none)
    Spec* m_last = nullptr;
    std::vector<uint64_t> m_last_made;
};

// A region as a Python callable, so the rewritten plan calls it like any recorded op (and
// renders it as `torchscript_graph(...)`). Owned by a capsule, which the plan's step holds.
PyObject* region_call(PyObject* capsule, PyObject* const* args, Py_ssize_t) {
    auto* r = static_cast<Region*>(PyCapsule_GetPointer(capsule, "magpy.region"));
    return r ? r->call(args) : nullptr;
}

PyMethodDef g_region_def = {"torchscript_graph", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(region_call)),
                            METH_FASTCALL, "A stretch of the replay plan compiled by TorchScript."};

// [SECTION] backend ----------------------------------------------------------------------------

class TorchScriptGraph final : public CompiledGraph {
public:
    TorchScriptGraph(std::shared_ptr<const Plan> plan, size_t ops, std::vector<Region*> regions,
                     std::vector<py::Ref> owners)
        : m_plan(std::move(plan)), m_ops(ops), m_regions(std::move(regions)),
          m_owners(std::move(owners)) {}

private:
    PyObject* run_impl(PyObject* const* inputs, Declined& declined) const override {
        return m_plan->run(inputs, declined);
    }
    std::vector<std::string> notes_impl() const override {
        std::vector<std::string> out;
        for (const Region* r : m_regions)
            out.insert(out.end(), r->notes().begin(), r->notes().end());
        return out;
    }
    std::string summary_impl() const override {
        size_t ops = 0;
        for (const Region* r : m_regions) ops += r->graph_ops();
        std::string s = std::to_string(m_regions.size()) + " TorchScript graph" +
                        (m_regions.size() == 1 ? "" : "s") + " covering " + std::to_string(ops) +
                        " of " + std::to_string(m_ops) + " ops";
        for (const Region* r : m_regions)
            s += "; graph " + std::to_string(r->number()) + ": " + std::to_string(r->graph_ops()) +
                 " ops, " + std::to_string(r->traced()) + " traces, " +
                 std::to_string(r->graph_runs()) + " graph runs, " +
                 std::to_string(r->eager_runs()) + " eager runs" +
                 (r->kernels().empty() ? "" : ", " + r->kernels());
        return s;
    }
    int64_t deferred_compile_ns_impl() const override {
        int64_t ns = 0;
        for (const Region* r : m_regions) ns += r->trace_ns();
        return ns;
    }
    std::vector<std::string> graph_texts_impl() const override {
        std::vector<std::string> out;
        for (const Region* r : m_regions) out.push_back(r->graph_text());
        return out;
    }

    std::shared_ptr<const Plan> m_plan;
    size_t m_ops;  // graph ops of the plan as captured
    std::vector<Region*> m_regions;  // owned by the capsules in m_owners (and the plan's steps)
    std::vector<py::Ref> m_owners;
};

class TorchScriptBackend final : public Backend {
public:
    explicit TorchScriptBackend(bool freeze)
        : Backend(freeze ? "torchscript-freeze" : "torchscript"), m_freeze(freeze) {}

private:
    std::unique_ptr<CompiledGraph> compile_impl(std::shared_ptr<const Plan> plan,
                                                std::string& note) const override {
        std::vector<Span> spans = find_regions(*plan);
        if (spans.empty()) {
            note = "torchscript: no stretch of " + std::to_string(kMinGraphOps) +
                   " or more tensor ops without writes in between; the plan runs as recorded";
            return compile_eager(std::move(plan));
        }
        std::vector<Region*> regions;
        std::vector<py::Ref> owners;
        auto make = [&](RegionPlan rp) -> py::Ref {
            auto* region = new Region(static_cast<int>(regions.size()), std::move(rp.sub),
                                      rp.graph_ops, rp.steps, m_freeze);
            region->set_input_count(rp.inputs);
            py::Ref fn = region_callable(region, "magpy.region", &g_region_def, owners);
            if (fn) regions.push_back(region);
            return fn;
        };
        std::shared_ptr<Plan> rewritten = rewrite_regions(*plan, spans, make);
        if (!rewritten) {
            PyErr_Clear();
            note = "torchscript: out of memory; the plan runs as recorded";
            return compile_eager(std::move(plan));
        }
        size_t ops = plan->graph_op_count();
        return std::make_unique<TorchScriptGraph>(std::move(rewritten), ops, std::move(regions),
                                                  std::move(owners));
    }
    bool m_freeze;
};

}  // namespace

const Backend* torchscript_backend(bool freeze) {
    static TorchScriptBackend plain(false), frozen(true);
    return freeze ? &frozen : &plain;
}

}  // namespace magpy
