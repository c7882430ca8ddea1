#include "backends/backend.h"

namespace magpy {

std::unique_ptr<CompiledGraph> Backend::compile(std::shared_ptr<const Plan> plan,
                                                std::string& note) const {
    std::unique_ptr<CompiledGraph> g = compile_impl(plan, note);
    if (!g) {
        if (note.empty()) note = "backend '" + m_name + "' could not compile this graph";
        note += "; running it with the eager backend";
        g = compile_eager(std::move(plan));
    }
    return g;
}

const Backend* eager_backend();
const Backend* torchscript_backend(bool freeze);
const Backend* fx_backend(const std::string& name);

const Backend* find_backend(const std::string& name) {
    if (name == "eager") return eager_backend();
    if (name == "torchscript") return torchscript_backend(false);
    if (name == "torchscript-freeze") return torchscript_backend(true);
    return fx_backend(name);
}

std::vector<std::string> backend_names() {
    return {"eager", "torchscript", "torchscript-freeze", "fx", "inductor", "cudagraphs"};
}

}  // namespace magpy
