// [SECTION] running  [SECTION] rendering
#include "replay/plan.h"

#include "python/compat.h"
#include "python/torch_api.h"

#include <algorithm>
#include <cctype>

namespace magpy {

size_t Plan::graph_op_count() const {
    size_t n = 0;
    for (const Step& s : m_steps) n += s.graph_op ? 1 : 0;
    return n;
}

// [SECTION] running ----------------------------------------------------------------------------

const char* binary_symbol(int op) {
    static const char* kSym[] = {"+",  "&",  "//",  "<<",  "@",  "*",  "%",  "|",  "**",
                                 ">>", "-",  "/",   "^",   "+=", "&=", "//=", "<<=", "@=",
                                 "*=", "%=", "|=",  "**=", ">>=", "-=", "/=", "^="};
    return op >= 0 && op < 26 ? kSym[op] : "?";
}

const char* compare_symbol(int op) {
    static const char* kSym[] = {"<", "<=", "==", "!=", ">", ">="};
    return op >= 0 && op < 6 ? kSym[op] : "?";
}


namespace {

using BinaryFn = PyObject* (*)(PyObject*, PyObject*);

BinaryFn binary_fn(int op) {
    switch (op) {
    case NB_ADD: return PyNumber_Add;
    case NB_AND: return PyNumber_And;
    case NB_FLOOR_DIVIDE: return PyNumber_FloorDivide;
    case NB_LSHIFT: return PyNumber_Lshift;
    case NB_MATRIX_MULTIPLY: return PyNumber_MatrixMultiply;
    case NB_MULTIPLY: return PyNumber_Multiply;
    case NB_REMAINDER: return PyNumber_Remainder;
    case NB_OR: return PyNumber_Or;
    case NB_RSHIFT: return PyNumber_Rshift;
    case NB_SUBTRACT: return PyNumber_Subtract;
    case NB_TRUE_DIVIDE: return PyNumber_TrueDivide;
    case NB_XOR: return PyNumber_Xor;
    case NB_INPLACE_ADD: return PyNumber_InPlaceAdd;
    case NB_INPLACE_AND: return PyNumber_InPlaceAnd;
    case NB_INPLACE_FLOOR_DIVIDE: return PyNumber_InPlaceFloorDivide;
    case NB_INPLACE_LSHIFT: return PyNumber_InPlaceLshift;
    case NB_INPLACE_MATRIX_MULTIPLY: return PyNumber_InPlaceMatrixMultiply;
    case NB_INPLACE_MULTIPLY: return PyNumber_InPlaceMultiply;
    case NB_INPLACE_REMAINDER: return PyNumber_InPlaceRemainder;
    case NB_INPLACE_OR: return PyNumber_InPlaceOr;
    case NB_INPLACE_RSHIFT: return PyNumber_InPlaceRshift;
    case NB_INPLACE_SUBTRACT: return PyNumber_InPlaceSubtract;
    case NB_INPLACE_TRUE_DIVIDE: return PyNumber_InPlaceTrueDivide;
    case NB_INPLACE_XOR: return PyNumber_InPlaceXor;
    default: return nullptr;
    }
}

PyObject* power(PyObject* a, PyObject* b) { return PyNumber_Power(a, b, Py_None); }
PyObject* inplace_power(PyObject* a, PyObject* b) { return PyNumber_InPlacePower(a, b, Py_None); }

// The plan's slots for one run: on the stack for small plans (no allocation per call).
struct Slots {
    explicit Slots(int n) : n(static_cast<size_t>(n)) {
        if (this->n > kSmall) big.assign(this->n, nullptr);
        v = this->n > kSmall ? big.data() : small;
        std::fill(v, v + this->n, nullptr);
    }
    ~Slots() {
        for (size_t i = 0; i < n; ++i) Py_XDECREF(v[i]);
    }
    static constexpr size_t kSmall = 64;
    size_t n;
    PyObject* small[kSmall];
    std::vector<PyObject*> big;
    PyObject** v;
};

}  // namespace

// [Note: site frames] Eager runs each operation in the frame of the user's code that called it,
// and some of them look at that frame: torch files the warnings of an op's C++ code
// (`masked_fill_` on an expanded tensor) under the file, line and module of the innermost
// Python frame, and a Python function called there sees it as its caller (sys._getframe(1),
// f_back). A replay plan runs none of the user's frames, so while a step runs, a frame object
// that stands for the one that ran it at capture (its file, function name, module globals,
// the step's line; library code such as Module._call_impl included) is linked as the thread's
// innermost frame above the caller of the compiled function (py::link_site_frame); it stays
// linked over the steps of the same site, its line changing. One frame per site is made at
// capture and reused; a plan that runs inside one of its own steps (a recursive call) links a
// copy. A TorchScript graph runs many ops in one step: when its ops give warnings, its steps
// run instead ([Note: warnings from a graph] in torchscript_backend.cpp).
void SiteLink::at(const Step& s) {
    if (m_linked && s.site == m_site) {
        py::set_site_frame_line(m_linked, s.site_line);
        return;
    }
    unlink();
    if (s.site < 0 || static_cast<size_t>(s.site) >= m_sites.size()) return;
    PyObject* f = m_sites[static_cast<size_t>(s.site)].get();
    if (!py::link_site_frame(m_ts, f, s.site_line)) {
        m_copy = py::Ref::steal(py::copy_site_frame(f));
        if (!m_copy || !py::link_site_frame(m_ts, m_copy.get(), s.site_line)) {
            PyErr_Clear();  // out of memory: the step runs with the caller's frame
            m_copy = py::Ref();
            return;
        }
        f = m_copy.get();
    }
    m_linked = f;
    m_site = s.site;
}

void SiteLink::unlink() {
    if (!m_linked) return;
    py::unlink_site_frame(m_ts, m_linked);
    m_linked = nullptr;
    m_copy = py::Ref();
}

namespace {
// The pending exception (normalized, borrowed; it stays pending), or null: which error is
// pending, to compare.
PyObject* pending_error() {
    if (!PyErr_Occurred()) return nullptr;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb && value) PyException_SetTraceback(value, tb);
    PyObject* v = value;
    PyErr_Restore(type, value, tb);
    return v;
}
}  // namespace

