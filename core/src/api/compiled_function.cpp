#include "api/compiled_function.h"

#include "capture/break_reasons.h"
#include "hook/frame_hook.h"
#include "python/torch_api.h"

#include <structmember.h>

namespace magpy {

namespace {

struct CompiledFunctionObject {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    CompiledState* state;
    PyObject* weakreflist;
};

PyObject* cf_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    auto* cf = reinterpret_cast<CompiledFunctionObject*>(self);
    return call_with_hook(*cf->state, args, nargsf, kwnames);
}

void cf_dealloc(PyObject* self) {
    auto* cf = reinterpret_cast<CompiledFunctionObject*>(self);
    PyObject_GC_UnTrack(self);
    if (cf->weakreflist) PyObject_ClearWeakRefs(self);
    delete cf->state;
    cf->state = nullptr;
    Py_TYPE(self)->tp_free(self);
}

int visit_state(const CompiledState& st, visitproc visit, void* arg) {
    Py_VISIT(st.target.get());
    for (const std::unique_ptr<CompiledState>& c : st.callees)
        if (int r = visit_state(*c, visit, arg)) return r;
    return 0;
}

int cf_traverse(PyObject* self, visitproc visit, void* arg) {
    auto* cf = reinterpret_cast<CompiledFunctionObject*>(self);
    return cf->state ? visit_state(*cf->state, visit, arg) : 0;
}

PyObject* cf_repr(PyObject* self) {
    auto* cf = reinterpret_cast<CompiledFunctionObject*>(self);
    return PyUnicode_FromFormat("<magpy.CompiledFunction %s backend=%s>",
                                cf->state->name.c_str(), cf->state->options.backend.c_str());
}

// nn.Module's methods that return the module (`train()`, `eval()`, `to()`, `float()`,
// `requires_grad_()`): called through the compiled one, they return the compiled one, so
// `model = magpy.compile(model).eval()` keeps it compiled. `self` is (compiled, method). Other
// methods are handed out as they are (inspect.signature(cm.forward) works).
bool returns_module(PyObject* name) {
    static const char* names[] = {"train", "eval", "to", "cuda", "cpu", "float", "double",
                                  "half", "bfloat16", "type", "requires_grad_", "apply",
                                  "share_memory", "to_empty", "xpu", "ipu"};
    if (!PyUnicode_Check(name)) return false;
    for (const char* n : names)
        if (PyUnicode_CompareWithASCIIString(name, n) == 0) return true;
    return false;
}

PyObject* call_returning_compiled(PyObject* self, PyObject* args, PyObject* kwargs) {
    PyObject* compiled = PyTuple_GET_ITEM(self, 0);
    PyObject* r = PyObject_Call(PyTuple_GET_ITEM(self, 1), args, kwargs);
    auto* cf = reinterpret_cast<CompiledFunctionObject*>(compiled);
    if (r && r == cf->state->target.get()) {
        Py_DECREF(r);
        return Py_NewRef(compiled);
    }
    return r;
}

PyMethodDef g_returning_compiled = {"method", reinterpret_cast<PyCFunction>(
                                                  reinterpret_cast<void (*)()>(call_returning_compiled)),
                                    METH_VARARGS | METH_KEYWORDS, nullptr};

// Attribute access falls through to the wrapped callable (so cf.__name__, cf.weight work).
PyObject* cf_getattro(PyObject* self, PyObject* name) {
    PyObject* r = PyObject_GenericGetAttr(self, name);
    if (r || !PyErr_ExceptionMatches(PyExc_AttributeError)) return r;
    PyErr_Clear();
    auto* cf = reinterpret_cast<CompiledFunctionObject*>(self);
    PyObject* target = cf->state->target.get();
    r = PyObject_GetAttr(target, name);
    if (r && returns_module(name) && PyMethod_Check(r) && PyMethod_GET_SELF(r) == target &&
        PyObject_TypeCheck(target, torch_api().module_type)) {
        PyObject* pair = PyTuple_Pack(2, self, r);
        Py_DECREF(r);
        if (!pair) return nullptr;
        r = PyCFunction_New(&g_returning_compiled, pair);
        Py_DECREF(pair);
    }
    return r;
}

// Attribute writes go to the wrapped callable (`cm.training = False`, `cm.flag = 1`): the
// compiled one has no attributes of its own to set.
int cf_setattro(PyObject* self, PyObject* name, PyObject* value) {
    auto* cf = reinterpret_cast<CompiledFunctionObject*>(self);
    return PyObject_SetAttr(cf->state->target.get(), name, value);
}

PyObject* cf_get_orig(PyObject* self, void*) {
    auto* cf = reinterpret_cast<CompiledFunctionObject*>(self);
    return Py_NewRef(cf->state->target.get());
}

PyGetSetDef cf_getset[] = {
    {"_orig", cf_get_orig, nullptr, "the compiled function or module, as the user gave it",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyMemberDef cf_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(CompiledFunctionObject, vectorcall), READONLY,
     nullptr},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(CompiledFunctionObject, weakreflist), READONLY,
     nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot cf_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(cf_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(cf_traverse)},
    {Py_tp_repr, reinterpret_cast<void*>(cf_repr)},
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_getattro, reinterpret_cast<void*>(cf_getattro)},
    {Py_tp_setattro, reinterpret_cast<void*>(cf_setattro)},
    {Py_tp_members, cf_members},
    {Py_tp_getset, cf_getset},
    {Py_tp_doc, const_cast<char*>("A function or module compiled by magpy.compile().")},
    {0, nullptr}};

