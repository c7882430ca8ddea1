// Backends turn a captured plan's operator graph into something that runs. Public non-virtual
// methods do the bookkeeping and call the private *_impl methods (the xinterpreter shape).
#pragma once

#include "replay/plan.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace magpy {

class CompiledGraph {
public:
    virtual ~CompiledGraph() = default;
    // New reference, or NULL with a Python error, or NULL with no error set when the plan
    // gave up before any visible effect (`declined` says why: Plan::run).
    // PRECONDITION: GIL held.
    PyObject* run(PyObject* const* inputs, Declined& declined) const {
        return run_impl(inputs, declined);
    }
    // What the backend made of the plan, for explain() and the report: one line ("2
    // TorchScript graphs covering 31 of 33 ops ..."), notes from later calls (a graph that fell
    // back to eager for some inputs), and each compiled graph as text.
    std::string summary() const { return summary_impl(); }
    std::vector<std::string> notes() const { return notes_impl(); }
    std::vector<std::string> graph_texts() const { return graph_texts_impl(); }
    // Compiling done lazily inside run() (tracing on a first call), in nanoseconds: counted as
    // compile time, not replay time, in the report.
    int64_t deferred_compile_ns() const { return deferred_compile_ns_impl(); }

private:
    virtual PyObject* run_impl(PyObject* const* inputs, Declined& declined) const = 0;
    virtual std::string summary_impl() const { return ""; }
    virtual std::vector<std::string> notes_impl() const { return {}; }
    virtual std::vector<std::string> graph_texts_impl() const { return {}; }
    virtual int64_t deferred_compile_ns_impl() const { return 0; }
};

class Backend {
public:
    virtual ~Backend() = default;
    const std::string& name() const { return m_name; }
    // Never returns null: a backend that cannot compile a plan returns the eager graph and
    // says why in `note` (shown by explain()).
    std::unique_ptr<CompiledGraph> compile(std::shared_ptr<const Plan> plan, std::string& note) const;

protected:
    explicit Backend(std::string name) : m_name(std::move(name)) {}

private:
    virtual std::unique_ptr<CompiledGraph> compile_impl(std::shared_ptr<const Plan> plan,
                                                        std::string& note) const = 0;
    std::string m_name;
};

// nullptr for an unknown name.
const Backend* find_backend(const std::string& name);
std::vector<std::string> backend_names();
std::unique_ptr<CompiledGraph> compile_eager(std::shared_ptr<const Plan> plan);

// For magpy._fx: what a compiled fx version is specialised on (fx_backend.cpp).
PyObject* fx_signature(PyObject* tensors, bool grad);
PyObject* fx_pins_signature(PyObject* pins, PyObject* expected = nullptr);

}  // namespace magpy
