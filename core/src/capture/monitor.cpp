// [SECTION] tracing  [SECTION] frames  [SECTION] dispatch  [SECTION] completion
// [SECTION] calls  [SECTION] annotation rules
#include "capture/monitor.h"

#include "capture/break_reasons.h"
#include "python/torch_api.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace magpy {

namespace {
thread_local Monitor* t_monitor = nullptr;

std::string str(PyObject* o) { return py::str_of(o); }

// Attribute names the rules read, interned once for the process (borrowed references).
PyObject* interned(const char* name) {
    static std::unordered_map<std::string, PyObject*> names;
    PyObject*& s = names[name];
    if (!s) s = PyUnicode_InternFromString(name);
    return s;
}

}  // namespace

// A tensor, or a tuple or list of tensors: what a call run whole at replay may hand on.
static bool tensors_only(PyObject* o) {
    if (is_tensor(o)) return true;
    if (!o || !(PyTuple_CheckExact(o) || PyList_CheckExact(o))) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(o); ++i)
        if (!is_tensor(PySequence_Fast_GET_ITEM(o, i))) return false;
    return true;
}

static bool is_ndarray(PyObject* o) {
    return o && std::strcmp(Py_TYPE(o)->tp_name, "numpy.ndarray") == 0;
}
// An array a recorded step made ([Note: numpy arrays from constants]).
static bool made_array(const Value& v) {
    return v.kind == ValueKind::OpResult && is_ndarray(v.real.get());
}

// A tuple or a shape: x.size()[:-1] + (heads, dim) is a torch.Size, (b,) + x.shape[1:] a tuple,
// as Python makes them (a FreshTuple is made again with the type of its real value).
static bool tuple_or_shape(PyObject* o) {
    return PyTuple_CheckExact(o) || Py_TYPE(o) == torch_api().size_type;
}

static bool is_number(PyObject* o) {
    return PyBool_Check(o) || PyLong_Check(o) || PyFloat_Check(o) || PyComplex_Check(o);
}

// How a computed value reads in messages: "(x * 2)", shortened when operands are long.
static std::string op_label(const std::string& a, const char* op, const std::string& b) {
    auto brief = [](const std::string& s) { return s.size() <= 24 ? s : s.substr(0, 21) + "..."; };
    return a.empty() ? std::string(op) + brief(b) : "(" + brief(a) + " " + op + " " + brief(b) + ")";
}

// A Sequential / ModuleList (/ ModuleDict) or a subclass (Conv2dNormActivation, ...) whose
// `dunder` is the base class's: iterating, indexing or len() of it reads its _modules in order.
static bool plain_module_container(PyObject* o, const char* dunder, bool dict_too = false) {
    const TorchApi& api = torch_api();
    PyTypeObject* base = PyObject_TypeCheck(o, api.sequential_type)    ? api.sequential_type
                         : PyObject_TypeCheck(o, api.module_list_type) ? api.module_list_type
                         : dict_too && PyObject_TypeCheck(o, api.module_dict_type)
                             ? api.module_dict_type
                             : nullptr;
    if (!base) return false;
    PyObject* name = interned(dunder);
    return _PyType_Lookup(Py_TYPE(o), name) == _PyType_Lookup(base, name);
}

// A ParameterList (ParameterDict) or a subclass whose `dunder` is the base class's: its items
// are the attributes "0", "1", ... (named by the keys) and its length the attribute `_size`.
static bool plain_parameter_container(PyObject* o, const char* dunder, bool dict = false) {
    PyTypeObject* base = dict ? torch_api().parameter_dict_type : torch_api().parameter_list_type;
    if (!base || !PyObject_TypeCheck(o, base)) return false;
    PyObject* name = interned(dunder);
    return _PyType_Lookup(Py_TYPE(o), name) == _PyType_Lookup(base, name);
}

// The length of an identity-guarded ParameterList, guarded by value (-1 after a break).
long Monitor::parameter_list_size(int list) {
    PyObject* size = PyObject_GetAttrString(m_cap.v(list).real.get(), "_size");
    if (!size || !PyLong_Check(size)) {
        Py_XDECREF(size);
        PyErr_Clear();
        m_cap.fail(breaks::kUnsupportedOpcode, m_cap.v(list).label + " (ParameterList) has no "
                   "length", "use a ParameterList as nn.ParameterList defines it");
        return -1;
    }
    int sv = m_cap.input_child(list, AccessKind::ModuleAttr, 0, interned("_size"), "._size", size);
    long n = PyLong_AsLong(size);
    Py_DECREF(size);
    return sv < 0 ? -1 : n;
}

// Item `i` (0 <= i < its length) of an identity-guarded ParameterList: its attribute "i".
int Monitor::parameter_list_item(int list, long i, PyObject* real) {
    py::Ref key = py::Ref::steal(PyUnicode_FromFormat("%ld", i));
    py::Ref item = real ? py::Ref::borrow(real)
                        : py::Ref::steal(PyObject_GetAttr(m_cap.v(list).real.get(), key.get()));
    if (!item) {
        PyErr_Clear();
        m_cap.internal_error("ParameterList item");
        return -1;
    }
    return m_cap.input_child(list, AccessKind::ModuleAttr, 0, key.get(),
                             "[" + std::to_string(i) + "]", item.get());
}

// The `_modules` dict of an identity-guarded Sequential/ModuleList/ModuleDict, as an input.
int Monitor::modules_dict(int container) {
    PyObject* mods = PyObject_GetAttrString(m_cap.v(container).real.get(), "_modules");
    if (!mods) {
        PyErr_Clear();
        m_cap.internal_error("module container without _modules");
        return -1;
    }
    int mv = m_cap.input_child(container, AccessKind::ModuleAttr, 0, interned("_modules"),
                               "._modules", mods);
    Py_DECREF(mods);
    return mv;
}

// The items of a sequence whose contents the capture knows: a fresh list or tuple, a constant
// tuple, or an input list or tuple (its length and items are then guarded).
// A set or frozenset of at most 256 constants and classes whose metaclass is type's own (they
// hash and compare by identity): what it holds is fixed by comparing it with a frozen copy.
static bool set_of_constants_or_classes(PyObject* o) {
    if (!(PySet_CheckExact(o) || PyFrozenSet_CheckExact(o)) || PySet_GET_SIZE(o) > 256) return false;
    Py_ssize_t pos = 0;
    PyObject* key;
    Py_hash_t hash;
    while (_PySet_NextEntry(o, &pos, &key, &hash))
        if (!is_constant_like(key) && !(PyType_Check(key) && Py_TYPE(key) == &PyType_Type))
            return false;
    return true;
}

// Whether a torch op's arguments hold something callable that the op may call (a function, a
// bound method, a module, an object with __call__; not a class), or a list or tuple of such:
// torch.utils.checkpoint(block, x), checkpoint_sequential([f, g], 2, x),
// torch.autograd.functional.jacobian(f, x), t.apply_(f).
bool Monitor::runs_callable_argument(const std::vector<int>& args, PyObject* fn) {
    // (not the object a method was called on: FloatFunctional.cat(self, xs) in quantized
    // models, a module's own method)
    size_t first = 0;
    if (!args.empty() && fn && PyFunction_Check(fn)) {
        PyObject* self = m_cap.v(args[0]).real.get();
        PyObject* name = reinterpret_cast<PyFunctionObject*>(fn)->func_name;
        if (self && name && _PyType_Lookup(Py_TYPE(self), name) == fn) first = 1;
    }
    auto callable = [](PyObject* o) {
        if (!o || is_tensor(o) || PyType_Check(o) || !PyCallable_Check(o)) return false;
        if (PyFunction_Check(o) || PyMethod_Check(o) ||
            PyObject_TypeCheck(o, torch_api().module_type))
            return true;
        // an object of a class of torch's own (torch.no_grad(), which is also a decorator)
        // is not called by the op it is given to
        py::Ref mod = py::Ref::steal(
            PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(o)), "__module__"));
        PyErr_Clear();
        return !names_torch_module(mod.get());
    };
    for (size_t i = first; i < args.size(); ++i) {
        PyObject* o = m_cap.v(args[i]).real.get();
        if (callable(o)) return true;
        if (o && (PyList_Check(o) || PyTuple_Check(o)))
            for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(o); ++k)
                if (callable(PySequence_Fast_GET_ITEM(o, k))) return true;
    }
    return false;
}

// Whether calling `o` runs Python code: a function, a method, a module, an object of a class
// defined in Python with __call__, a functools.partial of one (not a builtin: operator.mul).
static bool calls_python(PyObject* o) {
    if (!o || PyType_Check(o) || !PyCallable_Check(o)) return false;
    if (PyFunction_Check(o) || PyMethod_Check(o)) return true;
    if (Py_TYPE(o) == functools_partial_type()) {
        py::Ref func = py::Ref::steal(PyObject_GetAttrString(o, "func"));
        PyErr_Clear();
        return calls_python(func.get());
    }
    return (Py_TYPE(o)->tp_flags & Py_TPFLAGS_HEAPTYPE) != 0;
}

// [Note: class tests] isinstance(obj, C) and issubclass(K, C) are answered by type(obj) and K,
// which guards fix, when C's metaclass is `type` (or torch's Parameter meta, which also reads
// the tensor's `_is_param`). An ABC (ABCMeta: collections.abc.Mapping, numbers.Number) also
// answers from its registry, which `C.register(K)` anywhere changes: abc.get_cache_token()
// counts those, so it is guarded. A metaclass with an __instancecheck__ or __subclasscheck__
// of its own (a runtime_checkable Protocol, a user's) decides with code that may read
// anything: such a test breaks. A review probe found all three replayed stale.
bool Monitor::class_test_follows_type(const std::string& test, int subject, int classes) {
    static PyObject* instance_name = PyUnicode_InternFromString("__instancecheck__");  // kept
    static PyObject* subclass_name = PyUnicode_InternFromString("__subclasscheck__");  // kept
    static PyTypeObject* abc_meta = imported_type("abc", "ABCMeta");
    static PyTypeObject* parameter_meta = imported_type("torch.nn.parameter", "_ParameterMeta");
    static PyTypeObject* union_type = imported_type("types", "UnionType");
    PyObject* slot = test == "issubclass" ? subclass_name : instance_name;
    PyObject* plain = _PyType_Lookup(&PyType_Type, slot);
    static PyObject* class_name = PyUnicode_InternFromString("__class__");  // kept
    PyObject* obj = m_cap.v(subject).real.get();
    if (test == "isinstance" && obj &&
        _PyType_Lookup(Py_TYPE(obj), class_name) != _PyType_Lookup(&PyBaseObject_Type, class_name)) {
        // isinstance() also asks obj.__class__, which such a class computes (a mock)
        m_cap.fail(breaks::kUnsupportedCallee,
                   "`isinstance()` of " + m_cap.v(subject).label + ", whose class " +
                       Py_TYPE(obj)->tp_name + " defines its own __class__",
                   "test type(obj) instead, or make the test outside the compiled function");
        return false;
    }
    bool registry = false;
    std::string refused;
    std::function<void(PyObject*, int)> visit = [&](PyObject* c, int depth) {
        if (!refused.empty() || depth > 4) return;
        if (PyTuple_Check(c)) {
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(c); ++i) visit(PyTuple_GET_ITEM(c, i), depth + 1);
            return;
        }
        if (union_type && Py_TYPE(c) == union_type) {  // int | None
            py::Ref args = py::Ref::steal(PyObject_GetAttrString(c, "__args__"));
            PyErr_Clear();
            if (args) visit(args.get(), depth + 1);
            return;
        }
        if (!PyType_Check(c)) return;  // (isinstance raises for it, as eager did)
        PyObject* check = _PyType_Lookup(Py_TYPE(c), slot);
        if (check == plain ||
            (parameter_meta && check == _PyType_Lookup(parameter_meta, slot)))
            return;
        if (abc_meta && check == _PyType_Lookup(abc_meta, slot)) {
            registry = true;
            return;
        }
        refused = reinterpret_cast<PyTypeObject*>(c)->tp_name;
    };
    visit(m_cap.v(classes).real.get(), 0);
    if (!refused.empty()) {
        m_cap.fail(breaks::kUnsupportedCallee,
                   "`" + test + "()` with class " + refused + ", whose metaclass decides with "
                   "its own " + py::str_of(slot) + " (a runtime_checkable Protocol?)",
                   "test type(obj) or hasattr() instead, or make the test outside the compiled "
                   "function");
        return false;
    }
    if (registry) {
        static PyObject* token = [] {
            py::Ref abc = py::Ref::steal(PyImport_ImportModule("abc"));
            PyObject* fn = abc ? PyObject_GetAttrString(abc.get(), "get_cache_token") : nullptr;
            PyErr_Clear();
            return fn;  // kept for the process
        }();
        py::Ref now = py::Ref::steal(token ? PyObject_CallNoArgs(token) : nullptr);
        if (!now) {
            PyErr_Clear();
            m_cap.fail(breaks::kUnsupportedCallee,
                       "`" + test + "()` with an ABC, whose registry cannot be guarded",
                       "test type(obj) instead");
            return false;
        }
        m_cap.input_root(AccessKind::CallResult, 0, token, "abc.get_cache_token()", now.get());
    }
    return true;
}

// LIST_APPEND, LIST_EXTEND or DICT_MERGE into a list or dict display that a graph break split
// (`[*t, helper(x)]` with a break inside helper): the half-built object came into the resumed
// frame from the stack, as an input; the rest of the call runs as Python.
void Monitor::split_display(const char* what) {
    m_cap.fail(breaks::kUnsupportedOpcode,
               std::string("a ") + what + " display (or a call's * or ** arguments) is finished "
               "after a graph break inside it",
               "compute the item before the display: `y = helper(x); [*t, y]`");
}

// Whether the instruction at `offset` of frame `f` is inside a try of the captured code: a
// handler of its own, a caller's, or a @contextmanager whose yield sits in a try ([Note:
// generator context managers]).
void Monitor::set_in_try(ShadowFrame& f, int offset) {
    f.in_try = f.caller_in_try || !f.handler_contexts.empty() ||
               py::code_offset_reaches_user_handler(f.code, offset);
    m_cap.set_in_try(f.in_try);
}

bool Monitor::items_of(int seq, std::vector<int>& out) {
    if (generator_of(seq) || map_of(seq)) return lazy_items(seq, out);  // a, b = map(f, zs)
    seq = as_mapping(seq, "__iter__");  // its keys ([Note: objects made in the call])
    if (seq < 0) return false;
    Value& s = m_cap.v(seq);
    PyObject* o = s.real.get();
    if (s.kind == ValueKind::FreshList || s.kind == ValueKind::FreshTuple) {
        out = s.items;
        return true;
    }
    if (s.kind == ValueKind::FreshSet) return m_cap.set_items(seq, out);
    if (s.kind == ValueKind::Const && (PyTuple_Check(o) || PyList_Check(o))) {
        out.clear();
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(o); ++i)
            out.push_back(m_cap.const_value(PySequence_Fast_GET_ITEM(o, i)));
        return true;
    }
    if (s.kind == ValueKind::Input && !s.tensor && (PyList_CheckExact(o) || PyTuple_CheckExact(o))) {
        if (!m_cap.shadow(seq)) return false;
        out = m_cap.v(seq).items;
        return true;
    }
    if (s.kind == ValueKind::Input && !s.tensor && is_namedtuple_type(Py_TYPE(o))) {
        // immutable, and its length is fixed by its class (guarded): the items by position
        out.clear();
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); ++i) {
            int item = m_cap.input_child(seq, AccessKind::Item, static_cast<int>(i), nullptr,
                                         "[" + std::to_string(i) + "]", PyTuple_GET_ITEM(o, i));
            if (item < 0) return false;
            out.push_back(item);
        }
        return true;
    }
    if (s.kind == ValueKind::Input && s.identity &&
        plain_module_container(o, "__iter__")) {
        int mv = modules_dict(seq);
        if (mv < 0) return false;
        py::Ref mods = m_cap.v(mv).real;
        m_cap.guard_len(mv, PyDict_Size(mods.get()));
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *val;
        out.clear();
        while (PyDict_Next(mods.get(), &pos, &k, &val)) {
            int item = m_cap.input_child(mv, AccessKind::DictValueAt, static_cast<int>(i), nullptr,
                                         "[" + std::to_string(i) + "]", val);
            if (item < 0) return false;
            out.push_back(item);
            ++i;
        }
        return true;
    }
    if (s.kind == ValueKind::Const && PyRange_Check(o)) {
        py::Ref items = py::Ref::steal(PySequence_Tuple(o));
        if (!items) {
            PyErr_Clear();
            m_cap.internal_error("range items");
            return false;
        }
        out.clear();
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items.get()); ++i)
            out.push_back(m_cap.const_value(PyTuple_GET_ITEM(items.get(), i)));
        return true;
    }
    if (s.kind == ValueKind::OpResult && !s.tensor && (PyTuple_Check(o) || PyList_CheckExact(o))) {
        // x.chunk(3), torch.split(...), f(*x.topk(k)): the items of an op's tuple (or named
        // tuple of torch.return_types), by position
        py::Ref keep = s.real;
        out.clear();
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(keep.get()); ++i) {
            int item = item_of(seq, i, PySequence_Fast_GET_ITEM(keep.get(), i));
            if (item < 0) return false;
            out.push_back(item);
        }
        return true;
    }
    if (s.kind == ValueKind::Iterator) return iterator_items(seq, out);
    m_cap.fail(breaks::kUnsupportedOpcode,
               "the items of `" + s.label + "` (" + py::type_name(o) + ") are unpacked",
               "unpack lists or tuples");
    return false;
}

// All the items an iterator yields from where it is, for a consumer that takes them at once
// (`dict(zip(keys, values))`, `f(*zip(a, b))`); it is used up afterwards (a dict view is not).
bool Monitor::iterator_items(int it, std::vector<int>& out) {
    const Value& v = m_cap.v(it);
    auto fail = [&]() {
        m_cap.fail(breaks::kUnsupportedOpcode,
                   "the items of `" + v.label + "` (" + py::type_name(v.real.get()) + ") are "
                   "unpacked" + (v.iter_pos ? " after it was partly used" : ""),
                   "unpack lists, tuples, or zip() of them");
        return false;
    };
    // what next() took already is not among them (`first = next(it); rest = sum(it)`)
    size_t skip = v.iter_view ? 0 : static_cast<size_t>(v.iter_pos);
    if (v.iter_advance >= 0) return fail();
    std::vector<int> items;
    switch (v.iter_kind) {
    case IterKind::ConstSeq:
    case IterKind::FreshSeq:
    case IterKind::InputSeq:
        if (!items_of(v.iter_source, items)) return false;
        if (skip > items.size()) return m_cap.internal_error("an iterator past its items"), false;
        items.erase(items.begin(), items.begin() + static_cast<long>(skip));
        break;
    case IterKind::Generator:
    case IterKind::Map:
        if (skip) return fail();
        if (!lazy_items(it, items)) return false;
        break;
    case IterKind::Enumerate: {
        // (count, item) rows over what the wrapped iterator has left, counted on from where
        // this one is (dict(enumerate(names)), a, b = enumerate(xs))
        int inner = v.items.empty() ? -1 : v.items[0];
        Py_ssize_t count = v.iter_start + static_cast<Py_ssize_t>(skip);
        std::vector<int> rest;
        if (inner < 0 || !iterator_items(inner, rest)) return inner < 0 ? fail() : false;
        for (size_t k = 0; k < rest.size(); ++k) {
            py::Ref n = py::Ref::steal(PyLong_FromSsize_t(count + static_cast<Py_ssize_t>(k)));
            std::vector<int> row = {m_cap.const_value(n.get()), rest[k]};
            items.push_back(m_cap.fresh(ValueKind::FreshTuple, row, reals_of(row, false).get()));
        }
        break;
    }
    case IterKind::Flat:
    case IterKind::Zip: {
        // rows of `width` items: a dict's items() pairs, or one item from each zipped input
        std::vector<std::vector<int>> cols;
        size_t width = static_cast<size_t>(v.iter_width), n = v.items.size() / width;
        size_t first = v.iter_kind == IterKind::Flat ? std::min(skip, n) : 0;
        if (v.iter_kind == IterKind::Zip) {  // (each zipped iterator skips its own)
            std::vector<int> inner = v.items;
            width = inner.size();
            n = SIZE_MAX;
            std::vector<int> start;
            for (int sub : inner) {
                const Value& sv = m_cap.v(sub);
                if (sv.iter_kind == IterKind::Zip || sv.iter_kind == IterKind::Enumerate)
                    return fail();  // (how far a nested one went is not known)
                start.push_back(sv.iter_view ? -1 : sv.iter_pos);
                cols.emplace_back();
                if (!iterator_items(sub, cols.back())) return false;
                n = std::min(n, cols.back().size());
            }
            // each input gave n rows; then the ending round asked them in order until one ran
            // out, and those before it lost an item
            for (size_t i = 0; i < inner.size(); ++i)
                if (start[i] >= 0) m_cap.v(inner[i]).iter_pos = start[i] + static_cast<int>(n);
            for (size_t i = 0; i < inner.size() && cols[i].size() > n; ++i)
                if (start[i] >= 0 && !take_one(inner[i])) return false;
            for (int sub : inner) m_cap.v(sub).zipped_by = nullptr;
        }
        const std::vector<int> flat = m_cap.v(it).items;
        for (size_t r = first; r < n; ++r) {
            std::vector<int> row;
            for (size_t c = 0; c < width; ++c)
                row.push_back(cols.empty() ? flat[r * width + c] : cols[c][r]);
            if (width == 1 && !v.iter_rows) {
                items.push_back(row[0]);
                continue;
            }
            items.push_back(m_cap.fresh(ValueKind::FreshTuple, row, reals_of(row, false).get()));
        }
        break;
    }
    default:
        return fail();
    }
    if (!m_cap.v(it).iter_view) m_cap.v(it).iter_pos = static_cast<int>(skip + items.size());
    out = std::move(items);
    return true;
}

py::Ref Monitor::reals_of(const std::vector<int>& items, bool list) {
    auto n = static_cast<Py_ssize_t>(items.size());
    py::Ref seq = py::Ref::steal(list ? PyList_New(n) : PyTuple_New(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
        const py::Ref& r = m_cap.v(items[static_cast<size_t>(i)]).real;
        PyObject* o = Py_NewRef(r ? r.get() : Py_None);
        if (list) PyList_SET_ITEM(seq.get(), i, o);
        else PyTuple_SET_ITEM(seq.get(), i, o);
    }
    return seq;
}

// A dict made here from (key, value) pairs in order: a repeated key keeps its first place and
// takes its last value, as in Python.
int Monitor::fresh_dict(const std::vector<int>& pairs, PyObject* real) {
    int d = m_cap.fresh(ValueKind::FreshDict, {}, real);
    for (size_t i = 0; i + 1 < pairs.size(); i += 2) dict_set(d, pairs[i], pairs[i + 1]);
    return d;
}

// [Note: sets made in the call] A set made in the call from constants (`set()`, `{1, 2}`,
// `set(a_constant_tuple)`, torch >= 2's `called_always_called_hooks = set()` in
// Module._call_impl) is followed by its elements: each a constant, in the set's own order,
// read again from the set after each change. What Python asks of it (`in`, len, truth,
// iteration, a copy) follows from constants, so it folds; nothing runs at replay unless it
// escapes (returned, stored, passed on), where it is made as set([...]) of the elements the set
// holds then (Capture::set_items: the set is the program's own, changed by the real run). An
// element that is not a constant, or a change after it escaped, breaks.
int Monitor::fresh_set(PyObject* real) {
    int id = m_cap.fresh(ValueKind::FreshSet, {}, real);
    m_cap.v(id).label = "a set made in the call";
    return id;
}

// Whether the elements that `src` gives a set are constants the guards fix: a constant, a set
// made here, or a container whose items are guarded (items_of) and constant.
bool Monitor::set_source_known(int src) {
    ValueKind k = m_cap.v(src).kind;
    if (k == ValueKind::Const || k == ValueKind::FreshSet) return true;
    std::vector<int> items;
    return items_of(src, items) && require_const(items, "a set element");
}

// set.add(x) and the other set methods on a set made in the call (`in` is CONTAINS_OP).
int Monitor::set_method(const Pending& p, PyObject* result) {
    const std::string& op = p.callee.op;
    if (p.in.empty() || m_cap.v(p.in[0]).kind != ValueKind::FreshSet)
        return m_cap.fail(breaks::kUnsupportedCallee,
                          "`set." + op + "()` on " + (p.in.empty() ? "nothing" : m_cap.v(p.in[0]).label),
                          "call set methods on sets of constants made in the function"), -1;
    std::vector<int> args(p.in.begin() + 1, p.in.end());
    bool many = op == "update" || op == "union" || op == "intersection" || op == "difference" ||
                op == "symmetric_difference" || op == "issubset" || op == "issuperset" ||
                op == "isdisjoint" || ends_with(op, "_update");
    for (int a : args)  // update(other), union(a, b): their elements; add(x): x itself
        if (many ? !set_source_known(a) : !require_const({a}, "`set." + op + "()`")) return -1;
    static const std::unordered_set<std::string> kChanges = {
        "add", "discard", "remove", "clear", "update", "difference_update",
        "intersection_update", "symmetric_difference_update", "pop"};
    if (kChanges.count(op) && m_cap.exists_at_replay(p.in[0]))
        return m_cap.fail(breaks::kUnsupportedCallee,
                          "`set." + op + "()` changes a set after it was stored or returned",
                          "finish the set before storing or returning it"), -1;
    if (result && (PySet_CheckExact(result) || PyFrozenSet_CheckExact(result)))
        return PySet_CheckExact(result) ? fresh_set(result) : m_cap.const_value(result);
    return result ? m_cap.const_value(result) : -1;  // None, an element, a bool
}

// [Note: objects made in the call] An instance of a plain class of the user's
// (is_plain_user_class) made during the call is followed like a dict of its attributes: its
// __init__ is traced with it as self, `obj.name = v` sets an item, `obj.name` reads it (or the
// class attribute, guarded through the class), methods are traced like any user function.
// Nothing runs at replay for it unless it escapes (returned, stored where the caller sees it,
// live at a graph break): then it is made there by its C base's __new__ and its attributes set,
// and writes after that are replayed as effects. Properties and other data descriptors of the
// class break.
// A subclass of dict or OrderedDict (transformers' ModelOutput, a config dict with attribute
// access) is also a mapping: its items are a FreshDict of their own (Value::mapping), which
// the base's slots and methods act on (`obj[k]`, `k in obj`, `len(obj)`, iteration,
// `obj.keys()`, `super().__setitem__(k, v)`, `dict.get(obj, k)`), and which the object is
// made with at replay, items in their order, set as the base sets them.
// [Note: hooks of objects made in the call] A class's own __setattr__, __setitem__,
// __getitem__, __contains__, __len__ or __iter__ written in Python is traced like a method when
// an instruction (or len()) runs it (`self.loss = loss` in a dataclass __init__, `self[name] =
// v`, `out[0]`, `k in obj`, `for t in feats`), guarded through the class; the reading ones also
// on objects passed in (`name in self.heads` of a ModuleDict, `outputs["logits"]` of a
// ModelOutput; other modules' items, lengths and iteration keep the module rules). Inside a hook, `super().__setattr__(name, v)` and `object.__setattr__(self, name, v)` are
// the plain store, `super().__setitem__(k, v)` the base's. A write the capture makes after the
// object escaped is replayed by calling that base slot on it, never the class's hook again.
int Monitor::new_object(int cls, PyObject* real) {
    int obj = m_cap.new_value(ValueKind::FreshObject, real,
                              std::string(Py_TYPE(real)->tp_name) + "(...)");
    m_cap.v(obj).cls = cls;
    PyTypeObject* base = user_class_base(Py_TYPE(real));
    if (base && base != &PyBaseObject_Type) {
        int items = m_cap.fresh(ValueKind::FreshDict, {}, real);
        m_cap.v(items).owner = obj;
        m_cap.v(items).label = m_cap.v(obj).label;
        m_cap.v(obj).mapping = items;
    }
    return obj;
}

// How many attributes an object holds: the items of its __dict__ and the slots of
// `__slots__` that are set (-1: not known).
static Py_ssize_t attributes_set(PyObject* obj) {
    Py_ssize_t n = 0;
    if (_PyObject_GetDictPtr(obj)) {
        PyObject* d = PyObject_GenericGetDict(obj, nullptr);  // new reference
        if (!d) {
            PyErr_Clear();
            return -1;
        }
        n = PyDict_Size(d);
        Py_DECREF(d);
    }
    PyObject* mro = Py_TYPE(obj)->tp_mro;
    for (Py_ssize_t i = 0; mro && i < PyTuple_GET_SIZE(mro); ++i) {
        PyObject* dict = py::type_dict(reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i)));
        Py_ssize_t pos = 0;
        PyObject *key, *descr;
        while (dict && PyDict_Next(dict, &pos, &key, &descr)) {
            if (Py_TYPE(descr) != &PyMemberDescr_Type) continue;
            PyObject* v = Py_TYPE(descr)->tp_descr_get(descr, obj, nullptr);  // new reference
            if (v) ++n;
            else PyErr_Clear();
            Py_XDECREF(v);
        }
    }
    return n;
}

// The items of `value` when it is an object made in the call that is a dict whose class keeps
// the base's `slot` (`__getitem__`, `__len__` ...), else `value` itself.
bool Monitor::input_dict(int value) {
    const Value& o = m_cap.v(value);
    return o.kind == ValueKind::Input && !o.tensor && o.real && PyDict_Check(o.real.get());
}

int Monitor::as_mapping(int value, const char* slot) {
    const Value& o = m_cap.v(value);
    if (o.kind == ValueKind::Input && !o.tensor && o.real && PyDict_Check(o.real.get()) &&
        !PyDict_CheckExact(o.real.get())) {
        // A dict subclass passed in is read as a dict (guards fetch its items as dict does):
        // only while the class keeps the dict's slot.
        PyTypeObject* type = Py_TYPE(o.real.get());
        if (_PyType_Lookup(type, interned(slot)) != _PyType_Lookup(layout_base(type), interned(slot))) {
            m_cap.fail(breaks::kUnsupportedAttribute,
                       "`" + std::string(type->tp_name) + "." + slot + "` of " + o.label +
                           ", a dict passed in, is Python code",
                       "pass a plain dict, or use dict's own methods (dict.get(d, k))");
            return -1;
        }
        return value;
    }
    if (o.kind != ValueKind::FreshObject || o.mapping < 0) return value;
    PyTypeObject* type = Py_TYPE(o.real.get());
    PyObject* own = _PyType_Lookup(type, interned(slot));
    return own && own == _PyType_Lookup(user_class_base(type), interned(slot)) ? o.mapping : value;
}

// A write to the items of an object made in the call once it escaped: replayed as its C base's
// `method` (`__setitem__`, `pop`) called on the object, so no hook of its class runs again.
// False: the dict is not such items.
bool Monitor::escaped_mapping_write(int dict, const char* method, const std::vector<int>& args) {
    int owner = m_cap.v(dict).owner;
    if (owner < 0 || m_cap.v(owner).built < 0) return false;
    PyTypeObject* base = user_class_base(Py_TYPE(m_cap.v(owner).real.get()));
    PyObject* fn = base ? _PyType_Lookup(base, interned(method)) : nullptr;
    if (!fn) return m_cap.internal_error("a mapping base without " + std::string(method)), true;
    std::vector<int> values = {m_cap.const_value(fn, std::string(base->tp_name) + "." + method),
                               owner};
    values.insert(values.end(), args.begin(), args.end());
    Step s;
    s.kind = StepKind::Call;
    m_cap.record_effect(std::move(s), values);
    return true;
}

// A data descriptor of the class other than a slot of `__slots__` (a slot holds an attribute
// of an object made in the call as __dict__ does: followed the same way).
static bool is_data_descriptor(PyTypeObject* type, PyObject* name) {
    PyObject* d = _PyType_Lookup(type, name);
    return d && Py_TYPE(d)->tp_descr_set && Py_TYPE(d) != &PyMemberDescr_Type;
}

// A data descriptor whose get or set runs Python code: a property, or any other but a slot or
// a C getset.
static bool is_code_descriptor(PyTypeObject* type, PyObject* name) {
    PyObject* d = _PyType_Lookup(type, name);
    return d && Py_TYPE(d)->tp_descr_set && Py_TYPE(d) != &PyMemberDescr_Type &&
           Py_TYPE(d) != &PyGetSetDescr_Type;
}

// A class with its own __getattr__/__getattribute__ (`set`: __setattr__). nn.Module's own
// only look in (or register into) its parameter, buffer and module dicts.
static bool has_attribute_hook(PyObject* obj, bool set) {
    PyTypeObject* type = Py_TYPE(obj);
    if (PyObject_TypeCheck(obj, torch_api().module_type)) {
        // Module's own __setattr__ and __getattr__ only register into (or look in) its
        // parameter, buffer and module dicts; a subclass's own __setattr__ or
        // __getattribute__ may store or give anything (found by a probe: `value * 2`)
        const char* name = set ? "__setattr__" : "__getattribute__";
        PyObject* base = reinterpret_cast<PyObject*>(set ? torch_api().module_type : &PyBaseObject_Type);
        return _PyType_Lookup(type, interned(name)) !=
               _PyType_Lookup(reinterpret_cast<PyTypeObject*>(base), interned(name));
    }
    bool cls = PyType_Check(obj);  // a class: its metaclass decides (FunctionMeta does not hook)
    bool custom = set ? type->tp_setattro != (cls ? PyType_Type.tp_setattro : PyObject_GenericSetAttr)
                      : type->tp_getattro != (cls ? PyType_Type.tp_getattro : PyObject_GenericGetAttr);
    return custom && (type->tp_flags & Py_TPFLAGS_HEAPTYPE);
}

// A class with only a __getattr__ (torch.ops, lazy namespaces) runs it only when the usual
// lookup fails: an attribute already in the instance's __dict__ is read without Python code.
static bool found_before_getattr_hook(PyObject* obj, PyObject* key) {
    PyObject* ga = _PyType_Lookup(Py_TYPE(obj), interned("__getattribute__"));
    if (!ga || PyFunction_Check(ga)) return false;  // a __getattribute__ of the class's own
    PyObject** dict = _PyObject_GetDictPtr(obj);
    return dict && *dict && PyDict_Contains(*dict, key) == 1;
}

// What reading `target.name` finds that runs Python code the capture does not trace, beside
// properties and attribute hooks (found by a review probe: the guards called it, extra times,
// and replay reused one answer): a non-data descriptor of a Python class (its __get__) that
// the instance's __dict__ does not shadow; for a class, a data descriptor of its metaclass's
// (a metaclass @property); for a module,
// its __getattr__ (PEP 562) for a name it lacks. Empty when none.
static std::string code_on_read(PyObject* target, PyObject* name) {
    auto python_get = [](PyObject* d) {
        return d && (Py_TYPE(d)->tp_flags & Py_TPFLAGS_HEAPTYPE) && Py_TYPE(d)->tp_descr_get;
    };
    if (PyModule_Check(target)) {
        PyObject* dict = PyModule_GetDict(target);
        if (dict && !PyDict_GetItemWithError(dict, name) && !PyErr_Occurred() &&
            PyDict_GetItemString(dict, "__getattr__"))
            return "the module's __getattr__";
        PyErr_Clear();
        return "";
    }
    if (PyType_Check(target)) {
        // (a descriptor read on its class, `Categorical.probs`, gives itself or a stand-in)
        PyObject* meta = _PyType_Lookup(Py_TYPE(target), name);
        if (meta && Py_TYPE(meta)->tp_descr_set && Py_TYPE(meta) != &PyMemberDescr_Type &&
            Py_TYPE(meta) != &PyGetSetDescr_Type)
            return "a property of its metaclass";
        return "";
    }
    PyObject* d = _PyType_Lookup(Py_TYPE(target), name);
    if (!python_get(d) || Py_TYPE(d)->tp_descr_set) return "";  // data ones: is_code_descriptor
    PyObject** dict = _PyObject_GetDictPtr(target);
    if (dict && *dict && PyDict_Contains(*dict, name) == 1) return "";  // shadowed
    PyErr_Clear();
    return "a descriptor (" + py::type_name(d) + ".__get__)";
}

// Whether reading (or setting) `obj.key` could run Python code of the class's.
static bool runs_code_to_access(PyObject* obj, PyObject* key, bool set) {
    if (PyType_Check(obj) || PyModule_Check(obj)) return false;
    return is_code_descriptor(Py_TYPE(obj), key) ||
           (has_attribute_hook(obj, set) && (set || !found_before_getattr_hook(obj, key)));
}

bool Monitor::set_object_attr(int obj, PyObject* name, int val) {
    const Value& o = m_cap.v(obj);
    if (is_data_descriptor(Py_TYPE(o.real.get()), name)) {
        m_cap.fail(breaks::kUnsupportedAttribute,
                   "`" + o.label + "." + str(name) + "` is a property (its setter runs Python code)",
                   "make it a plain attribute");
        return false;
    }
    dict_set(obj, m_cap.const_value(name), val);
    if (m_cap.v(obj).built >= 0) {  // made at replay already: the write is an effect
        static PyObject* plain_set = _PyType_Lookup(&PyBaseObject_Type, interned("__setattr__"));
        Step s;
        if (_PyType_Lookup(Py_TYPE(m_cap.v(obj).real.get()), interned("__setattr__")) != plain_set) {
            // the class's own __setattr__ was traced around this store: the store itself
            s.kind = StepKind::Call;
            m_cap.record_effect(std::move(s), {m_cap.const_value(plain_set, "object.__setattr__"),
                                               obj, m_cap.const_value(name), val});
            return true;
        }
        s.kind = StepKind::SetAttr;
        s.name = py::Ref::borrow(name);
        m_cap.record_effect(std::move(s), {obj, val});
    }
    return true;
}

// module.name, imported once and kept for the process (callers cache it), or null.
static PyObject* module_attr(const char* module, const char* name) {
    PyObject* m = PyImport_ImportModule(module);
    PyObject* a = m ? PyObject_GetAttrString(m, name) : nullptr;
    Py_XDECREF(m);
    if (!a) PyErr_Clear();
    return a;
}

// os.environ, as os made it (borrowed), or null.
static PyObject* os_environ() {
    static PyObject* environ = module_attr("os", "environ");
    return environ;
}

// A member of an enum.Enum class (its `value` and `name` are properties, fixed for good).
static bool is_enum_member(PyObject* o) {
    static PyObject* enum_type = module_attr("enum", "Enum");
    if (!enum_type || PyType_Check(o)) return false;
    int r = PyObject_IsInstance(o, enum_type);
    if (r < 0) PyErr_Clear();
    return r == 1;
}

// Whether type(obj).name is object's own (the class does not define it).
static bool objects_own(PyObject* obj, const char* name) {
    PyObject* own = _PyType_Lookup(Py_TYPE(obj), interned(name));
    return own && own == PyDict_GetItemString(py::type_dict(&PyBaseObject_Type), name);
}

// str(obj) (`repr`: repr(obj)) about to run for the pending instruction, whose `in` starts
// with obj: the class's own __str__ traced as a hook, or its __repr__ when it keeps object's
// __str__ (which calls it; then that __str__ is guarded too, for a class that gains one later).
bool Monitor::expect_text_hook(Pending& p, bool repr) {
    int obj = p.in[0];
    bool via_repr = !repr && objects_own(m_cap.v(obj).real.get(), "__str__");
    if (!expect_hook(p, repr || via_repr ? "__repr__" : "__str__")) return false;
    if (via_repr) pin_type_attr(obj, "__str__");
    return true;
}

// Guards that type(obj).name is still what it is now (a hook traced because another one is
// object's: a class that gains __str__ later must not keep using its __repr__).
void Monitor::pin_type_attr(int obj, const char* name) {
    const Value& o = m_cap.v(obj);
    PyObject* attr = _PyType_Lookup(Py_TYPE(o.real.get()), interned(name));
    if (attr && !m_cap.failed() &&
        (o.kind == ValueKind::FreshObject || o.kind == ValueKind::Input))
        type_attr(obj, interned(name), attr);
}

// type(obj).name (`attr`), of an object made in the call (through its class) or passed in
// (through obj.__class__, with no instance attribute shadowing it), as a guarded value.
int Monitor::type_attr(int obj, PyObject* name, PyObject* attr) {
    return m_cap.v(obj).kind == ValueKind::FreshObject ? class_member(obj, name, attr)
                                                        : class_attr(obj, name, attr);
}

// [Note: hooks of objects made in the call] Whether the instruction pending in `p` (its `in`:
// the object, then the hook's other arguments) runs `dunder` of the object's class, written in
// Python: then it is traced as a method, and `p` says so.
bool Monitor::expect_hook(Pending& p, const char* dunder) {
    if (p.in.empty()) return false;
    const Value& o = m_cap.v(p.in[0]);
    if (o.real.get() == os_environ()) return false;  // its own rule ([Note: environment reads])
    bool read = std::strcmp(dunder, "__setattr__") != 0 && std::strcmp(dunder, "__setitem__") != 0;
    // (ModuleList and Sequential items, lengths and iteration are the module rules', not their
    // __getitem__, __len__ and __iter__'s)
    bool input = o.kind == ValueKind::Input && !o.tensor && o.real && !PyType_Check(o.real.get()) &&
                 (std::strcmp(dunder, "__contains__") == 0 ||
                  !PyObject_TypeCheck(o.real.get(), torch_api().module_type));
    if (o.kind != ValueKind::FreshObject && !input) return false;
    PyTypeObject* type = Py_TYPE(o.real.get());
    PyObject* fn = _PyType_Lookup(type, interned(dunder));
    if (!fn || !PyFunction_Check(fn)) return false;
    if (input && !read && !input_dict(p.in[0])) {
        // a write through the hook of an object passed in: followed only for a dict (a
        // ModelOutput given to a loss that sets `out.loss`), whose hook ends in the dict's and
        // object's own slots (CallKind::ObjectSlot)
        m_cap.fail(breaks::kUnsupportedAttribute,
                   "`" + std::string(type->tp_name) + "." + dunder + "` of " + o.label +
                       ", passed in, is Python code",
                   "change the object outside the compiled function");
        return true;
    }
    auto* code = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fn));
    if (!py::code_is_plain_function(code)) {
        m_cap.fail(breaks::kUnsupportedAttribute,
                   "`" + std::string(type->tp_name) + "." + dunder + "` is not a plain function",
                   "define it with def");
        return true;
    }
    int fv = type_attr(p.in[0], interned(dunder), fn);
    if (fv < 0) return true;
    p.callee = CalleeInfo{};
    p.callee.op = dunder;
    p.callee.kind = CallKind::InlineFunction;
    p.callee.name = std::string(type->tp_name) + "." + dunder;
    p.callee.code = code;
    p.callee_value = fv;
    p.hook = true;
    return true;
}

// [Note: environment reads] `os.environ.get(name, default)`, `os.getenv(name)`,
// `os.environ[name]` and `name in os.environ` (a debug flag read in a forward) read the process
// environment, which may change between calls. os.environ keeps it in a plain dict of bytes
// (`_data`, what os.putenv was given through it): the read is guarded there, the value by
// equality or the name's absence, so a changed variable recompiles and the answer is a
// constant of the capture. `fallback`: the value when the variable is not set (-1: none).
int Monitor::environ_read(int name, PyObject* result, int fallback) {
    auto fail = [&](const std::string& why) {
        m_cap.fail(breaks::kUnsupportedCallee, why,
                   "read the environment variable outside the compiled function");
        return -1;
    };
    if (!require_const({name}, "the name of an environment variable")) return -1;
    PyObject* key = m_cap.v(name).real.get();
    py::Ref os = py::Ref::steal(PyImport_ImportModule("os"));
    py::Ref data = py::Ref::steal(PyObject_GetAttrString(os_environ(), "_data"));
    py::Ref encoded = key && PyUnicode_Check(key)
                          ? py::Ref::steal(PyObject_CallMethod(os_environ(), "encodekey", "O", key))
                          : py::Ref();
    if (!os || !data || !PyDict_CheckExact(data.get()) || !encoded) {
        PyErr_Clear();
        return fail("os.environ is read in a way the capture does not know");
    }
    // os.environ is still the object read here (os.getenv reads it from os too), and _data its
    int env = m_cap.input_child(m_cap.constant_root(os.get(), "sys.modules['os']"),
                                AccessKind::Attr, 0, interned("environ"), ".environ", os_environ());
    if (env < 0) return -1;
    m_cap.guard_identity(env);
    int d = m_cap.input_child(env, AccessKind::Attr, 0, interned("_data"), "._data", data.get());
    if (d < 0) return -1;
    PyObject* held = PyDict_GetItemWithError(data.get(), encoded.get());  // borrowed
    if (!held && PyErr_Occurred()) {
        PyErr_Clear();
        return fail("os.environ is read in a way the capture does not know");
    }
    if (!held) {
        m_cap.guard_no_key(d, encoded.get());
        return fallback;
    }
    int v = m_cap.input_child(d, AccessKind::DictItem, 0, encoded.get(),
                              "[" + py::repr_string(encoded.get()) + "]", held);
    if (v < 0 || !require_const({v}, "an environment variable")) return -1;
    return result ? m_cap.const_value(result) : -1;
}

// CallKind::ObjectSlot, after the call ran: `object.__setattr__(obj, name, v)` is the plain
// store; dict's and OrderedDict's item slots act on the object's items.
int Monitor::object_slot_call(const Pending& p, PyObject* result) {
    const std::string& slot = p.callee.op;
    int obj = p.in[0];
    if (m_cap.v(obj).kind == ValueKind::Input) {  // a dict passed in, as dict and object do it
        size_t n = p.in.size();
        if (slot == "__getitem__" && n == 2 && !p.kwnames && result)
            return subscript(obj, p.in[1], result);
        if (slot == "__getattribute__" && n == 2 && result) {
            // object's own lookup: a plain attribute, read past the class's hook (what the
            // call wrote there first: a review probe found the entry value replayed)
            PyObject* name = m_cap.v(p.in[1]).real.get();
            auto written = m_cap.overlay().find({obj, str(name)});
            if (written != m_cap.overlay().end()) return written->second;
            PyObject* o = m_cap.v(obj).real.get();
            std::string code = code_on_read(o, name);
            if (code.empty() && is_code_descriptor(Py_TYPE(o), name)) code = "a data descriptor";
            if (!code.empty())
                return m_cap.fail(breaks::kUnsupportedAttribute,
                                  "`" + m_cap.v(obj).label + "." + str(name) + "` is computed by " +
                                      code, "read a plain attribute"),
                       -1;
            return m_cap.input_child(obj, AccessKind::GenericAttr, 0, name, "." + str(name), result);
        }
        bool named = n == 3 && !p.kwnames && result && require_const({p.in[1]}, p.callee.name);
        PyObject* slot_fn = m_cap.v(p.callee_value).real.get();
        if (named && slot == "__setitem__" && p.had_key >= 0) {  // super().__setitem__(k, v)
            write_input_item(obj, p.in[1], p.in[2], p.had_key == 0, slot_fn);
            return m_cap.failed() ? -1 : m_cap.const_value(Py_None);
        }
        if (named && slot == "__setattr__" && PyUnicode_Check(m_cap.v(p.in[1]).real.get())) {
            // object.__setattr__(obj, name, v): the plain store, replayed as that call (not
            // through the class's own __setattr__ again)
            Step s;
            s.kind = StepKind::Call;
            m_cap.record_effect(std::move(s), {m_cap.const_value(slot_fn), obj, p.in[1], p.in[2]});
            m_cap.overlay()[{obj, str(m_cap.v(p.in[1]).real.get())}] = p.in[2];
            return m_cap.const_value(Py_None);
        }
        if (!m_cap.failed())
            m_cap.fail(breaks::kUnsupportedCallee, "`" + p.callee.name + "` is called on " +
                           m_cap.v(obj).label, "read its items with d[key]");
        return -1;
    }
    int items = m_cap.v(obj).mapping;
    size_t n = p.in.size();
    auto key_const = [&](size_t i) { return require_const({p.in[i]}, "the key of " + p.callee.name); };
    if (!result) return -1;  // it raised: the exception is followed as any other
    if (p.kwnames) {
        m_cap.fail(breaks::kUnsupportedCallee, "`" + p.callee.name + "` with keywords",
                   "pass the arguments by position");
        return -1;
    }
    if (slot == "__init__" && n == 1) return m_cap.const_value(Py_None);
    if (slot == "__setattr__" && n == 3 && key_const(1) &&
        PyUnicode_Check(m_cap.v(p.in[1]).real.get())) {
        if (!set_object_attr(obj, m_cap.v(p.in[1]).real.get(), p.in[2])) return -1;
        return m_cap.const_value(Py_None);
    }
    if (items >= 0 && slot == "__setitem__" && n == 3 && key_const(1)) {
        set_fresh_item(items, p.in[1], p.in[2]);
        return m_cap.const_value(Py_None);
    }
    if (items >= 0 && slot == "__getitem__" && n == 2) return subscript(items, p.in[1], result);
    if (items >= 0 && slot == "__delitem__" && n == 2 && key_const(1)) {
        if (remove_dict_item(items, p.in[1], nullptr, false) < 0) return -1;
        return m_cap.const_value(Py_None);
    }
    if (items >= 0 && (slot == "__len__" || slot == "__contains__")) {
        // the keys are constants: so is the answer
        if (!require_const(std::vector<int>(p.in.begin() + 1, p.in.end()), p.callee.name))
            return -1;
        return m_cap.const_value(result);
    }
    if (!m_cap.failed())
        m_cap.fail(breaks::kUnsupportedCallee,
                   "`" + p.callee.name + "` is called on " + m_cap.v(obj).label,
                   "use the object's attributes and items directly");
    return -1;
}

// obj.name of an object made in the call: what was set, else the class's attribute (`method`:
// a function, bound by LOAD_METHOD with the object as self).
int Monitor::object_attr(int obj, PyObject* name, PyObject* real, bool method) {
    const Value& o = m_cap.v(obj);
    std::string label = o.label + "." + str(name);
    PyTypeObject* type = Py_TYPE(o.real.get());
    if (str(name) == "__dict__") {  // (a C descriptor, not a property)
        m_cap.fail(breaks::kUnsupportedAttribute,
                   "`" + label + "` (or vars()) of an object made in the call is not followed",
                   "read its attributes directly: obj.name");
        return -1;
    }
    if (is_data_descriptor(type, name)) {
        m_cap.fail(breaks::kUnsupportedAttribute,
                   "`" + label + "` is a property (its getter runs Python code)",
                   "read the underlying attribute, or make it a plain attribute");
        return -1;
    }
    int at = fresh_dict_slot(obj, name);
    if (at >= 0) return m_cap.v(obj).items[static_cast<size_t>(at)];
    PyObject* attr = _PyType_Lookup(type, name);
    if (attr && !method && PyFunction_Check(attr) && real && PyMethod_Check(real) &&
        PyMethod_GET_FUNCTION(real) == attr) {
        // `self.update` read as a value (3.11 emits LOAD_ATTR for `self.update(*a, **kw)`, as
        // Counter.__init__ has): the function with the object, called as LOAD_METHOD's form
        int func = class_member(obj, name, attr);
        if (func < 0) return -1;
        int m = m_cap.new_value(ValueKind::BoundMethod, real, label);
        m_cap.v(m).items = {func, obj};
        return m;
    }
    if (!attr || (!method && Py_TYPE(attr)->tp_descr_get)) {
        m_cap.fail(breaks::kUnsupportedAttribute,
                   attr ? "`" + label + "` is a bound method used as a value"
                        : "`" + label + "` is not set (AttributeError)",
                   attr ? "call the method directly" : "set it in __init__");
        return -1;
    }
    if (method && attr != real) return m_cap.internal_error("method lookup"), -1;
    return class_member(obj, name, attr);
}

// A constant of the capture that can change all the same: a class of the user's (its
// attributes), or a Python function (its defaults). [Note: constants that can change]
static bool mutable_constant(PyObject* o) {
    return PyFunction_Check(o) ||
           (PyType_Check(o) && (reinterpret_cast<PyTypeObject*>(o)->tp_flags & Py_TPFLAGS_HEAPTYPE));
}

// `attr`, found as `name` on the class of an object made in the call: guarded through the
// class, held by the guards when the capture knows it only as a constant.
int Monitor::class_member(int obj, PyObject* name, PyObject* attr) {
    int cls = m_cap.v(obj).cls;
    PyObject* type = m_cap.v(cls).real.get();
    if (m_cap.v(cls).kind != ValueKind::Input && type && mutable_constant(type)) {
        // a class known as a constant (`type(cfg)(...)`, `obj.__class__(...)`): its
        // attributes can still change between calls, so they are read through the class held
        // by the guards
        cls = m_cap.constant_root(type, reinterpret_cast<PyTypeObject*>(type)->tp_name, true);
    }
    if (m_cap.v(cls).kind == ValueKind::Input)
        return m_cap.input_child(cls, AccessKind::TypeLookup, 0, name, "." + str(name), attr);
    return m_cap.const_value(attr);
}

// sorted(xs[, reverse=b]) of items the capture knows, in an order that follows from the guards
// alone: constants (a dict's keys, guarded items of a list) or the (constant key, value) pairs
// of d.items(). The result is a fresh list of those same items in the order sorted() gave.
int Monitor::sorted_items(const Pending& p, PyObject* result) {
    auto unsupported = [&](const std::string& why) {
        m_cap.fail(breaks::kUnsupportedCallee, "`sorted()` " + why,
                   "sort constants, a dict's keys or d.items() (by key), or sort before calling "
                   "the compiled function");
        return -1;
    };
    size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
    for (size_t k = 0; k < nkw; ++k)
        if (str(PyTuple_GET_ITEM(p.kwnames, static_cast<Py_ssize_t>(k))) != "reverse")
            return unsupported("with a key function");
    if (!require_const(std::vector<int>(p.in.end() - static_cast<long>(nkw), p.in.end()),
                       "`sorted(reverse=...)`"))
        return -1;
    if (p.in.size() != nkw + 1 || !result || !PyList_CheckExact(result))
        return unsupported("without one iterable");
    int src = p.in[0];
    const Value& s = m_cap.v(src);
    std::vector<int> items;
    size_t width = 1;
    if (s.kind == ValueKind::FreshDict ||
        (s.kind == ValueKind::Input && PyDict_Check(s.real.get()))) {
        if (!dict_view(src, DictView::Keys, items)) return -1;
    } else if (s.kind == ValueKind::Iterator && s.iter_view) {  // d.keys(), d.items()
        items = s.items;
        width = static_cast<size_t>(std::max(1, s.iter_width));
    } else if (!items_of(src, items)) {
        return -1;
    }
    size_t n = items.size() / width;
    if (static_cast<size_t>(PyList_GET_SIZE(result)) != n)
        return m_cap.internal_error("sorted() gave another number of items"), -1;
    for (size_t g = 0; g < n; ++g) {
        int key = items[g * width];
        if (orders_as_constant(key)) continue;
        if (m_cap.v(key).tensor || m_cap.holds(key, &Value::dyn_scalar))
            return m_cap.fail(breaks::kTensorToPython,
                              "`sorted()` compares " + m_cap.v(key).label + ", a tensor or a "
                              "number read from one",
                              "sort with torch.sort, or keep the order fixed"),
                   -1;
        return unsupported("of " + m_cap.v(key).label + ", whose order the guards do not fix");
    }
    std::vector<bool> used(n, false);
    std::vector<int> out;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(result); ++i) {
        PyObject* r = PyList_GET_ITEM(result, i);
        PyObject* key = r;
        if (width == 2) {
            if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2)
                return m_cap.internal_error("sorted() of pairs"), -1;
            key = PyTuple_GET_ITEM(r, 0);
        }
        size_t found = n;
        for (size_t g = 0; g < n && found == n; ++g)  // the same object first,
            if (!used[g] && m_cap.v(items[g * width]).real.get() == key) found = g;
        for (size_t g = 0; g < n && found == n; ++g) {  // then an equal one
            int eq = used[g] ? 0
                             : PyObject_RichCompareBool(m_cap.v(items[g * width]).real.get(), key, Py_EQ);
            if (eq < 0) PyErr_Clear();
            if (eq == 1) found = g;
        }
        if (found == n) return m_cap.internal_error("an item sorted() gave"), -1;
        used[found] = true;
        out.push_back(width == 1 ? items[found]
                                 : m_cap.fresh(ValueKind::FreshTuple,
                                               {items[found * 2], items[found * 2 + 1]}, r));
    }
    return m_cap.fresh(ValueKind::FreshList, out, result);
}

// [Note: key functions] sorted(xs, key=f), min(xs, key=f), max(a, b, key=f): sorted() calls
// f from C once per item, in order, before it compares anything. Before the call runs, the
// items are read (they must be known, as for map) and a map record is made for f over them
// ([Note: map]), so those calls are traced like a map's. Afterwards the keys must be fixed by
// the guards (constants, guarded sizes): the result is then the same items in the order the
// call gave, and replay does not sort. A key that is a tensor or a number read from one
// decides the order from data: that breaks.
void Monitor::prepare_key(Pending& p) {
    size_t npos = p.in.size() - (p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0);
    int key = kwarg(p, "key");
    if (key < 0 || m_cap.v(key).real.get() == Py_None || npos == 0) return;
    const std::string& name = p.callee.name;
    std::vector<int> items;
    if (npos > 1) {  // max(a, b, key=f)
        items.assign(p.in.begin(), p.in.begin() + static_cast<long>(npos));
    } else {
        const Value& src = m_cap.v(p.in[0]);
        bool dict = src.kind == ValueKind::FreshDict ||
                    (src.kind == ValueKind::Input && PyDict_Check(src.real.get()));
        if (GenRecord* g = generator_of(p.in[0]); g && !g->done) {
            // sorted(g, key=f): the items are known as the generator yields them
            int gen = static_cast<int>(g - m_gens.data());
            size_t from = g->yielded.size();
            p.key_map = map_record(key, {{}}, "the key of `" + name + "()`",
                                   "use a lambda or a def as the key");
            if (p.key_map >= 0) {
                m_maps[static_cast<size_t>(p.key_map)].gen = gen;
                m_maps[static_cast<size_t>(p.key_map)].gen_from = from;
            }
            return;
        }
        if (dict ? !dict_view(p.in[0], DictView::Keys, items) : !items_of(p.in[0], items)) return;
    }
    p.key_map = map_record(key, {items}, "the key of `" + name + "()`",
                           "use a lambda or a def as the key, or " + name +
                           "() before calling the compiled function");
}

// [Note: map] functools.reduce(f, xs[, init]) with f a Python function calls f from C once per
// item, with what the call before returned first: a map record over the items whose first
// column is filled in as each call returns (MapRecord::fold). What the last call returned is
// the result; the calls are traced, so nothing runs at replay but the steps they recorded.
// (reduce of a pure builtin over constants, `reduce(operator.mul, x.shape)`, is folded.)
void Monitor::prepare_fold(Pending& p) {
    if (p.kwnames || p.in.size() < 2 || p.in.size() > 3) return;
    PyObject* fn = m_cap.v(p.in[0]).real.get();
    if (fn && PyCFunction_Check(fn) && classify_callee(fn).kind == CallKind::Unsupported)
        return m_cap.fail(breaks::kUnsupportedCallee,
                          "`functools.reduce()` with `" + classify_callee(fn).name +
                              "`, which changes its first argument",
                          "write the loop, or flatten with a comprehension");
    if (!fn || !(PyFunction_Check(fn) ||
                 (PyMethod_Check(fn) && PyFunction_Check(PyMethod_GET_FUNCTION(fn)))))
        return;  // a builtin: folded over constants, or refused, as any pure builtin
    std::vector<int> items;
    if (!items_of(p.in[1], items)) return;
    std::vector<int> accs(items.size(), m_cap.null_value());  // filled in as calls return
    if (p.in.size() == 3) {
        accs.insert(accs.begin(), p.in[2]);
    } else if (!items.empty()) {
        accs.insert(accs.begin(), items[0]);
        items.erase(items.begin());
    }
    accs.resize(items.size());
    p.fold_map = map_record(p.in[0], {accs, items}, "the function given to `functools.reduce()`",
                            "reduce with a lambda or a def, or write the loop");
    if (p.fold_map >= 0) m_maps[static_cast<size_t>(p.fold_map)].fold = true;
}

// The result of a reduce() whose calls were traced: what the last one returned (or the
// initial value, or the only item, when f was never called).
int Monitor::fold_result(const Pending& p, PyObject* result) {
    const MapRecord& rec = m_maps[static_cast<size_t>(p.fold_map)];
    if (!result) return -1;
    int r = -1;
    if (!rec.steps.empty()) {
        if (rec.results.size() != rec.steps.size())
            return m_cap.internal_error("reduce() made other calls than its items say"), -1;
        r = rec.results.back();
    } else {
        std::vector<int> items;
        if (p.in.size() == 3) r = p.in[2];
        else if (items_of(p.in[1], items) && items.size() == 1) r = items[0];
    }
    if (r < 0 || (m_cap.v(r).real.get() != result && m_cap.v(r).kind != ValueKind::Const))
        return m_cap.internal_error("reduce() returned another object than its last call"), -1;
    return r;
}

// A sort key whose comparisons the guards fix: a number, string, bytes, bool or None the
// guards know, or a tuple of such. (An identity-guarded object is known too, but its __lt__
// may read state that changes between calls.)
bool Monitor::orders_as_constant(int id, int depth) {
    if (!known(id) || depth > 8) return false;
    const Value& v = m_cap.v(id);
    PyObject* o = v.real.get();
    if (v.kind == ValueKind::FreshTuple || (o && PyTuple_CheckExact(o) && v.kind != ValueKind::Const)) {
        std::vector<int> items;
        if (!items_of(id, items)) return false;
        for (int it : items)
            if (!orders_as_constant(it, depth + 1)) return false;
        return true;
    }
    if (v.kind != ValueKind::Const || !o) return false;
    if (PyTuple_CheckExact(o)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); ++i) {
            PyObject* it = PyTuple_GET_ITEM(o, i);
            if (!(it == Py_None || PyLong_CheckExact(it) || PyFloat_CheckExact(it) ||
                  PyUnicode_CheckExact(it) || PyBytes_CheckExact(it) || PyBool_Check(it)))
                return false;
        }
        return true;
    }
    return o == Py_None || PyLong_Check(o) || PyFloat_Check(o) || PyUnicode_CheckExact(o) ||
           PyBytes_CheckExact(o);
}

// The keys a call ordered by (or picked the least or greatest of) follow from the guards, and
// so does `reverse=`: the order at replay is the order now.
bool Monitor::keys_fixed(const Pending& p, const std::vector<int>& keys) {
    const std::string& name = p.callee.name;
    for (int k : keys) {
        if (orders_as_constant(k)) continue;
        if (m_cap.v(k).tensor || m_cap.holds(k, &Value::dyn_scalar))
            return m_cap.fail(breaks::kTensorToPython,
                              "`" + name + "()` compares " + m_cap.v(k).label + ", a tensor or a "
                              "number read from one: the order depends on data",
                              "use torch.sort / argsort / argmax, or keep the order fixed"), false;
        return m_cap.fail(breaks::kUnsupportedCallee,
                          "`" + name + "()` compares " + m_cap.v(k).label +
                          ", whose order the guards do not fix",
                          "order by constants or sizes"), false;
    }
    int reverse = kwarg(p, "reverse");
    return reverse < 0 || require_const({reverse}, "`" + name + "(reverse=...)`");
}

// The value passed as keyword `name` to the pending call, or -1.
int Monitor::kwarg(const Pending& p, const char* name) {
    size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
    for (size_t k = 0; k < nkw; ++k)
        if (str(PyTuple_GET_ITEM(p.kwnames, static_cast<Py_ssize_t>(k))) == name)
            return p.in[p.in.size() - nkw + k];
    return -1;
}

// `items` in the order the objects of `seq` (a list) have them, matched by identity: an object
// that occurs twice has equal keys both times, so which of its values goes first is the same.
bool Monitor::reorder(std::vector<int>& items, PyObject* seq) {
    if (!PyList_CheckExact(seq) || static_cast<size_t>(PyList_GET_SIZE(seq)) != items.size())
        return m_cap.internal_error("a sort gave another number of items"), false;
    std::vector<int> out;
    std::vector<bool> used(items.size(), false);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(seq); ++i) {
        size_t g = 0;
        PyObject* got = PyList_GET_ITEM(seq, i);
        while (g < items.size() && (used[g] || !stands_for(items[g], got))) ++g;
        if (g == items.size()) return m_cap.internal_error("an item a sort gave"), false;
        used[g] = true;
        m_cap.v(items[g]).real = py::Ref::borrow(got);  // (a pair C code made: the one it holds)
        out.push_back(items[g]);
    }
    items = std::move(out);
    return true;
}

// The result of a call prepare_key() prepared, once its key calls were traced.
int Monitor::keyed_result(const Pending& p, PyObject* result) {
    const std::string& name = p.callee.name;
    if (!sync_gen_steps(m_maps[static_cast<size_t>(p.key_map)])) return -1;
    const MapRecord& rec = m_maps[static_cast<size_t>(p.key_map)];
    bool gen_left = rec.gen >= 0 && !m_gens[static_cast<size_t>(rec.gen)].done;
    if (!result || gen_left || rec.results.size() != rec.steps.size())
        return m_cap.fail(breaks::kUnsupportedCallee,
                          "`" + name + "()` did not call its key once for every item",
                          "call " + name + "() before calling the compiled function"), -1;
    if (!keys_fixed(p, rec.results)) return -1;
    std::vector<int> items;
    for (const std::vector<int>& step : rec.steps) items.push_back(step.back());
    if (name == "sorted")
        return reorder(items, result) ? m_cap.fresh(ValueKind::FreshList, items, result) : -1;
    for (int item : items)  // min / max: one of the items, or the default
        if (m_cap.v(item).real.get() == result) return item;
    for (int item : items)  // the first equal one: the first of equal keys
        if (stands_for(item, result)) {
            m_cap.v(item).real = py::Ref::borrow(result);
            return item;
        }
    int fallback = kwarg(p, "default");
    return fallback >= 0 ? fallback : (m_cap.internal_error(name + "() gave another object"), -1);
}

// xs.sort(key=f, reverse=b) of a list made in the call, or passed in (read before the call):
// its items in the new order, when the keys follow from the guards ([Note: key functions]).
// A list that exists at replay is sorted there by the same call, which needs no key function
// to be rebuilt only when it has none.
int Monitor::sort_list(const Pending& p) {
    int lst = p.in[0];
    std::vector<int> keys = m_cap.v(lst).items;
    if (p.key_map >= 0) {
        const MapRecord& rec = m_maps[static_cast<size_t>(p.key_map)];
        if (rec.results.size() != rec.steps.size())
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`list.sort()` did not call its key once for every item",
                              "sort before calling the compiled function"), -1;
        keys = rec.results;
    }
    if (!keys_fixed(p, keys)) return -1;
    if (m_cap.exists_at_replay(lst) && p.key_map >= 0)
        return m_cap.fail(breaks::kUnsupportedCallee,
                          "`list.sort(key=...)` of " + m_cap.v(lst).label + ", a list that "
                          "exists outside the call", "use sorted(..., key=...) and keep the result"), -1;
    std::vector<int> items = m_cap.v(lst).items;
    if (!reorder(items, m_cap.v(lst).real.get())) return -1;
    m_cap.v(lst).items = std::move(items);
    replay_list_call(p.callee_value, p.in, p.kwnames);  // its items are guarded
    return m_cap.const_value(Py_None);
}

// The key, value pairs of a mapping whose contents the capture knows (fresh, or an input dict
// with its keys and values guarded).
// Key `i` (`key`) of a dict passed in, in its order: a constant, or an object read through the
// dict's keys (guarded by identity there, and its attributes as any input's are).
int Monitor::input_dict_key(int dict, Py_ssize_t i, PyObject* key) {
    if (is_constant_like(key)) return m_cap.const_value(key);
    py::Ref keys = py::Ref::steal(PyDict_Keys(m_cap.v(dict).real.get()));
    py::Ref tuple = keys ? py::Ref::steal(PyList_AsTuple(keys.get())) : py::Ref();
    if (!tuple) {
        PyErr_Clear();
        return m_cap.internal_error("the keys of a dict"), -1;
    }
    int kv = m_cap.input_child(dict, AccessKind::DictKeys, 0, nullptr, ".keys()", tuple.get());
    if (kv < 0) return -1;
    return m_cap.input_child(kv, AccessKind::Item, static_cast<int>(i), nullptr,
                             "[" + std::to_string(i) + "]", key);
}

bool Monitor::pairs_of(int dict, std::vector<int>& out) {
    Value& d = m_cap.v(dict);
    if (d.kind == ValueKind::FreshDict) {
        out = d.items;
        return true;
    }
    if (d.kind == ValueKind::Input && PyDict_Check(d.real.get()) && !d.mutated) {
        if (stale_instance_dict(dict)) return false;
        PyObject* o = m_cap.v(dict).real.get();
        // its keys in order (a copy or `**d` keeps it: a review probe found `{**feats}`
        // replaying the order of the capture)
        py::Ref keys = py::Ref::steal(PyDict_Keys(o));
        py::Ref order = keys ? py::Ref::steal(PyList_AsTuple(keys.get())) : py::Ref();
        if (!order) {
            PyErr_Clear();
            return m_cap.internal_error("the keys of a dict"), false;
        }
        if (m_cap.input_child(dict, AccessKind::DictKeys, 0, nullptr, ".keys()", order.get()) < 0)
            return false;
        Py_ssize_t pos = 0;
        PyObject *key, *val;
        out.clear();
        Py_ssize_t i = 0;
        while (PyDict_Next(o, &pos, &key, &val)) {
            int kv = dict_item(dict, key, val);
            int k = kv < 0 ? -1 : input_dict_key(dict, i++, key);
            if (k < 0) return false;
            out.push_back(k);
            out.push_back(kv);
        }
        return true;
    }
    if (d.kind == ValueKind::Input && PyDict_Check(d.real.get()) && d.keyed_writes) {
        // [Note: dict writes] Written only by d["name"] = v: the keys it had at entry (guarded,
        // in order) with their values or the ones written, then the keys the call added.
        PyObject* now = d.real.get();
        const std::vector<int> added = m_added_keys[dict];
        auto is_added = [&](PyObject* key) {
            for (int a : added)
                if (m_cap.v(a).real.get() == key ||
                    PyObject_RichCompareBool(m_cap.v(a).real.get(), key, Py_EQ) == 1)
                    return true;
            PyErr_Clear();
            return false;
        };
        py::Ref entry_keys = py::Ref::steal(PyList_New(0));
        Py_ssize_t pos = 0;
        PyObject *key, *val;
        while (PyDict_Next(now, &pos, &key, &val))
            if (!is_added(key)) PyList_Append(entry_keys.get(), key);
        m_cap.guard_len(dict, PyList_GET_SIZE(entry_keys.get()));
        py::Ref keys_tuple = py::Ref::steal(PyList_AsTuple(entry_keys.get()));
        int keys_value = m_cap.input_child(dict, AccessKind::DictKeys, 0, nullptr, ".keys()",
                                           keys_tuple.get());
        if (keys_value < 0) return false;
        out.clear();
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entry_keys.get()); ++i) {
            PyObject* k = PyList_GET_ITEM(entry_keys.get(), i);
            int kv = written_item(dict, k);
            if (kv < 0) kv = dict_item(dict, k, PyDict_GetItem(now, k));
            if (kv < 0) return false;
            out.push_back(is_constant_like(k) ? m_cap.const_value(k)
                                              : m_cap.input_child(keys_value, AccessKind::Item,
                                                                  static_cast<int>(i), nullptr,
                                                                  "[" + std::to_string(i) + "]", k));
            if (out.back() < 0) return false;
            out.push_back(kv);
        }
        for (int a : added) {
            out.push_back(a);
            out.push_back(written_item(dict, m_cap.v(a).real.get()));
        }
        return true;
    }
    m_cap.fail(breaks::kUnsupportedCallee, "the items of `" + d.label + "` are unpacked with **",
               "unpack dicts passed in or made in the function");
    return false;
}

// Where `key`'s value sits in a fresh dict's items (key, value, ...), or -1.
int Monitor::fresh_dict_slot(int dict, PyObject* key) {
    const std::vector<int>& items = m_cap.v(dict).items;
    for (size_t j = 0; j + 1 < items.size(); j += 2) {
        int eq = PyObject_RichCompareBool(m_cap.v(items[j]).real.get(), key, Py_EQ);
        if (eq < 0) PyErr_Clear();
        if (eq == 1) return static_cast<int>(j + 1);
    }
    return -1;
}

// d[key] = val on a dict made in the call: its items follow, and once the dict exists at
// replay (it escaped) the write is replayed there too.
void Monitor::set_fresh_item(int dict, int key, int val) {
    dict_set(dict, key, val);
    if (escaped_mapping_write(dict, "__setitem__", {key, val})) return;
    if (m_cap.v(dict).built >= 0) {
        Step s;
        s.kind = StepKind::SetItem;
        m_cap.record_effect(std::move(s), {dict, key, val});
    }
}

void Monitor::dict_set(int dict, int key, int val) {
    int at = fresh_dict_slot(dict, m_cap.v(key).real.get());
    std::vector<int>& items = m_cap.v(dict).items;
    if (at >= 0) {
        items[static_cast<size_t>(at)] = val;
        return;
    }
    items.push_back(key);
    items.push_back(val);
}

// d[key] of a dict passed in, as a guarded input value.
int Monitor::dict_item(int dict, PyObject* key, PyObject* real) {
    if (stale_instance_dict(dict)) return -1;
    return m_cap.input_child(dict, AccessKind::DictItem, 0, key, "[" + py::repr_string(key) + "]",
                             real);
}

// `key` looked up in a dict passed in: the value this call wrote there, its value (guarded), or
// the null value with the key guarded absent.
// [Note: writes] `obj.__dict__` of an object passed in, read after the call set an attribute of
// obj (whose write the capture keeps by attribute, not in this dict): true, after failing.
bool Monitor::stale_instance_dict(int dict) {
    int obj = m_cap.v(dict).dict_of;
    if (obj < 0) return false;
    auto it = m_cap.overlay().lower_bound({obj, std::string()});
    if (it == m_cap.overlay().end() || it->first.first != obj) return false;
    m_cap.fail(breaks::kMutatedThenRead,
               "`" + m_cap.v(dict).label + "` is read after this function set attributes of " +
                   m_cap.v(obj).label,
               "read the attributes by name");
    return true;
}

int Monitor::dict_lookup(int dict, PyObject* key) {
    int written = written_item(dict, key);
    if (written >= 0) return written;
    PyObject* hit = PyDict_GetItemWithError(m_cap.v(dict).real.get(), key);
    if (hit) return dict_item(dict, key, hit);
    PyErr_Clear();
    m_cap.guard_no_key(dict, key);
    return m_cap.null_value();
}

// [Note: dict writes]
// A dict passed in (a stats or cache dict) written as d["name"] = v is still readable by key:
// the written values are kept in the capture's overlay under "[name]", and any other key holds
// what it held at entry, so reading it is an ordinary guarded input read. Only string keys are
// tracked (1, 1.0 and True are one key to a dict but not to a name). Whole-dict reads (len,
// iteration, passing it on) after a write, and writes with other keys, still break (MB008).
static std::string item_name(PyObject* key) {
    return key && PyUnicode_CheckExact(key) ? "[" + py::str_of(key) + "]" : std::string();
}

int Monitor::written_item(int dict, PyObject* key) {
    const Value& d = m_cap.v(dict);
    if (!d.keyed_writes) return -1;
    std::string name = item_name(key);
    if (name.empty()) return -1;
    auto it = m_cap.overlay().find({dict, name});
    return it == m_cap.overlay().end() ? -1 : it->second;
}

void Monitor::write_input_item(int dict, int key, int val, bool added, PyObject* via) {
    if (m_cap.v(dict).dict_of >= 0)
        return m_cap.fail(breaks::kUnsupportedOpcode,
                          "`" + m_cap.v(dict).label + "` is written: attributes set through "
                          "__dict__ are not followed", "set the attribute with setattr(obj, name, value)");
    if (added) m_added_keys[dict].push_back(key);  // a new key goes last in iteration order
    Step s;
    if (via) {  // the dict's own __setitem__ called past a class's hook: replayed as that call
        s.kind = StepKind::Call;
        m_cap.record_effect(std::move(s), {m_cap.const_value(via), dict, key, val});
    } else {
        s.kind = StepKind::SetItem;
        m_cap.record_effect(std::move(s), {dict, key, val});
    }
    std::string name = m_cap.v(key).kind == ValueKind::Const ? item_name(m_cap.v(key).real.get())
                                                             : std::string();
    Value& d = m_cap.v(dict);  // (after record_effect, which may add values)
    d.keyed_writes = !name.empty() && (!d.mutated || d.keyed_writes);
    d.mutated = true;
    if (d.keyed_writes) m_cap.overlay()[{dict, name}] = val;
}

// `d.pop(key)` or `del d[key]` on a dict made in the call or passed in: the value removed (or
// the null value when the key is missing), with the removal replayed where the dict exists at
// replay. `present` is the value the key held before the removal ran (null: absent), for a
// dict passed in. A dict passed in must not have been written before in the call: its later
// reads break (MB008), as after any write that is not by key.
int Monitor::remove_dict_item(int dict, int key, PyObject* present, bool want_value) {
    static PyObject* pop = PyDict_GetItemString(py::type_dict(&PyDict_Type), "pop");
    PyObject* k = m_cap.v(key).real.get();
    int removed;
    if (m_cap.v(dict).kind == ValueKind::FreshDict) {
        int at = fresh_dict_slot(dict, k);
        if (at < 0) return m_cap.null_value();
        std::vector<int>& items = m_cap.v(dict).items;
        removed = items[static_cast<size_t>(at)];
        items.erase(items.begin() + at - 1, items.begin() + at + 1);
        if (escaped_mapping_write(dict, "pop", {key})) return removed;
        if (m_cap.v(dict).built < 0) return removed;
    } else {
        if (m_cap.v(dict).dict_of >= 0) {
            m_cap.fail(breaks::kUnsupportedOpcode,
                       "an item is removed from `" + m_cap.v(dict).label + "`: attributes "
                       "deleted through __dict__ are not followed", "use delattr(obj, name)");
            return -1;
        }
        if (m_cap.v(dict).mutated) {
            m_cap.fail(breaks::kMutatedThenRead,
                       "an item is removed from `" + m_cap.v(dict).label +
                           "` after this function changed it",
                       "remove items before changing the dict, or copy it first");
            return -1;
        }
        if (!present) {
            m_cap.guard_no_key(dict, k);
            return m_cap.null_value();
        }
        // `del d[k]` needs only that the key is there (its value's type is guarded, not its
        // value); d.pop(k) gives the value, guarded as any read
        removed = m_cap.input_child(dict, AccessKind::DictItem, 0, k,
                                    "[" + py::repr_string(k) + "]", present, !want_value);
        if (removed < 0) return -1;
        m_cap.v(dict).mutated = true;
        m_cap.v(dict).keyed_writes = false;
    }
    Step s;
    s.kind = StepKind::Call;
    m_cap.record_effect(std::move(s), {m_cap.const_value(pop, "dict.pop"), dict, key});
    return removed;
}

// A list method on a list made in the function or passed in. The capture follows the contents;
// when the list exists at replay (passed in, or already stored or returned), the call is
// replayed there in program order too.
int Monitor::mutate_list(int callee, const std::string& name, const std::vector<int>& in) {
    if (in.empty()) {
        m_cap.internal_error("list method without self");
        return -1;
    }
    int lst = in[0];
    Value& l = m_cap.v(lst);
    bool input = l.kind == ValueKind::Input && !l.tensor && PyList_CheckExact(l.real.get());
    if (l.kind != ValueKind::FreshList && !input) {
        m_cap.fail(breaks::kUnsupportedCallee, "list." + name + "() on " + l.label,
                   "call list methods on lists");
        return -1;
    }
    // Appending to a list passed in needs nothing of its contents (a log growing every call
    // must not be guarded by its length); anything else follows the contents from here on.
    bool append_only = name == "append" || name == "extend";
    if (input && name == "copy" && !m_cap.shadow(lst)) return -1;
    if (input && name == "clear" && in.size() == 1 && !l.shadow) {
        l.items.clear();
        l.mutated = false;
        l.shadow = true;  // empty from here on, whatever it held
    } else if (input && !l.shadow && append_only) {
        l.mutated = true;
    } else if (input && !m_cap.shadow(lst)) {
        return -1;
    }
    std::vector<int>& items = m_cap.v(lst).items;  // stable: values live in a deque
    auto const_index = [&](int id, Py_ssize_t& i) {
        const Value& v = m_cap.v(id);
        if (v.kind != ValueKind::Const || !PyLong_Check(v.real.get())) return false;
        i = PyLong_AsSsize_t(v.real.get());
        return true;
    };
    if (name == "copy" && in.size() == 1) {  // not a mutation: a new list of the same items
        std::vector<int> copy = items;
        return m_cap.fresh(ValueKind::FreshList, copy, nullptr);
    }
    Py_ssize_t size = static_cast<Py_ssize_t>(items.size()), i = 0;
    size_t n = in.size();
    int result = m_cap.const_value(Py_None);
    if (name == "append" && n == 2) {
        items.push_back(in[1]);
    } else if (name == "extend" && n == 2) {
        std::vector<int> more;
        if (!items_of(in[1], more)) return -1;
        items.insert(items.end(), more.begin(), more.end());
    } else if (name == "insert" && n == 3 && const_index(in[1], i)) {
        if (i < 0) i = std::max<Py_ssize_t>(0, i + size);
        items.insert(items.begin() + std::min(i, size), in[2]);
    } else if (name == "pop" && (n == 1 || (n == 2 && const_index(in[1], i)))) {
        i = n == 1 ? size - 1 : i < 0 ? i + size : i;
        if (i < 0 || i >= size) {
            m_cap.internal_error("pop from an empty list");
            return -1;
        }
        result = items[static_cast<size_t>(i)];
        items.erase(items.begin() + i);
    } else if (name == "clear" && n == 1) {
        items.clear();
    } else if (name == "reverse" && n == 1) {
        std::reverse(items.begin(), items.end());
    } else {
        m_cap.fail(breaks::kUnsupportedCallee, "list." + name + "() on " + l.label,
                   "use append, extend, insert (constant index), pop, clear or reverse");
        return -1;
    }
    replay_list_call(callee, in, nullptr);
    return result;
}

// A list method called on a list that exists at replay (passed in, or escaped) is called on it
// there too, as a write the others keep their order with.
void Monitor::replay_list_call(int callee, const std::vector<int>& in, PyObject* kwnames) {
    if (!m_cap.exists_at_replay(in[0])) return;
    Step s;
    s.kind = StepKind::Call;
    if (kwnames) s.kwnames = py::Ref::borrow(kwnames);
    std::vector<int> values = {callee};
    values.insert(values.end(), in.begin(), in.end());
    m_cap.record_effect(std::move(s), values);
}

// obj[key] over items the capture knows (an int picks one, a slice makes a fresh container).
int Monitor::index_items(const std::vector<int>& items, PyObject* key, ValueKind kind,
                         PyObject* real) {
    Py_ssize_t n = static_cast<Py_ssize_t>(items.size());
    if (PyLong_Check(key)) {
        Py_ssize_t i = PyLong_AsSsize_t(key);
        if (i < 0) i += n;
        if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
    } else if (PySlice_Check(key)) {
        Py_ssize_t start, stop, step;
        if (PySlice_Unpack(key, &start, &stop, &step) == 0) {
            Py_ssize_t len = PySlice_AdjustIndices(n, &start, &stop, step);
            std::vector<int> picked;
            for (Py_ssize_t j = 0; j < len; ++j)
                picked.push_back(items[static_cast<size_t>(start + j * step)]);
            return m_cap.fresh(kind, picked, real);
        }
        PyErr_Clear();
    }
    m_cap.internal_error("index out of the known items");
    return -1;
}

// A function found on the class of an input object (a method, a module's forward), reached
// through type(obj) so that replacing it on the class, or shadowing it on the instance, fails
// the guards.
// [Note: properties] `obj.name` where the class has a property whose getter is a Python
// function: the getter's frame (entered from C by LOAD_ATTR) is traced like a callee with
// `obj` as its argument, and the attribute is what it returned. The property and its getter
// are guarded through the class, so replacing either recompiles. Property subclasses that keep
// property's own __get__ (torch.distributions' dependent_property) are properties too. On an
// object made in the call, a non-data descriptor whose class defines __get__ in Python
// (torch.distributions' lazy_property: Categorical(logits=l).probs computes, caches on the
// instance and returns) is traced the same way: __get__(descriptor, obj, type(obj)), guarded
// through both classes. A functools.cached_property there is read as its own __get__ reads it,
// without tracing that __get__ (it reads obj.__dict__ under a lock): its function is traced
// with `obj` as its argument, and what it returned is set on the object. Other data
// descriptors, and properties on values whose class we do not follow, break in load_attr
// (MB007).
// The hooks a backward() call from the tensors of `p` may run that have no Python frame to be
// seen by ([Note: code that ran inside a call]): those of the leaves it reaches
// (`w.register_hook(grads.append)`, a partial of a C function), walked from grad_fn through
// next_functions (at most 4096 nodes), and the hooks registered in the call. `held` keeps the
// objects alive.
std::vector<PyObject*> Monitor::backward_hooks(const Pending& p, std::vector<py::Ref>& held) {
    std::vector<PyObject*> roots, todo;
    std::unordered_set<PyObject*> seen;
    for (const py::Ref& h : m_hooks_made) roots.push_back(h.get());
    auto attr = [&](PyObject* o, const char* name) {
        PyObject* a = PyObject_GetAttrString(o, name);
        if (!a) PyErr_Clear();
        else held.emplace_back(py::Ref::steal(a));
        return a;
    };
    std::vector<int> sources = p.in;
    if (p.callee.bound_self) sources.push_back(p.callee_value);
    // backward() from tensors the call computed: which leaves it reaches (so gets a gradient)
    // follows from the plan's ops ([Note: gradients read by hand] at grad_of)
    bool computed = p.callee.op == "backward";
    std::vector<PyObject*> leaves;
    for (int a : sources) {
        PyObject* t = m_cap.v(a).real.get();
        if (t && !(is_tensor(t) && m_cap.v(a).kind == ValueKind::OpResult) &&
            !(PyMethod_Check(t) || PyCFunction_Check(t)))
            computed = false;  // (a list of tensors, a tensor passed in)
        if (!t) continue;
        if (PyMethod_Check(t) || PyCFunction_Check(t))
            t = PyMethod_Check(t) ? PyMethod_GET_SELF(t) : PyCFunction_GET_SELF(t);
        std::vector<PyObject*> tensors;
        if (t && is_tensor(t)) tensors.push_back(t);
        else if (t && (PyList_Check(t) || PyTuple_Check(t)))
            for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(t); ++i)
                tensors.push_back(PySequence_Fast_GET_ITEM(t, i));
        for (PyObject* x : tensors)
            if (x && is_tensor(x))
                if (PyObject* fn = attr(x, "grad_fn"); fn && fn != Py_None) todo.push_back(fn);
    }
    while (!todo.empty() && seen.size() < 4096) {
        PyObject* node = todo.back();
        todo.pop_back();
        if (!seen.insert(node).second) continue;
        if (PyObject* leaf = attr(node, "variable"); leaf && is_tensor(leaf)) {
            leaves.push_back(leaf);
            PyObject* hooks = attr(leaf, "_backward_hooks");
            if (hooks && PyDict_Check(hooks) && PyDict_GET_SIZE(hooks) > 0) roots.push_back(hooks);
        }
        PyObject* next = attr(node, "next_functions");
        for (Py_ssize_t i = 0; next && PyTuple_Check(next) && i < PyTuple_GET_SIZE(next); ++i) {
            PyObject* pair = PyTuple_GET_ITEM(next, i);
            if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) > 0 &&
                PyTuple_GET_ITEM(pair, 0) != Py_None)
                todo.push_back(PyTuple_GET_ITEM(pair, 0));
        }
    }
    if (computed && todo.empty())  // (the whole graph walked)
        for (PyObject* leaf : leaves) m_reached_leaves.emplace(leaf, py::Ref::borrow(leaf));
    return roots;
}

// A property, or a subclass that keeps property's own __get__ (torch.distributions'
// dependent_property): reading it calls its fget.
static bool plain_property(PyObject* d) {
    return PyObject_TypeCheck(d, &PyProperty_Type) &&
           Py_TYPE(d)->tp_descr_get == PyProperty_Type.tp_descr_get;
}

// [Note: __getattribute__ of objects passed in] `config.output_attentions` where the class
// has its own __getattribute__ in Python (Hugging Face's PretrainedConfig maps aliases through
// `attribute_map`): the hook's frame, entered from C by LOAD_ATTR, is traced like a property
// getter with (obj, name), found and guarded through the class. Its
// `super().__getattribute__(key)` is object's own lookup (getattribute_slot): a plain attribute
// read guarded past the hook (AccessKind::GenericAttr), or a property's getter traced. True
// when the read goes that way.
bool Monitor::expect_getattribute(ShadowFrame& f, PyObject* name) {
    Pending& p = f.pending;
    if (p.in.size() != 1) return false;
    int obj = p.in[0];
    const Value& o = m_cap.v(obj);
    PyObject* target = o.real.get();
    if (o.kind != ValueKind::Input || !target || o.tensor || PyType_Check(target) ||
        PyModule_Check(target) || PyObject_TypeCheck(target, torch_api().module_type))
        return false;
    PyTypeObject* type = Py_TYPE(target);
    PyObject* hook = _PyType_Lookup(type, interned("__getattribute__"));
    if (!hook || !PyFunction_Check(hook) || _PyType_Lookup(type, interned("__getattr__")) ||
        !py::code_is_plain_function(reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(hook))))
        return false;
    int fn = class_attr(obj, interned("__getattribute__"), hook);
    if (fn < 0) return true;  // (failed)
    p.in = {obj, m_cap.const_value(name)};
    p.callee = CalleeInfo{};
    p.callee.kind = CallKind::InlineFunction;
    p.callee.name = std::string(type->tp_name) + ".__getattribute__";
    p.callee.code = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(hook));
    p.callee_value = fn;
    p.property_get = true;
    return true;
}

// object.__getattribute__(obj, name) called on an object passed in from its class's own
// __getattribute__ ([Note: __getattribute__ of objects passed in]): a property's getter is
// traced (the call becomes that getter's), anything else is read after the call.
bool Monitor::getattribute_slot(Pending& p, int callable, std::vector<int>& args,
                                PyObject* kwnames) {
    static PyObject* generic = _PyType_Lookup(&PyBaseObject_Type, interned("__getattribute__"));
    PyObject* fn = m_cap.v(callable).real.get();
    if (fn != generic || kwnames || args.size() != 2) return false;
    const Value& o = m_cap.v(args[0]);
    const Value& k = m_cap.v(args[1]);
    if (o.kind != ValueKind::Input || o.tensor || k.kind != ValueKind::Const ||
        !PyUnicode_CheckExact(k.real.get()))
        return false;
    PyObject* name = k.real.get();
    PyObject* d = _PyType_Lookup(Py_TYPE(o.real.get()), name);
    bool property = d && plain_property(d);
    p.callee = CalleeInfo{};
    p.callee_value = callable;
    p.kwnames = nullptr;
    p.in = args;
    if (!property) {
        p.callee.kind = CallKind::ObjectSlot;
        p.callee.op = "__getattribute__";
        p.callee.name = "object.__getattribute__";
        return true;
    }
    py::Ref fget = py::Ref::steal(PyObject_GetAttrString(d, "fget"));
    if (!fget) PyErr_Clear();
    if (!fget || !PyFunction_Check(fget.get())) return false;
    int prop = class_attr(args[0], name, d);
    int getter = prop < 0 ? -1
                          : m_cap.input_child(prop, AccessKind::Attr, 0, interned("fget"), ".fget",
                                              fget.get());
    if (getter < 0) return true;  // (failed)
    p.callee.kind = CallKind::InlineFunction;
    p.callee.name = str(name);
    p.callee.code = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fget.get()));
    p.callee_value = getter;
    p.in = {args[0]};
    return true;
}

void Monitor::expect_property_getter(ShadowFrame& f, PyObject* name) {
    Pending& p = f.pending;
    if (p.in.size() != 1) return;
    int obj = p.in[0];
    const Value& o = m_cap.v(obj);
    PyObject* target = o.real.get();
    if (!target || o.tensor || PyType_Check(target) ||
        !(o.kind == ValueKind::Input || o.kind == ValueKind::FreshObject))
        return;
    PyObject* prop = _PyType_Lookup(Py_TYPE(target), name);
    if (!prop) return;
    bool property = plain_property(prop);
    PyObject* lazy_get = nullptr;  // borrowed: the Python __get__ of a non-data descriptor
    bool cached = false;           // a functools.cached_property
    if (!property && o.kind == ValueKind::FreshObject && !Py_TYPE(prop)->tp_descr_set &&
        fresh_dict_slot(obj, name) < 0) {
        lazy_get = _PyType_Lookup(Py_TYPE(prop), interned("__get__"));
        if (!lazy_get || !PyFunction_Check(lazy_get)) return;
        cached = lazy_get == torch_api().cached_property_get.get();
    }
    if (!property && !lazy_get) return;
    const char* getter = property ? "fget" : cached ? "func" : nullptr;
    py::Ref fget = getter ? py::Ref::steal(PyObject_GetAttrString(prop, getter))
                          : py::Ref::borrow(lazy_get);
    if (!fget) PyErr_Clear();
    if (!fget || !PyFunction_Check(fget.get())) return;
    py::Ref cache_as;
    if (cached) {  // it caches under attrname (the name it was assigned to in the class)
        cache_as = py::Ref::steal(PyObject_GetAttrString(prop, "attrname"));
        if (!cache_as) PyErr_Clear();
        if (!cache_as || !PyUnicode_Check(cache_as.get())) return;
    }
    int prop_value = -1;
    if (o.kind == ValueKind::Input) {
        prop_value = class_attr(obj, name, prop);
    } else if (o.cls >= 0 && m_cap.v(o.cls).kind == ValueKind::Input) {
        prop_value = m_cap.input_child(o.cls, AccessKind::TypeLookup, 0, name, "." + str(name),
                                       prop);
    }
    if (prop_value < 0) return;  // load_attr then says why
    int fn = -1;
    if (getter) {
        fn = m_cap.input_child(prop_value, AccessKind::Attr, 0, interned(getter),
                               std::string(".") + getter, fget.get());
        if (cached) {
            // the name it caches under is read at capture: guard it (it is set once, by
            // __set_name__, so this holds unless the class is rebuilt)
            int attrname = m_cap.input_child(prop_value, AccessKind::Attr, 0,
                                             interned("attrname"), ".attrname", cache_as.get());
            if (attrname < 0 || !require_const({attrname}, "a cached_property's name")) return;
        }
    } else {
        PyObject* descr_class = reinterpret_cast<PyObject*>(Py_TYPE(prop));
        int descr_type = m_cap.input_child(prop_value, AccessKind::TypeOf, 0, nullptr,
                                           ".__class__", descr_class);
        fn = descr_type < 0 ? -1
                            : m_cap.input_child(descr_type, AccessKind::TypeLookup, 0,
                                                interned("__get__"), ".__get__", lazy_get);
        p.in = {prop_value, obj, o.cls};  // __get__(descriptor, instance, owner)
    }
    if (fn < 0) return;
    p.callee = CalleeInfo{};
    p.callee.kind = CallKind::InlineFunction;
    p.callee.name = str(name);
    p.callee.code = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fget.get()));
    p.callee_value = fn;
    p.property_get = true;
    p.cache_as = std::move(cache_as);
}

// [Note: properties] `obj.name = v` where the class has a property whose setter is a Python
// function, on an object passed in or made in the call (`self.scale = s` in a forward): the
// setter's frame is traced like a callee with (obj, v), found and guarded through the class as
// a getter is. What it sets is followed as any write of its code. False: not such a store.
bool Monitor::expect_property_setter(Pending& p, int obj, PyObject* name, int val) {
    const Value& o = m_cap.v(obj);
    PyObject* target = o.real.get();
    if (!target || o.tensor || PyType_Check(target) ||
        !(o.kind == ValueKind::Input || o.kind == ValueKind::FreshObject))
        return false;
    PyObject* prop = _PyType_Lookup(Py_TYPE(target), name);
    if (!prop || !PyObject_TypeCheck(prop, &PyProperty_Type) ||
        Py_TYPE(prop)->tp_descr_set != PyProperty_Type.tp_descr_set)
        return false;
    // a class's own __setattr__ runs first (nn.Module's reaches the property through
    // object.__setattr__ for values it does not register): only the plain store, or Module's
    PyObject* set = _PyType_Lookup(Py_TYPE(target), interned("__setattr__"));
    PyObject* module_set = _PyType_Lookup(torch_api().module_type, interned("__setattr__"));
    if (set != _PyType_Lookup(&PyBaseObject_Type, interned("__setattr__")) &&
        (set != module_set || is_tensor(m_cap.v(val).real.get()) ||
         PyObject_TypeCheck(m_cap.v(val).real.get(), torch_api().module_type)))
        return false;
    py::Ref fset = py::Ref::steal(PyObject_GetAttrString(prop, "fset"));
    if (!fset) PyErr_Clear();
    if (!fset || !PyFunction_Check(fset.get())) return false;
    int prop_value = -1;
    if (o.kind == ValueKind::Input) {
        prop_value = class_attr(obj, name, prop);
    } else if (o.cls >= 0 && m_cap.v(o.cls).kind == ValueKind::Input) {
        prop_value = m_cap.input_child(o.cls, AccessKind::TypeLookup, 0, name, "." + str(name), prop);
    } else {
        prop_value = m_cap.const_value(prop);
    }
    if (prop_value < 0) return false;
    int fn = m_cap.input_child(prop_value, AccessKind::Attr, 0, interned("fset"), ".fset",
                               fset.get());
    if (fn < 0) return false;
    p.in = {obj, val};
    p.callee = CalleeInfo{};
    p.callee.kind = CallKind::InlineFunction;
    p.callee.name = "property `" + str(name) + "` setter";
    p.callee.code = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fset.get()));
    p.callee_value = fn;
    p.hook = true;
    return true;
}

// [Note: super] `super()` in a traced frame is `super(__class__, <first argument>)`: the class
// comes from the frame's `__class__` cell (guarded by identity, as closure cells are) and the
// object from its first local, as CPython takes them; `super(cls, obj)` gives both. The call
// makes a Super value; the method then looked up on it is found the way super() finds it, on
// the classes of type(obj).__mro__ after the class, and guarded by that lookup
// (AccessKind::SuperLookup on type(obj)), so a base method replaced later recompiles. The
// method is then called with the object first and traced like any method of the user's
// (`super().forward(x)`, `super().__init__(...)` on an object made in the call). Attributes
// other than plain functions (properties, class or static methods) break (MB007), but for the
// slots and methods of the C base of an object made in the call, or of a dict passed in
// (`super().__setitem__(k, v)`: CallKind::ObjectSlot, [Note: objects made in the call]).
void Monitor::dispatch_super(ShadowFrame& f, Pending& p) {
    int cls = -1, obj = -1;
    if (p.in.empty() && !p.kwnames) {
        PyCodeObject* co = f.code;
        int n = py::code_nlocalsplus(co);
        int cell = -1;
        for (int i = n - co->co_nfreevars; i < n; ++i)
            if (str(py::code_localsplus_name(co, i)) == "__class__") cell = i;
        if (cell < 0 || co->co_argcount + co->co_kwonlyargcount < 1)
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`super()` without arguments outside a method",
                              "call super() in a method, or pass the class and the object");
        cls = load_deref(f, cell);
        if (cls < 0) return;
        if (py::code_local_kind(co, 0) & py::kLocalKindCell) {
            auto it = m_cap.cells().find(py::frame_local(f.frame, 0));
            obj = it == m_cap.cells().end() ? -1 : it->second;
        } else {
            obj = f.locals.empty() ? -1 : f.locals[0];
        }
    } else if (p.in.size() == 2 && !p.kwnames) {
        cls = p.in[0];
        obj = p.in[1];
    }
    if (cls < 0 || obj < 0)
        return m_cap.fail(breaks::kUnsupportedCallee, "a form of `super()` the capture does not follow",
                          "call super() or super(cls, self) in a method");
    const Value& c = m_cap.v(cls);
    const Value& o = m_cap.v(obj);
    if (!PyType_Check(c.real.get()) || !(c.kind == ValueKind::Const || c.identity) ||
        !(o.kind == ValueKind::Input || o.kind == ValueKind::FreshObject) || o.tensor ||
        PyType_Check(o.real.get()))
        return m_cap.fail(breaks::kUnsupportedCallee,
                          "`super()` over " + o.label + ", which the capture cannot look up",
                          "call super() in a method of your class");
    p.in = {cls, obj};
}

int Monitor::super_method(int sup, PyObject* name, PyObject* real) {
    const Value& s = m_cap.v(sup);
    int cls = s.items[0], obj = s.items[1];
    PyObject* start = m_cap.v(cls).real.get();
    PyTypeObject* type = Py_TYPE(m_cap.v(obj).real.get());
    PyObject* mro = type->tp_mro;
    Py_ssize_t at = -1;
    for (Py_ssize_t i = 0; mro && i < PyTuple_GET_SIZE(mro); ++i)
        if (PyTuple_GET_ITEM(mro, i) == start) at = i;
    PyObject* raw = at >= 0 ? lookup_after(type, at, name) : nullptr;
    std::string what = "`super()." + str(name) + "`";
    // object.__init__ (a base class's `super().__init__()` at the top): called as a slot, a no-op
    bool object_init = raw && raw == _PyType_Lookup(&PyBaseObject_Type, interned("__init__"));
    // a slot or method of the C base of an object made in the call (`super().__setitem__(k, v)`
    // in a dict subclass, `super().__setattr__(name, v)`): followed on its attributes and items
    PyTypeObject* base = user_class_base(type);
    if (input_dict(obj)) base = layout_base(type);  // `super().__getitem__(k)` of a dict passed in
    bool base_method = raw && (m_cap.v(obj).kind == ValueKind::FreshObject || input_dict(obj)) &&
                       base &&
                       (Py_TYPE(raw) == &PyWrapperDescr_Type || Py_TYPE(raw) == &PyMethodDescr_Type) &&
                       PyType_IsSubtype(base, PyDescr_TYPE(raw));
    // object.__getattribute__ from a class's own __getattribute__ on an object passed in
    bool object_getattribute =
        raw && raw == _PyType_Lookup(&PyBaseObject_Type, interned("__getattribute__")) &&
        m_cap.v(obj).kind == ValueKind::Input;
    bool c_slot = object_init || base_method || object_getattribute;
    if (!raw || !(c_slot || PyFunction_Check(raw)) || !real ||
        (!c_slot && (!PyMethod_Check(real) || PyMethod_GET_FUNCTION(real) != raw)))
        return m_cap.fail(breaks::kUnsupportedAttribute, what + " is not a plain method",
                          "call a plain method of the base class"),
               -1;
    // The lookup depends on type(obj) (its MRO) only: guarded through it.
    const Value& o = m_cap.v(obj);
    int type_value = o.kind == ValueKind::Input
                         ? m_cap.input_child(obj, AccessKind::TypeOf, 0, nullptr, ".__class__",
                                             reinterpret_cast<PyObject*>(type))
                         : o.cls;
    if (type_value < 0 || m_cap.v(type_value).node < 0 ||
        m_cap.v(type_value).real.get() != reinterpret_cast<PyObject*>(type))
        return m_cap.fail(breaks::kUnsupportedAttribute,
                          what + " on an object whose class the capture cannot guard",
                          "call super() in a method of a class defined outside the call"),
               -1;
    return m_cap.input_child(type_value, AccessKind::SuperLookup, static_cast<int>(at), name,
                             ".<after " + std::string(reinterpret_cast<PyTypeObject*>(start)->tp_name) +
                                 ">." + str(name),
                             raw);
}

int Monitor::class_attr(int obj, PyObject* name, PyObject* real) {
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(m_cap.v(obj).real.get()));
    int cls = m_cap.input_child(obj, AccessKind::TypeOf, 0, nullptr, ".__class__", type);
    if (cls < 0) return -1;
    int fn = m_cap.input_child(cls, AccessKind::TypeLookup, 0, name, "." + str(name), real);
    if (fn < 0) return -1;
    if (_PyObject_GetDictPtr(m_cap.v(obj).real.get())) m_cap.guard_no_instance_attr(obj, name);
    return fn;
}

Monitor::Monitor(Capture& capture, PyCodeObject* root_code, bool fullgraph,
                 SegmentOptions segments)
    : m_cap(capture), m_root_code(root_code), m_fullgraph(fullgraph), m_seg(segments) {
    if (fullgraph) m_seg.sites = nullptr;  // a break must raise, never end a segment
}

// [SECTION] tracing ----------------------------------------------------------------------------

// [Note: code that ran inside a call] in core/NOTES.md: while backward(), autograd.grad or a
// state-changing call is in flight, the frame hook reports the Python functions it evaluates
// (on any thread) and their arguments; what they reach may have changed.
std::vector<Monitor*> Monitor::s_watchers;

void Monitor::watch_call(bool on) {
    if (on) {
        m_ran.clear();
        m_ran_overflow = false;
    }
    if (on == m_watching) return;
    m_watching = on;
    if (on) s_watchers.push_back(this);
    else s_watchers.erase(std::find(s_watchers.begin(), s_watchers.end(), this));
}

// Whether `fn` is torch's own Python (by its module's name, not its file's path).
static bool torch_function(PyObject* fn) {
    PyObject* module = PyFunction_GET_MODULE(fn);
    if (!module || !PyUnicode_Check(module)) return false;
    return PyUnicode_CompareWithASCIIString(module, "torch") == 0 ||
           PyUnicode_Tailmatch(module, interned("torch."), 0, 6, -1) == 1;
}

// Every watcher sees every frame (a capture on another thread may be the one whose call ran
// it: attributing it to each is the safe side).
void Monitor::frame_evaluated(py::IFrame* frame) {
    PyCodeObject* co = py::frame_code(frame);
    PyObject* fn = py::frame_function(frame);
    if (!fn || !PyFunction_Check(fn) || torch_function(fn)) return;
    int nargs = co->co_argcount + co->co_kwonlyargcount + ((co->co_flags & CO_VARARGS) ? 1 : 0) +
                ((co->co_flags & CO_VARKEYWORDS) ? 1 : 0);
    for (Monitor* m : s_watchers) {
        if (m->m_ran.size() >= 4096) {
            m->m_ran_overflow = true;
            continue;
        }
        m->m_ran.emplace_back(py::Ref::borrow(fn));
        for (int i = 0; i < nargs; ++i)
            if (PyObject* a = py::frame_local(frame, i)) m->m_ran.emplace_back(py::Ref::borrow(a));
    }
}

void Monitor::install() {
    t_monitor = this;
    m_opcode_events_were = magpy_allow_opcode_events();  // 3.12: PyEval_SetTrace reads it
    PyEval_SetTrace(&Monitor::trace, nullptr);
}

void Monitor::uninstall() {
    watch_call(false);
    // (a tracer the program set during the call, past a break at sys.settrace, stays: a
    // review probe found it removed)
    if (py::thread_tracer(PyThreadState_Get()) == &Monitor::trace) PyEval_SetTrace(nullptr, nullptr);
    magpy_restore_opcode_events(m_opcode_events_were);
    t_monitor = nullptr;
}

// Never fails: returning -1 would make CPython drop the tracer and raise into user code.
int Monitor::trace(PyObject*, PyFrameObject* frame, int what, PyObject* arg) {
    Monitor* m = t_monitor;
    if (!m) return 0;
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);  // the trace function must not disturb a pending exception
    switch (what) {
    case PyTrace_CALL: m->on_call(frame); break;
    case PyTrace_RETURN: m->on_return(frame, arg); break;
    case PyTrace_OPCODE:
        if (!m->m_stopped) m->on_opcode(frame);
        break;
    case PyTrace_EXCEPTION:
        if (!m->m_stopped && !m->m_frames.empty() && m->m_frames.back().frame_obj == frame)
            m->on_exception(frame, arg);
        break;
    default: break;
    }
    if (PyErr_Occurred()) py::clear_error_keep_interrupt();  // engine errors must not leak
    if (py::interrupt_pending()) {
        // A signal handler ran inside the engine (PyObject_Repr and others check signals): the
        // KeyboardInterrupt is the program's. Stop capturing and raise it where the program is.
        if (!m->m_stopped) {
            m->m_cap.fail(breaks::kException, "interrupted (KeyboardInterrupt)",
                          "the call was interrupted; it captures again on the next call");
            // Not stop_tracing(): an interrupt says nothing about the code, so it leaves no
            // break site for later captures.
            m->m_stopped = true;
            m->untrace_frames();
        }
        if (PyErr_Occurred()) PyErr_Clear();
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(etb);
        py::take_interrupt();
        return -1;
    }
    // Raised once, the error is raised again at the first instruction of a handler of the
    // user's that caught it; cleanup handlers (a with block's exit) run, as they would for it.
    // Not at an instruction without a line (PUSH_EXC_INFO): its traceback entry would name
    // line -1; the next one has the except clause's line.
    bool again = false;
    if (m->m_raised && what == PyTrace_OPCODE) {
        PyCodeObject* co = py::frame_code(py::frame_of(frame));
        int offset = py::frame_offset(py::frame_of(frame));
        again = !py::code_offset_in_cleanup(co, offset) &&
                PyCode_Addr2Line(co, offset * static_cast<int>(sizeof(_Py_CODEUNIT))) >= 0;
    }
    if (m->m_fullgraph && m->m_cap.failed() && (!m->m_raised || again) && what != PyTrace_RETURN &&
        !m->m_raising) {
        // fullgraph=True: stop the program at the break, before it runs further. A handler
        // of the user's that catches the error is stopped at its first instruction the same
        // way, so the error always reaches the caller.
        m->m_raised = true;
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(etb);
        if (m->m_break_error) {  // the same error again, so that it is the one that leaves
            PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(m->m_break_error.get())),
                            m->m_break_error.get());
            return -1;
        }
        m->m_break_error = m->m_cap.raise_graph_break();
        return -1;
    }
    PyErr_Restore(et, ev, etb);
    return 0;
}

// [Note: calls that raise] A call that raises an exception nothing in it catches (a shape
// check's `raise ValueError(...)`, an op failing on the inputs) is the program's error, not a
// graph break: eager raises it, and so does the compiled call, with fullgraph=True too. The
// capture is dropped where that becomes certain: at a branch whose side taken runs straight
// into an uncaught `raise`, or at an exception that no handler of the traced frames catches.
// No break is reported, no break site noted and nothing cached, so the next call captures
// afresh. Should C code between the frames swallow the exception after all (hasattr over a
// property that raised), the call goes on eagerly (fullgraph=True too) and reports MB006.
void Monitor::drop_raising_call() {
    m_cap.fail(breaks::kException, "an exception was raised inside the captured code and "
               "caught outside it", "code that raises (or catches) exceptions runs eagerly");
    m_raising = true;
    m_stopped = true;
    untrace_frames();
}

void Monitor::stop_tracing() {
    if (!m_stopped) forget_generators();  // [Note: generators left inside cleanup]
    if (!m_stopped) note_site();
    m_stopped = true;
    if (m_fullgraph) return;  // keep seeing the frames: see trace()
    untrace_frames();
}

void Monitor::untrace_frames() {
    for (ShadowFrame& f : m_frames)
        if (f.frame_obj) py::frame_set_trace_opcodes(f.frame_obj, false);
}

// [SECTION] frames -----------------------------------------------------------------------------

// [Note: stack depth in 3.12] in python/compat.h. Empty in 3.11, and where the bytecode has an
// instruction of unknown effect (the capture then fails at its first instruction).
std::vector<int16_t> Monitor::shadow_depths(PyCodeObject* co) {
#if !MAGPY_IS_PYTHON_312
    static const bool check = [] {
        const char* e = std::getenv("MAGPY_CHECK_DEPTHS");
        return e && *e && *e != '0';
    }();
    if (!check) return {};
#endif
    std::vector<int16_t> depths = py::code_stack_depths(co);
    if (depths.empty())
        m_cap.internal_error("the stack depths of `" + str(co->co_qualname) + "` are unknown");
    return depths;
}

void Monitor::on_call(PyFrameObject* fo) {
    py::frame_set_trace_opcodes(fo, false);
    if (m_stopped) {
        m_untraced.push_back(fo);
        return;
    }
    py::IFrame* f = py::frame_of(fo);
    PyCodeObject* co = py::frame_code(f);
    if (m_frames.empty()) {
        if (co != m_root_code) {
            m_untraced.push_back(fo);
            return;
        }
        ShadowFrame sf;
        sf.frame = f;
        sf.frame_obj = fo;
        sf.code = co;
        sf.depths = shadow_depths(co);
        sf.is_root = true;
        m_frames.push_back(std::move(sf));
        bind_root(m_frames.back());
        py::frame_set_trace_opcodes(fo, !m_stopped);
        return;
    }
    if ((co->co_flags & CO_GENERATOR) && resume_generator(fo, f, co)) return;
    ShadowFrame& top = m_frames.back();
    Pending& p = top.pending;
    bool inline_call = p.opcode == CALL || p.opcode == CALL_FUNCTION_EX || p.property_get || p.hook;
    // `self` of a forward whose comprehensions read it is a cell by now (MAKE_CELL has run).
    PyObject* first = co->co_nlocalsplus > 0 ? py::frame_local_value(f, co, 0) : nullptr;
    // A forward under a decorator whose wrapper takes (*args, **kwargs): self is args[0]
    if (first && co->co_argcount == 0 && (co->co_flags & CO_VARARGS) && PyTuple_Check(first) &&
        PyTuple_GET_SIZE(first) > 0)
        first = PyTuple_GET_ITEM(first, 0);
    bool made_here = p.callee.kind == CallKind::UserClass && first &&
                     reinterpret_cast<PyObject*>(Py_TYPE(first)) == m_cap.v(p.callee_value).real.get() &&
                     py::frame_previous(f) == top.frame;  // type.__call__ running its __init__
    bool expected = inline_call && !p.inline_bound && p.callee.code == co &&
                    (p.callee.kind == CallKind::InlineFunction || made_here ||
                     (p.callee.kind == CallKind::InlineModule && first == p.expect_self));
    // A frame entered from C (no Python frame in between) by the frame we trace: map() calls.
    if (!expected && py::frame_previous(f) == top.frame && enter_map_step(fo, f, co)) return;
    if (!expected) {
        // Runs untraced: inside a recorded op, a known callee, or Module.__call__ on the way
        // to the forward we expect.
        m_untraced.push_back(fo);
        return;
    }
    p.inline_bound = true;
    if (made_here) {  // self: the object type.__call__ just made ([Note: objects made in the call])
        p.made = new_object(p.callee_value, first);
        p.in.insert(p.in.begin(), p.made);
    }
    int func_value = p.callee.kind == CallKind::InlineFunction ? p.callee_value : p.forward_value;
    enter_callee(fo, f, co, nullptr, func_value);
}

// [Note: finalizers] An object's `__del__` runs where its last reference goes, which is
// the frame's business when that reference is a local or a stack value (`del obj`, `obj =
// None`, an expression statement's result popped). A plan holds such values in its slots and
// the frame's own locals until it ends (and the capture holds them too, so whether this was the
// last reference is not known then), so an instruction that drops an object whose class has a
// `__del__` in Python breaks before it runs (MB003): the segment ends there and the statement
// runs in the frame's own code, a bridge ([Note: bridges] in magpy/_resume.py; the engine
// keeps no references of its own to the values it hands on: [Note: references handed over]
// in hook/frame_hook.cpp). Writes that drop an object kept elsewhere (`self.cache = None`, a
// dict item) are replayed as writes, where the object goes as it did. A `__del__` from other
// code the frame runs (the cyclic collector at any allocation) is not the program's to order.
bool Monitor::drops_finalized(ShadowFrame& f, const py::Instruction& ins) {
    if (!py::drops_frame_reference(ins.opcode)) return false;
    PyObject* v = nullptr;
    if (ins.opcode == POP_TOP) {
        if (!f.stack.empty()) v = m_cap.v(f.stack.back()).real.get();
    } else {
        v = py::frame_local(f.frame, ins.oparg);
        if (v && (ins.opcode == STORE_DEREF || ins.opcode == DELETE_DEREF))
            v = PyCell_Check(v) ? PyCell_GET(v) : nullptr;
    }
    if (!v || !Py_TYPE(v)->tp_finalize) return false;
    static PyObject* del_name = PyUnicode_InternFromString("__del__");
    PyObject* del = del_name ? _PyType_Lookup(Py_TYPE(v), del_name) : nullptr;
    if (!del || !PyFunction_Check(del)) return false;
    m_cap.fail(breaks::kUnsupportedCallee,
               "`" + str(reinterpret_cast<PyFunctionObject*>(del)->func_qualname) +
                   "` may run here (this drops a reference to its object)",
               "the statement runs in the function's own frame, and capture goes on after it; "
               "to keep one graph, drop the object outside the compiled function");
    return true;
}

// [Note: generators left inside cleanup] A generator made in the call and left before its end
// while suspended inside a try or with block of its own (`for x in gen(): break`, a zip that
// ran out on a shorter input, the yield under `with torch.no_grad()`) runs that block's
// cleanup where its last reference goes (close()). The plan replays what it yielded, not its
// frame, so the cleanup would never run at replay. The capture holds references of its own, so
// the program's drop is seen as the generator's references all being the capture's (or those
// of iterators over it that only the capture holds), checked before each instruction while one
// is suspended so; at the root's return any left fails too. It fails the capture, and the
// capture lets go of the generator and of the values that hold it, so that its cleanup runs
// there, where it would have. A capture that fails for another reason lets go of such
// generators too (stop_tracing).
// Whether iterator `o` holds `g`: itself, or in what it references, or in a tuple it references
// (zip keeps its iterators in one).
static bool iterator_holds(PyObject* o, PyObject* g) {
    if (o == g) return true;
    if (!PyIter_Check(o) || !Py_TYPE(o)->tp_traverse) return false;
    std::vector<PyObject*> refs;
    auto collect = [](PyObject* x, void* arg) {
        static_cast<std::vector<PyObject*>*>(arg)->push_back(x);
        return 0;
    };
    Py_TYPE(o)->tp_traverse(o, collect, &refs);
    for (size_t i = 0, n = refs.size(); i < n; ++i)
        if (PyTuple_Check(refs[i])) Py_TYPE(refs[i])->tp_traverse(refs[i], collect, &refs);
    return std::find(refs.begin(), refs.end(), g) != refs.end();
}

bool Monitor::generators_left_in_cleanup(bool at_return) {
    bool any = false;  // (known at each yield: this is the usual, cheap answer)
    for (const GenRecord& r : m_gens) any = any || (r.in_cleanup && !r.done && r.object);
    if (!any) return false;
    std::unordered_map<PyObject*, Py_ssize_t> held;  // references the capture's values hold
    for (int i = 0; i < m_cap.value_count(); ++i)
        if (PyObject* o = m_cap.v(i).real.get()) held[o]++;
    auto iterators_over = [&](PyObject* g) {  // held values that are iterators over g
        std::vector<PyObject*> out;
        for (const auto& [o, n] : held)
            if (o != g && iterator_holds(o, g)) out.push_back(o);
        return out;
    };
    for (const GenRecord& r : m_gens) {
        PyObject* g = r.object;
        if (!r.in_cleanup || r.done || !g) continue;
        std::string name = str(r.code->co_qualname);
        std::vector<PyObject*> wrappers = iterators_over(g);
        Py_ssize_t program = Py_REFCNT(g) - held[g];
        for (PyObject* w : wrappers)
            if (Py_REFCNT(w) - held[w] == 0) --program;  // a dropped zip holding it
        if (!at_return && program > 0) continue;
        m_cap.fail(breaks::kGeneratorCleanup,
                   "the generator `" + name + "` is left before its end inside a try or with "
                   "block of its own, whose cleanup runs there",
                   "run it to its end (list(...)), or move the try or with block out of it");
        forget_generators();
        return true;
    }
    return false;
}

// The capture's references to the generators made in the call that have not ended, and to
// iterators over them, go ([Note: generators left inside cleanup]): the code that runs on
// untraced may leave them inside their cleanup.
void Monitor::forget_generators() {
    std::vector<PyObject*> gens;
    for (const GenRecord& r : m_gens)
        if (!r.done && r.object) gens.push_back(r.object);
    for (int i = 0; i < m_cap.value_count() && !gens.empty(); ++i) {
        PyObject* o = m_cap.v(i).real.get();
        bool holds = false;
        for (PyObject* g : gens) holds = holds || (o && iterator_holds(o, g));
        if (holds) m_cap.forget(o);
    }
    for (GenRecord& r : m_gens)
        if (!r.done) r.object = nullptr;  // (borrowed: it may go now)
}

// Pushes the shadow frame of a traced callee and binds its arguments from `call` (null: the
// call pending in the caller; a generator's first resume: the call that made it, `gen` its
// record; a call made by map(): its step, `map` its record).
void Monitor::enter_callee(PyFrameObject* fo, py::IFrame* f, PyCodeObject* co, Pending* call,
                           int func_value, int gen, int map) {
    ShadowFrame sf;
    sf.frame = f;
    sf.frame_obj = fo;
    sf.code = co;
    sf.depths = shadow_depths(co);
    // Lines inside torch's own Python (Sequential.forward) are reported at the user's call.
    sf.library_code = str(co->co_filename).find("/torch/") != std::string::npos;
    sf.caller_in_try = m_frames.back().in_try;
    sf.gen = gen;
    sf.map = map;
    m_frames.push_back(std::move(sf));
    // (a reference into m_frames is taken only after the push_back)
    Pending& bound = call ? *call : m_frames[m_frames.size() - 2].pending;
    if (!bind_callee(m_frames.back(), bound, func_value)) {
        stop_tracing();
        return;
    }
    py::frame_set_trace_opcodes(fo, true);
}

// [Note: generators] The frame of a generator made in the call, resumed: bound like a callee
// on its first resume, its shadow frame restored on later ones (with the None that resuming
// pushes). False: not one of ours (it runs untraced).
bool Monitor::resume_generator(PyFrameObject* fo, py::IFrame* f, PyCodeObject* co) {
    // The record of the generator object that owns the frame: several of one expression may be
    // alive at once (one that all() left half-consumed, and a new one from the next call).
    PyObject* gen = py::frame_generator(f);
    GenRecord* g = nullptr;
    int index = -1;
    for (size_t i = 0; i < m_gens.size() && !g; ++i) {
        if (m_gens[i].code != co || m_gens[i].done || m_gens[i].object != gen) continue;
        g = &m_gens[i];
        index = static_cast<int>(i);
    }
    if (!g) return false;
    if (!g->started) {
        g->started = true;
        Pending call = g->call;
        enter_callee(fo, f, co, &call, g->func_value, index);
        return true;
    }
    ShadowFrame sf = std::move(g->frame);
    sf.frame = f;
    sf.frame_obj = fo;
    sf.caller_in_try = m_frames.back().in_try;
    sf.stack.push_back(m_cap.const_value(Py_None));  // what next() sends in
    m_frames.push_back(std::move(sf));
    py::frame_set_trace_opcodes(fo, true);
    return true;
}

Monitor::GenRecord* Monitor::generator_of(int value) {
    const Value& v = m_cap.v(value);
    if (v.kind != ValueKind::Iterator || v.iter_kind != IterKind::Generator) return nullptr;
    return &m_gens[static_cast<size_t>(v.iter_source)];
}

Monitor::MapRecord* Monitor::map_of(int value) {
    const Value& v = m_cap.v(value);
    if (v.kind != ValueKind::Iterator || v.iter_kind != IterKind::Map) return nullptr;
    return &m_maps[static_cast<size_t>(v.iter_source)];
}

bool Monitor::lazy_items(int value, std::vector<int>& out, bool partial_ok) {
    GenRecord* g = generator_of(value);
    MapRecord* m = map_of(value);
    if (!g && !m) return false;
    if (m && m->opaque && !partial_ok && !fill_opaque_map(*m, nullptr)) return false;
    if (!partial_ok && (g ? !g->done : m->results.size() < m->steps.size())) {
        m_cap.fail(breaks::kUnsupportedOpcode,
                   std::string(g ? "a generator" : "a map") + " is used without being run to its "
                   "end (" + m_cap.v(value).label + ")",
                   "consume it whole (list(), sum(), a for loop without break)");
        return false;
    }
    // what next() or an earlier consumer took already is not handed out again
    const std::vector<int>& all = g ? g->yielded : m->results;
    int& taken = m_cap.v(value).iter_pos;
    size_t from = std::min(all.size(), static_cast<size_t>(std::max(taken, 0)));
    out.assign(all.begin() + static_cast<long>(from), all.end());
    taken = static_cast<int>(all.size());
    return true;
}

// The calls of a map of a torch op (or nn module) that the capture has not recorded yet, run by
// C code without a frame: each becomes a step. What each call returned is taken from `kept`
// (the list or tuple the consumer made of them: list(map(f, xs))) or, when the consumer kept
// none of them (sum(map(f, xs))), computed again here: the op has no effects and draws nothing,
// so it gives the same.
bool Monitor::fill_opaque_map(MapRecord& rec, PyObject* kept) {
    for (size_t k = rec.results.size(); k < rec.steps.size(); ++k) {
        bool ok = kept ? opaque_step(rec, PySequence_Fast_GET_ITEM(kept, static_cast<Py_ssize_t>(k)))
                       : remake_opaque_step(rec);
        if (!ok) return false;
    }
    return true;
}

// The next call of an opaque map, whose result nothing kept, made again and recorded.
bool Monitor::remake_opaque_step(MapRecord& rec) {
    if (rec.results.size() >= rec.steps.size())
        return m_cap.internal_error("a map called past its items"), false;
    py::Ref args = reals_of(rec.steps[rec.results.size()], false);
    py::Ref real = py::Ref::steal(PyObject_Call(m_cap.v(rec.func_value).real.get(), args.get(), nullptr));
    if (!real) {
        PyErr_Clear();
        m_cap.fail(breaks::kUnsupportedCallee,
                   "the function of `map`, " + rec.callee.name + ", raised when its result was "
                   "made again", "write a list comprehension: [f(x) for x in xs]");
        return false;
    }
    return opaque_step(rec, real.get());
}

// The next call of an opaque map, which returned `real`, recorded as a step.
bool Monitor::opaque_step(MapRecord& rec, PyObject* real) {
    if (rec.results.size() >= rec.steps.size())
        return m_cap.internal_error("a map called past its items"), false;
    Pending call;
    call.opcode = CALL;
    call.callee = rec.callee;
    call.callee_value = rec.func_value;
    call.in = rec.steps[rec.results.size()];
    int r = record_call(call, real, false, true);
    if (r < 0) return false;
    rec.results.push_back(r);
    return true;
}

// [Note: map] map(f, *iterables) with f a Python function (or a bound method of one): the
// items of each iterable are read when the map is made (so they must be known: lists, tuples,
// ranges, generators run to their end), and each call of f that the consumer's next() makes
// from C is traced like a callee bound to the next step's arguments. A consumer that ran it to
// its end sees the list of the results, as for generators. Other callables (torch ops,
// builtins) are called from C without a frame to trace: they break with a hint.
int Monitor::make_map(const std::vector<int>& args, PyObject* result) {
    if (args.size() < 2) {
        m_cap.fail(breaks::kUnsupportedCallee, "`map` with these arguments", "call map(f, items)");
        return -1;
    }
    std::vector<std::vector<int>> columns;
    for (size_t i = 1; i < args.size(); ++i) {
        std::vector<int> its;
        if (!items_of(args[i], its)) return -1;
        columns.push_back(std::move(its));
    }
    int index = map_record(args[0], columns, "the function of `map`",
                           "write a list comprehension: [f(x) for x in xs]", true);
    if (index < 0) return -1;
    const MapRecord& rec = m_maps[static_cast<size_t>(index)];
    int it = m_cap.new_value(ValueKind::Iterator, result, "map(" + rec.callee.name + ", ...)");
    m_cap.v(it).iter_kind = IterKind::Map;
    m_cap.v(it).iter_source = index;
    return it;
}

// The record of calls `fv(*column_items)`, one per row, that C code is about to make (map's
// next(), sorted()'s key): its index in m_maps, or -1 after a failure that names `role` (what
// fv is to the caller).
int Monitor::map_record(int fv, const std::vector<std::vector<int>>& columns,
                        const std::string& role, const std::string& hint, bool records_ops) {
    auto fail = [&](const std::string& why) {
        m_cap.fail(breaks::kUnsupportedCallee, why, hint);
        return -1;
    };
    MapRecord rec;
    PyObject* fn = m_cap.v(fv).real.get();
    if (PyMethod_Check(fn) && PyFunction_Check(PyMethod_GET_FUNCTION(fn))) {
        if (m_cap.v(fv).kind != ValueKind::Input || !split_method(fv, rec.func_value, rec.self_value))
            return m_cap.failed() ? -1 : fail(role + " is the method " + m_cap.v(fv).label);
        fn = m_cap.v(rec.func_value).real.get();
    } else {
        rec.func_value = fv;
    }
    rec.callee = classify_callee(fn);
    bool pure = rec.callee.kind == CallKind::PureBuiltin || rec.callee.kind == CallKind::TypeCtor ||
                rec.callee.kind == CallKind::Len || rec.callee.kind == CallKind::Getter;
    // map(torch.sigmoid, xs), map(self.act, feats): an op without effects, recorded per item
    // (`records_ops`: a map, whose results flow on; a sort key's or reduce's do not)
    bool opaque = records_ops &&
                  (rec.callee.kind == CallKind::TorchOp || rec.callee.kind == CallKind::LeafModule) &&
                  !op_has_effects(rec.callee, fn, nullptr, nullptr) &&
                  !op_draws(rec.callee, fn, nullptr, nullptr);
    if (rec.callee.kind != CallKind::InlineFunction && !pure && !opaque)
        return fail(role + ", " + m_cap.v(fv).label + " (" + rec.callee.name + "), is called "
                    "from C, where it cannot be followed");
    rec.code = opaque ? nullptr : rec.callee.code;
    rec.opaque = opaque;
    size_t n = SIZE_MAX;
    for (const std::vector<int>& its : columns) n = std::min(n, its.size());
    for (size_t k = 0; k < n; ++k) {
        std::vector<int> step;
        if (rec.self_value >= 0) step.push_back(rec.self_value);
        for (const std::vector<int>& its : columns) step.push_back(its[k]);
        rec.steps.push_back(std::move(step));
    }
    rec.role = role;
    rec.pure = pure;
    if (pure) {
        rec.code = nullptr;  // no frames to trace
        for (const std::vector<int>& step : rec.steps)
            if (!fold_pure_step(rec, step)) return -1;
    }
    m_maps.push_back(std::move(rec));
    return static_cast<int>(m_maps.size()) - 1;
}

// map(int, sizes), sorted(names, key=str.lower): a pure builtin over constants is folded here;
// the calls from C give the same results.
bool Monitor::fold_pure_step(MapRecord& rec, const std::vector<int>& step) {
    auto fail = [&](const std::string& why) {
        m_cap.fail(breaks::kUnsupportedCallee, why, "use a lambda or a def, or constants");
        return false;
    };
    if (rec.callee.kind == CallKind::Getter && step.size() == 1) {
        // sorted(rows, key=itemgetter(1)): the item it reads, which the caller then compares
        PyObject* fn = m_cap.v(rec.func_value).real.get();
        if (getter_value(rec.func_value, rec.callee, step[0], nullptr) < 0) return false;
        py::Ref r = py::Ref::steal(PyObject_CallOneArg(fn, m_cap.v(step[0]).real.get()));
        if (!r) {
            PyErr_Clear();
            return fail(rec.role + ", " + rec.callee.name + ", raised for " + m_cap.v(step[0]).label);
        }
        int got = getter_value(rec.func_value, rec.callee, step[0], r.get());
        if (got < 0) return false;
        rec.results.push_back(got);
        return true;
    }
    for (int a : step)
        if (!known(a))
            return fail(rec.role + ", " + rec.callee.name + ", is given " + m_cap.v(a).label +
                        ", which is not a constant");
    py::Ref r = py::Ref::steal(PyObject_Call(m_cap.v(rec.func_value).real.get(),
                                             reals_of(step, false).get(), nullptr));
    if (!r) PyErr_Clear();
    PyObject* o = r.get();
    if (!o || !(PyLong_CheckExact(o) || PyFloat_CheckExact(o) || PyUnicode_CheckExact(o) ||
                PyBool_Check(o)))  // a fresh list each call is not a constant
        return fail(rec.role + ", " + rec.callee.name + ", gives no constant for these items");
    rec.results.push_back(m_cap.const_value(r.get()));
    return true;
}

// A key over a generator's items: a step for each item it yielded since the last look (the
// key of min() and max() is called between the generator's yields; sorted() takes them all
// first).
bool Monitor::sync_gen_steps(MapRecord& rec) {
    if (rec.gen < 0) return true;
    const std::vector<int> yielded = m_gens[static_cast<size_t>(rec.gen)].yielded;
    for (size_t i = rec.gen_from + rec.steps.size(); i < yielded.size(); ++i) {
        std::vector<int> step;
        if (rec.self_value >= 0) step.push_back(rec.self_value);
        step.push_back(yielded[i]);
        rec.steps.push_back(step);
        if (rec.pure && !fold_pure_step(rec, step)) return false;
    }
    return true;
}

// Whether `got`, an object C code handed on, is the item `want` of the capture: the same
// object, or a pair of d.items() that C code made only now (sorted(d.items(), key=f)): a tuple
// of the same items, or equal to a tuple of constants folded into one value.
bool Monitor::stands_for(int want, PyObject* got) {
    const Value& w = m_cap.v(want);
    if (got == w.real.get()) return true;
    if (!got || !PyTuple_CheckExact(got)) return false;
    if (w.kind == ValueKind::Const)
        return w.real && PyTuple_CheckExact(w.real.get()) && same_constant(w.real.get(), got);
    if (w.kind != ValueKind::FreshTuple || w.built >= 0 ||
        static_cast<size_t>(PyTuple_GET_SIZE(got)) != w.items.size())
        return false;
    for (size_t k = 0; k < w.items.size(); ++k)
        if (PyTuple_GET_ITEM(got, static_cast<Py_ssize_t>(k)) != m_cap.v(w.items[k]).real.get())
            return false;
    return true;
}

// A frame entered from C while a map of its code has calls left: the map's next call, traced.
// Its arguments pick the map (two maps of one function zipped together). False: not one of
// ours.
bool Monitor::enter_map_step(PyFrameObject* fo, py::IFrame* f, PyCodeObject* co) {
    auto next_call_matches = [&](const MapRecord& m) {
        const std::vector<int>& args = m.steps[m.results.size()];
        for (size_t i = 0; i < args.size() && static_cast<int>(i) < co->co_argcount; ++i) {
            if (!stands_for(args[i], py::frame_local_value(f, co, static_cast<int>(i)))) return false;
        }
        return true;
    };
    auto stop = [&](const std::string& what, const std::string& hint) {
        m_cap.fail(breaks::kUnsupportedCallee, what, hint);
        stop_tracing();
        return true;
    };
    int index = -1, ours = 0, matching = 0;
    for (size_t i = 0; i < m_maps.size(); ++i) {
        if (m_maps[i].code == co && !sync_gen_steps(m_maps[i])) return stop_tracing(), true;
        const MapRecord& m = m_maps[i];
        if (m.code != co) continue;
        ++ours;
        if (m.results.size() >= m.steps.size() || !next_call_matches(m)) continue;
        ++matching;
        index = static_cast<int>(i);
    }
    if (ours == 0) return false;
    // Called from C with a map of its code alive, but not as that map's next call: the items
    // the map goes over changed after it was made.
    if (matching == 0)
        return stop("a map(" + str(co->co_name) + ", ...) goes over other items than it had "
                    "when it was made", "make the map where it is used");
    if (matching > 1)
        return stop("two maps of " + str(co->co_name) + " over the same items are consumed "
                    "together", "make a list of the first before using the second");
    MapRecord& m = m_maps[static_cast<size_t>(index)];
    const std::vector<int>& args = m.steps[m.results.size()];
    for (size_t i = 0; i < args.size() && static_cast<int>(i) < co->co_argcount; ++i)
        m_cap.v(args[i]).real = py::Ref::borrow(py::frame_local_value(f, co, static_cast<int>(i)));
    Pending call;
    call.opcode = CALL;
    call.callee = m.callee;
    call.callee_value = m.func_value;
    call.in = m.steps[m.results.size()];
    enter_callee(fo, f, co, &call, m.func_value, -1, index);
    return true;
}

void Monitor::on_return(PyFrameObject* fo, PyObject* value) {
    if (!m_untraced.empty() && m_untraced.back() == fo) {
        m_untraced.pop_back();
        return;
    }
    if (m_frames.empty() || m_frames.back().frame_obj != fo) return;
    ShadowFrame done = std::move(m_frames.back());
    m_frames.pop_back();
    if (done.is_root) {
        m_root_returned = value != nullptr;
        m_return_value = done.return_value;
        if (!m_cap.failed()) generators_left_in_cleanup(true);
        return;
    }
    if (m_stopped || m_frames.empty()) return;
    if (!value) {
        m_cap.fail(breaks::kException, "an exception was raised inside the captured code",
                   "code that raises (or catches) exceptions runs eagerly");
        stop_tracing();
        return;
    }
    if (done.map >= 0) {  // one call made by a map ([Note: map])
        MapRecord& m = m_maps[static_cast<size_t>(done.map)];
        m.results.push_back(done.return_value);
        if (m.fold && m.results.size() < m.steps.size())  // reduce: the next call's accumulator
            m.steps[m.results.size()][m.self_value >= 0 ? 1 : 0] = done.return_value;
        m_cap.set_in_try(m_frames.back().in_try);
        return;
    }
    if (done.gen >= 0) {  // a yield, or the generator's end ([Note: generators])
        GenRecord& g = m_gens[static_cast<size_t>(done.gen)];
        if (done.pending.opcode == YIELD_VALUE && done.pending.in.size() == 1) {
            // [Note: generators left inside cleanup]: whether close() would run code now
            g.in_cleanup = py::code_yield_has_cleanup(done.code, py::frame_offset(done.frame));
            g.yielded.push_back(done.pending.in[0]);
            done.pending = Pending{};
            g.frame = std::move(done);
        } else {
            g.done = true;
        }
        m_cap.set_in_try(m_frames.back().in_try);
        return;
    }
    m_frames.back().pending.inline_result = done.return_value;
    m_cap.set_in_try(m_frames.back().in_try);
}

static std::string local_name(PyCodeObject* co, int i) {
    return str(py::code_localsplus_name(co, i));
}

// The user's code reads fast local `i` (a variable, a cell, a free variable) that has no value:
// the instruction raises UnboundLocalError (NameError for a free variable), as it does without
// magpy, so the call runs eagerly with an ordinary break.
static void fail_unassigned(Capture& cap, PyCodeObject* co, int i) {
    bool free = py::code_local_kind(co, i) & py::kLocalKindFree;
    cap.fail(breaks::kException,
             "`" + local_name(co, i) + "` is read before it is assigned (" +
                 (free ? "NameError" : "UnboundLocalError") + ")",
             "assign it on every path before reading it");
}

void Monitor::bind_root(ShadowFrame& f) {
    PyCodeObject* co = f.code;
    int n = py::code_nlocalsplus(co);
    f.locals.assign(static_cast<size_t>(n), -1);
    int nargs = co->co_argcount + co->co_kwonlyargcount + ((co->co_flags & CO_VARARGS) ? 1 : 0) +
                ((co->co_flags & CO_VARKEYWORDS) ? 1 : 0);
    int first_free = n - co->co_nfreevars;
    for (int i = 0; i < n; ++i) {
        PyObject* real = py::frame_local(f.frame, i);
        unsigned char kind = py::code_local_kind(co, i);
        if (i < nargs) {
            PyObject* val = (kind & py::kLocalKindCell) ? PyCell_GET(real) : real;
            if (!val) {  // a resume function's local with no value at the break
                if (kind & py::kLocalKindCell) m_cap.cells()[real] = -1;
                continue;
            }
            bool scalar = m_seg.dynamic_args && static_cast<size_t>(i) < m_seg.dynamic_args->size() &&
                          (*m_seg.dynamic_args)[static_cast<size_t>(i)] && PyFloat_CheckExact(val);
            std::string source = "L['" + local_name(co, i) + "']";
            int id = m_cap.input_root(AccessKind::FrameLocal, i, nullptr, source, val, scalar);
            if (kind & py::kLocalKindCell) m_cap.cells()[real] = id;
            else f.locals[static_cast<size_t>(i)] = id;
        } else if (kind & py::kLocalKindFree) {
            PyObject* cell = real;
            int k = i - first_free;
            m_cap.external_cells()[cell] = -(k + 2);  // resolved lazily by load_deref
        } else if (kind & py::kLocalKindCell) {
            if (real) m_cap.cells()[real] = -1;
        }
    }
    for (int i = 0; i < nargs; ++i)
        if (f.locals[static_cast<size_t>(i)] >= 0 && local_name(co, i).rfind("$stack", 0) == 0 &&
            !reopen_with_block(f, i))
            return;
}

// [Note: breaks inside with blocks]
// A break inside a with block over one of torch's context managers resumes like any other:
// the resume function gets the block's bound __exit__ as a stack entry, and its copy of the
// bytecode ends the block (the normal exit's call, or the cleanup handler on an exception).
// Its capture takes that entry for an open block entered before the plan: the plan reads
// `__self__.__exit__` from it (the function guarded), the call at the block's end is the
// block's exit, and a step failing at replay inside it calls __exit__ with the exception, as
// the frame's cleanup would. A plan that declines leaves the block open (PlanContext::
// inherited): the frame runs again from its start, still inside it. A context manager class
// of the user's is reopened the same way, its __exit__ then traced at the block's end ([Note:
// user context managers]). A break inside a try block goes on in the frame itself ([Note:
// breaks inside try blocks] in segment.cpp).
bool Monitor::reopen_with_block(ShadowFrame& f, int local) {
    int id = f.locals[static_cast<size_t>(local)];
    PyObject* m = m_cap.v(id).real.get();
    if (!PyMethod_Check(m)) return true;
    PyObject* self = PyMethod_GET_SELF(m);
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(self));
    PyObject* exit_fn = _PyType_Lookup(Py_TYPE(self), interned("__exit__"));
    if (PyMethod_GET_FUNCTION(m) != exit_fn) return true;
    if (!torch_api().is_context_type(type)) {
        if (!PyFunction_Check(exit_fn)) return true;
        // a context manager class of the user's ([Note: user context managers])
        if (!user_context_class(self, m_cap.v(id).label)) return !m_cap.failed();
        int func, self_value;
        if (!split_method(id, func, self_value)) return false;
        Arg a;
        if (!m_cap.arg_of(self_value, a)) return false;
        int unwind = bind_exit(func, a, m, m_cap.v(id).label);  // for Plan::unwind
        if (unwind < 0 || !m_cap.enter_context(unwind, true, true)) return false;
        int bound = m_cap.new_value(ValueKind::BoundMethod, m, m_cap.v(id).label);
        m_cap.v(bound).items = {func, self_value};
        m_cap.v(bound).ctx_exit = true;
        f.locals[static_cast<size_t>(local)] = bound;
        return true;
    }
    int func, self_value;
    if (!split_method(id, func, self_value)) return false;
    m_cap.guard_identity(func);
    if (!guard_saved_state(self_value)) return false;
    note_context_type(type);
    Arg a;
    if (!m_cap.arg_of(self_value, a)) return false;
    Step get_exit;
    get_exit.kind = StepKind::GetAttr;
    get_exit.name = py::Ref::borrow(interned("__exit__"));
    get_exit.args.push_back(a);
    int ex = m_cap.record(std::move(get_exit), m, m_cap.v(id).label, false);
    m_cap.v(ex).ctx_exit = true;
    if (!m_cap.enter_context(ex, true)) return false;
    f.locals[static_cast<size_t>(local)] = ex;
    return true;
}

// An inherited block's __exit__ restores what its __enter__ saved on the object (no_grad's
// `prev`, autocast's prev and prev_fastdtype ...). That decides the state after the block, which
// the capture takes as known (is_grad_enabled(), the dtypes ops give), and the frame entered
// the block before this capture began, so each saved value is guarded. State saved where
// Python cannot read it (inference_mode's C++ guard object) cannot be: the capture stops.
bool Monitor::guard_saved_state(int ctx) {
    PyObject* obj = m_cap.v(ctx).real.get();
    if (std::strstr(Py_TYPE(obj)->tp_name, "nullcontext")) return true;  // restores nothing
    PyObject** dictptr = _PyObject_GetDictPtr(obj);
    if (!dictptr || !*dictptr || !PyDict_Check(*dictptr)) return true;
    py::Ref items = py::Ref::steal(PyDict_Items(*dictptr));
    if (!items) {
        PyErr_Clear();
        m_cap.internal_error("the attributes of a with block's context manager");
        return false;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items.get()); ++i) {
        PyObject* key = PyTuple_GET_ITEM(PyList_GET_ITEM(items.get(), i), 0);
        PyObject* value = PyTuple_GET_ITEM(PyList_GET_ITEM(items.get(), i), 1);
        if (!PyUnicode_Check(key)) continue;
        if (is_constant_like(value)) {
            if (m_cap.input_child(ctx, AccessKind::Attr, 0, key, "." + py::str_of(key), value) < 0)
                return false;
        } else {  // (not held here: inference_mode's state comes back when its guard dies)
            m_cap.fail(breaks::kUnsupportedOpcode,
                       "a graph break inside a `with " + py::type_name(obj) + "` block that "
                       "began before it: what the block's end restores is kept where it cannot "
                       "be checked (" + py::type_name(value) + ")",
                       "move the code that breaks out of the with block");
            return false;
        }
    }
    return true;
}

// Default `d` (positional) or `name` (keyword-only) of a function made in the call: the value
// its MAKE_FUNCTION took (`real` is the object the function holds).
int Monitor::made_default(int func_value, bool positional, int d, PyObject* name, PyObject* real) {
    std::vector<int> parts = m_cap.v(func_value).items;
    int src = parts.size() == 2 ? parts[positional ? 0 : 1] : -1;
    const Value* s = src >= 0 ? &m_cap.v(src) : nullptr;
    if (s && s->kind == ValueKind::Const && s->real.get() != Py_None) return m_cap.const_value(real);
    if (s && positional && s->kind == ValueKind::FreshTuple && d >= 0 &&
        static_cast<size_t>(d) < s->items.size())
        return s->items[static_cast<size_t>(d)];
    if (s && !positional && s->kind == ValueKind::FreshDict) {
        for (size_t j = 0; j + 1 < s->items.size(); j += 2) {
            PyObject* key = m_cap.v(s->items[j]).real.get();
            if (key && PyObject_RichCompareBool(key, name, Py_EQ) == 1) return s->items[j + 1];
            PyErr_Clear();
        }
    }
    m_cap.internal_error("a default of a function made in the call");
    return -1;
}

bool Monitor::bind_callee(ShadowFrame& f, Pending& call, int func_value) {
    PyCodeObject* co = f.code;
    int n = py::code_nlocalsplus(co);
    f.locals.assign(static_cast<size_t>(n), -1);
    f.func_value = func_value;
    std::vector<int> pos = call.in;  // callable excluded; for InlineModule self first
    size_t nkw = call.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(call.kwnames)) : 0;
    std::vector<int> kwvals(pos.end() - static_cast<long>(nkw), pos.end());
    pos.resize(pos.size() - nkw);
    int argc = co->co_argcount, kwonly = co->co_kwonlyargcount;
    bool has_varargs = co->co_flags & CO_VARARGS, has_varkw = co->co_flags & CO_VARKEYWORDS;
    std::vector<int> bound(static_cast<size_t>(argc + kwonly), -1);
    std::vector<int> extra_pos;
    for (size_t i = 0; i < pos.size(); ++i) {
        if (static_cast<int>(i) < argc) bound[i] = pos[i];
        else extra_pos.push_back(pos[i]);
    }
    std::vector<int> extra_kw;  // key, value pairs
    for (size_t k = 0; k < nkw; ++k) {
        PyObject* name = PyTuple_GET_ITEM(call.kwnames, static_cast<Py_ssize_t>(k));
        int idx = -1;
        for (int i = 0; i < argc + kwonly; ++i) {
            int eq = PyObject_RichCompareBool(py::code_localsplus_name(co, i), name, Py_EQ);
            if (eq == 1) {
                idx = i;
                break;
            }
        }
        if (idx >= 0) bound[static_cast<size_t>(idx)] = kwvals[k];
        else {
            extra_kw.push_back(m_cap.const_value(name));
            extra_kw.push_back(kwvals[k]);
        }
    }
    // Defaults come from the function object: guarded through its access path, or for a
    // function made in the call, the values it was made with.
    PyObject* func = py::frame_function(f.frame);
    PyObject* defaults = PyFunction_GET_DEFAULTS(func);
    PyObject* kwdefaults = PyFunction_GET_KW_DEFAULTS(func);
    bool made_here = func_value >= 0 && m_cap.v(func_value).kind == ValueKind::Function;
    for (int i = 0; i < argc + kwonly; ++i) {
        if (bound[static_cast<size_t>(i)] >= 0) continue;
        PyObject* real = py::frame_local_value(f.frame, co, i);
        if (!real) return m_cap.internal_error("unbound argument"), false;
        if (made_here) {
            bool positional = i < argc && defaults;
            int d = positional ? i - (argc - static_cast<int>(PyTuple_GET_SIZE(defaults))) : -1;
            int id = made_default(func_value, positional, d, py::code_localsplus_name(co, i), real);
            if (id < 0) return false;
            bound[static_cast<size_t>(i)] = id;
            continue;
        }
        if (i < argc && defaults) {
            int ndef = static_cast<int>(PyTuple_GET_SIZE(defaults));
            int d = i - (argc - ndef);
            if (func_value >= 0 && m_cap.v(func_value).node >= 0)
                bound[static_cast<size_t>(i)] = m_cap.input_child(
                    func_value, AccessKind::FuncDefault, d, nullptr,
                    ".__defaults__[" + std::to_string(d) + "]", real);
            else
                bound[static_cast<size_t>(i)] = m_cap.const_value(real);  // Module.forward: class
        } else if (kwdefaults) {
            PyObject* name = py::code_localsplus_name(co, i);
            if (func_value >= 0 && m_cap.v(func_value).node >= 0)
                bound[static_cast<size_t>(i)] = m_cap.input_child(
                    func_value, AccessKind::FuncKwDefault, 0, name,
                    ".__kwdefaults__['" + str(name) + "']", real);
            else
                bound[static_cast<size_t>(i)] = m_cap.const_value(real);
        }
        if (bound[static_cast<size_t>(i)] < 0) return false;
        if (m_cap.v(bound[static_cast<size_t>(i)]).kind != ValueKind::Const &&
            m_cap.v(bound[static_cast<size_t>(i)]).kind != ValueKind::Input)
            return false;
    }
    auto set_local = [&](int i, int id) {
        PyObject* real = py::frame_local(f.frame, i);
        if (py::code_local_kind(co, i) & py::kLocalKindCell) {
            m_cap.cells()[real] = id;
            real = PyCell_GET(real);
        } else {
            f.locals[static_cast<size_t>(i)] = id;
        }
        Value& val = m_cap.v(id);
        if (!val.real) val.real = py::Ref::borrow(real);
        else if (val.real.get() != real && val.kind != ValueKind::Const)
            m_cap.internal_error("argument binding does not match the frame");
    };
    for (int i = 0; i < argc + kwonly; ++i) set_local(i, bound[static_cast<size_t>(i)]);
    int slot = argc + kwonly;
    if (has_varargs) {
        PyObject* real = py::frame_local_value(f.frame, co, slot);
        set_local(slot, m_cap.fresh(ValueKind::FreshTuple, extra_pos, real));
        ++slot;
    } else if (!extra_pos.empty()) {
        return m_cap.internal_error("too many positional arguments"), false;
    }
    if (has_varkw) {
        PyObject* real = py::frame_local_value(f.frame, co, slot);
        set_local(slot, m_cap.fresh(ValueKind::FreshDict, extra_kw, real));
    } else if (!extra_kw.empty()) {
        return m_cap.internal_error("unexpected keyword argument"), false;
    }
    for (int i = 0; i < py::code_nlocalsplus(co); ++i) {
        unsigned char kind = py::code_local_kind(co, i);
        PyObject* real = py::frame_local(f.frame, i);
        if (i >= argc + kwonly + has_varargs + has_varkw && (kind & py::kLocalKindCell) && real &&
            !m_cap.cells().count(real))
            m_cap.cells()[real] = -1;
    }
    return !m_cap.failed();
}

// [SECTION] dispatch ---------------------------------------------------------------------------

int Monitor::pop(ShadowFrame& f) {
    if (f.stack.empty()) {
        m_cap.internal_error("shadow stack underflow");
        return 0;
    }
    int v = f.stack.back();
    f.stack.pop_back();
    return v;
}

// [Note: exceptions caught in the frame] An exception raised by an instruction of the frame
// we trace, that a handler in the same frame catches, is followed when the guards decide that
// it is raised: unpacking a sequence of known length (`b, c, h, w = x.shape` for a 3-d x),
// indexing a list of guarded length or a dict without the key (guarded absent) with a
// constant, `view` on a tensor whose sizes and strides are guarded, or an import of a module
// that is not installed. The raising instruction leaves
// nothing in the plan; the shadow stack unwinds as CPython's does (to the handler's depth, the
// offset if the table says so, the exception) and the handler is traced like other code, the
// exception a constant. Any other exception stops the capture (MB006), as does a break inside
// an except clause that would need resuming there.
void Monitor::on_exception(PyFrameObject* fo, PyObject* exc_info) {
    ShadowFrame& f = m_frames.back();
    PyObject* type = exc_info && PyTuple_Check(exc_info) && PyTuple_GET_SIZE(exc_info) == 3
                         ? PyTuple_GET_ITEM(exc_info, 0)
                         : nullptr;
    PyObject* value = type ? PyTuple_GET_ITEM(exc_info, 1) : nullptr;
    py::Instruction ins = py::frame_current_instruction(f.frame);
    py::Handler h = py::code_handler(f.code, ins.offset);
    bool handled = h.target >= 0 && py::code_offset_reaches_user_handler(f.code, ins.offset);
    if (!handled && !f.caller_in_try && !m_cap.failed()) return drop_raising_call();
    bool caught = handled && h.depth <= static_cast<int>(f.stack.size() + f.pending.in.size());
    if (!caught || !type || !value || !raise_is_determined(f, type, value) || m_cap.failed()) {
        m_cap.fail(breaks::kException, "an exception was raised inside the captured code",
                   "code that raises (or catches) exceptions runs eagerly");
        stop_tracing();
        return;
    }
    f.pending = Pending{};
    f.kwnames = nullptr;
    f.stack.resize(static_cast<size_t>(h.depth));
    if (h.lasti) {
        py::Ref at = py::Ref::steal(PyLong_FromLong(ins.offset));
        f.stack.push_back(m_cap.const_value(at.get()));
    }
    f.stack.push_back(m_cap.const_value(value));
    (void)fo;
}

// `try: import apex except ImportError:` and `from m import name`: the import fails the same
// way at every call while what it looked for is not found: a module that is not installed
// (ModuleNotFoundError naming the module imported, or a package on its path), guarded absent
// from sys.modules, and for `from m import name` the name, guarded absent from m and
// "m.name" from sys.modules. A module that raises ImportError from its own body (or cannot find
// one of its own imports) runs that body on every eager call: that breaks. A module installed
// on disk while the process runs is not seen.
bool Monitor::import_fails_for_good(ShadowFrame& f, PyObject* exc) {
    Pending& p = f.pending;
    PyObject* name = py::code_name(f.code, p.oparg);
    static PyObject* modules = PyImport_GetModuleDict();  // sys.modules (borrowed, lives on)
    int sys_modules = m_cap.constant_root(modules, "sys.modules");
    if (sys_modules < 0) return false;
    auto absent = [&](PyObject* key) {
        int in = PyDict_Contains(modules, key);
        if (in != 0) {
            PyErr_Clear();
            return false;  // present (None: blocked on purpose; or a module after all)
        }
        m_cap.guard_no_key(sys_modules, key);
        return true;
    };
    if (p.opcode == IMPORT_FROM) {
        PyObject* module = p.in.size() == 1 ? m_cap.v(p.in[0]).real.get() : nullptr;
        if (!module || !PyModule_Check(module) || m_cap.v(p.in[0]).node < 0) return false;
        // the import machinery's own "cannot import name", not one raised by the module's
        // __getattr__ (PEP 562: a lazy module whose optional backend is missing)
        PyObject* mdict = PyModule_GetDict(module);
        if (mdict && PyDict_GetItemString(mdict, "__getattr__")) return false;
        py::Ref text = py::Ref::steal(exc ? PyObject_Str(exc) : nullptr);
        if (!text || !starts_with(py::str_of(text.get()), "cannot import name")) {
            PyErr_Clear();
            return false;
        }
        const char* pkg = PyModule_GetName(module);
        if (!pkg) {
            PyErr_Clear();
            return false;
        }
        py::Ref full = py::Ref::steal(PyUnicode_FromFormat("%s.%U", pkg, name));
        if (!full || !absent(full.get())) return false;
        m_cap.guard_no_attr(p.in[0], name);
        return true;
    }
    if (!exc || !PyErr_GivenExceptionMatches(reinterpret_cast<PyObject*>(Py_TYPE(exc)),
                                             PyExc_ModuleNotFoundError))
        return false;
    py::Ref missing = py::Ref::steal(PyObject_GetAttrString(exc, "name"));
    if (!missing || !PyUnicode_Check(missing.get())) {
        PyErr_Clear();
        return false;
    }
    std::string m = py::str_of(missing.get()), wanted = py::str_of(name);
    if (m.empty() || !(wanted == m || wanted.rfind(m + ".", 0) == 0))
        return false;  // one of the module's own imports: its body runs at every call
    // `import a.b.c` with a.b missing: the packages before it were found, and are guarded to
    // stay the same objects in sys.modules (removed, eager would run their bodies again)
    for (size_t dot = m.find('.'); dot != std::string::npos; dot = m.find('.', dot + 1)) {
        py::Ref parent = py::Ref::steal(PyUnicode_FromStringAndSize(m.data(), static_cast<Py_ssize_t>(dot)));
        PyObject* pm = parent ? PyDict_GetItemWithError(modules, parent.get()) : nullptr;
        if (!pm) {
            PyErr_Clear();
            return false;
        }
        int v = m_cap.input_child(sys_modules, AccessKind::DictItem, 0, parent.get(),
                                  "[" + py::repr_string(parent.get()) + "]", pm);
        if (v < 0) return false;
        m_cap.guard_identity(v);
    }
    return absent(missing.get());
}

// Whether the guards decide that the pending instruction raises (exception type `type`).
bool Monitor::raise_is_determined(ShadowFrame& f, PyObject* type, PyObject* exc) {
    Pending& p = f.pending;
    if ((p.opcode == IMPORT_NAME || p.opcode == IMPORT_FROM) &&
        PyErr_GivenExceptionMatches(type, PyExc_ImportError))
        return import_fails_for_good(f, exc);
    if ((p.opcode == UNPACK_SEQUENCE || p.opcode == UNPACK_EX) && p.in.size() == 1 &&
        PyErr_GivenExceptionMatches(type, PyExc_ValueError)) {
        std::vector<int> items;  // known length (guarded), so it raises again
        return items_of(p.in[0], items);
    }
    if (p.opcode == BINARY_SUBSCR && p.in.size() == 2 && m_cap.v(p.in[1]).kind == ValueKind::Const) {
        // xs[100] (IndexError), d["missing"] (KeyError) on a container whose length or keys
        // are guarded
        const Value& c = m_cap.v(p.in[0]);
        PyObject* key = m_cap.v(p.in[1]).real.get();
        if (PyErr_GivenExceptionMatches(type, PyExc_IndexError) && PyLong_CheckExact(key) &&
            !c.tensor && (PyList_CheckExact(c.real.get()) || PyTuple_CheckExact(c.real.get()))) {
            std::vector<int> items;
            return items_of(p.in[0], items);
        }
        if (PyErr_GivenExceptionMatches(type, PyExc_KeyError) && PyDict_CheckExact(c.real.get())) {
            if (c.kind == ValueKind::FreshDict) return true;
            if (c.kind != ValueKind::Input || c.mutated) return false;
            m_cap.guard_no_key(p.in[0], key);
            return true;
        }
        return false;
    }
    if (p.opcode == CALL && p.callee.kind == CallKind::TorchOp && p.callee.op == "view" &&
        PyErr_GivenExceptionMatches(type, PyExc_RuntimeError)) {
        // The sizes and strides of every tensor, and the sizes asked for, decide it.
        for (int a : p.in) {
            if (m_cap.holds(a, &Value::dyn_shape) || m_cap.holds(a, &Value::dyn_scalar))
                return false;
            m_cap.concretize(a);
        }
        if (p.callee.bound_self && m_cap.v(p.callee_value).dyn_shape) return false;
        m_cap.pin_all_dims();
        guard_all_strides();
        return true;
    }
    return false;
}

void Monitor::on_opcode(PyFrameObject* fo) {
    if (m_frames.empty() || m_frames.back().frame_obj != fo) return;
    ShadowFrame& f = m_frames.back();
#if MAGPY_IS_PYTHON_312
    // 3.12 may report an instruction after its EXTENDED_ARG prefix, already decoded (and
    // dispatched) at the prefix's event; it has not run yet.
    if (f.prefixed_at >= 0) {
        // every later prefix has an event of its own too; the instruction's is the last
        int here = py::frame_offset(f.frame);
        if (here < f.prefixed_at && here >= f.prefixed_from) return;
        int at = std::exchange(f.prefixed_at, -1);
        if (here == at) return;
    }
#endif
    if (f.pending.opcode >= 0) complete(f);
    if (!m_cap.failed()) generators_left_in_cleanup(false);
    if (m_cap.failed()) return stop_tracing();
    int depth = py::frame_stack_depth(f.frame, f.depths);
#if !MAGPY_IS_PYTHON_312
    if (!f.depths.empty()) {  // MAGPY_CHECK_DEPTHS=1: [Note: stack depth in 3.12]
        int at = py::frame_offset(f.frame);
        if (f.depths[static_cast<size_t>(at)] != depth) {
            m_cap.internal_error("computed stack depth " + std::to_string(f.depths[static_cast<size_t>(at)]) +
                                 " at offset " + std::to_string(at) + " of `" + str(f.code->co_qualname) +
                                 "`, CPython has " + std::to_string(depth));
            return stop_tracing();
        }
    }
#endif
    if (depth != static_cast<int>(f.stack.size())) {
        m_cap.internal_error("shadow stack out of sync (" + std::to_string(f.stack.size()) +
                             " vs " + std::to_string(depth) + ")");
        return stop_tracing();
    }
    py::Instruction ins = py::frame_current_instruction(f.frame);
    if (ins.prefixed) {
        f.prefixed_at = ins.offset;
        f.prefixed_from = py::frame_offset(f.frame);
    }
    m_at_code = f.code;
    m_at_offset = ins.offset;
    set_in_try(f, ins.offset);
    m_cap.set_site(f.code, py::frame_globals(f.frame), ins.offset);
    if (!f.library_code) {
        m_cap.set_location(f.code, py::code_line_of(f.code, ins.offset));
    } else {
        // Inside torch's own Python (Sequential.forward): report the user's innermost frame,
        // at the call it is making now (not a line of a callee that already returned).
        for (auto it = m_frames.rbegin(); it != m_frames.rend(); ++it)
            if (!it->library_code) {
                py::Instruction at = py::frame_current_instruction(it->frame);
                m_cap.set_location(it->code, py::code_line_of(it->code, at.offset));
                break;
            }
    }
    if (f.is_root) {
        if (at_site(f, ins)) {
            end_segment(f, ins);
            return stop_tracing();
        }
        m_root_ins = ins;
        m_root_callee = callee_at(f, ins);
    }
    m_cap.instructions++;
    if (!f.is_root) {
        dispatch(f, ins);
        if (m_cap.failed()) stop_tracing();
        return;
    }
    // What a failing dispatch may have taken off the shadow frame: its operands (stack) and
    // KW_NAMES (kwnames); `pending` is empty here (complete() reset it) and may be set.
    size_t steps = m_cap.step_count();
    std::vector<int> stack = f.stack;
    PyObject* kwnames = f.kwnames;
    dispatch(f, ins);
    if (!m_cap.failed() || m_raising) return;
    // A break found before the root frame's instruction ran: the frame is as it was before it,
    // so the segment can end here now, as the next capture would at this site.
    if (m_cap.step_count() == steps) {
        std::swap(f.stack, stack);
        std::swap(f.kwnames, kwnames);
        Pending pending = std::exchange(f.pending, Pending{});
        if (break_here(f, ins)) return;
        std::swap(f.stack, stack);
        std::swap(f.kwnames, kwnames);
        f.pending = std::move(pending);
    }
    stop_tracing();
}

static const char* opname(int op);

void Monitor::dispatch(ShadowFrame& f, const py::Instruction& ins) {
    if (drops_finalized(f, ins)) return;  // before the instruction: see on_opcode
    int depth = static_cast<int>(f.stack.size());
    Pending p;
    p.opcode = ins.opcode;
    p.oparg = ins.oparg;
    auto take = [&](int n) {
        p.in.assign(f.stack.end() - n, f.stack.end());
        f.stack.resize(f.stack.size() - static_cast<size_t>(n));
    };
    auto defer = [&](int n_in, int n_out) {
        take(n_in);
        p.depth_after = depth - n_in + n_out;
        f.pending = std::move(p);
    };
    switch (ins.opcode) {
    case NOP: case RESUME: case JUMP_FORWARD: case JUMP_BACKWARD:
    case JUMP_BACKWARD_NO_INTERRUPT: case CACHE:
        return;
    case KW_NAMES: {
        f.kwnames = py::code_const(f.code, ins.oparg);
        int prefixes = 0;
        for (int a = ins.oparg >> 8; a; a >>= 8) ++prefixes;
        f.kwnames_at = ins.offset - prefixes;
        return;
    }
    // An except clause entered by a caught exception ([Note: exceptions caught in the frame])
    case PUSH_EXC_INFO:
        ++f.handlers;
        defer(1, 2);  // the previous exception (None at the top), the exception
        return;
    case CHECK_EXC_MATCH:
        defer(2, 2);  // the exception stays; whether it matches
        return;
    // match statements: what a pattern asks of the subject (its type, length, attributes)
    case MATCH_SEQUENCE: case MATCH_MAPPING: case GET_LEN:
        defer(1, 2);  // the subject stays
        return;
    case MATCH_CLASS:
        defer(3, 1);
        return;
    case MATCH_KEYS:
        defer(2, 3);  // the subject and the keys stay; the values, or None
        return;
    case POP_EXCEPT:
        if (f.handlers > 0) --f.handlers;
        pop(f);
        return;
    case YIELD_VALUE:
        if (f.gen < 0)
            return m_cap.fail(breaks::kUnsupportedOpcode, "a yield in a frame that is not a "
                              "generator made in the call", "yield from generators made inside");
        defer(1, 0);  // completed by the frame's return event (on_return)
        return;
    case POP_TOP: pop(f); return;
    case PUSH_NULL: push(f, m_cap.null_value()); return;
    case COPY: push(f, f.stack[f.stack.size() - static_cast<size_t>(ins.oparg)]); return;
    case SWAP:
        std::swap(f.stack.back(), f.stack[f.stack.size() - static_cast<size_t>(ins.oparg)]);
        return;
    case LOAD_CONST: push(f, m_cap.const_value(py::code_const(f.code, ins.oparg))); return;
    case LOAD_FAST: {
        int id = f.locals[static_cast<size_t>(ins.oparg)];
        if (id < 0) {
            // The real local has no value either: the instruction raises UnboundLocalError,
            // as it does without magpy. Otherwise the shadow lost track of it (an engine bug).
            if (!py::frame_local(f.frame, ins.oparg)) return fail_unassigned(m_cap, f.code, ins.oparg);
            return m_cap.internal_error("read of a local with no value");
        }
        push(f, id);
        return;
    }
    case STORE_FAST: {
        int v = pop(f);  // 3.12: a comprehension restores a local it found unbound (NULL)
        f.locals[static_cast<size_t>(ins.oparg)] = v == m_cap.null_value() ? -1 : v;
        return;
    }
    case DELETE_FAST: f.locals[static_cast<size_t>(ins.oparg)] = -1; return;
    case LOAD_GLOBAL: {
        PyObject* name = py::code_name(f.code, ins.oparg >> 1);
        if (ins.oparg & 1) push(f, m_cap.null_value());
        int id = load_global(f, name);
        if (id >= 0) push(f, id);
        return;
    }
    case STORE_GLOBAL: {
        PyObject* name = py::code_name(f.code, ins.oparg);
        int val = pop(f);
        if (py::frame_globals(f.frame) != py::frame_globals(m_frames.front().frame))
            return m_cap.fail(breaks::kUnsupportedOpcode,
                              "a global of another module is assigned", "return the value instead");
        Step s;
        s.kind = StepKind::SetItem;
        int globals = m_cap.input_root(AccessKind::GlobalsDict, 0, nullptr, "G",
                                       py::frame_globals(f.frame));
        m_cap.record_effect(std::move(s), {globals, m_cap.const_value(name), val});
        m_cap.global_overlay()[str(name)] = val;
        return;
    }
    case LOAD_DEREF: {
        int id = load_deref(f, ins.oparg);
        if (id >= 0) push(f, id);
        return;
    }
    case STORE_DEREF: {
        PyObject* cell = py::frame_local(f.frame, ins.oparg);
        if (f.is_root && root_closure_cell(f, cell)) {
            // `nonlocal step; step += 1` in the compiled function itself: its closure is the
            // same on every call, so each write is an effect on that cell, replayed in order
            // (every one: a review probe found `count += 1; count *= 3` left at 1), and later
            // reads in the call see the value written
            static PyObject* setter = [] {
                PyObject* d = _PyType_Lookup(&PyCell_Type, interned("cell_contents"));
                return d ? PyObject_GetAttrString(d, "__set__") : nullptr;  // kept
            }();
            if (!setter) return m_cap.internal_error("cell_contents.__set__");
            int val = pop(f);
            Step s;
            s.kind = StepKind::Call;
            m_cap.record_effect(std::move(s),
                                {m_cap.const_value(setter), m_cap.const_value(cell), val});
            m_cap.cells()[cell] = val;
            return;
        }
        if (!m_cap.cells().count(cell))
            return m_cap.fail(breaks::kUnsupportedOpcode,
                              "a `nonlocal` variable of an enclosing function is assigned",
                              "return the new value instead of assigning it");
        int val = pop(f);
        m_cap.rebound(cell);  // read as written from here on
        if (m_cap.cell_frozen_at(cell, val))  // [Note: functions made in the call]
            return m_cap.fail(breaks::kEscapingObject,
                              "`" + str(py::code_localsplus_name(f.code, ins.oparg)) +
                                  "` is assigned after a function that reads it left the call",
                              "assign it before making the function, or pass it as an argument");
        m_cap.cells()[cell] = val;
        return;
    }
    case LOAD_CLOSURE:
        push(f, m_cap.new_value(ValueKind::Cell, py::frame_local(f.frame, ins.oparg), "cell"));
        return;
    case RETURN_VALUE:
        f.return_value = pop(f);
        return;
    case RETURN_CONST:  // 3.12
        f.return_value = m_cap.const_value(py::code_const(f.code, ins.oparg));
        return;
    case LOAD_FAST_AND_CLEAR: {  // 3.12: an inlined comprehension saves a local it shadows
        if (py::code_local_kind(f.code, ins.oparg) & py::kLocalKindCell)
            return m_cap.fail(breaks::kUnsupportedOpcode,
                              "a comprehension's variable is also a closure cell of the function",
                              "rename the comprehension's variable");
        int& local = f.locals[static_cast<size_t>(ins.oparg)];
        push(f, local >= 0 ? local : m_cap.null_value());
        local = -1;
        return;
    }
    case END_FOR:  // 3.12: reached only by a jump past an exhausted FOR_ITER's usual target
        pop(f);
        pop(f);
        return;
    case LOAD_SUPER_ATTR: {  // 3.12: super().name / super(cls, obj).name, no super object made
        int obj = pop(f), cls = pop(f), fn = pop(f);
        if (m_cap.v(fn).real.get() != reinterpret_cast<PyObject*>(&PySuper_Type))
            return m_cap.fail(breaks::kUnsupportedCallee, "`super` is not the builtin super",
                              "do not shadow super");
        Pending call;
        call.in = {cls, obj};
        dispatch_super(f, call);  // [Note: super], in its two-argument form
        if (m_cap.failed()) return;
        py::Ref real = py::Ref::steal(PyObject_CallFunctionObjArgs(
            reinterpret_cast<PyObject*>(&PySuper_Type), m_cap.v(call.in[0]).real.get(),
            m_cap.v(call.in[1]).real.get(), nullptr));
        if (!real) return m_cap.internal_error("super() did not make a super object");
        int sup = m_cap.new_value(ValueKind::Super, real.get(), "super()");
        m_cap.v(sup).items = call.in;
        push(f, sup);
        py::Instruction attr = ins;  // then LOAD_METHOD / LOAD_ATTR on it, as 3.11 runs it
        attr.opcode = (ins.oparg & 1) ? LOAD_METHOD : LOAD_ATTR;
        attr.oparg = ins.oparg >> 2;
        return dispatch(f, attr);
    }
    case BINARY_SLICE: case STORE_SLICE: {  // 3.12: x[a:b] and x[a:b] = v
        // The same as BUILD_SLICE 2 then BINARY_SUBSCR / STORE_SUBSCR.
        int stop = pop(f), start = pop(f);
        PyObject* a = m_cap.v(start).real.get();
        PyObject* b = m_cap.v(stop).real.get();
        py::Ref real = py::Ref::steal(PySlice_New(a ? a : Py_None, b ? b : Py_None, nullptr));
        if (!real) return m_cap.internal_error("slice()");
        int slice = slice_value({start, stop}, real.get());
        if (slice < 0) return;
        push(f, slice);
        py::Instruction subscr = ins;
        subscr.opcode = ins.opcode == BINARY_SLICE ? BINARY_SUBSCR : STORE_SUBSCR;
        return dispatch(f, subscr);
    }
    case POP_JUMP_FORWARD_IF_TRUE: case POP_JUMP_FORWARD_IF_FALSE:
    case POP_JUMP_BACKWARD_IF_TRUE: case POP_JUMP_BACKWARD_IF_FALSE: {
        int v = pop(f);
        if (!branch_to_raise(f, ins, v)) truthiness_known(v);
        return;
    }
    case POP_JUMP_FORWARD_IF_NONE: case POP_JUMP_FORWARD_IF_NOT_NONE:
    case POP_JUMP_BACKWARD_IF_NONE: case POP_JUMP_BACKWARD_IF_NOT_NONE: {
        int v = pop(f);
        const Value& t = m_cap.v(v);
        // A size or a number read at replay is a number whatever its value:
        // `tgt_len if tgt_len is not None else src_len` with tgt_len symbolic
        bool number = t.real && (PyLong_CheckExact(t.real.get()) || PyFloat_CheckExact(t.real.get())) &&
                      (t.sym || t.dyn_scalar || t.data_size);
        if (t.kind == ValueKind::OpResult && !t.tensor && !number)
            m_cap.fail(breaks::kTensorToPython, "a branch tests an op result against None",
                       "test the inputs instead");
        return;
    }
    case JUMP_IF_TRUE_OR_POP: case JUMP_IF_FALSE_OR_POP:
        if (!truthiness_known(f.stack.back())) return;
        p.depth_after = depth;  // or depth - 1: decided at completion
        f.pending = std::move(p);
        return;
    case STORE_ATTR: {
        PyObject* name = py::code_name(f.code, ins.oparg);
        int obj = pop(f), val = pop(f);
        if (expect_property_setter(p, obj, name, val)) {
            p.depth_after = depth - 2;
            f.pending = std::move(p);
            return;
        }
        if (m_cap.failed()) return;
        if (m_cap.v(obj).kind == ValueKind::FreshObject || input_dict(obj))
            p.in = {obj, m_cap.const_value(name), val};
        if (expect_hook(p, "__setattr__")) {
            p.depth_after = depth - 2;
            f.pending = std::move(p);
            return;
        }
        return store_attr(obj, name, val);
    }
    case DELETE_SUBSCR: {
        // del d[key] on a dict with a constant key (before it runs: the key is still there)
        int key = pop(f), cont = as_mapping(pop(f), "__delitem__");
        if (cont < 0) return;
        Value& c = m_cap.v(cont);
        bool dict = c.kind == ValueKind::FreshDict ||
                    (c.kind == ValueKind::Input && !c.tensor && PyDict_Check(c.real.get()));
        if (!dict || m_cap.v(key).kind != ValueKind::Const)
            return m_cap.fail(breaks::kUnsupportedOpcode, "`del` of an item of " + c.label,
                              "delete items of dicts, by constant keys");
        PyObject* present = c.kind == ValueKind::Input
                                ? PyDict_GetItemWithError(c.real.get(), m_cap.v(key).real.get())
                                : nullptr;
        PyErr_Clear();
        remove_dict_item(cont, key, present, false);  // a missing key raises KeyError after this
        return;
    }
    case STORE_SUBSCR: {
        int key = pop(f), cont = pop(f), val = pop(f);
        p.in = {cont, key, val};
        if (expect_hook(p, "__setitem__")) {
            p.depth_after = depth - 3;
            f.pending = std::move(p);
            return;
        }
        cont = as_mapping(cont, "__setitem__");
        if (cont < 0) return;
        Value& c = m_cap.v(cont);
        if (c.tensor) {
            Step s;
            s.kind = StepKind::SetItem;
            Arg a, b, d;
            if (!m_cap.arg_of(cont, a) || !m_cap.arg_of(key, b) || !m_cap.arg_of(val, d)) return;
            s.args = {a, b, d};
            s.effect = true;
            s.mutates = 0;
            m_cap.record(std::move(s), Py_None, "setitem", true);
            return;
        }
        bool list = c.kind == ValueKind::FreshList ||
                    (c.kind == ValueKind::Input && PyList_CheckExact(c.real.get()));
        if (list && m_cap.v(key).kind == ValueKind::Const && PyLong_Check(m_cap.v(key).real.get())) {
            if (c.kind == ValueKind::Input && !m_cap.shadow(cont)) return;
            Py_ssize_t i = PyLong_AsSsize_t(m_cap.v(key).real.get());
            Py_ssize_t n = static_cast<Py_ssize_t>(c.items.size());
            if (i < 0) i += n;
            if (i < 0 || i >= n) return m_cap.internal_error("list index out of range");
            c.items[static_cast<size_t>(i)] = val;
            if (m_cap.exists_at_replay(cont)) {
                Step s;
                s.kind = StepKind::SetItem;
                m_cap.record_effect(std::move(s), {cont, key, val});
            }
            return;
        }
        if (c.kind == ValueKind::FreshDict && m_cap.v(key).kind == ValueKind::Const)
            return set_fresh_item(cont, key, val);
        if (c.kind == ValueKind::Input && PyDict_Check(c.real.get())) {
            PyObject* k = m_cap.v(key).real.get();  // the write has not run yet
            bool added = k && written_item(cont, k) < 0 && PyDict_Contains(c.real.get(), k) == 0;
            PyErr_Clear();
            return write_input_item(cont, key, val, added);
        }
        return m_cap.fail(breaks::kUnsupportedOpcode, "item assignment on " + c.label,
                          "assign items of tensors, lists or dicts");
    }
    case LIST_APPEND: {
        int val = pop(f);
        Value& l = m_cap.v(f.stack[f.stack.size() - static_cast<size_t>(ins.oparg)]);
        if (l.kind != ValueKind::FreshList) return split_display("list");
        l.items.push_back(val);
        return;
    }
    case MAP_ADD: {
        int val = pop(f), key = pop(f);
        Value& d = m_cap.v(f.stack[f.stack.size() - static_cast<size_t>(ins.oparg)]);
        if (d.kind != ValueKind::FreshDict || m_cap.v(key).kind != ValueKind::Const)
            return m_cap.fail(breaks::kUnsupportedOpcode, "a dict comprehension with computed keys",
                              "use constant keys");
        d.items.push_back(key);
        d.items.push_back(val);
        return;
    }
    case SET_ADD:     // {e for e in ...}
    case SET_UPDATE: {  // {1, 2, 3}: BUILD_SET 0, then the constant frozenset
        int src = pop(f);
        int target = f.stack[f.stack.size() - static_cast<size_t>(ins.oparg)];
        if (m_cap.v(target).kind != ValueKind::FreshSet)
            return m_cap.fail(breaks::kUnsupportedOpcode, "a set of values that are not "
                              "constants", "build sets of constants (numbers, strings)");
        if (ins.opcode == SET_ADD) require_const({src}, "a set element");
        else set_source_known(src);  // the set changes as the real one does
        return;
    }
    case LIST_EXTEND: {
        int src = pop(f);
        int target = f.stack[f.stack.size() - static_cast<size_t>(ins.oparg)];
        if (m_cap.v(target).kind != ValueKind::FreshList)
            return split_display("list");
        std::vector<int> items;
        if (!items_of(src, items)) return;
        std::vector<int>& dst = m_cap.v(target).items;
        dst.insert(dst.end(), items.begin(), items.end());
        return;
    }
    case PRECALL:  // 3.11
        split_bound_method(f, ins.oparg);
        return;
    case CALL: {
        int n = ins.oparg;
#if MAGPY_IS_PYTHON_312
        if (!split_bound_method(f, n)) return;  // CALL does what PRECALL did
#endif
        PyObject* kwnames = f.kwnames;
        f.kwnames = nullptr;
        int a = f.stack[f.stack.size() - static_cast<size_t>(n) - 2];
        std::vector<int> args(f.stack.end() - n, f.stack.end());
        int callable;
        if (a == m_cap.null_value()) {
            callable = f.stack[f.stack.size() - static_cast<size_t>(n) - 1];
        } else {
            callable = a;
            args.insert(args.begin(), f.stack[f.stack.size() - static_cast<size_t>(n) - 1]);
        }
        take(n + 2);
        p.depth_after = depth - n - 1;
        f.pending = std::move(p);
        dispatch_call(f, callable, std::move(args), kwnames);
        return;
    }
    case CALL_FUNCTION_EX: {
        bool has_kw = ins.oparg & 1;
        int kw = has_kw ? pop(f) : -1;
        int star = pop(f);
        int callable = pop(f);
        pop(f);  // the NULL 3.11 pushes below the callable
        p.depth_after = depth - (has_kw ? 4 : 3) + 1;
        f.pending = std::move(p);
        std::vector<int> args;
        if (!items_of(star, args)) return;
        PyObject* kwnames = nullptr;
        py::Ref names;
        if (kw >= 0) {
            std::vector<int> pairs;
            if (!pairs_of(kw, pairs)) return;
            names = py::Ref::steal(PyTuple_New(static_cast<Py_ssize_t>(pairs.size() / 2)));
            for (size_t j = 0; j + 1 < pairs.size(); j += 2) {
                PyObject* key = m_cap.v(pairs[j]).real.get();
                PyTuple_SET_ITEM(names.get(), static_cast<Py_ssize_t>(j / 2), Py_NewRef(key));
                args.push_back(pairs[j + 1]);
            }
            if (!pairs.empty()) kwnames = names.get();
        }
        // Keep the kwnames tuple alive as a constant of the capture.
        if (kwnames) m_cap.const_value(kwnames);
        dispatch_call(f, callable, std::move(args), kwnames);
        return;
    }
    case DICT_MERGE: case DICT_UPDATE: {
        int src = pop(f);
        int target = f.stack[f.stack.size() - static_cast<size_t>(ins.oparg)];
        if (m_cap.v(target).kind != ValueKind::FreshDict)
            return split_display("dict");
        std::vector<int> pairs;
        if (!pairs_of(src, pairs)) return;
        for (size_t j = 0; j + 1 < pairs.size(); j += 2) dict_set(target, pairs[j], pairs[j + 1]);
        return;
    }
    case MAKE_FUNCTION: {
        // An inner function, lambda or comprehension: traced into when called. Its closure
        // cells are the ones this capture follows; its defaults are values of this capture
        // (`lambda t, k=k: ...`), kept with it for binding its calls.
        int parts = 1;
        for (int bit = 1; bit <= 0x08; bit <<= 1) parts += (ins.oparg & bit) ? 1 : 0;
        defer(parts, 1);
        return;
    }
    case IMPORT_NAME: defer(2, 1); return;  // level, fromlist -> the module
    case IMPORT_FROM: defer(1, 2); return;  // the module stays; its attribute is pushed
    case LOAD_ATTR:
    case LOAD_METHOD:
        defer(1, ins.opcode == LOAD_ATTR ? 1 : 2);
        if (!expect_getattribute(f, py::code_name(f.code, ins.oparg)))
            expect_property_getter(f, py::code_name(f.code, ins.oparg));
        return;
    case BEFORE_WITH:
        defer(1, 2);
        if (user_context_manager(f.pending)) expect_hook(f.pending, "__enter__");
        return;
    case BINARY_OP: case COMPARE_OP: case BINARY_SUBSCR: case IS_OP: case CONTAINS_OP:
        defer(2, 1);
        if (ins.opcode == BINARY_SUBSCR && !expect_hook(f.pending, "__getitem__")) {
            // d[k] of a dict subclass made in the call (Counter) without the key: the class's
            // __missing__ answers, called from dict's own lookup
            const Value& o = m_cap.v(f.pending.in[0]);
            const Value& k = m_cap.v(f.pending.in[1]);
            if (o.kind == ValueKind::FreshObject && o.mapping >= 0 &&
                k.kind == ValueKind::Const && fresh_dict_slot(o.mapping, k.real.get()) < 0)
                expect_hook(f.pending, "__missing__");
        }
        if (ins.opcode == CONTAINS_OP) {  // `key in container`: container.__contains__(key)
            Pending& q = f.pending;
            std::swap(q.in[0], q.in[1]);
            if (!expect_hook(q, "__contains__")) std::swap(q.in[0], q.in[1]);
        }
        return;
    case UNARY_NEGATIVE: case UNARY_POSITIVE: case UNARY_INVERT: case UNARY_NOT: case GET_ITER:
        defer(1, 1);
        if (ins.opcode == GET_ITER) expect_hook(f.pending, "__iter__");
        return;
    case BUILD_TUPLE: case BUILD_LIST: case BUILD_SET: defer(ins.oparg, 1); return;
    case BUILD_MAP: defer(2 * ins.oparg, 1); return;
    case BUILD_CONST_KEY_MAP: defer(ins.oparg + 1, 1); return;
    case BUILD_SLICE: defer(ins.oparg, 1); return;
    case LIST_TO_TUPLE: defer(1, 1); return;
    case BUILD_STRING: defer(ins.oparg, 1); return;
    case FORMAT_VALUE:
        defer((ins.oparg & 0x04) ? 2 : 1, 1);
        // f"{obj}", f"{obj!r}" of a class with its own __str__ / __repr__ (and object's
        // __format__, which calls str())
        if (!(ins.oparg & 0x04) && (ins.oparg & 0x03) != 3 && !f.pending.in.empty()) {
            int obj = f.pending.in[0];
            bool convert = (ins.oparg & 0x03) != 0;  // !s, !r: str() or repr() itself
            bool plain = objects_own(m_cap.v(obj).real.get(), "__format__");
            if ((convert || plain) && expect_text_hook(f.pending, (ins.oparg & 0x03) == 2) &&
                !convert)
                pin_type_attr(obj, "__format__");  // object's, which calls str()
        }
        return;
    case UNPACK_SEQUENCE: defer(1, ins.oparg); return;
    case UNPACK_EX: defer(1, (ins.oparg & 0xff) + (ins.oparg >> 8) + 1); return;
    case FOR_ITER:
        if (m_cap.v(f.stack.back()).kind != ValueKind::Iterator) {
            int it = input_iterator(f.stack.back());
            if (m_cap.failed()) return;
            if (it >= 0) f.stack.back() = it;
        }
        if (m_cap.v(f.stack.back()).kind != ValueKind::Iterator)
            return m_cap.fail(breaks::kUnsupportedOpcode,
                              "a loop goes on over " + m_cap.v(f.stack.back()).label +
                                  ", an iterator made before the capture started",
                              "the loop runs in Python after a graph break; move the break "
                              "out of the loop to capture it whole");
        p.depth_after = depth;  // depth + 1 (item) or depth - 1 (exhausted)
        f.pending = std::move(p);
        return;
    default:
        return m_cap.fail(breaks::kUnsupportedOpcode,
                          std::string("the bytecode instruction ") + opname(ins.opcode) +
                              " is not supported yet",
                          "this construct runs eagerly; see the list of supported Python");
    }
}

// [SECTION] completion -------------------------------------------------------------------------

// The value of slice(*bounds), `real` the slice CPython made. x[:T] with T a symbolic size,
// x[p:p + n] with p read from tensor data: the slice is built at replay. -1: the capture failed.
int Monitor::slice_value(const std::vector<int>& bounds, PyObject* real) {
    bool sym = false, data = false;
    for (int v : bounds) {
        sym = sym || m_cap.v(v).sym_number();
        data = data || m_cap.v(v).dyn_scalar;
    }
    if (!sym && !data) return require_const(bounds, "a slice") ? m_cap.const_value(real) : -1;
    Step s;
    s.kind = StepKind::BuildSlice;
    for (int v : bounds) {
        if (!m_cap.v(v).sym_number() && !m_cap.v(v).dyn_scalar && !known(v))
            return require_const({v}, "a slice"), -1;
        Arg a;
        if (!m_cap.arg_of(v, a)) return -1;
        s.args.push_back(std::move(a));
    }
    int r = m_cap.record(std::move(s), real, "slice(...)", false);
    m_cap.v(r).dyn_scalar = data;  // its bounds come from tensor data
    return r;
}

// Before a call of `n` arguments: CPython replaces [NULL, bound method] with [function, self]
// (3.11's PRECALL, 3.12's CALL), and so does the shadow stack. False: the capture failed.
bool Monitor::split_bound_method(ShadowFrame& f, int n) {
    int below = f.stack[f.stack.size() - static_cast<size_t>(n) - 2];
    PyObject* callable = real_stack(f, n);
    if (below != m_cap.null_value() || !PyMethod_Check(callable)) return true;
    int m = f.stack[f.stack.size() - static_cast<size_t>(n) - 1];
    if (m_cap.v(m).kind != ValueKind::Input)
        return m_cap.fail(breaks::kUnsupportedCallee, "a bound method object is called",
                          "call the method directly on its object"),
               false;
    int fn, self;
    if (!split_method(m, fn, self)) return false;
    f.stack[f.stack.size() - static_cast<size_t>(n) - 2] = fn;
    f.stack[f.stack.size() - static_cast<size_t>(n) - 1] = self;
    return true;
}

void Monitor::complete(ShadowFrame& f) {
    Pending p = std::move(f.pending);
    f.pending = Pending();
    int depth = py::frame_stack_depth(f.frame, f.depths);
    PyObject* tos = depth > 0 ? real_stack(f, 0) : nullptr;
    auto out = [&](int id) {
        if (id >= 0) push(f, id);
    };
    if (p.hook) {  // [Note: hooks of objects made in the call]
        if (!p.inline_bound || p.inline_result < 0)
            return m_cap.fail(breaks::kUnsupportedAttribute,
                              "`" + p.callee.name + "` ran without being traced",
                              "use plain attributes and items");
        if (p.opcode == BINARY_SUBSCR || p.opcode == GET_ITER) out(p.inline_result);
        if (p.opcode == CONTAINS_OP && require_const({p.inline_result}, "an `in` test"))
            out(m_cap.const_value(tos));  // what __contains__ gave, as `in` or `not in` made it
        bool length = p.callee.op == "__len__";
        if (p.opcode == CALL && length && require_const({p.inline_result}, "a length"))
            out(m_cap.const_value(tos));  // len(obj): what __len__ gave, as an int
        if ((p.opcode == CALL && !length) || p.opcode == FORMAT_VALUE)
            out(p.inline_result);  // str(obj), f"{obj}": what __str__ / __repr__ gave
        if (p.opcode == BEFORE_WITH) user_with_enter(f, p);
        return;
    }
    if (p.property_get) {  // [Note: properties] the getter returned what the attribute is
        if (!p.inline_bound || p.inline_result < 0)
            return m_cap.fail(breaks::kUnsupportedAttribute,
                              "property `" + p.callee.name + "` was read without its getter "
                              "running as traced code",
                              "read a plain attribute");
        if (m_cap.v(p.inline_result).real.get() != tos &&
            m_cap.v(p.inline_result).kind != ValueKind::Const)
            return m_cap.internal_error("a property's value changed on its way back");
        if (p.cache_as) set_object_attr(p.in[0], p.cache_as.get(), p.inline_result);
        if (p.opcode == LOAD_METHOD) push(f, m_cap.null_value());
        return out(p.inline_result);
    }
    switch (p.opcode) {
    case JUMP_IF_TRUE_OR_POP: case JUMP_IF_FALSE_OR_POP:
        if (depth == p.depth_after - 1) pop(f);
        return;
    case FOR_ITER: {
        int it = f.stack.back();
        if (m_cap.v(it).zipped_by && m_cap.v(it).zipped_by != f.frame_obj)  // (a generator
            // over `it` zipped with `it` itself: the zip's next() comes first in CPython)
            return m_cap.fail(breaks::kUnsupportedOpcode,
                              "a loop over " + m_cap.v(it).label + ", which a zip() or "
                              "enumerate() also reads", "zip lists, not iterators read elsewhere");
        if (depth == p.depth_after - 1) {  // exhausted
            pop(f);
            iter_done(it);
            return;
        }
        out(next_item(it, tos));
        return;
    }
    case IMPORT_NAME: {
        // `import x.y` / `from x import y` inside the function: the module the import found
        // (it ran for real, so it is in sys.modules); attributes read from it are guarded.
        if (!tos || !PyModule_Check(tos))
            return m_cap.fail(breaks::kUnsupportedOpcode, "an import gives something other than a "
                              "module", "import at module level");
        const char* mod = PyModule_GetName(tos);
        if (!mod) PyErr_Clear();
        int id = m_cap.constant_root(tos, "sys.modules['" + std::string(mod ? mod : "?") + "']", true);
        out(id);
        return;
    }
    case IMPORT_FROM:
        out(p.in[0]);
        out(load_attr(p.in[0], py::code_name(f.code, p.oparg), tos));
        return;
    case LOAD_ATTR: {
        PyObject* name = py::code_name(f.code, p.oparg);
        if (m_cap.v(p.in[0]).kind == ValueKind::FreshObject && str(name) == "__dict__" &&
            py::frame_current_instruction(f.frame).opcode == CONTAINS_OP)
            // `"loc" in obj.__dict__` (torch.distributions' argument checks) of an object made
            // in the call: which attributes it has follows from the path, which the guards fix
            return out(m_cap.const_value(tos));
        out(load_attr(p.in[0], name, tos));
        return;
    }
    case LOAD_METHOD: {
        PyObject* meth = real_stack(f, 1);
        PyObject* name = py::code_name(f.code, p.oparg);
        if (m_cap.v(p.in[0]).kind == ValueKind::Super) {
            // super().name(...): CPython pushes [NULL, bound method], which PRECALL turns into
            // [function, object]; the shadow stack holds that form at once.
            int fn = super_method(p.in[0], name, tos);
            if (fn < 0) return;
            int obj = m_cap.v(p.in[0]).items[1];
            push(f, fn);
            push(f, obj);
            return;
        }
        if (!meth) {
            push(f, m_cap.null_value());
            out(load_attr(p.in[0], name, tos));
            return;
        }
        Value& o = m_cap.v(p.in[0]);
        if (o.kind == ValueKind::FreshObject) {
            int fn = object_attr(p.in[0], name, meth, true);
            if (fn < 0) return;
            push(f, fn);
            push(f, p.in[0]);
            return;
        }
        if (o.kind == ValueKind::Input && !o.tensor && PyFunction_Check(meth)) {
            // A user method: guarded through the class, so replacing it is noticed.
            int fn = class_attr(p.in[0], name, meth);
            if (fn < 0) return;
            push(f, fn);
            push(f, p.in[0]);
            return;
        }
        if (o.kind == ValueKind::Input && !o.identity && !o.tensor &&
            Py_TYPE(meth) != &PyMethodDescr_Type)
            return m_cap.fail(breaks::kUnsupportedAttribute,
                              "method `" + str(name) + "` of " + o.label + " is not a plain method",
                              "call a plain method");
        push(f, m_cap.const_value(meth, callable_name(meth)));
        push(f, p.in[0]);
        return;
    }
    case BINARY_OP:
        out(binary(p.oparg, p.in[0], p.in[1], tos));
        return;
    case COMPARE_OP: {
        Value &a = m_cap.v(p.in[0]), &b = m_cap.v(p.in[1]);
        bool sym = a.sym_number() || b.sym_number();
        bool scalar = (a.dyn_scalar || b.dyn_scalar || sym) && number_operands(p.in[0], p.in[1]);
        if (a.tensor || b.tensor || scalar) {
            int r = operator_step(StepKind::Compare, p.oparg, p.in[0], p.in[1], tos, !scalar);
            if (r < 0) return;
            if (scalar) number_from(r, {p.in[0], p.in[1]});
            out(r);
            return;
        }
        if (int r = numpy_operator(StepKind::Compare, p.oparg, p.in[0], p.in[1], tos); r >= 0)
            return out(r);
        if (int r = shape_compare(p.oparg, p.in[0], p.in[1], tos); r >= 0) return out(r);
        if (m_cap.failed()) return;
        if (!require_const(p.in, "a comparison")) return;
        out(m_cap.const_value(tos));
        return;
    }
    case IS_OP: {
        Value &a = m_cap.v(p.in[0]), &b = m_cap.v(p.in[1]);
        bool known = (a.kind == ValueKind::Const || a.identity) &&
                     (b.kind == ValueKind::Const || b.identity);
        bool vs_none = (a.kind == ValueKind::Const && a.real.get() == Py_None) ||
                       (b.kind == ValueKind::Const && b.real.get() == Py_None);
        // One value is one object at replay too; two values read from the inputs are the
        // same object or not as the guards say (tensors reached by two paths are two values);
        // a mutable object made in the call (a sentinel: `missing = object()`) is none of
        // what existed before it.
        auto made = [&](const Value& v) {
            return v.kind == ValueKind::FreshObject || v.kind == ValueKind::FreshList ||
                   v.kind == ValueKind::FreshDict || v.kind == ValueKind::FreshSet;
        };
        auto before = [&](const Value& v) {
            return v.kind == ValueKind::Input || v.kind == ValueKind::Const || v.identity;
        };
        bool apart = (made(a) && before(b)) || (made(b) && before(a));
        if (apart && a.real.get() == b.real.get())
            return m_cap.internal_error("an object made in the call is one from before it");
        // Two equal strings or numbers read from the inputs (guarded by value) may or may not
        // be one object: that is guarded too. None, True, False are one object always.
        auto singleton = [](const Value& v) {
            PyObject* o = v.real.get();
            if (PyLong_CheckExact(o)) {  // CPython keeps one object per small int
                int overflow = 0;
                long n = PyLong_AsLongAndOverflow(o, &overflow);
                return !overflow && n >= -5 && n <= 256;
            }
            // and one empty tuple, one empty string; torch one object per dtype, layout and
            // memory format (`x.dtype is torch.float16`)
            const TorchApi& api = torch_api();
            return o == Py_None || o == Py_True || o == Py_False || o == Py_Ellipsis ||
                   o == Py_NotImplemented || (PyTuple_CheckExact(o) && PyTuple_GET_SIZE(o) == 0) ||
                   (PyUnicode_CheckExact(o) && PyUnicode_GET_LENGTH(o) == 0) ||
                   Py_TYPE(o) == api.dtype_type || Py_TYPE(o) == api.layout_type ||
                   std::strcmp(Py_TYPE(o)->tp_name, "torch.memory_format") == 0;
        };
        if (known && a.kind == ValueKind::Const && b.kind == ValueKind::Const &&
            !singleton(a) && !singleton(b) && p.in[0] != p.in[1]) {
            // Two values that differ are never one object; two equal ones may or may not be
            // (of different types, or of different bits as 0.0 and -0.0, never one object)
            PyObject *x = a.real.get(), *y = b.real.get();
            int eq = Py_TYPE(x) == Py_TYPE(y) && same_constant(x, y) ? 1 : 0;
            PyErr_Clear();
            if (eq != 0 && !(a.node >= 0 && b.node >= 0 &&
                             m_cap.guard_same_object(p.in[0], p.in[1])))
                return m_cap.fail(breaks::kUnsupportedOpcode,
                                  "an `is` test between two equal values (" +
                                      py::repr_string(x).substr(0, 40) +
                                      "), which may or may not be one object",
                                  "compare them with ==");
        }
        if (!known && !vs_none && !apart && p.in[0] != p.in[1] &&
            !m_cap.guard_same_object(p.in[0], p.in[1]))
            return m_cap.fail(breaks::kUnsupportedOpcode, "an `is` test between two objects",
                              "compare values instead of identities");
        out(m_cap.const_value(tos));
        return;
    }
    case CONTAINS_OP: {
        // `x in c` is a constant when x is known and so is what it is compared with: the
        // keys of a dict (present ones read, absent ones guarded absent) or the items of a
        // sequence.
        int needle = p.in[0], hay = as_mapping(p.in[1], "__contains__");
        if (hay < 0) return;
        if (m_cap.v(hay).real.get() == os_environ()) {  // `name in os.environ`
            if (environ_read(needle, tos, m_cap.const_value(tos)) >= 0) out(m_cap.const_value(tos));
            return;
        }
        if (m_cap.v(needle).sym_number() && m_cap.v(hay).kind == ValueKind::Const &&
            !m_cap.v(needle).tensor) {
            // `T in (100, 200)` with T a size read at replay: computed there, a relation
            // (checked at replay where Python branches on it), not T guarded by value
            static PyObject* contains = PyObject_GetAttrString(PyImport_ImportModule("operator"), "contains");
            static PyObject* not_ = PyObject_GetAttrString(PyImport_ImportModule("operator"), "not_");
            auto call = [&](PyObject* fn, std::vector<int> args, PyObject* real) {
                int r = call_at_replay(fn, args, real, "in");
                if (r >= 0) number_from(r, {needle});
                return r;
            };
            if (!contains || !not_) return m_cap.internal_error("the operator module");
            bool found = (tos == Py_True) != (p.oparg == 1);
            int r = call(contains, {hay, needle}, found ? Py_True : Py_False);
            if (r >= 0 && p.oparg == 1) r = call(not_, {r}, tos);
            if (r >= 0) out(r);
            return;
        }
        if (!known(needle)) {
            require_const({needle}, "an `in` test");
            return;
        }
        Value& c = m_cap.v(hay);
        // (what code an op ran may have changed: `in` would read it as it is now)
        if ((c.kind == ValueKind::Input || c.kind == ValueKind::Const) &&
            m_cap.read_after_change(c.real.get(), c.label))
            return;
        if (c.kind == ValueKind::Input && PyDict_Check(c.real.get()) &&
            (!c.mutated || c.keyed_writes) && m_cap.v(needle).kind == ValueKind::Const) {
            if (stale_instance_dict(hay)) return;
            // the key's presence is guarded, not what it holds (a later d[k] reads that)
            PyObject* key = m_cap.v(needle).real.get();
            int present = written_item(hay, key) >= 0 ? 1 : PyDict_Contains(c.real.get(), key);
            if (present < 0) return m_cap.internal_error("`in` on a dict");
            if (written_item(hay, key) < 0) m_cap.guard_key_in(hay, key, present == 1);
            out(m_cap.const_value(tos));
            return;
        }
        if (c.kind == ValueKind::FreshDict) {
            for (size_t j = 0; j < c.items.size(); j += 2)
                if (!known(c.items[j])) {
                    require_const({c.items[j]}, "an `in` test");
                    return;
                }
            out(m_cap.const_value(tos));
            return;
        }
        if (c.kind == ValueKind::Const || c.kind == ValueKind::FreshSet) {
            out(m_cap.const_value(tos));
            return;
        }
        if (c.kind == ValueKind::Input && set_of_constants_or_classes(c.real.get())) {
            // `type(obj) in _ATOMIC_TYPES` (3.12's dataclasses.asdict): a set passed in, of
            // constants and plain classes (which compare by identity), compared by value
            guard_set_value(hay);
            out(m_cap.const_value(tos));
            return;
        }
        std::vector<int> items;
        if (!items_of(hay, items)) return;
        for (int it : items)
            if (!known(it)) {
                require_const({it}, "an `in` test");
                return;
            }
        out(m_cap.const_value(tos));
        return;
    }
    case BINARY_SUBSCR:
        if (m_cap.v(p.in[0]).real.get() == os_environ()) {  // os.environ[name]
            if (m_cap.v(p.in[1]).real && PyUnicode_Check(m_cap.v(p.in[1]).real.get()))
                out(environ_read(p.in[1], tos, -1));
            else
                m_cap.fail(breaks::kUnsupportedCallee, "os.environ is indexed with " +
                           m_cap.v(p.in[1]).label, "index it with a str");
        } else if (int cont = as_mapping(p.in[0], "__getitem__"); cont >= 0) {
            out(subscript(cont, p.in[1], tos));
        }
        return;
    case UNARY_NEGATIVE: case UNARY_POSITIVE: case UNARY_INVERT: case UNARY_NOT: {
        Value& a = m_cap.v(p.in[0]);
        // -t, ~mask, and -n of a number computed at replay (a dynamic number, a symbolic
        // size, a number read from tensor data)
        bool number = a.sym_number() || (a.dyn_scalar && !a.tensor);
        if ((a.tensor || number) && p.opcode != UNARY_NOT) {
            Step s;
            s.kind = StepKind::Unary;
            s.op = p.opcode == UNARY_NEGATIVE ? 0 : p.opcode == UNARY_POSITIVE ? 1 : 2;
            Arg x;
            if (!m_cap.arg_of(p.in[0], x)) return;
            s.args = {x};
            static const char* kUnary[] = {"-", "+", "~"};
            std::string label = op_label("", kUnary[s.op], a.label);
            int r = m_cap.record(std::move(s), tos, label, !number);
            if (number) number_from(r, {p.in[0]});
            out(r);
            return;
        }
        if (p.opcode == UNARY_NOT ? !truthiness_known(p.in[0]) : !require_const(p.in, "an operator"))
            return;
        out(m_cap.const_value(tos));
        return;
    }
    case GET_ITER:
        out(make_iter(p.in[0], tos));
        return;
    case MAKE_FUNCTION: {
        // the inputs: [defaults] [keyword defaults] [annotations] [closure] code
        int fn = m_cap.new_value(ValueKind::Function, tos,
                                 "function " + py::str_of(reinterpret_cast<PyFunctionObject*>(tos)->func_qualname));
        int none = m_cap.const_value(Py_None);
        size_t k = 0;
        int defaults = (p.oparg & 0x01) ? p.in[k++] : none;
        int kwdefaults = (p.oparg & 0x02) ? p.in[k++] : none;
        m_cap.v(fn).items = {defaults, kwdefaults};
        out(fn);
        return;
    }
    case BUILD_TUPLE: case BUILD_LIST:
        out(m_cap.fresh(p.opcode == BUILD_TUPLE ? ValueKind::FreshTuple : ValueKind::FreshList,
                        p.in, tos));
        return;
    case LIST_TO_TUPLE:
        out(m_cap.fresh(ValueKind::FreshTuple, m_cap.v(p.in[0]).items, tos));
        return;
    case BUILD_SET:  // {a, b} of constants: [Note: sets made in the call]
        if (require_const(p.in, "a set element")) out(fresh_set(tos));
        return;
    case BUILD_MAP:
        for (size_t i = 0; i < p.in.size(); i += 2)
            if (m_cap.v(p.in[i]).kind != ValueKind::Const)
                return m_cap.fail(breaks::kUnsupportedOpcode, "a dict with computed keys",
                                  "use constant keys");
        out(fresh_dict(p.in, tos));
        return;
    case BUILD_CONST_KEY_MAP: {
        PyObject* keys = m_cap.v(p.in.back()).real.get();
        std::vector<int> items;
        for (size_t i = 0; i + 1 < p.in.size(); ++i) {
            items.push_back(m_cap.const_value(PyTuple_GET_ITEM(keys, static_cast<Py_ssize_t>(i))));
            items.push_back(p.in[i]);
        }
        out(fresh_dict(items, tos));
        return;
    }
    case BUILD_SLICE:
        out(slice_value(p.in, tos));
        return;
    case BUILD_STRING: case FORMAT_VALUE: {
        bool data = false;
        for (int v : p.in) {
            if (m_cap.v(v).tensor)
                return m_cap.fail(breaks::kTensorToPython, "a tensor is formatted as text",
                                  "format tensors outside the compiled function");
            data = data || formatted_at_replay(v);
        }
        // f"{loss.item():.3f}", f"got {x.shape}" with a symbolic batch (torch._assert's
        // message in torchvision): formatted at replay, not fixing the sizes
        if (data) {
            int r = format_step(p.opcode, p.oparg, p.in, tos);
            if (r >= 0) m_cap.v(r).dyn_scalar = true;
            out(r);
            return;
        }
        if (!require_const(p.in, "string formatting")) return;
        out(m_cap.const_value(tos));
        return;
    }
    case PUSH_EXC_INFO:
        out(m_cap.const_value(real_stack(f, 1)));
        out(p.in[0]);
        return;
    case MATCH_SEQUENCE: case MATCH_MAPPING:  // from the subject's type: guarded or fixed
        out(p.in[0]);
        out(m_cap.const_value(tos));
        return;
    case GET_LEN:
        out(p.in[0]);
        out(length_value(p.in[0], tos));
        return;
    case MATCH_CLASS:
        return match_class(f, p, tos);
    case MATCH_KEYS: {
        // `case {"scale": s}`: each key read from the dict (guarded there), or guarded absent
        int subject = p.in[0], keys = p.in[1];
        PyObject* ks = m_cap.v(keys).real.get();
        const Value& d = m_cap.v(subject);
        bool dict = d.kind == ValueKind::FreshDict ||
                    (d.kind == ValueKind::Input && PyDict_CheckExact(d.real.get()) && !d.mutated);
        if (!dict || m_cap.v(keys).kind != ValueKind::Const || !ks || !PyTuple_Check(ks))
            return m_cap.fail(breaks::kUnsupportedOpcode,
                              "a mapping pattern over " + d.label,
                              "match a dict made in the call or passed in, with constant keys");
        out(subject);
        out(keys);
        std::vector<int> values;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ks); ++i) {
            PyObject* k = PyTuple_GET_ITEM(ks, i);
            PyObject* got = tos != Py_None ? PyTuple_GET_ITEM(tos, i) : nullptr;
            if (!got) {  // a key missing: None, which the guards must fix
                got = PyDict_GetItemWithError(m_cap.v(subject).real.get(), k);
                if (got || PyErr_Occurred()) {
                    PyErr_Clear();
                    if (got) continue;  // present, though a later one is missing
                    return m_cap.internal_error("a mapping pattern's key");
                }
                if (m_cap.v(subject).kind == ValueKind::Input) m_cap.guard_no_key(subject, k);
                return out(m_cap.const_value(Py_None));
            }
            int v = subscript(subject, m_cap.const_value(k), got);
            if (v < 0) return;
            values.push_back(v);
        }
        return out(m_cap.fresh(ValueKind::FreshTuple, values, tos));
    }
    case CHECK_EXC_MATCH:
        if (m_cap.v(p.in[0]).kind != ValueKind::Const || !known(p.in[1]))
            return m_cap.fail(breaks::kException, "an except clause matches against " +
                              m_cap.v(p.in[1]).label, "catch a built-in exception class");
        out(p.in[0]);
        out(m_cap.const_value(tos));
        return;
    case UNPACK_SEQUENCE: {
        int seq = p.in[0];
        Value& s = m_cap.v(seq);
        int n = p.oparg;
        std::vector<int> items;
        if (s.kind == ValueKind::Const || s.tensor || s.kind == ValueKind::OpResult) {
            if (s.tensor) m_cap.fix_length(seq);  // unpacking needs exactly n rows
            for (int i = 0; i < n; ++i) {
                int it = s.kind == ValueKind::Const ? m_cap.const_value(real_stack(f, i))
                                                    : item_of(seq, i, real_stack(f, i));
                if (it < 0) return;
                items.push_back(it);
            }
        } else if (!items_of(seq, items)) {
            return;
        }
        if (static_cast<int>(items.size()) != n) return m_cap.internal_error("unpack size");
        for (int i = n - 1; i >= 0; --i) push(f, items[static_cast<size_t>(i)]);
        return;
    }
    case UNPACK_EX: {
        // a, *rest, z = seq: the starred part is a new list
        std::vector<int> items;
        size_t before = static_cast<size_t>(p.oparg & 0xff), after = static_cast<size_t>(p.oparg >> 8);
        int seq = p.in[0];
        Value& sv = m_cap.v(seq);
        if (sv.kind == ValueKind::Const || sv.tensor || sv.kind == ValueKind::OpResult) {
            // the items as they came out: the first ones, the starred list, the last ones
            std::vector<PyObject*> reals;
            for (size_t i = 0; i < before; ++i) reals.push_back(real_stack(f, static_cast<int>(i)));
            PyObject* star = real_stack(f, static_cast<int>(before));
            if (!star || !PyList_Check(star)) return m_cap.internal_error("UNPACK_EX list");
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(star); ++i) reals.push_back(PyList_GET_ITEM(star, i));
            for (size_t j = 0; j < after; ++j)
                reals.push_back(real_stack(f, static_cast<int>(before + 1 + j)));
            if (sv.tensor) m_cap.fix_length(seq);
            for (size_t i = 0; i < reals.size(); ++i) {
                int it = sv.kind == ValueKind::Const ? m_cap.const_value(reals[i])
                                                     : item_of(seq, static_cast<Py_ssize_t>(i), reals[i]);
                if (it < 0) return;
                items.push_back(it);
            }
        } else if (!items_of(seq, items)) {
            return;
        }
        if (items.size() < before + after) return m_cap.internal_error("unpack size");
        std::vector<int> out(items.begin(), items.begin() + static_cast<long>(before));
        std::vector<int> rest(items.begin() + static_cast<long>(before),
                              items.end() - static_cast<long>(after));
        out.push_back(m_cap.fresh(ValueKind::FreshList, rest, real_stack(f, static_cast<int>(before))));
        out.insert(out.end(), items.end() - static_cast<long>(after), items.end());
        for (size_t i = out.size(); i-- > 0;) push(f, out[i]);
        return;
    }
    case CALL: case CALL_FUNCTION_EX:
        complete_call(f, p, tos);
        return;
    case BEFORE_WITH:
        return with_enter(f, p.in[0], real_stack(f, 1), tos);
    default:
        return m_cap.internal_error(std::string("no completion for ") + opname(p.opcode));
    }
}

// [SECTION] calls ------------------------------------------------------------------------------

// The code of the function @contextlib.contextmanager makes (shared by every function it
// decorates), found once. Borrowed; kept for the process.
static PyObject* contextmanager_helper_code() {
    static PyObject* code = [] {
        PyObject* contextlib = PyImport_ImportModule("contextlib");
        PyObject* decorate = contextlib ? PyObject_GetAttrString(contextlib, "contextmanager") : nullptr;
        PyObject* sample = decorate ? PyObject_CallOneArg(decorate, decorate) : nullptr;
        PyObject* c = sample && PyFunction_Check(sample) ? PyFunction_GET_CODE(sample) : nullptr;
        Py_XINCREF(c);
        Py_XDECREF(sample);
        Py_XDECREF(decorate);
        Py_XDECREF(contextlib);
        PyErr_Clear();
        return c;
    }();
    return code;
}

// [Note: generator context managers] `with timer(log) as t:` over a @contextlib.contextmanager
// function of the user's. Calling it makes a _GeneratorContextManager around a generator of the
// function the decorator wrapped (`__wrapped__`, guarded by identity): that generator is
// recorded as one made in the call ([Note: generators]), and the object is a GenContext value.
// BEFORE_WITH runs its __enter__ (contextlib's code, untraced), which resumes the generator: its
// frame is traced up to the yield, whose value is what `as` binds. At the block's end
// __exit__(None, None, None) resumes it again, traced to its end (contextlib catches the
// StopIteration, untraced). What the generator did before and after its yield (appends, torch
// context blocks, ops) is thus recorded in program order around the block; nothing of contextlib
// runs at replay. The object itself cannot escape, an exception leaving the block is followed
// as any other (the call runs eagerly), and a graph break inside the block runs the call
// eagerly (a with block).
void Monitor::dispatch_gen_context(Pending& p, int callable, std::vector<int> args,
                                   PyObject* kwnames) {
    const Value& c = m_cap.v(callable);
    py::Ref wrapped = py::Ref::steal(PyObject_GetAttrString(c.real.get(), "__wrapped__"));
    if (!wrapped) PyErr_Clear();
    if (!wrapped || !PyFunction_Check(wrapped.get()) || c.kind != ValueKind::Input)
        return m_cap.fail(breaks::kUnsupportedCallee,
                          "the @contextmanager function " + c.label + " cannot be followed",
                          "define it at module level");
    int func = m_cap.input_child(callable, AccessKind::Attr, 0, interned("__wrapped__"),
                                 ".__wrapped__", wrapped.get());
    if (func < 0) return;
    p.callee = classify_callee(wrapped.get());
    if (p.callee.kind != CallKind::Generator)
        return m_cap.fail(breaks::kUnsupportedCallee,
                          "the @contextmanager function " + c.label + " is not a plain generator",
                          "write it as a generator function");
    p.callee.kind = CallKind::GenContext;
    p.callee_value = func;
    p.kwnames = kwnames;
    p.in = std::move(args);
}

// [Note: partials] A functools.partial is called as what it stands for:
// func(*p.args, *args, **{**p.keywords, **kwargs}). One passed in (`self.act = partial(F.gelu,
// approximate="tanh")`) has its func, the items of its args and its keywords guarded like any
// attribute read. One made in the call is a ValueKind::Partial whose items are its parts (func,
// args, keyword values; the keyword names are those of the real object's keywords, in order);
// a partial of a partial is flattened, as functools does. If it escapes it is made again at
// replay from its parts (build_arg).
bool Monitor::partial_parts(int partial, PartialParts& out) {
    const Value& pv = m_cap.v(partial);
    PyObject* p = pv.real.get();
    py::Ref pargs = py::Ref::steal(PyObject_GetAttrString(p, "args"));
    py::Ref pkw = py::Ref::steal(PyObject_GetAttrString(p, "keywords"));
    if (!pargs || !pkw || !PyTuple_CheckExact(pargs.get()) || !PyDict_CheckExact(pkw.get())) {
        PyErr_Clear();
        m_cap.fail(breaks::kUnsupportedCallee, pv.label + " is not a plain partial",
                   "call the function itself");
        return false;
    }
    out = PartialParts{};
    PyObject *key, *value;
    Py_ssize_t it = 0;
    if (pv.kind == ValueKind::Partial) {
        const std::vector<int>& items = pv.items;
        size_t npos = static_cast<size_t>(PyTuple_GET_SIZE(pargs.get()));
        if (items.size() != 1 + npos + static_cast<size_t>(PyDict_GET_SIZE(pkw.get()))) {
            m_cap.internal_error("the parts of a partial");
            return false;
        }
        out.func = items[0];
        out.args.assign(items.begin() + 1, items.begin() + 1 + static_cast<long>(npos));
        out.values.assign(items.begin() + 1 + static_cast<long>(npos), items.end());
        while (PyDict_Next(pkw.get(), &it, &key, &value)) out.names.push_back(key);
        return true;
    }
    py::Ref pfunc = py::Ref::steal(PyObject_GetAttrString(p, "func"));
    if (!pfunc) {
        PyErr_Clear();
        return m_cap.internal_error("a partial without func"), false;
    }
    out.func = m_cap.input_child(partial, AccessKind::Attr, 0, interned("func"), ".func",
                                 pfunc.get());
    int av = m_cap.input_child(partial, AccessKind::Attr, 0, interned("args"), ".args",
                               pargs.get());
    int kv = m_cap.input_child(partial, AccessKind::Attr, 0, interned("keywords"), ".keywords",
                               pkw.get());
    if (out.func < 0 || av < 0 || kv < 0) return false;
    m_cap.guard_len(av, PyTuple_GET_SIZE(pargs.get()));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(pargs.get()); ++i) {
        int item = item_of(av, i, PyTuple_GET_ITEM(pargs.get(), i));
        if (item < 0) return false;
        out.args.push_back(item);
    }
    m_cap.guard_len(kv, PyDict_Size(pkw.get()));
    while (PyDict_Next(pkw.get(), &it, &key, &value)) {
        int kval = dict_item(kv, key, value);
        if (kval < 0) return false;
        out.names.push_back(key);
        out.values.push_back(kval);
    }
    return true;
}

// `parts` applied to a call's arguments (its keyword values last, named by `kwnames`): the
// partial's positionals, then the call's; the partial's keywords in their order, a call's
// keyword of the same name replacing its value, new ones after.
void Monitor::apply_partial(PartialParts parts, std::vector<int>& args, PyObject*& kwnames) {
    size_t nkw = kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(kwnames)) : 0;
    std::vector<int> merged = std::move(parts.args);
    merged.insert(merged.end(), args.begin(), args.end() - static_cast<long>(nkw));
    for (size_t k = 0; k < nkw; ++k) {
        PyObject* name = PyTuple_GET_ITEM(kwnames, static_cast<Py_ssize_t>(k));
        int val = args[args.size() - nkw + k];
        size_t j = 0;
        while (j < parts.names.size() && PyUnicode_Compare(parts.names[j], name) != 0) ++j;
        if (j < parts.names.size()) {
            parts.values[j] = val;
        } else {
            parts.names.push_back(name);
            parts.values.push_back(val);
        }
    }
    merged.insert(merged.end(), parts.values.begin(), parts.values.end());
    kwnames = nullptr;
    if (!parts.names.empty()) {
        py::Ref t = py::Ref::steal(PyTuple_New(static_cast<Py_ssize_t>(parts.names.size())));
        for (size_t k = 0; k < parts.names.size(); ++k)
            PyTuple_SET_ITEM(t.get(), static_cast<Py_ssize_t>(k), Py_NewRef(parts.names[k]));
        kwnames = t.get();
        m_owned.push_back(std::move(t));
    }
    args = std::move(merged);
}

// functools.partial(func, *args, **kwargs) has run and made `result`: its value.
int Monitor::make_partial(const Pending& p, PyObject* result) {
    size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
    if (p.in.size() <= nkw) return m_cap.internal_error("partial() without a function"), -1;
    PartialParts parts;
    parts.func = p.in[0];
    std::vector<int> args(p.in.begin() + 1, p.in.end());
    PyObject* kwnames = p.kwnames;
    const Value& fv = m_cap.v(parts.func);
    if (fv.kind == ValueKind::Partial ||
        (fv.kind == ValueKind::Input && Py_TYPE(fv.real.get()) == functools_partial_type())) {
        if (!partial_parts(parts.func, parts)) return -1;  // flattened, as functools does
    }
    const int func = parts.func;
    apply_partial(std::move(parts), args, kwnames);
    // what functools made must be what the parts say
    py::Ref rfunc = py::Ref::steal(PyObject_GetAttrString(result, "func"));
    py::Ref rargs = py::Ref::steal(PyObject_GetAttrString(result, "args"));
    py::Ref rkw = py::Ref::steal(PyObject_GetAttrString(result, "keywords"));
    size_t rn = kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(kwnames)) : 0;
    if (!rfunc || !rargs || !rkw || !PyTuple_CheckExact(rargs.get()) || !PyDict_CheckExact(rkw.get()) ||
        static_cast<size_t>(PyTuple_GET_SIZE(rargs.get())) + rn != args.size() ||
        static_cast<size_t>(PyDict_GET_SIZE(rkw.get())) != rn ||
        rfunc.get() != m_cap.v(func).real.get()) {
        PyErr_Clear();
        return m_cap.internal_error("a partial made unlike its arguments"), -1;
    }
    int v = m_cap.new_value(ValueKind::Partial, result, "partial(" + m_cap.v(p.in[0]).label + ")");
    std::vector<int> items{func};
    items.insert(items.end(), args.begin(), args.end());
    m_cap.v(v).items = std::move(items);
    return v;
}

// obj.name = val (STORE_ATTR, or setattr() with a constant name).
void Monitor::store_attr(int obj, PyObject* name, int val) {
    Value& o = m_cap.v(obj);
    if (o.kind == ValueKind::FreshObject) {
        set_object_attr(obj, name, val);
        return;
    }
    if (!o.tensor && o.real && runs_code_to_access(o.real.get(), name, true))
        return m_cap.fail(breaks::kUnsupportedAttribute,
                          "setting `" + o.label + "." + str(name) + "` runs a property "
                          "setter or a custom __setattr__",
                          "set the underlying attribute");
    // `p.data = t` on a tensor passed in (EMA updates) swaps its storage, `p.grad = None`
    // drops its gradient: writes
    bool data_swap = o.tensor && (str(name) == "data" || str(name) == "grad");
    if (o.tensor && str(name) == "data") m_cap.reshaped_in_place(obj);
    if (o.tensor && str(name) == "grad") {
        m_grads_changed = true;
        m_reached_leaves.erase(o.real.get());
    }
    if (o.kind != ValueKind::Input || (o.tensor && !data_swap))
        return m_cap.fail(breaks::kUnsupportedAttribute,
                          "attribute `" + str(name) + "` is set on " + o.label,
                          "set attributes only on objects passed in (modules, self)");
    Step s;
    s.kind = StepKind::SetAttr;
    s.name = py::Ref::borrow(name);
    m_cap.record_effect(std::move(s), {obj, val});
    // (a gradient is what backward() leaves there next, not what was written: read it then)
    if (!(o.tensor && str(name) == "grad")) m_cap.overlay()[{obj, str(name)}] = val;
}

// Whether module `callable` would run hooks when called: 1 yes, 0 no (guarded so: its own hook
// dicts and torch's global ones are empty), -1 the capture failed.
int Monitor::module_hooks(int callable) {
    Value& c = m_cap.v(callable);
    bool any = false;
    std::vector<int> empty;
    if (c.kind == ValueKind::Input) {
        if (module_has_no_hooks(c.real.get())) m_cap.guard_no_hooks(callable);
        else any = true;
    }
    for (const auto& [hook_name, hooks] : torch_api().global_hooks) {
        int hv = m_cap.constant_root(hooks.get(), hook_name);
        if (PyDict_Size(hooks.get()) != 0) any = true;
        else empty.push_back(hv);
    }
    if (any) return 1;  // the traced __call__ reads (and so guards) the dicts itself
    for (int hv : empty) m_cap.guard_len(hv, 0);
    return 0;
}

// copy.deepcopy itself (the function of the copy module, not a wrapper of the user's).
static bool is_copy_deepcopy(PyObject* fn) {
    if (!PyFunction_Check(fn)) return false;
    PyObject* mod = PyFunction_GET_MODULE(fn);
    auto* code = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fn));
    return mod && PyUnicode_Check(mod) && PyUnicode_CompareWithASCIIString(mod, "copy") == 0 &&
           PyUnicode_CompareWithASCIIString(code->co_name, "deepcopy") == 0;
}

// Plain data: None, numbers, strings and bytes, and lists, tuples, dicts and sets of them (what
// a config holds). copy.deepcopy of it is fresh containers around the same immutable items.
static bool plain_data(PyObject* o, int depth) {
    if (o == Py_None || PyBool_Check(o) || PyLong_CheckExact(o) || PyFloat_CheckExact(o) ||
        PyComplex_CheckExact(o) || PyUnicode_CheckExact(o) || PyBytes_CheckExact(o))
        return true;
    if (depth > 8) return false;
    if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
        if (PySequence_Fast_GET_SIZE(o) > 4096) return false;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(o); ++i)
            if (!plain_data(PySequence_Fast_GET_ITEM(o, i), depth + 1)) return false;
        return true;
    }
    if (PyDict_CheckExact(o)) {
        if (PyDict_GET_SIZE(o) > 4096) return false;
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &pos, &k, &v))
            if (!plain_data(k, depth + 1) || !plain_data(v, depth + 1)) return false;
        return true;
    }
    if (PyAnySet_CheckExact(o)) {
        py::Ref items = py::Ref::steal(PySequence_Tuple(o));
        if (!items) {
            PyErr_Clear();
            return false;
        }
        return plain_data(items.get(), depth + 1);
    }
    return false;
}

void Monitor::dispatch_call(ShadowFrame& f, int callable, std::vector<int> args,
                            PyObject* kwnames) {
    Pending& p = f.pending;
    Value& c = m_cap.v(callable);
    PyObject* fn = c.real.get();
    if (!fn) return m_cap.internal_error("call of an unknown object");
    if (PyMethod_Check(fn) && PyFunction_Check(PyMethod_GET_FUNCTION(fn)) &&
        c.kind == ValueKind::Input) {
        // self.method(*args, **kw): the function, with self first (both guarded)
        int func, self;
        if (!split_method(callable, func, self)) return;
        args.insert(args.begin(), self);
        return dispatch_call(f, func, std::move(args), kwnames);
    }
    if (c.kind == ValueKind::BoundMethod) {  // log.append(x): list.append(log, x)
        if (c.ctx_exit) m_cap.exit_context();  // a user's __exit__ runs in the enclosing block
        int func = c.items[0];
        args.insert(args.begin(), c.items[1]);
        return dispatch_call(f, func, std::move(args), kwnames);
    }
    if ((c.kind == ValueKind::Input && Py_TYPE(fn) == functools_partial_type()) ||
        c.kind == ValueKind::Partial) {
        PartialParts parts;
        if (!partial_parts(callable, parts)) return;
        int func = parts.func;
        apply_partial(std::move(parts), args, kwnames);
        return dispatch_call(f, func, std::move(args), kwnames);
    }
    if ((c.kind == ValueKind::Input && !PyType_Check(fn) && is_plain_user_class(Py_TYPE(fn))) ||
        c.kind == ValueKind::FreshObject) {
        // obj(*args) on an instance of a user class (torchvision's LevelMapper), passed in or
        // made in the call: its class's __call__, traced with obj first; the class and the
        // lookup are guarded.
        PyObject* call = _PyType_Lookup(Py_TYPE(fn), interned("__call__"));
        if (call && PyFunction_Check(call)) {
            int func = c.kind == ValueKind::Input ? class_attr(callable, interned("__call__"), call)
                                                  : class_member(callable, interned("__call__"), call);
            if (func < 0) return;
            args.insert(args.begin(), callable);
            return dispatch_call(f, func, std::move(args), kwnames);
        }
    }
    if (PyFunction_Check(fn) && PyFunction_GET_CODE(fn) == contextmanager_helper_code())
        return dispatch_gen_context(p, callable, std::move(args), kwnames);
    if (c.kind == ValueKind::GenContext && PyMethod_Check(fn)) {  // the with block ends
        auto open = std::find(f.handler_contexts.begin(), f.handler_contexts.end(), callable);
        if (open != f.handler_contexts.end()) {
            // the generator's code after its yield is not inside the block's try
            f.handler_contexts.erase(open);
            set_in_try(f, m_at_offset);
        }
        p.callee = CalleeInfo{};
        p.callee.kind = CallKind::GenContextExit;
        p.callee.name = c.label;
        p.callee_value = callable;
        p.kwnames = kwnames;
        p.in = std::move(args);
        return;
    }
    if (getattribute_slot(p, callable, args, kwnames)) return;
    if (!args.empty() && (m_cap.v(args[0]).kind == ValueKind::FreshObject || input_dict(args[0])) &&
        (Py_TYPE(fn) == &PyMethodDescr_Type || Py_TYPE(fn) == &PyWrapperDescr_Type)) {
        // [Note: objects made in the call] a C method of the object's base class, called on it
        // (or on a dict subclass passed in: `dict.__getitem__(self, k)` in its __getitem__)
        const Value& o = m_cap.v(args[0]);
        PyTypeObject* owner = PyDescr_TYPE(fn);
        PyTypeObject* base = o.kind == ValueKind::FreshObject ? user_class_base(Py_TYPE(o.real.get()))
                                                              : layout_base(Py_TYPE(o.real.get()));
        std::string method = str(PyDescr_NAME(fn));
        bool slot = Py_TYPE(fn) == &PyWrapperDescr_Type ||  // dict's __getitem__ and
                    (method.size() > 4 && method.rfind("__", 0) == 0);  // __contains__ are methods
        if (base && PyType_IsSubtype(base, owner) && slot) {
            p.callee = CalleeInfo{};
            p.callee.kind = CallKind::ObjectSlot;
            p.callee.op = method;
            p.callee.name = std::string(owner->tp_name) + "." + method;
            p.callee_value = callable;
            p.kwnames = kwnames;
            if (method == "__setitem__" && input_dict(args[0]) && args.size() == 3) {
                // whether the key is new (it goes last): read before the call runs
                p.had_key = PyDict_Contains(m_cap.v(args[0]).real.get(), m_cap.v(args[1]).real.get());
                if (p.had_key < 0) PyErr_Clear();
            }
            p.in = std::move(args);
            return;
        }
        if (base && PyType_IsSubtype(base, owner) && o.kind == ValueKind::FreshObject &&
            o.mapping >= 0) {
            if (method == "copy" || method == "fromkeys")  // they make an object of the class
                return m_cap.fail(breaks::kUnsupportedCallee,
                                  "`" + method + "()` of " + o.label + ", a dict made in the call",
                                  "use dict(obj.items()) for a plain copy");
            // OrderedDict's update, setdefault, pop... reach the class's own item slots from C
            // (found by a probe: update() skipped a ModelOutput's __setitem__ at replay); only
            // the reading methods act on the items alone
            bool reads = method == "keys" || method == "values" || method == "items" ||
                         method == "get" || method == "__len__" || method == "__contains__";
            PyTypeObject* type = Py_TYPE(o.real.get());
            bool hooked = false;
            for (const char* slot : {"__setitem__", "__getitem__", "__delitem__"})
                hooked = hooked || _PyType_Lookup(type, interned(slot)) !=
                                       _PyType_Lookup(base, interned(slot));
            if (hooked && !reads)
                return m_cap.fail(breaks::kUnsupportedCallee,
                                  "`" + method + "()` of " + o.label + " runs its class's own "
                                  "item methods from C",
                                  "set the items one by one with obj[key] = value");
            args[0] = o.mapping;  // obj.keys(), dict.get(obj, k): on its items
        }
    }
    p.callee = classify_callee(fn);
    if (p.callee.kind == CallKind::InlineFunction && args.size() == 1 && !kwnames &&
        is_copy_deepcopy(fn) && plain_data(m_cap.v(args[0]).real.get(), 0)) {
        p.callee.kind = CallKind::DeepCopy;  // (its memo keys by id(): not traced)
        p.callee.name = "copy.deepcopy";
    }
    if (c.ctx_exit) {  // the end of a captured with block
        p.callee.kind = CallKind::ContextExit;
        p.callee.name = c.label;
    }
    // [Note: code that ran inside a call]
    // (`t.register_hook(f)` only keeps f, for backward() to call)
    // (a custom autograd.Function's forward is not looked into: [Note: autograd functions])
    p.hidden_code = runs_hidden_code(p.callee) || p.callee.kind == CallKind::AutogradApply ||
                    p.callee.python_kernel ||
                    (p.callee.kind == CallKind::TorchOp && !starts_with(p.callee.op, "register_") &&
                     runs_callable_argument(args, c.real.get()));
    if (p.hidden_code) watch_call(true);
    p.callee_value = callable;
    p.kwnames = kwnames;
    p.in = std::move(args);
    if (p.callee.kind == CallKind::InlineFunction && p.callee.name == "Mapping.get" &&
        !p.in.empty() && m_cap.v(p.in[0]).real.get() == os_environ()) {
        p.callee.kind = CallKind::EnvRead;  // os.environ.get(name[, default])
        p.callee.name = "os.environ.get";
        p.in.erase(p.in.begin());
    }
    if (p.callee.kind == CallKind::Len && p.in.size() == 1 && !kwnames &&
        expect_hook(p, "__len__"))  // len(obj) of a class with its own __len__
        return;
    bool text = (p.callee.kind == CallKind::TypeCtor && p.callee.name == "str") ||
                (p.callee.kind == CallKind::PureBuiltin && p.callee.name == "repr");
    if (text && p.in.size() == 1 && !kwnames && expect_text_hook(p, p.callee.name == "repr"))
        return;  // str(obj), repr(obj) of a class with its own hooks
    if (p.callee.kind == CallKind::InlineModule) p.expect_self = fn;
    if (p.callee.kind == CallKind::InlineModule || p.callee.kind == CallKind::LeafModule) {
        // [Note: module hooks] Hooks run code the module's forward does not show (a forward
        // hook storing features, weight_norm's pre-hook). Without any, the guards say so;
        // with some, the module's __call__ (Module._call_impl) is traced, hooks and all. So is
        // a __call__ the module's class defines itself (a call counter, a wrapper that changes
        // the module before `super().__call__(x)`); that Module's own __call__ is the one that
        // runs is guarded through the class of a user module, as its forward is.
        static PyObject* module_call =
            _PyType_Lookup(torch_api().module_type, interned("__call__"));  // kept by torch
        PyObject* call = _PyType_Lookup(Py_TYPE(fn), interned("__call__"));
        bool own_call = call != module_call;
        if (!own_call && c.kind == ValueKind::Input && p.callee.kind == CallKind::InlineModule) {
            int cls = m_cap.input_child(callable, AccessKind::TypeOf, 0, nullptr, ".__class__",
                                        reinterpret_cast<PyObject*>(Py_TYPE(fn)));
            if (cls < 0 || m_cap.input_child(cls, AccessKind::TypeLookup, 0, interned("__call__"),
                                             ".__call__", call) < 0)
                return;
        }
        int hooks = own_call ? 1 : module_hooks(callable);
        if (hooks < 0) return;
        if (hooks > 0) {
            if (c.kind != ValueKind::Input || !call || !PyFunction_Check(call))
                return m_cap.fail(breaks::kUnsupportedCallee,
                                  c.label + (own_call ? " has a __call__ of its own"
                                                      : " has hooks registered"),
                                  "remove the hooks or compile the module without them");
            int func = class_attr(callable, interned("__call__"), call);
            if (func < 0) return;
            std::vector<int> with_self = std::move(p.in);
            with_self.insert(with_self.begin(), callable);
            return dispatch_call(f, func, std::move(with_self), kwnames);
        }
    }
    if (p.callee.kind == CallKind::InlineModule && c.kind == ValueKind::Input) {
        // A forward set on the instance (`m.forward = MethodType(f, m)`, accelerate's hooks:
        // `m.forward = partial(new_forward, m)`) is what Module.__call__ calls: the call is
        // that attribute's call, read through the module (guarded there).
        PyObject** dict = _PyObject_GetDictPtr(fn);
        PyObject* own = dict && *dict ? PyDict_GetItemWithError(*dict, interned("forward")) : nullptr;
        if (PyErr_Occurred()) return m_cap.internal_error("a module's __dict__");
        if (own) {
            int fwd = m_cap.input_child(callable, AccessKind::ModuleAttr, 0, interned("forward"),
                                        ".forward", own);
            if (fwd < 0) return;
            return dispatch_call(f, fwd, std::move(p.in), kwnames);
        }
    }
    if (p.callee.kind == CallKind::InlineModule) {
        if (c.kind == ValueKind::Input) {
            // The forward that runs is the class's: guard it, and that no instance attribute
            // replaces it.
            PyObject* fwd = _PyType_Lookup(Py_TYPE(fn), interned("forward"));
            if (!fwd || !PyFunction_Check(fwd))
                return m_cap.fail(breaks::kUnsupportedCallee, c.label + ".forward is not a function",
                                  "define forward as a plain method");
            p.forward_value = class_attr(callable, interned("forward"), fwd);
            if (p.forward_value < 0) return;
        }
        p.in.insert(p.in.begin(), callable);  // self is the forward's first argument
    }
    if (p.callee.kind == CallKind::UserClass && p.callee.code) {
        // The __init__ that runs is the class's: guarded through the class when it has a path.
        PyObject* init = _PyType_Lookup(reinterpret_cast<PyTypeObject*>(fn), interned("__init__"));
        p.forward_value = c.kind == ValueKind::Input
                              ? m_cap.input_child(callable, AccessKind::TypeLookup, 0,
                                                  interned("__init__"), ".__init__", init)
                              : m_cap.const_value(init);
        if (p.forward_value < 0) return;
    }
    if (p.callee.kind == CallKind::ListMethod && !p.in.empty()) {
        // The call has not run yet: a list passed in that it may reorder or shrink is read
        // now, as the caller passed it (appends are followed after the fact, see mutate_list).
        const Value& l = m_cap.v(p.in[0]);
        const std::string& op = p.callee.op;
        if (l.kind == ValueKind::Input && PyList_CheckExact(l.real.get()) && !l.shadow &&
            op != "append" && op != "extend" && op != "clear" && !m_cap.shadow(p.in[0]))
            return;
    }
    switch (p.callee.kind) {
    case CallKind::Print: {
        // [Note: print] Replayed as a step: at replay it prints what eager prints, in order
        // with the other effects, when every argument prints the same from its replayed value.
        size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
        for (size_t k = 0; k < nkw; ++k) {
            std::string kw = str(PyTuple_GET_ITEM(p.kwnames, static_cast<Py_ssize_t>(k)));
            if (kw != "sep" && kw != "end" && kw != "flush")
                return m_cap.fail(breaks::kIO, "`print(" + kw + "=...)` writes to a file",
                                  "print to the console, or write files outside the compiled "
                                  "function");
        }
        require_prints_the_same(p.in, "print");
        return;
    }
    case CallKind::Warn:
    case CallKind::Log:
        return prepare_caller_effect(f, p);
    case CallKind::Super:
        return dispatch_super(f, p);
    case CallKind::PureBuiltin:
        if (p.callee.name == "sorted" || p.callee.name == "min" || p.callee.name == "max")
            prepare_key(p);
        if (p.callee.name == "reduce") prepare_fold(p);
        return;
    case CallKind::ListMethod:
        if (p.callee.op == "sort") prepare_key(p);
        return;
    case CallKind::DictMethod:
        // d.setdefault(k, v) inserts only when k is missing; the value it returns cannot tell
        // (d[k] may already be v itself), so look before the call. So does d.pop(k, default).
        if ((p.callee.name == "setdefault" || p.callee.name == "pop") && p.in.size() >= 2 &&
            PyDict_Check(m_cap.v(p.in[0]).real.get())) {
            p.had_key = PyDict_Contains(m_cap.v(p.in[0]).real.get(), m_cap.v(p.in[1]).real.get());
            if (p.had_key < 0) PyErr_Clear();  // unhashable: the call raises
        }
        // d.update(...) on a dict passed in: which keys it adds (they go last in its order)
        if (p.callee.name == "update" && !p.in.empty() &&
            m_cap.v(p.in[0]).kind == ValueKind::Input && PyDict_Check(m_cap.v(p.in[0]).real.get()))
            p.dict_before = py::Ref::steal(PyDict_Copy(m_cap.v(p.in[0]).real.get()));
        return;
    case CallKind::IO:
        return m_cap.fail(breaks::kIO, "`" + p.callee.name + "()` does input or output",
                          "it runs in Python between two graphs; move printing and I/O out "
                          "of the compiled function to get one graph");
    case CallKind::Getter:
        getter_parts(p, nullptr);  // refuses what it would not follow, before it runs
        return;
    case CallKind::Unsupported:
        return m_cap.fail(breaks::kUnsupportedCallee,
                          "`" + p.callee.name + "` has no capture rule",
                          "call torch functions, tensor methods, nn modules or your own Python "
                          "functions here");
    default:
        return;
    }
}

// len(seq) (or GET_LEN of a match statement), whose value `result` is: a constant fixed by the
// guards (a length guarded, or followed items), or a size of a tensor with symbolic dims.
int Monitor::length_value(int seq, PyObject* result) {
    int a = as_mapping(seq, "__len__");
    if (a < 0) return -1;
    Value& v = m_cap.v(a);
    if (v.tensor && (v.dyn_shape || m_cap.sym_tensor(a))) return m_cap.size_of(a, 0, result);
    auto refuse = [&]() {
        m_cap.fail(breaks::kUnsupportedCallee, "len() of " + v.label,
                   "take len() of lists, tuples, dicts or tensors");
        return -1;
    };
    if (v.kind == ValueKind::Input && !v.tensor) {
        PyObject* o = v.real.get();
        if (v.identity && plain_module_container(o, "__len__", true)) {
            int mv = modules_dict(a);
            if (mv < 0) return -1;
            m_cap.guard_len(mv, PyLong_AsSsize_t(result));
        } else if (v.identity && plain_parameter_container(o, "__len__")) {
            if (parameter_list_size(a) < 0) return -1;  // its _size, guarded
        } else if (v.shadow || (v.mutated && PyList_CheckExact(o))) {
            // length known from the tracked items (the original length is guarded)
            if (!m_cap.shadow(a)) return -1;
        } else if (PyList_Check(o) || PyTuple_Check(o) || PyDict_Check(o)) {
            if (v.mutated) {
                m_cap.fail(breaks::kMutatedThenRead,
                           "len(" + v.label + ") after this function changed it",
                           "take the length before changing the container");
                return -1;
            }
            m_cap.guard_len(a, PyLong_AsSsize_t(result));
        } else {
            return refuse();
        }
    } else if (!(v.tensor || v.kind == ValueKind::Const || v.kind == ValueKind::FreshList ||
                 v.kind == ValueKind::FreshTuple || v.kind == ValueKind::FreshDict ||
                 v.kind == ValueKind::FreshSet)) {
        return refuse();
    }
    return m_cap.const_value(result);
}

// The value of `copy`, what copy.deepcopy made of `src` (plain data): the same value where it
// gave the same object (immutable items), else a fresh container of the copies of the items,
// each object made once (`made`: a list that occurs twice is copied once, as the memo does).
int Monitor::deep_copied(int src, PyObject* copy, std::unordered_map<PyObject*, int>& made) {
    if (copy == m_cap.v(src).real.get()) {
        if (!require_const({src}, "what `copy.deepcopy` copies")) return -1;
        return src;
    }
    auto hit = made.find(copy);
    if (hit != made.end()) return hit->second;
    auto refuse = [&]() {
        m_cap.fail(breaks::kUnsupportedCallee,
                   "`copy.deepcopy` of " + m_cap.v(src).label + " gave another shape of data",
                   "copy plain lists, tuples and dicts");
        return -1;
    };
    int out = -1;
    if (PyDict_CheckExact(copy)) {
        std::vector<int> pairs, copied;
        if (!pairs_of(src, pairs)) return -1;
        if (pairs.size() / 2 != static_cast<size_t>(PyDict_GET_SIZE(copy))) return refuse();
        for (size_t j = 0; j + 1 < pairs.size(); j += 2) {
            PyObject* v = PyDict_GetItemWithError(copy, m_cap.v(pairs[j]).real.get());
            if (!v) {
                PyErr_Clear();
                return refuse();
            }
            int c = deep_copied(pairs[j + 1], v, made);
            if (c < 0) return -1;
            copied.push_back(pairs[j]);
            copied.push_back(c);
        }
        out = fresh_dict(copied, copy);
    } else if (PyList_CheckExact(copy) || PyTuple_CheckExact(copy)) {
        std::vector<int> items, copied;
        if (!items_of(src, items)) return -1;
        if (items.size() != static_cast<size_t>(PySequence_Fast_GET_SIZE(copy))) return refuse();
        for (size_t i = 0; i < items.size(); ++i) {
            int c = deep_copied(items[i], PySequence_Fast_GET_ITEM(copy, static_cast<Py_ssize_t>(i)), made);
            if (c < 0) return -1;
            copied.push_back(c);
        }
        out = m_cap.fresh(PyList_CheckExact(copy) ? ValueKind::FreshList : ValueKind::FreshTuple,
                          copied, copy);
    } else if (PySet_CheckExact(copy)) {
        if (!require_const({src}, "what `copy.deepcopy` copies")) return -1;
        out = fresh_set(copy);
    } else {
        return refuse();
    }
    if (out >= 0) made[copy] = out;
    return out;
}

// `case Cls(a, b=p)` (MATCH_CLASS): whether the subject is an instance follows from its type
// (guarded or fixed) and the class (a constant or pinned); the attributes it extracts (named by
// Cls.__match_args__ for positional ones, or the subject itself for int(x), str(s) & co) are
// read like obj.name. `tos` is the tuple of them CPython made, or None.
void Monitor::match_class(ShadowFrame& f, const Pending& p, PyObject* tos) {
    int subject = p.in[0], cls = p.in[1], names = p.in[2];
    PyObject* type = m_cap.v(cls).real.get();
    PyObject* kw = m_cap.v(names).real.get();
    if (!known(cls) || !type || !PyType_Check(type) || !kw || !PyTuple_Check(kw))
        return m_cap.fail(breaks::kUnsupportedOpcode,
                          "a class pattern against " + m_cap.v(cls).label + ", not a known class",
                          "match against a class defined outside the function");
    int is = PyObject_IsInstance(m_cap.v(subject).real.get(), type);
    if (is < 0) {
        PyErr_Clear();
        return m_cap.fail(breaks::kUnsupportedOpcode, "a class pattern whose isinstance() raised",
                          "match against a plain class");
    }
    if (tos == Py_None) {
        if (is)
            return m_cap.fail(breaks::kUnsupportedOpcode,
                              "a class pattern that " + m_cap.v(subject).label +
                                  " fails on a missing attribute",
                              "test the attribute with hasattr()");
        return push(f, m_cap.const_value(Py_None));
    }
    Py_ssize_t count = p.oparg, nkw = PyTuple_GET_SIZE(kw);
    if (!is || !PyTuple_Check(tos) || PyTuple_GET_SIZE(tos) != count + nkw)
        return m_cap.internal_error("a class pattern matched otherwise than expected");
    auto* t = reinterpret_cast<PyTypeObject*>(type);
    bool self_match = t->tp_flags & (Py_TPFLAGS_LONG_SUBCLASS | Py_TPFLAGS_LIST_SUBCLASS |
                                     Py_TPFLAGS_TUPLE_SUBCLASS | Py_TPFLAGS_BYTES_SUBCLASS |
                                     Py_TPFLAGS_UNICODE_SUBCLASS | Py_TPFLAGS_DICT_SUBCLASS);
    self_match = self_match || t == &PyFloat_Type || t == &PyByteArray_Type ||
                 t == &PySet_Type || t == &PyFrozenSet_Type || t == &PyBool_Type;
    std::vector<int> parts;
    int match_args = -1;
    for (Py_ssize_t i = 0; i < count + nkw; ++i) {
        PyObject* got = PyTuple_GET_ITEM(tos, i);
        if (i < count && count == 1 && self_match && got == m_cap.v(subject).real.get()) {
            parts.push_back(subject);  // int(x): the subject itself
            continue;
        }
        PyObject* name = nullptr;
        if (i >= count) {
            name = PyTuple_GET_ITEM(kw, i - count);
        } else {
            if (match_args < 0) {
                py::Ref ma = py::Ref::steal(PyObject_GetAttrString(type, "__match_args__"));
                if (!ma || !PyTuple_Check(ma.get())) {
                    PyErr_Clear();
                    return m_cap.internal_error("__match_args__ of a matched class");
                }
                match_args = load_attr(cls, interned("__match_args__"), ma.get());
                if (match_args < 0) return;
            }
            PyObject* ma = m_cap.v(match_args).real.get();
            if (!known(match_args) || i >= PyTuple_GET_SIZE(ma))
                return m_cap.fail(breaks::kUnsupportedOpcode,
                                  "a class pattern whose __match_args__ is not a constant tuple",
                                  "set __match_args__ in the class body");
            name = PyTuple_GET_ITEM(ma, i);
        }
        int part = load_attr(subject, name, got);
        if (part < 0) return;
        parts.push_back(part);
    }
    push(f, m_cap.fresh(ValueKind::FreshTuple, parts, tos));
}

// operator.itemgetter(k, ...)(obj) is obj[k] (a tuple of them for several), and
// attrgetter("name", ...)(obj) is obj.name, each followed as the subscript or attribute read
// it stands for. What the getter holds comes from its __reduce__; it is immutable. Before the
// call (`result` null) only checks that what it reads runs no Python code of the user's, which
// would run from C, untraced; after it, the result's value (-1 after a failure).
int Monitor::getter_parts(const Pending& p, PyObject* result) {
    if (p.kwnames || p.in.size() != 1)
        return m_cap.fail(breaks::kUnsupportedCallee,
                          "`" + p.callee.name + "` called with other than one argument",
                          "call it with the one object it reads"), -1;
    return getter_value(p.callee_value, p.callee, p.in[0], result);
}

int Monitor::getter_value(int getter, const CalleeInfo& callee, int obj, PyObject* result) {
    auto refuse = [&](const std::string& why) {
        m_cap.fail(breaks::kUnsupportedCallee, "`" + callee.name + "` " + why,
                   "index the object or read its attribute directly");
        return -1;
    };
    py::Ref red = py::Ref::steal(PyObject_CallMethod(m_cap.v(getter).real.get(), "__reduce__",
                                                     nullptr));
    PyObject* keys = red && PyTuple_Check(red.get()) && PyTuple_GET_SIZE(red.get()) == 2
                         ? PyTuple_GET_ITEM(red.get(), 1)
                         : nullptr;
    if (!keys || !PyTuple_Check(keys) || PyTuple_GET_SIZE(keys) == 0) {
        PyErr_Clear();
        return refuse("holds what it reads in a form the capture does not know");
    }
    bool attr = callee.op == "attrgetter";
    PyObject* target = m_cap.v(obj).real.get();
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* k = PyTuple_GET_ITEM(keys, i);
        if (attr && (!PyUnicode_Check(k) || PyUnicode_FindChar(k, '.', 0, PyUnicode_GET_LENGTH(k), 1) >= 0))
            return refuse("reads a dotted path of attributes");
        if (attr ? runs_code_to_access(target, k, false) && namedtuple_field(Py_TYPE(target), k) < 0
                 : !(PyList_CheckExact(target) || PyTuple_CheckExact(target) ||
                     PyDict_CheckExact(target) || is_tensor(target) ||
                     is_namedtuple_type(Py_TYPE(target))))
            return refuse(std::string("of ") + m_cap.v(obj).label + " would run " +
                          (attr ? "a property or a custom __getattr__" : "its own __getitem__"));
    }
    if (!result) return 0;
    if (n > 1 && (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) != n))
        return m_cap.internal_error(callee.name + " gave no tuple"), -1;
    std::vector<int> parts;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* k = PyTuple_GET_ITEM(keys, i);
        PyObject* got = n == 1 ? result : PyTuple_GET_ITEM(result, i);
        int part = attr ? load_attr(obj, k, got) : subscript(obj, m_cap.const_value(k), got);
        if (part < 0) return -1;
        parts.push_back(part);
    }
    return n == 1 ? parts[0] : m_cap.fresh(ValueKind::FreshTuple, parts, result);
}

// [Note: effects that read the caller's frame] warnings.warn files its warning under the file,
// line and module of the frame that called it (or one `stacklevel` above), and a Logger's
// info() & co name that frame in the record (Logger.findCaller). A replay plan runs none of
// the user's frames, so the site is found now, while they run (magpy/_effects.py: warn_site,
// log_site), and the call becomes a step that calls _effects.warn or _effects.log with it:
// filters, the warning registry, the logger's level and handlers are all consulted at replay,
// as eager consults them. A site above the compiled function is looked up again at replay.
void Monitor::prepare_caller_effect(ShadowFrame& f, Pending& p) {
    bool warn = p.callee.kind == CallKind::Warn;
    const std::string& what = p.callee.name;
    std::vector<const char*> names =
        warn ? std::vector<const char*>{"message", "category", "stacklevel", "source"}
             : std::vector<const char*>{"self", "msg"};
    if (!warn && p.callee.op == "log") names.insert(names.begin() + 1, "level");
    size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
    size_t npos = p.in.size() - nkw;
    std::unordered_map<std::string, int> arg;
    std::vector<int> extra_pos;  // a logger's %-arguments
    for (size_t i = 0; i < npos; ++i) {
        if (i < names.size()) arg[names[i]] = p.in[i];
        else if (!warn) extra_pos.push_back(p.in[i]);
        else return m_cap.fail(breaks::kIO, "`" + what + "()` with extra arguments", "");
    }
    for (size_t k = 0; k < nkw; ++k) {
        std::string kw = str(PyTuple_GET_ITEM(p.kwnames, static_cast<Py_ssize_t>(k)));
        bool allowed = warn ? kw == "message" || kw == "category" || kw == "stacklevel" ||
                                  kw == "source"
                            : kw == "exc_info" || kw == "stack_info" || kw == "stacklevel" ||
                                  kw == "extra";
        if (!allowed)
            return m_cap.fail(breaks::kIO, "`" + what + "(" + kw + "=...)` is not replayed",
                              "drop the argument, or warn and log outside the compiled function");
        arg[kw] = p.in[npos + k];
    }
    auto real = [&](const char* name) -> PyObject* {
        auto it = arg.find(name);
        return it == arg.end() ? nullptr : m_cap.v(it->second).real.get();
    };
    auto constant = [&](const char* name) {
        auto it = arg.find(name);
        return it == arg.end() || require_const({it->second}, "`" + what + "(" + name + "=...)`");
    };
    if (!constant("stacklevel") || !constant("source") || !constant("exc_info") ||
        !constant("stack_info") || !constant("level") || !constant("category"))
        return;
    long stacklevel = 1;
    if (PyObject* sl = real("stacklevel")) {
        stacklevel = PyLong_Check(sl) ? PyLong_AsLong(sl) : -1;
        if (PyErr_Occurred()) PyErr_Clear();
    }
    PyObject* message = real(warn ? "message" : "msg");
    const char* unsure = nullptr;  // why the replayed call could differ from eager's
    if (!message) unsure = "no message";
    else if (warn && !PyUnicode_Check(message)) unsure = "a message that is not a str";
    else if ((real("source") && real("source") != Py_None) ||
             (real("exc_info") && PyObject_IsTrue(real("exc_info")) != 0) ||
             (real("stack_info") && PyObject_IsTrue(real("stack_info")) != 0))
        unsure = "a source, exc_info or stack_info";
    else if (!warn && stacklevel < 1) unsure = "a stacklevel below 1";
    if (unsure)
        return m_cap.fail(breaks::kIO, "`" + what + "()` with " + unsure + " is not replayed",
                          "warn or log a plain message, or do it outside the compiled function");
    int logger = warn ? -1 : arg["self"];
    if (!warn) {
        // the record is made as Logger._log makes it: a subclass that makes it otherwise
        // runs in Python
        PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(m_cap.v(logger).real.get()));
        py::Ref base = py::Ref::steal(PyObject_GetAttrString(m_cap.v(p.callee_value).real.get(),
                                                              "__globals__"));
        PyObject* logger_type = base ? PyDict_GetItemString(base.get(), "Logger") : nullptr;
        bool plain = logger_type && PyType_Check(logger_type);
        for (const char* name : {"findCaller", "_log"}) {
            PyObject* own = plain ? _PyType_Lookup(reinterpret_cast<PyTypeObject*>(type),
                                                   interned(name))
                                  : nullptr;
            plain = own && own == _PyType_Lookup(reinterpret_cast<PyTypeObject*>(logger_type),
                                                 interned(name));
            if (plain && m_cap.v(logger).kind == ValueKind::Input &&
                class_attr(logger, interned(name), own) < 0)
                return;
        }
        if (!plain)
            return m_cap.fail(breaks::kIO, "`" + what + "()` of a logger whose class finds "
                              "its caller or makes its records itself",
                              "log outside the compiled function");
    }
    std::vector<int> shown = extra_pos;
    shown.push_back(arg[warn ? "message" : "msg"]);
    if (!require_prints_the_same(shown, what)) return;
    py::Ref effects = py::Ref::steal(PyImport_ImportModule("magpy._effects"));
    py::Ref site = effects ? py::Ref::steal(PyObject_CallMethod(
                                 effects.get(), warn ? "warn_site" : "log_site", "OOl",
                                 f.frame_obj, m_frames.front().frame_obj, stacklevel))
                           : py::Ref();
    py::Ref step_fn = site ? py::Ref::steal(PyObject_GetAttrString(effects.get(),
                                                                   warn ? "warn" : "log"))
                           : py::Ref();
    if (!step_fn) {
        PyErr_Clear();
        return m_cap.internal_error("magpy._effects could not find the site of " + what);
    }
    p.callee_value = m_cap.const_value(step_fn.get(), "magpy._effects." +
                                                          std::string(warn ? "warn" : "log"));
    int site_value = m_cap.const_value(site.get());
    if (warn) {
        auto it = arg.find("category");
        int category = it != arg.end() && m_cap.v(it->second).real.get() != Py_None
                           ? it->second
                           : m_cap.const_value(PyExc_UserWarning);
        p.in = {arg["message"], category, site_value};
    } else {
        int level = arg.count("level") ? arg["level"]
                                       : m_cap.const_value(py::Ref::steal(
                                             PyLong_FromLong(logger_level(p.callee.name))).get());
        int args = m_cap.fresh(ValueKind::FreshTuple, extra_pos, reals_of(extra_pos, false).get());
        int extra = arg.count("extra") ? arg["extra"] : m_cap.const_value(Py_None);
        p.in = {logger, level, arg["msg"], args, site_value, extra};
    }
    p.kwnames = nullptr;
}

void Monitor::complete_call(ShadowFrame& f, Pending& p, PyObject* result) {
    const std::string& name = p.callee.name;
    auto push_out = [&](int id) {
        if (id >= 0) push(f, id);
    };
    // (isinstance(g, Mapping), type(g), id(g): calls that look at the object, not its items)
    bool looks_only = p.callee.kind == CallKind::IsInstance || p.callee.kind == CallKind::TypeOf ||
                      p.callee.kind == CallKind::AttrQuery ||
                      (p.callee.kind == CallKind::PureBuiltin &&
                       (name == "id" || name == "callable" || name == "hash" || name == "repr" ||
                        name == "ascii" || name == "format" || name == "vars"));
    if (p.callee.kind != CallKind::InlineFunction && p.callee.kind != CallKind::InlineModule &&
        p.callee.kind != CallKind::Generator && !looks_only &&
        !(p.callee.kind == CallKind::Iteration && p.callee.name != "reversed")) {
        // sum(g), tuple(g), torch.cat(list(g)): a generator the call ran to its end is the list
        // of what it yielded ([Note: generators]), and a map the list of its results. (zip and
        // enumerate take them as they are: their steps resume them one at a time.)
        // all() and any() stop at the first item that decides: what it yielded so far is what
        // they saw.
        // sum(), min() and max() of any other iterator (chain(...), reversed(xs), d.values())
        // take all its items too: the list of them. (sorted() reads its argument's items.)
        bool stops_early = p.callee.kind == CallKind::PureBuiltin && (name == "all" || name == "any");
        // So do torch functions given an iterator (clip_grad_norm_(m.parameters(), c)): at
        // replay they get the list of its items.
        bool takes_all = (p.callee.kind == CallKind::PureBuiltin &&
                          (name == "sum" || name == "min" || name == "max")) ||
                         p.callee.kind == CallKind::TorchOp;
        for (int& a : p.in) {
            std::vector<int> items;
            if (generator_of(a) && p.callee.kind == CallKind::TorchOp)
                // the op resumes it between steps of its own (vector_to_parameters writes each
                // parameter it yields): its code after each yield sees what the op did
                return m_cap.fail(breaks::kEscapingObject,
                                  "a generator is passed to `" + name + "`, which runs it "
                                  "between its own steps",
                                  "pass a list: " + name + "(list(...))");
            if ((generator_of(a) || map_of(a)) && p.key_map < 0) {
                // list(map(torch.relu, xs)): the results the list holds are the calls'
                MapRecord* m = map_of(a);
                bool keeps = p.callee.kind == CallKind::TypeCtor && (name == "list" || name == "tuple") &&
                             result && (PyList_CheckExact(result) || PyTuple_CheckExact(result)) &&
                             m && static_cast<size_t>(PySequence_Fast_GET_SIZE(result)) == m->steps.size();
                if (m && m->opaque && keeps && !fill_opaque_map(*m, result)) return;
                if (m && m->opaque && stops_early)  // how far it went depends on the results
                    return m_cap.fail(breaks::kUnsupportedCallee,
                                      "`" + name + "()` of a map of " + m->callee.name +
                                          ", which stops at the first result that decides",
                                      "write a comprehension: " + name + "([f(x) for x in xs])");
                if (!lazy_items(a, items, stops_early)) return;
            } else if (takes_all && p.key_map < 0 && m_cap.v(a).kind == ValueKind::Iterator) {
                // (with a key function, the items were read before the call and are its result)
                if (!iterator_items(a, items)) return;
            } else {
                continue;
            }
            a = m_cap.fresh(ValueKind::FreshList, items, reals_of(items, true).get());
        }
    }
    bool any_tensor = false, all_const = true, dyn = false, dyn_number = false;
    bool flows = p.callee.kind == CallKind::TorchOp || p.callee.kind == CallKind::LeafModule ||
                 p.callee.kind == CallKind::InlineFunction ||
                 p.callee.kind == CallKind::InlineModule || p.callee.kind == CallKind::UserClass ||
                 p.callee.kind == CallKind::Print || p.callee.kind == CallKind::Warn ||
                 p.callee.kind == CallKind::Log || p.callee.kind == CallKind::AutogradApply ||
                 p.callee.kind == CallKind::CachedCall || p.callee.kind == CallKind::RandomDraw ||
                 p.callee.kind == CallKind::ClockRead || p.callee.kind == CallKind::ObjectSlot ||
                 // lengths.append(ids.shape[-1]): the number is stored as it is at replay
                 (p.callee.kind == CallKind::ListMethod && p.callee.name == "append");
    if (sym_number_call(p, result))  // min(decay, (1 + step) / (10 + step)) with step dynamic
        return push_out(record_sym_number(p, result));
    if (p.callee.kind == CallKind::PureBuiltin && name == "divmod" && p.in.size() == 2 &&
        !p.kwnames && result && PyTuple_CheckExact(result) && PyTuple_GET_SIZE(result) == 2 &&
        number_operands(p.in[0], p.in[1]) &&
        (m_cap.v(p.in[0]).sym_number() || m_cap.v(p.in[1]).sym_number())) {
        // divmod(n, k) of a symbolic size: (n // k, n % k), each computed at replay
        static PyObject* op = PyImport_ImportModule("operator");  // (held for good)
        std::vector<int> parts;
        for (const char* fn : {"floordiv", "mod"}) {
            py::Ref f = py::Ref::steal(op ? PyObject_GetAttrString(op, fn) : nullptr);
            if (!f) {
                PyErr_Clear();
                return m_cap.internal_error("operator." + std::string(fn));
            }
            Pending part = p;
            part.callee_value = m_cap.const_value(f.get(), "operator." + std::string(fn));
            part.callee.name = fn;
            int r = record_sym_number(part, PyTuple_GET_ITEM(result, static_cast<Py_ssize_t>(parts.size())));
            if (r < 0) return;
            parts.push_back(r);
        }
        return push_out(m_cap.fresh(ValueKind::FreshTuple, std::move(parts), result));
    }
    if (int truth = sym_truth_call(p); truth >= 0)  // x * bool(x.numel()): not per size
        return push_out(m_cap.const_value(truth ? Py_True : Py_False));
    if (text_at_replay(p))  // str(n), "{}x{}".format(h, w) of symbolic sizes, as f"{n}"
        return push_out(call_at_replay(m_cap.v(p.callee_value).real.get(), p.in, result, "str"));
    // A tensor changed in place keeps its value's sizes (an input's are guarded): the numbers
    // an in-place change of its shape is given are fixed (`y.squeeze_(d)`, `x.unsqueeze_(d)`)
    const std::string& op = p.callee.op;
    if (p.callee.kind == CallKind::TorchOp &&
        (op == "squeeze_" || op == "unsqueeze_" || op == "transpose_" || op == "swapdims_" ||
         op == "swapaxes_" || op == "resize_" || op == "as_strided_" || op == "set_"))
        flows = false;
    if (!flows)  // builtins and the like compute with the number itself
        for (int a : p.in)
            if (p.callee.kind != CallKind::IsInstance || !m_cap.v(a).positive)
                m_cap.concretize(a);
    for (int a : p.in) {
        Value& v = m_cap.v(a);
        any_tensor = any_tensor || v.tensor;
        all_const = all_const && v.kind == ValueKind::Const;
        dyn = dyn || m_cap.holds(a, &Value::dyn_shape);  // torch.cat([masked, ...])
        dyn_number = dyn_number || m_cap.holds(a, &Value::dyn_scalar);
    }
    if (p.callee.bound_self) dyn = dyn || m_cap.v(p.callee_value).dyn_shape;  // f = t.size
    switch (p.callee.kind) {
    case CallKind::InlineFunction:
    case CallKind::InlineModule: {
        if (!p.inline_bound || p.inline_result < 0)
            return m_cap.internal_error("an inlined call returned without being traced");
        if (m_cap.v(p.inline_result).real.get() != result &&
            m_cap.v(p.inline_result).kind != ValueKind::Const)
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "the result of `" + name + "` was changed on its way back (hooks?)",
                              "remove forward hooks");
        push_out(p.inline_result);
        return;
    }
    case CallKind::TorchOp:
    case CallKind::LeafModule: {
        size_t nargs = p.in.size() + (p.callee.bound_self ? 1 : 0) -
                       (p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0);
        // torch.set_warn_always(True), torch.use_deterministic_algorithms(...): state the guards
        // read at entry changes inside the call, so a query of it after this breaks (below)
        const std::string& op = p.callee.op;
        if (p.callee.kind == CallKind::TorchOp && !p.callee.bound_self &&
            (starts_with(op, "set_") || starts_with(op, "use_")) && op != "set_grad_enabled")
            m_other_state_set = true;
        if (p.callee.kind == CallKind::TorchOp && is_global_state_query(p.callee.op) &&
            p.in.empty() && (m_grad_state_set || m_other_state_set)) {
            // Inside or after a captured with block: grad mode follows from the guarded mode
            // at entry and the blocks; other state is not followed.
            if (p.callee.op == "is_grad_enabled") return push_out(m_cap.const_value(result));
            if (m_other_state_set)
                return m_cap.fail(breaks::kUnsupportedCallee,
                                  "`" + name + "()` reads state that the call changed "
                                  "before it (a with block such as autocast or "
                                  "inference_mode, or a torch.set_* call)",
                                  "read it outside the compiled function and pass it in");
        }
        if (p.callee.kind == CallKind::TorchOp && result &&
            torch_api().is_context_type(reinterpret_cast<PyObject*>(Py_TYPE(result)))) {
            // ctx.clone() in torch's decorator wrappers (@torch.no_grad()): a fresh context
            // manager, made at replay too.
            note_context_type(reinterpret_cast<PyObject*>(Py_TYPE(result)));
            return push_out(record_call(p, result, false, false));
        }
        if (p.callee.kind == CallKind::TorchOp && is_global_state_query(p.callee.op) &&
            p.in.empty()) {
            // Answered by global state: guarded by asking again on every call.
            PyObject* fn = m_cap.v(p.callee_value).real.get();
            push_out(m_cap.input_root(AccessKind::CallResult, 0, fn, callable_name(fn) + "()",
                                      result));
            return;
        }
        // (of a tensor: `x.storage().size()` is TypedStorage's, which reads the storage's
        // bytes at replay, not a size the guards hold)
        bool is_meta = p.callee.kind == CallKind::TorchOp && is_metadata_query(p.callee.op, nargs) &&
                       (p.callee.bound_self || p.in.empty() || m_cap.v(p.in[0]).tensor ||
                        p.callee.op == "is_tensor");
        if (is_meta) {
            int t = !p.in.empty() && !p.callee.bound_self && m_cap.v(p.in[0]).tensor ? p.in[0] : -1;
            if (dyn) {  // sizes become numbers read at replay ([Note: numbers from tensor data])
                int r = t >= 0 && m_cap.v(t).dyn_shape ? symbolic_query(p, t, result) : -1;
                if (r >= 0 || m_cap.failed()) return push_out(r);
                return m_cap.fail(breaks::kDynamicShape,
                                  "`" + name + "` reads the layout of a tensor whose shape "
                                  "depends on data",
                                  "read only its sizes (x.shape, x.size(d), x.numel())");
            }
            if (reads_strides(p.callee.op)) guard_all_strides();
            if (p.callee.bound_self || (t >= 0 && m_cap.sym_tensor(t)))
                return push_out(symbolic_query(p, t, result));
            push_out(m_cap.const_value(result));
            return;
        }
        bool reads_tensor = p.callee.bound_self || (!p.in.empty() && m_cap.v(p.in[0]).tensor);
        if (result && !is_tensor(result) && is_number(result) && reads_tensor &&
            p.callee.kind == CallKind::TorchOp)
            return push_out(number_from_data(p, result));  // t.item(), torch.equal(a, b)
        if (result && p.callee.kind == CallKind::TorchOp && p.callee.op == "tolist" &&
            args_fold(p))
            return push_out(constant_of(result));  // [Note: tensors of constants]
        if (result == Py_None && starts_with(p.callee.name, "F.") && args_fold(p))
            // torch.nn.functional's helpers compute from their arguments alone: torch 2's
            // `F._canonical_mask(mask=None, ...)` in TransformerEncoderLayer.forward is None
            // for constants (not so a reader of torch's state, get_worker_info())
            return push_out(m_cap.const_value(Py_None));
        if (result && p.callee.kind == CallKind::TorchOp && p.callee.op == "tolist")
            if (int r = tolist_numbers(p, result); r >= 0 || m_cap.failed()) return push_out(r);
        if (result && !is_tensor(result) && (is_number(result) || PyUnicode_Check(result)) &&
            !reads_tensor && !p.callee.bound_self) {
            // torch.distributed.is_initialized(), torch.get_num_threads(): a fact of the process
            // that may change between calls
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`" + name + "` gives a Python value (" + py::type_name(result) +
                              ") about the process, which may differ in a later call",
                              "compute it outside the compiled function and pass it in");
        }
        if (result && !is_tensor(result) && (is_number(result) || PyUnicode_Check(result))) {
            return m_cap.fail(breaks::kTensorToPython,
                              "`" + name + "` turns tensor data into a Python value",
                              "keep the value as a tensor (e.g. use torch.where instead of an "
                              "if), or move this outside the compiled function");
        }
        // A number read from tensor data may decide the result's shape (interpolate's
        // scale_factor, torch.zeros(n), x[:n]).
        push_out(record_call(p, result, dyn || dyn_number ||
                                        has_data_dependent_shape(p.callee.op, nargs)));
        return;
    }
    case CallKind::Len:
        if (p.in.size() != 1) return m_cap.internal_error("len arity");
        return push_out(length_value(p.in[0], result));
    case CallKind::Getter:
        return push_out(getter_parts(p, result));
    case CallKind::MakeModule: {
        // `loss_fct = CrossEntropyLoss(ignore_index=pad)` in a forward (every HF head): a module
        // with no parameters, buffers or submodules, from constant arguments, is made again
        // by a step at replay (a new object each call, as in eager) and called as a leaf.
        if (!result) return;
        bool args_known = true;
        for (int a : p.in) args_known = args_known && known(a);
        const char* why = !args_known ? "arguments that are not constants" : nullptr;
        for (const char* held : {"_parameters", "_buffers", "_modules"}) {
            PyObject* d = why ? nullptr : PyObject_GetAttrString(result, held);
            if (!why && (!d || !PyDict_Check(d))) why = "parameters, buffers or submodules";
            Py_ssize_t pos = 0;
            PyObject *k, *item;
            while (!why && PyDict_Next(d, &pos, &k, &item))  // (a loss's `weight` is None)
                if (item != Py_None) why = "parameters, buffers or submodules";
            Py_XDECREF(d);
            PyErr_Clear();
        }
        if (why)
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`" + name + "(...)` is made in the call with " + why,
                              "make the module in __init__, or use its torch.nn.functional form");
        return push_out(record_call(p, result, false, false));
    }
    case CallKind::DeepCopy: {
        if (!result) return;
        std::unordered_map<PyObject*, int> made;
        return push_out(deep_copied(p.in[0], result, made));
    }
    case CallKind::CountElements: {
        // Each item counted: the counts follow from the items when they are constants; they
        // are read back from the counter (a dict of constants) into the items the capture
        // follows, new keys last in the order counting added them.
        std::vector<int> items;
        const Value& c = p.in.empty() ? m_cap.v(m_cap.null_value()) : m_cap.v(p.in[0]);
        if (p.kwnames || p.in.size() != 2 || c.kind != ValueKind::FreshObject || c.mapping < 0 ||
            !PyDict_Check(c.real.get()))
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`Counter` counting into " + c.label,
                              "count into a Counter made in the call");
        if (!items_of(p.in[1], items)) return;
        for (int it : items)
            if (!known(it))
                return m_cap.fail(breaks::kUnsupportedCallee,
                                  "`Counter` counts " + m_cap.v(it).label + ", which is not a constant",
                                  "count constants (names, sizes)");
        int counter = p.in[0], mapping = c.mapping;
        py::Ref real = m_cap.v(counter).real;
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(real.get(), &pos, &k, &v)) {  // what each count was added to
            int at = fresh_dict_slot(mapping, k);
            int before = at >= 0 ? m_cap.v(mapping).items[static_cast<size_t>(at)] : -1;
            if (before >= 0 && !known(before))
                return m_cap.fail(breaks::kUnsupportedCallee,
                                  "`Counter` adds to " + m_cap.v(before).label +
                                      ", which is not a constant",
                                  "count constants into a Counter of counts");
        }
        pos = 0;
        while (PyDict_Next(real.get(), &pos, &k, &v))
            set_fresh_item(mapping, m_cap.const_value(k), m_cap.const_value(v));
        return push_out(m_cap.const_value(Py_None));
    }
    case CallKind::AttrQuery: {
        // hasattr(obj, "name") / getattr(obj, "name"[, default]) with a constant name: a
        // present attribute is read like `obj.name` (guarded the same way); an absent one is
        // guarded absent (objects from the caller) or known absent (made in the call).
        size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
        if (name == "setattr") {  // setattr(obj, "name", value): obj.name = value
            PyObject* key = p.in.size() == 3 ? m_cap.v(p.in[1]).real.get() : nullptr;
            if (nkw || !key || m_cap.v(p.in[1]).kind != ValueKind::Const || !PyUnicode_CheckExact(key))
                return m_cap.fail(breaks::kUnsupportedCallee,
                                  "`setattr()` with an attribute name that is not a constant",
                                  "assign obj.name = value");
            store_attr(p.in[0], key, p.in[2]);
            return push_out(m_cap.const_value(Py_None));
        }
        bool has = name == "hasattr";
        PyObject* key = p.in.size() >= 2 ? m_cap.v(p.in[1]).real.get() : nullptr;
        if (nkw || p.in.size() < 2 || p.in.size() > (has ? 2u : 3u) ||
            m_cap.v(p.in[1]).kind != ValueKind::Const || !key || !PyUnicode_CheckExact(key))
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`" + name + "()` with an attribute name that is not a constant",
                              "use a string literal, or read the attribute directly");
        int obj = p.in[0];
        PyObject* target = m_cap.v(obj).real.get();
        if (!target || runs_code_to_access(target, key, false))
            return m_cap.fail(breaks::kUnsupportedAttribute,
                              "`" + name + "(" + m_cap.v(obj).label + ", '" + str(key) +
                                  "')` would run a property or a custom __getattr__",
                              "read a plain attribute");
        py::Ref attr = py::Ref::steal(PyObject_GetAttr(target, key));
        PyErr_Clear();
        if (!attr && !has && p.in.size() < 3)
            return m_cap.internal_error("getattr() without a default found no attribute");
        if (attr) {
            int r = load_attr(obj, key, attr.get());
            if (r < 0) return;
            return push_out(has ? m_cap.const_value(Py_True) : r);
        }
        const Value& o = m_cap.v(obj);
        if (o.kind == ValueKind::Const && o.real && mutable_constant(o.real.get())) {
            // getattr(type(obj), name, default): a class of the user's, known as a constant,
            // may gain the attribute later; guarded absent through the class the guards hold
            // (a review probe)
            m_cap.guard_no_attr(m_cap.constant_root(o.real.get(), o.label, true), key);
        } else if (o.kind == ValueKind::Input || o.identity) {
            if (o.node < 0) return m_cap.internal_error("an input without a guard node");
            m_cap.guard_no_attr(obj, key);
        } else if (!(o.tensor || o.kind == ValueKind::Const || o.kind == ValueKind::FreshObject ||
                     o.kind == ValueKind::FreshList || o.kind == ValueKind::FreshTuple ||
                     o.kind == ValueKind::FreshDict)) {
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`" + name + "()` of " + o.label + ", whose attributes are not known",
                              "test the attribute on an object passed in");
        }
        return push_out(has ? m_cap.const_value(Py_False) : p.in[2]);
    }
    case CallKind::Next: {
        if (name == "iter") {  // iter(x): what a for loop over x iterates
            if (p.kwnames || p.in.size() != 1)
                return m_cap.fail(breaks::kUnsupportedCallee, "`iter()` with a sentinel",
                                  "iterate over a sequence");
            return push_out(make_iter(p.in[0], result));
        }
        // next(it): the item a for loop would take (`next(self.parameters()).device`)
        int it = p.in.empty() ? -1 : p.in[0];
        const Value* iv = it >= 0 ? &m_cap.v(it) : nullptr;
        if (p.kwnames || p.in.empty() || p.in.size() > 2 || iv->kind != ValueKind::Iterator ||
            iv->iter_kind == IterKind::Generator || iv->iter_kind == IterKind::Map)
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`next()` of " + (iv ? iv->label : std::string("nothing")) +
                                  ", an iterator the capture does not follow item by item",
                              "iterate with a for loop, or index the sequence");
        if (p.in.size() == 2 && result == m_cap.v(p.in[1]).real.get())
            return m_cap.fail(breaks::kUnsupportedOpcode,
                              "`next()` with a default reached the end of " + iv->label,
                              "test the length of the sequence instead");
        if (iv->zipped_by && iv->zipped_by != f.frame_obj)
            return m_cap.fail(breaks::kUnsupportedOpcode,
                              "`next()` of " + iv->label + ", which a zip() or enumerate() also reads",
                              "zip lists, not iterators read elsewhere");
        return push_out(next_item(it, result));
    }
    case CallKind::Print:
    case CallKind::Warn:
    case CallKind::Log: {
        int r = record_call(p, result, false, false);
        if (r >= 0) push_out(m_cap.const_value(Py_None));
        return;
    }
    case CallKind::IsInstance: {
        // The type of every value is known: guarded for inputs, fixed for everything else.
        for (int a : p.in)
            if (m_cap.v(a).kind == ValueKind::OpResult && !m_cap.v(a).tensor &&
                !m_cap.v(a).dyn_scalar &&  // a number's type follows from the guarded dtype
                !m_cap.v(a).positive)      // a size of an input is an int
                return m_cap.fail(breaks::kUnsupportedCallee, "isinstance() of an op result",
                                  "test the inputs instead");
        if (p.in.size() == 2 && !class_test_follows_type(name, p.in[0], p.in[1])) return;
        push_out(m_cap.const_value(result));
        return;
    }
    case CallKind::PureBuiltin:
    case CallKind::TypeCtor: {
        if (p.key_map >= 0) return push_out(keyed_result(p, result));
        if (name == "vars" && p.in.size() == 1 && !p.kwnames && result)
            return push_out(load_attr(p.in[0], interned("__dict__"), result));  // obj.__dict__
        if (name == "id" && p.in.size() == 1 && !p.kwnames && result) {
            // the same number each call only for an object the guards pin (a module, a
            // function) or an immutable constant (copy.deepcopy's memo keys); anything made
            // anew each call has a new id
            const Value& a = m_cap.v(p.in[0]);
            if (a.identity || (a.kind == ValueKind::Const && is_constant_like(a.real.get())))
                return push_out(m_cap.const_value(result));
            if (a.kind == ValueKind::Input && !a.tensor && a.node >= 0) {
                // an object held by the model (a config dict): pinned by identity from here
                // (a tensor passed in is usually a new one each call: it breaks)
                m_cap.guard_identity(p.in[0]);
                return push_out(m_cap.const_value(result));
            }
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`id()` of " + a.label +
                                  (a.kind == ValueKind::Input ? ", a tensor passed in, usually a new object each call"
                                                              : ", which is a new object each call"),
                              "compare objects with `is`, or key by something else");
        }
        if (name == "callable" && p.in.size() == 1 && !p.kwnames && result) {
            // follows from the type, guarded, and its class's __call__ (set later on the class)
            const Value& a = m_cap.v(p.in[0]);
            if (a.kind == ValueKind::Input && !a.tensor && !PyType_Check(a.real.get()) &&
                !m_cap.guard_class_unchanged(p.in[0]))
                return;
            return push_out(m_cap.const_value(result));
        }
        if (p.fold_map >= 0) return push_out(fold_result(p, result));
        size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
        // defaultdict(factory, ...): the factory first, then as dict()
        size_t first = name == "collections.defaultdict" ? 1 : 0;
        if (p.callee.kind == CallKind::TypeCtor && p.in.size() <= first + 1 + nkw &&
            p.in.size() >= first + nkw &&
            (name == "dict" || name == "collections.OrderedDict" || first == 1)) {
            // Built as its own type at replay; dict(pairs) / dict(other_dict) take the items,
            // then dict(..., name=v) the keywords.
            if (first == 1 && !require_const({p.in[0]}, "the factory of a defaultdict")) return;
            std::vector<int> pairs;
            if (p.in.size() > first + nkw) {
                const Value& src = m_cap.v(p.in[first]);
                if (src.kind == ValueKind::FreshObject && src.mapping >= 0 &&
                    Py_TYPE(src.real.get())->tp_iter == PyDict_Type.tp_iter) {
                    // dict(counter): a dict subclass made in the call whose iteration is
                    // dict's copies its items as they are
                    if (!pairs_of(src.mapping, pairs)) return;
                } else if (src.kind == ValueKind::FreshDict ||
                           (src.kind == ValueKind::Input && PyDict_Check(src.real.get()))) {
                    if (!pairs_of(p.in[first], pairs)) return;
                } else {
                    std::vector<int> seq;
                    if (!items_of(p.in[first], seq)) return;
                    for (int pair : seq) {
                        std::vector<int> kv;
                        if (!items_of(pair, kv)) return;
                        if (kv.size() != 2 || !known(kv[0]))
                            return m_cap.fail(breaks::kUnsupportedCallee,
                                              name + "() of items that are not (constant key, value) pairs",
                                              "build the dict from (constant key, value) pairs");
                        pairs.push_back(kv[0]);
                        pairs.push_back(kv[1]);
                    }
                }
            }
            for (size_t k = 0; k < nkw; ++k) {
                pairs.push_back(m_cap.const_value(PyTuple_GET_ITEM(p.kwnames, static_cast<Py_ssize_t>(k))));
                pairs.push_back(p.in[p.in.size() - nkw + k]);
            }
            int d = fresh_dict(pairs, result);
            if (first == 1) m_cap.v(d).default_factory = p.in[0];
            push_out(d);
            return;
        }
        if (p.callee.kind == CallKind::TypeCtor && p.in.size() == 1 &&
            (name == "list" || name == "tuple") && m_cap.v(p.in[0]).kind == ValueKind::Iterator &&
            result && (PyList_CheckExact(result) || PyTuple_CheckExact(result))) {
            // list(d.keys()), list(zip(a, b)), tuple(enumerate(xs)): run the iteration the
            // call just did, item by item, against the items it produced.
            int it = make_iter(p.in[0], nullptr);
            if (it < 0) return;
            std::vector<int> items;
            for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(result); ++i) {
                int item = next_item(it, PySequence_Fast_GET_ITEM(result, i));
                if (item < 0) return;
                items.push_back(item);
            }
            iter_done(it);
            push_out(m_cap.fresh(name == "list" ? ValueKind::FreshList : ValueKind::FreshTuple,
                                 items, result));
            return;
        }
        if ((name == "set" || name == "frozenset") && p.in.size() <= 1 && !p.kwnames && result) {
            // [Note: sets made in the call]
            if (!p.in.empty() && !set_source_known(p.in[0])) return;
            return push_out(name == "set" ? fresh_set(result) : m_cap.const_value(result));
        }
        if (p.callee.kind == CallKind::TypeCtor && p.in.size() == 1 && name == "list" &&
            m_cap.v(p.in[0]).kind == ValueKind::Const) {
            std::vector<int> items;  // list(range(n)), list(a_constant_tuple)
            if (!items_of(p.in[0], items)) return;
            push_out(m_cap.fresh(ValueKind::FreshList, items, result));
            return;
        }
        if (p.callee.kind == CallKind::TypeCtor && p.in.size() == 1 && name == "torch.Size" &&
            result && Py_TYPE(result) == torch_api().size_type) {
            // torch.Size([b, n]) of sizes, symbolic ones too: a shape made again at replay
            std::vector<int> items;
            const Value& s = m_cap.v(p.in[0]);
            bool seq = s.kind == ValueKind::FreshList || s.kind == ValueKind::FreshTuple ||
                       (s.kind == ValueKind::Input && !s.tensor &&
                        (PyList_CheckExact(s.real.get()) || PyTuple_CheckExact(s.real.get())));
            if (seq && items_of(p.in[0], items) &&
                std::all_of(items.begin(), items.end(), [&](int it) {
                    const Value& v = m_cap.v(it);
                    return !v.tensor && v.real && PyLong_CheckExact(v.real.get());
                }))
                return push_out(m_cap.fresh(ValueKind::FreshTuple, items, result));
            if (m_cap.failed()) return;
        }
        if (p.callee.kind == CallKind::TypeCtor && p.in.size() == 1 &&
            (name == "list" || name == "tuple")) {
            Value& s = m_cap.v(p.in[0]);
            if (s.kind == ValueKind::FreshList || s.kind == ValueKind::FreshTuple ||
                s.kind == ValueKind::FreshDict) {
                std::vector<int> items = s.items;
                if (s.kind == ValueKind::FreshDict) {  // list(d): its keys
                    items.clear();
                    for (size_t i = 0; i < s.items.size(); i += 2) items.push_back(s.items[i]);
                }
                push_out(m_cap.fresh(name == "list" ? ValueKind::FreshList : ValueKind::FreshTuple,
                                     items, result));
                return;
            }
            PyObject* sr = s.real.get();
            if (s.kind == ValueKind::Input && !s.tensor && sr &&
                (PyList_CheckExact(sr) || PyTuple_CheckExact(sr))) {
                if (name == "tuple" && PyTuple_CheckExact(sr))
                    return push_out(p.in[0]);  // tuple(a_tuple) is that tuple
                std::vector<int> items;  // list(xs) of a list or tuple passed in: its items
                if (!items_of(p.in[0], items)) return;
                push_out(m_cap.fresh(name == "list" ? ValueKind::FreshList : ValueKind::FreshTuple,
                                     items, result));
                return;
            }
            // list(x.split(n)), tuple(t): the items a loop over it would take, read at replay.
            if ((s.tensor || (s.kind == ValueKind::OpResult && sr &&
                              (PyTuple_CheckExact(sr) || PyList_CheckExact(sr)))) &&
                !s.dyn_shape && result && (PyList_CheckExact(result) || PyTuple_CheckExact(result))) {
                int src = p.in[0];
                m_cap.fix_length(src);
                std::vector<int> items;
                for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(result); ++i) {
                    int item = item_of(src, i, PySequence_Fast_GET_ITEM(result, i));
                    if (item < 0) return;
                    items.push_back(item);
                }
                push_out(m_cap.fresh(name == "list" ? ValueKind::FreshList : ValueKind::FreshTuple,
                                     items, result));
                return;
            }
        }
        if (p.callee.kind == CallKind::PureBuiltin && name == "sorted" && !all_const)
            return push_out(sorted_items(p, result));
        if (p.callee.kind == CallKind::PureBuiltin && !all_const && result && is_tensor(result)) {
            // sum(losses), max(a, b), abs(t): run at replay on the values of that call.
            push_out(record_call(p, result, dyn));
            return;
        }
        bool number_ctor = p.callee.kind == CallKind::TypeCtor && p.in.size() == 1 &&
                           (name == "int" || name == "float") && any_tensor;
        if (result && is_number(result) && (number_ctor || dyn_number) &&
            (p.callee.kind == CallKind::PureBuiltin || p.callee.kind == CallKind::TypeCtor))
            return push_out(number_from_data(p, result));  // int(t), round(loss.item(), 4)
        if (any_tensor)
            return m_cap.fail(breaks::kTensorToPython,
                              "`" + name + "()` is applied to a tensor",
                              "use the torch equivalent (torch.abs, torch.max, x.float())");
        if (name.rfind("numpy.", 0) == 0 && is_ndarray(result) && numpy_from_constants(p.in))
            return push_out(array_result(record_call(p, result, false, false)));
        // re.sub(pattern, a_function, s), np.apply_along_axis(f, ...): folding would call
        // the function once, at capture
        static const std::unordered_set<std::string> kNeverCalls = {
            "callable", "id", "repr", "ascii", "hash", "format", "vars"};
        if (p.callee.kind == CallKind::PureBuiltin && !kNeverCalls.count(name) &&
            std::any_of(p.in.begin(), p.in.end(),
                        [&](int a) { return calls_python(m_cap.v(a).real.get()); }))
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`" + name + "()` is given a function, which it may call",
                              "pass a constant instead of the function, or call it outside the "
                              "compiled function");
        if (!require_const(p.in, "`" + name + "()`")) return;
        if (p.callee.kind == CallKind::TypeCtor && name == "list")
            return m_cap.fail(breaks::kUnsupportedCallee, "list() of a constant",
                              "build the list with [...]");
        if (name.rfind("numpy.", 0) == 0 && result && !PyBool_Check(result) &&
            !PyUnicode_CheckExact(result) &&
            !(PyNumber_Check(result) && std::string(Py_TYPE(result)->tp_name) != "numpy.ndarray"))
            // an array is mutable, and a function that returns None ran for its effects
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`" + name + "()` gives a " + py::type_name(result) +
                                  ", not a number to fold",
                              "compute with torch, or call it outside the compiled function");
        for (int a : p.in)  // min(s, t) gives one of its arguments: that object, not a copy
            if (result && m_cap.v(a).real.get() == result) return push_out(a);
        push_out(constant_of(result));  // a list, dict or set folded is made anew each call
        return;
    }
    case CallKind::EagerFact: {
        // is_scripting()/is_tracing() are False and _get_tracing_state() is None whenever this
        // code runs eagerly (capture and replay alike); annotate(T, x) and _unwrap_optional(x)
        // are x.
        const std::string& op = p.callee.op;
        if (op == "annotate" && p.in.size() == 2) return push_out(p.in[1]);
        if (op == "_unwrap_optional" && p.in.size() == 1) return push_out(p.in[0]);
        if (op == "__init__" && p.in.size() == 1 && !p.kwnames && result == Py_None)
            return push_out(m_cap.const_value(result));  // object.__init__(obj) does nothing
        if ((op == "is_scripting" || op == "is_tracing") && result == Py_False)
            return push_out(m_cap.const_value(result));
        if (op == "_get_tracing_state" && result == Py_None)
            return push_out(m_cap.const_value(result));
        if (p.callee.process_fact) return push_out(m_cap.const_value(result));
        if (op.rfind("_has_torch_function", 0) == 0) {
            // torch.overrides.has_torch_function(args): False for plain tensors and parameters
            // (their types are guarded), which is all a capture follows.
            if (result != Py_False)
                return m_cap.fail(breaks::kUnsupportedCallee,
                                  "`" + name + "` finds a tensor subclass with __torch_function__",
                                  "pass plain tensors");
            std::vector<int> args;
            for (int a : p.in) {
                const Value& v = m_cap.v(a);
                if (v.kind == ValueKind::FreshTuple || v.kind == ValueKind::FreshList)
                    args.insert(args.end(), v.items.begin(), v.items.end());
                else args.push_back(a);
            }
            for (int a : args) {
                const Value& v = m_cap.v(a);
                PyTypeObject* t = v.real ? Py_TYPE(v.real.get()) : nullptr;
                bool plain = v.tensor ? (t == torch_api().tensor_type || t == torch_api().parameter_type)
                                      : (v.kind == ValueKind::Const);
                if (!plain)
                    return m_cap.fail(breaks::kUnsupportedCallee,
                                      "`" + name + "` of " + v.label + ", which is not a plain tensor",
                                      "pass plain tensors");
            }
            return push_out(m_cap.const_value(result));
        }
        return m_cap.fail(breaks::kUnsupportedCallee, "`" + name + "` while scripting or tracing",
                          "compile the eager model, not a scripted or traced one");
    }
    case CallKind::SetMethod:
        push_out(set_method(p, result));
        return;
    case CallKind::ListMethod: {
        if (p.callee.op == "sort") return push_out(sort_list(p));
        if ((p.callee.op == "index" || p.callee.op == "count") && result && !p.in.empty()) {
            // names.index(key) over items the guards fix: a constant (a list read, not changed)
            std::vector<int> items;
            if (!items_of(p.in[0], items)) return;
            items.insert(items.end(), p.in.begin() + 1, p.in.end());
            if (!require_const(items, "`list." + p.callee.op + "()`")) return;
            return push_out(m_cap.const_value(result));
        }
        int r = mutate_list(p.callee_value, name, p.in);
        if (r >= 0 && !m_cap.v(r).real && result)  // copy(): the new list
            m_cap.v(r).real = py::Ref::borrow(result);
        push_out(r);
        return;
    }
    case CallKind::RandomDraw:
    case CallKind::ClockRead: {
        // drawn (read) again at replay, in order with the other steps: like a number read from
        // tensor data, arithmetic on it is replayed and a branch on it breaks
        int r = record_call(p, result, false, false);
        if (r >= 0) m_cap.v(r).dyn_scalar = true;
        return push_out(r);
    }
    case CallKind::AutogradApply: {
        // [Note: autograd functions] MyFunction.apply(x): runs at replay as one step, so its
        // backward is the user's; its forward is not looked into, so the sizes of what it
        // returns are read at replay like those of nonzero()
        if (!tensors_only(result))
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`" + name + "` returns a " + py::type_name(result) +
                                  ", not tensors",
                              "return tensors from the forward of an autograd.Function");
        return push_out(record_call(p, result, true, false));
    }
    case CallKind::CachedCall: {
        // [Note: cached functions] `@functools.lru_cache def freqs(n, d)`: what it returns
        // depends on its arguments alone (the cache's contract), and whether it runs depends
        // on its cache. Tensors it returns are fetched at replay by calling it there (a hit
        // returns the very tensor eager gets); constants from constant arguments are folded.
        if (tensors_only(result)) return push_out(record_call(p, result, false, false));
        bool args_known = true;
        for (int a : p.in) args_known = args_known && known(a);
        if (args_known && result && is_typing_object(result))  // List[Tensor]: typing's cache
            return push_out(m_cap.const_value(result));
        PyObject* cached_fn = m_cap.v(p.callee_value).real.get();
        py::Ref params = py::Ref::steal(PyObject_CallMethod(cached_fn, "cache_parameters", nullptr));
        PyObject* maxsize = params && PyDict_Check(params.get())
                                ? PyDict_GetItemString(params.get(), "maxsize")
                                : nullptr;
        PyErr_Clear();
        bool unbounded = maxsize == Py_None;
        if (!unbounded && result && is_number(result) && !PyBool_Check(result)) {
            // A bounded cache evicts: whether it runs is known only then. The number is read at
            // replay from the call (as a number from tensor data).
            int r = record_call(p, result, false, false);
            if (r >= 0) m_cap.v(r).dyn_scalar = true;
            return push_out(r);
        }
        bool typed = params && PyDict_Check(params.get()) &&
                     PyDict_GetItemString(params.get(), "typed") == Py_True;
        if (args_known && result && !p.kwnames && unbounded &&
            (result == Py_None || is_number(result) || PyUnicode_CheckExact(result) ||
             PyBool_Check(result))) {
            // (the function itself is held by identity: another cached function rebound to
            // the same name must not answer for it)
            if (m_cap.v(p.callee_value).kind == ValueKind::Input)
                m_cap.guard_identity(p.callee_value);
            // A constant of the capture, guarded by looking it up in the function's cache on
            // each call (cached_result): after cache_clear() the lookup fails and the call is
            // captured again, where the function runs in its place, after the call's earlier
            // effects, as in eager (a review probe: running it at the guards ran it before
            // them, on state the call had not yet written, and put that answer in the cache).
            PyObject* fn = m_cap.v(p.callee_value).real.get();
            py::Ref args = py::Ref::steal(PyTuple_New(static_cast<Py_ssize_t>(p.in.size())));
            if (!args) return m_cap.internal_error("out of memory");
            for (size_t i = 0; i < p.in.size(); ++i)
                PyTuple_SET_ITEM(args.get(), static_cast<Py_ssize_t>(i),
                                 py::Ref::borrow(m_cap.v(p.in[i]).real.get()).release());
            py::Ref lookup = py::Ref::steal(cached_result_lookup(fn, args.get(), typed));
            if (!lookup) {
                PyErr_Clear();
                return m_cap.fail(breaks::kUnsupportedCallee,
                                  "the cache of `" + name + "` cannot be looked into",
                                  "return tensors from functions under functools.lru_cache");
            }
            return push_out(m_cap.input_root(AccessKind::CallResult, 0, lookup.get(),
                                             name + "(...)", result));
        }
        return m_cap.fail(breaks::kUnsupportedCallee,
                          "the cached function `" + name + "` returns " +
                              (args_known ? "a " + py::type_name(result)
                                          : "a value from arguments that are not constants"),
                          "return tensors, or numbers and strings of constant arguments, from "
                          "functions under functools.lru_cache");
    }
    case CallKind::Context:
        // torch.no_grad() & co, made at replay too (set_grad_enabled(b) sets the mode here).
        if (!require_const(p.in, "`" + name + "()`")) return;
        note_context_type(m_cap.v(p.callee_value).real.get());
        push_out(record_call(p, result, false, false));
        return;
    case CallKind::ModuleMembers:
        push_out(module_members(p, result));
        return;
    case CallKind::NamedTuple: {
        // Point(x, y=...) -> the fields in order; missing ones from _field_defaults
        auto* t = reinterpret_cast<PyTypeObject*>(m_cap.v(p.callee_value).real.get());
        PyObject* fields = _PyType_Lookup(t, interned("_fields"));
        Py_ssize_t nf = PyTuple_GET_SIZE(fields);
        size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
        size_t npos = p.in.size() - nkw;
        if (!result || Py_TYPE(result) != t || PyTuple_GET_SIZE(result) != nf ||
            npos > static_cast<size_t>(nf))
            return m_cap.internal_error("namedtuple construction");
        std::vector<int> items(static_cast<size_t>(nf), -1);
        for (size_t i = 0; i < npos; ++i) items[i] = p.in[i];
        for (size_t k = 0; k < nkw; ++k) {
            int idx = namedtuple_field(t, PyTuple_GET_ITEM(p.kwnames, static_cast<Py_ssize_t>(k)));
            if (idx < 0) return m_cap.internal_error("namedtuple keyword");
            items[static_cast<size_t>(idx)] = p.in[npos + k];
        }
        for (Py_ssize_t i = 0; i < nf; ++i)
            if (items[static_cast<size_t>(i)] < 0)  // a default: the object the call used
                items[static_cast<size_t>(i)] = m_cap.const_value(PyTuple_GET_ITEM(result, i));
        push_out(m_cap.fresh(ValueKind::FreshTuple, items, result));
        return;
    }
    case CallKind::Generator: {
        // a generator function called (a generator expression made): nothing runs yet
        if (!result || !PyGen_Check(result)) return m_cap.internal_error("generator call");
        GenRecord g;
        g.code = p.callee.code;
        g.call = p;
        g.func_value = p.callee_value;
        g.object = result;
        int it = m_cap.new_value(ValueKind::Iterator, result, name + "(...)");
        m_cap.v(it).iter_kind = IterKind::Generator;
        m_cap.v(it).iter_source = static_cast<int>(m_gens.size());
        m_gens.push_back(std::move(g));
        return push_out(it);
    }
    case CallKind::NamedTupleMethod: {
        // nt._replace(f=v): a fresh tuple of the same class; nt._asdict(): {field: item}
        PyObject* self_real = p.in.empty() ? nullptr : m_cap.v(p.in[0]).real.get();
        if (!self_real || !is_namedtuple_type(Py_TYPE(self_real)) || !result)
            return m_cap.internal_error("namedtuple method");
        PyTypeObject* t = Py_TYPE(self_real);
        std::vector<int> items;
        if (!items_of(p.in[0], items)) return;
        PyObject* fields = _PyType_Lookup(t, interned("_fields"));
        if (static_cast<Py_ssize_t>(items.size()) != PyTuple_GET_SIZE(fields))
            return m_cap.internal_error("namedtuple length");
        size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
        if (p.in.size() != 1 + nkw)
            return m_cap.internal_error("namedtuple method arguments");
        if (p.callee.op == "_asdict") {
            std::vector<int> pairs;
            for (size_t i = 0; i < items.size(); ++i) {
                pairs.push_back(m_cap.const_value(PyTuple_GET_ITEM(fields, static_cast<Py_ssize_t>(i))));
                pairs.push_back(items[i]);
            }
            return push_out(m_cap.fresh(ValueKind::FreshDict, pairs, result));
        }
        for (size_t k = 0; k < nkw; ++k) {
            int idx = namedtuple_field(t, PyTuple_GET_ITEM(p.kwnames, static_cast<Py_ssize_t>(k)));
            if (idx < 0) return m_cap.internal_error("namedtuple field");
            items[static_cast<size_t>(idx)] = p.in[1 + k];
        }
        return push_out(m_cap.fresh(ValueKind::FreshTuple, items, result));
    }
    case CallKind::UserClass: {
        // the object made, its __init__ traced (or object's, which sets nothing)
        if (!result) return;
        int obj = p.made;
        if (obj < 0 && p.callee.code)
            return m_cap.internal_error("__init__ of " + name + " was not traced");
        if (obj < 0) {
            obj = new_object(p.callee_value, result);
            int items = m_cap.v(obj).mapping;
            size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
            if (items >= 0 && p.in.size() > nkw)
                return m_cap.fail(breaks::kUnsupportedCallee,
                                  "`" + name + "()` with items given by position",
                                  "give the items as keywords, or set them one by one");
            for (size_t k = 0; items >= 0 && k < nkw; ++k)  // Config(a=1, b=2): dict's __init__
                dict_set(items, m_cap.const_value(PyTuple_GET_ITEM(p.kwnames, static_cast<Py_ssize_t>(k))),
                         p.in[p.in.size() - nkw + k]);
        }
        if (m_cap.v(obj).real.get() != result)
            return m_cap.internal_error("the object made is not the one returned");
        if (int items = m_cap.v(obj).mapping;
            items >= 0 && PyDict_Size(result) != static_cast<Py_ssize_t>(m_cap.v(items).items.size() / 2))
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`" + name + "()` holds items the capture did not see",
                              "set items in __init__ with self[key] = value");
        // what __init__ set is all the object holds
        if (attributes_set(result) != static_cast<Py_ssize_t>(m_cap.v(obj).items.size() / 2))
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`" + name + "()` sets attributes the capture did not see",
                              "set attributes in __init__ with self.name = value");
        push_out(obj);
        return;
    }
    case CallKind::ObjectSlot:
        return push_out(object_slot_call(p, result));
    case CallKind::GenContext: {
        // the context manager made: its generator, recorded to be traced when __enter__ and
        // __exit__ resume it (untraced contextlib code in between)
        if (!result) return;
        py::Ref gen = py::Ref::steal(PyObject_GetAttrString(result, "gen"));
        if (!gen || !PyGen_Check(gen.get())) {
            PyErr_Clear();
            return m_cap.internal_error("a @contextmanager object without its generator");
        }
        GenRecord g;
        g.code = p.callee.code;
        g.call = p;
        g.call.callee.kind = CallKind::Generator;
        g.func_value = p.callee_value;
        g.object = gen.get();
        int it = m_cap.new_value(ValueKind::Iterator, gen.get(), name + "(...) generator");
        m_cap.v(it).iter_kind = IterKind::Generator;
        m_cap.v(it).iter_source = static_cast<int>(m_gens.size());
        m_gens.push_back(std::move(g));
        int cm = m_cap.new_value(ValueKind::GenContext, result, name + "(...)");
        m_cap.v(cm).items = {it};
        return push_out(cm);
    }
    case CallKind::GenContextExit: {
        if (!result) return;  // the generator raised, or did not stop: followed as any error
        for (int a : p.in)
            if (m_cap.v(a).real.get() != Py_None || p.kwnames)
                return m_cap.internal_error("__exit__ of a @contextmanager with an exception");
        GenRecord* g = generator_of(m_cap.v(p.callee_value).items[0]);
        if (!g || !g->done || result != Py_False)
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "`" + name + "` did not end its generator at the end of the with "
                              "block", "yield exactly once in a @contextmanager function");
        return push_out(m_cap.const_value(result));
    }
    case CallKind::EnvRead:
        if (p.kwnames || p.in.empty() || p.in.size() > 2)
            return m_cap.fail(breaks::kUnsupportedCallee, "`" + name + "()` with these arguments",
                              "pass the name and the default by position");
        return push_out(environ_read(p.in[0], result,
                                     p.in.size() == 2 ? p.in[1] : m_cap.const_value(Py_None)));
    case CallKind::MakePartial:
        if (!result || Py_TYPE(result) != functools_partial_type())
            return m_cap.internal_error("functools.partial() did not make a partial");
        push_out(make_partial(p, result));
        return;
    case CallKind::Super: {
        if (!result || Py_TYPE(result) != &PySuper_Type)
            return m_cap.internal_error("super() did not make a super object");
        int s = m_cap.new_value(ValueKind::Super, result, "super()");
        m_cap.v(s).items = p.in;  // {class, object}
        push_out(s);
        return;
    }
    case CallKind::TypeOf:
        if (p.in.size() != 1 || p.kwnames)
            return m_cap.fail(breaks::kUnsupportedCallee, "`type()` that makes a class",
                              "define the class outside the compiled function");
        push_out(m_cap.const_value(result));
        return;
    case CallKind::ContextExit:
        m_cap.exit_context();  // __exit__ itself runs in the enclosing block
        push_out(record_call(p, result, false, false));
        return;
    case CallKind::Iteration:
    case CallKind::DictMethod: {
        size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
        if (p.callee.kind == CallKind::DictMethod && name == "update") {
            size_t npos = p.in.size() - nkw;
            const Value& d = m_cap.v(p.in[0]);
            if (npos > 2 || (d.kind != ValueKind::FreshDict && !p.dict_before))
                return m_cap.fail(breaks::kUnsupportedCallee, "dict.update() on " + d.label,
                                  "update a dict made in the call or passed in, from one dict");
            std::vector<std::pair<int, int>> keywords;
            for (size_t k = 0; k < nkw; ++k)
                keywords.emplace_back(m_cap.const_value(PyTuple_GET_ITEM(p.kwnames, static_cast<Py_ssize_t>(k))),
                                      p.in[npos + k]);
            int r = dict_update(p.in[0], npos == 2 ? p.in[1] : -1, keywords, p.dict_before.get());
            if (r >= 0) push_out(r);
            return;
        }
        if (nkw == 0) return push_out(iter_call(name, p.in, result, p.had_key));
        if (nkw == 1 && (name == "itertools.zip_longest" || name == "itertools.accumulate")) {
            // zip_longest(a, b, fillvalue=x), accumulate(xs, initial=0)
            bool fill = name == "itertools.zip_longest";
            if (str(PyTuple_GET_ITEM(p.kwnames, 0)) != (fill ? "fillvalue" : "initial"))
                return m_cap.fail(breaks::kUnsupportedCallee, "`" + name + "` with this keyword",
                                  "pass the arguments by position");
            std::vector<int> pos(p.in.begin(), p.in.end() - 1);
            return push_out(itertools_call(name, pos, result, fill ? p.in.back() : -1,
                                           fill ? -1 : p.in.back()));
        }
        if (name == "enumerate" && nkw == 1 && p.in.size() == 2 &&
            str(PyTuple_GET_ITEM(p.kwnames, 0)) == "start")
            return push_out(iter_call(name, p.in, result));  // enumerate(xs, start=1)
        return m_cap.fail(breaks::kUnsupportedCallee, "`" + name + "` with keyword arguments",
                          "pass the arguments by position");
    }
    default:
        return m_cap.internal_error("call completion for " + name);
    }
}

// Whether an f-string part is made at replay: a number computed there (read from data, a
// symbolic size or one read from a tensor the plan makes), a string made from one, or a shape
// or tuple holding such sizes among constants.
bool Monitor::formatted_at_replay(int id) {
    const Value& v = m_cap.v(id);
    PyObject* o = v.real.get();
    if (v.tensor || !o) return false;
    if (v.dyn_scalar || v.sym_number()) return true;
    if (!(v.kind == ValueKind::FreshTuple && tuple_or_shape(o)) &&
        !(v.kind == ValueKind::FreshList && PyList_CheckExact(o)))  // f"{list(x.shape)}"
        return false;
    bool any = false;
    for (int it : v.items) {
        const Value& iv = m_cap.v(it);
        if (iv.tensor) return false;
        if (iv.dyn_scalar || iv.sym_number()) any = true;
        else if (iv.kind != ValueKind::Const) return false;
    }
    return any;
}

// A call replayed as it is (a torch op, a leaf module, a pure builtin on tensors).
// FORMAT_VALUE (conversion, then format() with the spec) and BUILD_STRING ("".join) as steps
// run at replay; `real` is the string the instruction made (may be null at a break).
// `fn(*args)` (a function of Python's own), called at replay on the replayed values.
bool Monitor::text_at_replay(const Pending& p) {
    const std::string& n = p.callee.name;
    size_t first;  // the arguments to be formatted
    if ((p.callee.kind == CallKind::TypeCtor && n == "str") ||
        (p.callee.kind == CallKind::PureBuiltin && n == "repr"))
        first = 0;
    else if (p.callee.kind == CallKind::PureBuiltin && n == "str.format" && !p.in.empty() &&
             m_cap.v(p.in[0]).kind == ValueKind::Const &&
             PyUnicode_CheckExact(m_cap.v(p.in[0]).real.get()))
        first = 1;  // (the format string)
    else
        return false;
    if (p.kwnames || p.in.size() <= first || (first == 0 && p.in.size() != 1)) return false;
    bool any = false;
    for (size_t i = first; i < p.in.size(); ++i) {
        if (formatted_at_replay(p.in[i])) any = true;
        else if (m_cap.v(p.in[i]).kind != ValueKind::Const) return false;
    }
    return any;
}

int Monitor::call_at_replay(PyObject* fn, const std::vector<int>& args, PyObject* real,
                            const std::string& label) {
    Step s;
    s.kind = StepKind::Call;
    s.args.push_back(Arg::value(fn));
    for (int a : args) {
        Arg x;
        if (!m_cap.arg_of(a, x)) return -1;
        s.args.push_back(std::move(x));
    }
    return m_cap.record(std::move(s), real, label, false);
}

int Monitor::format_step(int opcode, int oparg, const std::vector<int>& in, PyObject* real) {
    auto call = [&](PyObject* fn, std::vector<int> args) {
        return call_at_replay(fn, args, real, "str");
    };
    PyObject* builtins = PyEval_GetBuiltins();
    if (opcode == BUILD_STRING) {
        static PyObject* join = PyObject_GetAttrString(PyUnicode_FromString(""), "join");
        int parts = m_cap.fresh(ValueKind::FreshTuple, in, reals_of(in, false).get());
        return call(join, {parts});
    }
    if (in.empty()) {
        m_cap.internal_error("FORMAT_VALUE without a value");
        return -1;
    }
    int v = in[0];
    static const char* conversions[] = {nullptr, "str", "repr", "ascii"};
    if (const char* conv = conversions[oparg & 0x03]) {
        v = call(PyDict_GetItemString(builtins, conv), {v});
        if (v < 0) return -1;
    }
    std::vector<int> args = {v};
    if ((oparg & 0x04) && in.size() > 1) args.push_back(in[1]);
    return call(PyDict_GetItemString(builtins, "format"), args);
}

int Monitor::number_from_data(Pending& p, PyObject* result) {
    if (result && args_fold(p)) return constant_of(result);  // [Note: tensors of constants]
    int r = record_call(p, result, false, false);
    if (r >= 0) m_cap.v(r).dyn_scalar = true;
    return r;
}

// [Note: numbers from tensor data] `lengths.tolist()` of a 1-D tensor (its length guarded, or
// fixed again when symbolic): a list made in the call whose items are numbers read at replay (the list is made by a
// step, each item taken from it by another), so `for i, n in enumerate(lengths.tolist()):
// h[i, :n]` unrolls over the length and slices by numbers from data, as `int(lengths[i])`
// does. -1 with no failure: not such a call (it is recorded whole, as before).
int Monitor::tolist_numbers(Pending& p, PyObject* result) {
    if (p.in.size() != 1 || p.kwnames || !PyList_CheckExact(result)) return -1;
    int t = p.in[0];
    const Value& tv = m_cap.v(t);
    if (!tv.tensor || tv.dyn_shape) return -1;  // its length depends on data
    if (m_cap.sym_tensor(t)) m_cap.fix_length(t);  // as iterating it: its length fixed again
    Py_ssize_t n = PyList_GET_SIZE(result);
    if (n > 64) return -1;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* it = PyList_GET_ITEM(result, i);
        if (!(PyLong_CheckExact(it) || PyFloat_CheckExact(it))) return -1;  // nested, or bools
    }
    int list = record_call(p, result, false, false);
    if (list < 0) return -1;
    std::vector<int> items;
    for (Py_ssize_t i = 0; i < n; ++i) {
        int r = item_of(list, i, PyList_GET_ITEM(result, i), false);
        if (r < 0) return -1;
        m_cap.v(r).dyn_scalar = true;
        items.push_back(r);
    }
    return m_cap.fresh(ValueKind::FreshList, std::move(items), result);
}

bool Monitor::args_fold(const Pending& p) {
    if (!m_cap.callee_folds(p.callee_value)) return false;
    for (int a : p.in)
        if (!m_cap.folds(a)) return false;
    return true;
}

// A Python value read from data that follows from the guards: numbers and strings are
// constants; lists and tuples (t.tolist()) are made in the call, so each call gets its own.
int Monitor::constant_of(PyObject* o, int depth) {
    if ((PyList_CheckExact(o) || PyTuple_CheckExact(o)) && depth < 8) {
        std::vector<int> items;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(o); ++i)
            items.push_back(constant_of(PySequence_Fast_GET_ITEM(o, i), depth + 1));
        return m_cap.fresh(PyList_CheckExact(o) ? ValueKind::FreshList : ValueKind::FreshTuple,
                           std::move(items), o);
    }
    if (PyDict_CheckExact(o) && depth < 8) {  // dict.fromkeys("ab", 0), a folded dict
        std::vector<int> pairs;
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &pos, &k, &v)) {
            pairs.push_back(m_cap.const_value(k));
            pairs.push_back(constant_of(v, depth + 1));
        }
        return fresh_dict(pairs, o);
    }
    if (PySet_CheckExact(o)) return fresh_set(o);  // of hashable constants
    return m_cap.const_value(o);
}

int Monitor::record_call(Pending& p, PyObject* result, bool dyn_shape, bool graph_op) {
    Step s;
    s.kind = StepKind::Call;
    Arg callee;
    if (!m_cap.arg_of(p.callee_value, callee)) return -1;
    s.args.push_back(callee);
    for (int a : p.in) {
        Arg x;
        if (!m_cap.arg_of(a, x)) return -1;
        s.args.push_back(std::move(x));
    }
    s.kwnames = py::Ref::borrow(p.kwnames);
    {
        size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
        std::vector<PyObject*> kwvalues;
        for (size_t i = p.in.size() - nkw; i < p.in.size(); ++i)
            kwvalues.push_back(m_cap.v(p.in[i]).real.get());
        s.effect = op_has_effects(p.callee, m_cap.v(p.callee_value).real.get(), p.kwnames,
                                  kwvalues.data());
        s.draws = s.effect && op_draws(p.callee, m_cap.v(p.callee_value).real.get(), p.kwnames,
                                       kwvalues.data());
        if (p.hidden_code && !runs_hidden_code(p.callee)) {
            // torch.utils.checkpoint(block, x): the block's Python runs inside the op, with
            // whatever it writes or draws; never part of a compiled graph (a trace of it ran
            // the block twice, drawing twice)
            s.effect = true;
            graph_op = false;
        }
        if (p.callee.kind == CallKind::TorchOp &&
            (p.callee.op == "register_hook" || p.callee.op == "register_prehook")) {
            for (int a : p.in)  // `y.register_hook(f)` in the call: backward() may run f
                if (PyCallable_Check(m_cap.v(a).real.get()))
                    m_hooks_made.push_back(m_cap.v(a).real);
            py::Ref id = py::Ref::steal(result ? PyObject_GetAttrString(result, "id") : nullptr);
            if (id && PyLong_Check(id.get())) m_hook_ids_made.insert(PyLong_AsLong(id.get()));
            PyErr_Clear();
        }
        // [Note: code that ran inside a call]: the Python that backward() (hooks, custom
        // Functions) or step(closure) ran, and hooks registered in the call, may have
        // changed what they reach; [Note: library calls that change state]: so may an
        // optimizer's or scheduler's own step(), through its arguments
        std::vector<PyObject*> roots;
        std::vector<py::Ref> held;  // keeps what backward_hooks read alive
        if (p.hidden_code) {
            watch_call(false);
            if (m_ran_overflow) {
                m_cap.fail(breaks::kMutatedThenRead,
                           "`" + p.callee.name + "()` ran more Python than the capture follows",
                           "call it outside the compiled function");
                return -1;
            }
            for (const py::Ref& r : m_ran) roots.push_back(r.get());
            for (PyObject* h : backward_hooks(p, held)) roots.push_back(h);
            // and what it was given (a callable object's own state: `self.n += 1` in __call__)
            for (int a : p.in) roots.push_back(m_cap.v(a).real.get());
            if (runs_hidden_code(p.callee)) m_cap.guard_tensor_hooks();  // (only backward
                                                                          // runs tensor hooks)
        }
        std::string call = p.callee.op + "()";
        if (runs_hidden_code(p.callee) || p.callee.op == "zero_grad") m_grads_changed = true;
        if (p.callee.op == "zero_grad") m_reached_leaves.clear();  // (set_to_none or not)
        if (p.callee.changes_state) {
            for (int a : p.in) roots.push_back(m_cap.v(a).real.get());
            PyObject* fn = m_cap.v(p.callee_value).real.get();
            if (PyMethod_Check(fn)) roots.push_back(PyMethod_GET_SELF(fn));
            // a method (`sched.step()`): named by the receiver's class and the user's label
            call = p.callee.name + "()";
            if (!p.in.empty() && p.callee.name.find('.') != std::string::npos &&
                PyObject_HasAttrString(m_cap.v(p.in[0]).real.get(), p.callee.op.c_str()))
                call = py::type_name(m_cap.v(p.in[0]).real.get()) + "." + p.callee.op +
                       "()` on `" + m_cap.v(p.in[0]).label;
        }
        if (!roots.empty()) m_cap.changed_by_call(roots, call, p.hidden_code);
        if (s.effect) {
            int t = op_inplace_target(p.callee, m_cap.v(p.callee_value).real.get(), p.kwnames,
                                      kwvalues.data(), p.in.size() - kwvalues.size());
            if (t >= 0 && !p.callee.bound_self) s.mutates = static_cast<int8_t>(1 + t);
        }
    }
    // The leaf module's training flag decides what it computes: guarded, unless the call set
    // it itself (`m.eval()` earlier in the call: a review probe found the written flag
    // guarded at entry, which failed on every call) to a value the guards decide
    auto written = m_cap.overlay().find({p.callee_value, "training"});
    if (p.callee.kind == CallKind::LeafModule && written != m_cap.overlay().end() &&
        !m_cap.folds(written->second) && m_cap.v(written->second).kind != ValueKind::Input) {
        m_cap.fail(breaks::kUnsupportedCallee,
                   "`" + m_cap.v(p.callee_value).label + "` is called after its training flag "
                   "was set to a value computed in the call",
                   "set the flag from an argument or a constant");
        return -1;
    }
    if (p.callee.kind == CallKind::LeafModule) m_cap.entry_hooks_of_module(p.callee_value, m_hook_ids_made);
    if (p.callee.kind == CallKind::LeafModule && grad_mode_enabled() &&
        m_cap.v(p.callee_value).kind == ValueKind::Input &&
        std::find(m_grad_leaves.begin(), m_grad_leaves.end(), p.callee_value) == m_grad_leaves.end())
        m_grad_leaves.push_back(p.callee_value);
    if (p.callee.kind == CallKind::LeafModule && m_cap.v(p.callee_value).kind == ValueKind::Input &&
        written == m_cap.overlay().end() &&
        !leaf_module_ignores_training(m_cap.v(p.callee_value).real.get())) {
        PyObject* tr = PyObject_GetAttrString(m_cap.v(p.callee_value).real.get(), "training");
        if (tr) {
            m_cap.input_child(p.callee_value, AccessKind::ModuleAttr, 0,
                              interned("training"), ".training", tr);
            Py_DECREF(tr);
        } else {
            PyErr_Clear();
        }
    }
    std::string label = p.callee.kind == CallKind::LeafModule
                            ? m_cap.v(p.callee_value).label + "(...)"
                            : p.callee.name + "(...)";
    int r = m_cap.record(std::move(s), result, label, graph_op);
    m_cap.v(r).dyn_shape = m_cap.v(r).dyn_shape || dyn_shape;
    if (m_cap.v(r).tensor && rank_may_change(p))  // [Note: ranks that may change]
        m_cap.v(r).rank_varies = true;
    {  // a tensor whose shape this op changes in place
        const std::string& op = p.callee.op;
        bool reshapes = p.callee.kind == CallKind::TorchOp && !p.in.empty() &&
                        (op == "set_" || op == "resize_" || op == "resize_as_" ||
                         op == "as_strided_" || op == "unsqueeze_" || op == "squeeze_" ||
                         op == "t_" || op == "transpose_" || op == "swapdims_" ||
                         op == "swapaxes_");
        if (reshapes) m_cap.reshaped_in_place(p.in[0]);
        if (p.callee.kind == CallKind::TorchOp && !p.in.empty() &&
            (op == "requires_grad_" || op == "detach_"))
            m_cap.metadata_changed(p.in[0]);
    }
    // `out=t` resizes t to the result: its sizes are the result's from here on (symbolic or
    // data-dependent alike), not the ones it was made with.
    size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
    for (size_t k = 0; k < nkw; ++k) {
        int out = p.in[p.in.size() - nkw + k];
        if (str(PyTuple_GET_ITEM(p.kwnames, static_cast<Py_ssize_t>(k))) != "out" ||
            !m_cap.v(out).tensor)
            continue;
        if (m_cap.v(out).kind == ValueKind::Input) {  // resized to the result
            m_cap.reshaped_in_place(out);
            continue;
        }
        const Value& res = m_cap.v(r);
        bool sym = res.sym, sym_all = res.sym_all, dyn = res.dyn_shape;
        auto deps = res.sym_deps;
        Value& o = m_cap.v(out);
        o.sym = sym;
        o.sym_all = sym_all;
        o.sym_deps = std::move(deps);
        o.dyn_shape = dyn;
    }
    return r;
}

// [Note: ranks that may change] in capture.cpp: squeeze() of a tensor whose sizes may be 1 at
// replay, and ops whose rank a number read at replay gives.
bool Monitor::rank_may_change(const Pending& p) {
    if (p.callee.kind != CallKind::TorchOp) return false;
    const std::string& op = p.callee.op;
    bool squeeze = op == "squeeze" || op == "squeeze_";
    if (!squeeze && op != "flatten" && op != "tensordot") return false;
    std::vector<int> args = p.in;
    if (p.callee.bound_self) args.push_back(p.callee_value);
    for (int a : args) {
        const Value& x = m_cap.v(a);
        PyObject* o = x.real.get();
        if (PyCFunction_Check(o) && PyCFunction_GET_SELF(o) && is_tensor(PyCFunction_GET_SELF(o))) {
            // the bound method's tensor: its value is the one the method was read from
            if (squeeze && x.kind == ValueKind::OpResult) return true;
            continue;
        }
        if (x.tensor) {
            if (squeeze && (x.dyn_shape || (x.kind != ValueKind::Input && x.sym))) return true;
        } else if (x.sym || x.dyn_scalar) {
            return true;  // a dim, or tensordot's dims, read at replay
        }
    }
    return false;
}

// [Note: gradients read by hand] `p.grad` (clipping or measuring gradients by hand). Before
// anything in the call may have changed gradients, the gradient of a tensor passed in is an
// input like its other attributes (guarded: None, or a tensor of these sizes). After
// backward(), zero_grad() or an optimizer's step (m_grads_changed), it is read at replay: a
// tensor there if a backward() from tensors the call computed reached `p` since the last
// zero_grad() or `.grad =` (m_reached_leaves: the same ops reach the same leaves at replay).
// Otherwise whether it is None is not known before the replay runs (a parameter outside this
// step's loss, a loss passed in): a break (a review probe found `p.grad is not None` replayed
// as True for a gradient cleared between calls).
int Monitor::grad_of(int t, PyObject* name, PyObject* real) {
    const Value& o = m_cap.v(t);
    if (!m_grads_changed && o.kind == ValueKind::Input && o.node >= 0)
        return m_cap.input_child(t, AccessKind::Attr, 0, name, ".grad", real);
    if (!real || real == Py_None || !m_reached_leaves.count(o.real.get())) {
        m_cap.fail(breaks::kUnsupportedAttribute,
                   "`" + o.label + ".grad` is read after a call that changes gradients, and "
                   "whether it is None then is not known before it runs",
                   "read gradients after a backward() of a loss computed in the function, or "
                   "outside the compiled function");
        return -1;
    }
    return attr_at_replay(t, name, real, false);
}

// `obj.name`, read at replay from the replayed object (a step; `op`: part of the graph).
int Monitor::attr_at_replay(int obj, PyObject* name, PyObject* real, bool op) {
    Step s;
    s.kind = StepKind::GetAttr;
    s.name = py::Ref::borrow(name);
    Arg a;
    if (!m_cap.arg_of(obj, a)) return -1;
    s.args = {a};
    return m_cap.record(std::move(s), real, m_cap.v(obj).label + "." + str(name), op);
}

// A bound method passed in or read from an input: its function and self, both guarded.
bool Monitor::split_method(int method, int& func, int& self) {
    PyObject* m = m_cap.v(method).real.get();
    func = m_cap.input_child(method, AccessKind::Attr, 0, interned("__func__"), ".__func__",
                             PyMethod_GET_FUNCTION(m));
    self = m_cap.input_child(method, AccessKind::Attr, 0, interned("__self__"), ".__self__",
                             PyMethod_GET_SELF(m));
    return func >= 0 && self >= 0;
}

// [SECTION] module members -------------------------------------------------------------------

// The parameters of the leaf modules called with autograd on (m_grad_leaves), guarded as
// inputs (their requires_grad among their facts), once a program asks whether something it
// computed requires grad. False with the capture failed.
bool Monitor::guard_leaf_parameters() {
    std::vector<int> leaves;
    leaves.swap(m_grad_leaves);
    for (int leaf : leaves) {
        std::vector<PyObject*> memo;
        std::vector<std::pair<std::string, int>> modules;
        if (!walk_modules(leaf, "", memo, modules)) return false;
        for (const auto& [name, module] : modules) {
            std::vector<std::pair<PyObject*, int>> params;
            if (!dict_entries(module, "_parameters", params)) return false;
        }
    }
    return true;
}

// Module.named_modules(): each module once (by identity), depth first, with its dotted name.
bool Monitor::walk_modules(int module, const std::string& prefix, std::vector<PyObject*>& memo,
                           std::vector<std::pair<std::string, int>>& out) {
    PyObject* obj = m_cap.v(module).real.get();
    if (std::find(memo.begin(), memo.end(), obj) != memo.end()) return true;
    memo.push_back(obj);
    out.emplace_back(prefix, module);
    std::vector<std::pair<PyObject*, int>> children;
    if (!dict_entries(module, "_modules", children)) return false;
    for (const auto& [key, child] : children) {
        if (m_cap.v(child).real.get() == Py_None) continue;
        std::string name = prefix + (prefix.empty() ? "" : ".") + py::str_of(key);
        if (!walk_modules(child, name, memo, out)) return false;
    }
    return true;
}

// A module's `_modules` / `_parameters` / `_buffers`: (key, value) in order, with the keys
// guarded (names, order and count) and each value an input by position.
bool Monitor::dict_entries(int module, const char* dict_name,
                           std::vector<std::pair<PyObject*, int>>& out) {
    auto refuse = [&](const std::string& why) {
        m_cap.fail(breaks::kUnsupportedCallee, m_cap.v(module).label + "." + dict_name + " " + why,
                   "keep the module's standard attributes");
        return false;
    };
    PyObject* d = PyObject_GetAttrString(m_cap.v(module).real.get(), dict_name);
    if (!d) {
        PyErr_Clear();
        return refuse("is missing");
    }
    int dv = m_cap.input_child(module, AccessKind::ModuleAttr, 0, interned(dict_name),
                               std::string(".") + dict_name, d);
    Py_DECREF(d);
    if (dv < 0) return false;
    d = m_cap.v(dv).real.get();
    if (!PyDict_Check(d)) return refuse("is not a dict");
    py::Ref keys = py::Ref::steal(PySequence_Tuple(py::Ref::steal(PyDict_Keys(d)).get()));
    if (m_cap.input_child(dv, AccessKind::DictKeys, 0, nullptr, ".keys()", keys.get()) < 0)
        return false;
    Py_ssize_t pos = 0;
    int i = 0;
    PyObject *k, *val;
    out.clear();
    while (PyDict_Next(d, &pos, &k, &val)) {
        int item = m_cap.input_child(dv, AccessKind::DictValueAt, i, nullptr,
                                     "[" + std::to_string(i) + "]", val);
        ++i;
        if (item < 0) return false;
        out.emplace_back(k, item);
    }
    return true;
}

int Monitor::module_members(const Pending& p, PyObject* generator) {
    const std::string& what = *torch_api().module_member_fn(m_cap.v(p.callee_value).real.get());
    auto refuse = [&](const std::string& why) {
        m_cap.fail(breaks::kUnsupportedCallee, "`" + what + "()` " + why,
                   "call it without arguments, or with recurse= only");
        return -1;
    };
    if (p.in.empty()) return refuse("without a module");
    int self = p.in[0];
    const Value& sv = m_cap.v(self);
    if (sv.kind != ValueKind::Input || !sv.identity)
        return refuse("of " + sv.label + ", a module the capture cannot guard");
    size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
    bool recurse = what != "children" && what != "named_children";
    if (p.in.size() - nkw != 1) return refuse("with positional arguments");
    for (size_t i = 0; i < nkw; ++i) {
        std::string k = py::str_of(PyTuple_GET_ITEM(p.kwnames, static_cast<Py_ssize_t>(i)));
        const Value& a = m_cap.v(p.in[1 + i]);
        if (k != "recurse" || a.kind != ValueKind::Const || !PyBool_Check(a.real.get()))
            return refuse("with `" + k + "=`");
        recurse = a.real.get() == Py_True;
    }
    bool named = what.rfind("named_", 0) == 0;
    std::string kind = named ? what.substr(6) : what;
    std::vector<PyObject*> memo;
    std::vector<std::pair<std::string, int>> modules;
    if (kind == "modules" || recurse) {
        if (!walk_modules(self, "", memo, modules)) return -1;
    } else {
        modules.emplace_back("", self);
    }
    std::vector<std::pair<std::string, int>> members;  // (name, value)
    if (kind == "modules") {
        members = modules;
    } else {
        // children: the direct submodules; parameters / buffers: each module's own dict.
        const char* dict_name = kind == "children" ? "_modules" : kind == "parameters" ? "_parameters" : "_buffers";
        std::vector<PyObject*> seen;
        std::vector<std::pair<PyObject*, int>> entries;
        for (const auto& [prefix, mod] : modules) {
            if (!dict_entries(mod, dict_name, entries)) return -1;
            for (const auto& [key, m] : entries) {
                PyObject* val = m_cap.v(m).real.get();
                if (val == Py_None) continue;
                // Duplicates (tied weights, a module registered twice) are yielded once, as
                // Module does; identities are guarded so the same ones stay the same.
                m_cap.guard_identity(m);
                if (std::find(seen.begin(), seen.end(), val) != seen.end()) continue;
                seen.push_back(val);
                members.emplace_back(prefix + (prefix.empty() ? "" : ".") + py::str_of(key), m);
            }
        }
    }
    int it = m_cap.new_value(ValueKind::Iterator, generator, sv.label + "." + what + "()");
    Value& iv = m_cap.v(it);
    iv.iter_kind = IterKind::Flat;
    iv.iter_width = named ? 2 : 1;
    for (const auto& [name, member] : members) {
        if (named) {
            py::Ref n = py::Ref::steal(PyUnicode_FromString(name.c_str()));
            m_cap.v(it).items.push_back(m_cap.const_value(n.get()));
        }
        m_cap.v(it).items.push_back(member);
    }
    return it;
}

// [SECTION] with blocks ------------------------------------------------------------------------

void Monitor::note_context_type(PyObject* t) {
    std::string n = reinterpret_cast<PyTypeObject*>(t)->tp_name;
    bool grad = n.find("grad") != std::string::npos;
    m_grad_state_set = m_grad_state_set || grad;
    m_other_state_set = m_other_state_set || (!grad && n.find("nullcontext") == std::string::npos);
    if (grad) m_cap.changes_grad_mode();
}

// [Note: user context managers] `with Timer(log):`, `with self.flags.off():`: a with block over an
// object (passed in, or made in the call) of a class of the user's whose __enter__ and __exit__
// are Python functions. BEFORE_WITH's call of __enter__ is traced as a hook of the object (its
// writes, reads and result followed like any callee's), and the __exit__ it pushes is a
// BoundMethod value {the class's __exit__, the object}, so the normal exit's
// `exit(None, None, None)` is traced as a method call too. The block is also a plan context
// whose __exit__ is read from the object at replay (`getattr(obj, '__exit__')`): when a step
// inside raises at replay, Plan::unwind calls it with the exception, as the with block's cleanup
// would; a plan that declines does not call it (PlanContext::user: what __enter__ did were
// steps, undone or not yet made). A class whose __exit__ may return something true (suppress
// the exception: a return of anything but a None or False constant) breaks (MB004), since the
// plan cannot go on after a suppressed exception. A block entered before a resumed capture
// began is reopened the same way (Monitor::reopen_with_block).
bool Monitor::user_context_manager(Pending& p) {
    if (p.in.empty()) return false;
    const Value& c = m_cap.v(p.in[0]);
    if ((c.kind != ValueKind::Input && c.kind != ValueKind::FreshObject) || c.tensor || !c.real)
        return false;
    return user_context_class(c.real.get(), c.label);
}

// Whether `obj`'s class is a context manager of the user's that the capture follows; one whose
// __exit__ may suppress an exception fails the capture (and gives false).
bool Monitor::user_context_class(PyObject* obj, const std::string& label) {
    PyTypeObject* type = Py_TYPE(obj);
    PyObject* enter = _PyType_Lookup(type, interned("__enter__"));
    PyObject* exit = _PyType_Lookup(type, interned("__exit__"));
    if (!enter || !exit || !PyFunction_Check(enter) || !PyFunction_Check(exit)) return false;
    auto* code = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(exit));
    if (!py::code_is_plain_function(code)) return false;
    // every return gives None or False: RETURN_CONST, or RETURN_VALUE right after a LOAD_CONST
    // and reached by no jump (`return True if c else None` jumps to one RETURN_VALUE from two
    // LOAD_CONSTs)
    std::vector<int> targets;
    for (int at = 0; at < Py_SIZE(code);) {
        py::Instruction ins = py::code_instruction_at(code, at);
        if (ins.opcode == FOR_ITER || ins.opcode == SEND || ins.opcode == JUMP_FORWARD ||
            ins.opcode == JUMP_BACKWARD || ins.opcode == JUMP_BACKWARD_NO_INTERRUPT ||
            ins.opcode == POP_JUMP_FORWARD_IF_TRUE || ins.opcode == POP_JUMP_FORWARD_IF_FALSE ||
            ins.opcode == POP_JUMP_FORWARD_IF_NONE || ins.opcode == POP_JUMP_FORWARD_IF_NOT_NONE ||
            ins.opcode == POP_JUMP_BACKWARD_IF_TRUE || ins.opcode == POP_JUMP_BACKWARD_IF_FALSE ||
            ins.opcode == POP_JUMP_BACKWARD_IF_NONE || ins.opcode == POP_JUMP_BACKWARD_IF_NOT_NONE ||
            ins.opcode == JUMP_IF_TRUE_OR_POP || ins.opcode == JUMP_IF_FALSE_OR_POP)
            targets.push_back(py::jump_target(ins));
        at = py::next_offset(ins);
    }
    int previous = -1;
    PyObject* previous_const = nullptr;
    for (int at = 0; at < Py_SIZE(code);) {
        py::Instruction ins = py::code_instruction_at(code, at);
        bool returns = ins.opcode == RETURN_VALUE || ins.opcode == RETURN_CONST;
        bool jumped_to = std::find(targets.begin(), targets.end(), ins.offset) != targets.end();
        PyObject* value = ins.opcode == RETURN_CONST              ? py::code_const(code, ins.oparg)
                          : previous == LOAD_CONST && !jumped_to ? previous_const
                                                                  : nullptr;
        if (returns && value != Py_None && value != Py_False) {
            m_cap.fail(breaks::kUnsupportedOpcode,
                       "a `with` block over " + label + ", whose " + type->tp_name +
                           ".__exit__ may suppress the exception (it returns a computed value)",
                       "return None from __exit__, or move the with block out of the compiled "
                       "function");
            return false;
        }
        previous = ins.opcode;
        previous_const = ins.opcode == LOAD_CONST ? py::code_const(code, ins.oparg) : nullptr;
        at = py::next_offset(ins);
    }
    return true;
}

// A plan step binding the class's __exit__ (value `fn`) to the object `self` at replay, as the
// with statement does (never through the object's own __getattribute__). -1: failed.
int Monitor::bind_exit(int fn, const Arg& self, PyObject* real, const std::string& label) {
    Arg fa;
    if (!m_cap.arg_of(fn, fa)) return -1;
    Step bind;
    bind.kind = StepKind::Call;
    bind.args = {Arg::value(reinterpret_cast<PyObject*>(&PyMethod_Type)), fa, self};
    return m_cap.record(std::move(bind), real, label, false);
}

// After a user's __enter__ returned (traced): BEFORE_WITH's two results, the __exit__ value and
// what __enter__ gave ([Note: user context managers]).
void Monitor::user_with_enter(ShadowFrame& f, Pending& p) {
    int ctx = p.in[0];
    PyObject* exit = real_stack(f, 1);  // the bound __exit__
    PyObject* fn = _PyType_Lookup(Py_TYPE(m_cap.v(ctx).real.get()), interned("__exit__"));
    if (!exit || !fn || !PyMethod_Check(exit) || PyMethod_GET_FUNCTION(exit) != fn)
        return m_cap.internal_error("a with block's __exit__ is not its class's");
    int fv = m_cap.v(ctx).kind == ValueKind::Input ? class_attr(ctx, interned("__exit__"), fn)
                                                   : class_member(ctx, interned("__exit__"), fn);
    if (fv < 0) return;
    // An object made in the call is made at replay from here on (its later attribute writes
    // replayed on it), so that an unwinding __exit__ sees what eager's would.
    Arg ca;
    if (!m_cap.escape_arg(ctx, ca)) return;
    int unwind = bind_exit(fv, ca, exit, m_cap.v(ctx).label + ".__exit__");
    if (unwind < 0 || !m_cap.enter_context(unwind, false, true)) return;
    int m = m_cap.new_value(ValueKind::BoundMethod, exit, m_cap.v(ctx).label + ".__exit__");
    m_cap.v(m).items = {fv, ctx};
    m_cap.v(m).ctx_exit = true;
    push(f, m);
    push(f, p.inline_result);
}

void Monitor::with_enter(ShadowFrame& f, int ctx, PyObject* exit, PyObject* entered) {
    if (m_cap.v(ctx).kind == ValueKind::GenContext) {
        // [Note: generator context managers] __enter__ ran the generator to its yield
        GenRecord* g = generator_of(m_cap.v(ctx).items[0]);
        if (!g || g->done || g->yielded.empty())
            return m_cap.fail(breaks::kUnsupportedCallee,
                              "the generator of " + m_cap.v(ctx).label + " did not yield",
                              "yield exactly once in a @contextmanager function");
        int as = g->yielded.back();
        if (m_cap.v(as).real.get() != entered && m_cap.v(as).kind != ValueKind::Const)
            return m_cap.internal_error("a @contextmanager entered another value than it yielded");
        // An error in the block at replay cannot be thrown into the generator (it is not made
        // at replay). When the yield sits in a try with a handler (`try: yield finally: ...`),
        // the block's steps are inside a try of the plan's: one that raises at replay hands
        // the call to eager execution, which runs the handler ([Note: replay errors inside
        // try]; what ran before must be undoable or invisible, else MB014). (A with block
        // around the yield is fine: it is a plan context of its own.)
        int ex = m_cap.new_value(ValueKind::GenContext, exit, m_cap.v(ctx).label + ".__exit__");
        m_cap.v(ex).items = m_cap.v(ctx).items;
        if (g->frame.frame &&
            py::code_offset_reaches_user_handler(g->code, py::frame_offset(g->frame.frame)))
            f.handler_contexts.push_back(ex);
        push(f, ex);
        push(f, as);
        return;
    }
    Value& c = m_cap.v(ctx);
    PyObject* obj = c.real.get();
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(obj));
    if (!torch_api().is_context_type(type))
        return m_cap.fail(breaks::kUnsupportedOpcode,
                          "a `with` block over " + c.label + " (" + py::type_name(obj) + ")",
                          "torch.no_grad(), enable_grad(), set_grad_enabled(), inference_mode(), "
                          "autocast(), nullcontext(), @contextmanager functions and classes "
                          "whose __enter__ and __exit__ are Python functions are captured; "
                          "move other with blocks out of the compiled function");
    note_context_type(type);
    Arg ca;
    if (!m_cap.arg_of(ctx, ca)) return;
    Step get_exit;
    get_exit.kind = StepKind::GetAttr;
    get_exit.name = py::Ref::borrow(interned("__exit__"));
    get_exit.args.push_back(ca);
    int ex = m_cap.record(std::move(get_exit), exit, c.label + ".__exit__", false);
    m_cap.v(ex).ctx_exit = true;
    PyObject* enter_fn = _PyType_Lookup(Py_TYPE(obj), interned("__enter__"));
    if (!enter_fn) return m_cap.internal_error("a context manager without __enter__");
    Step enter;
    enter.kind = StepKind::Call;
    enter.args.push_back(Arg::value(enter_fn));  // the class's function (the type is fixed)
    enter.args.push_back(ca);
    int res = m_cap.record(std::move(enter), entered, c.label + ".__enter__()", false);
    if (!m_cap.enter_context(ex)) return;
    push(f, ex);
    push(f, res);
}

// [SECTION] iteration --------------------------------------------------------------------------
// An iterator value knows where its items come from; FOR_ITER asks next_item() for each one and
// iter_done() at the end, which guards what decided the trip count.

// [Note: iterators passed in]
// A loop whose body broke goes on in a resume function, with its iterator on the stack: an
// object made before that capture started. When it is a list, tuple or range iterator, or a
// zip or enumerate of those (what segments rebuild loop iterators as), the items it has left
// are read without taking them (AccessKind::IterRest, guarded like an input list), so the loop
// is captured on: each item the capture takes is that list's next item, and the plan calls
// next() on the real iterator at that point, so it is where the loop left it for whatever
// runs after the segment (the resumed frame's stack, or a local naming the same iterator).
// Any other use of the iterator than a loop over it (list(it), zip(it, ...)) breaks as
// before. Without this, each iteration after the break was a segment of its own that only
// called next() (MB004).
int Monitor::input_iterator(int value) {
    if (m_cap.v(value).kind != ValueKind::Input || m_cap.v(value).tensor ||
        m_cap.v(value).node < 0)
        return -1;
    py::Ref real = m_cap.v(value).real;
    // The guards read the items left when the call begins: a list this call changed before
    // the loop went on holds others now (a review probe: `l[-1] = y` after the break)
    std::vector<PyObject*> lists;
    iterator_lists(real.get(), lists);
    for (PyObject* l : lists)
        if (m_cap.input_changed(l)) {
            m_cap.fail(breaks::kMutatedThenRead,
                       "a loop resumed after a graph break goes on over a list that was "
                       "changed after the break",
                       "change the list after the loop, or loop over a copy of it");
            return -1;
        }
    py::Ref rest = py::Ref::steal(iterator_rest(real.get()));
    if (!rest) return -1;
    std::string label = m_cap.v(value).label;
    int src = m_cap.input_child(value, AccessKind::IterRest, 0, nullptr, ".<items left>",
                                rest.get());
    if (src < 0) return -1;
    int it = m_cap.new_value(ValueKind::Iterator, real.get(), label);
    Value& iv = m_cap.v(it);
    iv.iter_kind = IterKind::InputSeq;
    iv.iter_source = src;
    iv.iter_advance = value;
    return it;
}

// The same item, as a loop would tell: the same object, or equal plain numbers and strings
// (a range's iterator makes each int anew).
static bool same_item(PyObject* a, PyObject* b) {
    if (a == b) return true;
    if (Py_TYPE(a) != Py_TYPE(b) ||
        !(PyLong_CheckExact(a) || PyFloat_CheckExact(a) || PyUnicode_CheckExact(a)))
        return false;
    return same_constant(a, b);
}

// The items an iterator passed in had left are read when the capture begins, and the plan gives
// those to the loop (the guards read them the same way at each call). The loop's body may
// change the container under the iterator (`l[-1] = y`, `l.pop()`, through any name): from
// then on the real iterator yields what the list holds now, and a replay would still give the
// items read at entry (a review probe). So each item the real loop took must be the one read
// at entry, and the loop must run out where they did (`real` null: it ran out); else the loop
// breaks here, and goes on from the list as it is now.
bool Monitor::rest_item_is(int rest, int pos, PyObject* real) {
    PyObject* items = m_cap.v(rest).real.get();
    Py_ssize_t n = PyList_Check(items) ? PyList_GET_SIZE(items) : -1;
    bool same;
    if (!real) {
        same = pos == n;
    } else if (pos < 0 || pos >= n) {
        same = false;
    } else {
        PyObject* was = PyList_GET_ITEM(items, pos);
        same = same_item(was, real);
        if (!same && PyTuple_CheckExact(was) && PyTuple_CheckExact(real) &&
            PyTuple_GET_SIZE(was) == PyTuple_GET_SIZE(real)) {
            same = true;  // a zip's or enumerate's row: made anew, its parts are the items
            for (Py_ssize_t k = 0; same && k < PyTuple_GET_SIZE(real); ++k)
                same = same_item(PyTuple_GET_ITEM(was, k), PyTuple_GET_ITEM(real, k));
        }
    }
    if (!same)
        m_cap.fail(breaks::kMutatedThenRead,
                   "a loop resumed after a graph break goes on after the list or tuple it "
                   "iterates was changed inside the loop",
                   "change the container after the loop, or loop over a copy of it");
    return same;
}

// next(it) as a plan step, an effect in program order; `ran_out`: next(it, None), the call
// that found the iterator exhausted.
void Monitor::advance_iterator(int it, bool ran_out) {
    Step s;
    s.kind = StepKind::Call;
    std::vector<int> in = {m_cap.const_value(PyDict_GetItemString(PyEval_GetBuiltins(), "next")), it};
    if (ran_out) in.push_back(m_cap.const_value(Py_None));
    m_cap.record_effect(std::move(s), in);
}

int Monitor::make_iter(int src, PyObject* real_iter) {
    src = as_mapping(src, "__iter__");  // its keys ([Note: objects made in the call])
    if (src < 0) return -1;
    if (real_iter == m_cap.v(src).real.get()) {  // iter(it) is it: an iterator passed in
        int it = input_iterator(src);
        if (it >= 0 || m_cap.failed()) return it;
    }
    Value& s = m_cap.v(src);
    if (s.kind == ValueKind::Iterator) {
        if (!s.iter_view) return src;  // iter(iterator) is the iterator itself
        int it = m_cap.new_value(ValueKind::Iterator, real_iter, s.label);
        Value& iv = m_cap.v(it);
        const Value& view = m_cap.v(src);
        iv.iter_kind = view.iter_kind;
        iv.iter_width = view.iter_width;
        iv.iter_rows = view.iter_rows;
        iv.items = view.items;
        iv.iter_container = view.iter_container;
        iv.iter_method = view.iter_method;
        iv.iter_snapshot = view.iter_snapshot;
        return it;
    }
    IterKind kind;
    int source = src;
    int container = -1;
    std::vector<int> flat;
    if (s.kind == ValueKind::Const || s.kind == ValueKind::FreshSet) {
        kind = IterKind::ConstSeq;  // a set's elements are constants
    } else if (s.kind == ValueKind::FreshList || s.kind == ValueKind::FreshTuple) {
        kind = IterKind::FreshSeq;
    } else if (s.kind == ValueKind::Input && !s.tensor &&
               (PyList_CheckExact(s.real.get()) || PyTuple_CheckExact(s.real.get()))) {
        kind = IterKind::InputSeq;
        if (s.mutated && !m_cap.shadow(src)) return -1;
    } else if (s.kind == ValueKind::Input && s.identity &&
               plain_module_container(s.real.get(), "__iter__")) {
        kind = IterKind::ModuleSeq;
        source = modules_dict(src);
        if (source < 0) return -1;
    } else if (s.kind == ValueKind::Input && s.identity && plain_parameter_container(s.real.get(), "__iter__")) {
        // ParameterList: self[i] for i in range(len(self))
        long n = parameter_list_size(src);
        if (n < 0) return -1;
        for (long i = 0; i < n; ++i) {
            int iv = parameter_list_item(src, i, nullptr);
            if (iv < 0) return -1;
            flat.push_back(iv);
        }
        kind = IterKind::Flat;
    } else if (s.tensor || (s.kind == ValueKind::OpResult &&
                            (PyTuple_Check(s.real.get()) || PyList_Check(s.real.get())))) {
        // (an op's tuple or list: chunk(), split(); not another object an op gave, such as
        // x.storage(), whose length nothing guards)
        std::string why_not;
        if (s.dyn_shape && !speculate_length(src, why_not)) {
            m_cap.fail(breaks::kDynamicShape,
                       "iteration over `" + s.label + "`, whose length depends on data" + why_not,
                       "iterate over a fixed-size tensor, or over a range of a bound with a "
                       "mask");
            return -1;
        }
        if (!s.dyn_shape) m_cap.fix_length(src);  // the trip count is the length: fixed again
        kind = IterKind::OpSeq;
    } else if (s.kind == ValueKind::FreshDict || (s.kind == ValueKind::Input && PyDict_Check(s.real.get()))) {
        if (!dict_view(src, DictView::Keys, flat)) return -1;  // for k in d: its keys
        kind = IterKind::Flat;
        container = src;
    } else {
        m_cap.fail(breaks::kUnsupportedOpcode,
                   "iteration over " + s.label + " (" + py::type_name(s.real.get()) + ")",
                   "iterate over lists, tuples, dicts, ranges, tensors or module lists");
        return -1;
    }
    int it = m_cap.new_value(ValueKind::Iterator, real_iter, "iter(" + m_cap.v(src).label + ")");
    Value& iv = m_cap.v(it);
    iv.iter_kind = kind;
    iv.iter_source = source;
    iv.items = std::move(flat);
    if (container >= 0) mark_live(it, container, nullptr);
    else if (kind == IterKind::ConstSeq && PyAnySet_Check(m_cap.v(src).real.get()))
        mark_live(it, src, nullptr);
    return it;
}

py::Ref Monitor::container_state(PyObject* c) {
    if (PyDict_Check(c) || PyAnySet_Check(c)) {
        py::Ref t = py::Ref::steal(PySequence_Tuple(c));
        if (!t) PyErr_Clear();
        return t;
    }
    if (PyList_Check(c)) return py::Ref::steal(PyLong_FromSsize_t(PyList_GET_SIZE(c)));
    return py::Ref();
}

void Monitor::mark_live(int it, int container, const char* method) {
    Value& iv = m_cap.v(it);
    iv.iter_container = container;
    iv.iter_method = method;
    iv.iter_snapshot = container_state(m_cap.v(container).real.get());
}

int Monitor::next_item(int it, PyObject* real) {
    Value& iter = m_cap.v(it);
    int pos = iter.iter_pos++;
    int src = iter.iter_source;
    switch (iter.iter_kind) {
    case IterKind::ConstSeq: return m_cap.const_value(real);
    case IterKind::FreshSeq:
    case IterKind::InputSeq: {
        if (iter.iter_advance >= 0) {  // [Note: iterators passed in]
            int advance = iter.iter_advance;
            if (!rest_item_is(src, pos, real)) return -1;
            int item = m_cap.input_child(src, AccessKind::Item, pos, nullptr,
                                         "[" + std::to_string(pos) + "]", real);
            if (item < 0) return -1;
            advance_iterator(advance, false);
            return m_cap.failed() ? -1 : item;
        }
        if (iter.iter_kind == IterKind::InputSeq && !m_cap.v(src).shadow)
            return m_cap.input_child(src, AccessKind::Item, pos, nullptr,
                                     "[" + std::to_string(pos) + "]", real);
        // The container's items as they are now: Python's list iterator sees changes.
        // A row of dict items that LIST_EXTEND put in the list is a pair the dict view made,
        // not the engine's (`(*a.items(), *b.items())` in torch 2's Module._call_impl).
        const std::vector<int>& items = m_cap.v(src).items;
        int item = pos < static_cast<int>(items.size()) ? items[static_cast<size_t>(pos)] : -1;
        if (item < 0 || !stands_for(item, real)) {
            m_cap.internal_error("iteration over a container out of step");
            return -1;
        }
        m_cap.v(item).real = py::Ref::borrow(real);
        return item;
    }
    case IterKind::ModuleSeq:
        return m_cap.input_child(src, AccessKind::DictValueAt, pos, nullptr,
                                 "[" + std::to_string(pos) + "]", real);
    case IterKind::OpSeq: return item_of(src, pos, real);
    case IterKind::Generator:  // for x in g: the item the loop's next() made it yield
    case IterKind::Map: {      // for y in map(f, xs): what the call next() made returned
        if (iter.iter_kind == IterKind::Map && m_maps[static_cast<size_t>(src)].opaque &&
            static_cast<size_t>(pos) == m_maps[static_cast<size_t>(src)].results.size() &&
            !opaque_step(m_maps[static_cast<size_t>(src)], real))
            return -1;  // (a map of a torch op: this call recorded now that its result is known)
        const std::vector<int>& got = iter.iter_kind == IterKind::Map
                                          ? m_maps[static_cast<size_t>(src)].results
                                          : m_gens[static_cast<size_t>(src)].yielded;
        // (a folded map's results are equal to the real ones, not the same objects)
        bool folded = iter.iter_kind == IterKind::Map && !m_maps[static_cast<size_t>(src)].code;
        if (pos >= static_cast<int>(got.size()) ||
            (folded ? PyObject_RichCompareBool(m_cap.v(got[static_cast<size_t>(pos)]).real.get(),
                                               real, Py_EQ) != 1
                    : m_cap.v(got[static_cast<size_t>(pos)]).real.get() != real)) {
            PyErr_Clear();
            m_cap.internal_error("a generator out of step with its loop");
            return -1;
        }
        return got[static_cast<size_t>(pos)];
    }
    case IterKind::Flat: {
        size_t w = static_cast<size_t>(iter.iter_width), at = static_cast<size_t>(pos) * w;
        if (at + w > iter.items.size()) {
            m_cap.internal_error("iteration past the known items");
            return -1;
        }
        // The items were read when the loop began: a dict the body changes (`d[k] = y` for a
        // key still to come) yields others now, which the plan would not give (a review probe)
        auto changed = [&] {
            m_cap.fail(breaks::kMutatedThenRead,
                       "`" + iter.label + "` yields another item than the one it held when the "
                       "loop began: the loop's body changed it",
                       "change the container after the loop, or loop over a copy of it");
            return -1;
        };
        if (w == 1 && !iter.iter_rows) {
            if (!same_item(m_cap.v(iter.items[at]).real.get(), real)) return changed();
            return iter.items[at];
        }
        if (PyTuple_Check(real) && static_cast<size_t>(PyTuple_GET_SIZE(real)) == w)
            for (size_t k = 0; k < w; ++k)
                if (!same_item(m_cap.v(iter.items[at + k]).real.get(), PyTuple_GET_ITEM(real, k)))
                    return changed();
        return m_cap.fresh(ValueKind::FreshTuple,
                           std::vector<int>(iter.items.begin() + static_cast<long>(at),
                                            iter.items.begin() + static_cast<long>(at + w)),
                           real);
    }
    case IterKind::Zip:
    case IterKind::Enumerate: {
        // `real` is the tuple this step yields; each part comes from its own iterator.
        if (!PyTuple_Check(real)) {
            m_cap.internal_error("zip/enumerate did not yield a tuple");
            return -1;
        }
        std::vector<int> inner = m_cap.v(it).items;
        std::vector<int> parts;
        Py_ssize_t k = 0;
        if (m_cap.v(it).iter_kind == IterKind::Enumerate)
            parts.push_back(m_cap.const_value(PyTuple_GET_ITEM(real, k++)));
        for (int sub : inner) {
            int part = next_item(sub, PyTuple_GET_ITEM(real, k++));
            if (part < 0) return -1;
            parts.push_back(part);
        }
        return m_cap.fresh(ValueKind::FreshTuple, parts, real);
    }
    }
    return -1;
}

void Monitor::iter_done(int it) {
    Value& iter = m_cap.v(it);
    switch (iter.iter_kind) {
    case IterKind::InputSeq:
        if (iter.iter_advance >= 0) {
            // The real loop's last next() ran out here; at replay it runs too, with a default
            // (a zip ending takes items from the iterators it holds before one runs out).
            int advance = iter.iter_advance, src = iter.iter_source, n = iter.iter_pos;
            if (!rest_item_is(src, n, nullptr)) return;
            m_cap.guard_len(src, n);
            advance_iterator(advance, true);
            return;
        }
        if (!m_cap.v(iter.iter_source).shadow) m_cap.guard_len(iter.iter_source, iter.iter_pos);
        return;
    case IterKind::ModuleSeq:
        m_cap.guard_len(iter.iter_source, iter.iter_pos);
        return;
    case IterKind::Zip:
    case IterKind::Enumerate: {
        // zip stops at its shortest input: pin the length of every input container.
        std::vector<int> inner = iter.items;
        // an iterator passed in, here or in a zip or enumerate inside (a review probe:
        // enumerate(zip(it, names))): it lost an item to the zip ending, which the replay's
        // next() calls do not take
        std::vector<int> todo = inner;
        for (size_t k = 0; k < todo.size() && k < 256; ++k) {
            const Value& sv = m_cap.v(todo[k]);
            if (sv.iter_advance >= 0)
                return m_cap.fail(breaks::kUnsupportedOpcode,
                                  "zip() ran out over " + sv.label + ", an iterator passed in",
                                  "zip lists or tuples, or loop over the iterator itself");
            if (sv.iter_kind == IterKind::Zip || sv.iter_kind == IterKind::Enumerate)
                todo.insert(todo.end(), sv.items.begin(), sv.items.end());
        }
        if (!zip_ran_out(inner)) return;
        pin_zip_inputs(inner);
        for (int sub : inner) m_cap.v(sub).zipped_by = nullptr;  // its own again
        return;
    }
    default:
        return;
    }
}

// zip() ends when one of its iterators runs out, after taking an item from each before it:
// those lost that item (a later list(it) does not see it). iter_left tells which ran out;
// take_one moves an iterator past an item it gave that nobody saw (a map of a torch op, whose
// call left no trace, has it recorded; a zip or enumerate passes it on to what it wraps);
// zip_ran_out does both for a zip over `inner` that was asked once more and ran out.
int Monitor::iter_left(int sub) {  // 1: items left, 0: none, -1: not known
    const Value& v = m_cap.v(sub);
    size_t pos = static_cast<size_t>(std::max(v.iter_pos, 0));
    switch (v.iter_kind) {
    case IterKind::Generator: {
        const GenRecord& g = m_gens[static_cast<size_t>(v.iter_source)];
        return g.yielded.size() > pos ? 1 : (g.done ? 0 : -1);
    }
    case IterKind::Map:
        return m_maps[static_cast<size_t>(v.iter_source)].steps.size() > pos ? 1 : 0;
    case IterKind::FreshSeq:
        return m_cap.v(v.iter_source).items.size() > pos ? 1 : 0;
    case IterKind::ConstSeq:
    case IterKind::InputSeq:
    case IterKind::ModuleSeq: {
        Py_ssize_t n = PyObject_Length(m_cap.v(v.iter_source).real.get());
        if (n < 0) PyErr_Clear();
        return n < 0 ? -1 : static_cast<size_t>(n) > pos ? 1 : 0;
    }
    case IterKind::Flat:
        return v.items.size() / static_cast<size_t>(std::max(v.iter_width, 1)) > pos ? 1 : 0;
    case IterKind::Enumerate:
        return v.items.empty() ? -1 : iter_left(v.items[0]);
    case IterKind::Zip: {
        const std::vector<int> inner = v.items;
        for (int i : inner) {  // asked in order: the first without items ends it
            int l = iter_left(i);
            if (l != 1) return l;
        }
        return 1;
    }
    default:
        return -1;
    }
}

bool Monitor::take_one(int sub) {
    Value& v = m_cap.v(sub);
    if (v.iter_kind == IterKind::Zip || v.iter_kind == IterKind::Enumerate) {
        const std::vector<int> inner = v.items;
        for (int i : inner)
            if (!take_one(i)) return false;
    } else if (v.iter_kind == IterKind::Map) {
        MapRecord& m = m_maps[static_cast<size_t>(v.iter_source)];
        if (m.opaque && m.results.size() == static_cast<size_t>(v.iter_pos) &&
            m.results.size() < m.steps.size() && !remake_opaque_step(m))
            return false;
    }
    m_cap.v(sub).iter_pos += 1;
    return true;
}

static bool holds_lazy(Capture& cap, int sub, int depth = 0) {
    const Value& v = cap.v(sub);
    if (v.iter_kind == IterKind::Generator || v.iter_kind == IterKind::Map) return true;
    if ((v.iter_kind == IterKind::Zip || v.iter_kind == IterKind::Enumerate) && depth < 16) {
        const std::vector<int> inner = v.items;
        for (int i : inner)
            if (holds_lazy(cap, i, depth + 1)) return true;
    }
    return false;
}

bool Monitor::zip_ran_out(const std::vector<int>& inner) {
    for (int sub : inner) {
        int l = iter_left(sub);
        if (l == 0) {  // this one ran out: what it wraps was asked too, the rest were not
            const Value& v = m_cap.v(sub);
            if (v.iter_kind == IterKind::Zip || v.iter_kind == IterKind::Enumerate) {
                const std::vector<int> nested = v.items;
                return zip_ran_out(nested);
            }
            return true;
        }
        if (l < 0) {
            bool lazy = false;
            for (int i : inner) lazy = lazy || holds_lazy(m_cap, i);
            if (!lazy) return true;
            m_cap.fail(breaks::kUnsupportedOpcode,
                       "zip() ran out over a generator or map whose last item cannot be told",
                       "zip lists or tuples");
            return false;
        }
        if (!take_one(sub)) return false;
    }
    return true;
}

// The lengths a zip's ending relied on, pinned in every input container (nested zips too).
void Monitor::pin_zip_inputs(const std::vector<int>& inner) {
    for (int sub : inner) {
        const Value& sv = m_cap.v(sub);
        if (sv.iter_kind == IterKind::Zip || sv.iter_kind == IterKind::Enumerate) {
            const std::vector<int> nested = sv.items;
            pin_zip_inputs(nested);
        } else if ((sv.iter_kind == IterKind::InputSeq && !m_cap.v(sv.iter_source).shadow) ||
                   sv.iter_kind == IterKind::ModuleSeq) {
            PyObject* o = m_cap.v(sv.iter_source).real.get();
            Py_ssize_t n = PyObject_Length(o);
            if (n < 0) PyErr_Clear();
            m_cap.guard_len(sv.iter_source, n);
        }
    }
}

// The keys, values or (key, value) items of a dict made here or passed in (then its length,
// the values read and the order of its keys are guarded).
bool Monitor::dict_view(int dict, DictView view, std::vector<int>& out) {
    std::vector<int> pairs;
    if (!pairs_of(dict, pairs)) return false;  // (which guards the order of its keys)
    out.clear();
    for (size_t j = 0; j + 1 < pairs.size(); j += 2) {
        if (view != DictView::Values) out.push_back(pairs[j]);
        if (view != DictView::Keys) out.push_back(pairs[j + 1]);
    }
    return true;
}

// itertools over known sequences: the items they yield, worked out here by running the same
// itertools type over the items' positions (chain, product, combinations with or without
// replacement, permutations, islice, pairwise, zip_longest), or over the items themselves when
// they are constants (accumulate); repeat(x, n) is n times x, and starmap(f, rows) is map(f)
// over the rows' columns. `fill` is zip_longest's fillvalue, `initial` accumulate's (or -1).
int Monitor::itertools_call(const std::string& name, const std::vector<int>& args,
                            PyObject* result, int fill, int initial) {
    std::string label = name.substr(10) + "(...)";
    auto refuse = [&](const std::string& what, const std::string& hint) {
        m_cap.fail(breaks::kUnsupportedCallee, what, hint);
        return -1;
    };
    auto flat = [&](std::vector<int> out, int width, bool rows) {
        // a flat list of the items, `width` per step (a tuple each when `rows`)
        int it = m_cap.new_value(ValueKind::Iterator, result, label);
        m_cap.v(it).iter_kind = IterKind::Flat;
        m_cap.v(it).iter_width = std::max(1, width);
        m_cap.v(it).iter_rows = rows;
        m_cap.v(it).items = std::move(out);
        return it;
    };
    if (name == "itertools.repeat") {
        if (args.size() != 2 || !require_const({args[1]}, "`itertools.repeat(x, times)`")) {
            if (!m_cap.failed())
                refuse("`itertools.repeat` without a count (it never ends)",
                       "give the count, or zip with [x] * len(items)");
            return -1;
        }
        Py_ssize_t n = PyLong_AsSsize_t(m_cap.v(args[1]).real.get());
        if (n < 0 && PyErr_Occurred()) PyErr_Clear();
        return flat(std::vector<int>(static_cast<size_t>(std::max<Py_ssize_t>(n, 0)), args[0]), 1, false);
    }
    if (name == "itertools.starmap") {
        std::vector<int> rows;
        if (args.size() != 2 || !items_of(args[1], rows)) return m_cap.failed() ? -1 : refuse(
            "`itertools.starmap` with these arguments", "call starmap(f, rows)");
        std::vector<int> map_args = {args[0]};
        for (size_t r = 0; r < rows.size(); ++r) {
            std::vector<int> row;
            if (!items_of(rows[r], row)) return -1;
            if (r == 0) map_args.resize(1 + row.size(), -1);
            if (row.size() + 1 != map_args.size())
                return refuse("`itertools.starmap` over rows of different lengths",
                              "write a loop");
            for (size_t c = 0; c < row.size(); ++c) {
                int& col = map_args[1 + c];
                if (col < 0) col = m_cap.fresh(ValueKind::FreshList, {}, nullptr);
                m_cap.v(col).items.push_back(row[c]);
            }
        }
        for (size_t c = 1; c < map_args.size(); ++c)  // the columns' own lists, for the record
            m_cap.v(map_args[c]).real = reals_of(m_cap.v(map_args[c]).items, true);
        if (map_args.size() < 2)
            return refuse("`itertools.starmap` over no rows or empty rows", "write a loop");
        return make_map(map_args, result);
    }
    bool chain = name == "itertools.chain", accumulate = name == "itertools.accumulate";
    size_t nseq = name == "itertools.product" || chain || name == "itertools.zip_longest"
                      ? args.size()
                      : std::min<size_t>(1, args.size());
    std::vector<std::vector<int>> seqs(nseq);
    for (size_t i = 0; i < nseq; ++i)
        if (!items_of(args[i], seqs[i])) return -1;
    std::vector<int> consts(args.begin() + static_cast<long>(nseq), args.end());
    if (initial >= 0) consts.push_back(initial);
    if (!consts.empty() && !require_const(consts, "`" + name + "`")) return -1;
    if (chain) {
        std::vector<int> out;
        for (const std::vector<int>& sq : seqs) out.insert(out.end(), sq.begin(), sq.end());
        return flat(std::move(out), 1, false);
    }
    bool longest = name == "itertools.zip_longest";
    if (longest && fill < 0) fill = m_cap.const_value(Py_None);
    py::Ref kwargs;
    if (longest || initial >= 0) {  // (positions past the end of a shorter one are None)
        kwargs = py::Ref::steal(PyDict_New());
        if (!kwargs || PyDict_SetItemString(kwargs.get(), longest ? "fillvalue" : "initial",
                                            longest ? Py_None : m_cap.v(initial).real.get()) < 0) {
            PyErr_Clear();
            return m_cap.internal_error("keywords for " + name), -1;
        }
    }
    if (accumulate) {  // of constants (offsets from sizes): the running results are constants
        PyObject* func = args.size() > 1 ? m_cap.v(args[1]).real.get() : Py_None;
        CallKind fk = func && func != Py_None ? classify_callee(func).kind : CallKind::PureBuiltin;
        if (fk != CallKind::PureBuiltin)  // a Python function would run from C, untraced
            return refuse("`itertools.accumulate` with the function " + m_cap.v(args[1]).label,
                          "write the loop, or accumulate with an operator (operator.mul)");
        for (int item : seqs[0])
            if (!known(item))
                return refuse("`itertools.accumulate` of " + m_cap.v(item).label +
                                  ", which is not a constant",
                              "add the tensors in a loop, or use torch.cumsum");
    }
    py::Ref call_args = py::Ref::steal(PyTuple_New(static_cast<Py_ssize_t>(args.size())));
    for (size_t i = 0; call_args && i < args.size(); ++i) {
        PyObject* a = m_cap.v(args[i]).real.get();
        if (i < nseq)  // the items themselves for accumulate, else their positions
            a = accumulate ? reals_of(seqs[i], true).release()
                           : PyObject_CallFunction(reinterpret_cast<PyObject*>(&PyRange_Type),
                                                   "n", static_cast<Py_ssize_t>(seqs[i].size()));
        else
            Py_XINCREF(a);
        if (!a) {
            PyErr_Clear();
            return m_cap.internal_error("positions for " + name), -1;
        }
        PyTuple_SET_ITEM(call_args.get(), static_cast<Py_ssize_t>(i), a);
    }
    py::Ref rows = call_args ? py::Ref::steal(PyObject_Call(
                                   reinterpret_cast<PyObject*>(Py_TYPE(result)), call_args.get(),
                                   kwargs.get()))
                             : py::Ref();
    py::Ref list = rows ? py::Ref::steal(PySequence_List(rows.get())) : py::Ref();
    if (!list) {
        PyErr_Clear();
        return m_cap.internal_error("the positions " + name + " yields"), -1;
    }
    std::vector<int> out;
    int width = -1;
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(list.get()); ++r) {
        PyObject* pos = PyList_GET_ITEM(list.get(), r);
        if (accumulate) {
            out.push_back(m_cap.const_value(pos));
            continue;
        }
        if (!PyTuple_Check(pos)) {  // islice: one position per step
            out.push_back(seqs[0][PyLong_AsSize_t(pos)]);
            continue;
        }
        if (width < 0) width = static_cast<int>(PyTuple_GET_SIZE(pos));
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(pos); ++k) {
            PyObject* at = PyTuple_GET_ITEM(pos, k);
            bool product = name == "itertools.product" || longest;
            if (at == Py_None) {  // zip_longest past the end of a shorter one
                out.push_back(fill);
                continue;
            }
            out.push_back(seqs[product ? static_cast<size_t>(k) : 0][PyLong_AsSize_t(at)]);
        }
    }
    if (width == 0)
        return refuse("`" + name + "` yielding empty tuples", "iterate over the items themselves");
    return flat(std::move(out), width, width > 0);
}

// zip(...), enumerate(x[, start]), reversed(x), d.items() / keys() / values() / get(k[, v]).
int Monitor::iter_call(const std::string& name, const std::vector<int>& args, PyObject* result,
                       int had_key) {
    auto fail = [&](const std::string& what) {
        m_cap.fail(breaks::kUnsupportedCallee, what, "iterate over lists, tuples, dicts or ranges");
        return -1;
    };
    if (name == "zip" || name == "enumerate") {
        if (args.empty() || (name == "enumerate" && (args.size() > 2 ||
                                                     (args.size() == 2 &&
                                                      m_cap.v(args[1]).kind != ValueKind::Const))))
            return fail("`" + name + "` with these arguments");
        std::vector<int> inner;
        size_t n = name == "zip" ? args.size() : 1;
        for (size_t i = 0; i < n; ++i) {
            int sub = make_iter(args[i], m_cap.v(args[i]).real.get());
            if (sub < 0) return -1;
            if (m_cap.v(sub).iter_pos != 0)
                return fail("`" + name + "` of an iterator that is already in use");
            m_cap.v(sub).zipped_by = m_frames.empty() ? nullptr : m_frames.back().frame_obj;
            inner.push_back(sub);
        }
        int it = m_cap.new_value(ValueKind::Iterator, result, name + "(...)");
        m_cap.v(it).iter_kind = name == "zip" ? IterKind::Zip : IterKind::Enumerate;
        if (name == "enumerate" && args.size() == 2) {
            m_cap.v(it).iter_start = PyLong_AsSsize_t(m_cap.v(args[1]).real.get());
            if (PyErr_Occurred()) {
                PyErr_Clear();
                return fail("`enumerate` with a start that is not an int");
            }
        }
        m_cap.v(it).items = std::move(inner);
        return it;
    }
    if (name == "map") return make_map(args, result);
    if (name == "reversed") {
        std::vector<int> items;
        if (args.size() != 1 || !items_of(args[0], items)) return -1;
        std::reverse(items.begin(), items.end());
        int it = m_cap.new_value(ValueKind::Iterator, result, "reversed(" + m_cap.v(args[0]).label + ")");
        m_cap.v(it).iter_kind = IterKind::Flat;
        m_cap.v(it).items = std::move(items);
        if (PyList_Check(m_cap.v(args[0]).real.get())) {
            mark_live(it, args[0], "reversed");
        }
        return it;
    }
    if (name.rfind("itertools.", 0) == 0) return itertools_call(name, args, result, -1, -1);
    // dict methods: args[0] is the dict
    if (args.empty()) return fail("dict method without a dict");
    int d = args[0];
    bool known = m_cap.v(d).kind == ValueKind::FreshDict ||
                 (m_cap.v(d).kind == ValueKind::Input && PyDict_Check(m_cap.v(d).real.get()));
    if (!known) return fail("dict." + name + "() on " + m_cap.v(d).label);
    if ((name == "items" || name == "keys" || name == "values") && args.size() == 1) {
        std::vector<int> items;
        if (!dict_view(d, name == "items" ? DictView::Items
                          : name == "keys" ? DictView::Keys
                                           : DictView::Values,
                       items))
            return -1;
        int view = m_cap.new_value(ValueKind::Iterator, result, m_cap.v(d).label + "." + name + "()");
        Value& vv = m_cap.v(view);
        vv.iter_kind = IterKind::Flat;
        vv.iter_width = name == "items" ? 2 : 1;
        vv.iter_view = true;
        vv.items = std::move(items);
        mark_live(view, d, name == "items" ? "items" : name == "keys" ? "keys" : "values");
        return view;
    }
    if (name == "copy" && args.size() == 1 && result && PyDict_Check(result)) {
        // kwargs.copy(), copy.copy(d): a dict made in the call with the same items (an
        // OrderedDict's copy is made again as an OrderedDict)
        std::vector<int> pairs;
        if (!dict_view(d, DictView::Items, pairs)) return -1;
        return fresh_dict(pairs, result);
    }
    if (name == "get" && (args.size() == 2 || args.size() == 3) &&
        m_cap.v(args[1]).kind == ValueKind::Const) {
        PyObject* key = m_cap.v(args[1]).real.get();
        int fallback = args.size() == 3 ? args[2] : m_cap.const_value(Py_None);
        if (m_cap.v(d).kind == ValueKind::FreshDict) {
            int at = fresh_dict_slot(d, key);
            return at >= 0 ? m_cap.v(d).items[static_cast<size_t>(at)] : fallback;
        }
        if (m_cap.v(d).mutated && !m_cap.v(d).keyed_writes)
            return fail("dict.get() after this function changed " + m_cap.v(d).label);
        int hit = dict_lookup(d, key);
        return hit == m_cap.null_value() ? fallback : hit;
    }
    if (name == "setdefault" && (args.size() == 2 || args.size() == 3) &&
        m_cap.v(args[1]).kind == ValueKind::Const) {
        // stats.setdefault("history", []).append(x)
        PyObject* key = m_cap.v(args[1]).real.get();
        int fallback = args.size() == 3 ? args[2] : m_cap.const_value(Py_None);
        if (m_cap.v(d).kind == ValueKind::FreshDict) {
            int at = fresh_dict_slot(d, key);
            if (at >= 0) return m_cap.v(d).items[static_cast<size_t>(at)];
            set_fresh_item(d, args[1], fallback);
            return fallback;
        }
        if (m_cap.v(d).mutated && !m_cap.v(d).keyed_writes)
            return fail("dict.setdefault() after this function changed " + m_cap.v(d).label);
        int written = written_item(d, key);
        if (written >= 0) return written;
        if (had_key < 0) return fail("dict.setdefault() on " + m_cap.v(d).label);
        if (had_key == 1) return dict_item(d, key, result);  // the key was there: nothing changed
        m_cap.guard_no_key(d, key);
        write_input_item(d, args[1], fallback, true);
        return fallback;
    }
    if (name == "pop" && (args.size() == 2 || args.size() == 3) &&
        m_cap.v(args[1]).kind == ValueKind::Const) {
        // kwargs.pop("scale", 1.0): the value, or the default when the key was missing
        int fallback = args.size() == 3 ? args[2] : -1;
        if (had_key < 0 && m_cap.v(d).kind != ValueKind::FreshDict)
            return fail("dict.pop() on " + m_cap.v(d).label);
        int got = remove_dict_item(d, args[1], had_key == 1 ? result : nullptr, true);
        if (got == m_cap.null_value() && fallback >= 0) return fallback;
        return got;
    }
    if (name == "update" && args.size() == 2 && m_cap.v(d).kind == ValueKind::FreshDict)
        return dict_update(d, args[1], {}, nullptr);  // losses.update(detector_losses)
    return fail("dict." + name + "() on " + m_cap.v(d).label);
}

// d.update(other, name=v, ...): other's items (a dict made in the call or passed in) in its
// order, then the keywords, each set as by `d[key] = value`. `d` is a dict made in the call, or
// one passed in whose items before the call were `before` (which keys the update adds).
int Monitor::dict_update(int d, int other, const std::vector<std::pair<int, int>>& keywords,
                         PyObject* before) {
    std::vector<int> pairs;
    if (other >= 0) {
        const Value& o = m_cap.v(other);
        if (o.kind != ValueKind::FreshDict &&
            !(o.kind == ValueKind::Input && PyDict_Check(o.real.get()))) {
            m_cap.fail(breaks::kUnsupportedCallee, "dict.update() from " + o.label,
                       "update from a dict, or set the items one by one");
            return -1;
        }
        if (!dict_view(other, DictView::Items, pairs)) return -1;
    }
    for (const auto& [key, value] : keywords) {
        pairs.push_back(key);
        pairs.push_back(value);
    }
    bool fresh = m_cap.v(d).kind == ValueKind::FreshDict;
    for (size_t j = 0; j + 1 < pairs.size(); j += 2) {
        if (m_cap.v(pairs[j]).kind != ValueKind::Const) {
            m_cap.fail(breaks::kUnsupportedCallee, "dict.update() with a key that is not a constant",
                       "use constant keys");
            return -1;
        }
        if (fresh) {
            set_fresh_item(d, pairs[j], pairs[j + 1]);
            continue;
        }
        PyObject* k = m_cap.v(pairs[j]).real.get();
        bool added = written_item(d, k) < 0 && PyDict_Contains(before, k) == 0;
        PyErr_Clear();
        write_input_item(d, pairs[j], pairs[j + 1], added);
    }
    return m_cap.const_value(Py_None);
}

// [SECTION] annotation rules -------------------------------------------------------------------

// The globals dict of a frame as a value: the entry frame's `G`, a traced function's
// `.__globals__`, or (code reached without a path, e.g. a function made during the call) the
// module dict itself, held by the guard tree (module dicts live as long as their modules).
int Monitor::frame_globals_value(ShadowFrame& f) {
    PyObject* globals = py::frame_globals(f.frame);
    if (globals == py::frame_globals(m_frames.front().frame))
        return m_cap.input_root(AccessKind::GlobalsDict, 0, nullptr, "G", globals);
    if (f.func_value >= 0 && m_cap.v(f.func_value).node >= 0)
        return m_cap.input_child(f.func_value, AccessKind::Attr, 0, interned("__globals__"),
                                 ".__globals__", globals);
    PyObject* mod = PyDict_GetItemString(globals, "__name__");
    std::string name = mod && PyUnicode_Check(mod) ? str(mod) : std::string("<module>");
    return m_cap.constant_root(globals, "sys.modules['" + name + "'].__dict__");
}

int Monitor::load_global(ShadowFrame& f, PyObject* name) {
    bool root_globals = py::frame_globals(f.frame) == py::frame_globals(m_frames.front().frame);
    if (root_globals) {
        auto it = m_cap.global_overlay().find(str(name));
        if (it != m_cap.global_overlay().end()) return it->second;
        if (m_cap.global_changed(py::frame_globals(f.frame), name, "G['" + str(name) + "']"))
            return -1;
    }
    PyObject* real = PyDict_GetItemWithError(py::frame_globals(f.frame), name);
    if (real) {
        if (root_globals)
            return m_cap.input_root(AccessKind::Global, 0, name, "G['" + str(name) + "']", real);
        if (f.func_value >= 0 && m_cap.v(f.func_value).node >= 0)
            return m_cap.input_child(f.func_value, AccessKind::FuncGlobal, 0, name,
                                     ".__globals__['" + str(name) + "']", real);
        int g = frame_globals_value(f);
        if (g < 0) return -1;
        return dict_item(g, name, real);
    }
    PyErr_Clear();
    real = PyDict_GetItemWithError(py::frame_builtins(f.frame), name);
    if (!real) {
        PyErr_Clear();
        m_cap.fail(breaks::kException, "name `" + str(name) + "` is not defined",
                   "define it before calling");
        return -1;
    }
    // A builtin: guard that no global of that name appears later and shadows it.
    int g = frame_globals_value(f);
    if (g < 0) return -1;
    m_cap.guard_no_key(g, name);
    return m_cap.input_root(AccessKind::Builtin, 0, name, "__builtins__['" + str(name) + "']",
                            real);
}

// Whether `cell` is one of the closure cells of the function the root frame runs.
bool Monitor::root_closure_cell(const ShadowFrame& f, PyObject* cell) {
    PyObject* fn = py::frame_function(f.frame);
    PyObject* closure = fn && PyFunction_Check(fn) ? PyFunction_GET_CLOSURE(fn) : nullptr;
    for (Py_ssize_t i = 0; closure && i < PyTuple_GET_SIZE(closure); ++i)
        if (PyTuple_GET_ITEM(closure, i) == cell) return true;
    return false;
}

int Monitor::load_deref(ShadowFrame& f, int index) {
    PyObject* cell = py::frame_local(f.frame, index);
    auto it = m_cap.cells().find(cell);
    if (it != m_cap.cells().end()) {
        // a cell of a frame of the call that a function run inside an op may have rebound
        // (`nonlocal gnorm` in a gradient hook backward() ran, in a block checkpoint ran)
        if (m_cap.read_after_change(cell, local_name(f.code, index))) return -1;
        if (it->second < 0) {
            // The real cell is empty too: the instruction raises NameError, as it does
            // without magpy. Otherwise the shadow lost track of it (an engine bug).
            if (!PyCell_GET(cell))
                fail_unassigned(m_cap, f.code, index);
            else
                m_cap.internal_error("read of an empty closure cell");
            return -1;
        }
        return it->second;
    }
    PyObject* real = PyCell_GET(cell);
    if (!real) {
        fail_unassigned(m_cap, f.code, index);
        return -1;
    }
    std::string name = local_name(f.code, index);
    // a cell that code run by an earlier call may rebind (`nonlocal count` in a hook)
    if (m_cap.read_after_change(cell, name)) return -1;
    int first_free = py::code_nlocalsplus(f.code) - f.code->co_nfreevars;
    int k = index - first_free;
    auto ext = m_cap.external_cells().find(cell);
    if (!f.is_root && ext != m_cap.external_cells().end()) {
        // a cell of the compiled function's closure, passed on to a function made in the call
        // (`lambda kv: order[kv[0]]` with `order` from the compiled function's enclosing scope)
        k = -(ext->second + 2);
        const ShadowFrame& root = m_frames.front();
        name = local_name(root.code, py::code_nlocalsplus(root.code) - root.code->co_nfreevars + k);
    }
    if (f.is_root || ext != m_cap.external_cells().end())
        return m_cap.input_root(AccessKind::ClosureCell, k, nullptr,
                                "closure['" + name + "']", real);
    if (f.func_value >= 0 && m_cap.v(f.func_value).node >= 0)
        return m_cap.input_child(f.func_value, AccessKind::FuncClosure, k, nullptr,
                                 ".__closure__['" + name + "']", real);
    m_cap.fail(breaks::kUnsupportedOpcode, "closure variable `" + name + "` of a method is read",
               "pass it as an argument");
    return -1;
}

// `log.append` read as an attribute of a list, dict, set or tuple (passed in or made in the call):
// the method with its object (ValueKind::BoundMethod), called as LOAD_METHOD's form would be.
// CPython 3.11 emits LOAD_ATTR for `x.append(...)` when the module imports a name `x`, and
// `append = out.append` is a common idiom. 0 when `real` is not such a method.
int Monitor::container_method(int obj, PyObject* name, PyObject* real) {
    const Value& o = m_cap.v(obj);
    PyObject* self = o.real.get();
    if (o.tensor || !self || !real || !PyCFunction_Check(real) ||
        PyCFunction_GET_SELF(real) != self)
        return 0;
    PyTypeObject* t = Py_TYPE(self);
    bool container = t == &PyList_Type || t == &PyDict_Type || t == &PySet_Type ||
                     t == &PyTuple_Type;
    bool value = o.kind == ValueKind::Input || o.kind == ValueKind::FreshList ||
                 o.kind == ValueKind::FreshDict || o.kind == ValueKind::FreshTuple;
    PyObject* descr = container && value ? _PyType_Lookup(t, name) : nullptr;
    if (!descr || Py_TYPE(descr) != &PyMethodDescr_Type) return 0;
    int m = m_cap.new_value(ValueKind::BoundMethod, real, o.label + "." + str(name));
    int d = m_cap.const_value(descr, std::string(t->tp_name) + "." + str(name));
    m_cap.v(m).items = {d, obj};
    return m;
}

int Monitor::load_attr(int obj, PyObject* name, PyObject* real) {
    std::string n = str(name);
    auto it = m_cap.overlay().find({obj, n});
    if (it != m_cap.overlay().end()) return it->second;
    Value& o = m_cap.v(obj);
    if (n == "__class__" && o.real && !PyType_Check(o.real.get()) && real == reinterpret_cast<PyObject*>(Py_TYPE(o.real.get())))
        return m_cap.const_value(real);  // as type(obj): every value's type is guarded or fixed
    if (n == "__dict__" && o.kind == ValueKind::Input && !o.tensor && real && PyDict_Check(real) &&
        !PyType_Check(o.real.get()) && !PyModule_Check(o.real.get())) {
        // `obj.__dict__` holds obj's attributes: the capture follows them by attribute, so
        // this dict is only read, and only while no attribute of obj was set in the call
        int d = m_cap.input_child(obj, AccessKind::Attr, 0, name, ".__dict__", real);
        if (d >= 0) m_cap.v(d).dict_of = obj;
        return d;
    }
    if (!o.tensor && o.real && PyTuple_Check(o.real.get()) &&
        (o.kind == ValueKind::FreshTuple || o.kind == ValueKind::Input)) {
        int idx = namedtuple_field(Py_TYPE(o.real.get()), name);  // det.boxes
        if (idx >= 0) {
            if (o.kind == ValueKind::FreshTuple) return o.items[static_cast<size_t>(idx)];
            return item_of(obj, idx, real);
        }
    }
    if (int m = container_method(obj, name, real); m != 0) return m;
    const char* cname = PyUnicode_AsUTF8(name);
    if (o.tensor) {
        if (is_metadata_attribute(cname)) {
            if (n == "is_leaf" && o.kind == ValueKind::Input)  // not part of the tensor check
                return m_cap.input_child(obj, AccessKind::Attr, 0, name, ".is_leaf", real);
            if (n == "shape" && (o.dyn_shape || m_cap.sym_tensor(obj))) return shape_of(obj, real);
            if ((n == "shape" || n == "ndim") && !m_cap.read_rank(obj)) return -1;
            // whether an op result requires grad follows from its inputs', and the parameters
            // of leaf modules are inputs the guards did not check until now (a review probe
            // froze them between calls: `if y.requires_grad:` kept the old branch)
            if ((n == "requires_grad" || n == "is_leaf") && o.kind != ValueKind::Input &&
                !guard_leaf_parameters())
                return -1;
            return m_cap.const_value(real);
        }
        // A tensor computed from constants is one of the capture ([Note: tensors of
        // constants]); its `.data` shares its memory under a version counter of its own, so a
        // write through it goes unseen (a review probe: `c = torch.zeros(2);
        // c.data.copy_(x)` replayed zeros): from here on it is not a constant.
        if (n == "data" || n == "numpy" || n == "storage" || n == "untyped_storage" ||
            n == "__dlpack__" || n == "set_")
            o.const_data = false;
        // An op attribute (x.T, x.data), or `f = x.reshape` (then f(*shape)): the bound method
        // taken at replay from the replayed tensor, calling it being the op.
        bool op = is_op_attribute(cname);
        if (op || (real && PyCFunction_Check(real) && PyCFunction_GET_SELF(real) == o.real.get()))
            return attr_at_replay(obj, name, real, op);
        if (n == "grad") return grad_of(obj, name, real);
        m_cap.fail(breaks::kUnsupportedAttribute, "tensor attribute `" + n + "` is read",
                   "read shape, dtype, device or call tensor methods");
        return -1;
    }
    if (o.kind == ValueKind::Const && o.real && mutable_constant(o.real.get())) {
        // type(obj).name, obj.__class__.name: a class the capture knows as a constant, whose
        // attributes can still change between calls: read through the class the guards hold
        obj = m_cap.constant_root(o.real.get(), o.label, true);
        return load_attr(obj, name, real);
    }
    if (o.kind == ValueKind::Const) return m_cap.const_value(real);
    if (o.kind == ValueKind::FreshObject) return object_attr(obj, name, real, false);
    if (o.kind == ValueKind::OpResult) return attr_at_replay(obj, name, real, true);
    if (o.kind != ValueKind::Input) {
        m_cap.fail(breaks::kUnsupportedAttribute, "attribute `" + n + "` of " + o.label,
                   "read attributes of objects passed in");
        return -1;
    }
    PyObject* target = o.real.get();
    bool is_module = PyObject_TypeCheck(target, torch_api().module_type);
    if (o.identity && (n == "value" || n == "name") && is_enum_member(target) && real &&
        is_constant_like(real))
        return m_cap.const_value(real);  // Color.RED.value: fixed when the class was made
    if (!PyType_Check(target) && is_code_descriptor(Py_TYPE(target), name)) {
        m_cap.fail(breaks::kUnsupportedAttribute,
                   "`" + o.label + "." + n + "` is a property (its getter runs Python code)",
                   "read the underlying attribute, or make it a plain attribute");
        return -1;
    }
    if (has_attribute_hook(target, false) && !found_before_getattr_hook(target, name)) {
        m_cap.fail(breaks::kUnsupportedAttribute,
                   "`" + o.label + "` has a custom __getattr__/__getattribute__",
                   "use plain attributes");
        return -1;
    }
    if (std::string code = code_on_read(target, name); !code.empty()) {
        m_cap.fail(breaks::kUnsupportedAttribute,
                   "`" + o.label + "." + n + "` is computed by " + code + ", Python code that "
                   "runs on every read",
                   "read a plain attribute, or compute the value outside the compiled function");
        return -1;
    }
    if (PyType_Check(target) && o.identity && real && PyCFunction_Check(real) &&
        PyCFunction_GET_SELF(real) == target) {
        // MyFunction.apply: a C class method, bound anew on every read, to a class the guards
        // fix; the same every time
        PyObject* d = _PyType_Lookup(reinterpret_cast<PyTypeObject*>(target), name);
        if (d && Py_TYPE(d) == &PyClassMethodDescr_Type && !_PyType_Lookup(Py_TYPE(target), name))
            return m_cap.const_value(real);
    }
    return m_cap.input_child(obj, is_module ? AccessKind::ModuleAttr : AccessKind::Attr, 0, name,
                             "." + n, real);
}

int Monitor::item_of(int seq, Py_ssize_t i, PyObject* real, bool graph_op) {
    Value& s = m_cap.v(seq);
    if (s.kind == ValueKind::Input && (s.shadow || s.mutated) && PyList_CheckExact(s.real.get())) {
        if (!m_cap.shadow(seq)) return -1;
    }
    if (s.kind == ValueKind::Input && s.shadow) {
        if (i >= 0 && i < static_cast<Py_ssize_t>(s.items.size()))
            return s.items[static_cast<size_t>(i)];
        m_cap.internal_error("index out of the known items");
        return -1;
    }
    if (s.kind == ValueKind::Input && !s.tensor)
        return m_cap.input_child(seq, AccessKind::Item, static_cast<int>(i), nullptr,
                                 "[" + std::to_string(i) + "]", real);
    if (s.kind == ValueKind::OpResult || s.tensor) {
        Step st;
        st.kind = StepKind::GetItem;
        Arg a;
        if (!m_cap.arg_of(seq, a)) return -1;
        py::Ref idx = py::Ref::steal(PyLong_FromSsize_t(i));
        st.args = {a, Arg::value(idx.get())};
        return m_cap.record(std::move(st), real, s.label + "[" + std::to_string(i) + "]", graph_op);
    }
    m_cap.fail(breaks::kUnsupportedOpcode, "items of " + s.label + " are read",
               "unpack lists, tuples or tensors");
    return -1;
}

// What a tensor may be indexed with: constants, sizes and slices of sizes (computed at replay),
// tensors, and tuples or lists of these (x[:, [-1]], x[None, idx], x[rows, cols, None]).
// dyn_shape: the result's shape depends on data (a boolean or uint8 mask).
Monitor::IndexKey Monitor::index_key(int key, int depth) {
    const Value& k = m_cap.v(key);
    if (k.dyn_scalar) return {true, true};  // x[n], x[p:p + n] with n read from tensor data
    if (k.kind == ValueKind::Const || k.sym_number() ||
        (k.sym && k.real && PySlice_Check(k.real.get())))
        return {true, false};
    if (k.tensor) {
        PyObject* dt = PyObject_GetAttrString(k.real.get(), "dtype");
        std::string d = dt ? str(dt) : "";
        Py_XDECREF(dt);
        if (!dt) PyErr_Clear();
        return {true, d == "torch.bool" || d == "torch.uint8" || k.dyn_shape};
    }
    if (k.kind == ValueKind::OpResult && k.real && PyTuple_CheckExact(k.real.get()) &&
        PyTuple_GET_SIZE(k.real.get()) > 0) {  // x[torch.where(mask)]: a tuple of index tensors
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(k.real.get()); ++i)
            if (!is_tensor(PyTuple_GET_ITEM(k.real.get(), i))) return {false, false};
        return {true, k.dyn_shape};
    }
    if ((k.kind == ValueKind::FreshTuple || k.kind == ValueKind::FreshList) && depth < 4) {
        IndexKey all{true, false};
        std::vector<int> items = k.items;
        for (int it : items) {
            IndexKey one = index_key(it, depth + 1);
            all.ok = all.ok && one.ok;
            all.dyn_shape = all.dyn_shape || one.dyn_shape;
        }
        return all;
    }
    return {false, false};
}

// d[key] of a defaultdict made in the call that did not hold key: the item its factory just
// made and stored (an empty list or dict made in the call, or 0 and 0.0).
int Monitor::default_item(int dict, int key, PyObject* real) {
    PyObject* factory = m_cap.v(m_cap.v(dict).default_factory).real.get();
    int item = -1;
    if (!real) return -1;
    if (factory == reinterpret_cast<PyObject*>(&PyList_Type) && PyList_CheckExact(real))
        item = m_cap.fresh(ValueKind::FreshList, {}, real);
    else if (factory == reinterpret_cast<PyObject*>(&PyDict_Type) && PyDict_CheckExact(real))
        item = fresh_dict({}, real);
    else if ((factory == reinterpret_cast<PyObject*>(&PyLong_Type) ||
              factory == reinterpret_cast<PyObject*>(&PyFloat_Type)) && is_constant_like(real))
        item = m_cap.const_value(real);
    if (item < 0) {
        m_cap.fail(breaks::kUnsupportedCallee,
                   "a missing key of " + m_cap.v(dict).label + " runs its factory " +
                       py::repr_string(factory),
                   "use defaultdict(list), (dict), (int) or (float), or dict.setdefault");
        return -1;
    }
    set_fresh_item(dict, key, item);
    return item;
}

int Monitor::subscript(int cont, int key, PyObject* real) {
    Value& c = m_cap.v(cont);
    Value& k = m_cap.v(key);
    if (c.tensor || (c.kind == ValueKind::OpResult && !c.tensor)) {
        IndexKey ik = index_key(key);
        if (!ik.ok) {
            m_cap.fail(breaks::kUnsupportedOpcode, "a tensor is indexed with " + k.label,
                       "index with constants, slices, tensors, or tuples and lists of them");
            return -1;
        }
        Step s;
        s.kind = StepKind::GetItem;
        Arg a, b;
        if (!m_cap.arg_of(cont, a) || !m_cap.arg_of(key, b)) return -1;
        s.args = {a, b};
        int r = m_cap.record(std::move(s), real, c.label + "[...]", true);
        m_cap.v(r).dyn_shape = m_cap.v(r).dyn_shape || ik.dyn_shape;  // a mask passed in
        return r;
    }
    m_cap.concretize(key);
    // d[f] with f an object the guards pin (3.12's typing: _caches[func] in _tp_cache): read
    // under that object, as under a constant key
    bool pinned_key = k.identity && c.kind == ValueKind::Input && PyDict_Check(c.real.get());
    if (k.kind != ValueKind::Const && !pinned_key) {
        m_cap.fail(breaks::kUnsupportedOpcode, c.label + " is indexed with a computed key",
                   "index containers with constants");
        return -1;
    }
    PyObject* kr = k.real.get();
    if (c.kind == ValueKind::Const) return m_cap.const_value(real);
    if (c.kind == ValueKind::FreshList || c.kind == ValueKind::FreshTuple)
        return index_items(c.items, kr, c.kind, real);
    if (c.kind == ValueKind::FreshDict) {
        int at = fresh_dict_slot(cont, kr);
        if (at >= 0) return c.items[static_cast<size_t>(at)];
        if (c.default_factory >= 0) return default_item(cont, key, real);
    }
    if (c.kind == ValueKind::Input) {
        PyObject* o = c.real.get();
        if ((PyList_CheckExact(o) || PyTuple_CheckExact(o)) &&
            (PyLong_Check(kr) || PySlice_Check(kr))) {
            if (c.mutated && !c.shadow && PyLong_Check(kr)) {
                // `log[-1]` right after appends: one of the items appended here, whatever the
                // list held before (its length is not needed)
                Py_ssize_t i = PyLong_AsSsize_t(kr);
                Py_ssize_t appended = static_cast<Py_ssize_t>(c.items.size());
                if (i < 0 && -i <= appended) return c.items[static_cast<size_t>(appended + i)];
            }
            if (c.shadow || c.mutated || PySlice_Check(kr)) {
                std::vector<int> items;
                if (!items_of(cont, items)) return -1;
                return index_items(items, kr,
                                   PyList_CheckExact(o) ? ValueKind::FreshList : ValueKind::FreshTuple,
                                   real);
            }
            Py_ssize_t i = PyLong_AsSsize_t(kr);
            if (i < 0) {
                Py_ssize_t n = PyObject_Length(o);
                m_cap.guard_len(cont, n);
                i += n;
            }
            return item_of(cont, i, real);
        }
        if (PyDict_Check(o)) {
            int written = written_item(cont, kr);
            return written >= 0 ? written : dict_item(cont, kr, real);
        }
        if (c.identity && PyUnicode_Check(kr) && PyObject_TypeCheck(o, torch_api().module_dict_type) &&
            plain_module_container(o, "__getitem__", true)) {
            // self.heads[name]: the module under that key of its _modules
            int mv = modules_dict(cont);
            return mv < 0 ? -1 : dict_item(mv, kr, real);
        }
        if (c.identity && PySlice_Check(kr) && plain_module_container(o, "__getitem__")) {
            // self.blocks[:-1]: a new ModuleList / Sequential of the same modules, made again
            // from them if it leaves the call
            std::vector<int> items;
            if (!items_of(cont, items)) return -1;
            return index_items(items, kr, ValueKind::FreshList, real);
        }
        if (c.identity && PyLong_Check(kr) && plain_parameter_container(o, "__getitem__")) {
            // self.scales[i]: its attribute "i" (the length guarded for a negative i)
            long i = PyLong_AsLong(kr);
            if (i < 0) {
                long n = parameter_list_size(cont);
                if (n < 0) return -1;
                i += n;
            }
            return parameter_list_item(cont, i, real);
        }
        if (c.identity && PyUnicode_Check(kr) && plain_parameter_container(o, "__getitem__", true))
            return m_cap.input_child(cont, AccessKind::ModuleAttr, 0, kr,
                                     "[" + py::repr_string(kr) + "]", real);  // self.scales["a"]
        if (c.identity && PyLong_Check(kr) &&
            plain_module_container(o, "__getitem__")) {
            int mv = modules_dict(cont);
            if (mv < 0) return -1;
            Py_ssize_t n = PyDict_Size(m_cap.v(mv).real.get());
            Py_ssize_t i = PyLong_AsSsize_t(kr);
            if (i < 0) {
                m_cap.guard_len(mv, n);
                i += n;
            }
            return m_cap.input_child(mv, AccessKind::DictValueAt, static_cast<int>(i), nullptr,
                                     "[" + std::to_string(i) + "]", real);
        }
    }
    m_cap.fail(breaks::kUnsupportedOpcode, "indexing " + c.label + " (" +
                                               py::type_name(c.real.get()) + ")",
               "index tensors, lists, tuples, dicts or module lists");
    return -1;
}

// Whether `%`-formatting `value` into a string gives the same text at replay: numbers (fixed,
// symbolic or read from data), strings, and tuples of those.
bool Monitor::formats_at_replay(int value, int depth) {
    const Value& v = m_cap.v(value);
    PyObject* o = v.real.get();
    if (!o || v.tensor) return false;
    if (v.kind == ValueKind::FreshTuple && PyTuple_CheckExact(o) && depth == 0) {
        std::vector<int> items = v.items;
        for (int it : items)
            if (!formats_at_replay(it, 1)) return false;
        return true;
    }
    bool scalar = PyLong_CheckExact(o) || PyFloat_CheckExact(o) || PyUnicode_CheckExact(o);
    return scalar && (v.kind == ValueKind::Const || v.kind == ValueKind::Input ||
                      v.kind == ValueKind::OpResult);
}

// `x.shape != skip.shape`, `x.shape[2:] == (h, w)`: shapes (or tuples of sizes) compared for
// equality, with sizes that are symbolic or read at replay from a tensor the plan makes. The
// comparison is a step of its own, whose truth a branch then checks, so it stands for the
// relation between the sizes (the same batch on both sides) instead of fixing each size to
// its value in this call. Shapes of different lengths are unequal whatever their sizes.
// -1 when the operands are not such shapes (nothing recorded).
int Monitor::shape_compare(int op, int a, int b, PyObject* real) {
    if (op != Py_EQ && op != Py_NE) return -1;
    auto shape_like = [&](int id) {
        const Value& v = m_cap.v(id);
        PyObject* o = v.real.get();
        return o && !v.tensor && tuple_or_shape(o) &&
               (v.kind == ValueKind::FreshTuple || v.kind == ValueKind::Const);
    };
    if (!shape_like(a) || !shape_like(b)) return -1;
    std::vector<int> left, right;
    if (!items_of(a, left) || !items_of(b, right)) return -1;
    bool dynamic = false;
    for (const std::vector<int>* side : {&left, &right})
        for (int it : *side) {
            const Value& v = m_cap.v(it);
            PyObject* o = v.real.get();
            if (v.tensor || !o || !PyLong_CheckExact(o)) return -1;
            if (v.dyn_scalar || v.sym_number()) dynamic = true;
            else if (v.kind != ValueKind::Const) return -1;
        }
    if (left.size() != right.size()) return m_cap.const_value(real);
    if (!dynamic) return -1;
    int r = operator_step(StepKind::Compare, op, a, b, real, false);
    if (r < 0) return -1;
    left.insert(left.end(), right.begin(), right.end());
    number_from(r, left);
    return r;
}

int Monitor::binary(int op, int a, int b, PyObject* real) {
    Value &x = m_cap.v(a), &y = m_cap.v(b);
    bool sym = x.sym_number() || y.sym_number();
    bool scalar = (x.dyn_scalar || y.dyn_scalar || sym) && number_operands(a, b);
    // "n=%d" % n, "%d/%d" % (i, n) with a symbolic size or a number read from data: the text is
    // made at replay, as an f-string's is (format_step)
    if (int r = numpy_operator(StepKind::Binary, op, a, b, real); r >= 0) return r;
    bool text = op == NB_REMAINDER && x.kind == ValueKind::Const && y.kind != ValueKind::Const &&
                PyUnicode_CheckExact(x.real.get()) && formats_at_replay(b);
    if (x.tensor || y.tensor || scalar || text) {
        bool graph_op = x.tensor || y.tensor;
        int r = operator_step(StepKind::Binary, op, a, b, real, graph_op,
                              op >= NB_INPLACE_ADD && x.tensor);  // t += 1 changes t
        if (r < 0 || text) return r;  // a string, not a number
        if (!graph_op) number_from(r, {a, b});
        return r;
    }
    // s |= t: a write the replay cannot make on a set passed in (known by value) or on one
    // made in the call that has left it; on one made here, the set itself ([Note: sets made in
    // the call])
    bool in_place = op >= NB_INPLACE_ADD && real == x.real.get() && PyAnySet_Check(real);
    bool made_here = x.kind == ValueKind::FreshSet;
    if (in_place && (x.kind == ValueKind::Const || (made_here && m_cap.exists_at_replay(a)))) {
        m_cap.fail(breaks::kUnsupportedOpcode,
                   "an in-place operator changes " + x.label +
                       (made_here ? " after it was stored or returned" : ", a set passed in"),
                   "make a new set: s = s | other");
        return -1;
    }
    if (x.kind == ValueKind::Const && y.kind == ValueKind::Const) return m_cap.const_value(real);
    if ((made_here || y.kind == ValueKind::FreshSet) && known(a) && known(b)) {
        if (in_place && made_here) return a;  // a |= b, a &= b
        return PySet_CheckExact(real) ? fresh_set(real) : m_cap.const_value(real);  // a | b
    }
    auto is_dict = [&](const Value& d) {
        return !d.tensor && PyDict_Check(d.real.get()) &&
               (d.kind == ValueKind::FreshDict || d.kind == ValueKind::Input);
    };
    if ((op == NB_OR || op == NB_INPLACE_OR) && is_dict(x) && is_dict(y)) {
        // a | b: a new dict of both; a |= b: a.update(b) (a made in the call)
        int into = a;
        if (op == NB_OR) {
            std::vector<int> pairs;
            if (!dict_view(a, DictView::Items, pairs)) return -1;
            into = fresh_dict(pairs, real);
        }
        if (m_cap.v(into).kind != ValueKind::FreshDict) {
            m_cap.fail(breaks::kUnsupportedOpcode, "`|=` changes " + m_cap.v(a).label + ", a dict "
                       "passed in", "merge into a new dict: d = d | other");
            return -1;
        }
        if (iter_call("update", {into, b}, Py_None) < 0) return -1;
        return into;
    }
    bool x_list = !x.tensor && PyList_CheckExact(x.real.get()) &&
                  (x.kind == ValueKind::FreshList || x.kind == ValueKind::Input);
    if (op == NB_INPLACE_ADD && x_list) {  // xs += ys extends xs in place
        static PyObject* extend = PyDict_GetItemString(py::type_dict(&PyList_Type), "extend");
        if (mutate_list(m_cap.const_value(extend, "list.extend"), "extend", {a, b}) < 0) return -1;
        return a;
    }
    bool same_seq = (PyList_CheckExact(x.real.get()) && PyList_CheckExact(y.real.get())) ||
                    (tuple_or_shape(x.real.get()) && tuple_or_shape(y.real.get()));
    if ((op == NB_ADD || op == NB_INPLACE_ADD) && same_seq && !x.tensor && !y.tensor) {
        std::vector<int> left, right;
        if (!items_of(a, left) || !items_of(b, right)) return -1;
        left.insert(left.end(), right.begin(), right.end());
        return m_cap.fresh(PyList_CheckExact(x.real.get()) ? ValueKind::FreshList
                                                           : ValueKind::FreshTuple,
                           left, real);
    }
    if (op == NB_MULTIPLY || op == NB_INPLACE_MULTIPLY) {
        // [None] * n, (0,) * k: the same items repeated (n fixed by the guards)
        bool x_seq = PyList_CheckExact(x.real.get()) || tuple_or_shape(x.real.get());
        int seq = x_seq ? a : b, count = x_seq ? b : a;
        Value& c = m_cap.v(count);
        PyObject* sr = m_cap.v(seq).real.get();
        if ((PyList_CheckExact(sr) || tuple_or_shape(sr)) && !m_cap.v(seq).tensor &&
            PyLong_CheckExact(c.real.get()) &&
            (op == NB_MULTIPLY || x_seq) && !(op == NB_INPLACE_MULTIPLY && PyList_CheckExact(sr))) {
            m_cap.concretize(count);
            if (m_cap.v(count).kind == ValueKind::Const) {
                std::vector<int> items, out;
                if (!items_of(seq, items)) return -1;
                long n = PyLong_AsLong(m_cap.v(count).real.get());
                for (long i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
                return m_cap.fresh(PyList_CheckExact(sr) ? ValueKind::FreshList : ValueKind::FreshTuple,
                                   out, real);
            }
        }
    }
    m_cap.fail(breaks::kUnsupportedOpcode,
               "an operator is applied to " + x.label + " and " + y.label,
               "apply operators to tensors or constants");
    return -1;
}

// Both operands are Python numbers (constants or floats read from tensor data): arithmetic on
// them is replayed.
static size_t tensor_rank(PyObject* t) { return static_cast<size_t>(tensor_dim(t)); }

// [Note: dynamic shapes] x.shape of a tensor with symbolic dims: a tuple of its sizes, the
// symbolic ones read at replay.
int Monitor::shape_of(int t, PyObject* real) {
    if (!m_cap.read_rank(t)) return -1;
    std::vector<int> items;
    for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(real); ++d) {
        int n = m_cap.size_of(t, static_cast<int>(d), PyTuple_GET_ITEM(real, d));
        if (n < 0) return -1;
        items.push_back(n);
    }
    return m_cap.fresh(ValueKind::FreshTuple, std::move(items), real);
}

// A metadata query on a tensor with symbolic dims: sizes are read at replay; the rank, dtype
// and the like stay fixed; anything else (strides, contiguity) fixes the sizes again.
int Monitor::symbolic_query(const Pending& p, int t, PyObject* result) {
    const std::string& op = p.callee.op;
    size_t nkw = p.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(p.kwnames)) : 0;
    size_t nargs = p.in.size() - nkw;
    if (t >= 0 && !m_cap.read_rank(t)) return -1;
    if (t >= 0 && nkw == 0) {
        if (op == "size" && nargs == 1) return shape_of(t, result);
        if ((op == "size" && nargs == 2) || op == "__len__") {
            PyObject* d = op == "__len__" ? nullptr : m_cap.v(p.in[1]).real.get();
            if (d && !(m_cap.v(p.in[1]).kind == ValueKind::Const && PyLong_Check(d)))
                m_cap.concretize(p.in[1]);
            long dim = d ? PyLong_AsLong(d) : 0;
            if (dim < 0) dim += static_cast<long>(tensor_rank(m_cap.v(t).real.get()));
            return m_cap.size_of(t, static_cast<int>(dim), result);
        }
        if ((op == "numel" || op == "nelement") && nargs == 1)
            return m_cap.size_of(t, Capture::kNumel, result);
        if (op == "dim" || op == "ndimension" || op == "is_floating_point" || op == "is_complex" ||
            op == "element_size" || op == "get_device" || op == "is_signed" || op == "type" ||
            op == "is_tensor")
            return m_cap.const_value(result);
    }
    if (t >= 0 && m_cap.v(t).dyn_shape) return -1;  // strides of a data-dependent shape: unknown
    m_cap.pin_all_dims();
    return m_cap.const_value(result);
}

// The result `r` of arithmetic on numbers: symbolic when an operand is (its dims are the
// union of theirs).
void Monitor::number_from(int r, const std::vector<int>& operands) {
    Value& out = m_cap.v(r);
    out.sym = false;
    out.sym_all = false;
    out.sym_deps.clear();
    out.dyn_scalar = false;
    out.data_size = true;
    for (int id : operands) {
        const Value& in = m_cap.v(id);
        out.dyn_scalar = out.dyn_scalar || in.dyn_scalar;
        out.data_size = out.data_size && (!in.dyn_scalar || in.data_size);
        if (!in.sym || in.tensor) continue;
        out.sym = true;
        out.sym_all = out.sym_all || in.sym_all;
        out.sym_deps.insert(out.sym_deps.end(), in.sym_deps.begin(), in.sym_deps.end());
    }
    out.data_size = out.data_size && out.dyn_scalar;
}

int Monitor::sym_truth(int id) {
    Value& v = m_cap.v(id);
    if (!v.sym_number() || PyBool_Check(v.real.get())) return -1;
    if (v.positive) return 1;  // a size of an input: at least 2 by its guards
    int truth = PyObject_IsTrue(v.real.get());
    if (truth < 0) {
        PyErr_Clear();
        return -1;
    }
    return m_cap.add_replay_check(id, truth ? Py_True : Py_False, kCheckTruth) ? truth : -1;
}

int Monitor::sym_truth_call(const Pending& p) {
    const std::string& n = p.callee.name;
    bool one = (p.callee.kind == CallKind::TypeCtor && n == "bool") ||
               (p.callee.kind == CallKind::PureBuiltin && n == "truth");
    bool many = p.callee.kind == CallKind::PureBuiltin && (n == "all" || n == "any");
    if ((!one && !many) || p.kwnames || p.in.size() != 1) return -1;
    std::vector<int> items = {p.in[0]};
    if (many) {
        const Value& c = m_cap.v(p.in[0]);
        if (c.kind != ValueKind::FreshList && c.kind != ValueKind::FreshTuple) return -1;
        items = c.items;
    }
    bool any_sym = false;
    for (int it : items) {  // (read first: nothing is checked unless all of them can be)
        const Value& v = m_cap.v(it);
        if (v.sym_number() && !PyBool_Check(v.real.get())) any_sym = true;
        else if (v.kind != ValueKind::Const || !v.real ||
                 !(PyLong_CheckExact(v.real.get()) || PyFloat_CheckExact(v.real.get())))
            return -1;
    }
    if (!any_sym) return -1;
    bool stop_on = n == "any";  // all() stops at the first false item, any() at a true one
    for (int it : items) {
        int truth = m_cap.v(it).sym_number() ? sym_truth(it) : PyObject_IsTrue(m_cap.v(it).real.get());
        if (truth < 0) return -1;
        if (one) return truth;
        if ((truth == 1) == stop_on) return stop_on ? 1 : 0;
    }
    return stop_on ? 0 : 1;
}

// A builtin that computes a number from numbers only, one of them symbolic (a dynamic number
// or a symbolic size): `min`, `max`, `abs`, `round`, `math.sqrt`, `int()`, `float()`. It is
// replayed rather than fixing its operands, and its result is symbolic in all of them.
bool Monitor::sym_number_call(const Pending& p, PyObject* result) {
    bool ctor = p.callee.kind == CallKind::TypeCtor &&
                (p.callee.name == "int" || p.callee.name == "float");
    if (p.callee.kind != CallKind::PureBuiltin && !ctor) return false;
    if (!result || !(PyLong_CheckExact(result) || PyFloat_CheckExact(result))) return false;
    bool sym = false;
    std::vector<int> operands = p.in;
    const std::string& n = p.callee.name;
    if ((n == "sum" || n == "min" || n == "max" || n == "prod" || n == "torch.Size.numel") &&
        p.in.size() == 1 &&
        !p.kwnames &&
        (m_cap.v(p.in[0]).kind == ValueKind::FreshList ||
         m_cap.v(p.in[0]).kind == ValueKind::FreshTuple))
        operands = m_cap.v(p.in[0]).items;  // sum([b, t * 2]): the list made at replay
    for (int a : operands) {
        const Value& v = m_cap.v(a);
        PyObject* o = v.real.get();
        if (v.sym_number()) sym = true;
        else if (v.kind != ValueKind::Const || !o || !(PyLong_Check(o) || PyFloat_Check(o)))
            return false;
    }
    return sym;
}

int Monitor::record_sym_number(Pending& p, PyObject* result) {
    int r = record_call(p, result, false, false);
    std::vector<int> operands = p.in;
    if (p.in.size() == 1 && (m_cap.v(p.in[0]).kind == ValueKind::FreshList ||
                             m_cap.v(p.in[0]).kind == ValueKind::FreshTuple))
        operands = m_cap.v(p.in[0]).items;  // sum(list) of numbers
    if (r >= 0) number_from(r, operands);
    return r;
}

bool Monitor::number_operands(int a, int b) {
    for (int id : {a, b}) {
        const Value& v = m_cap.v(id);
        PyObject* o = v.real.get();
        if (v.dyn_scalar || v.sym_number()) continue;
        if (v.kind != ValueKind::Const || !o || !(PyFloat_Check(o) || PyLong_Check(o))) return false;
    }
    return true;
}

// Determined by the guards: a constant, an identity-guarded object, or a container made here
// of such values.
void Monitor::guard_set_value(int id) {
    py::Ref frozen = py::Ref::steal(PyFrozenSet_New(m_cap.v(id).real.get()));
    if (!frozen) {
        PyErr_Clear();
        m_cap.internal_error("a frozen copy of a set");
        return;
    }
    m_cap.guard_equals(id, frozen.get());
}

bool Monitor::known(int id, int depth) {
    const Value& v = m_cap.v(id);
    m_cap.concretize(id);  // a symbolic number: Python needs it
    if (v.kind == ValueKind::Const || v.kind == ValueKind::FreshSet || v.identity) return true;
    if (v.kind == ValueKind::Input && !v.tensor && depth < 8 &&
        (PyList_CheckExact(v.real.get()) || PyTuple_CheckExact(v.real.get()))) {
        // a list held by the model (sum(self.class_weights)): its length and items guarded
        if (!m_cap.shadow(id)) return false;
        std::vector<int> items = m_cap.v(id).items;
        for (int it : items)
            if (!known(it, depth + 1)) return false;
        return true;
    }
    if ((v.kind == ValueKind::FreshList || v.kind == ValueKind::FreshTuple ||
         v.kind == ValueKind::FreshDict) && depth < 8) {
        std::vector<int> items = v.items;
        for (int it : items)
            if (!known(it, depth + 1)) return false;
        return true;
    }
    return false;
}

// How a break names a number Python needs that is only known when the call runs.
static const char* const kRunTimeNumber =
    ", a number read from tensor data, drawn at random or read from the clock";

// [Note: numpy arrays from constants] np.triu(np.ones((1, T, T)), k=1).astype("uint8") (the
// Annotated Transformer's subsequent mask, then torch.from_numpy): a numpy function or ndarray
// method whose arguments are constants of the capture, sizes (symbolic ones too: the step
// computes with each call's), or arrays made this way, and whose result
// is an array, is recorded as a step, so every call makes its own arrays, as eager does (an
// array is mutable: it is never a constant of the capture). Python reading such an array is
// not followed (it breaks): an array has no version counter to tell whether a write since made
// its data depend on the inputs ([Note: tensors of constants]). numpy.random is not numpy here
// (it draws).
bool Monitor::numpy_from_constants(const std::vector<int>& in) {
    auto ok = [&](auto& self, int a, int depth) -> bool {
        const Value& v = m_cap.v(a);
        if (made_array(v)) return true;
        if (m_cap.folds(a) || v.identity || v.sym_number()) return true;  // np.float32; sizes
        if ((v.kind == ValueKind::FreshTuple || v.kind == ValueKind::FreshList) && depth < 4) {
            std::vector<int> items = v.items;
            for (int it : items)
                if (!self(self, it, depth + 1)) return false;
            return true;
        }
        return false;
    };
    for (int a : in)
        if (!ok(ok, a, 0)) return false;
    return true;
}

// An operator on an array made from constants ([Note: numpy arrays from constants]): `1 - m`,
// `a += 1`, `m == 0`, recorded; -1 (nothing recorded, no failure) when it is not one.
// `a <op> b` (StepKind::Binary or Compare) as a step replayed as it is; `graph_op` when it
// is a tensor op of the graph, `effect` for an in-place operator on a tensor (t += 1).
int Monitor::operator_step(StepKind kind, int op, int a, int b, PyObject* real, bool graph_op,
                           bool effect) {
    Step s;
    s.kind = kind;
    s.op = op;
    Arg x, y;
    if (!m_cap.arg_of(a, x) || !m_cap.arg_of(b, y)) return -1;
    s.args = {x, y};
    s.effect = effect;
    if (effect) s.mutates = 0;
    std::string label = op_label(m_cap.v(a).label,
                                 kind == StepKind::Binary ? binary_symbol(op) : compare_symbol(op),
                                 m_cap.v(b).label);
    return m_cap.record(std::move(s), real, label, graph_op);
}

int Monitor::numpy_operator(StepKind kind, int op, int a, int b, PyObject* real) {
    if (!is_ndarray(real) || !(made_array(m_cap.v(a)) || made_array(m_cap.v(b))) ||
        !numpy_from_constants({a, b}))
        return -1;
    return array_result(operator_step(kind, op, a, b, real, false));
}

// The value of a recorded step that made an array: never data Python may read as a constant,
// since writes to an array are not versioned.
int Monitor::array_result(int r) {
    if (r >= 0) m_cap.v(r).const_data = false;
    return r;
}

bool Monitor::require_const(const std::vector<int>& values, const std::string& what) {
    for (int id : values) {
        Value& v = m_cap.v(id);
        if (m_cap.holds(id, &Value::dyn_scalar))
            return m_cap.fail(breaks::kTensorToPython,
                              what + " needs the value of " + v.label + kRunTimeNumber,
                              "keep the value in a tensor, or use it outside the compiled "
                              "function"),
                   false;
        if (!known(id)) {
            m_cap.fail(v.tensor ? breaks::kTensorToPython : breaks::kUnsupportedOpcode,
                       what + " uses " + v.label + ", which is not a constant",
                       v.tensor ? "keep tensor values in tensors" : "use constants here");
            return false;
        }
    }
    return true;
}

// Whether a value's str() at replay is the text eager prints: built-in scalars and strings
// (constants, inputs, numbers and strings computed at replay), shapes, dtypes, devices,
// tensors without grad (their repr names no grad_fn, which a compiled graph would change), and
// containers of those.
static bool const_prints_the_same(PyObject* o, int depth = 0) {
    const TorchApi& api = torch_api();
    PyTypeObject* t = Py_TYPE(o);
    if (o == Py_None || PyBool_Check(o) || PyLong_CheckExact(o) || PyFloat_CheckExact(o) ||
        PyComplex_CheckExact(o) || PyUnicode_CheckExact(o) || PyBytes_CheckExact(o) ||
        t == api.dtype_type || t == api.device_type)
        return true;
    if (depth >= 4) return false;
    if (PyTuple_CheckExact(o) || PyList_CheckExact(o) || t == api.size_type) {
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(o); ++i)
            if (!const_prints_the_same(PySequence_Fast_GET_ITEM(o, i), depth + 1)) return false;
        return true;
    }
    return false;
}

// Whether every value prints the same at replay; if not, a break (MB005) naming `what`.
bool Monitor::require_prints_the_same(const std::vector<int>& values, const std::string& what) {
    for (int a : values)
        if (!prints_the_same(a)) {
            m_cap.fail(breaks::kIO,
                       "`" + what + "()` of " + m_cap.v(a).label + ", whose text at replay could "
                       "differ (an object with its own __str__, or a tensor that requires grad)",
                       "use numbers, strings, shapes or tensors without grad; the call then "
                       "runs in the graph's replay");
            return false;
        }
    return true;
}

bool Monitor::prints_the_same(int id, int depth) {
    const Value& v = m_cap.v(id);
    PyObject* o = v.real.get();
    if (v.tensor) {
        if (!o || Py_TYPE(o) != torch_api().tensor_type) return false;  // subclasses, Parameter
        PyObject* rg = PyObject_GetAttrString(o, "requires_grad");
        bool grad = !rg || PyObject_IsTrue(rg) != 0;
        Py_XDECREF(rg);
        PyErr_Clear();
        return !grad;
    }
    switch (v.kind) {
    case ValueKind::Const:
        return o && const_prints_the_same(o);
    case ValueKind::Input:
    case ValueKind::OpResult:  // format steps, numbers read at replay
        return o && (PyLong_CheckExact(o) || PyFloat_CheckExact(o) || PyUnicode_CheckExact(o) ||
                     PyBool_Check(o) || o == Py_None);
    case ValueKind::FreshList:
    case ValueKind::FreshTuple:
    case ValueKind::FreshDict: {
        if (depth >= 4) return false;
        PyTypeObject* t = o ? Py_TYPE(o) : nullptr;
        if (t && !(t == &PyList_Type || t == &PyTuple_Type || t == &PyDict_Type ||
                   t == torch_api().size_type))
            return false;  // a namedtuple or OrderedDict prints its type's name
        std::vector<int> items = v.items;
        for (int it : items)
            if (!prints_the_same(it, depth + 1)) return false;
        return true;
    }
    default:
        return false;
    }
}

// [Note: branches to a raise] A branch on tensor data whose other side runs straight into a
// `raise` (`if not valid.all(): raise ValueError(...)` in torch.distributions' argument
// checks, `assert not torch.isnan(loss).any()`, `if (x < 0).any(): raise ...`) is a check of
// the input, not control flow the program lives on. While nothing visible has happened in the
// segment, the capture follows the side it took and the plan checks at replay that the tensor
// (or the number read from it) has the same truth value (a Check step, kCheckTruth); if not,
// the plan gives up before any effect and the call is captured again (Declined::Recapture), so
// the failing call raises exactly as eager does. Any other branch on data, or one after a
// write, an in-place op or a random draw, is a graph break (MB001).
// The truth of a value whose truth test runs no Python code of the user's (plain tensors,
// numbers, strings, None, plain containers); -1 otherwise, or when it has none (a tensor of many
// elements: the jump raises, as eager does).
static int plain_truth(PyObject* o) {
    const TorchApi& api = torch_api();
    PyTypeObject* t = Py_TYPE(o);
    bool plain = o == Py_None || PyBool_Check(o) || PyLong_CheckExact(o) || PyFloat_CheckExact(o) ||
                 PyUnicode_CheckExact(o) || PyList_CheckExact(o) || PyTuple_CheckExact(o) ||
                 PyDict_CheckExact(o) || t == api.tensor_type || t == api.parameter_type;
    int truth = plain ? PyObject_IsTrue(o) : -1;
    if (truth < 0) PyErr_Clear();
    return truth;
}

// A POP_JUMP_IF_TRUE/FALSE one of whose sides runs straight into an uncaught `raise`: if the
// side taken does, the call is dropped ([Note: calls that raise]); if the other does and the
// value comes from tensor data, a replay check ([Note: branches to a raise]). False: neither,
// and the branch is handled as any other.
bool Monitor::branch_to_raise(ShadowFrame& f, const py::Instruction& ins, int id) {
    int jump = py::jump_target(ins), next = py::next_offset(ins);
    bool jump_raises = py::code_runs_into_raise(f.code, jump);
    if (!jump_raises && !py::code_runs_into_raise(f.code, next)) return false;
    const Value& v = m_cap.v(id);
    int truth = plain_truth(v.real.get());
    if (truth < 0) return false;
    bool if_true = ins.opcode == POP_JUMP_FORWARD_IF_TRUE || ins.opcode == POP_JUMP_BACKWARD_IF_TRUE;
    bool jumps = if_true == (truth == 1);
    if (jumps == jump_raises) {  // the side taken raises
        if (f.caller_in_try) return false;  // a caller's handler may catch it: followed as before
        drop_raising_call();
        return true;
    }
    bool data = v.dyn_scalar || (v.tensor && !m_cap.folds(id));
    return data && m_cap.add_replay_check(id, truth ? Py_True : Py_False, kCheckTruth);
}

// [Note: speculated branches] A branch on the size of a tensor whose shape depends on data
// (`if boxes.numel() > 4000` in torchvision's batched_nms after score filtering, `if not
// det.shape[0]`) usually goes the same way call after call: it picks an algorithm or skips an
// empty case. While nothing visible has happened in the segment, the capture follows the side
// it took and the plan checks at replay that the test has the same truth value (a Check step,
// kCheckTruth, carrying the Speculation). When it does not, the plan gives up before any effect
// (Declined::Recapture), the Speculation is marked failed, and the next capture makes the
// branch a graph break (MB001), so a branch that flips costs one recapture, not a wasted graph
// run per call. With fullgraph=True there are no breaks: each side gets an entry of its own.
// Branches on tensor values or numbers read from them (`.item()`) are graph breaks as before,
// since those decide what the program computes.
bool Monitor::speculate_branch(int id, std::string& why_not) {
    const Value& v = m_cap.v(id);
    if (!v.data_size) return false;
    auto guess = guess_here("the branch on the data-dependent size `" + v.label + "` (line " +
                                std::to_string(m_cap.line()) + ") went the other way",
                            " (it went the other way on an earlier call, so it is no longer "
                            "guessed)",
                            why_not);
    int truth = guess ? plain_truth(v.real.get()) : -1;
    return truth >= 0 &&
           m_cap.add_replay_check(id, truth ? Py_True : Py_False, kCheckTruth, std::move(guess));
}

// A loop over a tensor whose length depends on data (`for c in torch.unique(labels)` in
// torchvision's _batched_nms_vanilla) is unrolled on the same guess: its length is checked at
// replay, and once it differs the loop is a graph break.
bool Monitor::speculate_length(int id, std::string& why_not) {
    const Value& v = m_cap.v(id);
    auto guess = guess_here("the loop over `" + v.label + "` (line " +
                                std::to_string(m_cap.line()) +
                                "), whose length depends on data, ran a different number of times",
                            " (its length changed on an earlier call, so it is no longer guessed)",
                            why_not);
    Py_ssize_t n = guess ? PyObject_Length(v.real.get()) : -1;
    py::Ref len = py::Ref::steal(n < 0 ? nullptr : PyLong_FromSsize_t(n));
    PyErr_Clear();
    return len && m_cap.add_replay_check(id, len.get(), kCheckLength, std::move(guess));
}

// The guess at the instruction being traced, made on first use with `what` (for the recompile
// reason once it fails); null when guesses are off, or when it failed before and fullgraph is off
// (why_not then says so, as `failed` does). A guess that cannot be checked also says why.
std::shared_ptr<Speculation> Monitor::guess_here(const std::string& what, const char* failed,
                                                 std::string& why_not) {
    auto* guesses = m_cap.dynamic().speculations;
    if (!guesses || !m_at_code) return nullptr;
    std::string site = str(m_at_code->co_filename) + ":" +
                       std::to_string(m_at_code->co_firstlineno) + "@" +
                       std::to_string(m_at_offset);
    std::shared_ptr<Speculation>& guess = (*guesses)[site];
    if (!guess) {
        guess = std::make_shared<Speculation>();
        guess->what = what;
    }
    if (guess->failed && !m_fullgraph) {
        why_not = failed;
        return nullptr;
    }
    why_not = " (after a visible effect, so a guess could not be undone)";
    return guess;
}

bool Monitor::truthiness_known(int id) {
    Value& v = m_cap.v(id);
    if (v.dyn_scalar) {
        std::string why_not;
        if (speculate_branch(id, why_not)) return true;
        m_cap.fail(breaks::kDataDependentBranch,
                   "a branch depends on " + v.label +
                       (v.data_size ? ", the size of a tensor whose shape depends on its data" +
                                          why_not
                                    : kRunTimeNumber),
                   "use torch.where / masking instead of `if`, or move the decision outside the "
                   "compiled function");
        return false;
    }
    if (sym_truth(id) >= 0) return true;  // `if T:`, `T or default` on a size read at replay
    m_cap.concretize(id);  // a branch on sizes: checked or guarded from here on
    if (v.tensor && m_cap.folds(id)) return true;  // [Note: tensors of constants]
    if (v.tensor) {
        m_cap.fail(breaks::kDataDependentBranch,
                   "a branch depends on the values inside tensor " + v.label,
                   "use torch.where / masking instead of `if`, or move the decision outside the "
                   "compiled function");
        return false;
    }
    switch (v.kind) {
    case ValueKind::Const:
    case ValueKind::FreshList:
    case ValueKind::FreshSet:
    case ValueKind::FreshTuple:
    case ValueKind::FreshDict:
        return true;
    case ValueKind::Input: {
        PyObject* o = v.real.get();
        if (v.shadow || (v.mutated && PyList_CheckExact(o))) return m_cap.shadow(id);
        if (v.mutated) {
            m_cap.fail(breaks::kMutatedThenRead,
                       "the truth value of `" + v.label + "` is tested after this function changed it",
                       "test it before changing it");
            return false;
        }
        if (PyList_Check(o) || PyTuple_Check(o) || PyDict_Check(o)) {
            m_cap.guard_len(id, PyObject_Length(o));
            return true;
        }
        PyTypeObject* t = Py_TYPE(o);
        bool custom = (t->tp_as_number && t->tp_as_number->nb_bool) ||
                      (t->tp_as_mapping && t->tp_as_mapping->mp_length) ||
                      (t->tp_as_sequence && t->tp_as_sequence->sq_length);
        if (!custom) return m_cap.guard_class_unchanged(id);  // (a __bool__ added later)
        break;
    }
    default:
        break;
    }
    m_cap.fail(breaks::kUnsupportedOpcode, "the truth value of " + v.label + " is tested",
               "test a constant, a flag or `is None`");
    return false;
}

// Strides of a computed tensor follow from the strides of the inputs: guard them all.
void Monitor::guard_all_strides() {
    for (int id = 1; id < m_cap.value_count(); ++id)
        if (m_cap.v(id).kind == ValueKind::Input && m_cap.v(id).tensor) m_cap.guard_strides(id);
}

static const char* opname(int op) {
    // the interpreter's own names (opcode.opname), read once
    static std::vector<std::string> names = [] {
        std::vector<std::string> out(256);
        py::Ref mod = py::Ref::steal(PyImport_ImportModule("opcode"));
        py::Ref list = mod ? py::Ref::steal(PyObject_GetAttrString(mod.get(), "opname")) : py::Ref();
        for (Py_ssize_t i = 0; list && PyList_Check(list.get()) && i < PyList_GET_SIZE(list.get()) && i < 256; ++i)
            if (PyUnicode_Check(PyList_GET_ITEM(list.get(), i)))
                out[static_cast<size_t>(i)] = PyUnicode_AsUTF8(PyList_GET_ITEM(list.get(), i));
        PyErr_Clear();
        return out;
    }();
    return op >= 0 && op < 256 && !names[static_cast<size_t>(op)].empty()
               ? names[static_cast<size_t>(op)].c_str()
               : "(unknown opcode)";
}

}  // namespace magpy