PyObject* Plan::add_user_frame(const Step& s) const {
    if (s.loc >= 0 && s.loc < static_cast<int>(m_locations.size()) && PyErr_Occurred()) {
        const SourceLocation& l = m_locations[static_cast<size_t>(s.loc)];
        _PyTraceback_Add(l.function.c_str(), l.filename.c_str(), s.line);
    }
    return nullptr;
}

// A failed step: the user's exception with the user's frame added, or, inside a try block, a
// request to run the frame eagerly (see run()). Only Exception subclasses are handed back:
// KeyboardInterrupt and SystemExit go on as they are.
// [Note: draws before a check] A plan may give up (decline) only before anything visible has
// happened, so that the frame can run again as eager would. Drawing from the global generators
// (torch.randn, dropout, `t.normal_()` on memory the call made, random.random()) changes only
// their state, and that can be put back: such a plan saves the states on entry (torch's CPU
// generator, the CUDA ones once CUDA is initialised, the `random` module's) and restores them
// when it declines, so the frame that runs again draws exactly the numbers eager draws. This
// lets torch.distributions' `log_prob` validation follow an `rsample()`. A draw from a
// generator of the user's (generator=, a random.Random of their own) is a visible effect.
namespace {
struct GeneratorFns {
    py::Ref torch_get, torch_set, cuda_initialized, cuda_get, cuda_set, random_get, random_set;
};
const GeneratorFns* generator_fns() {
    static GeneratorFns* fns = [] {
        auto* f = new GeneratorFns;  // lives for the process
        auto attr = [](const char* module, const char* name) {
            py::Ref m = py::Ref::steal(PyImport_ImportModule(module));
            py::Ref a = m ? py::Ref::steal(PyObject_GetAttrString(m.get(), name)) : py::Ref();
            PyErr_Clear();
            return a;
        };
        f->torch_get = attr("torch.random", "get_rng_state");
        f->torch_set = attr("torch.random", "set_rng_state");
        f->cuda_initialized = attr("torch.cuda", "is_initialized");
        f->cuda_get = attr("torch.cuda", "get_rng_state_all");
        f->cuda_set = attr("torch.cuda", "set_rng_state_all");
        f->random_get = attr("random", "getstate");
        f->random_set = attr("random", "setstate");
        return f;
    }();
    return fns;
}
}  // namespace

