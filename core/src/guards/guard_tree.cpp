// [SECTION] building  [SECTION] fetching  [SECTION] checks  [SECTION] describing
#include "guards/guard_tree.h"

#include "python/torch_api.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace magpy {

// [SECTION] building ---------------------------------------------------------------------------

int GuardTree::add_accessor(AccessKind kind, int parent, int index, PyObject* key,
                            std::string source) {
    for (size_t i = 0; i < m_nodes.size(); ++i) {
        const Accessor& a = m_nodes[i];
        if (a.kind != kind || a.parent != parent || a.index != index) continue;
        if ((a.key.get() == nullptr) != (key == nullptr)) continue;
        if (key && (kind == AccessKind::Constant || kind == AccessKind::CallResult)) {
            if (a.key.get() != key) continue;  // held objects: the same object, not an equal one
        } else if (key) {
            int eq = PyObject_RichCompareBool(a.key.get(), key, Py_EQ);
            if (eq < 0) PyErr_Clear();
            if (eq != 1 || Py_TYPE(a.key.get()) != Py_TYPE(key)) continue;
        }
        return static_cast<int>(i);
    }
    Accessor a;
    a.kind = kind;
    a.parent = parent;
    a.index = index;
    a.key = py::Ref::borrow(key);
    a.source = std::move(source);
    m_nodes.push_back(std::move(a));
    return static_cast<int>(m_nodes.size() - 1);
}

static PyObject* hook_keys_at(PyObject* t, int depth);

PyObject* tensor_hook_keys(PyObject* t) { return hook_keys_at(t, 0); }

static PyObject* hook_keys_at(PyObject* t, int depth) {
    static PyObject* name = PyUnicode_InternFromString("_backward_hooks");
    if (!is_tensor(t)) {  // a module: its parameters', its submodules' in turn
        if (depth > 64) {  // a module that holds itself (a review probe: the stack overflowed)
            PyErr_SetString(PyExc_RecursionError, "modules nested more than 64 deep");
            return nullptr;
        }
        PyObject** dict = _PyObject_GetDictPtr(t);
        PyObject* params = dict && *dict ? PyDict_GetItemString(*dict, "_parameters") : nullptr;
        PyObject* children = dict && *dict ? PyDict_GetItemString(*dict, "_modules") : nullptr;
        if (!params || !children || !PyDict_Check(params) || !PyDict_Check(children)) {
            PyErr_SetString(PyExc_TypeError, "not a tensor or an nn.Module");
            return nullptr;
        }
        py::Ref out = py::Ref::steal(PyList_New(0));
        for (PyObject* d : {params, children}) {
            PyObject *k, *v;
            Py_ssize_t pos = 0;
            while (out && PyDict_Next(d, &pos, &k, &v)) {
                if (v == Py_None) continue;
                py::Ref keys = py::Ref::steal(hook_keys_at(v, depth + 1));
                if (!keys || PyList_Append(out.get(), keys.get()) < 0) return nullptr;
            }
        }
        return out ? PyList_AsTuple(out.get()) : nullptr;
    }
    py::Ref hooks = py::Ref::steal(PyObject_GetAttr(t, name));
    if (!hooks) return nullptr;
    if (hooks.get() == Py_None) return PyTuple_New(0);
    return PySequence_Tuple(hooks.get());  // a dict: its keys, in order
}

// One check instead of three nodes per module: its hook dicts, read from its __dict__.
// (_backward_pre_hooks exists from torch 2.0 on.)
static PyObject* const* hook_names() {
    static PyObject* names[4] = {PyUnicode_InternFromString("_forward_hooks"),
                                 PyUnicode_InternFromString("_forward_pre_hooks"),
                                 PyUnicode_InternFromString("_backward_hooks"),
                                 PyUnicode_InternFromString("_backward_pre_hooks")};
    return names;
}

// module_has_no_hooks, which also hands back the hook containers it read (`found`, borrowed:
// null where absent).
static bool no_hooks_in(PyObject* m, PyObject* found[4]) {
    PyObject* const* names = hook_names();
    PyObject** dict = _PyObject_GetDictPtr(m);
    if (!dict || !*dict) return false;
    for (int i = 0; i < 4; ++i) {
        PyObject* n = names[i];
        PyObject* d = PyDict_GetItemWithError(*dict, n);
        found[i] = d;
        if (!d) {
            if (PyErr_Occurred()) PyErr_Clear();
            else if (n == names[3]) continue;
            return false;
        }
        Py_ssize_t len = PyDict_Check(d) ? PyDict_GET_SIZE(d) : PyObject_Length(d);
        if (len != 0) {
            PyErr_Clear();
            return false;
        }
    }
    return true;
}

bool module_has_no_hooks(PyObject* m) {
    PyObject* found[4] = {};
    return no_hooks_in(m, found);
}

// NoHooks through the check's memo ([Note: guard fetches by dict versions]): while the
// module's __dict__ keeps its version, its hook dicts are the ones found before, and only
// their sizes are read.
static bool no_hooks_kept(const Check& c, PyObject* m) {
    PyObject** dictptr = _PyObject_GetDictPtr(m);
    PyObject* d = dictptr ? *dictptr : nullptr;
    if (d && d == c.memo_dict && PyDict_Check(d) && py::dict_version(d) == c.memo_version) {
        for (PyObject* h : c.memo_hooks)
            if (h && PyDict_GET_SIZE(h) != 0) return false;
        return true;
    }
    c.memo_dict = nullptr;
    PyObject* found[4] = {};
    if (!no_hooks_in(m, found)) return false;
    if (!d || !PyDict_Check(d)) return true;
    for (int i = 0; i < 4; ++i) {
        if (found[i] && !PyDict_Check(found[i])) return true;  // nothing kept
        c.memo_hooks[i] = found[i];  // (null: absent, as _backward_pre_hooks before torch 2.0)
    }
    c.memo_dict = d;
    c.memo_version = py::dict_version(d);
    return true;
}

void GuardTree::add_check(int node, Check check) {
    auto& checks = m_nodes[static_cast<size_t>(node)].checks;
    for (const Check& c : checks)
        if (c.kind == check.kind) {
            if (c.kind == CheckKind::NoInstanceAttr || c.kind == CheckKind::KeyIn ||
                c.kind == CheckKind::NoAttr) {
                if (c.flag == check.flag &&
                    PyObject_RichCompareBool(c.key.get(), check.key.get(), Py_EQ) == 1)
                    return;
                PyErr_Clear();
                continue;
            }
            if (c.kind == CheckKind::SameAs || c.kind == CheckKind::NotSameAs) {
                if (c.other == check.other) return;
                continue;
            }
            if (c.kind != CheckKind::TensorMatch || check.tensor.with_strides == c.tensor.with_strides)
                return;  // one check of a kind per node; layout upgrades below
        }
    if (check.kind == CheckKind::TensorMatch) {
        for (Check& c : checks)
            if (c.kind == CheckKind::TensorMatch) {
                c = std::move(check);
                return;
            }
    }
    checks.push_back(std::move(check));
}

