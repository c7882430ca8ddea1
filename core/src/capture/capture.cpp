// [SECTION] values  [SECTION] guards by type  [SECTION] plan  [SECTION] breaks  [SECTION] finish
#include "capture/capture.h"

#include "capture/break_reasons.h"
#include "capture/callee_rules.h"
#include "python/compat.h"
#include "python/torch_api.h"
#include "guards/tensor_check.h"

#include <algorithm>
#include <unordered_set>
#include <cstring>

namespace magpy {

Capture::Capture(PyObject* entry_function)
    : m_entry_function(entry_function), m_guards(std::make_unique<GuardTree>()),
      m_plan(std::make_shared<Plan>()) {
    m_values.emplace_back();  // value 0: NULL
    Check grad;
    grad.kind = CheckKind::GradMode;
    PyObject* on = PyObject_CallNoArgs(torch_api().is_grad_enabled.get());
    grad.flag = on == Py_True;
    if (!on) PyErr_Clear();
    Py_XDECREF(on);
    m_guards->add_root_check(std::move(grad));
    Check dispatch;
    dispatch.kind = CheckKind::Dispatch;
    dispatch.dispatch = DispatchState::current();
    m_guards->add_root_check(std::move(dispatch));
}

Capture::~Capture() = default;

// [SECTION] values -----------------------------------------------------------------------------

int Capture::new_value(ValueKind kind, PyObject* real, std::string label) {
    Value val;
    val.kind = kind;
    val.real = py::Ref::borrow(real);
    val.label = std::move(label);
    val.tensor = real && is_tensor(real);
    m_values.push_back(std::move(val));
    return static_cast<int>(m_values.size() - 1);
}

int Capture::const_value(PyObject* real, std::string label) {
    return new_value(ValueKind::Const, real, label.empty() ? py::repr_string(real) : label);
}

bool is_constant_like(PyObject* o, int depth) {
    if (o == Py_None || o == Py_Ellipsis || o == Py_NotImplemented || PyBool_Check(o) ||
        PyLong_CheckExact(o) || PyFloat_CheckExact(o) || PyComplex_CheckExact(o) ||
        PyUnicode_CheckExact(o) || PyBytes_CheckExact(o))
        return true;
    const TorchApi& api = torch_api();
    PyTypeObject* t = Py_TYPE(o);
    if (t == api.dtype_type || t == api.device_type || t == api.layout_type) return true;
    if (t == &PyRange_Type) return true;  // start, stop and step are ints
    if (t == api.version_type) return true;  // torch.__version__, compared as a version
    static PyTypeObject* pattern = imported_type("re", "Pattern");  // a compiled regex: its
    if (t == pattern) return true;  // pattern and flags never change, compared by them
    // a tuple, a shape, or a named tuple of the interpreter's (sys.version_info, the results
    // of os.stat or time.localtime): items fixed when it is made
    bool struct_seq = PyTuple_Check(o) && t->tp_base == &PyTuple_Type &&
                      PyDict_GetItemString(py::type_dict(t), "n_sequence_fields") != nullptr;
    if ((PyTuple_CheckExact(o) || t == api.size_type || struct_seq) && depth < 4) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); ++i)
            if (!is_constant_like(PyTuple_GET_ITEM(o, i), depth + 1)) return false;
        return true;
    }
    if (PyFrozenSet_CheckExact(o) && depth < 4 && PySet_GET_SIZE(o) <= 256) {
        Py_ssize_t pos = 0;
        PyObject* key;
        Py_hash_t hash;
        while (_PySet_NextEntry(o, &pos, &key, &hash))
            if (!is_constant_like(key, depth + 1)) return false;
        return true;
    }
    if (PySlice_Check(o)) {
        auto* s = reinterpret_cast<PySliceObject*>(o);
        return is_constant_like(s->start, depth + 1) && is_constant_like(s->stop, depth + 1) &&
               is_constant_like(s->step, depth + 1);
    }
    return false;
}

// enum.EnumMeta: the class of every Enum class; its members are singletons.
static PyTypeObject* enum_meta_type() {
    static PyObject* meta = [] {
        py::Ref mod = py::Ref::steal(PyImport_ImportModule("enum"));
        PyObject* m = mod ? PyObject_GetAttrString(mod.get(), "EnumMeta") : nullptr;
        if (!m || !PyType_Check(m)) PyErr_Clear();
        return m;  // kept for the process
    }();
    return meta && PyType_Check(meta) ? reinterpret_cast<PyTypeObject*>(meta) : nullptr;
}

// Objects a guard checks by identity: classes, functions, modules, and singletons (enum
// members, bare `object()` sentinels), whose identity is what programs test with `is`.
// typing's special forms and aliases (`List`, `Optional`, `List[Tensor]`, a TypeVar) and
// `list[int]`: made once, never changed, compared by identity (`List[Tensor]` in
// torch.jit.annotate and typing.cast is then a constant of the capture).
bool is_typing_object(PyObject* o) {
    PyTypeObject* t = Py_TYPE(o);
    if (t == &Py_GenericAliasType) return true;
    if (!(t->tp_flags & Py_TPFLAGS_HEAPTYPE) || !py::type_dict(t)) return false;
    PyObject* module = PyDict_GetItemString(py::type_dict(t), "__module__");  // borrowed
    return module && PyUnicode_Check(module) && PyUnicode_CompareWithASCIIString(module, "typing") == 0;
}

static bool is_identity_object(PyObject* o) {
    if (PyType_Check(o) || PyFunction_Check(o) || PyCFunction_Check(o) || PyModule_Check(o) ||
        PyCode_Check(o) || Py_TYPE(o) == &PyMethodDescr_Type ||
        Py_TYPE(o) == &PyWrapperDescr_Type || Py_TYPE(o) == &PyClassMethodDescr_Type ||
        Py_TYPE(o) == &PyBaseObject_Type)
        return true;
    // operator.itemgetter / attrgetter: immutable, what they read is fixed when made
    const char* tn = Py_TYPE(o)->tp_name;
    if (std::strcmp(tn, "operator.itemgetter") == 0 || std::strcmp(tn, "operator.attrgetter") == 0)
        return true;
    PyTypeObject* meta = enum_meta_type();
    if (meta && PyObject_TypeCheck(reinterpret_cast<PyObject*>(Py_TYPE(o)), meta)) return true;
    const TorchApi& api = torch_api();
    return PyObject_TypeCheck(o, api.module_type) || is_typing_object(o);
}

// [Note: functions by code]
// A function defined inside another (a lambda or `def` in a function body) is a new object on
// every call of the function that makes it, so guarding it by identity would recompile each
// time it is passed in again (`apply(x, fn=lambda t: t * 2)`). Such a function is guarded by
// its code and globals instead (CheckKind::CodeIs); what its call reads besides (defaults,
// keyword defaults, closure cells, globals) is read through its access path and guarded there,
// and the function itself, if it flows on, is read at replay like any input. Functions defined
// at module level keep their identity guard: they are the same object call after call, and
// folding them as constants is what makes their calls cheap to guard.
static bool is_made_per_call(PyObject* o) {
    return Py_TYPE(o) == &PyFunction_Type &&
           (reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(o))->co_flags & CO_NESTED);
}

// Equal sets may iterate in different orders (their tables' histories differ): the order the
// capture saw is guarded too, for a set or frozenset read by value.
void Capture::guard_set_order(int id) {
    const Value& val = v(id);
    PyObject* real = val.real.get();
    if (val.node < 0 || PySet_GET_SIZE(real) < 2) return;
    py::Ref order = py::Ref::steal(PySequence_Tuple(real));
    if (!order) {
        PyErr_Clear();
        internal_error("the order of a set");
        return;
    }
    int keys = m_guards->add_accessor(AccessKind::DictKeys, val.node, 0, nullptr,
                                      val.label + " in iteration order");
    Check o;
    o.kind = CheckKind::Equals;
    o.value = order;
    m_guards->add_check(keys, std::move(o));
}

// [Note: tensors that run Python on every op] A tensor subclass with its own
// __torch_function__ (or __torch_dispatch__) runs that Python on every op and attribute read,
// the capture's own reads included: what it does (counting, logging, wrapping results) is
// not followed, and a compiled graph would skip it. Such a tensor ends the capture where it
// is met; the code runs eagerly from there.
bool Capture::fail_python_tensor(int id) {
    const Value& val = v(id);
    if (!val.tensor || !runs_python_on_ops(Py_TYPE(val.real.get()))) return false;
    fail(breaks::kUnsupportedCallee,
         "`" + val.label + "` is a tensor of class " + Py_TYPE(val.real.get())->tp_name +
             ", whose own __torch_function__ or __torch_dispatch__ runs Python on every op",
         "pass a plain tensor (t.as_subclass(torch.Tensor)), or compile code that does not "
         "use the subclass");
    return true;
}

void Capture::add_type_guards(int id, PyObject* real, bool by_type) {
    Value& val = v(id);
    int node = val.node;
    val.dyn_scalar = by_type;
    if (val.tensor) {
        if (fail_python_tensor(id)) return;
        Check t;
        t.kind = CheckKind::TypeIs;
        t.expected = py::WeakOrStrong::make(reinterpret_cast<PyObject*>(Py_TYPE(real)));
        m_guards->add_check(node, std::move(t));
        Check m;
        m.kind = CheckKind::TensorMatch;
        if (tensor_is_nested(real) || !tensor_meta_of(real, m.tensor, false)) {
            fail(breaks::kDynamicShape, "`" + val.label + "` is a nested tensor, whose sizes a "
                 "guard cannot check", "pass a padded tensor (nested.to_padded_tensor(0.0))");
            return;
        }
        m.tensor.key.dynamic = dynamic_dims_for(node, real);
        if (m.tensor.key.dynamic) m_dynamic_nodes.push_back(node);
        m_guards->add_check(node, std::move(m));
        return;
    }
    if (is_constant_like(real) && !by_type) {
        val.kind = ValueKind::Const;
        Check c;
        c.kind = CheckKind::Equals;
        c.value = py::Ref::borrow(real);
        m_guards->add_check(node, std::move(c));
        if (PyFrozenSet_CheckExact(real)) guard_set_order(id);
        return;
    }
    if (PyTuple_CheckExact(real) && !by_type &&
        m_guards->node(node).kind == AccessKind::DictKeys) {
        // The keys of a dict passed in, not all constants (enum members, objects): each key
        // that is a constant by value, the others by identity. The capture takes each key for
        // itself (`k.scale`), and an equal key of another class or state must not pass
        // (`{Mode.A: 1}` then `{"a": 1}`: Mode.A == "a").
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(real); ++i) {
            PyObject* k = PyTuple_GET_ITEM(real, i);
            int item = m_guards->add_accessor(AccessKind::Item, node, static_cast<int>(i),
                                              nullptr, val.label + "[" + std::to_string(i) + "]");
            Check c;
            if (is_constant_like(k)) {
                c.kind = CheckKind::Equals;
                c.value = py::Ref::borrow(k);
            } else {
                c.kind = CheckKind::IdIs;
                c.expected = py::WeakOrStrong::make(k);
            }
            m_guards->add_check(item, std::move(c));
        }
    }
    if (PySet_CheckExact(real) && !by_type) {
        // A set of constants (flags, layer indices to skip): compared by value with a frozen
        // copy (the set itself may change later); set methods are not captured, so the
        // capture never changes it.
        py::Ref frozen = py::Ref::steal(PyFrozenSet_New(real));
        if (frozen && is_constant_like(frozen.get())) {
            val.kind = ValueKind::Const;
            Check t;
            t.kind = CheckKind::TypeIs;
            t.expected = py::WeakOrStrong::make(reinterpret_cast<PyObject*>(&PySet_Type));
            m_guards->add_check(node, std::move(t));
            Check c;
            c.kind = CheckKind::Equals;
            c.value = frozen;
            m_guards->add_check(node, std::move(c));
            guard_set_order(id);
            return;
        }
        PyErr_Clear();
    }
    Check c;
    if (is_made_per_call(real)) {
        c.kind = CheckKind::CodeIs;
        c.expected = py::WeakOrStrong::make(PyFunction_GET_CODE(real));
        c.value = py::Ref::borrow(PyFunction_GET_GLOBALS(real));
    } else if (is_identity_object(real)) {
        val.identity = true;
        c.kind = CheckKind::IdIs;
        c.expected = py::WeakOrStrong::make(real);
        if (PyFunction_Check(real))  // and its code: `h.__code__ = g.__code__` (a review probe)
            c.value = py::Ref::borrow(PyFunction_GET_CODE(real));
    } else {
        c.kind = CheckKind::TypeIs;
        c.expected = py::WeakOrStrong::make(reinterpret_cast<PyObject*>(Py_TYPE(real)));
    }
    m_guards->add_check(node, std::move(c));
}

