#include "replay/resume.h"

#include "cache/code_cache.h"
#include "python/compat.h"

namespace magpy {

namespace {

std::string resume_key(int target, const std::vector<bool>& nulls, const std::vector<int>& unbound,
                       bool eager) {
    std::string k = std::to_string(target) + (eager ? "|E|" : "|");
    for (bool n : nulls) k += n ? 'N' : 'v';
    k += "|";
    for (int u : unbound) k += std::to_string(u) + ",";
    return k;
}

}  // namespace

PyCodeObject* resume_code(PyCodeObject* origin, int target, const std::vector<bool>& nulls,
                          const std::vector<int>& unbound, bool eager, PyObject* launcher) {
    CodeCache* cc = code_cache(origin, true);
    if (!cc) {
        PyErr_SetString(PyExc_RuntimeError, "magpy: no cache for the resumed code");
        return nullptr;
    }
    std::string key = resume_key(target, nulls, unbound, eager);
    auto it = cc->resumes.find(key);
    if (it != cc->resumes.end()) return reinterpret_cast<PyCodeObject*>(it->second.get());
    py::Ref mod = py::Ref::steal(PyImport_ImportModule("magpy._resume"));
    if (!mod) return nullptr;
    py::Ref py_nulls = py::Ref::steal(PyList_New(static_cast<Py_ssize_t>(nulls.size())));
    for (size_t i = 0; i < nulls.size(); ++i)
        PyList_SET_ITEM(py_nulls.get(), static_cast<Py_ssize_t>(i), PyBool_FromLong(nulls[i]));
    py::Ref py_unbound = py::Ref::steal(PyList_New(static_cast<Py_ssize_t>(unbound.size())));
    for (size_t i = 0; i < unbound.size(); ++i)
        PyList_SET_ITEM(py_unbound.get(), static_cast<Py_ssize_t>(i), PyLong_FromLong(unbound[i]));
    py::Ref r = py::Ref::steal(PyObject_CallMethod(mod.get(), "make_resume", "OiOOOO", origin,
                                                   target, py_nulls.get(), py_unbound.get(),
                                                   eager ? Py_True : Py_False,
                                                   eager && launcher ? launcher : Py_None));
    if (!r) return nullptr;
    PyObject* code = PyTuple_GET_ITEM(r.get(), 0);
    long shift = PyLong_AsLong(PyTuple_GET_ITEM(r.get(), 1));
    CodeCache* rc = code_cache(reinterpret_cast<PyCodeObject*>(code), true);
    if (!rc) {
        PyErr_SetString(PyExc_RuntimeError, "magpy: no cache for a resume code");
        return nullptr;
    }
    rc->origin = origin;
    rc->shift = static_cast<int>(shift);
    rc->target = target;
    cc->resumes.emplace(key, py::Ref::borrow(code));
    return reinterpret_cast<PyCodeObject*>(code);
}

bool prepare_resume(const Continuation& c, PyObject* live, PyObject* frame_function,
                    PyObject* launcher, py::Ref& resume_fn, std::vector<py::Ref>& args) {
    if (!c.origin) {
        PyErr_SetString(PyExc_RuntimeError, "magpy: the resumed function's code is gone");
        return false;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(live);
    size_t nstack = 0;
    for (bool null : c.stack_nulls) nstack += null ? 0 : 1;
    size_t nvar = static_cast<size_t>(c.nvar);
    if (static_cast<size_t>(n) < nvar + nstack) {
        PyErr_SetString(PyExc_RuntimeError, "magpy: a segment's state does not match its layout");
        return false;
    }
    args.clear();
    for (Py_ssize_t i = 0; i < n; ++i) args.push_back(py::Ref::borrow(PyTuple_GET_ITEM(live, i)));
    // args: [locals | stack | cells]; the stack's top is args[nvar + nstack - 1]. The branch or
    // next() decides whether the top is popped, or an item pushed over it.
    auto top_index = static_cast<long>(nvar + nstack) - 1;
    bool jumped = false, popped = false;
    py::Ref item;
    if (c.kind == Continuation::Kind::Branch) {
        PyObject* top = args[static_cast<size_t>(top_index)].get();
        if (c.test == Continuation::Test::IsNone || c.test == Continuation::Test::IsNotNone) {
            jumped = (top == Py_None) == (c.test == Continuation::Test::IsNone);
        } else {
            int t = PyObject_IsTrue(top);
            if (t < 0) return false;
            jumped = (t != 0) == (c.test == Continuation::Test::IsTrue);
        }
        popped = !jumped || c.pop_on_jump;
    } else if (c.kind == Continuation::Kind::ForIter) {
        item = py::Ref::steal(PyIter_Next(args[static_cast<size_t>(top_index)].get()));
        if (!item && PyErr_Occurred()) return false;
        jumped = popped = !item;
    }
    if (popped) args.erase(args.begin() + top_index);
    if (item) args.insert(args.begin() + top_index + 1, std::move(item));
    PyCodeObject*& code = c.resolved[jumped ? 1 : 0];
    if (!code) {
        // The first time the frame goes this way: make (or find) the resume code, and tell it
        // which of its arguments were computed from tensor data.
        std::vector<bool> nulls = c.stack_nulls;
        std::vector<bool> computed = c.computed;
        computed.resize(static_cast<size_t>(n), false);
        if (popped) {
            nulls.pop_back();
            computed.erase(computed.begin() + top_index);
        }
        if (c.kind == Continuation::Kind::ForIter && !jumped) {
            nulls.push_back(false);
            computed.insert(computed.begin() + top_index + 1, false);
        }
        code = resume_code(c.origin, jumped ? c.jump : c.next, nulls, c.unbound, c.eager,
                           launcher);
        if (!code) return false;
        if (CodeCache* rc = code_cache(code, false)) {
            std::vector<bool>& dyn = rc->dynamic_args;
            if (dyn.size() < computed.size()) dyn.resize(computed.size(), false);
            for (size_t i = 0; i < computed.size(); ++i)
                if (computed[i]) dyn[i] = true;
        }
    }
    resume_fn = resume_function(code, frame_function);
    return static_cast<bool>(resume_fn);
}

py::Ref resume_function(PyCodeObject* code, PyObject* frame_function) {
    py::Ref fn = py::Ref::steal(PyFunction_NewWithQualName(
        reinterpret_cast<PyObject*>(code), PyFunction_GET_GLOBALS(frame_function),
        code->co_qualname));
    if (!fn) return fn;
    PyObject* closure = PyFunction_GET_CLOSURE(frame_function);
    if (closure && PyFunction_SetClosure(fn.get(), closure) < 0) return py::Ref();
    return fn;
}

}  // namespace magpy