void GuardTree::add_root_check(Check check) {
    for (const Check& c : m_root_checks)
        if (c.kind == check.kind) return;
    m_root_checks.push_back(std::move(check));
}

size_t GuardTree::check_count() const {
    size_t n = m_root_checks.size();
    for (const Accessor& a : m_nodes) n += a.checks.size();
    return n;
}

// [SECTION] fetching ---------------------------------------------------------------------------

static PyObject* new_ref_or_null(PyObject* o) {
    Py_XINCREF(o);
    return o;
}

// nn.Module attributes live in __dict__ or in the _parameters/_buffers/_modules dicts that
// Module.__getattr__ searches; reading them directly skips a Python call per access.
static PyObject* module_attr(PyObject* obj, PyObject* name) {
    // a data descriptor of the class (a property) comes before the instance's dict, as in
    // getattr (a review probe added one to the class after the capture)
    PyObject* descr = _PyType_Lookup(Py_TYPE(obj), name);
    if (descr && Py_TYPE(descr)->tp_descr_set) return PyObject_GetAttr(obj, name);
    PyObject** dictptr = _PyObject_GetDictPtr(obj);
    if (dictptr && *dictptr) {
        PyObject* d = *dictptr;
        PyObject* v = PyDict_GetItemWithError(d, name);
        if (v) return new_ref_or_null(v);
        if (PyErr_Occurred()) return nullptr;
        static PyObject* kStores[] = {PyUnicode_InternFromString("_parameters"),
                                      PyUnicode_InternFromString("_buffers"),
                                      PyUnicode_InternFromString("_modules")};
        for (PyObject* store : kStores) {
            PyObject* sd = PyDict_GetItemWithError(d, store);
            if (sd && PyDict_Check(sd)) {
                v = PyDict_GetItemWithError(sd, name);
                if (v) return new_ref_or_null(v);
                if (PyErr_Occurred()) return nullptr;
            }
        }
    }
    return PyObject_GetAttr(obj, name);
}

// [Note: guard fetches by dict versions] A model's guards walk its module tree on every call:
// hundreds of lookups in module dicts, most of them far from the cache after the model's own
// run. A node reached only through dicts (a module attribute, a dict item, the n-th value of a
// module's _modules, a name in a Python module) keeps what its last fetch read: the parent
// object, each dict consulted with its version (py::dict_version), and the value found. While
// the parent is the same object and every one of those dicts keeps its version, the lookup
// would find the same value, so it is taken from the memo. The dicts are checked in the order
// they were read, each held by the one before it (the first by the parent, which is alive), so
// no freed dict is read; a dict made at a freed one's address has a version no dict had before.
// A value that is the object which last passed the node's checks has never left its dict since,
// so IdIs holds without reading its weak reference; every other check runs as before. NoHooks
// keeps the module's hook dicts the same way (no_hooks_kept).

// The dicts fetch() read to find `v` for node `a` from `parent`, noted in a.memo; nothing when
// the value came from anywhere else (getattr, a descriptor, a __getattr__).
// A dict whose lookups run no Python code: every key an exact str (a key of another type
// could answer __eq__ differently later with the dict unchanged: a review probe).
static bool str_keys_only(PyObject* d) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v))
        if (!PyUnicode_CheckExact(k)) return false;
    return true;
}

static void remember(const Accessor& a, PyObject* parent, PyObject* v) {
    FetchMemo& m = a.memo;
    m.count = 0;
    m.passed = false;
    m.ordered = false;
    bool pure = true;
    auto note = [&](PyObject* d) {
        m.dicts[m.count] = d;
        m.versions[m.count] = py::dict_version(d);
        ++m.count;
        pure = pure && str_keys_only(d);
    };
    auto found = [&](PyObject* d, PyObject* key) {
        PyObject* hit = PyDict_GetItemWithError(d, key);
        if (!hit) PyErr_Clear();
        return hit;
    };
    switch (a.kind) {
    case AccessKind::ModuleAttr: {
        PyObject** dictptr = _PyObject_GetDictPtr(parent);
        PyObject* d = dictptr ? *dictptr : nullptr;
        if (!d || !PyDict_Check(d) || !PyUnicode_CheckExact(a.key.get())) return;
        PyObject* descr = _PyType_Lookup(Py_TYPE(parent), a.key.get());
        if (descr && Py_TYPE(descr)->tp_descr_set) return;  // a property's answer may change
        note(d);
        if (PyObject* hit = found(d, a.key.get())) {
            if (hit != v) m.count = 0;
            break;
        }
        static PyObject* kStores[] = {PyUnicode_InternFromString("_parameters"),
                                      PyUnicode_InternFromString("_buffers"),
                                      PyUnicode_InternFromString("_modules")};
        PyObject* hit = nullptr;
        for (PyObject* store : kStores) {
            PyObject* sd = found(d, store);
            if (!sd || !PyDict_Check(sd)) continue;
            note(sd);
            if ((hit = found(sd, a.key.get()))) break;
        }
        if (hit != v) m.count = 0;  // (not found: it came from getattr)
        break;
    }
    case AccessKind::Attr:
        if (!PyModule_CheckExact(parent) || !PyUnicode_CheckExact(a.key.get())) return;
        note(PyModule_GetDict(parent));
        if (found(m.dicts[0], a.key.get()) != v) m.count = 0;
        break;
    case AccessKind::DictItem:
        if (!PyDict_Check(parent) || !PyUnicode_CheckExact(a.key.get())) return;
        note(parent);
        if (found(parent, a.key.get()) != v) m.count = 0;
        break;
    case AccessKind::DictValueAt:
        // an OrderedDict's own order changes with move_to_end, its version does not
        if (PyODict_Check(parent)) {
            if (!py::odict_state_known()) return;
            m.ordered = true;
            m.order = py::odict_state(parent);
        } else if (!PyDict_CheckExact(parent)) {
            return;
        }
        note(parent);
        break;
    default:
        return;
    }
    if (!pure) m.count = 0;
    if (a.kind == AccessKind::ModuleAttr || a.kind == AccessKind::DictItem) {
        PyTypeObject* t = Py_TYPE(parent);  // (its tag is valid: a lookup above assigned it)
        if (!PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG)) m.count = 0;
        m.type = t;
        m.type_tag = t->tp_version_tag;
    } else {
        m.type = nullptr;
    }
    if (m.count > 0) {
        m.parent = parent;
        m.value = v;
    }
}

