// The eager backend replays the recorded operations through the same Python callables the
// program used. It is the correctness baseline every other backend is tested against.
#include "backends/backend.h"

namespace magpy {

namespace {

class EagerGraph final : public CompiledGraph {
public:
    explicit EagerGraph(std::shared_ptr<const Plan> plan) : m_plan(std::move(plan)) {}

private:
    PyObject* run_impl(PyObject* const* inputs, Declined& declined) const override {
        return m_plan->run(inputs, declined);
    }
    std::shared_ptr<const Plan> m_plan;
};

class EagerBackend final : public Backend {
public:
    EagerBackend() : Backend("eager") {}

private:
    std::unique_ptr<CompiledGraph> compile_impl(std::shared_ptr<const Plan> plan,
                                                std::string&) const override {
        return compile_eager(std::move(plan));
    }
};

}  // namespace

std::unique_ptr<CompiledGraph> compile_eager(std::shared_ptr<const Plan> plan) {
    return std::make_unique<EagerGraph>(std::move(plan));
}

const Backend* eager_backend() {
    static EagerBackend backend;
    return &backend;
}

}  // namespace magpy