bool Plan::OnEntry::save(const Plan& plan) {
    if (plan.m_changes_grad) {
        grad = py::Ref::steal(PyObject_CallNoArgs(torch_api().is_grad_enabled.get()));
        if (!grad) return false;
    }
    if (!plan.m_restores_generators) return true;
    const GeneratorFns* g = generator_fns();
    if (!g->torch_get || !g->torch_set || !g->random_get || !g->random_set) {
        PyErr_SetString(PyExc_RuntimeError, "magpy: cannot save the random generators' state");
        return false;
    }
    py::Ref cuda_on = g->cuda_initialized
                          ? py::Ref::steal(PyObject_CallNoArgs(g->cuda_initialized.get()))
                          : py::Ref::borrow(Py_False);
    if (!cuda_on) return false;
    py::Ref t = py::Ref::steal(PyObject_CallNoArgs(g->torch_get.get()));
    py::Ref r = t ? py::Ref::steal(PyObject_CallNoArgs(g->random_get.get())) : py::Ref();
    py::Ref c = r && cuda_on.get() == Py_True && g->cuda_get
                    ? py::Ref::steal(PyObject_CallNoArgs(g->cuda_get.get()))
                    : py::Ref::borrow(Py_None);
    if (!t || !r || !c) return false;
    generators = py::Ref::steal(PyTuple_Pack(3, t.get(), r.get(), c.get()));
    return generators.get() != nullptr;
}

// [Note: writes undone] A write to an attribute of an object passed in (AnchorGenerator's
// `self.cell_anchors = [...]` on every call, a step counter), to an item of a dict passed in, or
// to a global changes dict entries and nothing else when the object's class sets attributes the
// plain way (object.__setattr__, or nn.Module's, which also keeps _parameters, _buffers and
// _modules) and has no data descriptor of that name. Such a write (Step::undoable, decided at
// capture by Capture::undoable_write) does not stop a plan from giving up later: before it runs,
// the plan notes the entries it may change (the key in the instance __dict__, and for a module
// in its three registries too; the key in the dict), and when the plan declines it puts them
// back, last write first, so the frame that runs again starts from what the caller had. Only
// plans that may decline after such a write keep the notes (Plan::set_undoes_writes).
bool Plan::OnEntry::note_write(const Step& s, PyObject* target, PyObject* key) {
    auto note = [&](PyObject* map) {
        PyObject* old = PyDict_GetItemWithError(map, key);  // borrowed
        if (!old && PyErr_Occurred()) return false;
        writes.push_back({py::Ref::borrow(map), py::Ref::borrow(key), py::Ref::borrow(old)});
        return true;
    };
    if (s.kind == StepKind::SetItem) return PyDict_Check(target) && note(target);
    py::Ref dict = py::Ref::steal(PyObject_GenericGetDict(target, nullptr));
    if (!dict || !note(dict.get())) return false;
    if (!PyObject_TypeCheck(target, torch_api().module_type)) return true;
    for (const char* name : {"_parameters", "_buffers", "_modules"}) {
        PyObject* registry = PyDict_GetItemString(dict.get(), name);  // borrowed
        if (registry && PyDict_Check(registry) && !note(registry)) return false;
    }
    return true;
}

void Plan::OnEntry::restore() const {
    for (auto w = writes.rbegin(); w != writes.rend(); ++w) {
        int rc = 0;
        if (w->old) {
            rc = PyObject_SetItem(w->map.get(), w->key.get(), w->old.get());
        } else {
            int has = PyDict_Contains(w->map.get(), w->key.get());
            rc = has > 0 ? PyObject_DelItem(w->map.get(), w->key.get()) : has;
        }
        if (rc < 0) PyErr_WriteUnraisable(w->map.get());
    }
    auto call = [](const py::Ref& fn, PyObject* arg) {
        PyObject* r = fn ? PyObject_CallOneArg(fn.get(), arg) : nullptr;
        if (r) Py_DECREF(r);
        else if (PyErr_Occurred()) PyErr_WriteUnraisable(fn.get());
    };
    if (grad) call(torch_api().set_grad_enabled_fn, grad.get());
    if (!generators) return;
    const GeneratorFns* g = generator_fns();
    call(g->torch_set, PyTuple_GET_ITEM(generators.get(), 0));
    call(g->random_set, PyTuple_GET_ITEM(generators.get(), 1));
    if (PyTuple_GET_ITEM(generators.get(), 2) != Py_None)
        call(g->cuda_set, PyTuple_GET_ITEM(generators.get(), 2));
}