PyObject* GuardTree::fetch_kept(const Accessor& a, py::IFrame* frame, PyObject* parent,
                                bool& same) const {
    same = false;
    FetchMemo& m = a.memo;
    if (m.count > 0 && parent && parent == m.parent) {
        PyObject* first = parent;  // DictItem, DictValueAt
        if (a.kind == AccessKind::ModuleAttr) {
            PyObject** dictptr = _PyObject_GetDictPtr(parent);
            first = dictptr ? *dictptr : nullptr;
        } else if (a.kind == AccessKind::Attr) {
            first = PyModule_CheckExact(parent) ? PyModule_GetDict(parent) : nullptr;
        }
        bool hit = first && first == m.dicts[0] && PyDict_Check(first);
        for (int i = 0; hit && i < m.count; ++i) hit = py::dict_version(m.dicts[i]) == m.versions[i];
        if (hit && m.ordered) hit = PyODict_Check(first) && py::odict_state(first) == m.order;
        if (hit && m.type)
            hit = Py_TYPE(parent) == m.type &&
                  PyType_HasFeature(m.type, Py_TPFLAGS_VALID_VERSION_TAG) &&
                  m.type->tp_version_tag == m.type_tag;
        if (hit) {
            same = m.passed;
            Py_INCREF(m.value);
            return m.value;
        }
    }
    m.count = 0;
    m.passed = false;
    PyObject* v = fetch(a, frame, parent);
    if (v && parent) remember(a, parent, v);
    return v;
}

PyObject* GuardTree::fetch(const Accessor& a, py::IFrame* frame, PyObject* parent) const {
    switch (a.kind) {
    case AccessKind::FrameLocal:
        return new_ref_or_null(py::frame_local(frame, a.index));
    case AccessKind::Global:
        return new_ref_or_null(PyDict_GetItemWithError(py::frame_globals(frame), a.key.get()));
    case AccessKind::Builtin: {
        PyObject* b = py::frame_builtins(frame);
        return new_ref_or_null(PyDict_Check(b) ? PyDict_GetItemWithError(b, a.key.get())
                                               : nullptr);
    }
    case AccessKind::GlobalsDict:
        return new_ref_or_null(py::frame_globals(frame));
    case AccessKind::Constant:
        return new_ref_or_null(a.key.get());
    case AccessKind::CallResult:
        return PyObject_CallNoArgs(a.key.get());
    case AccessKind::ClosureCell: {
        PyObject* closure = PyFunction_GET_CLOSURE(py::frame_function(frame));
        if (!closure || a.index >= PyTuple_GET_SIZE(closure)) return nullptr;
        return new_ref_or_null(PyCell_GET(PyTuple_GET_ITEM(closure, a.index)));
    }
    default:
        break;
    }
    if (!parent) return nullptr;
    switch (a.kind) {
    case AccessKind::Attr:
        if (PyModule_CheckExact(parent)) {  // torch.sin: one dict lookup, no type walk
            PyObject* hit = PyDict_GetItemWithError(PyModule_GetDict(parent), a.key.get());
            if (hit || PyErr_Occurred()) return new_ref_or_null(hit);
        }
        return PyObject_GetAttr(parent, a.key.get());
    case AccessKind::ModuleAttr:
        return module_attr(parent, a.key.get());
    case AccessKind::Item:
        if (PyList_CheckExact(parent))
            return a.index < PyList_GET_SIZE(parent)
                       ? new_ref_or_null(PyList_GET_ITEM(parent, a.index))
                       : nullptr;
        if (PyTuple_Check(parent))
            return a.index < PyTuple_GET_SIZE(parent)
                       ? new_ref_or_null(PyTuple_GET_ITEM(parent, a.index))
                       : nullptr;
        return PySequence_GetItem(parent, a.index);
    case AccessKind::DictItem:  // dict's own item (a subclass's __getitem__ is traced)
        if (PyDict_Check(parent)) return new_ref_or_null(PyDict_GetItemWithError(parent, a.key.get()));
        return PyObject_GetItem(parent, a.key.get());
    case AccessKind::FuncGlobal:
        if (!PyFunction_Check(parent)) return nullptr;
        return new_ref_or_null(PyDict_GetItemWithError(PyFunction_GET_GLOBALS(parent), a.key.get()));
    case AccessKind::FuncClosure: {
        if (!PyFunction_Check(parent)) return nullptr;
        PyObject* closure = PyFunction_GET_CLOSURE(parent);
        if (!closure || a.index >= PyTuple_GET_SIZE(closure)) return nullptr;
        return new_ref_or_null(PyCell_GET(PyTuple_GET_ITEM(closure, a.index)));
    }
    case AccessKind::FuncDefault: {
        if (!PyFunction_Check(parent)) return nullptr;
        PyObject* d = PyFunction_GET_DEFAULTS(parent);
        if (!d || a.index >= PyTuple_GET_SIZE(d)) return nullptr;
        return new_ref_or_null(PyTuple_GET_ITEM(d, a.index));
    }
    case AccessKind::TypeOf:
        return new_ref_or_null(reinterpret_cast<PyObject*>(Py_TYPE(parent)));
    case AccessKind::TypeLookup:
        return PyType_Check(parent)
                   ? new_ref_or_null(_PyType_Lookup(reinterpret_cast<PyTypeObject*>(parent),
                                                    a.key.get()))
                   : nullptr;
    case AccessKind::FuncKwDefault: {
        if (!PyFunction_Check(parent)) return nullptr;
        PyObject* d = PyFunction_GET_KW_DEFAULTS(parent);
        return d && PyDict_Check(d) ? new_ref_or_null(PyDict_GetItemWithError(d, a.key.get()))
                                    : nullptr;
    }
    case AccessKind::DictKeys: {
        if (PyAnySet_Check(parent)) return PySequence_Tuple(parent);  // in iteration order
        if (!PyDict_Check(parent)) return nullptr;
        // An OrderedDict's own order (move_to_end changes it, not the dict's), read by its C
        // iterator as `for k in od` does (not through a keys() a subclass may override)
        PyObject* keys = nullptr;
        if (PyObject_TypeCheck(parent, &PyODict_Type)) {
            py::Ref it = py::Ref::steal(PyODict_Type.tp_iter(parent));
            keys = it ? PySequence_List(it.get()) : nullptr;
        } else {
            keys = PyDict_Keys(parent);
        }
        if (!keys) return nullptr;
        PyObject* t = PyList_AsTuple(keys);
        Py_DECREF(keys);
        return t;
    }
    case AccessKind::IterRest:
        return iterator_rest(parent);
    case AccessKind::GenericAttr:
        return PyObject_GenericGetAttr(parent, a.key.get());
    case AccessKind::SuperLookup:
        return PyType_Check(parent)
                   ? new_ref_or_null(lookup_after(reinterpret_cast<PyTypeObject*>(parent),
                                                  a.index, a.key.get()))
                   : nullptr;
    case AccessKind::DictValueAt: {
        if (!PyDict_Check(parent)) return nullptr;
        if (PyODict_Check(parent)) {
            // an OrderedDict's own order, which iterating it (a Sequential's children) follows
            // and move_to_end changes (a review probe: storage order was read)
            py::Ref it = py::Ref::steal(PyODict_Type.tp_iter(parent));
            for (Py_ssize_t i = 0; it; ++i) {
                py::Ref k = py::Ref::steal(PyIter_Next(it.get()));
                if (!k) return nullptr;
                if (i == a.index) return new_ref_or_null(PyDict_GetItemWithError(parent, k.get()));
            }
            return nullptr;
        }
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        while (PyDict_Next(parent, &pos, &k, &v))
            if (i++ == a.index) return new_ref_or_null(v);
        return nullptr;
    }
    default:
        return nullptr;
    }
}

