// The fx backends: each region of a plan (backends/regions.h) becomes a torch.fx GraphModule,
// built by magpy._fx from the region's steps on its first run, and run as Python ("fx"), or
// compiled by inductor ("inductor", "cudagraphs"; torch >= 2). A region that cannot be
// built, compiled or run falls back to its recorded steps, with a note. See core/NOTES.md
// [Note: fx backends].
#include "backends/backend.h"
#include "backends/regions.h"
#include "guards/tensor_check.h"
#include "profile/profiler.h"
#include "python/torch_api.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace magpy {

namespace {

// The magpy._fx function `name` (new reference), or null with a Python error.
py::Ref fx_function(const char* name) {
    py::Ref mod = py::Ref::steal(PyImport_ImportModule("magpy._fx"));
    return mod ? py::Ref::steal(PyObject_GetAttrString(mod.get(), name)) : py::Ref();
}

// A step's argument for magpy._fx: (0, input), (1, slot) or (2, constant).
PyObject* arg_tuple(const Arg& a) {
    if (a.kind == Arg::Kind::Const) return Py_BuildValue("(iO)", 2, a.constant.get());
    return Py_BuildValue("(ii)", a.kind == Arg::Kind::Input ? 0 : 1, a.index);
}

// The sub-plan's steps as magpy._fx reads them: (kind, op, out, args, kwnames, name).
py::Ref steps_as_python(const Plan& sub) {
    py::Ref list = py::Ref::steal(PyList_New(0));
    if (!list) return {};
    for (const Step& s : sub.steps()) {
        py::Ref args = py::Ref::steal(PyList_New(0));
        if (!args) return {};
        for (const Arg& a : s.args) {
            py::Ref t = py::Ref::steal(arg_tuple(a));
            if (!t || PyList_Append(args.get(), t.get()) < 0) return {};
        }
        py::Ref step = py::Ref::steal(Py_BuildValue(
            "(iiiOOO)", static_cast<int>(s.kind), s.op, s.out, args.get(),
            s.kwnames ? s.kwnames.get() : Py_None, s.name ? s.name.get() : Py_None));
        if (!step || PyList_Append(list.get(), step.get()) < 0) return {};
    }
    return list;
}

// Non-tensor inputs are constants of a region's graph (modules, functions, numbers): each
// different set gets its own graph, up to kMaxSpecs; further ones run the recorded steps.
constexpr size_t kMaxSpecs = 8;

// The same object, or equal numbers or strings, or lists or tuples of such (made afresh by
// each call: `x[[0, 1]]`). Floats by their bits: a graph made for 0.0 gives +0.0 where -0.0
// would give -0.0 (`x * s`), and NaN is NaN.
bool same_constant(PyObject* a, PyObject* b) {
    if (a == b) return true;
    if (Py_TYPE(a) != Py_TYPE(b)) return false;
    if (PyList_CheckExact(a) || PyTuple_CheckExact(a)) {
        if (Py_SIZE(a) != Py_SIZE(b)) return false;
        bool list = PyList_CheckExact(a);
        for (Py_ssize_t i = 0; i < Py_SIZE(a); ++i)
            if (!same_constant(list ? PyList_GET_ITEM(a, i) : PyTuple_GET_ITEM(a, i),
                               list ? PyList_GET_ITEM(b, i) : PyTuple_GET_ITEM(b, i)))
                return false;
        return true;
    }
    if (PyFloat_CheckExact(a)) {
        double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(b);
        return std::memcmp(&x, &y, sizeof x) == 0;
    }
    if (!PyLong_CheckExact(a) && !PyUnicode_CheckExact(a)) return false;
    int eq = PyObject_RichCompareBool(a, b, Py_EQ);
    if (eq < 0) PyErr_Clear();
    return eq == 1;
}

class FxRegion {
public:
    FxRegion(int number, RegionPlan rp, std::string backend)
        : m_number(number), m_backend(std::move(backend)), m_sub(std::move(rp.sub)),
          m_inputs(rp.inputs), m_graph_ops(rp.graph_ops) {}