PyObject* Plan::fail(const Step& s, Declined& declined, PyObject** slots,
                     const OnEntry& entry) const {
    if (!PyErr_Occurred() && declined == Declined::No) {
        PyErr_SetString(PyExc_SystemError, "magpy: a replayed step failed without an error");
        return add_user_frame(s);
    }
    if (declined == Declined::No && s.in_try && PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        declined = Declined::RunEagerly;
    }
    if (declined == Declined::No && !s.frame_added) add_user_frame(s);
    PyObject* before = pending_error();
    unwind(s.ctx, slots, declined != Declined::No);
    // An __exit__ that raised replaced the error: its traceback goes through the user's frame
    // too, as the with statement's would.
    if (declined == Declined::No && PyErr_Occurred() && pending_error() != before)
        add_user_frame(s);
    if (declined != Declined::No) entry.restore();  // the frame runs again from its start
    return nullptr;
}

// [Note: with blocks]
void Plan::unwind(int ctx, PyObject** slots, bool declined) const {
    for (; ctx >= 0 && ctx < static_cast<int>(m_contexts.size());
         ctx = m_contexts[static_cast<size_t>(ctx)].parent) {
        const PlanContext& c = m_contexts[static_cast<size_t>(ctx)];
        PyObject* exit = slots[c.exit_slot];
        if (!exit || (declined && (c.inherited || c.user))) continue;
        PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
        PyErr_Fetch(&type, &value, &tb);
        PyObject* r;
        if (type) {
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb) PyException_SetTraceback(value, tb);
            r = PyObject_CallFunctionObjArgs(exit, type, value, tb ? tb : Py_None, nullptr);
        } else {
            r = PyObject_CallFunctionObjArgs(exit, Py_None, Py_None, Py_None, nullptr);
        }
        if (r) {
            Py_DECREF(r);  // the captured context managers never swallow exceptions
            PyErr_Restore(type, value, tb);
        } else if (declined) {
            PyErr_WriteUnraisable(exit);  // nothing to report it to: the frame runs again
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        } else {
            // __exit__ raised: its exception replaces the pending one, chained as Python does.
            PyObject *t2, *v2, *tb2;
            PyErr_Fetch(&t2, &v2, &tb2);
            PyErr_NormalizeException(&t2, &v2, &tb2);
            if (value) PyException_SetContext(v2, value);
            else Py_XDECREF(value);
            Py_XDECREF(type);
            Py_XDECREF(tb);
            PyErr_Restore(t2, v2, tb2);
        }
    }
}

const std::vector<std::vector<int>>& Plan::releases() const {
    if (m_release.size() == m_steps.size()) return m_release;
    std::vector<int> last(static_cast<size_t>(m_num_slots), -1);  // step of the last read
    for (size_t i = 0; i < m_steps.size(); ++i) {
        for (const Arg& a : m_steps[i].args)
            if (a.kind == Arg::Kind::Slot) last[static_cast<size_t>(a.index)] = static_cast<int>(i);
        int out = m_steps[i].out;
        if (out >= 0 && last[static_cast<size_t>(out)] < static_cast<int>(i))
            last[static_cast<size_t>(out)] = static_cast<int>(i);  // never read: dies at once
        // an open with block's __exit__ lives while a step inside may raise (unwind() calls
        // it), also when no step calls it (a user's context manager: [Note: user context
        // managers])
        for (int c = m_steps[i].ctx; c >= 0 && c < static_cast<int>(m_contexts.size());
             c = m_contexts[static_cast<size_t>(c)].parent) {
            int& l = last[static_cast<size_t>(m_contexts[static_cast<size_t>(c)].exit_slot)];
            l = std::max(l, static_cast<int>(i));
        }
    }
    if (m_result.kind == Arg::Kind::Slot) last[static_cast<size_t>(m_result.index)] = -1;
    m_release.assign(m_steps.size(), {});
    for (int k = 0; k < m_num_slots; ++k)
        if (last[static_cast<size_t>(k)] >= 0)
            m_release[static_cast<size_t>(last[static_cast<size_t>(k)])].push_back(k);
    return m_release;
}

int Plan::last_declining() const {
    if (m_last_declining != -2) return m_last_declining;
    m_last_declining = -1;
    for (size_t i = 0; i < m_steps.size(); ++i)
        if (m_steps[i].in_try || m_steps[i].kind == StepKind::Check)
            m_last_declining = static_cast<int>(i);
    return m_last_declining;
}