// Iterators read through __reduce__, which every one of these types has for pickling: list and
// tuple iterators give (iter, (seq,), index), or (iter, ((),)) once exhausted; range iterators
// (iter, (range,), index); zip (zip, (iterators...)), with a third item when strict;
// enumerate (enumerate, (iterator, count)).
PyObject* lookup_after(PyTypeObject* type, Py_ssize_t after, PyObject* name) {
    PyObject* mro = type->tp_mro;
    if (!mro || !PyTuple_Check(mro)) return nullptr;
    for (Py_ssize_t j = after + 1; j < PyTuple_GET_SIZE(mro); ++j) {
        PyObject* d = py::type_dict(reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, j)));
        PyObject* r = d ? PyDict_GetItemWithError(d, name) : nullptr;
        if (r) return r;
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return nullptr;
        }
    }
    return nullptr;
}

void iterator_lists(PyObject* it, std::vector<PyObject*>& out, int depth) {
    PyTypeObject* t = Py_TYPE(it);
    if (depth > 8 || (t != &PyListIter_Type && t != &PyZip_Type && t != &PyEnum_Type)) return;
    py::Ref red = py::Ref::steal(PyObject_CallMethod(it, "__reduce__", nullptr));
    if (!red || !PyTuple_Check(red.get()) || PyTuple_GET_SIZE(red.get()) < 2 ||
        !PyTuple_Check(PyTuple_GET_ITEM(red.get(), 1))) {
        PyErr_Clear();
        return;
    }
    PyObject* args = PyTuple_GET_ITEM(red.get(), 1);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); ++i) {
        PyObject* a = PyTuple_GET_ITEM(args, i);
        if (t == &PyListIter_Type && PyList_Check(a)) out.push_back(a);
        else iterator_lists(a, out, depth + 1);
    }
}

PyObject* iterator_rest(PyObject* it) {
    PyTypeObject* t = Py_TYPE(it);
    bool seq = t == &PyListIter_Type || t == &PyTupleIter_Type || t == &PyRangeIter_Type;
    if (!seq && t != &PyZip_Type && t != &PyEnum_Type) return nullptr;
    py::Ref red = py::Ref::steal(PyObject_CallMethod(it, "__reduce__", nullptr));
    if (!red || !PyTuple_Check(red.get()) || PyTuple_GET_SIZE(red.get()) < 2 ||
        !PyTuple_Check(PyTuple_GET_ITEM(red.get(), 1))) {
        PyErr_Clear();
        return nullptr;
    }
    PyObject* args = PyTuple_GET_ITEM(red.get(), 1);
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    py::Ref out;
    if (seq) {
        if (nargs != 1) return nullptr;
        Py_ssize_t pos = 0;  // 3.12's range iterator: None, its range starts where it is
        if (PyTuple_GET_SIZE(red.get()) >= 3 && PyTuple_GET_ITEM(red.get(), 2) != Py_None) {
            pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(red.get(), 2));
            if (pos < 0) {
                PyErr_Clear();
                return nullptr;
            }
        }
        Py_ssize_t n = PyObject_Length(PyTuple_GET_ITEM(args, 0));
        if (n < 0 || n - pos > kMaxIterRest) {
            PyErr_Clear();
            return nullptr;
        }
        py::Ref part = py::Ref::steal(
            PySequence_GetSlice(PyTuple_GET_ITEM(args, 0), std::min(pos, n), n));
        out = part ? py::Ref::steal(PySequence_List(part.get())) : py::Ref();
    } else if (t == &PyZip_Type) {
        if (PyTuple_GET_SIZE(red.get()) != 2 || nargs == 0) return nullptr;  // strict zip
        std::vector<py::Ref> rests;
        Py_ssize_t n = PY_SSIZE_T_MAX;
        for (Py_ssize_t i = 0; i < nargs; ++i) {
            rests.push_back(py::Ref::steal(iterator_rest(PyTuple_GET_ITEM(args, i))));
            if (!rests.back()) return nullptr;
            n = std::min(n, PyList_GET_SIZE(rests.back().get()));
        }
        out = py::Ref::steal(PyList_New(n));
        for (Py_ssize_t k = 0; out && k < n; ++k) {
            PyObject* row = PyTuple_New(nargs);
            if (!row) {
                out = py::Ref();
                break;
            }
            for (Py_ssize_t i = 0; i < nargs; ++i)
                PyTuple_SET_ITEM(row, i, Py_NewRef(PyList_GET_ITEM(rests[static_cast<size_t>(i)].get(), k)));
            PyList_SET_ITEM(out.get(), k, row);
        }
    } else {  // enumerate
        if (nargs != 2) return nullptr;
        py::Ref rest = py::Ref::steal(iterator_rest(PyTuple_GET_ITEM(args, 0)));
        Py_ssize_t count = PyLong_AsSsize_t(PyTuple_GET_ITEM(args, 1));
        if (!rest || count < 0) {
            PyErr_Clear();
            return nullptr;
        }
        Py_ssize_t n = PyList_GET_SIZE(rest.get());
        out = py::Ref::steal(PyList_New(n));
        for (Py_ssize_t k = 0; out && k < n; ++k) {
            PyObject* index = PyLong_FromSsize_t(count + k);
            PyObject* row = index ? PyTuple_Pack(2, index, PyList_GET_ITEM(rest.get(), k)) : nullptr;
            Py_XDECREF(index);
            if (!row) {
                out = py::Ref();
                break;
            }
            PyList_SET_ITEM(out.get(), k, row);
        }
    }
    if (!out) PyErr_Clear();
    return out.release();
}