    // The tuple of the region's outputs (new reference), or NULL with a Python error.
    PyObject* call(PyObject* const* args) {
        if (m_failed) return run_steps(args);
        Spec* spec = nullptr;
        for (Spec& s : m_specs)
            if (s.matches(args, m_is_tensor)) spec = &s;
        if (!spec) {
            if (m_specs.size() >= kMaxSpecs) {
                note(m_backend + " graph " + std::to_string(m_number) + " runs its recorded steps "
                     "for some inputs: more than " + std::to_string(kMaxSpecs) +
                     " different modules, functions or numbers passed to it");
                return run_steps(args);
            }
            spec = build(args);
            if (!spec) return PyErr_Occurred() ? nullptr : run_steps(args);
        }
        if (spec->warns) return run_steps(args);
        m_argv.clear();
        for (size_t i : spec->tensors) m_argv.push_back(args[i]);
        int64_t t0 = spec->runs == 0 ? now_ns() : 0;  // torch.compile compiles on the first call
        py::Ref warned;
        PyObject* r = spec->runs == 0 && m_backend == "fx"
                          ? first_run(spec->compiled.get(), warned)
                          : PyObject_Vectorcall(spec->compiled.get(), m_argv.data(),
                                                m_argv.size(), nullptr);
        if (spec->runs == 0) m_compile_ns += now_ns() - t0;
        if (r && PyTuple_Check(r)) {
            ++spec->runs;
            if (warned && PyList_GET_SIZE(warned.get()) > 0) return warned_run(*spec, r, warned, args);
            return r;
        }
        if (!r && !PyErr_ExceptionMatches(PyExc_Exception))
            return nullptr;  // an interrupt (KeyboardInterrupt), not the graph's failure
        // A graph that changes tensors in place (through views of its inputs) may have changed
        // them before it failed: running the steps again would change them twice (a review
        // probe), so its error stands. A plain fx graph runs Python's own ops, so it is the
        // error the steps raise; a compiling backend's first call may fail compiling, before
        // anything ran: then the steps run.
        if (!r && changes_in_place(args) && (m_backend == "fx" || spec->runs > 0)) {
            if (warned && PyList_GET_SIZE(warned.get()) > 0) {  // given before it, as in eager
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                if (!give_recorded(warned)) PyErr_Clear();
                PyErr_Restore(type, value, tb);
            }
            return nullptr;
        }
        std::string why = r ? "it returned no tuple" : py::fetch_error_string();
        Py_XDECREF(r);
        // The steps again: if they raise too, the error is the program's, and the graph stays.
        PyObject* eager = run_steps(args);
        if (!eager) return nullptr;
        m_specs.clear();
        m_failed = true;
        note(m_backend + " graph " + std::to_string(m_number) + " failed to run (" + why +
             "); it runs its recorded steps from now on");
        return eager;
    }

    int number() const { return m_number; }
    size_t graph_ops() const { return m_graph_ops; }
    size_t compiled() const { return m_specs.size(); }
    uint64_t runs() const {
        uint64_t n = 0;
        for (const Spec& s : m_specs) n += s.runs;
        return n;
    }
    uint64_t eager_runs() const { return m_eager_runs; }
    int64_t compile_ns() const { return m_compile_ns; }
    std::string text() const { return m_specs.empty() ? "" : m_specs.front().text; }
    const std::vector<std::string>& notes() const { return m_notes; }

private:
    struct Spec {
        std::vector<py::Ref> constants;  // the non-tensor inputs it was built for
        std::vector<size_t> tensors;  // its arguments: the positions of the inputs that are
                                      // tensors, or lists and tuples of tensors
        py::Ref compiled;
        std::string text;
        uint64_t runs = 0;
        bool warns = false;  // its ops give warnings: the steps run ([Note: warnings from an fx graph])
        bool matches(PyObject* const* args, const std::vector<bool>& is_tensor) const {
            for (size_t i = 0, k = 0; i < is_tensor.size(); ++i) {
                if (is_tensor[i]) continue;
                if (!same_constant(args[i], constants[k++].get())) return false;
            }
            return true;
        }
    };