namespace {
// [Note: warnings before a decline] A plan that may still decline (a step inside the user's try
// block may raise on new data, a Check may fail) has done nothing visible yet, so the frame can
// run again as eager would ([Note: draws before a check]). A warning that a step gives (an op's
// C++ code filing a deprecation, fuzz seed 582853) is visible, and the frame running again
// would give it twice. Until its last such step, the plan runs with an "error" filter for
// every warning first in warnings.filters (put in place, so that the registries behind "once
// per line" stay valid): a warning then raises, and the plan declines (Declined::Warned) and
// lets the frame run, which gives it once, as the user's filters say. A warning already in a
// registry is silent before any filter is read, as in eager.
class WarningHold {
public:
    explicit WarningHold(bool on) {
        if (!on) return;
        static PyObject* entry =  // ("error", None, Warning, None, 0), as simplefilter makes
            Py_BuildValue("(sOOOi)", "error", Py_None, PyExc_Warning, Py_None, 0);
        // the module once; its `filters` each run (catch_warnings replaces the list)
        static PyObject* warnings = PyImport_ImportModule("warnings");
        m_filters = warnings ? py::Ref::steal(PyObject_GetAttrString(warnings, "filters"))
                             : py::Ref();
        if (!entry || !m_filters || !PyList_Check(m_filters.get()) ||
            PyList_Insert(m_filters.get(), 0, entry) < 0) {
            PyErr_Clear();  // no hold: a warning before a decline may be given twice
            m_filters = py::Ref();
            return;
        }
        m_entry = entry;
    }
    ~WarningHold() { end(); }
    WarningHold(const WarningHold&) = delete;
    WarningHold& operator=(const WarningHold&) = delete;
    bool on() const { return m_entry != nullptr; }
    void end() {
        if (!m_entry) return;
        PyObject* list = m_filters.get();
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i)
            if (PyList_GET_ITEM(list, i) == m_entry) {
                PyObject *t, *v, *tb;
                PyErr_Fetch(&t, &v, &tb);
                if (PySequence_DelItem(list, i) < 0) PyErr_Clear();
                PyErr_Restore(t, v, tb);
                break;
            }
        m_entry = nullptr;
    }

private:
    py::Ref m_filters;
    PyObject* m_entry = nullptr;
};
}  // namespace