// [SECTION] checks -----------------------------------------------------------------------------

bool is_tensor(PyObject* o) {
    const TorchApi& api = torch_api();
    return api.tensor_type && PyObject_TypeCheck(o, api.tensor_type);
}

static bool read_int_tuple(PyObject* t, std::vector<int64_t>& out) {
    if (!t || !PyTuple_Check(t)) return false;
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    out.resize(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
        out[static_cast<size_t>(i)] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
    }
    return !PyErr_Occurred();
}

bool tensor_meta_of(PyObject* t, TensorMeta& m, bool with_strides) {
    if (!is_tensor(t)) return false;
    if (tensor_is_nested(t)) return false;  // no sizes
    m.dtype = py::Ref::steal(PyObject_GetAttrString(t, "dtype"));
    m.device = py::Ref::steal(PyObject_GetAttrString(t, "device"));
    py::Ref shape = py::Ref::steal(PyObject_GetAttrString(t, "shape"));
    py::Ref rg = py::Ref::steal(PyObject_GetAttrString(t, "requires_grad"));
    if (!m.dtype || !m.device || !shape || !rg || !read_int_tuple(shape.get(), m.sizes)) {
        PyErr_Clear();
        return false;
    }
    m.requires_grad = rg.get() == Py_True;
    tensor_key_of(t, m.key, with_strides);
    m.with_strides = with_strides;
    if (with_strides) {
        m.strides = m.key.strides;
        m.storage_offset = m.key.storage_offset;
    }
    return true;
}

// Sizes with symbolic dims spelled by their source: [L['x'].size(0), 8] reads as "any".
static std::string sizes_str(const TensorMeta& t) {
    std::string s = "[";
    for (size_t d = 0; d < t.sizes.size(); ++d) {
        if (d) s += ", ";
        s += d < 64 && (t.key.dynamic >> d) & 1 ? "s" + std::to_string(d)
                                                : std::to_string(t.sizes[d]);
    }
    return s + "]";
}

// Short spelling of an object for guard text: modules print many lines, so use the type name.
static std::string short_repr(PyObject* o) {
    std::string r = py::repr_string(o);
    if (r.find('\n') == std::string::npos && r.size() <= 72) return r;
    char buf[32];
    snprintf(buf, sizeof buf, "%p", static_cast<void*>(o));
    return "<" + py::type_name(o) + " object at " + buf + ">";
}

static std::string ints_str(const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
}

static bool same_bits(double x, double y) { return std::memcmp(&x, &y, sizeof x) == 0; }

// Equality that tells apart what a program can: -0.0 from 0.0 (1 / x differs), and NaN equals
// itself, in floats and complex numbers and inside tuples, lists and slices.
bool same_constant(PyObject* expected, PyObject* v) {
    if (expected == v) return true;
    // a set of constants is guarded against a frozen copy of it
    if (Py_TYPE(expected) != Py_TYPE(v) &&
        !(PyFrozenSet_CheckExact(expected) && PySet_CheckExact(v)))
        return false;
    if (PyFloat_Check(v)) return same_bits(PyFloat_AS_DOUBLE(expected), PyFloat_AS_DOUBLE(v));
    if (std::strncmp(Py_TYPE(v)->tp_name, "numpy.float", 11) == 0) {
        // numpy's other floats (float32, float16): -0.0 is not 0.0, NaN is NaN, as for floats
        double a = PyFloat_AsDouble(expected), b = PyFloat_AsDouble(v);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return false;
        }
        return same_bits(a, b);
    }
    if (PyComplex_CheckExact(v)) {
        Py_complex a = PyComplex_AsCComplex(expected), b = PyComplex_AsCComplex(v);
        return same_bits(a.real, b.real) && same_bits(a.imag, b.imag);
    }
    if (PyTuple_CheckExact(v) || PyList_CheckExact(v)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        if (n != PySequence_Fast_GET_SIZE(expected)) return false;
        for (Py_ssize_t i = 0; i < n; ++i)
            if (!same_constant(PySequence_Fast_GET_ITEM(expected, i),
                               PySequence_Fast_GET_ITEM(v, i)))
                return false;
        return true;
    }
    if (PyAnySet_Check(v)) {
        // == of sets matches {1} with {1.0} and {True}: each element must be the same
        // constant (type and bits), as in a tuple
        // (the element of `expected` that equals each of v's, found through a dict of them)
        if (PySet_GET_SIZE(v) != PySet_GET_SIZE(expected)) return false;
        py::Ref mine = py::Ref::steal(PyDict_New());
        py::Ref it = py::Ref::steal(PyObject_GetIter(expected));
        bool same = mine && it;
        while (PyObject* e = same ? PyIter_Next(it.get()) : nullptr) {
            same = PyDict_SetItem(mine.get(), e, e) == 0;
            Py_DECREF(e);
        }
        it = same ? py::Ref::steal(PyObject_GetIter(v)) : py::Ref();
        same = same && it;
        while (PyObject* e = same ? PyIter_Next(it.get()) : nullptr) {
            PyObject* twin = PyDict_GetItemWithError(mine.get(), e);
            same = twin && same_constant(twin, e);
            Py_DECREF(e);
        }
        if (PyErr_Occurred()) {  // an element's __eq__ or __hash__ raised
            PyErr_Clear();
            return false;
        }
        return same;
    }
    if (PySlice_Check(v)) {
        auto* a = reinterpret_cast<PySliceObject*>(expected);
        auto* b = reinterpret_cast<PySliceObject*>(v);
        return same_constant(a->start, b->start) && same_constant(a->stop, b->stop) &&
               same_constant(a->step, b->step);
    }
    int eq = PyObject_RichCompareBool(expected, v, Py_EQ);
    if (eq < 0) {
        PyErr_Clear();
        return false;
    }
    return eq == 1;
}