// A new guard node reached `real`. An object already known by another path is the same value
// (writes through one path are seen through the other): guard that the paths still agree.
// Tensors are not merged: the plan reads each path at replay and runs the real ops on the real
// tensors, which is right whether or not two paths meet.
int Capture::register_input(int node, PyObject* real, bool by_type) {
    if (!by_type && m_dynamic.numbers && m_dynamic.mode != 0 &&
        (PyFloat_CheckExact(real) || PyLong_CheckExact(real)) &&
        m_dynamic.numbers->count(m_guards->node(node).source)) {
        // A number whose value changed between calls (automatic dynamic): a symbolic number
        // read at replay, guarded by type until Python needs its value (concretize).
        int id = new_value(ValueKind::Input, real, m_guards->node(node).source);
        v(id).node = node;
        add_type_guards(id, real, true);
        v(id).dyn_scalar = false;
        v(id).sym = true;
        v(id).sym_deps = {{node, 1}};
        m_dynamic_numbers.push_back(id);
        m_node_values[node] = id;
        return id;
    }
    if (!is_constant_like(real) && !is_tensor(real)) {
        auto seen = m_input_objects.find(real);
        if (seen != m_input_objects.end()) {
            Check same;
            same.kind = CheckKind::SameAs;
            same.other = v(seen->second).node;
            m_guards->add_check(node, std::move(same));
            m_node_values[node] = seen->second;
            return seen->second;
        }
    }
    auto hidden = m_changed_tensors.find(real);
    if (hidden != m_changed_tensors.end()) {  // first read after code that may have changed it
        fail(breaks::kMutatedThenRead,
             "`" + m_guards->node(node).source + "` is read after `" + hidden->second.second +
                 "`, which may have changed its sizes or requires_grad",
             "read it before that call, or outside the compiled function");
        return -1;
    }
    int id = new_value(ValueKind::Input, real, m_guards->node(node).source);
    v(id).node = node;
    add_type_guards(id, real, by_type);
    m_node_values[node] = id;
    if (v(id).kind == ValueKind::Input && !by_type) m_input_objects[real] = id;
    if (v(id).tensor && !m_failed) {
        for (int changed : m_metadata_changed) {  // [Note: metadata changed through one path]
            if (v(changed).real.get() == real) {
                fail(breaks::kMutatedThenRead,
                     "`" + v(id).label + "` is the same tensor as `" + v(changed).label +
                         "`, whose shape or requires_grad this function changed in place",
                     "read it through one name, or change it before the call");
                return id;
            }
            Check c;
            c.kind = CheckKind::NotSameAs;
            c.other = v(changed).node;
            m_guards->add_check(node, std::move(c));
        }
    }
    if (v(id).tensor && !m_failed) {  // its hooks as the call found them (guard_tensor_hooks)
        if (PyObject* keys = tensor_hook_keys(real)) m_entry_hooks[node] = py::Ref::steal(keys);
        else PyErr_Clear();
    }
    return id;
}

int Capture::input_root(AccessKind kind, int index, PyObject* key, const std::string& source,
                        PyObject* real, bool by_type) {
    int node = m_guards->add_accessor(kind, -1, index, key, source);
    auto it = m_node_values.find(node);
    if (it != m_node_values.end()) return it->second;
    return register_input(node, real, by_type);
}

int Capture::constant_root(PyObject* obj, const std::string& source, bool pinned) {
    int node = m_guards->add_accessor(AccessKind::Constant, -1, 0, obj, source);
    auto it = m_node_values.find(node);
    int id = it != m_node_values.end() ? it->second : new_value(ValueKind::Input, obj, source);
    v(id).node = node;
    m_node_values[node] = id;
    if (pinned) v(id).identity = true;
    return id;
}

int Capture::input_child(int parent, AccessKind kind, int index, PyObject* key,
                         const std::string& suffix, PyObject* real, bool by_type) {
    Value& p = v(parent);
    if (p.node < 0) {
        internal_error("path step from a value with no access path");
        return -1;
    }
    // Its type, and the attributes of a dict subclass (a ModelOutput), do not change with its
    // items: read them after writes too
    bool beside_items = kind == AccessKind::TypeOf || kind == AccessKind::TypeLookup ||
                        kind == AccessKind::SuperLookup ||
                        (kind == AccessKind::Attr && p.real && PyDict_Check(p.real.get()) &&
                         !PyDict_CheckExact(p.real.get()));
    if (p.mutated && !beside_items &&
        !(p.keyed_writes && (kind == AccessKind::DictItem ||
                             kind == AccessKind::DictKeys))) {  // [Note: dict writes]
        fail(breaks::kMutatedThenRead,
             "`" + p.label + "` is read after this function changed it",
             "read it before changing it, or keep the value in a local variable");
        return -1;
    }
    // [Note: library calls that change state]; methods are looked up, not state read
    PyObject* pr = p.real.get();
    PyObject* globals = !pr                                                   ? nullptr
                        : kind == AccessKind::FuncGlobal && PyFunction_Check(pr) ? PyFunction_GET_GLOBALS(pr)
                        : kind == AccessKind::Attr && PyModule_Check(pr)       ? PyModule_GetDict(pr)
                        : kind == AccessKind::DictItem && PyDict_Check(pr)     ? pr
                                                                               : nullptr;
    if (global_changed(globals, key, p.label + suffix)) return -1;
    if (pr && PyType_Check(pr) && (kind == AccessKind::Attr || kind == AccessKind::TypeLookup) &&
        !m_changed_globals.empty() && real && !PyFunction_Check(real)) {
        // a class attribute, wherever on the MRO it is set (methods are looked up, not state)
        PyObject* mro = reinterpret_cast<PyTypeObject*>(pr)->tp_mro;
        for (Py_ssize_t i = 0; mro && i < PyTuple_GET_SIZE(mro); ++i)
            if (global_changed(reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i))->tp_dict,
                               key, p.label + suffix))
                return -1;
    }

    if (!beside_items && real &&
        !(PyFunction_Check(real) || PyMethod_Check(real) || PyCFunction_Check(real)) &&
        read_after_change(p.real.get(), p.label + suffix))
        return -1;
    int node = m_guards->add_accessor(kind, p.node, index, key, p.label + suffix);
    auto it = m_node_values.find(node);
    if (it != m_node_values.end()) return it->second;
    return register_input(node, real, by_type);
}

// [Note: library calls that change state] An optimizer's or scheduler's step() is recorded as
// one op, so the capture does not see what it writes: learning rates in param_groups, the step
// counters, the optimizer's state. Its effect is visible (the plan cannot give up after it), and
// the objects it reaches through its arguments (instances, their __dict__s, lists, tuples and
// dicts, tensors and functions excluded) are remembered: a later read of one of them in this
// capture is a graph break there (MB008), so the next segment reads it afresh, after the call.
void Capture::changed_by_call(const std::vector<PyObject*>& roots, const std::string& call,
                              bool hidden_code) {
    constexpr size_t kMaxObjects = 4096;
    constexpr int kMaxDepth = 64;  // (the object count bounds the walk)
    std::vector<std::pair<PyObject*, int>> todo;
    for (PyObject* r : roots) todo.emplace_back(r, 0);
    auto skip = [](PyObject* o) {
        return o == Py_None || PyLong_Check(o) || PyFloat_Check(o) || PyUnicode_Check(o) ||
               PyBytes_Check(o) || PyBool_Check(o) || PyType_Check(o) || PyModule_Check(o) ||
               is_tensor(o);
    };
    std::vector<PyObject*> reached;
    std::unordered_set<PyObject*> tensors;  // reached: their sizes or requires_grad may change
    while (!todo.empty()) {
        auto [o, depth] = todo.back();
        todo.pop_back();
        // (Python of the user's ran, a hook say: the tensors it reaches through its closure,
        // globals or objects; not those it was given, which it rarely reshapes)
        if (o && hidden_code && depth > 0 && is_tensor(o)) {
            tensors.insert(o);
            m_changed_tensors.emplace(o, std::make_pair(py::Ref::borrow(o), call));
        }
        if (!o || skip(o) || m_changed.count(o)) continue;
        if (m_changed.size() >= kMaxObjects) {
            fail(breaks::kMutatedThenRead,
                 "`" + call + "` reaches more objects than the capture follows",
                 "call it outside the compiled function");
            return;
        }
        m_changed.emplace(o, std::make_pair(py::Ref::borrow(o), call));
        reached.push_back(o);
        if (depth >= kMaxDepth) continue;
        if (PyFunction_Check(o)) {  // what its closure cells and defaults hold (an LBFGS
                                    // closure's state, `def hook(g, s=state)`)
            // The cells its code rebinds (`nonlocal gnorm`) are changed themselves; of the
            // others, only what they hold (`lambda t: t * scale` leaves `scale` as it was).
            PyObject* cells = PyFunction_GET_CLOSURE(o);
            auto* fco = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(o));
            std::vector<PyObject*> rebound_names = py::code_stored_derefs(fco);
            int first_free = py::code_nlocalsplus(fco) - fco->co_nfreevars;
            for (Py_ssize_t i = 0; cells && i < PyTuple_GET_SIZE(cells); ++i) {
                PyObject* cell = PyTuple_GET_ITEM(cells, i);
                PyObject* name = i < fco->co_nfreevars
                                     ? py::code_localsplus_name(fco, first_free + static_cast<int>(i))
                                     : nullptr;
                bool rebinds = !name;  // (unknown: as rebound)
                for (PyObject* r : rebound_names)
                    rebinds = rebinds || PyUnicode_Compare(r, name) == 0;
                if (rebinds) todo.emplace_back(cell, depth + 1);
                else if (PyCell_Check(cell) && PyCell_GET(cell)) todo.emplace_back(PyCell_GET(cell), depth + 1);
            }
            todo.emplace_back(PyFunction_GET_DEFAULTS(o), depth + 1);
            todo.emplace_back(PyFunction_GET_KW_DEFAULTS(o), depth + 1);
            // and the module globals its code names (`STATS["n"] += 1`), unless it is torch's
            // own; those it stores (`global count`) are rebound
            PyObject* globals = PyFunction_GET_GLOBALS(o);
            if (names_torch_module(PyDict_GetItemString(globals, "__name__"))) continue;
            // ; the attributes its code stores are rebound on the classes and modules it names
            // (`Stats.n += 1`); `globals()[k] = v` may rebind any of them
            std::vector<PyCodeObject*> codes{reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(o))};
            std::vector<PyObject*> named;  // classes and modules
            std::vector<std::string> attrs;
            for (size_t c = 0; c < codes.size() && c < 64; ++c) {
                PyCodeObject* co = codes[c];
                for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(co->co_consts); ++i)
                    if (PyCode_Check(PyTuple_GET_ITEM(co->co_consts, i)))
                        codes.push_back(reinterpret_cast<PyCodeObject*>(PyTuple_GET_ITEM(co->co_consts, i)));
                for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(co->co_names); ++i) {
                    PyObject* name = PyTuple_GET_ITEM(co->co_names, i);
                    PyObject* g = PyDict_GetItemWithError(globals, name);
                    if (g && (PyType_Check(g) || PyModule_Check(g))) named.push_back(g);
                    else if (g) todo.emplace_back(g, depth + 1);
                    else if (!PyErr_Occurred() && PyUnicode_CompareWithASCIIString(name, "globals") == 0)
                        m_changed_globals.emplace(std::make_pair(globals, std::string("*")), call);
                }
                PyErr_Clear();
                for (PyObject* name : py::code_stored_names(co, false))
                    m_changed_globals.emplace(std::make_pair(globals, py::str_of(name)), call);
                for (PyObject* name : py::code_stored_names(co, true)) attrs.push_back(py::str_of(name));
            }
            for (PyObject* g : named) {
                PyObject* ns = PyModule_Check(g) ? PyModule_GetDict(g)
                                                 : reinterpret_cast<PyTypeObject*>(g)->tp_dict;
                for (const std::string& a : attrs) m_changed_globals.emplace(std::make_pair(ns, a), call);
            }
            continue;
        }
        if (PyMethod_Check(o)) {
            todo.emplace_back(PyMethod_GET_SELF(o), depth + 1);
            todo.emplace_back(PyMethod_GET_FUNCTION(o), depth + 1);
            continue;
        }
        if (PyCFunction_Check(o)) {  // a bound C method's object (`register_hook(grads.append)`)
            todo.emplace_back(PyCFunction_GET_SELF(o), depth + 1);
            continue;
        }
        if (PyCell_Check(o)) {  // a closure cell (`nonlocal count` in a hook): rebound, so read
            todo.emplace_back(PyCell_GET(o), depth + 1);  // afresh too (read_after_change)
            continue;
        }
        if (PyWeakref_CheckRef(o)) {  // `ref = weakref.ref(self)` in a hook
            todo.emplace_back(PyWeakref_GET_OBJECT(o), depth + 1);
            continue;
        }
        if (PyDict_Check(o)) {
            PyObject *k, *val;
            Py_ssize_t pos = 0;
            while (PyDict_Next(o, &pos, &k, &val)) todo.emplace_back(val, depth + 1);
        } else if (PyList_Check(o) || PyTuple_Check(o)) {
            for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(o); ++i)
                todo.emplace_back(PySequence_Fast_GET_ITEM(o, i), depth + 1);
        } else if (Py_TYPE(o)->tp_traverse && !PyObject_TypeCheck(o, functools_partial_type())) {
            // an instance: its __dict__, its __slots__, what a C object holds (a deque's items)
            std::vector<PyObject*> held;
            Py_TYPE(o)->tp_traverse(
                o,
                [](PyObject* x, void* arg) {
                    static_cast<std::vector<PyObject*>*>(arg)->push_back(x);
                    return 0;
                },
                &held);
            for (PyObject* x : held) todo.emplace_back(x, depth + 1);
        } else if (PyObject** dict = _PyObject_GetDictPtr(o); dict && *dict) {
            todo.emplace_back(*dict, depth + 1);
        }
        if (PyObject_TypeCheck(o, functools_partial_type())) {  // its function and arguments
            for (const char* part : {"func", "args", "keywords"}) {
                PyObject* x = PyObject_GetAttrString(o, part);
                if (x) {
                    todo.emplace_back(x, depth + 1);
                    m_changed_parts.emplace_back(py::Ref::steal(x));
                }
                PyErr_Clear();
            }
        }
    }
    // A tensor the hidden code reached may have had its metadata changed in place there
    // (`t.requires_grad_(...)`, `buf.resize_(n)` in a gradient hook; a review probe: the
    // values read at capture were replayed): its sizes and flags are read at replay from here
    // on, as after the capture's own in-place changes of them.
    if (!tensors.empty())
        for (size_t id = 0; id < m_values.size(); ++id) {
            const Value& val = m_values[id];
            if (val.tensor && val.real && tensors.count(val.real.get()))
                reshaped_in_place(static_cast<int>(id));
        }
    // What the capture already follows itself (containers made in the call, objects it wrote
    // or shadows) would be read from its own copy afterwards: the call is a break instead, so
    // the next segment reads them afresh.
    std::unordered_set<PyObject*> now(reached.begin(), reached.end()), written;
    for (const auto& [key, value] : m_overlay) written.insert(v(key.first).real.get());
    for (const Value& val : m_values) {
        PyObject* r = val.real.get();
        if (!r || !now.count(r)) continue;
        bool followed = val.kind == ValueKind::FreshList || val.kind == ValueKind::FreshDict ||
                        val.kind == ValueKind::FreshTuple || val.kind == ValueKind::FreshSet ||
                        val.kind == ValueKind::FreshObject ||
                        (val.kind == ValueKind::Input && (val.mutated || val.shadow));
        if (followed || written.count(r)) {
            fail(breaks::kMutatedThenRead,
                 "`" + val.label + "`, which this function made or changed, is given to `" +
                     call + "`, which may change it",
                 "change it after that call, or outside the compiled function");
            return;
        }
    }
}