PyObject* Plan::run(PyObject* const* inputs, Declined& declined) const {
    declined = Declined::No;
    Slots slots(m_num_slots);
    OnEntry entry;
    if ((m_changes_grad || m_restores_generators) && !entry.save(*this)) return nullptr;
    const int hold_until = last_declining();
    WarningHold hold(hold_until >= 0);
    auto fail = [&](const Step& s) {
        if (hold.on() && declined == Declined::No && PyErr_ExceptionMatches(PyExc_Warning)) {
            PyErr_Clear();
            declined = Declined::Warned;
        }
        hold.end();
        return this->fail(s, declined, slots.v, entry);
    };
    auto get = [&](const Arg& a) -> PyObject* {  // borrowed
        switch (a.kind) {
        case Arg::Kind::Input: return inputs[a.index];
        case Arg::Kind::Const: return a.constant.get();
        case Arg::Kind::Slot: return slots.v[a.index];
        }
        return nullptr;
    };
    PyObject* argv_small[16];
    std::vector<PyObject*> argv_big;
    const std::vector<std::vector<int>>& release = releases();
    SiteLink site(PyThreadState_Get(), m_sites);
    for (size_t i = 0; i < m_steps.size(); ++i) {
        // Values die after their last use, as the program's temporaries would: a long plan
        // does not hold every intermediate tensor until it returns.
        if (i > 0)
            for (int k : release[i - 1]) Py_CLEAR(slots.v[k]);
        const Step& s = m_steps[i];
        if (static_cast<int>(i) > hold_until) hold.end();
        site.at(s);
        PyObject* r = nullptr;
        switch (s.kind) {
        case StepKind::Call: {
            size_t n = s.args.size();
            PyObject** argv = argv_small;
            if (n > 16) {
                argv_big.resize(n);
                argv = argv_big.data();
            }
            for (size_t i = 0; i < n; ++i) argv[i] = get(s.args[i]);
            size_t nkw = s.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(s.kwnames.get())) : 0;
            r = PyObject_Vectorcall(argv[0], argv + 1, n - 1 - nkw, s.kwnames.get());
            break;
        }
        case StepKind::CallEx: {
            PyObject* kw = get(s.args[2]);
            py::Ref star = py::Ref::steal(PySequence_Tuple(get(s.args[1])));
            r = star ? PyObject_Call(get(s.args[0]), star.get(), kw == Py_None ? nullptr : kw)
                     : nullptr;
            break;
        }
        case StepKind::Binary: {
            BinaryFn fn = s.op == NB_POWER           ? power
                          : s.op == NB_INPLACE_POWER ? inplace_power
                                                     : binary_fn(s.op);
            r = fn(get(s.args[0]), get(s.args[1]));
            break;
        }
        case StepKind::Compare:
            r = PyObject_RichCompare(get(s.args[0]), get(s.args[1]), s.op);
            break;
        case StepKind::Unary: {
            PyObject* a = get(s.args[0]);
            if (s.op == 0) r = PyNumber_Negative(a);
            else if (s.op == 1) r = PyNumber_Positive(a);
            else if (s.op == 2) r = PyNumber_Invert(a);
            else {
                int t = PyObject_Not(a);
                r = t < 0 ? nullptr : Py_NewRef(t ? Py_True : Py_False);
            }
            break;
        }
        case StepKind::GetItem:
            r = PyObject_GetItem(get(s.args[0]), get(s.args[1]));
            break;
        case StepKind::GetAttr:
            r = PyObject_GetAttr(get(s.args[0]), s.name.get());
            break;
        case StepKind::BuildList:
        case StepKind::BuildTuple: {
            Py_ssize_t n = static_cast<Py_ssize_t>(s.args.size());
            r = s.kind == StepKind::BuildList ? PyList_New(n) : PyTuple_New(n);
            if (!r) break;
            for (Py_ssize_t i = 0; i < n; ++i) {
                PyObject* it = Py_NewRef(get(s.args[static_cast<size_t>(i)]));
                if (s.kind == StepKind::BuildList) PyList_SET_ITEM(r, i, it);
                else PyTuple_SET_ITEM(r, i, it);
            }
            if (r && s.name) {  // a list-like type made from the list (layers[:2] of a ModuleList)
                PyObject* made = PyObject_CallOneArg(s.name.get(), r);
                Py_SETREF(r, made);
            }
            break;
        }
        case StepKind::BuildDict: {
            // `name` holds the dict type when it is not dict (OrderedDict keeps its own order,
            // so items go in through its __setitem__).
            r = s.name ? PyObject_CallNoArgs(s.name.get()) : PyDict_New();
            for (size_t i = 0; r && i + 1 < s.args.size(); i += 2)
                if (PyObject_SetItem(r, get(s.args[i]), get(s.args[i + 1])) < 0) Py_CLEAR(r);
            break;
        }
        case StepKind::BuildSlice:
            r = PySlice_New(get(s.args[0]), get(s.args[1]),
                            s.args.size() > 2 ? get(s.args[2]) : nullptr);
            break;
        case StepKind::SetAttr:
        case StepKind::SetItem: {
            PyObject* target = get(s.args[0]);
            PyObject* key = s.kind == StepKind::SetAttr ? s.name.get() : get(s.args[1]);
            if (s.undoable && m_undoes_writes && !entry.note_write(s, target, key))
                return fail(s);
            int rc = s.kind == StepKind::SetAttr ? PyObject_SetAttr(target, key, get(s.args[1]))
                                                 : PyObject_SetItem(target, key, get(s.args[2]));
            if (rc < 0) return fail(s);
            continue;
        }
        case StepKind::Check: {
            PyObject* x = get(s.args[0]);
            int same;
            if (s.op == kCheckLength) {
                Py_ssize_t n = PyObject_Length(x);
                same = n < 0 ? -1 : n == PyLong_AsSsize_t(get(s.args[1]));
            } else if (s.op == kCheckRank) {
                static PyObject* ndim = PyUnicode_InternFromString("ndim");
                PyObject* n = PyObject_GetAttr(x, ndim);
                same = n ? PyObject_RichCompareBool(n, get(s.args[1]), Py_EQ) : -1;
                Py_XDECREF(n);
            } else if (s.op == kCheckTruth) {
                int truth = PyObject_IsTrue(x);
                same = truth < 0 ? -1 : truth == (get(s.args[1]) == Py_True);
            } else {
                same = PyObject_RichCompareBool(x, get(s.args[1]), Py_EQ);
            }
            if (same < 0 && PyErr_ExceptionMatches(PyExc_Exception)) {
                PyErr_Clear();  // (len() of what is now a 0-d tensor): not what was seen
                same = 0;
            }
            if (same < 0) return fail(s);
            if (!same) {
                if (s.speculation) s.speculation->failed = true;
                declined = Declined::Recapture;
                return fail(s);
            }
            continue;
        }
        }
        if (!r) return fail(s);
        if (s.out >= 0) {
            Py_XSETREF(slots.v[s.out], r);
        } else {
            Py_DECREF(r);
        }
    }
    PyObject* result = get(m_result);
    return Py_XNewRef(result);
}

// [SECTION] rendering --------------------------------------------------------------------------

