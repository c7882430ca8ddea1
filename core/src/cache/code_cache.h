// Per-code-object cache of captured entries (guards, plan, compiled graph), attached to the code
// object with _PyCode_SetExtra and freed with it. Most recently used first; a limit per code
// object, after which the frame runs eagerly with a note.
#pragma once

#include "backends/backend.h"
#include "capture/capture.h"
#include "replay/resume.h"

#include <algorithm>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace magpy {

struct CacheEntry {
    uint64_t id = 0;
    std::string options_key;  // CompileOptions::key() of the wrapper that made it
    // CompiledState::id of the wrapper that made it, then of each other wrapper (same code,
    // same options) that hit it: whose cache limit it counts against, whose explain() shows it
    std::vector<uint64_t> users;
    bool used_by(uint64_t wrapper) const {
        return std::find(users.begin(), users.end(), wrapper) != users.end();
    }
    std::unique_ptr<GuardTree> guards;
    std::shared_ptr<const Plan> plan;       // null: the capture broke; the frame runs eagerly
    // Set when the plan is a segment that ends at a graph break: the plan's result is the
    // frame's live state, and the frame goes on in a resume function (replay/resume.h).
    std::shared_ptr<const Continuation> cont;
    std::unique_ptr<CompiledGraph> graph;
    std::vector<BreakInfo> breaks;
    std::vector<std::string> refgraph_nodes;
    std::vector<std::string> refgraph_edges;
    std::string backend;
    std::string backend_note;
    uint64_t hits = 0;
    int64_t capture_ns = 0;
    int64_t compile_ns = 0;
    int64_t replay_ns = 0;  // summed over hits
    size_t instructions = 0;
};

struct CodeCache {
    std::list<CacheEntry> entries;  // most recently used first
    std::vector<BreakSite> sites;
    // Original code objects: the resume codes made for it, by ResumeKey (see resume.h).
    std::map<std::string, py::Ref> resumes;
    // Resume codes: the code they continue (borrowed: it owns this code through `resumes`,
    // and clears this pointer when it dies) and the prologue's length in code units.
    PyCodeObject* origin = nullptr;
    int shift = 0;
    int target = 0;  // where in the origin it goes on (code units)
    // Resume codes: arguments that held values computed from tensor data in some segment
    // ending here (floats among them are guarded by type only).
    std::vector<bool> dynamic_args;
    // Automatic dynamic shapes: tensor dims (by the guard's source, e.g. L['x']) whose size
    // changed between captures; symbolic in later captures.
    std::map<std::string, uint64_t> dynamic_dims;
    // Automatic dynamic numbers: int and float inputs (by source) whose value changed between
    // captures; read at replay (guarded by type only) in later captures.
    std::set<std::string> dynamic_numbers;
    // Branches on data-dependent sizes guessed by captures, by site ([Note: speculated
    // branches]): one that went the other way at replay is a graph break in later captures.
    std::map<std::string, std::shared_ptr<Speculation>> speculations;
    ~CodeCache();
};


constexpr size_t kDefaultCacheLimit = 8;
// Entries of one code object under one set of options, whatever wrappers made them (each
// wrapper has its own limit, CompileOptions::cache_limit): past it, new inputs run eagerly.
constexpr size_t kMaxSharedEntries = 64;

// PRECONDITION: GIL held. Returns the cache for `code`, creating it.
CodeCache* code_cache(PyCodeObject* code, bool create);
// Drops every entry of every cache (magpy.reset()).
void clear_all_caches();
uint64_t next_entry_id();

}  // namespace magpy