static bool tensor_matches(const TensorMeta& want, PyObject* v, std::string* why,
                           const std::string& src) {
    if (!why) return is_tensor(v) && tensor_key_matches(v, want.key);  // the hot path
    TensorMeta got;
    if (!tensor_meta_of(v, got, want.with_strides)) {
        if (why) *why = "`" + src + "`: expected a tensor, got " + py::type_name(v);
        return false;
    }
    if (got.dtype.get() != want.dtype.get()) {
        if (why)
            *why = "tensor `" + src + "` dtype: expected " + py::str_of(want.dtype.get()) +
                   ", got " + py::str_of(got.dtype.get());
        return false;
    }
    if (!same_constant(want.device.get(), got.device.get())) {
        if (why)
            *why = "tensor `" + src + "` device: expected " + py::str_of(want.device.get()) +
                   ", got " + py::str_of(got.device.get());
        return false;
    }
    if (got.sizes.size() != want.sizes.size()) {
        if (why)
            *why = "tensor `" + src + "` rank: expected " + std::to_string(want.sizes.size()) +
                   ", got " + std::to_string(got.sizes.size());
        return false;
    }
    for (size_t d = 0; d < got.sizes.size(); ++d) {
        bool symbolic = d < 64 && (want.key.dynamic >> d) & 1;
        if (symbolic ? got.sizes[d] < 2 : got.sizes[d] != want.sizes[d]) {
            if (why)
                *why = "tensor `" + src + "` dim " + std::to_string(d) + ": expected " +
                       (symbolic ? std::string("a size of 2 or more")
                                 : std::to_string(want.sizes[d])) +
                       ", got " + std::to_string(got.sizes[d]);
            return false;
        }
    }
    if (got.requires_grad != want.requires_grad) {
        if (why)
            *why = "tensor `" + src + "` requires_grad: expected " +
                   (want.requires_grad ? "True" : "False") + ", got " +
                   (got.requires_grad ? "True" : "False");
        return false;
    }
    if (got.key.inference != want.key.inference) {
        if (why)
            *why = "tensor `" + src + "`: expected " + (want.key.inference ? "an" : "no") +
                   " inference tensor (made under torch.inference_mode())";
        return false;
    }
    if (got.key.named != want.key.named) {
        if (why)
            *why = "tensor `" + src + "`: expected a tensor " +
                   (want.key.named ? "with" : "without") + " dimension names";
        return false;
    }
    if (got.key.layout != want.key.layout) {
        if (why) *why = "tensor `" + src + "` layout: expected another layout (dense vs sparse)";
        return false;
    }
    if (want.with_strides && got.strides != want.strides) {
        if (why)
            *why = "tensor `" + src + "` strides: expected " + ints_str(want.strides) + ", got " +
                   ints_str(got.strides);
        return false;
    }
    if (want.with_strides && got.storage_offset != want.storage_offset) {
        if (why)
            *why = "tensor `" + src + "` storage offset: expected " +
                   std::to_string(want.storage_offset) + ", got " +
                   std::to_string(got.storage_offset);
        return false;
    }
    return true;
}

static bool in_instance_dict(PyObject* obj, PyObject* key) {
    PyObject** dictptr = _PyObject_GetDictPtr(obj);
    if (!dictptr || !*dictptr) return false;
    PyObject* hit = PyDict_GetItemWithError(*dictptr, key);
    if (!hit && PyErr_Occurred()) PyErr_Clear();
    return hit != nullptr;
}

// `<lambda> (file.py:12)`: where a function's code was written (the code may be gone).
static std::string code_where(PyObject* code) {
    if (!code) return "<deleted code>";
    auto* co = reinterpret_cast<PyCodeObject*>(code);
    return py::str_of(co->co_qualname) + " (" + py::str_of(co->co_filename) + ":" +
           std::to_string(co->co_firstlineno) + ")";
}

