// The CUPTI profiler on a real GPU, with no Python: kernels on two streams, copies and a memset,
// some inside begin_graph/end_graph (nested too), must come back from flush() with their kinds,
// bytes, device times and the graph that was innermost at their launch.
//
//   nvcc -std=c++17 -O1 -I core/src -DMAGPY_HAS_CUPTI tests/gpu/cupti_check.cu \
//        core/src/profile/profiler.cpp core/src/profile/cupti_profiler.cpp -lcupti -ldl
//
// (tests/gpu/run.sh builds and runs it.) Exit 0: every check passed; 77: no GPU here (the
// profiler's status line says why); 1: a check failed (each failure is printed).
#include "profile/profiler.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

using magpy::ActivityKind;
using magpy::KernelRecord;

namespace {

int g_failures = 0;

#define CHECK(cond, ...)                                          \
    do {                                                          \
        if (!(cond)) {                                            \
            ++g_failures;                                         \
            std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            std::printf(__VA_ARGS__);                             \
            std::printf("\n");                                    \
        }                                                         \
    } while (0)

#define CUDA(call)                                                                   \
    do {                                                                             \
        cudaError_t e_ = (call);                                                     \
        if (e_ != cudaSuccess) {                                                     \
            std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, \
                        __LINE__, #call);                                            \
            return 1;                                                                \
        }                                                                            \
    } while (0)

__global__ void scale_kernel(float* x, int n, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a + 1.0f;
}

// Runs long enough (a few ms) that two of them on two streams overlap.
__global__ void spin_kernel(float* x, int n, int rounds) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    for (int r = 0; r < rounds; ++r) v = v * 0.999f + 0.5f;
    x[i] = v;
}

// The device records (kernels, copies, memsets) whose name contains `part`.
std::vector<const KernelRecord*> device_named(const std::vector<KernelRecord>& rs,
                                              const char* part) {
    std::vector<const KernelRecord*> out;
    for (const KernelRecord& r : rs)
        if (r.kind != ActivityKind::Runtime && r.name.find(part) != std::string::npos)
            out.push_back(&r);
    return out;
}

}  // namespace

