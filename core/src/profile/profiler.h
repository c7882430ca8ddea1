// Kernel timing on the GPU: what ran on the device while a compiled graph ran, attributed to that
// graph. One small interface so that the engine never includes a CUPTI header; the CUPTI
// implementation (cupti_profiler.cpp) is compiled only where CUPTI was found, and says once, in
// status(), why it cannot record anything (no GPU, no driver). See [Note: CUPTI profiler] in
// core/NOTES.md.
//
// Public non-virtual methods do the bookkeeping and call the private *_impl methods (the shape
// of backends/backend.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace magpy {

enum class ActivityKind : uint8_t {
    Kernel,   // a kernel on the device
    Memcpy,   // a copy issued by the device's copy engines
    Memset,   // a memset on the device
    Runtime,  // a host-side CUDA API call (runtime, or a driver launch such as cuLaunchKernel)
};
// "kernel", "memcpy", "memset", "runtime".
const char* activity_kind_name(ActivityKind kind);

// The engine's clock: nanoseconds on std::chrono::steady_clock (phase timings, kernel records).
inline int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// A cheaper clock for the phases of a cache hit, which a tiny function pays on every call:
// the CPU's time-stamp counter where there is one (invariant on current x86-64: the clock
// source Linux itself uses), read in a few cycles where steady_clock takes ~25 ns. Durations
// in ticks become nanoseconds through ticks_to_ns(), whose rate is measured against now_ns()
// over the time since the first reading (exact enough after the first milliseconds).
inline uint64_t now_ticks() {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_ia32_rdtsc();
#else
    return static_cast<uint64_t>(now_ns());
#endif
}

// The rate is measured from when the library was loaded (callers hold the GIL).
struct TickRate {
    uint64_t t0 = now_ticks();
    int64_t n0 = now_ns();
    double ns_per_tick = 0;  // 0 until measured over 50 ms or more
};
inline TickRate g_tick_rate;

inline int64_t ticks_to_ns(uint64_t ticks) {
#if defined(__x86_64__) || defined(__i386__)
    TickRate& rate = g_tick_rate;
    double r = rate.ns_per_tick;
    if (r == 0) {
        int64_t n = now_ns();
        uint64_t t = now_ticks();
        if (t <= rate.t0 || n <= rate.n0) return 0;
        r = static_cast<double>(n - rate.n0) / static_cast<double>(t - rate.t0);
        if (n - rate.n0 >= 50'000'000) rate.ns_per_tick = r;
    }
    return static_cast<int64_t>(static_cast<double>(ticks) * r);
#else
    return static_cast<int64_t>(ticks);
#endif
}

// Times are nanoseconds on the engine's clock (now_ns).
struct KernelRecord {
    std::string name;  // kernel name as compiled (mangled), "memcpy HtoD", "memset", API name
    ActivityKind kind = ActivityKind::Kernel;
    int64_t start_ns = 0;
    int64_t end_ns = 0;
    uint64_t graph_id = 0;        // innermost begin_graph() open at the launch; 0: none
    uint32_t correlation_id = 0;  // an API call and the device work it launched share it
    uint32_t device = 0;
    uint32_t stream = 0;  // 0 for Runtime records
    uint64_t bytes = 0;   // Memcpy and Memset only
};

// What an implementation hands to the attribution step on flush: records whose graph_id is not
// set yet, and links from a correlation id to the graph that was innermost when that API call
// ran (CUPTI's external correlation records, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0).
struct ActivityBatch {
    std::vector<KernelRecord> records;
    std::vector<std::pair<uint32_t, uint64_t>> links;  // correlation_id -> graph_id
    uint64_t dropped = 0;  // records the implementation lost since the last flush
};

// Correlation id -> graph id, kept across flushes: a kernel can complete (and be flushed) after
// the flush that delivered its launch's link. Oldest links are forgotten beyond `capacity`.
// Not thread-safe; Profiler guards it.
class CorrelationMap {
public:
    static constexpr size_t kDefaultCapacity = 1 << 16;
    explicit CorrelationMap(size_t capacity = kDefaultCapacity) : m_capacity(capacity) {}
    // Adds the batch's links, then sets graph_id on every record that has one.
    void attribute(ActivityBatch& batch);
    size_t size() const { return m_graph_of.size(); }
    void clear();

private:
    void add(uint32_t correlation_id, uint64_t graph_id);
    size_t m_capacity;
    std::unordered_map<uint32_t, uint64_t> m_graph_of;
    std::deque<uint32_t> m_order;  // insertion order, for forgetting the oldest
};

class Profiler {
public:
    virtual ~Profiler() = default;
    Profiler(const Profiler&) = delete;
    Profiler& operator=(const Profiler&) = delete;