    void note(std::string n) {
        if (m_notes.size() < 8 && std::find(m_notes.begin(), m_notes.end(), n) == m_notes.end())
            m_notes.push_back(std::move(n));
    }

    Spec* build(PyObject* const* args) {
        int64_t t0 = now_ns();
        py::Ref compile = fx_function("compile_region");
        py::Ref steps = compile ? steps_as_python(m_sub) : py::Ref();
        py::Ref sample = py::Ref::steal(PyTuple_New(static_cast<Py_ssize_t>(m_inputs)));
        for (size_t i = 0; sample && i < m_inputs; ++i)
            PyTuple_SET_ITEM(sample.get(), static_cast<Py_ssize_t>(i), Py_NewRef(args[i]));
        py::Ref r = steps && sample ? py::Ref::steal(PyObject_CallFunction(
                                          compile.get(), "OOs", steps.get(), sample.get(),
                                          m_backend.c_str()))
                                    : py::Ref();
        m_compile_ns += now_ns() - t0;
        if (!r && PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception))
            return nullptr;  // as in call()
        Spec spec;
        if (r && PyTuple_Check(r.get()) && PyTuple_GET_SIZE(r.get()) == 3 &&
            PyUnicode_Check(PyTuple_GET_ITEM(r.get(), 1)) &&
            PyList_Check(PyTuple_GET_ITEM(r.get(), 2))) {
            spec.compiled = py::Ref::borrow(PyTuple_GET_ITEM(r.get(), 0));
            spec.text = PyUnicode_AsUTF8(PyTuple_GET_ITEM(r.get(), 1));
            PyObject* tensors = PyTuple_GET_ITEM(r.get(), 2);
            std::vector<bool> is_tensor(m_inputs, false);
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(tensors); ++k) {
                size_t i = PyLong_AsSize_t(PyList_GET_ITEM(tensors, k));
                if (PyErr_Occurred() || i >= m_inputs) return fail("bad tensor positions");
                spec.tensors.push_back(i);
                is_tensor[i] = true;
            }
            if (!m_specs.empty() && is_tensor != m_is_tensor)
                return fail("its inputs changed kind");  // a guard keeps them: an engine bug
            m_is_tensor = is_tensor;
            for (size_t i = 0; i < m_inputs; ++i)
                if (!is_tensor[i]) spec.constants.push_back(py::Ref::borrow(args[i]));
            m_specs.push_back(std::move(spec));
            return &m_specs.back();
        }
        return fail(r ? "an unexpected result" : py::fetch_error_string());
    }

    // [Note: warnings from an fx graph] The ops of a plain fx graph run from its generated
    // code, so a warning an op gives (`torch.tensor(t)`'s advice to clone) names that code, not
    // the user's line, and a filter on the user's file never sees it. The first run of each
    // version records the warnings its ops give (`call_recording_warnings`, shown to no one).
    // A version whose ops warn runs the region's steps from then on, where each warning names
    // its line under the user's filters: at once, instead of the graph's outputs, when the
    // steps can run again (nothing in place, no draws); else the recorded warnings are given at
    // the lines of the steps whose nodes gave them (the generated code's line tells the node).
    // A warning the user's filters make an error is raised where it is given, so the graph
    // stops at that op as eager would; if the graph raises after changing something in place
    // (its error stands), the warnings given before the error are given first.
    // (inductor's compiled code calls few ops that warn: not done.)
    PyObject* first_run(PyObject* compiled, py::Ref& warned) {
        py::Ref rec = fx_function("call_recording_warnings");
        py::Ref argv = py::Ref::steal(PyTuple_New(static_cast<Py_ssize_t>(m_argv.size())));
        for (size_t i = 0; argv && i < m_argv.size(); ++i)
            PyTuple_SET_ITEM(argv.get(), static_cast<Py_ssize_t>(i), Py_NewRef(m_argv[i]));
        if (!rec || !argv) return nullptr;
        py::Ref pair = py::Ref::steal(PyObject_CallFunctionObjArgs(rec.get(), compiled, argv.get(),
                                                                   nullptr));
        if (!pair) {  // the warnings given before the error, when it has them
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            py::Ref before = py::Ref::steal(value ? PyObject_GetAttrString(value, "_magpy_warned")
                                                  : nullptr);
            if (before && PyList_Check(before.get())) warned = before;
            PyErr_Clear();
            PyErr_Restore(type, value, tb);
            return nullptr;
        }
        if (!PyTuple_Check(pair.get()) || PyTuple_GET_SIZE(pair.get()) != 2 ||
            !PyList_Check(PyTuple_GET_ITEM(pair.get(), 1))) {
            PyErr_SetString(PyExc_RuntimeError, "magpy: call_recording_warnings gave no pair");
            return nullptr;
        }
        warned = py::Ref::borrow(PyTuple_GET_ITEM(pair.get(), 1));
        return Py_NewRef(PyTuple_GET_ITEM(pair.get(), 0));
    }

    PyObject* warned_run(Spec& spec, PyObject* r, const py::Ref& warned, PyObject* const* args) {
        spec.warns = true;
        note(m_backend + " graph " + std::to_string(m_number) + " runs its recorded steps for "
             "some inputs: an op in it gives a warning, which then names its line");
        if (!changes_in_place(args)) {
            Py_DECREF(r);
            return run_steps(args);
        }
        if (!give_recorded(warned)) {
            Py_DECREF(r);  // an "error" filter made it an exception
            return nullptr;
        }
        return r;
    }

    // Gives the recorded warnings (category, message, step) at the lines of the steps whose
    // nodes gave them; false if one became an exception.
    bool give_recorded(const py::Ref& warned) {
        const std::vector<Step>& steps = m_sub.steps();
        const Step* first = nullptr;
        for (const Step& st : steps)
            if (!first && st.site >= 0) first = &st;
        SiteLink site(PyThreadState_Get(), m_sub.sites());
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(warned.get()); ++i) {
            PyObject* w = PyList_GET_ITEM(warned.get(), i);  // (category, message, step)
            long k = PyLong_AsLong(PyTuple_GET_ITEM(w, 2));  // the step whose node gave it
            if (k < 0 && PyErr_Occurred()) PyErr_Clear();
            const Step* at = k >= 0 && static_cast<size_t>(k) < steps.size() &&
                                     steps[static_cast<size_t>(k)].site >= 0
                                 ? &steps[static_cast<size_t>(k)]
                                 : first;
            if (at) site.at(*at);
            py::Ref text = py::Ref::steal(PyObject_Str(PyTuple_GET_ITEM(w, 1)));
            if (!text || PyErr_WarnEx(PyTuple_GET_ITEM(w, 0), PyUnicode_AsUTF8(text.get()), 1) < 0)
                return false;
        }
        return true;
    }

    // Whether running the graph may have changed what the caller sees, so that its steps must
    // not run again after it: a step with an effect, or a call of a module with an `inplace`
    // flag (ReLU, LeakyReLU, Dropout...), which may have been set since the capture (a review
    // probe: `act.inplace = True`, then a warning on the first run applied it twice).
    bool changes_in_place(PyObject* const* args) const {
        for (const Step& st : m_sub.steps()) {
            if (st.effect) return true;
            if (st.kind != StepKind::Call || st.args.empty()) continue;
            const Arg& a = st.args[0];
            PyObject* fn = a.kind == Arg::Kind::Const   ? a.constant.get()
                           : a.kind == Arg::Kind::Input ? args[a.index]
                                                        : nullptr;
            PyObject** dict = fn ? _PyObject_GetDictPtr(fn) : nullptr;
            if (dict && *dict && PyDict_Check(*dict) &&
                PyDict_GetItemString(*dict, "inplace"))  // (borrowed; no error raised)
                return true;
        }
        return false;
    }

    Spec* fail(const std::string& why) {
        m_failed = true;
        m_specs.clear();
        note(m_backend + " could not build graph " + std::to_string(m_number) + " (" + why +
             "); it runs its recorded steps");
        return nullptr;
    }

    PyObject* run_steps(PyObject* const* args) {
        ++m_eager_runs;
        Declined d = Declined::No;
        PyObject* r = m_sub.run(args, d);
        if (!r && !PyErr_Occurred()) raise_region_declined();
        return r;
    }

    int m_number;
    std::string m_backend;
    Plan m_sub;
    size_t m_inputs;
    size_t m_graph_ops;
    std::vector<Spec> m_specs;  // a std::vector: pointers into it live only within call()
    std::vector<bool> m_is_tensor;
    std::vector<PyObject*> m_argv;
    bool m_failed = false;
    std::vector<std::string> m_notes;
    uint64_t m_eager_runs = 0;
    int64_t m_compile_ns = 0;  // building, and each graph's first run
};