bool Capture::set_items(int id, std::vector<int>& out) {
    out.clear();
    PyObject* it = PyObject_GetIter(v(id).real.get());
    while (PyObject* e = it ? PyIter_Next(it) : nullptr) {
        out.push_back(const_value(e));
        Py_DECREF(e);
    }
    Py_XDECREF(it);
    if (!PyErr_Occurred()) return true;
    internal_error("the elements of a set made in the call");
    return false;
}

// set([...]) of a set's elements iterates as the set does unless removals left its table
// larger than a new one's (then the order can differ, and with it what a loop over it computes).
bool Capture::set_items_in_order(int id, std::vector<int>& out) {
    if (!set_items(id, out)) return false;
    py::Ref list = py::Ref::steal(PyList_New(0));
    for (int e : out)
        if (list && PyList_Append(list.get(), v(e).real.get()) < 0) list = py::Ref();
    py::Ref again = list ? py::Ref::steal(PySet_New(list.get())) : py::Ref();
    py::Ref order = again ? py::Ref::steal(PySequence_List(again.get())) : py::Ref();
    int same = order ? PyObject_RichCompareBool(order.get(), list.get(), Py_EQ) : -1;
    if (same < 0) {
        PyErr_Clear();
        internal_error("the elements of a set made in the call");
        return false;
    }
    if (!same)
        fail(breaks::kUnsupportedCallee,
             "a set made in the call leaves it after elements were removed, and a set made "
             "again of what it holds would iterate in another order",
             "build the set again from its elements before it leaves: s = set(sorted(s))");
    return same == 1;
}

int Capture::fresh(ValueKind kind, std::vector<int> items, PyObject* real) {
    // A tuple made only of constants is itself a constant.
    if (kind == ValueKind::FreshTuple) {
        bool all_const = true;
        for (int i : items) all_const = all_const && v(i).kind == ValueKind::Const;
        if (all_const && real) return const_value(real);
    }
    int id = new_value(kind, real, kind == ValueKind::FreshList    ? "[...]"
                                   : kind == ValueKind::FreshTuple ? "(...)"
                                                                   : "{...}");
    v(id).items = std::move(items);
    return id;
}

// [SECTION] guards by type ---------------------------------------------------------------------

void Capture::guard_no_hooks(int id) {
    if (v(id).node < 0) return;
    Check c;
    c.kind = CheckKind::NoHooks;
    m_guards->add_check(v(id).node, std::move(c));
}

// [Note: library calls that change state] A read of `obj` (spelled `what`), which such a call
// reached: a break (true). Through input_child, or a length or the items of a list passed in.
bool Capture::read_after_change(PyObject* obj, const std::string& what) {
    auto changed = obj ? m_changed.find(obj) : m_changed.end();
    if (changed == m_changed.end()) return false;
    fail(breaks::kMutatedThenRead,
         "`" + what + "` is read after `" + changed->second.second + "`, which may have changed it",
         "read it before that call, or outside the compiled function");
    return true;
}

void Capture::rebound(PyObject* obj) { m_changed.erase(obj); }

bool Capture::global_changed(PyObject* globals, PyObject* name, const std::string& what) {
    if (!globals || !name || !PyUnicode_Check(name) || m_changed_globals.empty()) return false;
    auto it = m_changed_globals.find(std::make_pair(globals, py::str_of(name)));
    if (it == m_changed_globals.end()) it = m_changed_globals.find(std::make_pair(globals, std::string("*")));
    if (it == m_changed_globals.end()) return false;
    fail(breaks::kMutatedThenRead,
         "`" + what + "` is read after `" + it->second + "`, which may have changed it",
         "read it before that call, or outside the compiled function");
    return true;
}

// `keys` (tensor_hook_keys) without the hooks registered in the call (new reference).
static PyObject* without_ids(PyObject* keys, const std::set<long>& made) {
    PyObject* out = PyList_New(0);
    for (Py_ssize_t i = 0; out && i < PyTuple_GET_SIZE(keys); ++i) {
        PyObject* k = PyTuple_GET_ITEM(keys, i);
        if (PyTuple_Check(k)) {
            py::Ref inner = py::Ref::steal(without_ids(k, made));
            if (!inner || PyList_Append(out, inner.get()) < 0) Py_CLEAR(out);
        } else if (!(PyLong_Check(k) && made.count(PyLong_AsLong(k))) &&
                   PyList_Append(out, k) < 0) {
            Py_CLEAR(out);
        }
    }
    if (!out) return nullptr;
    PyObject* t = PyList_AsTuple(out);
    Py_DECREF(out);
    return t;
}

void Capture::entry_hooks_of_module(int id, const std::set<long>& made_in_call) {
    Value& m = v(id);
    if (m.kind != ValueKind::Input || m.node < 0 || m_entry_hooks.count(m.node)) return;
    py::Ref keys = py::Ref::steal(tensor_hook_keys(m.real.get()));
    PyObject* entry = keys ? without_ids(keys.get(), made_in_call) : nullptr;
    if (entry) m_entry_hooks[m.node] = py::Ref::steal(entry);
    else PyErr_Clear();
}

// The hooks as the call found them (m_entry_hooks): hooks it registers itself, and removes
// before it ends, are the plan's own (a review probe: a per-call hook failed this guard every
// call). Tensors that require grad, and the leaf modules called (their parameters').
void Capture::guard_tensor_hooks() {
    for (const Value& val : m_values) {
        PyObject* t = val.real.get();
        if (val.kind != ValueKind::Input || val.node < 0 || !t) continue;
        if (val.tensor) {
            py::Ref grad = py::Ref::steal(PyObject_GetAttrString(t, "requires_grad"));
            PyErr_Clear();
            if (grad.get() != Py_True) continue;
        }
        auto entry = m_entry_hooks.find(val.node);
        if (entry == m_entry_hooks.end() || !m_hooks_guarded.insert(val.node).second) continue;
        Check c;
        c.kind = CheckKind::TensorHooks;
        c.value = entry->second;
        m_guards->add_check(val.node, std::move(c));
    }
}

void Capture::forget(PyObject* obj) {
    for (Value& val : m_values)
        if (val.real.get() == obj) val.real = py::Ref();
}

bool Capture::read_after_change(int id) {
    const Value& val = v(id);
    return val.kind == ValueKind::Input && read_after_change(val.real.get(), val.label);
}

void Capture::guard_len(int id, Py_ssize_t n) {
    Value& val = v(id);
    if (val.node < 0 || read_after_change(id)) return;
    Check c;
    c.kind = CheckKind::LenEq;
    c.length = n;
    m_guards->add_check(val.node, std::move(c));
}

// An answer folded from the slots of an object's class (`if obj:` with no __bool__ or __len__,
// callable(obj)) holds while the class is unchanged: a class of the user's (the interpreter's
// own cannot change) is guarded by its version tag, which any attribute set on it or its bases
// renews (a review probe: `A.__bool__ = ...` between calls kept the old branch).
bool Capture::guard_class_unchanged(int id) {
    Value& val = v(id);
    PyObject* o = val.real.get();
    PyTypeObject* t = o ? Py_TYPE(o) : nullptr;
    if (!t || !(t->tp_flags & Py_TPFLAGS_HEAPTYPE) || val.node < 0) return true;
    static PyObject* probe = PyUnicode_InternFromString("__bool__");  // kept
    _PyType_Lookup(t, probe);  // (gives the class a version tag if it has none)
    if (!(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) || t->tp_version_tag == 0) {
        fail(breaks::kUnsupportedOpcode,
             "the class of " + val.label + " cannot be guarded against changes",
             "test a flag or `is None` instead");
        return false;
    }
    int cls = input_child(id, AccessKind::TypeOf, 0, nullptr, ".__class__",
                          reinterpret_cast<PyObject*>(t));
    if (cls < 0 || v(cls).node < 0) return false;
    Check c;
    c.kind = CheckKind::TypeVersion;
    c.length = static_cast<Py_ssize_t>(t->tp_version_tag);
    m_guards->add_check(v(cls).node, std::move(c));
    return true;
}

void Capture::guard_identity(int id) {
    Value& val = v(id);
    if (val.node < 0 || val.identity) return;
    Check c;
    c.kind = CheckKind::IdIs;
    c.expected = py::WeakOrStrong::make(val.real.get());
    if (PyFunction_Check(val.real.get())) c.value = py::Ref::borrow(PyFunction_GET_CODE(val.real.get()));
    m_guards->add_check(val.node, std::move(c));
}

void Capture::guard_strides(int id) {
    Value& val = v(id);
    if (val.node < 0 || !val.tensor) return;
    m_guards->set_dynamic_dims(val.node, 0);  // strides follow the sizes
    Check m;
    m.kind = CheckKind::TensorMatch;
    tensor_meta_of(val.real.get(), m.tensor, true);
    m_guards->add_check(val.node, std::move(m));
}

bool Capture::guard_same_object(int a, int b) {
    int na = v(a).node, nb = v(b).node;
    // (a number or string read from the inputs is a Const with a node: guarded by value)
    auto read = [&](int id) {
        return v(id).kind == ValueKind::Input || v(id).kind == ValueKind::Const;
    };
    if (na < 0 || nb < 0 || !read(a) || !read(b)) return false;
    if (na == nb) return true;
    Check c;  // on the later node: the earlier one is fetched first
    c.kind = v(a).real.get() == v(b).real.get() ? CheckKind::SameAs : CheckKind::NotSameAs;
    c.other = std::min(na, nb);
    m_guards->add_check(std::max(na, nb), std::move(c));
    return true;
}

void Capture::guard_absent(int id, CheckKind kind, PyObject* key, bool flag) {
    if (v(id).node < 0 || read_after_change(id)) return;
    Check c;
    c.kind = kind;
    c.key = py::Ref::borrow(key);
    c.flag = flag;
    m_guards->add_check(v(id).node, std::move(c));
}

void Capture::guard_equals(int id, PyObject* value) {
    Value& val = v(id);
    if (val.node < 0 || read_after_change(id)) return;
    Check c;
    c.kind = CheckKind::Equals;
    c.value = value ? py::Ref::borrow(value) : val.real;
    m_guards->add_check(val.node, std::move(c));
}

// [SECTION] dynamic shapes ---------------------------------------------------------------------
// [Note: dynamic shapes]

uint64_t Capture::dynamic_dims_for(int node, PyObject* t) {
    if (m_dynamic.mode == 0) return 0;
    const Accessor& a = m_guards->node(node);
    uint64_t dims = 0;
    if (m_dynamic.dims) {
        auto it = m_dynamic.dims->find(a.source);
        if (it != m_dynamic.dims->end()) dims |= it->second;
    }
    // dynamic=True: every dim of the tensors passed in (parameters and buffers keep theirs).
    if (m_dynamic.mode == 1 && a.kind != AccessKind::ModuleAttr) dims = ~uint64_t{0};
    // magpy.mark_dynamic(t, dim)
    PyObject* marked = PyObject_GetAttrString(t, "_magpy_dynamic_dims");
    if (marked) {
        py::Ref seq = py::Ref::steal(PySequence_Tuple(marked));
        Py_DECREF(marked);
        for (Py_ssize_t i = 0; seq && i < PyTuple_GET_SIZE(seq.get()); ++i) {
            long d = PyLong_AsLong(PyTuple_GET_ITEM(seq.get(), i));
            if (d >= 0 && d < 64) dims |= uint64_t{1} << d;
        }
    }
    PyErr_Clear();
    // Sizes 0 and 1 stay fixed (as in torch.compile): broadcasting and emptiness depend on them.
    PyObject* shape = PyObject_GetAttrString(t, "shape");
    uint64_t ok = 0;
    for (Py_ssize_t d = 0; shape && d < PyTuple_GET_SIZE(shape) && d < 64; ++d)
        if (PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d)) >= 2) ok |= uint64_t{1} << d;
    Py_XDECREF(shape);
    PyErr_Clear();
    return dims & ok;
}

bool Capture::sym_tensor(int id) {
    const Value& val = v(id);
    if (!val.tensor) return false;
    if (val.kind == ValueKind::Input) return val.node >= 0 && m_guards->dynamic_dims(val.node);
    return val.sym;
}

// An argument that carries symbolic sizes into an op: a symbolic tensor or number, or a
// container whose items may be such (conservatively, any container when dims are symbolic).
bool Capture::arg_sym(const Arg& a) {
    switch (a.kind) {
    case Arg::Kind::Const: return false;
    case Arg::Kind::Input: {
        auto it = m_node_values.find(a.index);
        if (it == m_node_values.end()) return true;
        const Value& val = v(it->second);
        if (val.tensor) return sym_tensor(it->second);
        return !(val.kind == ValueKind::Const || val.identity);
    }
    case Arg::Kind::Slot: {
        size_t s = static_cast<size_t>(a.index);
        if (s >= m_slot_values.size() || m_slot_values[s] < 0) return true;  // built containers
        const Value& val = v(m_slot_values[s]);
        return val.sym || val.sym_all || !val.sym_deps.empty();
    }
    }
    return true;
}

int Capture::slot_value(const Arg& a) const {
    if (a.kind != Arg::Kind::Slot) return -1;
    size_t s = static_cast<size_t>(a.index);
    if (s < m_slot_values.size() && m_slot_values[s] >= 0) return m_slot_values[s];
    auto built = m_built_slots.find(a.index);
    return built == m_built_slots.end() ? -1 : built->second;
}

int Capture::arg_value(const Arg& a) const {
    if (a.kind != Arg::Kind::Input) return slot_value(a);
    auto it = m_node_values.find(a.index);
    return it == m_node_values.end() ? -1 : it->second;
}

