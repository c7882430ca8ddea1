// Per-code-object cache of captured entries (guards, plan, compiled graph), attached to the code
// object with _PyCode_SetExtra and freed with it. Most recently used first; a limit per code
// object, after which the frame runs eagerly with a note.
#pragma once

#include "backends/backend.h"
#include "capture/capture.h"

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

namespace magpy {

struct CacheEntry {
    uint64_t id = 0;
    std::string options_key;  // CompileOptions::key() of the wrapper that made it
    std::unique_ptr<GuardTree> guards;
    std::shared_ptr<const Plan> plan;       // null: the capture broke; the frame runs eagerly
    std::unique_ptr<CompiledGraph> graph;
    std::vector<BreakInfo> breaks;
    std::vector<std::string> refgraph_nodes;
    std::vector<std::string> refgraph_edges;
    std::string backend;
    std::string backend_note;
    uint64_t hits = 0;
    int64_t capture_ns = 0;
    int64_t compile_ns = 0;
    size_t instructions = 0;
};

struct CodeCache {
    std::list<CacheEntry> entries;  // most recently used first
};

constexpr size_t kDefaultCacheLimit = 8;

// PRECONDITION: GIL held. Returns the cache for `code`, creating it.
CodeCache* code_cache(PyCodeObject* code, bool create);
// Drops every entry of every cache (magpy.reset()).
void clear_all_caches();
uint64_t next_entry_id();

}  // namespace magpy
