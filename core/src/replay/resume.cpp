#include "replay/resume.h"

#include "cache/code_cache.h"
#include "python/compat.h"

namespace magpy {

namespace {

std::string resume_key(int target, const std::vector<bool>& nulls, const std::vector<int>& unbound,
                       bool eager, const std::vector<InnerFunction>& functions) {
    std::string k = std::to_string(target) + (eager ? "|E|" : "|");
    for (bool n : nulls) k += n ? 'N' : 'v';
    k += "|";
    for (int u : unbound) k += std::to_string(u) + ",";
    // Code objects are constants of the origin and annotations are kept by the entry: their
    // addresses name them for as long as the key is used.
    for (const InnerFunction& fn : functions) {
        k += "|F" + std::to_string(reinterpret_cast<uintptr_t>(fn.code.get())) + ":" +
             std::to_string(reinterpret_cast<uintptr_t>(fn.annotations.get())) +
             (fn.defaults ? "d" : "") + (fn.kwdefaults ? "k" : "");
        for (const auto& t : fn.targets) k += std::string(1, t.first) + std::to_string(t.second);
    }
    return k;
}

// Python's view of the functions (magpy/_resume.py: make_resume's `functions`). New reference.
PyObject* functions_arg(const std::vector<InnerFunction>& functions) {
    py::Ref list = py::Ref::steal(PyList_New(0));
    if (!list) return nullptr;
    for (const InnerFunction& fn : functions) {
        py::Ref targets = py::Ref::steal(PyList_New(0));
        if (!targets) return nullptr;
        for (const auto& t : fn.targets) {
            const char* kind = t.first == 'v' ? "var" : t.first == 's' ? "stack" : "cell";
            py::Ref item = py::Ref::steal(Py_BuildValue("(si)", kind, t.second));
            if (!item || PyList_Append(targets.get(), item.get()) < 0) return nullptr;
        }
        py::Ref spec = py::Ref::steal(Py_BuildValue(
            "(OOOOO)", fn.code.get(), fn.annotations ? fn.annotations.get() : Py_None,
            fn.defaults ? Py_True : Py_False, fn.kwdefaults ? Py_True : Py_False, targets.get()));
        if (!spec || PyList_Append(list.get(), spec.get()) < 0) return nullptr;
    }
    return list.release();
}

}  // namespace

PyCodeObject* resume_code(PyCodeObject* origin, int target, const std::vector<bool>& nulls,
                          const std::vector<int>& unbound, bool eager, PyObject* launcher,
                          const std::vector<InnerFunction>& functions) {
    CodeCache* cc = code_cache(origin, true);
    if (!cc) {
        PyErr_SetString(PyExc_RuntimeError, "magpy: no cache for the resumed code");
        return nullptr;
    }
    std::string key = resume_key(target, nulls, unbound, eager, functions);
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
    py::Ref py_functions = py::Ref::steal(functions_arg(functions));
    if (!py_functions) return nullptr;
    const bool bridge = eager && launcher && functions.empty();
    py::Ref r = py::Ref::steal(PyObject_CallMethod(mod.get(), "make_resume", "OiOOOOO", origin,
                                                   target, py_nulls.get(), py_unbound.get(),
                                                   eager ? Py_True : Py_False,
                                                   bridge ? launcher : Py_None,
                                                   py_functions.get()));
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
                           launcher, c.functions);
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

void InnerFunction::held_at(size_t live_index, size_t nvar, size_t nstack) {
    const char kind = live_index < nvar ? 'v' : live_index < nvar + nstack ? 's' : 'c';
    const size_t index = kind == 'v' ? live_index
                         : kind == 's' ? live_index - nvar
                                       : live_index - nvar - nstack;
    targets.push_back({kind, static_cast<int>(index)});
}

bool inner_function(PyObject* fn, py::IFrame* frame, PyCodeObject* code, PyCodeObject* origin,
                    bool made_here, InnerFunction& out, std::string& why) {
    why.clear();
    if (!PyFunction_Check(fn)) return false;
    auto* f = reinterpret_cast<PyFunctionObject*>(fn);
    PyObject* closure = f->func_closure;  // a tuple of cells, or NULL
    PyCodeObject* fcode = reinterpret_cast<PyCodeObject*>(f->func_code);
    // Made here when each cell it closes over is the frame's local of the same name.
    const Py_ssize_t nfree = closure ? PyTuple_GET_SIZE(closure) : 0;
    bool ours = made_here, all_ours = true;
    const int nfree_code = fcode->co_nfreevars;
    const int first_free = py::code_nlocalsplus(fcode) - nfree_code;
    for (Py_ssize_t j = 0; j < nfree; ++j) {
        PyObject* cell = PyTuple_GET_ITEM(closure, j);
        bool found = false;
        if (j < nfree_code) {
            PyObject* name = py::code_localsplus_name(fcode, first_free + static_cast<int>(j));
            for (int i = 0; i < py::code_nlocalsplus(code) && !found; ++i) {
                if (!(py::code_local_kind(code, i) & (py::kLocalKindCell | py::kLocalKindFree)))
                    continue;
                found = py::frame_local(frame, i) == cell &&
                        PyUnicode_Compare(py::code_localsplus_name(code, i), name) == 0;
            }
        }
        if (!found) {
            for (int i = 0; i < py::code_nlocalsplus(code); ++i)
                if (py::frame_local(frame, i) == cell) ours = true;
        }
        ours = ours || found;
        all_ours = all_ours && found;
    }
    if (!ours) return false;
    auto refuse = [&](std::string because) {
        why = "`" + py::str_of(f->func_qualname) + "` " + because;
        return false;
    };
    if (!all_ours) return refuse("closes over variables of more than this function");
    bool in_consts = false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(origin->co_consts); ++i)
        in_consts = in_consts || PyTuple_GET_ITEM(origin->co_consts, i) == f->func_code;
    if (!in_consts) return refuse("was not made by this function's own code");
    if (f->func_dict && PyDict_Size(f->func_dict) > 0) return refuse("has attributes of its own");
    out = InnerFunction();
    out.code = py::Ref::borrow(f->func_code);
    out.defaults = f->func_defaults != nullptr;
    out.kwdefaults = f->func_kwdefaults != nullptr;
    if (f->func_annotations && PyDict_Check(f->func_annotations)) {
        // MAKE_FUNCTION takes names and values in one tuple
        py::Ref flat = py::Ref::steal(PyTuple_New(2 * PyDict_Size(f->func_annotations)));
        if (!flat) return refuse("has annotations that cannot be read");
        Py_ssize_t pos = 0, k = 0;
        PyObject *key, *value;
        while (PyDict_Next(f->func_annotations, &pos, &key, &value)) {
            PyTuple_SET_ITEM(flat.get(), k++, Py_NewRef(key));
            PyTuple_SET_ITEM(flat.get(), k++, Py_NewRef(value));
        }
        out.annotations = std::move(flat);
    } else if (f->func_annotations && PyTuple_Check(f->func_annotations)) {
        out.annotations = py::Ref::borrow(f->func_annotations);
    }
    return true;
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
