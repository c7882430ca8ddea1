// The CUPTI activity profiler (compiled only with MAGPY_HAS_CUPTI). See [Note: CUPTI profiler]
// in core/NOTES.md.
//
// [SECTION] Errors: MAGPY_CUPTI
// [SECTION] The driver, opened with dlopen
// [SECTION] Activity buffers and CUPTI's callbacks
// [SECTION] Decoding records
// [SECTION] CuptiProfiler
//
// libcupti itself needs no driver to load (it is linked); the driver (libcuda.so.1) is opened
// with dlopen by the probe, so that magpy loads and reports "no GPU" on machines without one.
#include "profile/profiler.h"

#include <cupti.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace magpy {
namespace {

// The newest layout of each record this CUPTI's headers define: CUPTI fills the records in the
// layout of the library's version, so the probe refuses a library older than the headers.
#if CUPTI_API_VERSION >= 130100
using KernelActivity = CUpti_ActivityKernel11;
#elif CUPTI_API_VERSION >= 130000
using KernelActivity = CUpti_ActivityKernel10;
#elif CUPTI_API_VERSION >= 19  // CUDA 12.0
using KernelActivity = CUpti_ActivityKernel9;
#else
using KernelActivity = CUpti_ActivityKernel4;
#endif
#if CUPTI_API_VERSION >= 26  // CUDA 12.8 (and 13.x, whose versions are xxyyzz)
using MemcpyActivity = CUpti_ActivityMemcpy6;
#elif CUPTI_API_VERSION >= 19
using MemcpyActivity = CUpti_ActivityMemcpy5;
#else
using MemcpyActivity = CUpti_ActivityMemcpy4;
#endif
using MemsetActivity = CUpti_ActivityMemset4;

constexpr size_t kBufferBytes = 4u << 20;  // CUPTI recommends 1 to 10 MB (Kineto: 4 MB)
constexpr size_t kBufferAlign = 8;         // ACTIVITY_RECORD_ALIGNMENT
constexpr size_t kMaxBuffers = 64;         // 256 MB waiting for a flush, then records drop
constexpr uint32_t kBufferRefusalMinVersion = 27;  // older CUPTIs crash on a null buffer

const CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
    CUPTI_ACTIVITY_KIND_RUNTIME,
    CUPTI_ACTIVITY_KIND_DRIVER,  // launches that bypass the runtime (cuBLAS, Triton)
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,  // never KIND_KERNEL: it serializes kernels
    CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_MEMSET,
};

// ---------------------------------------------------------------------------------------------
// [SECTION] Errors: MAGPY_CUPTI

thread_local std::string t_last_cupti_error;

CUptiResult cupti_check(CUptiResult result, const char* call) {
    if (result != CUPTI_SUCCESS) {
        const char* text = nullptr;
        if (cuptiGetResultString(result, &text) != CUPTI_SUCCESS || !text) text = "unknown";
        t_last_cupti_error = std::string(call) + ": " + text;
    }
    return result;
}

// Evaluates to the CUptiResult; on failure "<call>: <CUPTI error>" is kept for cupti_error().
#define MAGPY_CUPTI(call) cupti_check((call), #call)

const std::string& cupti_error() { return t_last_cupti_error; }

std::string version_string(uint32_t v) {
    char buf[32];
    if (v >= 100000)  // CUDA 13 on: xxyyzz
        std::snprintf(buf, sizeof buf, "%u.%u", v / 10000, v / 100 % 100);
    else
        std::snprintf(buf, sizeof buf, "API v%u", v);
    return buf;
}

// What decides record layouts: major.minor from CUDA 13 on (xxyyzz), the API version before.
uint32_t layout_version(uint32_t v) { return v >= 100000 ? v / 100 : v; }

// ---------------------------------------------------------------------------------------------
// [SECTION] The driver, opened with dlopen

struct Driver {
    CUresult(CUDAAPI* init)(unsigned int) = nullptr;
    CUresult(CUDAAPI* device_get_count)(int*) = nullptr;
    CUresult(CUDAAPI* driver_get_version)(int*) = nullptr;
    CUresult(CUDAAPI* get_error_name)(CUresult, const char**) = nullptr;
    CUresult(CUDAAPI* ctx_get_current)(CUcontext*) = nullptr;
    CUresult(CUDAAPI* ctx_synchronize)() = nullptr;