PyObject* fx_region_call(PyObject* capsule, PyObject* const* args, Py_ssize_t) {
    auto* r = static_cast<FxRegion*>(PyCapsule_GetPointer(capsule, "magpy.fx_region"));
    return r ? r->call(args) : nullptr;
}

PyMethodDef g_fx_region_def = {
    "fx_graph", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fx_region_call)),
    METH_FASTCALL, "A stretch of the replay plan as a torch.fx graph (fx, inductor, cudagraphs)."};

class FxGraph final : public CompiledGraph {
public:
    FxGraph(std::shared_ptr<const Plan> plan, std::string backend, size_t ops,
            std::vector<FxRegion*> regions, std::vector<py::Ref> owners)
        : m_plan(std::move(plan)), m_backend(std::move(backend)), m_ops(ops),
          m_regions(std::move(regions)), m_owners(std::move(owners)) {}

private:
    PyObject* run_impl(PyObject* const* inputs, Declined& declined) const override {
        return m_plan->run(inputs, declined);
    }
    std::vector<std::string> notes_impl() const override {
        std::vector<std::string> out;
        for (const FxRegion* r : m_regions) out.insert(out.end(), r->notes().begin(), r->notes().end());
        return out;
    }
    std::string summary_impl() const override {
        size_t ops = 0;
        for (const FxRegion* r : m_regions) ops += r->graph_ops();
        std::string s = std::to_string(m_regions.size()) + " " + m_backend + " graph" +
                        (m_regions.size() == 1 ? "" : "s") + " covering " + std::to_string(ops) +
                        " of " + std::to_string(m_ops) + " ops";
        for (const FxRegion* r : m_regions)
            s += "; graph " + std::to_string(r->number()) + ": " + std::to_string(r->graph_ops()) +
                 " ops, " + std::to_string(r->compiled()) + " built, " + std::to_string(r->runs()) +
                 " graph runs, " + std::to_string(r->eager_runs()) + " eager runs";
        return s;
    }
    int64_t deferred_compile_ns_impl() const override {
        int64_t ns = 0;
        for (const FxRegion* r : m_regions) ns += r->compile_ns();
        return ns;
    }
    std::vector<std::string> graph_texts_impl() const override {
        std::vector<std::string> out;
        for (const FxRegion* r : m_regions) out.push_back(r->text());
        return out;
    }