bool Capture::arg_made_in_call(const Arg& a) {
    int id = slot_value(a);
    return id >= 0 && v(id).own_storage;
}

bool Capture::arg_data_shaped(const Arg& a) {
    int id = slot_value(a);  // inputs and constants have their shapes
    return id >= 0 && holds(id, &Value::dyn_shape);
}

bool Capture::holds(int id, bool Value::*flag, int depth) {
    const Value& val = v(id);
    if (val.*flag) return true;
    if ((val.kind == ValueKind::FreshList || val.kind == ValueKind::FreshTuple ||
         val.kind == ValueKind::FreshDict ||
         (val.kind == ValueKind::Input && (val.shadow || val.mutated))) && depth < 8)
        for (int item : val.items)
            if (item >= 0 && holds(item, flag, depth + 1)) return true;
    return false;
}

int Capture::size_of(int id, int dim, PyObject* real) {
    const Value& t = v(id);
    bool input = t.kind == ValueKind::Input && t.node >= 0 && !t.reshaped;
    uint64_t dims = input ? m_guards->dynamic_dims(t.node) : 0;
    uint64_t used = dim == kNumel ? dims : dim >= 0 && dim < 64 ? (dims & (uint64_t{1} << dim)) : 0;
    bool data = t.tensor && t.dyn_shape;  // [Note: numbers from tensor data]
    if (!data && (input ? !used : !t.sym)) return const_value(real);
    Step s;
    s.kind = StepKind::Call;
    Arg self;
    if (!arg_of(id, self)) return -1;
    std::string label = t.label;
    if (dim == kNumel) {
        s.args = {Arg::value(torch_api().tensor_numel.get()), self};
        label += ".numel()";
    } else {
        py::Ref d = py::Ref::steal(PyLong_FromLong(dim));
        s.args = {Arg::value(torch_api().tensor_size.get()), self, Arg::value(d.get())};
        label += ".size(" + std::to_string(dim) + ")";
    }
    int r = record(std::move(s), real, label, false);
    Value& n = v(r);
    if (data) {  // read at replay, never guarded: a size that depends on tensor data
        n.dyn_scalar = n.data_size = true;
        n.sym = n.sym_all = false;
        n.sym_deps.clear();
        return r;
    }
    n.sym = true;
    n.sym_all = !input;
    n.sym_deps.clear();
    n.positive = input && PyLong_Check(real) && PyLong_AsLong(real) > 0;  // (static dims fixed)
    if (input) n.sym_deps.emplace_back(v(id).node, used);
    return r;
}

// The plan may give up at the step being recorded: it must put back what it changed that can
// be put back (the generators, undoable writes) when it does.
void Capture::may_decline() {
    if (m_draws) m_plan->set_restores_generators();
    if (m_undoable_writes) m_plan->set_undoes_writes();
}

// The plan checks at replay that `value` is still `expected` (or has that length), and gives
// up before anything visible happened if not (Declined::Recapture).
bool Capture::add_replay_check(int id, PyObject* expected, CheckOp how,
                               std::shared_ptr<Speculation> guess) {
    if (m_effects) return false;
    may_decline();
    Step s;
    s.kind = StepKind::Check;
    s.op = how;
    s.speculation = std::move(guess);
    Arg a;
    if (!arg_of(id, a)) return false;
    s.args = {a, Arg::value(expected)};
    add_step(std::move(s));
    return true;
}

// Booleans (relations: `T > 1`) and numbers computed from op results' sizes are checked at
// replay while nothing visible has happened yet; numbers read from input sizes are guarded by
// value (the guard is cheaper than a failed replay).
void Capture::concretize(int id) {
    Value& val = v(id);
    if (!val.sym_number()) return;  // a number that also depends on tensor data stays unknown
    bool relation = PyBool_Check(val.real.get());
    if ((relation || val.sym_all) && add_replay_check(id, val.real.get(), kCheckEqual)) {
        // checked at replay
    } else if (val.sym_all) {
        pin_all_dims();
    } else {
        // A relation of a number that changes from call to call (a step counter: `if
        // n % accum == 0: opt.step()`), after a visible effect, cannot be checked at replay;
        // guarding the number would recompile on every call: the branch is a break instead.
        for (const auto& [node, dims] : val.sym_deps) {
            auto number = m_node_values.find(node);
            if (relation && m_effects && number != m_node_values.end() &&
                !v(number->second).tensor) {
                fail(breaks::kDataDependentBranch,
                     "a branch on `" + v(number->second).label + "`, which changes from call "
                     "to call, comes after a visible effect",
                     "the branch runs in Python between two graphs; branch before the "
                     "effect to keep one graph");
                return;
            }
        }
        for (const auto& [node, dims] : val.sym_deps) {
            auto number = m_node_values.find(node);
            if (number != m_node_values.end() && !v(number->second).tensor) pin_number(number->second);
            else m_guards->set_dynamic_dims(node, m_guards->dynamic_dims(node) & ~dims);
        }
    }
    val.sym = false;
    val.sym_all = false;
    val.sym_deps.clear();
    val.kind = ValueKind::Const;
}

void Capture::fix_length(int id) {
    Value& t = v(id);
    if (!t.tensor || !sym_tensor(id)) return;
    if (t.kind == ValueKind::Input) {
        m_guards->set_dynamic_dims(t.node, m_guards->dynamic_dims(t.node) & ~uint64_t{1});
        return;
    }
    check_length(id);
}

// The plan checks that the op result `id` (a tensor or a sequence of tensors) still has the
// length it had, or, after an effect, every size is fixed again.
void Capture::check_length(int id) {
    Py_ssize_t len = PyObject_Length(v(id).real.get());
    py::Ref n = py::Ref::steal(len < 0 ? nullptr : PyLong_FromSsize_t(len));
    PyErr_Clear();
    if (!n || !add_replay_check(id, n.get(), kCheckLength)) pin_all_dims();
}

// [Note: ranks that may change] The rank of an op result follows from its inputs' ranks for
// almost every op, and those are guarded. Not for squeeze() of sizes that may be 1 at replay
// (sizes of op results, which may be anything; symbolic input dims are at least 2), nor for
// ops whose rank is given by a number that is read at replay (flatten(d), tensordot(dims=n)),
// nor for what is computed from such a tensor (Monitor::record_call marks them; Capture::record
// passes the mark on). Python reading such a rank (its shape, dim(), a negative index) gets it
// checked at replay while nothing visible has happened yet; after that, the sizes and numbers
// it came from are guarded by value again, and a rank that depends on tensor data is a break.
bool Capture::read_rank(int id) {
    Value& t = v(id);
    if (!t.rank_varies || t.rank_checked) return true;
    PyObject* real = t.real.get();
    py::Ref n = py::Ref::steal(real ? PyObject_GetAttrString(real, "ndim") : nullptr);
    if (!n) {
        PyErr_Clear();
        internal_error("the rank of `" + t.label + "`");
        return false;
    }
    if (add_replay_check(id, n.get(), kCheckRank)) {
        v(id).rank_checked = true;
        return true;
    }
    if (v(id).dyn_shape) {
        fail(breaks::kDataDependentBranch,
             "the number of dims of `" + v(id).label + "`, which depends on tensor data, is "
             "read after a visible effect",
             "give squeeze() the dim to remove, or read the shape before the effect");
        return false;
    }
    pin_all_dims();
    v(id).rank_checked = true;
    return true;
}

// [Note: metadata changed through one path] Tensors passed in are not merged by identity
// ([Note: aliasing]): data changes reach every path, but sizes and requires_grad are facts
// each path's guard fixed. Once the call changes them in place through one path (t_(),
// resize_, .data =, requires_grad_()), another path to the same tensor would read stale
// facts, so from then on every tensor path is guarded to be, or not be, that tensor as it was
// in the capture; a path reached later that is the same tensor breaks (a review probe:
// `x.t_(); y.shape` with f(a, a)).
void Capture::metadata_changed(int id) {
    const Value& t = v(id);
    if (!t.tensor || t.kind != ValueKind::Input || t.node < 0) return;
    if (std::find(m_metadata_changed.begin(), m_metadata_changed.end(), id) !=
        m_metadata_changed.end())
        return;
    m_metadata_changed.push_back(id);
    for (const auto& [node, other] : m_node_values) {
        const Value& o = v(other);
        if (other == id || !o.tensor || o.kind != ValueKind::Input || o.node < 0) continue;
        Check c;
        c.kind = o.real.get() == t.real.get() ? CheckKind::SameAs : CheckKind::NotSameAs;
        c.other = std::min(o.node, t.node);  // (checked at the later of the two)
        m_guards->add_check(std::max(o.node, t.node), std::move(c));
    }
}

void Capture::reshaped_in_place(int id) {
    metadata_changed(id);
    Value& t = v(id);
    if (!t.tensor) return;
    t.reshaped = t.kind == ValueKind::Input;
    t.sym = t.sym_all = true;  // its sizes are read at replay, and may be anything
    t.sym_deps.clear();
    t.rank_varies = true;
}

void Capture::pin_all_dims() {
    for (int node : m_dynamic_nodes) m_guards->set_dynamic_dims(node, 0);
    for (int id : m_dynamic_numbers) pin_number(id);
}

// A dynamic input number whose value Python needed: guarded by value from here on.
void Capture::pin_number(int id) {
    Value& n = v(id);
    if (n.kind != ValueKind::Input || !n.sym) return;
    Check c;
    c.kind = CheckKind::Equals;
    c.value = n.real;
    m_guards->add_check(n.node, std::move(c));
    n.sym = false;
    n.sym_deps.clear();
    n.kind = ValueKind::Const;
}

// [SECTION] plan -------------------------------------------------------------------------------

// [Note: tensors of constants]
// A tensor computed only from constants has the same data in every call the guards admit:
// torchvision's resize computes its scale as torch.tensor(image.shape[-2:]), min, max and a
// division, then `.item()`. Such op results are marked `const_data`, and Python reading their
// data (`.item()`, `int(t)`, `.tolist()`, `if t:`) gets a constant instead of a number read at
// replay or a break; the ops themselves are still recorded, so every call gets fresh tensors.
// What keeps it exact:
// - every argument folds (constants, values of this kind, containers of them); inputs, random
//   ops and anything with an effect never do;
// - ops whose result is not a function of their arguments are refused by name: uninitialized
//   memory (empty, new_empty, x.new(n), torch.Tensor(n)), addresses and identities
//   (data_ptr, storage, id, hash), and `.data` (it has a version counter of its own);
// - only CPU tensors (kernels on accelerators may reduce in a different order run to run);
// - the tensor's version counter, shared with its views, must be unchanged when Python reads
//   the data: an in-place change since (through any view) makes it a number read at replay.
// With symbolic sizes the shapes are not constants, so nothing built from them folds.

// The version counter of a tensor (or of the tensor a bound method belongs to), -1 for others.
static int64_t data_version(PyObject* o) {
    if (o && PyCFunction_Check(o) && PyCFunction_GET_SELF(o) && is_tensor(PyCFunction_GET_SELF(o)))
        o = PyCFunction_GET_SELF(o);
    if (!o || !is_tensor(o)) return -1;
    PyObject* ver = PyObject_GetAttrString(o, "_version");
    int64_t n = ver && PyLong_Check(ver) ? PyLong_AsLongLong(ver) : -2;
    Py_XDECREF(ver);
    PyErr_Clear();
    return n;
}

bool Capture::folds(int id, int depth) {
    const Value& x = v(id);
    switch (x.kind) {
    case ValueKind::Const: return !x.tensor && !x.sym && !x.dyn_scalar;
    case ValueKind::OpResult:
        // (-2: an inference tensor, which has no version to tell an in-place change by)
        return x.const_data && !x.sym && x.const_version != -2 &&
               data_version(x.real.get()) == x.const_version;
    case ValueKind::FreshSet:  // of constants
        return true;
    case ValueKind::FreshList:
    case ValueKind::FreshTuple:
    case ValueKind::FreshDict: {
        if (depth >= 8) return false;
        std::vector<int> items = x.items;
        for (int it : items)
            if (!folds(it, depth + 1)) return false;
        return true;
    }
    default: return false;
    }
}

// Whether a call's result is a function of its arguments alone.
static bool pure_callee(PyObject* callee) {
    if (!callee) return false;
    if (PyType_Check(callee) &&
        PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(callee), torch_api().tensor_type))
        return false;  // torch.Tensor(n), torch.FloatTensor(n): uninitialized
    if (PyType_Check(callee) &&
        PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(callee), torch_api().module_type))
        return false;  // a module made in the call is a new object at each call, as in eager
    std::string n;
    if (PyObject* name = PyObject_GetAttrString(callee, "__name__")) {
        if (PyUnicode_Check(name)) n = py::str_of(name);
        Py_DECREF(name);
    }
    PyErr_Clear();
    static const std::set<std::string> kNotPure = {
        "empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "new",
        "data_ptr", "storage", "untyped_storage", "_storage", "_cdata", "id", "hash", "__hash__",
        // the generators' state, read or drawn
        "get_rng_state", "get_rng_state_all", "get_state", "initial_seed", "seed"};
    return kNotPure.count(n) == 0;
}

bool Capture::callee_folds(int id) {
    const Value& x = v(id);
    return ((x.kind == ValueKind::Input && x.identity) || folds(id)) && pure_callee(x.real.get());
}