    std::string error_text(CUresult r) const {
        const char* name = nullptr;
        if (get_error_name && get_error_name(r, &name) == CUDA_SUCCESS && name) return name;
        return "CUresult " + std::to_string(static_cast<int>(r));
    }
};

template <typename Fn>
bool load_symbol(void* handle, const char* name, Fn& fn) {
    fn = reinterpret_cast<Fn>(dlsym(handle, name));
    return fn != nullptr;
}

// Opens libcuda.so.1 (never closed) and finds a GPU. Returns false with `why` set.
bool open_driver(Driver& d, int& gpus, std::string& why) {
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char* e = dlerror();
        why = std::string("CUDA driver not found: ") + (e ? e : "libcuda.so.1");
        return false;
    }
    if (!load_symbol(handle, "cuInit", d.init) ||
        !load_symbol(handle, "cuDeviceGetCount", d.device_get_count)) {
        why = "libcuda.so.1 lacks cuInit/cuDeviceGetCount";
        return false;
    }
    load_symbol(handle, "cuDriverGetVersion", d.driver_get_version);
    load_symbol(handle, "cuGetErrorName", d.get_error_name);
    load_symbol(handle, "cuCtxGetCurrent", d.ctx_get_current);
    load_symbol(handle, "cuCtxSynchronize", d.ctx_synchronize);
    CUresult r = d.init(0);
    if (r != CUDA_SUCCESS) {
        why = "cuInit: " + d.error_text(r);
        return false;
    }
    gpus = 0;
    r = d.device_get_count(&gpus);
    if (r != CUDA_SUCCESS) {
        why = "cuDeviceGetCount: " + d.error_text(r);
        return false;
    }
    if (gpus <= 0) {
        why = "cuDeviceGetCount: 0 devices";
        return false;
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// [SECTION] Activity buffers and CUPTI's callbacks
//
// The callbacks only allocate or hand a buffer over, and return at once. Records are decoded by
// flush() on its caller's thread. Never destroyed: CUPTI may complete buffers during exit.

struct ReadyBuffer {
    uint8_t* data;
    size_t valid;
};

struct ActivityBuffers {
    std::atomic<size_t> live{0};       // allocated and not yet freed
    std::atomic<uint64_t> refused{0};  // requests we answered with no buffer
    std::atomic<uint64_t> dropped{0};  // cuptiActivityGetNumDroppedRecords
    bool may_refuse = false;           // set by the probe, before any callback
    std::mutex ready_mutex;            // taken by the callback: never held across CUPTI calls
    std::vector<ReadyBuffer> ready;

    std::vector<ReadyBuffer> take() {
        std::lock_guard<std::mutex> lock(ready_mutex);
        std::vector<ReadyBuffer> out;
        out.swap(ready);
        return out;
    }
    void release(uint8_t* data) {
        std::free(data);
        live.fetch_sub(1, std::memory_order_relaxed);
    }
};

ActivityBuffers& buffers() {
    static ActivityBuffers* instance = new ActivityBuffers();
    return *instance;
}

void CUPTIAPI on_buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    ActivityBuffers& b = buffers();
    *max_records = 0;  // as many as fit
    *buffer = nullptr;
    *size = 0;
    if (b.live.load(std::memory_order_relaxed) >= kMaxBuffers && b.may_refuse) {
        b.refused.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    void* p = std::aligned_alloc(kBufferAlign, kBufferBytes);
    if (!p) {
        b.refused.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    b.live.fetch_add(1, std::memory_order_relaxed);
    *buffer = static_cast<uint8_t*>(p);
    *size = kBufferBytes;
}

void CUPTIAPI on_buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t,
                                  size_t valid) {
    ActivityBuffers& b = buffers();
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS && dropped)
        b.dropped.fetch_add(dropped, std::memory_order_relaxed);
    if (!buffer) return;
    if (valid == 0) {
        b.release(buffer);
        return;
    }
    std::lock_guard<std::mutex> lock(b.ready_mutex);
    b.ready.push_back({buffer, valid});
}

