#include "cache/code_cache.h"

#include <unordered_set>

namespace magpy {

namespace {
Py_ssize_t g_extra_index = -1;
std::unordered_set<CodeCache*> g_caches;  // every live cache, for reset()
uint64_t g_next_id = 1;

// Called by CPython when a code object dies: nothing cached about it outlives it.
void free_code_cache(void* p) {
    auto* cc = static_cast<CodeCache*>(p);
    g_caches.erase(cc);
    delete cc;
}
}  // namespace

uint64_t next_entry_id() { return g_next_id++; }

CodeCache::~CodeCache() {
    // A resume code can outlive this cache (a frame of it is running): it must not point here.
    for (auto& [key, code] : resumes) {
        CodeCache* rc = code_cache(reinterpret_cast<PyCodeObject*>(code.get()), false);
        if (rc) rc->origin = nullptr;
    }
}

CodeCache* code_cache(PyCodeObject* code, bool create) {
    if (g_extra_index < 0) {
        g_extra_index = _PyEval_RequestCodeExtraIndex(free_code_cache);
        if (g_extra_index < 0) return nullptr;
    }
    void* extra = nullptr;
    if (_PyCode_GetExtra(reinterpret_cast<PyObject*>(code), g_extra_index, &extra) < 0) {
        PyErr_Clear();
        return nullptr;
    }
    if (extra || !create) return static_cast<CodeCache*>(extra);
    auto* cc = new CodeCache();
    if (_PyCode_SetExtra(reinterpret_cast<PyObject*>(code), g_extra_index, cc) < 0) {
        PyErr_Clear();
        delete cc;
        return nullptr;
    }
    g_caches.insert(cc);
    return cc;
}

void clear_all_caches() {
    for (CodeCache* cc : g_caches) {
        cc->entries.clear();
        cc->sites.clear();
        cc->dynamic_dims.clear();
        cc->dynamic_numbers.clear();
        cc->speculations.clear();
    }
}

}  // namespace magpy
