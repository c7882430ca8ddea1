// What magpy.compile() returns, as C++ state: the target, options and what happened so far.
#pragma once

#include "backends/backend.h"
#include "capture/capture.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace magpy {

struct CompileOptions {
    std::string backend = "eager";
    bool fullgraph = false;
    int dynamic = -1;  // -1 None (automatic), 0 False, 1 True
    size_t cache_limit = 8;
    // Entries made under other options (another backend, fullgraph) are not used: a fullgraph
    // wrapper must not hit an eager entry left by a plain one.
    std::string key() const {
        return backend + (fullgraph ? "/fullgraph" : "") + "/dynamic=" + std::to_string(dynamic);
    }
};

struct CallStats {
    uint64_t calls = 0;
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t resume_hits = 0;  // lookups of resume functions (segments after graph breaks)
    uint64_t resume_misses = 0;
    uint64_t captures = 0;
    uint64_t eager_calls = 0;  // ran without capture (break entries, cache limit)
    int64_t capture_ns = 0;
    int64_t compile_ns = 0;
    int64_t guard_ns = 0;   // checking guards on every call (hits and misses)
    int64_t replay_ns = 0;  // running compiled graphs (plans) on hits
    std::vector<BreakInfo> breaks;  // unique by id and location
    std::vector<std::string> recompile_reasons;
    std::vector<std::string> notes;  // warnings: engine errors, cache limit, backend fallbacks
};

struct CompiledState {
    // Tells this wrapper's cache entries from those of other wrappers of the same code (one
    // per layer compiled on its own: each has its own cache limit and its own explain()).
    uint64_t id = next_id();
    static uint64_t next_id() {  // PRECONDITION: GIL held
        static uint64_t n = 0;
        return ++n;
    }
    py::Ref target;  // the user's function or module (called as given)
    py::Ref code;    // the code object whose frames are captured (null: nothing to capture)
    PyObject* expect_self = nullptr;  // module or bound-method self (owned by target)
    // A forward or method wrapped by a decorator (functools.wraps: `@torch.no_grad()`): the
    // wrapper's frame is captured, recognised by its function (the class keeps it alive), as
    // its code is shared by every function the decorator wraps.
    PyObject* expect_function = nullptr;
    std::string name;
    CompileOptions options;
    std::string options_key;  // options.key(), computed once (compared on every call)
    const Backend* backend = nullptr;
    CallStats stats;
    // Callees compiled on their own ([Note: callees compiled on their own] in frame_hook.cpp):
    // a segment that ends at a call whose callee broke runs that call through its own state,
    // made on first use with these options. Owned; at most kMaxCallees.
    std::vector<std::unique_ptr<CompiledState>> callees;
    static constexpr size_t kMaxCallees = 64;

    void add_break(const BreakInfo& b);
    void add_note(const std::string& note);
};

}  // namespace magpy