std::string callable_name(PyObject* f) {
    if (!f) return "?";
    // Engine callables (a backend's compiled graph) are C functions bound to a capsule.
    if (PyCFunction_Check(f) && PyCFunction_GET_SELF(f) && PyCapsule_CheckExact(PyCFunction_GET_SELF(f)))
        return reinterpret_cast<PyCFunctionObject*>(f)->m_ml->ml_name;
    if (PyCFunction_Check(f)) {  // a method of a literal: ''.join, ', '.join
        PyObject* self = PyCFunction_GET_SELF(f);
        const char* method = reinterpret_cast<PyCFunctionObject*>(f)->m_ml->ml_name;
        if (self && (PyUnicode_CheckExact(self) || PyBytes_CheckExact(self)) &&
            PyObject_Length(self) <= 16)
            return py::repr_string(self) + "." + method;
    }
    PyObject* qual = PyObject_GetAttrString(f, "__qualname__");
    if (!qual) {
        PyErr_Clear();
        qual = PyObject_GetAttrString(f, "__name__");
    }
    if (!qual) {
        PyErr_Clear();
        return py::repr_string(f);
    }
    std::string name = py::str_of(qual);
    Py_DECREF(qual);
    PyObject* mod = PyObject_GetAttrString(f, "__module__");
    if (!mod) PyErr_Clear();
    std::string m = mod && PyUnicode_Check(mod) ? py::str_of(mod) : "";
    Py_XDECREF(mod);
    if (PyObject_TypeCheck(f, &PyMethodDescr_Type) || Py_TYPE(f) == &PyWrapperDescr_Type) {
        // Tensor methods: torch._C._TensorBase.add -> torch.Tensor.add
        PyTypeObject* owner = PyDescr_TYPE(f);
        std::string owner_name = owner->tp_name;
        if (owner_name == "torch._C._TensorBase") owner_name = "torch.Tensor";
        std::string short_name = name.substr(name.rfind('.') + 1);
        return owner_name + "." + short_name;
    }
    if (m == "torch.nn.functional") return "F." + name;
    if (m.empty() || m == "builtins") return name;
    if (m.rfind("torch._C", 0) == 0 || m == "torch.functional") return "torch." + name;
    return m + "." + name;
}

static std::string render_constant(PyObject* c);

std::string Plan::render_arg(const Arg& a) const {
    switch (a.kind) {
    case Arg::Kind::Input:
        return a.index >= 0 && static_cast<size_t>(a.index) < m_input_names.size()
                   ? m_input_names[static_cast<size_t>(a.index)]
                   : "input" + std::to_string(a.index);
    case Arg::Kind::Slot:
        return "v" + std::to_string(a.index);
    case Arg::Kind::Const:
        return render_constant(a.constant.get());
    }
    return "?";
}

// A constant as Python source would name it: callables and types by name, a module's
// globals as vars(module), tuples item by item, anything else by its repr.
static std::string render_constant(PyObject* c) {
    if (PyCallable_Check(c) && !PyType_Check(c)) return callable_name(c);
    if (PyType_Check(c)) return reinterpret_cast<PyTypeObject*>(c)->tp_name;
    if (PyTuple_CheckExact(c)) {
        std::string s = "(";
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(c); ++i)
            s += (i ? ", " : "") + render_constant(PyTuple_GET_ITEM(c, i));
        return s + (PyTuple_GET_SIZE(c) == 1 ? ",)" : ")");
    }
    if (PyDict_Check(c)) {  // warnings.warn's site holds the globals of a module
        PyObject* name = PyDict_GetItemString(c, "__name__");
        PyObject* mod = name ? PyDict_GetItemWithError(PyImport_GetModuleDict(), name) : nullptr;
        PyObject* dict = mod && PyModule_Check(mod) ? PyModule_GetDict(mod) : nullptr;
        PyErr_Clear();
        if (dict == c) return "vars(sys.modules[" + py::repr_string(name) + "])";
    }
    return py::repr_string(c);
}