// ---------------------------------------------------------------------------------------------
// [SECTION] Decoding records

const char* memcpy_kind_name(uint8_t kind) {
    switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return "memcpy HtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return "memcpy AtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA: return "memcpy AtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD: return "memcpy AtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: return "memcpy DtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    default: return "memcpy";
    }
}

// Runtime calls that PyTorch makes constantly and that launch nothing.
bool is_noise(CUpti_CallbackId cbid) {
    switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaGetDevice_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaGetDeviceCount_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaGetLastError_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaPeekAtLastError_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaDeviceGetAttribute_v5000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamIsCapturing_v10000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamIsCapturing_ptsz_v10000: return true;
    default: return false;
    }
}

// Of the driver calls, only launches are kept (the runtime's own launches are runtime records).
bool is_driver_launch(CUpti_CallbackId cbid) {
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz:
#if CUPTI_API_VERSION >= 19
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
#endif
        return true;
    default: return false;
    }
}

// "cudaLaunchKernel_v7000" -> "cudaLaunchKernel".
std::string api_name(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
    const char* raw = nullptr;
    if (cuptiGetCallbackName(domain, cbid, &raw) != CUPTI_SUCCESS || !raw)
        return (domain == CUPTI_CB_DOMAIN_DRIVER_API ? "driver cbid " : "runtime cbid ") +
               std::to_string(cbid);
    std::string name(raw);
    size_t v = name.rfind("_v");
    if (v != std::string::npos && v + 2 < name.size() &&
        name.find_first_not_of("0123456789", v + 2) == std::string::npos)
        name.resize(v);
    return name;
}

void decode(uint8_t* data, size_t valid, int64_t offset, ActivityBatch& batch) {
    auto steady = [offset](uint64_t t) { return t ? static_cast<int64_t>(t) + offset : 0; };
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(data, valid, &record) == CUPTI_SUCCESS) {
        KernelRecord r;
        switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            auto* k = reinterpret_cast<const KernelActivity*>(record);
            r.name = k->name ? k->name : "<unnamed kernel>";
            r.kind = ActivityKind::Kernel;
            r.start_ns = steady(k->start);
            r.end_ns = steady(k->end);
            r.correlation_id = k->correlationId;
            r.device = k->deviceId;
            r.stream = k->streamId;
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            auto* m = reinterpret_cast<const MemcpyActivity*>(record);
            r.name = memcpy_kind_name(m->copyKind);
            r.kind = ActivityKind::Memcpy;
            r.start_ns = steady(m->start);
            r.end_ns = steady(m->end);
            r.correlation_id = m->correlationId;
            r.device = m->deviceId;
            r.stream = m->streamId;
            r.bytes = m->bytes;
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            auto* m = reinterpret_cast<const MemsetActivity*>(record);
            r.name = "memset";
            r.kind = ActivityKind::Memset;
            r.start_ns = steady(m->start);
            r.end_ns = steady(m->end);
            r.correlation_id = m->correlationId;
            r.device = m->deviceId;
            r.stream = m->streamId;
            r.bytes = m->bytes;
            break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME:
        case CUPTI_ACTIVITY_KIND_DRIVER: {
            auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
            bool driver = record->kind == CUPTI_ACTIVITY_KIND_DRIVER;
            if (driver ? !is_driver_launch(a->cbid) : is_noise(a->cbid)) continue;
            r.name = api_name(driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API,
                              a->cbid);
            r.kind = ActivityKind::Runtime;
            r.start_ns = steady(a->start);
            r.end_ns = steady(a->end);
            r.correlation_id = a->correlationId;
            break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
            auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
            if (e->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
                batch.links.emplace_back(e->correlationId, e->externalId);
            continue;
        }
        default: continue;
        }
        batch.records.push_back(std::move(r));
    }
}

// steady_clock minus CUPTI's clock (CLOCK_REALTIME by default on Linux), sampled now.
bool clock_offset(int64_t& offset) {
    uint64_t cupti_now = 0;
    int64_t before = now_ns();
    if (cuptiGetTimestamp(&cupti_now) != CUPTI_SUCCESS) return false;
    int64_t after = now_ns();
    offset = before + (after - before) / 2 - static_cast<int64_t>(cupti_now);
    return true;
}

