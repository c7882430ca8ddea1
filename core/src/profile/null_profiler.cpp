// The profiler of a build without CUPTI (MAGPY_HAS_CUPTI undefined): never available, and every
// call is a no-op. See [Note: CUPTI profiler] in core/NOTES.md.
#include "profile/profiler.h"

namespace magpy {
namespace {

class NullProfiler final : public Profiler {
public:
    NullProfiler() : Profiler("null") {}

private:
    bool probe_impl(std::string& status) override {
        status = "CUPTI not built (magpy was configured without CUPTI: no kernel timings)";
        return false;
    }
    bool start_impl(std::string& error) override {
        error = "CUPTI not built";
        return false;
    }
    void stop_impl() override {}
    void flush_impl(ActivityBatch&) override {}
    void begin_graph_impl(uint64_t) override {}
    bool end_graph_impl(uint64_t) override { return true; }
};

}  // namespace

Profiler& profiler() {
    static Profiler* instance = new NullProfiler();  // never destroyed, like the CUPTI one
    return *instance;
}

}  // namespace magpy