    std::shared_ptr<const Plan> m_plan;
    std::string m_backend;
    size_t m_ops;
    std::vector<FxRegion*> m_regions;  // owned by the capsules in m_owners (and the plan's steps)
    std::vector<py::Ref> m_owners;
};

class FxBackend final : public Backend {
public:
    explicit FxBackend(std::string name) : Backend(std::move(name)) {}

private:
    std::unique_ptr<CompiledGraph> compile_impl(std::shared_ptr<const Plan> plan,
                                                std::string& note) const override {
        py::Ref unavailable = fx_function("unavailable");
        py::Ref why = unavailable ? py::Ref::steal(PyObject_CallFunction(
                                        unavailable.get(), "s", name().c_str()))
                                  : py::Ref();
        if (!why) {
            note = name() + ": " + py::fetch_error_string();
            return nullptr;
        }
        if (why.get() != Py_None) {
            note = PyUnicode_Check(why.get()) ? PyUnicode_AsUTF8(why.get()) : name() + " is unavailable";
            return nullptr;
        }
        std::vector<Span> spans = find_regions(*plan);
        if (spans.empty()) {
            note = name() + ": no stretch of " + std::to_string(kMinGraphOps) +
                   " or more tensor ops without writes in between; the plan runs as recorded";
            return compile_eager(std::move(plan));
        }
        std::vector<FxRegion*> regions;
        std::vector<py::Ref> owners;
        auto make = [&](RegionPlan rp) -> py::Ref {
            auto* region = new FxRegion(static_cast<int>(regions.size()), std::move(rp), name());
            py::Ref fn = region_callable(region, "magpy.fx_region", &g_fx_region_def, owners);
            if (fn) regions.push_back(region);
            return fn;
        };
        std::shared_ptr<Plan> rewritten = rewrite_regions(*plan, spans, make);
        if (!rewritten) {
            note = name() + ": " + py::fetch_error_string();
            return nullptr;
        }
        size_t ops = plan->graph_op_count();
        return std::make_unique<FxGraph>(std::move(rewritten), name(), ops, std::move(regions),
                                         std::move(owners));
    }
};

}  // namespace