// ---------------------------------------------------------------------------------------------
// [SECTION] CuptiProfiler

// The graphs this thread pushed onto CUPTI's (per-thread) external correlation stack.
thread_local std::vector<uint64_t> t_open_graphs;

class CuptiProfiler final : public Profiler {
public:
    CuptiProfiler() : Profiler("cupti") {}

private:
    bool probe_impl(std::string& status) override {
        uint32_t version = 0;
        if (MAGPY_CUPTI(cuptiGetVersion(&version)) != CUPTI_SUCCESS) {
            status = "CUPTI unusable (" + cupti_error() + ")";
            return false;
        }
        std::string prefix = "CUPTI " + version_string(version);
        if (layout_version(version) < layout_version(CUPTI_API_VERSION)) {
            // Records come in the library's (older) layouts, not the headers'.
            status = prefix + ": unusable (built against CUPTI " +
                     version_string(CUPTI_API_VERSION) + ", loaded an older one)";
            return false;
        }
        buffers().may_refuse = version >= kBufferRefusalMinVersion;
        int gpus = 0;
        std::string why;
        if (!open_driver(m_driver, gpus, why)) {
            status = prefix + ": no GPU (" + why + ")";
            return false;
        }
        if (MAGPY_CUPTI(cuptiActivityRegisterCallbacks(on_buffer_requested,
                                                       on_buffer_completed)) != CUPTI_SUCCESS) {
            status = prefix + ": unusable (" + cupti_error() + ")";
            return false;
        }
        status = prefix + ": " + std::to_string(gpus) + (gpus == 1 ? " GPU" : " GPUs");
        int driver = 0;
        if (m_driver.driver_get_version &&
            m_driver.driver_get_version(&driver) == CUDA_SUCCESS)
            status += ", driver " + std::to_string(driver / 1000) + "." +
                      std::to_string(driver % 1000 / 10);
        return true;
    }

    bool start_impl(std::string& error) override {
        size_t enabled = 0;
        for (CUpti_ActivityKind kind : kKinds) {
            if (MAGPY_CUPTI(cuptiActivityEnable(kind)) != CUPTI_SUCCESS) {
                error = cupti_error();
                while (enabled > 0) cuptiActivityDisable(kKinds[--enabled]);
                return false;
            }
            ++enabled;
        }
        return true;
    }

    void stop_impl() override {
        // Let the work this thread's context launched finish while its kinds are enabled.
        CUcontext context = nullptr;
        if (m_driver.ctx_get_current && m_driver.ctx_synchronize &&
            m_driver.ctx_get_current(&context) == CUDA_SUCCESS && context)
            m_driver.ctx_synchronize();
        for (size_t i = sizeof kKinds / sizeof kKinds[0]; i > 0; --i)
            MAGPY_CUPTI(cuptiActivityDisable(kKinds[i - 1]));
    }

    void flush_impl(ActivityBatch& batch) override {
        // No lock of ours is held here: on_buffer_completed runs inside this call.
        MAGPY_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
        int64_t offset = 0;
        clock_offset(offset);
        ActivityBuffers& b = buffers();
        for (const ReadyBuffer& ready : b.take()) {
            decode(ready.data, ready.valid, offset, batch);
            b.release(ready.data);
        }
        batch.dropped = b.dropped.exchange(0, std::memory_order_relaxed) +
                        b.refused.exchange(0, std::memory_order_relaxed);
    }

    void begin_graph_impl(uint64_t graph_id) override {
        if (cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0,
                                                   graph_id) == CUPTI_SUCCESS)
            t_open_graphs.push_back(graph_id);
    }

    bool end_graph_impl(uint64_t graph_id) override {
        if (t_open_graphs.empty()) return false;
        uint64_t opened = t_open_graphs.back();
        t_open_graphs.pop_back();
        uint64_t popped = 0;
        if (cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0,
                                                  &popped) != CUPTI_SUCCESS)
            return false;
        return opened == graph_id && popped == graph_id;
    }

    Driver m_driver;  // written by the probe only
};

}  // namespace

Profiler& profiler() {
    static Profiler* instance = new CuptiProfiler();  // never destroyed: see profiler.h
    return *instance;
}

}  // namespace magpy