bool GuardTree::run_checks(const Accessor* a, PyObject* v, PyObject* const* values,
                           std::string* why, bool same_object) const {
    const std::vector<Check>& checks = a ? a->checks : m_root_checks;
    static const std::string kNone;
    const std::string& src = a ? a->source : kNone;
    for (const Check& c : checks) {
        bool ok = true;
        switch (c.kind) {
        case CheckKind::TypeIs: {
            PyObject* t = c.expected.get();
            ok = t && reinterpret_cast<PyObject*>(Py_TYPE(v)) == t;
            if (!ok && why)
                *why = "`" + src + "`: expected type " +
                       (t ? reinterpret_cast<PyTypeObject*>(t)->tp_name : "<deleted class>") +
                       ", got " + py::type_name(v);
            break;
        }
        case CheckKind::IdIs: {
            if (!same_object) {  // (else the object that passed, never let go since)
                PyObject* o = c.expected.get();
                ok = o == v;
                if (!ok && why)
                    *why = "`" + src + "`: expected the same object as before (" +
                           (o ? short_repr(o) : std::string("<deleted>")) + "), got " +
                           short_repr(v);
                if (!ok) break;
            }
            // A function keeps its identity when its __code__ is replaced: checked too
            // (`value`: its code when the guard was made)
            if (c.value && PyFunction_Check(v) && PyFunction_GET_CODE(v) != c.value.get()) {
                ok = false;
                if (why) *why = "`" + src + ".__code__` was replaced";
            }
            break;
        }
        case CheckKind::CodeIs: {
            PyObject* code = c.expected.get();
            ok = code && Py_TYPE(v) == &PyFunction_Type && PyFunction_GET_CODE(v) == code &&
                 PyFunction_GET_GLOBALS(v) == c.value.get();
            if (!ok && why)
                *why = "`" + src + "`: expected a function made from " + code_where(code) +
                       ", got " + short_repr(v);
            break;
        }
        case CheckKind::Equals:
            ok = same_constant(c.value.get(), v);
            if (!ok && why)
                *why = "`" + src + "`: expected " + py::repr_string(c.value.get()) + ", got " +
                       py::repr_string(v);
            break;
        case CheckKind::LenEq: {
            Py_ssize_t n = PyList_CheckExact(v)    ? PyList_GET_SIZE(v)
                           : PyTuple_CheckExact(v) ? PyTuple_GET_SIZE(v)
                           : PyDict_CheckExact(v)  ? PyDict_GET_SIZE(v)
                                                   : PyObject_Length(v);
            if (n < 0) PyErr_Clear();
            ok = n == c.length;
            if (!ok && why)
                *why = "len(" + src + "): expected " + std::to_string(c.length) + ", got " +
                       std::to_string(n);
            break;
        }
        case CheckKind::TensorMatch:
            ok = tensor_matches(c.tensor, v, why, src);
            break;
        case CheckKind::GradMode: {
            bool on = grad_mode_enabled();
            ok = on == c.flag;
            if (!ok && why)
                *why = std::string("grad mode: expected torch.is_grad_enabled() == ") +
                       (c.flag ? "True" : "False");
            break;
        }
        case CheckKind::Dispatch: {
            DispatchState now = DispatchState::current();
            ok = c.dispatch.same_as(now);
            if (!ok && why) *why = c.dispatch.difference(now);
            break;
        }
        case CheckKind::NotSameAs:
            ok = values[c.other] != v;
            if (!ok && why)
                *why = "`" + src + "` and `" + m_nodes[static_cast<size_t>(c.other)].source +
                       "`: expected two different objects, got the same object";
            break;
        case CheckKind::SameAs:
            ok = values[c.other] == v;
            if (!ok && why)
                *why = "`" + src + "` and `" + m_nodes[static_cast<size_t>(c.other)].source +
                       "`: expected the same object, got two different objects";
            break;
        case CheckKind::KeyIn: {
            PyObject* hit = PyDict_Check(v) ? PyDict_GetItemWithError(v, c.key.get()) : nullptr;
            if (!hit && PyErr_Occurred()) PyErr_Clear();
            ok = (hit != nullptr) == c.flag;
            if (!ok && why)
                *why = "`" + src + "`: expected " +
                       (c.flag ? "key " + py::repr_string(c.key.get()) + ", found none"
                               : "no key " + py::repr_string(c.key.get()) + ", found one (" +
                                     short_repr(hit) + ")");
            break;
        }
        case CheckKind::NoAttr: {
            PyObject* hit = module_attr(v, c.key.get());  // modules' stores, then getattr
            ok = hit == nullptr;
            Py_XDECREF(hit);
            PyErr_Clear();
            if (!ok && why)
                *why = "`" + src + "`: expected no attribute " + py::repr_string(c.key.get()) +
                       ", found one";
            break;
        }
        case CheckKind::TypeVersion:
            ok = PyType_Check(v) &&
                 reinterpret_cast<PyTypeObject*>(v)->tp_version_tag ==
                     static_cast<unsigned int>(c.length);
            if (!ok && why) *why = "`" + src + "`: the class was changed since (an attribute set)";
            break;
        case CheckKind::NoHooks:
            ok = no_hooks_kept(c, v);
            if (!ok && why) *why = "`" + src + "`: expected no hooks, found some";
            break;
        case CheckKind::TensorHooks: {
            py::Ref keys = py::Ref::steal(tensor_hook_keys(v));
            ok = keys && PyObject_RichCompareBool(keys.get(), c.value.get(), Py_EQ) == 1;
            PyErr_Clear();
            if (!ok && why) *why = "`" + src + "`: its backward hooks changed";
            break;
        }
        case CheckKind::NoInstanceAttr:
            ok = !in_instance_dict(v, c.key.get());
            if (!ok && why)
                *why = "`" + src + "." + py::str_of(c.key.get()) +
                       "`: expected the class attribute, got an instance attribute that "
                       "shadows it";
            break;
        }
        if (!ok) {
            const_cast<Check&>(c).failures++;
            return false;
        }
    }
    return true;
}

bool GuardTree::check(py::IFrame* frame, std::vector<PyObject*>& values) const {
    values.assign(m_nodes.size(), nullptr);
    if (!run_checks(nullptr, nullptr, nullptr, nullptr)) return false;
    constexpr size_t kAhead = 4;  // nodes whose checks are fetched into the cache early
    for (size_t i = 0; i < m_nodes.size(); ++i) {
        const Accessor& a = m_nodes[i];
        // After the program's own run (a model's forward) the tree's checks are rarely still
        // in the cache, and each is read only after the fetch before it: start their loads now.
        if (i + kAhead < m_nodes.size() && !m_nodes[i + kAhead].checks.empty())
            __builtin_prefetch(m_nodes[i + kAhead].checks.data());
        PyObject* parent = a.parent >= 0 ? values[static_cast<size_t>(a.parent)] : nullptr;
        bool same = false;
        PyObject* v = fetch_kept(a, frame, parent, same);
        if (!v) {
            if (PyErr_Occurred()) PyErr_Clear();
            return false;
        }
        values[i] = v;
        if (!run_checks(&a, v, values.data(), nullptr, same)) return false;
        if (a.memo.count > 0 && a.memo.value == v) a.memo.passed = true;
    }
    return distinct_ok(values.data(), nullptr);
}

bool GuardTree::distinct_ok(PyObject* const* values, std::string* why) const {
    size_t n = m_distinct.size();
    if (n > 16 && !why) {  // many parameters: sort instead of comparing every pair
        thread_local std::vector<PyObject*> objs;
        objs.clear();
        for (int node : m_distinct) objs.push_back(values[node]);
        std::sort(objs.begin(), objs.end());
        return std::adjacent_find(objs.begin(), objs.end()) == objs.end();
    }
    for (size_t i = 0; i + 1 < n; ++i) {
        PyObject* a = values[m_distinct[i]];
        for (size_t j = i + 1; j < n; ++j)
            if (values[m_distinct[j]] == a) {
                if (why)
                    *why = "`" + m_nodes[static_cast<size_t>(m_distinct[i])].source + "` and `" +
                           m_nodes[static_cast<size_t>(m_distinct[j])].source +
                           "`: expected two different objects, got the same object";
                return false;
            }
    }
    return true;
}

// [Note: dynamic shapes]
void GuardTree::set_dynamic_dims(int node, uint64_t dims) {
    for (Check& c : m_nodes[static_cast<size_t>(node)].checks)
        if (c.kind == CheckKind::TensorMatch) c.tensor.key.dynamic = dims;
}

uint64_t GuardTree::dynamic_dims(int node) const {
    for (const Check& c : m_nodes[static_cast<size_t>(node)].checks)
        if (c.kind == CheckKind::TensorMatch) return c.tensor.key.dynamic;
    return 0;
}