bool Capture::step_folds(const Step& step, PyObject* real) {
    if (step.effect || !real) return false;
    switch (step.kind) {
    case StepKind::Call: case StepKind::CallEx: case StepKind::Binary: case StepKind::Compare:
    case StepKind::Unary: case StepKind::GetItem: case StepKind::GetAttr:
    case StepKind::BuildList: case StepKind::BuildTuple: case StepKind::BuildDict:
    case StepKind::BuildSlice:
        break;
    default: return false;
    }
    bool call = step.kind == StepKind::Call || step.kind == StepKind::CallEx;
    for (const Arg& a : step.args) {
        if (a.kind == Arg::Kind::Input) {
            // the callee may be an input guarded by identity (G['torch'].tensor)
            auto it = m_node_values.find(a.index);
            if (!call || &a != &step.args[0] || it == m_node_values.end() ||
                !v(it->second).identity)
                return false;
            continue;
        }
        if (a.kind == Arg::Kind::Const) {
            if (a.constant && is_tensor(a.constant.get())) return false;
            continue;
        }
        int id = slot_value(a);
        if (id < 0 || !folds(id)) return false;
    }
    if (call) {
        if (step.args.empty()) return false;
        const Arg& c = step.args[0];
        int cv = c.kind == Arg::Kind::Input ? m_node_values[c.index] : slot_value(c);
        PyObject* callee = c.kind == Arg::Kind::Const ? c.constant.get()
                           : cv >= 0                   ? v(cv).real.get()
                                                       : nullptr;
        if (!pure_callee(callee)) return false;
    }
    if (step.kind == StepKind::GetAttr && step.name && py::str_of(step.name.get()) == "data")
        return false;
    if (is_tensor(real)) {
        PyObject* cpu = PyObject_GetAttrString(real, "is_cpu");
        bool on_cpu = cpu == Py_True;
        Py_XDECREF(cpu);
        PyErr_Clear();
        if (!on_cpu) return false;
    }
    return true;
}

static uint8_t result_kind_of(PyObject* o) {
    if (!o) return 0;
    if (is_tensor(o)) return 1;
    if (!PyTuple_Check(o) && !PyList_Check(o)) return 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    for (Py_ssize_t i = 0; i < n; ++i)
        if (!is_tensor(PySequence_Fast_GET_ITEM(o, i))) return 0;
    return n > 0 ? 2 : 0;
}

// [Note: memory made in the call] A tensor op's result whose memory no tensor argument from
// outside the call shares (torch.zeros, x * 2, x[mask], a view of any of these) is memory the
// call made: nothing outside has seen it, so changing it in place (torchvision's
// `batched[i, :h, :w].copy_(img)`, `torch.empty(n).normal_()`) is not a visible effect, and a
// plan may still give up after it ([Note: branches to a raise], [Note: speculated branches]).
// Making it visible is an effect of its own (a write to an object passed in, a global) or
// happens at the return. A result that shares memory with an argument from outside (x.view(),
// x.data, F.dropout(x, training=False), out=x) is that argument's memory. Only the tensor ops
// of the graph are judged: other calls (an lru_cache function's) may return memory kept
// elsewhere.

// The memories of `o`, a tensor or a list or tuple of tensors; false when one has none.
static bool storages_of(PyObject* o, std::vector<const void*>& out) {
    if (is_tensor(o)) {
        const void* s = tensor_storage(o);
        if (s) out.push_back(s);
        return s != nullptr;
    }
    if (!PyList_Check(o) && !PyTuple_Check(o)) return true;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(o); ++i) {
        PyObject* item = PySequence_Fast_GET_ITEM(o, i);
        if (is_tensor(item) && !storages_of(item, out)) return false;
    }
    return true;
}

// Ops that give their argument itself, a view of it, or new memory, by its strides or its
// conj/neg bits, which guards do not fix: `x.contiguous()` copied a transposed input during the
// capture and is the input itself at replay. Their results are never the call's own memory.
static bool aliases_by_layout(const Step& step, PyObject* fn) {
    static const std::unordered_set<std::string> kLayoutDependent = {
        "contiguous", "reshape", "reshape_as", "flatten", "ravel", "resolve_conj",
        "resolve_neg", "conj_physical", "to"};
    if (step.kind != StepKind::Call && step.kind != StepKind::CallEx) return false;
    if (!fn) return true;  // (not known: not the call's own)
    py::Ref name = py::Ref::steal(PyObject_GetAttrString(fn, "__name__"));
    PyErr_Clear();
    return name && PyUnicode_Check(name.get()) && kLayoutDependent.count(py::str_of(name.get()));
}

bool Capture::made_in_call(const Step& step, PyObject* result) {
    std::vector<const void*> made, outside;
    if (!result || !storages_of(result, made) || made.empty()) return false;
    auto value_of = [&](const Arg& a) { return arg_value(a); };
    if (!step.args.empty()) {
        const Arg& callee = step.args[0];
        int id = value_of(callee);
        PyObject* fn = callee.kind == Arg::Kind::Const ? callee.constant.get()
                       : id >= 0                       ? v(id).real.get()
                                                       : nullptr;
        if (aliases_by_layout(step, fn)) return false;
    }
    auto from_outside = [&](int id) {  // the memories of value `id` unless the call made them
        const Value& val = v(id);
        if (val.own_storage) return true;
        if (val.kind == ValueKind::FreshList || val.kind == ValueKind::FreshTuple) {
            for (int item : val.items)
                if (!v(item).own_storage && !storages_of(v(item).real.get(), outside)) return false;
            return true;
        }
        PyObject* o = val.real.get();
        PyObject* bound = o && PyCFunction_Check(o) ? PyCFunction_GET_SELF(o) : nullptr;
        if (bound && !storages_of(bound, outside)) return false;  // a bound tensor method's tensor
        return !o || storages_of(o, outside);
    };
    for (const Arg& a : step.args) {
        if (a.kind == Arg::Kind::Const && !storages_of(a.constant.get(), outside)) return false;
        int id = value_of(a);
        if (a.kind != Arg::Kind::Const && (id < 0 || !from_outside(id))) return false;
    }
    for (const void* m : made)
        if (std::find(outside.begin(), outside.end(), m) != outside.end()) return false;
    return true;
}

int Capture::record(Step step, PyObject* real_result, const std::string& label, bool graph_op) {
    step.out = m_plan->add_slot();
    step.graph_op = graph_op;
    step.result_kind = result_kind_of(real_result);
    bool sym = false;
    if (!m_dynamic_nodes.empty() || !m_dynamic_numbers.empty())
        for (const Arg& a : step.args) sym = sym || arg_sym(a);
    bool folds = step_folds(step, real_result);
    // [Note: numbers from tensor data] A tensor computed from one whose shape depends on data
    // (x[mask], nonzero), directly or inside a container made in the call, may have such a
    // shape too (-t, t + 1, t.T, its items): its sizes are read at replay. Results that are
    // Python numbers are not shapes.
    bool data_shape = false;
    for (const Arg& a : step.args) data_shape = data_shape || arg_data_shaped(a);
    bool rank_varies = false;  // [Note: ranks that may change] (inside lists too: stack([y]))
    for (const Arg& a : step.args) {
        int arg = slot_value(a);
        rank_varies = rank_varies || (arg >= 0 && holds(arg, &Value::rank_varies));
    }
    int id = new_value(ValueKind::OpResult, real_result, label);
    fail_python_tensor(id);  // (`x.as_subclass(Logged)`)
    v(id).slot = step.out;
    v(id).rank_varies = rank_varies;
    v(id).dyn_shape = data_shape && real_result && !PyLong_Check(real_result) &&
                      !PyFloat_Check(real_result) && !PyComplex_Check(real_result);
    v(id).own_storage = graph_op && made_in_call(step, real_result);
    if (folds) {
        v(id).const_data = true;
        v(id).const_version = data_version(real_result);
    }
    if (m_slot_values.size() <= static_cast<size_t>(step.out))
        m_slot_values.resize(static_cast<size_t>(step.out) + 1, -1);
    m_slot_values[static_cast<size_t>(step.out)] = id;
    m_graph_ops += graph_op ? 1 : 0;
    add_step(std::move(step));
    if (sym) {
        // A sequence of tensors (split, unbind, chunk) has as many items as the sizes make:
        // its length is read by Python, so the sizes are fixed again. Numbers are symbolic
        // (the caller narrows what they depend on).
        PyObject* o = real_result;
        if (o && (PyTuple_Check(o) || PyList_Check(o))) {
            check_length(id);
            v(id).sym = true;  // its items are tensors with symbolic sizes
        } else {
            v(id).sym = true;
            v(id).sym_all = !v(id).tensor;
        }
    }
    return id;
}

// [Note: steps that cannot raise on new data]
// A step inside a try block after a visible effect is refused (MB014, [Note: replay errors
// inside try]) because, if it raised at replay, eager would have run the handler after the
// effect, and the plan can neither run the handler nor run the frame again. Most steps cannot
// raise on new data: the guards fix shapes, dtypes and devices, so an op that raises only on
// those (and on its constant arguments) raised during the capture or never does. Such a step
// is not `in_try` at all. This matters on torch 2, whose Module._call_impl runs a module with
// hooks inside `try: ... except Exception: ...; raise`: a hook that records something (a
// visible write) and the ops after it are in that try.
// What counts: building tuples, lists and slices; tensor attributes, comparisons, unary ops
// and + - * / @ & | ^ on tensors and plain numbers (not //, %, **: integer division by zero,
// integers to negative powers); indexing a tensor with constant ints and slices; torch ops on
// the list of op_raises_only_on_metadata (factories of constant sizes too); torch.nn's leaf
// modules of module_raises_only_on_metadata, whose parameters, buffers and plain attributes
// are then guarded (the plain replay guards the module only, and a weight swapped for an
// inference tensor or another dtype would raise). The tensor guards fix whether a tensor is an
// inference tensor and whether it has dimension names (TensorKey).
// Refused (a review probe found each raising at replay): in-place changes of memory the call
// did not make (expanded or overlapping memory, a leaf that requires grad, a view of several
// outputs) and `out=`; a 0-dim tensor as an argument of a call (torch reads it as a size, a
// dim or a step); a tensor with dimension names; an input that may change (a list passed in);
// an argument with symbolic sizes (a relation the guards do not check may fail), with a shape
// that depends on data, or computed at replay (`torch.zeros(int(t.sum()))`); a one-element
// integer tensor (read as a size too). A leaf module is let through only when every entry of
// its __dict__, _parameters and _buffers is a tensor, None or a constant (all guarded, with
// its class's version and no forward set on the instance; a second probe). A step may warn,
// and a filter set to "error" after the capture would make it raise: warnings.filters is
// guarded by value once such a step is let through. What is left: running out of memory
// reaches the caller without the handler running.
bool Capture::raises_only_on_metadata(const Step& step) {
    // A value the guards fix: a tensor (its metadata), a constant, an immutable input, or a
    // list or tuple made in the call of such values. Not a number or container computed at
    // replay (from data, say), nor a mutable object passed in (a list the call may change).
    auto fixed = [&](auto&& self, int id, int depth) -> bool {
        const Value& val = v(id);
        if (val.tensor || val.kind == ValueKind::Const) return true;
        if (val.kind == ValueKind::Input) return val.real && is_constant_like(val.real.get());
        if ((val.kind != ValueKind::FreshList && val.kind != ValueKind::FreshTuple) || depth > 4)
            return false;
        for (int item : val.items)
            if (item < 0 || !self(self, item, depth + 1)) return false;
        return true;
    };
    auto real = [&](const Arg& a) -> PyObject* {
        if (a.kind == Arg::Kind::Const) return a.constant.get();
        int id = arg_value(a);
        return id >= 0 ? v(id).real.get() : nullptr;
    };
    // a tensor torch may read as a number (a size, a dim, a step): 0-dim, or one element of
    // an integer or bool dtype, alone or in a list
    auto number_like = [](PyObject* t) { return is_tensor(t) && tensor_may_be_a_number(t); };
    auto scalar_tensor = [&](PyObject* o) {
        if (o && number_like(o)) return true;
        if (o && (PyList_CheckExact(o) || PyTuple_CheckExact(o)))
            for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(o); ++i)
                if (number_like(PySequence_Fast_GET_ITEM(o, i))) return true;
        return false;
    };
    bool call = step.kind == StepKind::Call || step.kind == StepKind::CallEx;
    bool tensor = false;
    bool dynamic = !m_dynamic_nodes.empty() || !m_dynamic_numbers.empty();
    for (size_t i = 0; i < step.args.size(); ++i) {
        const Arg& a = step.args[i];
        if ((dynamic && arg_sym(a)) || arg_data_shaped(a)) return false;
        int id = arg_value(a);
        bool callee = call && i == 0;
        if (a.kind != Arg::Kind::Const && !callee && (id < 0 || !fixed(fixed, id, 0)))
            return false;
        PyObject* o = real(a);
        if (o && is_tensor(o) && tensor_is_named(o)) return false;  // names are not guarded
        tensor = tensor || (o && is_tensor(o));
        // Binary and Compare: tensors and plain numbers only (`[0] * t` repeats a list by the
        // tensor's value; a user object's __radd__ is Python of its own)
        if ((step.kind == StepKind::Binary || step.kind == StepKind::Compare) && o &&
            !is_tensor(o) && !PyLong_CheckExact(o) && !PyFloat_CheckExact(o) &&
            !PyBool_Check(o) && !PyComplex_CheckExact(o))
            return false;
    }
    // In place: only on memory the call made (no overlap, no leaf, no inference tensor
    // passed in, which the guards do not fix), never into `out=`.
    if (step.mutates >= 0 && !arg_made_in_call(step.args[static_cast<size_t>(step.mutates)]))
        return false;
    if (step.effect && step.mutates < 0 && !step.draws) return false;
    if (step.kwnames)
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(step.kwnames.get()); ++i)
            if (py::str_of(PyTuple_GET_ITEM(step.kwnames.get(), i)) == "out") return false;
    switch (step.kind) {
    case StepKind::BuildList:
    case StepKind::BuildTuple:
    case StepKind::BuildSlice: return true;
    case StepKind::Unary:
    case StepKind::Compare: return tensor;
    case StepKind::GetAttr: return real(step.args[0]) && is_tensor(real(step.args[0]));
    case StepKind::Binary: {
        int op = step.op >= NB_INPLACE_ADD ? step.op - NB_INPLACE_ADD : step.op;
        return tensor && op != NB_FLOOR_DIVIDE && op != NB_REMAINDER && op != NB_POWER &&
               op != NB_LSHIFT && op != NB_RSHIFT;
    }
    case StepKind::GetItem: {
        if (step.args.size() != 2 || !real(step.args[0]) || !is_tensor(real(step.args[0])) ||
            step.args[1].kind != Arg::Kind::Const)
            return false;
        PyObject* key = step.args[1].constant.get();
        auto plain = [](PyObject* k) {
            return PyLong_CheckExact(k) || PySlice_Check(k) || k == Py_None || k == Py_Ellipsis;
        };
        if (PyTuple_CheckExact(key)) {
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(key); ++i)
                if (!plain(PyTuple_GET_ITEM(key, i))) return false;
            return true;
        }
        return plain(key);
    }
    case StepKind::Call: {
        PyObject* fn = real(step.args[0]);
        if (!step.graph_op || !fn) return false;
        // (a bound method's own tensor is not among the arguments)
        for (size_t i = 1; i < step.args.size(); ++i)
            if (scalar_tensor(real(step.args[i]))) return false;
        if (PyObject_TypeCheck(fn, torch_api().module_type)) {
            int module = arg_value(step.args[0]);
            return module >= 0 && v(module).kind == ValueKind::Input &&
                   module_raises_only_on_metadata(fn) && guard_module_state(module);
        }
        py::Ref name = py::Ref::steal(PyObject_GetAttrString(fn, "__name__"));
        PyErr_Clear();
        if (!name || !PyUnicode_Check(name.get())) return false;
        std::string n = py::str_of(name.get());
        return (!has_inplace_suffix(n) || step.mutates >= 0) && op_raises_only_on_metadata(n);
    }
    default: return false;
    }
}

