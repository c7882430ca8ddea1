// The profiler's bookkeeping (probe once, start/stop state, attribution of records to graphs)
// and the FakeProfiler test double. CUPTI itself lives in cupti_profiler.cpp.
#include "profile/profiler.h"

namespace magpy {

const char* activity_kind_name(ActivityKind kind) {
    switch (kind) {
    case ActivityKind::Kernel: return "kernel";
    case ActivityKind::Memcpy: return "memcpy";
    case ActivityKind::Memset: return "memset";
    case ActivityKind::Runtime: return "runtime";
    }
    return "unknown";
}

// ---------------------------------------------------------------------------------------------
// CorrelationMap

void CorrelationMap::add(uint32_t correlation_id, uint64_t graph_id) {
    auto [it, inserted] = m_graph_of.emplace(correlation_id, graph_id);
    if (!inserted) {
        it->second = graph_id;  // correlation ids wrap around after 2^32 API calls
        return;
    }
    m_order.push_back(correlation_id);
    while (m_order.size() > m_capacity) {
        m_graph_of.erase(m_order.front());
        m_order.pop_front();
    }
}

void CorrelationMap::attribute(ActivityBatch& batch) {
    for (const auto& [correlation_id, graph_id] : batch.links) add(correlation_id, graph_id);
    for (KernelRecord& r : batch.records) {
        auto it = m_graph_of.find(r.correlation_id);
        r.graph_id = it == m_graph_of.end() ? 0 : it->second;
    }
}

void CorrelationMap::clear() {
    m_graph_of.clear();
    m_order.clear();
}

// ---------------------------------------------------------------------------------------------
// Profiler

void Profiler::probe() {
    std::call_once(m_probe_once, [this] {
        std::string line;
        m_available = probe_impl(line);
        m_status = line.empty() ? (m_available ? "available" : "unavailable") : std::move(line);
    });
}

bool Profiler::available() {
    probe();
    return m_available;
}

const std::string& Profiler::status() {
    probe();
    return m_status;
}

std::string Profiler::error() const {
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_error;
}

uint64_t Profiler::dropped() const {
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_dropped;
}

void Profiler::start() {
    if (!available()) return;
    std::lock_guard<std::mutex> lock(m_mutex);
    if (m_running.load(std::memory_order_relaxed)) return;
    std::string error;
    if (!start_impl(error)) {
        m_error = error.empty() ? "could not start recording" : std::move(error);
        return;
    }
    m_error.clear();
    m_started_once.store(true, std::memory_order_relaxed);
    m_running.store(true, std::memory_order_release);
}

void Profiler::stop() {
    if (!m_running.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(m_mutex);
    if (!m_running.load(std::memory_order_relaxed)) return;
    m_running.store(false, std::memory_order_release);
    stop_impl();  // CUPTI does not call back into anything that takes m_mutex
}

std::vector<KernelRecord> Profiler::flush() {
    // Unavailable: nothing was ever started, so there is nothing to gather.
    if (!m_started_once.load(std::memory_order_acquire)) return {};
    ActivityBatch batch;
    flush_impl(batch);  // no lock of ours held: CUPTI calls bufferCompleted from in here
    std::lock_guard<std::mutex> lock(m_mutex);
    m_dropped += batch.dropped;
    m_correlations.attribute(batch);
    return std::move(batch.records);
}

// ---------------------------------------------------------------------------------------------
// FakeProfiler

FakeProfiler::FakeProfiler(bool available) : Profiler("fake"), m_fake_available(available) {}

bool FakeProfiler::probe_impl(std::string& status) {
    status = m_fake_available ? "fake profiler: made-up records" : "fake profiler: no GPU";
    return m_fake_available;
}

bool FakeProfiler::start_impl(std::string&) {
    m_recording = true;
    return true;
}

void FakeProfiler::stop_impl() { m_recording = false; }

uint32_t FakeProfiler::launch(const std::string& name, ActivityKind kind, int64_t start_ns,
                              int64_t end_ns, uint64_t bytes, uint32_t stream,
                              bool complete_later) {
    if (!m_recording) return 0;
    uint32_t correlation = m_next_correlation++;
    // CUPTI writes one external correlation record per API call, for the top of the stack.
    if (!m_open.empty()) m_pending.links.emplace_back(correlation, m_open.back());

    KernelRecord api;
    api.name = kind == ActivityKind::Runtime ? name : "cudaLaunchKernel";
    api.kind = ActivityKind::Runtime;
    api.start_ns = start_ns;
    api.end_ns = start_ns + 1;
    api.correlation_id = correlation;
    m_pending.records.push_back(api);
    if (kind == ActivityKind::Runtime) return correlation;

    KernelRecord device;
    device.name = name;
    device.kind = kind;
    device.start_ns = start_ns;
    device.end_ns = end_ns;
    device.correlation_id = correlation;
    device.stream = stream;
    device.bytes = bytes;
    (complete_later ? m_held : m_pending.records).push_back(std::move(device));
    return correlation;
}

void FakeProfiler::complete_held() {
    for (KernelRecord& r : m_held) m_pending.records.push_back(std::move(r));
    m_held.clear();
}

void FakeProfiler::flush_impl(ActivityBatch& batch) {
    batch = std::move(m_pending);
    m_pending = ActivityBatch();
}

void FakeProfiler::begin_graph_impl(uint64_t graph_id) { m_open.push_back(graph_id); }

bool FakeProfiler::end_graph_impl(uint64_t graph_id) {
    if (m_open.empty()) return false;
    uint64_t top = m_open.back();
    m_open.pop_back();
    return top == graph_id;
}

}  // namespace magpy