GuardTree::Changes GuardTree::changes(py::IFrame* frame) const {
    Changes out;
    std::vector<PyObject*> values(m_nodes.size(), nullptr);
    auto number = [](PyObject* o) { return PyFloat_CheckExact(o) || PyLong_CheckExact(o); };
    for (size_t i = 0; i < m_nodes.size(); ++i) {
        const Accessor& a = m_nodes[i];
        if (a.parent >= 0 && !values[static_cast<size_t>(a.parent)]) continue;
        PyObject* parent = a.parent >= 0 ? values[static_cast<size_t>(a.parent)] : nullptr;
        PyObject* v = fetch(a, frame, parent);
        if (!v) {
            PyErr_Clear();
            continue;
        }
        values[i] = v;
        for (const Check& c : a.checks) {
            if (c.kind == CheckKind::TensorMatch && is_tensor(v) && !tensor_is_nested(v)) {
                TensorKey got;
                tensor_key_of(v, got, false);
                if (got.sizes.size() != c.tensor.sizes.size()) continue;
                uint64_t dims = 0;
                for (size_t d = 0; d < got.sizes.size() && d < 64; ++d)
                    if (got.sizes[d] != c.tensor.sizes[d] && got.sizes[d] >= 2)  // 0, 1: fixed
                        dims |= uint64_t{1} << d;
                if (dims) out.dims.emplace_back(a.source, dims);
            } else if (c.kind == CheckKind::Equals && c.value && number(c.value.get()) &&
                       Py_TYPE(v) == Py_TYPE(c.value.get())) {
                int same = PyObject_RichCompareBool(v, c.value.get(), Py_EQ);
                if (same < 0) PyErr_Clear();
                if (same == 0) out.numbers.push_back(a.source);
            }
        }
    }
    release_values(values);
    return out;
}

std::string GuardTree::check_verbose(py::IFrame* frame) const {
    std::string why;
    if (!run_checks(nullptr, nullptr, nullptr, &why)) return why;
    std::vector<PyObject*> values(m_nodes.size(), nullptr);
    for (size_t i = 0; i < m_nodes.size() && why.empty(); ++i) {
        const Accessor& a = m_nodes[i];
        PyObject* parent = a.parent >= 0 ? values[static_cast<size_t>(a.parent)] : nullptr;
        PyObject* v = fetch(a, frame, parent);
        if (!v) {
            std::string err = PyErr_Occurred() ? py::fetch_error_string() : "";
            why = "`" + a.source + "` could not be read" + (err.empty() ? "" : " (" + err + ")");
            break;
        }
        values[i] = v;
        run_checks(&a, v, values.data(), &why);
    }
    if (why.empty()) distinct_ok(values.data(), &why);
    release_values(values);
    return why;
}

void GuardTree::release_values(std::vector<PyObject*>& values) {
    for (PyObject*& v : values) {
        Py_XDECREF(v);
        v = nullptr;
    }
}

// [SECTION] describing -------------------------------------------------------------------------

std::string describe_check(const Check& c, const std::string& src) {
    switch (c.kind) {
    case CheckKind::TypeIs: {
        PyObject* t = c.expected.get();
        return "type(" + src + ") is " +
               (t ? reinterpret_cast<PyTypeObject*>(t)->tp_name : "<deleted class>");
    }
    case CheckKind::IdIs: {
        PyObject* o = c.expected.get();
        return src + " is " + (o ? short_repr(o) : std::string("<deleted>"));
    }
    case CheckKind::CodeIs:
        return "same_function(" + src + ", " + code_where(c.expected.get()) + ")";
    case CheckKind::Equals: {
        // as same_constant compares floats: by their bits, which == does not say for these
        PyObject* v = c.value.get();
        if (PyFloat_CheckExact(v)) {
            double d = PyFloat_AS_DOUBLE(v);
            if (std::isnan(d)) return "math.isnan(" + src + ")";
            if (std::isinf(d)) return src + " == float('" + (d > 0 ? "inf" : "-inf") + "')";
            if (d == 0.0 && std::signbit(d)) return src + " == -0.0 (its sign too)";
        }
        return src + " == " + py::repr_string(v);
    }
    case CheckKind::LenEq:
        return "len(" + src + ") == " + std::to_string(c.length);
    case CheckKind::TensorMatch: {
        std::string s = "check_tensor(" + src + ", dtype=" + py::str_of(c.tensor.dtype.get()) +
                        ", device=" + py::str_of(c.tensor.device.get()) +
                        ", size=" + sizes_str(c.tensor) +
                        ", requires_grad=" + (c.tensor.requires_grad ? "True" : "False");
        if (c.tensor.key.inference) s += ", inference=True";
        if (c.tensor.key.named) s += ", named=True";
        if (c.tensor.with_strides)
            s += ", stride=" + ints_str(c.tensor.strides) +
                 ", storage_offset=" + std::to_string(c.tensor.storage_offset);
        return s + ")";
    }
    case CheckKind::GradMode:
        return std::string("torch.is_grad_enabled() == ") + (c.flag ? "True" : "False");
    case CheckKind::Dispatch:
        return c.dispatch.describe();
    case CheckKind::SameAs:
        return src + " is <node " + std::to_string(c.other) + ">";
    case CheckKind::NotSameAs:
        return src + " is not <node " + std::to_string(c.other) + ">";
    case CheckKind::KeyIn:
        return py::repr_string(c.key.get()) + (c.flag ? " in " : " not in ") + src;
    case CheckKind::NoInstanceAttr:
        return py::repr_string(c.key.get()) + " not in " + src + ".__dict__";
    case CheckKind::NoAttr:
        return "not hasattr(" + src + ", " + py::repr_string(c.key.get()) + ")";
    case CheckKind::NoHooks:
        return "no_hooks(" + src + ")";
    case CheckKind::TypeVersion:
        return "unchanged_class(" + src + ")";
    case CheckKind::TensorHooks:
        return "hook_ids(" + src + ") == " + py::repr_string(c.value.get());
    }
    return "?";
}

std::vector<std::string> GuardTree::describe() const {
    std::vector<std::string> out;
    for (const Check& c : m_root_checks) out.push_back(describe_check(c, ""));
    for (const Accessor& a : m_nodes)
        for (const Check& c : a.checks)
            out.push_back(c.kind == CheckKind::SameAs || c.kind == CheckKind::NotSameAs
                              ? a.source + (c.kind == CheckKind::SameAs ? " is " : " is not ") +
                                    m_nodes[static_cast<size_t>(c.other)].source
                              : describe_check(c, a.source));
    if (m_distinct.size() > 1) {
        std::string s = "distinct objects: ";
        for (size_t i = 0; i < m_distinct.size(); ++i)
            s += (i ? ", " : "") + m_nodes[static_cast<size_t>(m_distinct[i])].source;
        out.push_back(s);
    }
    return out;
}

}  // namespace magpy