bool Capture::guard_warning_filters() {
    if (m_filters_guarded) return true;
    py::Ref warnings = py::Ref::steal(PyImport_ImportModule("warnings"));
    py::Ref filters = warnings ? py::Ref::steal(PyObject_GetAttrString(warnings.get(), "filters"))
                               : py::Ref();
    py::Ref copy = filters && PyList_Check(filters.get())
                       ? py::Ref::steal(PySequence_List(filters.get()))
                       : py::Ref();
    if (!copy) {
        PyErr_Clear();
        return false;
    }
    static PyObject* name = PyUnicode_InternFromString("filters");  // kept
    int f = input_child(constant_root(warnings.get(), "sys.modules['warnings']"),
                        AccessKind::Attr, 0, name, ".filters", filters.get());
    if (f < 0) return false;
    guard_equals(f, copy.get());  // (a copy: the list itself changes in place)
    m_filters_guarded = true;
    return !m_failed;
}

bool Capture::guard_module_state(int module) {
    PyObject* m = v(module).real.get();
    PyObject* attrs = PyObject_GenericGetDict(m, nullptr);
    if (!attrs) {
        PyErr_Clear();
        return false;
    }
    py::Ref own = py::Ref::steal(attrs);
    std::vector<std::pair<py::Ref, py::Ref>> state;  // (name, value)
    bool plain = true;
    // Every entry: tensors by their metadata, None and constants by value. Anything else (a
    // list attribute, a forward set on the instance) may change what the module does: refused.
    auto collect = [&](PyObject* d, bool top) {
        Py_ssize_t pos = 0;
        PyObject *k, *val;
        while (d && PyDict_Check(d) && PyDict_Next(d, &pos, &k, &val)) {
            if (!PyUnicode_Check(k)) {
                plain = false;
                continue;
            }
            std::string name = py::str_of(k);
            if (top && name == "forward") plain = false;
            // the module's own tables (hooks are guarded apart, by no_hooks)
            if (top && starts_with(name, "_") && (PyDict_Check(val) || PyAnySet_Check(val)))
                continue;
            if (is_tensor(val) || val == Py_None || is_constant_like(val))
                state.emplace_back(py::Ref::borrow(k), py::Ref::borrow(val));
            else
                plain = false;
        }
    };
    collect(attrs, true);  // in_features, padding, eps, normalized_shape, a plain tensor ...
    for (const char* name : {"_parameters", "_buffers"})
        collect(PyDict_GetItemString(attrs, name), false);
    // its class as it was: a forward replaced on it (or on a base) renews the version tag;
    // and none set on the instance later
    if (!plain || !guard_class_unchanged(module)) return false;
    static PyObject* forward = PyUnicode_InternFromString("forward");  // kept
    guard_no_instance_attr(module, forward);
    for (auto& [name, val] : state) {
        int id = input_child(module, AccessKind::ModuleAttr, 0, name.get(),
                             "." + py::str_of(name.get()), val.get());
        // (a number that became dynamic is read at replay: not fixed)
        if (id < 0 || v(id).sym || v(id).sym_all || !v(id).sym_deps.empty()) return false;
    }
    return !m_failed;
}

static std::string method_name(const std::string& label) {  // "list.append" -> "append"
    size_t dot = label.rfind('.');
    return dot == std::string::npos ? label : label.substr(dot + 1);
}

// Every step is stamped with the user's line, file and function (for tracebacks at replay).
void Capture::add_step(Step step) {
    step.line = m_line;
    // A step inside try may raise at replay on new data; the plan then hands the call to
    // eager execution, which is only right while nothing visible has happened yet.
    // [Note: replay errors inside try]
    step.in_try = m_in_try;
    step.ctx = static_cast<int16_t>(m_ctx);
    if (step.in_try && m_effects && !m_failed && raises_only_on_metadata(step) &&
        guard_warning_filters())
        step.in_try = false;  // it raises at replay only where it raised here, or not at all
    if (step.in_try && m_effects && !m_failed)
        return fail(breaks::kTryAfterEffect,
                    "an operation inside a try block comes after a write or in-place change "
                    "made earlier in the call; if it raised on new data, replay could not run "
                    "the handler after the write exactly once",
                    "move the write after the try block, or the try block before the write");
    if (m_plan->steps().size() >= kMaxPlanSteps && !m_failed)
        return fail(breaks::kTooLarge,
                    "the call records more than " + std::to_string(kMaxPlanSteps) +
                        " operations (a long loop unrolled)",
                    "compile the loop's body as its own function, or loop fewer times per call");
    // Changing memory the call made is not visible ([Note: memory made in the call]), nor is
    // drawing random numbers while the plan can put the generators back ([Note: draws before a
    // check]), nor writes the plan can undo ([Note: writes undone]).
    bool invisible = step.mutates >= 0
                         ? static_cast<size_t>(step.mutates) < step.args.size() &&
                               arg_made_in_call(step.args[static_cast<size_t>(step.mutates)])
                         : step.draws || step.undoable;
    m_effects = m_effects || (step.effect && !invisible);
    m_draws = m_draws || step.draws;
    m_undoable_writes = m_undoable_writes || step.undoable;
    if (step.in_try) may_decline();
    if (m_code) {
        auto it = m_locations.find(m_code);
        if (it == m_locations.end())
            it = m_locations
                     .emplace(m_code, m_plan->add_location({py::str_of(m_code->co_filename),
                                                            py::str_of(m_code->co_name)}))
                     .first;
        step.loc = it->second;
    }
    if (m_site_code && m_site_globals) {
        auto key = std::make_pair(m_site_code, m_site_globals);
        auto it = m_sites.find(key);
        if (it == m_sites.end()) {
            py::Ref frame = py::Ref::steal(py::new_site_frame(m_site_code, m_site_globals));
            if (frame) it = m_sites.emplace(key, m_plan->add_site(frame.get())).first;
            else PyErr_Clear();  // out of memory: the step runs in the caller's frame
        }
        if (it != m_sites.end()) {
            step.site = it->second;
            step.site_line = py::code_line_of(m_site_code, m_site_offset);
        }
    }
    m_plan->add_step(std::move(step));
}

bool Capture::enter_context(int exit_value, bool inherited, bool user) {
    const Value& e = v(exit_value);
    if (e.kind != ValueKind::OpResult || e.slot < 0) {
        internal_error("a with block's __exit__ is not a plan value");
        return false;
    }
    if (m_plan->contexts().size() >= 0x7fff) {
        fail(breaks::kUnsupportedOpcode, "too many with blocks", "split the function");
        return false;
    }
    m_ctx = m_plan->add_context({e.slot, m_ctx, inherited, user});
    return true;
}

void Capture::exit_context() {
    if (m_ctx >= 0) m_ctx = m_plan->contexts()[static_cast<size_t>(m_ctx)].parent;
}

// Whether the write `step` (its target and key among `values`) changes dict entries only, so a
// plan that declines after it can put them back ([Note: writes undone] in plan.cpp): an item of
// a plain dict, or an attribute set the plain way (object.__setattr__ or nn.Module's, with no
// data descriptor of that name on the class) on an object with a __dict__. A module's attribute
// set to a Parameter or a module also runs registration code: not undone.
bool Capture::undoable_write(const Step& step, const std::vector<int>& values) {
    PyObject* target = values.empty() ? nullptr : v(values[0]).real.get();
    if (!target || !exists_at_replay(values[0])) return false;
    if (step.kind == StepKind::SetItem) return PyDict_CheckExact(target);
    if (step.kind != StepKind::SetAttr || values.size() != 2) return false;
    PyTypeObject* type = Py_TYPE(target);
    PyTypeObject* module = torch_api().module_type;
    bool is_module = module && PyObject_TypeCheck(target, module);
    static PyObject* setattr_name = PyUnicode_InternFromString("__setattr__");
    bool plain = type->tp_setattro == PyObject_GenericSetAttr ||
                 (is_module && _PyType_Lookup(type, setattr_name) ==
                                   _PyType_Lookup(module, setattr_name));
    PyObject* descr = _PyType_Lookup(type, step.name.get());
    PyObject* val = v(values[1]).real.get();
    bool registers = is_module && val &&
                     (PyObject_TypeCheck(val, module) ||
                      PyObject_TypeCheck(val, torch_api().parameter_type));
    return plain && !registers && !(descr && Py_TYPE(descr)->tp_descr_set) &&
           py::has_instance_dict(type);
}

void Capture::record_effect(Step step, const std::vector<int>& values) {
    // The RefGraph gets a write edge: target -> new value, with a version per written place.
    if (values.size() >= 2) {
        bool call = step.kind == StepKind::Call;
        int target = call ? values[1] : values[0];
        std::string place =
            step.kind == StepKind::SetAttr  ? "." + py::str_of(step.name.get())
            : step.kind == StepKind::SetItem ? "[" + py::repr_string(v(values[1]).real.get()) + "]"
                                             : "." + method_name(v(values[0]).label) + "()";
        int version = ++m_versions[{target, place}];
        m_write_edges.push_back({target, values.size() > (call ? 2u : 1u) ? values.back() : target,
                                 "write " + place + " (version " + std::to_string(version) + ")"});
    }
    for (int value : values) {
        Arg a;
        if (!escape_arg(value, a)) return;
        step.args.push_back(std::move(a));
    }
    step.effect = true;
    step.undoable = undoable_write(step, values);
    add_step(std::move(step));
    m_writes = true;
}

bool Capture::input_changed(PyObject* obj) const {
    auto seen = m_input_objects.find(obj);
    if (seen == m_input_objects.end()) return false;
    const Value& val = m_values[static_cast<size_t>(seen->second)];
    return val.mutated || val.shadow;
}

bool Capture::shadow(int id) {
    Value& val = v(id);
    if (read_after_change(id)) return false;
    if (val.shadow) return true;
    PyObject* o = val.real.get();
    if (val.kind != ValueKind::Input || !(PyList_CheckExact(o) || PyTuple_CheckExact(o))) {
        internal_error("shadow of a value that is not an input list");
        return false;
    }
    // Until now only appends were followed (`items` holds them): the first items of the real
    // list are still the ones the caller passed in.
    std::vector<int> tail = std::move(val.items);
    val.mutated = false;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o) - static_cast<Py_ssize_t>(tail.size());
    if (n < 0) {
        internal_error("list shorter than the items appended to it");
        return false;
    }
    guard_len(id, n);
    std::vector<int> items;
    for (Py_ssize_t i = 0; i < n; ++i) {
        int item = input_child(id, AccessKind::Item, static_cast<int>(i), nullptr,
                               "[" + std::to_string(i) + "]", PySequence_Fast_GET_ITEM(o, i));
        if (item < 0) return false;
        items.push_back(item);
    }
    items.insert(items.end(), tail.begin(), tail.end());
    Value& after = v(id);
    after.items = std::move(items);
    after.shadow = true;
    return true;
}

// An op receiving an input list reads its items: guard them (nested lists too).
bool Capture::guard_contents(int id, int depth) {
    if (depth > 8) {
        fail(breaks::kUnsupportedOpcode, "a deeply nested list is passed to an op",
             "pass tensors or flat lists");
        return false;
    }
    if (!shadow(id)) return false;
    std::vector<int> items = v(id).items;
    for (int item : items) {
        const Value& it = v(item);
        if (it.kind == ValueKind::Input && !it.tensor &&
            (PyList_CheckExact(it.real.get()) || PyTuple_CheckExact(it.real.get())) &&
            !guard_contents(item, depth + 1))
            return false;
    }
    return true;
}

// At replay, an object made in the call that escapes: made by the __new__ of its C base
// (object, dict, OrderedDict), then its items (a dict's) and attributes set as that base sets
// them, each in the order it was first set ([Note: objects made in the call]).
static PyObject* make_object(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if ((n != 2 && n != 3) || !PyType_Check(args[0]) || !PyDict_Check(args[1]) ||
        (n == 3 && !PyDict_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError, "magpy: make_object(cls, attrs[, items])");
        return nullptr;
    }
    auto* cls = reinterpret_cast<PyTypeObject*>(args[0]);
    PyTypeObject* base = layout_base(cls);
    if (!base || !base->tp_new || (n == 3 && (!base->tp_as_mapping ||
                                              !base->tp_as_mapping->mp_ass_subscript))) {
        PyErr_SetString(PyExc_TypeError, "magpy: make_object of a class without a C base");
        return nullptr;
    }
    py::Ref none_args = py::Ref::steal(PyTuple_New(0));
    PyObject* obj = base->tp_new(cls, none_args.get(), nullptr);  // new reference
    if (!obj) return nullptr;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (n == 3 && PyDict_Next(args[2], &pos, &k, &v)) {
        if (base->tp_as_mapping->mp_ass_subscript(obj, k, v) < 0) {
            Py_DECREF(obj);
            return nullptr;
        }
    }
    pos = 0;
    while (PyDict_Next(args[1], &pos, &k, &v)) {
        if (PyObject_GenericSetAttr(obj, k, v) < 0) {
            Py_DECREF(obj);
            return nullptr;
        }
    }
    return obj;
}