int main() {
    magpy::Profiler& p = magpy::profiler();
    std::printf("profiler: %s, status: %s\n", p.name().c_str(), p.status().c_str());
    if (!p.available()) {
        std::printf("SKIP: no GPU for the CUPTI profiler here\n");
        return 77;
    }

    const int n = 1 << 20;
    const size_t bytes = n * sizeof(float);
    std::vector<float> host(n, 1.0f);
    float *a = nullptr, *b = nullptr;
    CUDA(cudaMalloc(&a, bytes));
    CUDA(cudaMalloc(&b, bytes));
    cudaStream_t s1, s2;
    CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    // Warm up outside the profiled region (module load, context).
    scale_kernel<<<(n + 255) / 256, 256>>>(a, n, 1.0f);
    CUDA(cudaDeviceSynchronize());

    p.start();
    CHECK(p.running(), "start() did not start: %s", p.error().c_str());

    // Outside any graph: one copy in.
    CUDA(cudaMemcpy(a, host.data(), bytes, cudaMemcpyHostToDevice));
    // Graph 11: a kernel and a memset.
    p.begin_graph(11);
    scale_kernel<<<(n + 255) / 256, 256>>>(a, n, 2.0f);
    CUDA(cudaGetLastError());
    CUDA(cudaMemset(b, 0, bytes));
    // Graph 12 nested in 11: two spinning kernels on two streams (they may overlap).
    p.begin_graph(12);
    spin_kernel<<<(n + 255) / 256, 256, 0, s1>>>(a, n, 2000);
    spin_kernel<<<(n + 255) / 256, 256, 0, s2>>>(b, n, 2000);
    CUDA(cudaGetLastError());
    p.end_graph(12);
    // Back in graph 11: a device-to-device copy.
    CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s1));
    p.end_graph(11);
    // Outside again: the copy out.
    CUDA(cudaMemcpy(host.data(), b, bytes, cudaMemcpyDeviceToHost));
    CUDA(cudaDeviceSynchronize());
    p.stop();
    std::vector<KernelRecord> rs = p.flush();

    std::map<std::string, int> kinds;
    for (const KernelRecord& r : rs) ++kinds[magpy::activity_kind_name(r.kind)];
    std::printf("records: %zu (", rs.size());
    for (auto& [k, c] : kinds) std::printf(" %s=%d", k.c_str(), c);
    std::printf(" ), dropped %llu, unbalanced ends %llu\n",
                static_cast<unsigned long long>(p.dropped()),
                static_cast<unsigned long long>(p.unbalanced_ends()));
    for (const KernelRecord& r : rs)
        if (r.kind != ActivityKind::Runtime)
            std::printf("  %-8s graph %llu  stream %u  %8.3f us  %llu B  %s\n",
                        magpy::activity_kind_name(r.kind),
                        static_cast<unsigned long long>(r.graph_id), r.stream,
                        (r.end_ns - r.start_ns) / 1e3, static_cast<unsigned long long>(r.bytes),
                        r.name.substr(0, 60).c_str());

    auto scale = device_named(rs, "scale_kernel");
    CHECK(scale.size() == 1, "scale_kernel records: %zu (the warm-up ran before start)",
          scale.size());
    if (scale.size() == 1) CHECK(scale[0]->graph_id == 11, "scale_kernel in graph %llu",
                                 static_cast<unsigned long long>(scale[0]->graph_id));
    auto spins = device_named(rs, "spin_kernel");
    CHECK(spins.size() == 2, "spin_kernel records: %zu", spins.size());
    for (const KernelRecord* r : spins)
        CHECK(r->graph_id == 12, "spin_kernel in graph %llu (innermost is 12)",
              static_cast<unsigned long long>(r->graph_id));
    if (spins.size() == 2)
        CHECK(spins[0]->stream != spins[1]->stream, "both spins on stream %u", spins[0]->stream);
    auto check_copy = [&](const char* name, uint64_t graph) {
        auto cs = device_named(rs, name);
        CHECK(cs.size() == 1, "%s records: %zu", name, cs.size());
        if (cs.size() != 1) return;
        CHECK(cs[0]->kind == ActivityKind::Memcpy, "%s kind %s", name,
              magpy::activity_kind_name(cs[0]->kind));
        CHECK(cs[0]->bytes == bytes, "%s bytes %llu", name,
              static_cast<unsigned long long>(cs[0]->bytes));
        CHECK(cs[0]->graph_id == graph, "%s in graph %llu, expected %llu", name,
              static_cast<unsigned long long>(cs[0]->graph_id),
              static_cast<unsigned long long>(graph));
    };
    check_copy("memcpy HtoD", 0);
    check_copy("memcpy DtoD", 11);
    check_copy("memcpy DtoH", 0);
    auto sets = device_named(rs, "memset");
    CHECK(sets.size() == 1, "memset records: %zu", sets.size());
    if (sets.size() == 1) {
        CHECK(sets[0]->kind == ActivityKind::Memset && sets[0]->bytes == bytes,
              "memset bytes %llu", static_cast<unsigned long long>(sets[0]->bytes));
        CHECK(sets[0]->graph_id == 11, "memset in graph %llu",
              static_cast<unsigned long long>(sets[0]->graph_id));
    }
    // Device times are on the engine's clock (steady_clock), inside the profiled region, and in
    // launch order on one stream.
    int64_t lo = INT64_MAX, hi = 0;
    for (const KernelRecord& r : rs) {
        if (r.kind == ActivityKind::Runtime) continue;
        CHECK(r.start_ns > 0 && r.end_ns >= r.start_ns, "%s times %lld..%lld", r.name.c_str(),
              static_cast<long long>(r.start_ns), static_cast<long long>(r.end_ns));
        lo = std::min(lo, r.start_ns);
        hi = std::max(hi, r.end_ns);
    }
    CHECK(hi - lo < 10'000'000'000LL, "device work spans %lld ns", static_cast<long long>(hi - lo));
    if (scale.size() == 1 && spins.size() == 2)
        CHECK(scale[0]->end_ns <= spins[0]->start_ns + 1000 ||
                  scale[0]->end_ns <= spins[1]->start_ns + 1000,
              "scale_kernel ended after both spins started");
    // Every device record has a launching API record with its correlation id.
    for (const KernelRecord& r : rs) {
        if (r.kind == ActivityKind::Runtime) continue;
        bool launched = false;
        for (const KernelRecord& api : rs)
            launched |= api.kind == ActivityKind::Runtime && api.correlation_id == r.correlation_id;
        CHECK(launched, "no API record for %s (correlation %u)", r.name.c_str(), r.correlation_id);
    }
    CHECK(p.unbalanced_ends() == 0, "unbalanced ends %llu",
          static_cast<unsigned long long>(p.unbalanced_ends()));
    CHECK(p.dropped() == 0, "dropped %llu", static_cast<unsigned long long>(p.dropped()));

    // A second session: records from the first are not repeated; nothing after stop() is kept.
    p.start();
    p.begin_graph(21);
    scale_kernel<<<(n + 255) / 256, 256>>>(a, n, 0.5f);
    p.end_graph(21);
    CUDA(cudaDeviceSynchronize());
    p.stop();
    scale_kernel<<<(n + 255) / 256, 256>>>(a, n, 0.5f);  // not recorded
    CUDA(cudaDeviceSynchronize());
    std::vector<KernelRecord> second = p.flush();
    auto again = device_named(second, "scale_kernel");
    CHECK(again.size() == 1, "second session scale_kernel records: %zu", again.size());
    if (again.size() == 1) CHECK(again[0]->graph_id == 21, "second session graph %llu",
                                 static_cast<unsigned long long>(again[0]->graph_id));
    CHECK(device_named(second, "spin_kernel").empty(), "first session's records came again");

    cudaFree(a);
    cudaFree(b);
    std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "PASSED", g_failures);
    return g_failures ? 1 : 0;
}