const Backend* fx_backend(const std::string& name) {
    static FxBackend fx("fx"), inductor("inductor"), cudagraphs("cudagraphs");
    if (name == "fx") return &fx;
    if (name == "inductor") return &inductor;
    if (name == "cudagraphs") return &cudagraphs;
    return nullptr;
}

namespace {

// Appends what a compiled fx version is specialised on to `out`: per tensor its dtype, device,
// layout, requires_grad, sizes, strides and storage offset, and the position of the first
// earlier tensor sharing its memory. Read in C++ (the same reads as the guards' tensor
// checks): a few hundred nanoseconds for a region's inputs, where Python attribute reads took
// microseconds. With `addresses`, each one's storage address instead of the position (equal
// addresses say the same). False with a TypeError when an item is no tensor.
// Where a signature goes: appended to `out`, or, without one, compared with `expected` as it
// is made (stopping at the first difference: no allocation, for the per-call check).
struct Sink {
    std::string* out = nullptr;
    const char* expected = nullptr;
    size_t expected_size = 0, at = 0;
    bool same = true;
    void put(int64_t v) {
        if (out) {
            out->append(reinterpret_cast<const char*>(&v), sizeof v);
        } else if (same) {
            same = at + sizeof v <= expected_size && std::memcmp(expected + at, &v, sizeof v) == 0;
            at += sizeof v;
        }
    }
    bool matched() const { return same && at == expected_size; }
};

bool append_signature(PyObject* const* items, Py_ssize_t n, Sink& sink, bool addresses = false) {
    auto put = [&](int64_t v) { sink.put(v); };
    if (sink.out)
        sink.out->reserve(sink.out->size() + static_cast<size_t>(n) * 16 * sizeof(int64_t));
    std::vector<const void*> storages;
    TensorKey key;
    for (Py_ssize_t i = 0; i < n && sink.same; ++i) {
        PyObject* t = items[i];
        if (!PyObject_TypeCheck(t, torch_api().tensor_type)) {
            PyErr_Format(PyExc_TypeError, "fx_signature: item %zd is a %s, not a tensor", i,
                         Py_TYPE(t)->tp_name);
            return false;
        }
        if (tensor_is_nested(t)) {
            put(-2);
            continue;
        }
        tensor_key_of(t, key, true);
        for (int64_t v : {int64_t{key.dtype}, int64_t{key.device_type}, int64_t{key.device_index},
                          int64_t{key.layout}, int64_t{key.requires_grad},
                          int64_t{key.inference} * 2 + int64_t{key.named},
                          static_cast<int64_t>(key.sizes.size())})
            put(v);
        for (int64_t d : key.sizes) put(d);
        for (int64_t d : key.strides) put(d);
        put(key.storage_offset);
        const void* mem = tensor_storage(t);
        if (addresses) {  // equal addresses say which share memory: no search (the modules'
                          // hundreds of parameters and buffers made it quadratic)
            put(static_cast<int64_t>(reinterpret_cast<intptr_t>(mem)));
            continue;
        }
        auto same = mem ? std::find(storages.begin(), storages.end(), mem) : storages.end();
        put(same == storages.end() ? -1 : same - storages.begin());
        storages.push_back(mem);
    }
    return true;
}

PyObject* as_bytes(const std::string& s) {
    return PyBytes_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
}

}  // namespace