// At replay, a function made in the call that leaves it (a hook given to register_hook, a
// lambda returned): made again from its code and globals, with its defaults and closure cells
// ([Note: functions made in the call]). (code, globals, qualname, defaults, kwdefaults,
// cells...)
static PyObject* make_function(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (n < 5 || !PyCode_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "magpy: make_function(code, globals, qualname, ...)");
        return nullptr;
    }
    PyObject* fn = PyFunction_NewWithQualName(args[0], args[1], args[2]);  // new reference
    if (!fn) return nullptr;
    py::Ref closure = py::Ref::steal(n > 5 ? PyTuple_New(n - 5) : nullptr);
    for (Py_ssize_t i = 5; i < n; ++i) PyTuple_SET_ITEM(closure.get(), i - 5, Py_NewRef(args[i]));
    if ((args[3] != Py_None && PyFunction_SetDefaults(fn, args[3]) < 0) ||
        (args[4] != Py_None && PyFunction_SetKwDefaults(fn, args[4]) < 0) ||
        (closure && PyFunction_SetClosure(fn, closure.get()) < 0)) {
        Py_DECREF(fn);
        return nullptr;
    }
    return fn;
}

static PyObject* make_cell(PyObject*, PyObject* const* args, Py_ssize_t n) {
    return PyCell_New(n == 1 ? args[0] : nullptr);  // (value) or () for an empty cell
}

static PyObject* c_function(PyMethodDef* def) {
    return PyCFunction_New(def, nullptr);  // kept for the process by the caller's static
}

static PyObject* make_object_function() {
    static PyMethodDef def = {"make_object", reinterpret_cast<PyCFunction>(
                                                 reinterpret_cast<void (*)()>(make_object)),
                              METH_FASTCALL, "magpy: an object made in the call, at replay"};
    static PyObject* fn = c_function(&def);
    return fn;
}

// At replay, a Sequential made by slicing one, that escapes: `cls(OrderedDict(zip(keys,
// items)))`, as Sequential.__getitem__ makes it (its own keys kept). Calling the class with the
// list of modules, as for a ModuleList, raised (a review probe: a sliced Sequential given to
// torch.utils.checkpoint).
static PyObject* make_sequential(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (n != 3 || !PyType_Check(args[0]) || !PyTuple_Check(args[1]) || !PyList_Check(args[2]) ||
        PyTuple_GET_SIZE(args[1]) != PyList_GET_SIZE(args[2])) {
        PyErr_SetString(PyExc_TypeError, "magpy: make_sequential(cls, keys, items)");
        return nullptr;
    }
    static PyObject* odict = reinterpret_cast<PyObject*>(&PyODict_Type);
    py::Ref d = py::Ref::steal(PyObject_CallNoArgs(odict));
    for (Py_ssize_t i = 0; d && i < PyTuple_GET_SIZE(args[1]); ++i)
        if (PyObject_SetItem(d.get(), PyTuple_GET_ITEM(args[1], i), PyList_GET_ITEM(args[2], i)) < 0)
            return nullptr;
    return d ? PyObject_CallOneArg(args[0], d.get()) : nullptr;
}

static PyObject* make_sequential_function() {
    static PyMethodDef def = {"make_sequential", reinterpret_cast<PyCFunction>(
                                                     reinterpret_cast<void (*)()>(make_sequential)),
                              METH_FASTCALL, "magpy: a sliced Sequential, at replay"};
    static PyObject* fn = c_function(&def);
    return fn;
}

// A numpy array passed in and given to a step (`torch.from_numpy(a)`): the step reads its data
// at replay, but what the step makes of it (dtype, shape, layout) follows from its metadata,
// which an array keeps in attributes: guarded by value (`a.dtype.str`, `a.shape`, `a.strides`).
// Without them a float32 array took the float64 path a capture specialised on.
bool Capture::guard_array(int id) {
    static PyObject* const kNames[] = {PyUnicode_InternFromString("dtype"),  // kept
                                       PyUnicode_InternFromString("shape"),
                                       PyUnicode_InternFromString("strides")};
    static PyObject* const kStr = PyUnicode_InternFromString("str");
    for (PyObject* name : kNames) {
        py::Ref attr = py::Ref::steal(PyObject_GetAttr(v(id).real.get(), name));
        if (!attr) {
            PyErr_Clear();
            internal_error("a numpy array without " + py::str_of(name));
            return false;
        }
        int a = input_child(id, AccessKind::Attr, 0, name, "." + py::str_of(name), attr.get());
        if (a < 0) return false;
        if (name == kNames[0]) {  // a dtype compares by its str ('<f4'), a constant
            py::Ref str = py::Ref::steal(PyObject_GetAttr(attr.get(), kStr));
            if (!str) {
                PyErr_Clear();
                internal_error("a numpy dtype without str");
                return false;
            }
            a = input_child(a, AccessKind::Attr, 0, kStr, ".str", str.get());
            if (a < 0) return false;
        }
        if (v(a).kind != ValueKind::Const) {
            internal_error("numpy array metadata that is not a constant");
            return false;
        }
    }
    return true;
}

bool Capture::build_arg(int id, Arg& out, bool escape, int depth) {
    Value& val = v(id);
    switch (val.kind) {
    case ValueKind::Input: {
        PyObject* o = val.real.get();
        if (!escape && !val.tensor && std::strcmp(Py_TYPE(o)->tp_name, "numpy.ndarray") == 0) {
            if (!guard_array(id)) return false;
            out = Arg::input(v(id).node);
            return true;
        }
        if (!escape && !val.tensor && (PyList_CheckExact(o) || PyTuple_CheckExact(o)) &&
            !guard_contents(id, 0))
            return false;
        if (!escape && !val.tensor && PyDict_Check(o)) {
            fail(breaks::kUnsupportedCallee, "dict `" + val.label + "` is passed to an op",
                 "pass its items instead");
            return false;
        }
        out = Arg::input(val.node);
        return true;
    }
    case ValueKind::Const:
        if (val.built >= 0) {
            out = Arg::slot(val.built);
            return true;
        }
        if (escape && val.node < 0 && PyExceptionInstance_Check(val.real.get()))
            return fresh_exception(id, out);
        // A set passed in is known by value, but it is the caller's object: what the call
        // hands on is that object (read again through its path), not the one captured.
        out = val.node >= 0 && PyAnySet_CheckExact(val.real.get()) ? Arg::input(val.node)
                                                                    : Arg::value(val.real.get());
        return true;
    case ValueKind::OpResult:
        out = Arg::slot(val.slot);
        return true;
    case ValueKind::FreshObject:
        if (val.built < 0 && !escape) {
            fail(breaks::kUnsupportedCallee, "`" + val.label + "`, an object made in the call, "
                 "is passed to an op", "pass its attributes instead");
            return false;
        }
        [[fallthrough]];
    case ValueKind::FreshList:
    case ValueKind::FreshSet:
    case ValueKind::FreshTuple:
    case ValueKind::FreshDict: {
        if (val.built >= 0) {
            out = Arg::slot(val.built);
            return true;
        }
        if (depth > 32) {
            fail(breaks::kEscapingObject, "a container that contains itself is returned or stored",
                 "return a copy without the cycle");
            return false;
        }
        Step s;
        s.kind = val.kind == ValueKind::FreshList || val.kind == ValueKind::FreshSet
                     ? StepKind::BuildList
                 : val.kind == ValueKind::FreshTuple ? StepKind::BuildTuple
                                                     : StepKind::BuildDict;
        bool object = val.kind == ValueKind::FreshObject;
        int cls = val.cls;
        int mapping = object ? val.mapping : -1;
        int factory = val.default_factory;  // a defaultdict's: set once its items are in
        if (val.owner >= 0) {  // made with its object, never alone
            internal_error("the items of an object made in the call are built without it");
            return false;
        }
        if (val.kind == ValueKind::FreshSet)  // set([...]) at replay
            s.name = py::Ref::borrow(reinterpret_cast<PyObject*>(&PySet_Type));
        bool sequential = s.kind == StepKind::BuildList && val.real &&
                          PyObject_TypeCheck(val.real.get(), torch_api().sequential_type);
        if (!sequential && ((s.kind == StepKind::BuildDict && !PyDict_CheckExact(val.real.get())) ||
             (s.kind == StepKind::BuildList && !PyList_CheckExact(val.real.get()))) &&
            !object && val.real)  // an OrderedDict, a ModuleList made by slicing one
            s.name = py::Ref::borrow(reinterpret_cast<PyObject*>(Py_TYPE(val.real.get())));
        std::vector<int> items = val.items;
        if (val.kind == ValueKind::FreshSet && !set_items_in_order(id, items)) return false;
        for (int item : items) {
            Arg a;
            if (!build_arg(item, a, escape, depth + 1)) return false;
            s.args.push_back(std::move(a));
        }
        s.out = m_plan->add_slot();
        out = Arg::slot(s.out);
        add_step(std::move(s));
        // A Call step of `args` (the value built so far among them) whose result is the value.
        auto make_with = [&](std::vector<Arg> args) {
            Step mk;
            mk.kind = StepKind::Call;
            mk.args = std::move(args);
            mk.out = m_plan->add_slot();
            out = Arg::slot(mk.out);
            add_step(std::move(mk));
        };
        if (sequential) {  // make_sequential(cls, keys, [items])
            PyObject** dictptr = _PyObject_GetDictPtr(val.real.get());
            PyObject* modules = dictptr && *dictptr ? PyDict_GetItemString(*dictptr, "_modules") : nullptr;
            py::Ref keys = modules && PyDict_Check(modules)
                               ? py::Ref::steal(PySequence_Tuple(modules)) : py::Ref();
            if (!keys) {
                PyErr_Clear();
                internal_error("the keys of a sliced Sequential");
                return false;
            }
            make_with({Arg::value(make_sequential_function()),
                       Arg::value(reinterpret_cast<PyObject*>(Py_TYPE(val.real.get()))),
                       Arg::value(keys.get()), out});
        }
        if (factory >= 0) {  // defaultdict() then .default_factory = factory
            Step sf;
            sf.kind = StepKind::SetAttr;
            sf.name = py::Ref::steal(PyUnicode_InternFromString("default_factory"));
            Arg fa;
            if (!build_arg(factory, fa, false, depth + 1)) return false;
            sf.args = {out, fa};
            add_step(std::move(sf));
        }
        if (object) {  // make_object(cls, {attributes}[, {items}])
            Arg c;
            if (!build_arg(cls, c, false, depth + 1)) return false;
            std::vector<Arg> args = {Arg::value(make_object_function()), c, out};
            if (mapping >= 0) {
                Step d;
                d.kind = StepKind::BuildDict;
                std::vector<int> pairs = v(mapping).items;
                for (int item : pairs) {
                    Arg a;
                    if (!build_arg(item, a, escape, depth + 1)) return false;
                    d.args.push_back(std::move(a));
                }
                d.out = m_plan->add_slot();
                args.push_back(Arg::slot(d.out));
                add_step(std::move(d));
            }
            make_with(std::move(args));
        }
        if (val.real && val.kind == ValueKind::FreshTuple &&
            is_namedtuple_type(Py_TYPE(val.real.get()))) {
            // a namedtuple made in the call: Cls._make(tuple)
            py::Ref make = py::Ref::steal(PyObject_GetAttrString(
                reinterpret_cast<PyObject*>(Py_TYPE(val.real.get())), "_make"));
            if (!make) {
                PyErr_Clear();
                internal_error("namedtuple without _make");
                return false;
            }
            make_with({Arg::value(make.get()), out});
        }
        if (val.real && Py_TYPE(val.real.get()) == torch_api().size_type) {
            // a shape with symbolic sizes: torch.Size(tuple), as the program had it
            Step size;
            size.kind = StepKind::Call;
            size.args = {Arg::value(reinterpret_cast<PyObject*>(torch_api().size_type)), out};
            size.out = m_plan->add_slot();
            out = Arg::slot(size.out);
            add_step(std::move(size));
        }
        if (escape) v(id).built = out.index;
        m_built_slots[out.index] = id;
        return true;
    }
    case ValueKind::Function: {
        // [Note: functions made in the call] A lambda or def made in the call that an op is
        // given (t.register_hook(lambda g: ...)) or that leaves the call is made again at
        // replay from its code, its defaults and new cells holding what its closure cells
        // hold (cells of the compiled function's own closure are those cells themselves).
        // A cell the capture then assigns again would differ from eager's: that fails (in
        // Monitor's STORE_DEREF); so does one live at a graph break, whose frame goes on with
        // cells of its own.
        if (val.built >= 0) {
            out = Arg::slot(val.built);
            return true;
        }
        PyObject* fn = val.real.get();
        if (depth > 16) {  // a cell of its closure holds the function itself (recursion)
            fail(breaks::kEscapingObject,
                 "a function made in the call (" + val.label + ") refers to itself",
                 "define it outside the compiled function");
            return false;
        }
        if (m_ending_segment || !fn || !PyFunction_Check(fn) || val.items.size() != 2) {
            fail(breaks::kEscapingObject,
                 "a function made in the call (" + val.label + ") is live at a graph break",
                 "define it outside the compiled function");
            return false;
        }
        static PyMethodDef fn_def = {"make_function", reinterpret_cast<PyCFunction>(
                                         reinterpret_cast<void (*)()>(make_function)),
                                     METH_FASTCALL, "magpy: a function made in the call"};
        static PyMethodDef cell_def = {"make_cell", reinterpret_cast<PyCFunction>(
                                           reinterpret_cast<void (*)()>(make_cell)),
                                       METH_FASTCALL, "magpy: a closure cell made in the call"};
        static PyObject* make_fn = c_function(&fn_def);
        static PyObject* make_cl = c_function(&cell_def);
        auto* f = reinterpret_cast<PyFunctionObject*>(fn);
        std::vector<int> parts = val.items;  // defaults, keyword defaults
        Step s;
        s.kind = StepKind::Call;
        s.args = {Arg::value(make_fn), Arg::value(f->func_code), Arg::value(f->func_globals),
                  Arg::value(f->func_qualname)};
        // What it holds (defaults, cell contents) leaves the call with it: one object each,
        // shared with every other use (found by a probe: `seen = []` closed over by a hook and
        // returned was two lists)
        for (int part : parts) {
            Arg a;
            if (!build_arg(part, a, true, depth + 1)) return false;
            s.args.push_back(std::move(a));
        }
        PyObject* closure = f->func_closure;
        for (Py_ssize_t i = 0; closure && i < PyTuple_GET_SIZE(closure); ++i) {
            PyObject* cell = PyTuple_GET_ITEM(closure, i);
            if (m_external_cells.count(cell)) {  // the compiled function's own (guarded)
                s.args.push_back(Arg::value(cell));
                continue;
            }
            auto known = m_cells.find(cell);
            if (known == m_cells.end()) {
                fail(breaks::kEscapingObject,
                     "a function made in the call (" + val.label + ") reads a variable the "
                     "capture does not follow", "pass the value as an argument");
                return false;
            }
            auto copied = m_built_cells.find(cell);
            if (copied == m_built_cells.end()) {
                int content = known->second;
                Step c;
                c.kind = StepKind::Call;
                c.args = {Arg::value(make_cl)};
                if (content >= 0) {
                    Arg a;
                    if (!build_arg(content, a, true, depth + 1)) return false;
                    c.args.push_back(std::move(a));
                }
                c.out = m_plan->add_slot();
                m_frozen_cells[cell] = content;
                copied = m_built_cells.emplace(cell, c.out).first;
                add_step(std::move(c));
            }
            s.args.push_back(Arg::slot(copied->second));
        }
        s.out = m_plan->add_slot();
        out = Arg::slot(s.out);
        add_step(std::move(s));
        v(id).built = out.index;
        return true;
    }
    case ValueKind::Partial: {
        // made again at replay: functools.partial(func, *args, **keywords), from its parts
        if (val.built >= 0) {
            out = Arg::slot(val.built);
            return true;
        }
        py::Ref kw = py::Ref::steal(PyObject_GetAttrString(val.real.get(), "keywords"));
        if (!kw || !PyDict_CheckExact(kw.get())) {
            PyErr_Clear();
            internal_error("a partial without keywords");
            return false;
        }
        Step s;
        s.kind = StepKind::Call;
        s.args.push_back(Arg::value(reinterpret_cast<PyObject*>(functools_partial_type())));
        std::vector<int> items = val.items;
        for (int item : items) {
            Arg a;
            if (!build_arg(item, a, escape, depth + 1)) return false;
            s.args.push_back(std::move(a));
        }
        if (PyDict_GET_SIZE(kw.get()) > 0) {
            s.kwnames = py::Ref::steal(PySequence_Tuple(kw.get()));  // its keys, in order
            if (!s.kwnames) {
                PyErr_Clear();
                internal_error("the keywords of a partial");
                return false;
            }
        }
        s.out = m_plan->add_slot();
        out = Arg::slot(s.out);
        add_step(std::move(s));
        if (escape) v(id).built = out.index;
        m_built_slots[out.index] = id;
        return true;
    }
    case ValueKind::BoundMethod: {
        // taken again at replay from the object: getattr(obj, name)
        Arg self;
        if (!build_arg(val.items[1], self, escape, depth + 1)) return false;
        Step s;
        s.kind = StepKind::GetAttr;
        PyObject* fn = v(val.items[0]).real.get();
        s.name = PyFunction_Check(fn)  // a user context manager's __exit__
                     ? py::Ref::borrow(reinterpret_cast<PyFunctionObject*>(fn)->func_name)
                     : py::Ref::borrow(PyDescr_NAME(fn));
        s.args = {self};
        s.out = m_plan->add_slot();
        out = Arg::slot(s.out);
        add_step(std::move(s));
        return true;
    }
    case ValueKind::Iterator:
        if (!escape && val.iter_view) {
            // A dict view consumed by a call (sum(d.values())): a list of its items is the same
            // to any function that only iterates it.
            Step s;
            s.kind = StepKind::BuildList;
            std::vector<int> items = val.items;
            size_t w = static_cast<size_t>(std::max(1, val.iter_width));
            for (size_t j = 0; j + w <= items.size(); j += w) {
                Arg a;
                if (w == 1) {
                    if (!build_arg(items[j], a, false, depth + 1)) return false;
                } else {
                    Step pair;
                    pair.kind = StepKind::BuildTuple;
                    for (size_t k = 0; k < w; ++k) {
                        Arg part;
                        if (!build_arg(items[j + k], part, false, depth + 1)) return false;
                        pair.args.push_back(std::move(part));
                    }
                    pair.out = m_plan->add_slot();
                    a = Arg::slot(pair.out);
                    add_step(std::move(pair));
                }
                s.args.push_back(std::move(a));
            }
            s.out = m_plan->add_slot();
            out = Arg::slot(s.out);
            add_step(std::move(s));
            return true;
        }
        [[fallthrough]];
    default:
        fail(breaks::kEscapingObject,
             "`" + val.label + "` (" + py::type_name(val.real.get()) +
                 ") is used in a way the replay cannot rebuild",
             "keep iterators, closure cells and inner functions inside the function");
        return false;
    }
}