std::string Plan::render(const std::string& fn_name, const std::string& filename) const {
    std::string name = fn_name;  // "<module>", "<lambda>": not identifiers
    for (char& c : name)
        if (!(isalnum(static_cast<unsigned char>(c)) || c == '_')) c = '_';
    std::string out = "def replay_" + name + "(L, G):\n";
    out += "    # L: the frame's arguments, G: its globals; guards have already passed\n";
    for (const Step& s : m_steps) {
        std::string lhs = s.out >= 0 ? "v" + std::to_string(s.out) + " = " : "";
        std::string rhs;
        auto a = [&](size_t i) { return render_arg(s.args[i]); };
        switch (s.kind) {
        case StepKind::Call: {
            size_t nkw = s.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(s.kwnames.get())) : 0;
            rhs = a(0) + "(";
            size_t npos = s.args.size() - 1 - nkw;
            for (size_t i = 0; i < npos; ++i) rhs += (i ? ", " : "") + a(i + 1);
            for (size_t k = 0; k < nkw; ++k)
                rhs += std::string(npos + k ? ", " : "") +
                       py::str_of(PyTuple_GET_ITEM(s.kwnames.get(), static_cast<Py_ssize_t>(k))) +
                       "=" + a(1 + npos + k);
            rhs += ")";
            break;
        }
        case StepKind::Binary:
            if (s.op >= NB_INPLACE_ADD && s.op <= NB_INPLACE_XOR) {
                // `v1 = x += y` is not Python: spell the in-place form as operator.iadd & co
                static const char* kIn[] = {"iadd", "iand", "ifloordiv", "ilshift", "imatmul",
                                            "imul", "imod", "ior", "ipow", "irshift", "isub",
                                            "itruediv", "ixor"};
                rhs = std::string("operator.") + kIn[s.op - NB_INPLACE_ADD] + "(" + a(0) + ", " +
                      a(1) + ")";
            } else {
                rhs = a(0) + " " + binary_symbol(s.op) + " " + a(1);
            }
            break;
        case StepKind::Compare: rhs = a(0) + " " + compare_symbol(s.op) + " " + a(1); break;
        case StepKind::Unary: {
            static const char* kOps[] = {"-", "+", "~", "not "};
            rhs = std::string(kOps[s.op & 3]) + a(0);
            break;
        }
        case StepKind::GetItem: rhs = a(0) + "[" + a(1) + "]"; break;
        case StepKind::GetAttr: rhs = a(0) + "." + py::str_of(s.name.get()); break;
        case StepKind::BuildList:
        case StepKind::BuildTuple: {
            bool list = s.kind == StepKind::BuildList;
            rhs = list ? "[" : "(";
            for (size_t i = 0; i < s.args.size(); ++i) rhs += (i ? ", " : "") + a(i);
            if (!list && s.args.size() == 1) rhs += ",";
            rhs += list ? "]" : ")";
            if (s.name) rhs = callable_name(s.name.get()) + "(" + rhs + ")";
            break;
        }
        case StepKind::BuildDict:
            rhs = "{";
            for (size_t i = 0; i + 1 < s.args.size(); i += 2)
                rhs += (i ? ", " : "") + a(i) + ": " + a(i + 1);
            rhs += "}";
            if (s.name) {  // an OrderedDict, or a defaultdict whose factory is set next
                std::string type = callable_name(s.name.get());
                bool factory = type.find("defaultdict") != std::string::npos;
                rhs = type + "(" + (factory ? "None, " : "") + rhs + ")";
            }
            break;
        case StepKind::BuildSlice:
            rhs = "slice(" + a(0) + ", " + a(1) + (s.args.size() > 2 ? ", " + a(2) : "") + ")";
            break;
        case StepKind::SetAttr:
            rhs = a(0) + "." + py::str_of(s.name.get()) + " = " + a(1);
            break;
        case StepKind::SetItem: rhs = a(0) + "[" + a(1) + "] = " + a(2); break;
        case StepKind::CallEx: rhs = a(0) + "(*" + a(1) + ", **" + a(2) + ")"; break;
        case StepKind::Check:
            rhs = "check(" + (s.op == kCheckLength ? "len(" + a(0) + ")"
                              : s.op == kCheckTruth ? "bool(" + a(0) + ")"
                              : s.op == kCheckRank  ? a(0) + ".ndim"
                                                    : a(0)) +
                  " == " + a(1) + ")  # else: capture again";
            break;
        }
        std::string line = "    " + lhs + rhs;
        if (s.line > 0) {
            if (line.size() < 56) line.resize(56, ' ');
            line += "  # line " + std::to_string(s.line);
            if (!filename.empty() && s.loc >= 0 && static_cast<size_t>(s.loc) < m_locations.size() &&
                m_locations[static_cast<size_t>(s.loc)].filename != filename)
                line += " of " + m_locations[static_cast<size_t>(s.loc)].function;
        }
        out += line + "\n";
    }
    out += "    return " + render_arg(m_result) + "\n";
    return out;
}

}  // namespace magpy