// Grad mode, then the signature of `tensors` (a list): the key of a compiled fx version.
PyObject* fx_signature(PyObject* tensors, bool grad) {
    py::Ref seq = py::Ref::steal(PySequence_Fast(tensors, "fx_signature: a list of tensors"));
    if (!seq) return nullptr;
    std::string out;
    if (grad) out.push_back(grad_mode_enabled() ? '\1' : '\0');
    Sink sink;
    sink.out = &out;
    if (!append_signature(PySequence_Fast_ITEMS(seq.get()), PySequence_Fast_GET_SIZE(seq.get()),
                          sink))
        return nullptr;
    return as_bytes(out);
}

// The signature of the tensors `pins` names ((dict, key, tensor or None) triples: a module's
// parameters and buffers as a compiled version holds them) and of how many entries each dict
// has (a parameter registered since), or None when a dict no longer holds that very object
// under that key. Their storage addresses are part of it: a CUDA graph reads a parameter where
// it was (`p.data = other` moves it; magpy._fx.compile_with_static_parameters).
// With `expected` (an earlier signature, bytes), whether it is still the same, as a bool.
PyObject* fx_pins_signature(PyObject* pins, PyObject* expected) {
    py::Ref seq = py::Ref::steal(PySequence_Fast(pins, "fx_pins_signature: a list of pins"));
    if (!seq) return nullptr;
    if (expected && !PyBytes_Check(expected)) {
        PyErr_SetString(PyExc_TypeError, "fx_pins_signature: expected is a signature (bytes)");
        return nullptr;
    }
    std::vector<PyObject*> tensors;
    std::string out;
    Sink sink;
    if (expected) {
        sink.expected = PyBytes_AS_STRING(expected);
        sink.expected_size = static_cast<size_t>(PyBytes_GET_SIZE(expected));
    } else {
        sink.out = &out;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq.get()); ++i) {
        PyObject* pin = PySequence_Fast_GET_ITEM(seq.get(), i);
        if (!PyTuple_Check(pin) || PyTuple_GET_SIZE(pin) != 3 ||
            !PyDict_Check(PyTuple_GET_ITEM(pin, 0))) {
            PyErr_SetString(PyExc_TypeError, "fx_pins_signature: pins are (dict, key, tensor)");
            return nullptr;
        }
        PyObject* dict = PyTuple_GET_ITEM(pin, 0);
        PyObject* now = PyDict_GetItemWithError(dict, PyTuple_GET_ITEM(pin, 1));
        if (!now && PyErr_Occurred()) return nullptr;
        if (now != PyTuple_GET_ITEM(pin, 2)) {
            if (expected) Py_RETURN_FALSE;
            Py_RETURN_NONE;
        }
        sink.put(static_cast<int64_t>(PyDict_GET_SIZE(dict)));
        if (now != Py_None) tensors.push_back(now);  // borrowed: the dicts hold them meanwhile
    }
    if (!append_signature(tensors.data(), static_cast<Py_ssize_t>(tensors.size()), sink, true))
        return nullptr;
    if (expected) return Py_NewRef(sink.matched() ? Py_True : Py_False);
    return as_bytes(out);
}

}  // namespace magpy