bool Capture::arg_of(int id, Arg& out) { return build_arg(id, out, false, 0); }
bool Capture::escape_arg(int id, Arg& out) { return build_arg(id, out, true, 0); }

// An exception the call made (one a handler caught: [Note: exceptions caught in the frame] in
// monitor.cpp) is known by value, so what the code reads of it folds; but each call makes its
// own: where it leaves the call (stored, returned) one is made at replay from its type and
// arguments (an ImportError's name and path too), once, so that the errors a handler collects
// over calls are distinct objects, as in eager (a review probe: they were one object, and
// changing it changed what later calls caught).
bool Capture::fresh_exception(int id, Arg& out) {
    PyObject* e = v(id).real.get();
    py::Ref args = py::Ref::steal(PyObject_GetAttrString(e, "args"));
    if (!args || !PyTuple_Check(args.get())) {
        PyErr_Clear();
        internal_error("the arguments of a caught " + py::type_name(e));
        return false;
    }
    Step s;
    s.kind = StepKind::Call;
    s.args.push_back(Arg::value(reinterpret_cast<PyObject*>(Py_TYPE(e))));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args.get()); ++i)
        s.args.push_back(Arg::value(PyTuple_GET_ITEM(args.get(), i)));
    if (PyObject_TypeCheck(e, reinterpret_cast<PyTypeObject*>(PyExc_ImportError))) {
        py::Ref name = py::Ref::steal(PyObject_GetAttrString(e, "name"));
        py::Ref path = py::Ref::steal(PyObject_GetAttrString(e, "path"));
        if (!name || !path) {
            PyErr_Clear();
            internal_error("a caught ImportError");
            return false;
        }
        s.args.push_back(Arg::value(name.get()));
        s.args.push_back(Arg::value(path.get()));
        s.kwnames = py::Ref::steal(Py_BuildValue("(ss)", "name", "path"));
    }
    int made = record(std::move(s), e, py::type_name(e) + "(...)", false);
    v(id).built = v(made).slot;
    out = Arg::slot(v(id).built);
    return true;
}

// [SECTION] breaks -----------------------------------------------------------------------------

// A builtin in the user's terms: `__builtins__['open']` (the guards' path to it) is `open`.
static std::string builtins_by_name(std::string text) {
    static const std::string prefix = "__builtins__['";
    for (size_t at = text.find(prefix); at != std::string::npos; at = text.find(prefix, at)) {
        size_t end = text.find("']", at + prefix.size());
        if (end == std::string::npos) break;
        text.replace(at, end + 2 - at, text.substr(at + prefix.size(), end - at - prefix.size()));
    }
    return text;
}

void Capture::fail(const char* reason_id, std::string reason, std::string hint) {
    if (m_failed) return;
    m_failed = true;
    BreakInfo b;
    b.reason_id = reason_id;
    b.reason = builtins_by_name(std::move(reason));
    b.hint = std::move(hint);
    if (m_code) {
        b.filename = py::str_of(m_code->co_filename);
        b.function = py::str_of(m_code->co_qualname);
    }
    b.lineno = m_line;
    m_breaks.push_back(std::move(b));
}

void Capture::internal_error(std::string what) {
    if (m_failed) return;
    m_internal = true;
    fail(breaks::kInternal, "magpy could not follow this code (" + what + "); it ran eagerly",
         "please report this with the code of the function");
}

std::string format_break(const BreakInfo& b) {
    std::string s = "[" + b.reason_id + "] " + b.reason;
    if (!b.filename.empty())
        s += "\n  at " + b.filename + ":" + std::to_string(b.lineno) + " in " + b.function;
    if (!b.hint.empty()) s += "\n  hint: " + b.hint;
    return s;
}

std::string Capture::break_message() const {
    return m_breaks.empty() ? "graph break" : format_break(m_breaks.front());
}

// GraphBreakError(message) with the break's fields as attributes (reason_id, reason, hint,
// filename, lineno), for tools that show it (the notebook views).
py::Ref Capture::raise_graph_break() const {
    PyObject* type = graph_break_error();
    py::Ref exc = py::Ref::steal(PyObject_CallFunction(type, "s", break_message().c_str()));
    if (!exc) return {};
    BreakInfo b = m_breaks.empty() ? BreakInfo{} : m_breaks.front();
    auto set = [&](const char* name, PyObject* value) {
        if (value && PyObject_SetAttrString(exc.get(), name, value) < 0) PyErr_Clear();
        Py_XDECREF(value);
    };
    set("reason_id", PyUnicode_FromString(b.reason_id.c_str()));
    set("reason", PyUnicode_FromString(b.reason.c_str()));
    set("hint", PyUnicode_FromString(b.hint.c_str()));
    set("filename", PyUnicode_FromString(b.filename.c_str()));
    set("lineno", PyLong_FromLong(b.lineno));
    PyErr_Clear();
    PyErr_SetObject(type, exc.get());
    return exc;
}

static PyObject* g_graph_break_error = nullptr;
PyObject* graph_break_error() { return g_graph_break_error ? g_graph_break_error : PyExc_RuntimeError; }
void set_graph_break_error(PyObject* type) {
    Py_XINCREF(type);
    Py_XSETREF(g_graph_break_error, type);
}

// [SECTION] finish -----------------------------------------------------------------------------

void Capture::describe_graph(CaptureResult& r) {
    static const char* kKinds[] = {"null",  "input",    "const", "op",      "list",    "tuple",
                                   "dict",  "set",      "object", "iterator", "cell", "function",
                                   "super", "partial", "context", "method"};
    static_assert(sizeof(kKinds) / sizeof(kKinds[0]) ==
                      static_cast<size_t>(ValueKind::BoundMethod) + 1,
                  "a name for every ValueKind");
    for (size_t i = 1; i < m_values.size(); ++i) {
        const Value& val = m_values[i];
        std::string kind = kKinds[static_cast<int>(val.kind)];
        r.refgraph_nodes.push_back(std::to_string(i) + "\t" + kind + "\t" +
                                   (val.kind == ValueKind::Input ? "external" : "internal") +
                                   "\t" + val.label);
        for (int item : val.items)
            r.refgraph_edges.push_back(std::to_string(i) + "\t" + std::to_string(item) +
                                       "\titem");
    }
    for (const WriteEdge& w : m_write_edges)
        r.refgraph_edges.push_back(std::to_string(w.target) + "\t" + std::to_string(w.value) +
                                   "\t" + w.label);
    for (size_t i = 1; i < m_values.size(); ++i) {  // access-path edges: parent -> child
        const Value& val = m_values[i];
        if (val.node < 0 || m_node_values.count(val.node) == 0 ||
            m_node_values.at(val.node) != static_cast<int>(i))
            continue;
        const Accessor& a = m_guards->node(val.node);
        auto parent = m_node_values.find(a.parent);
        if (a.parent < 0 || parent == m_node_values.end()) continue;
        const std::string& plabel = m_values[static_cast<size_t>(parent->second)].label;
        std::string step = a.source.rfind(plabel, 0) == 0 ? a.source.substr(plabel.size())
                                                           : a.source;
        r.refgraph_edges.push_back(std::to_string(parent->second) + "\t" + std::to_string(i) +
                                   "\t" + step);
    }
}

CaptureResult Capture::finish(int return_value) {
    CaptureResult r;
    r.instructions = instructions;
    Arg result;
    if (!m_failed && escape_arg(return_value, result)) m_plan->set_result(std::move(result));
    if (m_failed) return finish_failed();
    // Objects that were distinct when captured must stay distinct when the function writes to
    // any of them: a write through one path would otherwise be missed through the other.
    std::vector<int> distinct;
    if (m_writes)
        for (const auto& [obj, id] : m_input_objects)
            if (!v(id).identity && !v(id).tensor) distinct.push_back(v(id).node);
    std::sort(distinct.begin(), distinct.end());
    m_guards->set_distinct(std::move(distinct));
    std::vector<std::string> names;
    for (const Accessor& a : m_guards->nodes()) names.push_back(a.source);
    m_plan->set_input_names(std::move(names));
    r.ok = true;
    r.breaks = m_breaks;  // a break this capture ended its segment at (retract_failure)
    r.ops = m_graph_ops;
    describe_graph(r);
    r.guards = std::move(m_guards);
    r.plan = std::move(m_plan);
    return r;
}

CaptureResult Capture::finish_failed() {
    CaptureResult r;
    r.instructions = instructions;
    r.ok = false;
    r.internal_error = m_internal;
    r.breaks = m_breaks;
    describe_graph(r);
    r.guards = std::move(m_guards);
    return r;
}

}  // namespace magpy