    // "cupti", "null" or "fake".
    const std::string& name() const { return m_name; }
    // Whether records can be collected here. The first call of available(), status() or
    // start() probes once (std::call_once): the CUPTI version, then the driver and a GPU.
    bool available();
    // One line, fixed after the probe: "CUPTI 13.0: 1 GPU", "CUPTI 13.0: no GPU (libcuda.so.1
    // not found: ...)", "CUPTI not built". Where the profiler is unavailable, every other call is
    // a cheap no-op and nothing else is ever reported.
    const std::string& status();
    // The last failure of start() (for example a CUPTI error enabling an activity kind), or "".
    std::string error() const;
    bool running() const { return m_running.load(std::memory_order_acquire); }
    // Records lost so far: CUPTI's dropped counts plus buffers it asked for and did not get.
    uint64_t dropped() const;
    // How many end_graph() calls did not close the graph that begin_graph() opened last.
    uint64_t unbalanced_ends() const { return m_unbalanced.load(std::memory_order_relaxed); }

    // Around one run of a compiled graph, on the thread that launches its work; nestable (the
    // innermost graph owns what is launched). A relaxed atomic load when not running. An
    // end_graph() after stop() still closes what its begin_graph() opened.
    void begin_graph(uint64_t graph_id) {
        if (m_running.load(std::memory_order_relaxed)) begin_graph_impl(graph_id);
    }
    void end_graph(uint64_t graph_id) {
        if (m_started_once.load(std::memory_order_relaxed) && !end_graph_impl(graph_id))
            m_unbalanced.fetch_add(1, std::memory_order_relaxed);
    }

    // Turns recording on (the activity kinds are enabled here, once per start, never per graph
    // run) and off. stop() waits for the device's current context (what the thread that calls it
    // launched) so that running kernels are still recorded; it keeps what was recorded for the
    // next flush(). Both are idempotent and cheap no-ops where unavailable.
    void start();
    void stop();
    // Everything recorded since the last flush, with graph ids attributed, in no particular
    // order. Holds no lock of ours while the implementation gathers (CUPTI calls back into us
    // from cuptiActivityFlushAll). Empty where unavailable.
    std::vector<KernelRecord> flush();

protected:
    explicit Profiler(std::string name) : m_name(std::move(name)) {}

private:
    // Once. Returns whether records can be collected; `status` gets the one line.
    virtual bool probe_impl(std::string& status) = 0;
    // Returns false with `error` set when recording could not be turned on.
    virtual bool start_impl(std::string& error) = 0;
    virtual void stop_impl() = 0;
    // Appends everything gathered since the last call. Called with no lock of ours held.
    virtual void flush_impl(ActivityBatch& batch) = 0;
    virtual void begin_graph_impl(uint64_t graph_id) = 0;
    // Returns false when the innermost open graph on this thread was not `graph_id` (or there
    // was none opened while running); it is closed anyway.
    virtual bool end_graph_impl(uint64_t graph_id) = 0;

    void probe();

    std::string m_name;
    std::once_flag m_probe_once;
    bool m_available = false;  // written once under m_probe_once
    std::string m_status;      // idem
    std::atomic<bool> m_running{false};
    std::atomic<bool> m_started_once{false};
    std::atomic<uint64_t> m_unbalanced{0};
    mutable std::mutex m_mutex;  // start/stop state, m_error, m_dropped, m_correlations
    std::string m_error;
    uint64_t m_dropped = 0;
    CorrelationMap m_correlations;
};

// The process's profiler: CUPTI where it was built in, else the null one. Never destroyed (CUPTI
// must not be called during static destruction).
Profiler& profiler();

// A test double: records are made up by launch() and go through the same attribution as
// CUPTI's, with CUPTI's rules: a launch while running makes an API record and a device record
// that share a new correlation id, plus a link to the innermost open graph; nothing is recorded
// while stopped. Single-threaded use.
class FakeProfiler final : public Profiler {
public:
    explicit FakeProfiler(bool available = true);
    // Pretends an API call launched work of `kind` that ran on the device over [start_ns,
    // end_ns]; kind Runtime makes only the API record. With `complete_later`, the device record
    // is held back until complete_held() (a kernel still running at the next flush). Returns
    // the correlation id, or 0 when not running.
    uint32_t launch(const std::string& name, ActivityKind kind, int64_t start_ns, int64_t end_ns,
                    uint64_t bytes = 0, uint32_t stream = 7, bool complete_later = false);
    void complete_held();
    // Pretends the next flush lost `n` records.
    void drop(uint64_t n) { m_pending.dropped += n; }
    size_t open_graphs() const { return m_open.size(); }

private:
    bool probe_impl(std::string& status) override;
    bool start_impl(std::string& error) override;
    void stop_impl() override;
    void flush_impl(ActivityBatch& batch) override;
    void begin_graph_impl(uint64_t graph_id) override;
    bool end_graph_impl(uint64_t graph_id) override;

    bool m_fake_available;
    bool m_recording = false;
    uint32_t m_next_correlation = 1;
    std::vector<uint64_t> m_open;  // the external correlation stack
    ActivityBatch m_pending;
    std::vector<KernelRecord> m_held;
};

}  // namespace magpy