PyType_Spec cf_spec = {"magpy.CompiledFunction", sizeof(CompiledFunctionObject), 0,
                       Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
                       cf_slots};

PyTypeObject* g_type = nullptr;

}  // namespace

PyTypeObject* compiled_function_type() {
    if (!g_type) g_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&cf_spec));
    return g_type;
}

std::string qualname_of(PyObject* o) {
    PyObject* q = PyObject_GetAttrString(o, "__qualname__");
    if (!q) {
        PyErr_Clear();
        q = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(o)), "__qualname__");
    }
    if (!q) {
        PyErr_Clear();
        return py::type_name(o);
    }
    std::string s = py::str_of(q);
    Py_DECREF(q);
    return s;
}

CaptureTarget capture_target(PyObject* target) {
    CaptureTarget t;
    PyObject* func = nullptr;
    if (PyFunction_Check(target)) {
        func = target;
    } else if (PyMethod_Check(target)) {
        func = PyMethod_GET_FUNCTION(target);
        t.self = PyMethod_GET_SELF(target);
    } else if (PyObject_TypeCheck(target, torch_api().module_type)) {
        t.self = target;
        // `self.forward = self._fast` in __init__: Module.__call__ finds the instance's own
        // (a review probe: the class's placeholder was taken, and the model ran eagerly)
        PyObject** dict = _PyObject_GetDictPtr(target);
        PyObject* own = dict && *dict ? PyDict_GetItemString(*dict, "forward") : nullptr;
        if (own && PyMethod_Check(own) && PyMethod_GET_SELF(own) == target &&
            PyFunction_Check(PyMethod_GET_FUNCTION(own))) {
            func = PyMethod_GET_FUNCTION(own);  // the instance's dict keeps it alive
        } else if (!own) {
            PyObject* fwd = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(target)),
                                                   "forward");
            if (!fwd) PyErr_Clear();
            if (fwd && PyFunction_Check(fwd)) func = fwd;  // the type keeps it alive
            Py_XDECREF(fwd);
        }
    }
    if (func && t.self) {
        PyObject* wrapped = PyObject_GetAttrString(func, "__wrapped__");
        if (wrapped) {
            t.function = func;  // `self` is inside the wrapper's *args
            Py_DECREF(wrapped);
        } else {
            PyErr_Clear();
        }
    }
    if (func && py::code_is_plain_function(
                    reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(func))))
        t.code = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(func));
    return t;
}

CompiledState* compiled_state(PyObject* obj) {
    if (!g_type || !PyObject_TypeCheck(obj, g_type)) return nullptr;
    return reinterpret_cast<CompiledFunctionObject*>(obj)->state;
}

PyObject* make_compiled_function(PyObject* target, const CompileOptions& options) {
    if (!init_torch_api()) return nullptr;
    if (!PyCallable_Check(target)) {
        PyErr_Format(PyExc_TypeError,
                     "magpy.compile() expects a function or an nn.Module, but got %R (%s), "
                     "which is not callable",
                     target, Py_TYPE(target)->tp_name);
        return nullptr;
    }
    const Backend* backend = find_backend(options.backend);
    if (!backend) {
        std::string names;
        for (const std::string& n : backend_names()) names += (names.empty() ? "" : ", ") + n;
        PyErr_Format(PyExc_ValueError, "magpy.compile(): unknown backend '%s'; available: %s",
                     options.backend.c_str(), names.c_str());
        return nullptr;
    }
    if (CompiledState* inner = compiled_state(target)) target = inner->target.get();
    PyTypeObject* type = compiled_function_type();
    if (!type) return nullptr;
    auto* cf = PyObject_GC_New(CompiledFunctionObject, type);
    if (!cf) return nullptr;
    cf->vectorcall = cf_vectorcall;
    cf->weakreflist = nullptr;
    cf->state = new CompiledState();
    CompiledState& st = *cf->state;
    st.target = py::Ref::borrow(target);
    st.options = options;
    st.options_key = options.key();
    st.backend = backend;
    st.name = qualname_of(target);

    CaptureTarget t = capture_target(target);
    st.expect_self = t.self;
    st.expect_function = t.function;
    if (t.code) {
        st.code = py::Ref::borrow(reinterpret_cast<PyObject*>(t.code));
    } else {
        BreakInfo b;
        b.reason_id = breaks::kNoPythonCode;
        b.reason = "`" + st.name + "` has no Python code to capture (" + py::type_name(target) +
                   "); it runs eagerly";
        b.hint = "compile a Python function or an nn.Module";
        st.add_break(b);
    }
    PyObject_GC_Track(reinterpret_cast<PyObject*>(cf));
    return reinterpret_cast<PyObject*>(cf);
}

}  // namespace magpy
