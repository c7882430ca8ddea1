#include "report/report.h"

#include <algorithm>
#include <map>

#include "cache/code_cache.h"
#include "profile/profiler.h"
#include "python/compat.h"

namespace magpy {

static nlohmann::json break_json(const BreakInfo& b) {
    return {{"reason_id", b.reason_id}, {"reason", b.reason},     {"hint", b.hint},
            {"filename", b.filename},   {"lineno", b.lineno},     {"function", b.function}};
}

static std::vector<std::string> split_tabs(const std::string& s) {
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t i = 0; i <= s.size(); ++i)
        if (i == s.size() || s[i] == '\t') {
            out.push_back(s.substr(start, i - start));
            start = i + 1;
        }
    return out;
}

// GPU work recorded by the profiler, per graph (cache entry id), kept for the process: a flush
// hands over everything recorded since the last one, whichever compiled callable ran it.
struct GraphKernels {
    uint64_t count = 0;
    int64_t device_ns = 0;
    std::map<std::string, std::pair<uint64_t, int64_t>> by_name;  // name -> (count, ns)
};

static std::map<uint64_t, GraphKernels>& kernels_by_graph() {
    static auto* m = new std::map<uint64_t, GraphKernels>();  // never destroyed
    return *m;
}

static void collect_kernels() {
    for (const KernelRecord& k : profiler().flush()) {
        if (k.kind == ActivityKind::Runtime || k.graph_id == 0) continue;
        GraphKernels& g = kernels_by_graph()[k.graph_id];
        int64_t ns = k.end_ns - k.start_ns;
        g.count++;
        g.device_ns += ns;
        std::string name = k.kind == ActivityKind::Kernel ? k.name
                                                          : activity_kind_name(k.kind);
        auto& [n, total] = g.by_name[name];
        n++;
        total += ns;
    }
}

static nlohmann::json kernels_json(uint64_t entry) {
    auto it = kernels_by_graph().find(entry);
    if (it == kernels_by_graph().end()) return nullptr;
    const GraphKernels& g = it->second;
    std::vector<std::pair<std::string, std::pair<uint64_t, int64_t>>> rows(g.by_name.begin(),
                                                                         g.by_name.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
    nlohmann::json top = nlohmann::json::array();
    for (size_t i = 0; i < rows.size() && i < 20; ++i)
        top.push_back({{"name", rows[i].first},
                       {"count", rows[i].second.first},
                       {"device_ns", rows[i].second.second}});
    return {{"count", g.count}, {"device_ns", g.device_ns}, {"top", top}};
}

nlohmann::json make_report(const CompiledState& st) {
    collect_kernels();
    nlohmann::json r;
    r["schema_version"] = kReportSchemaVersion;
    r["name"] = st.name;
    r["backend"] = st.options.backend;
    r["fullgraph"] = st.options.fullgraph;
    const CallStats& s = st.stats;
    r["calls"] = s.calls;
    r["cache_hits"] = s.hits;
    r["cache_misses"] = s.misses;
    r["resume_hits"] = s.resume_hits;
    r["resume_misses"] = s.resume_misses;
    r["captures"] = s.captures;
    r["eager_calls"] = s.eager_calls;
    r["profiler"] = {{"available", profiler().available()},
                     {"running", profiler().running()},
                     {"status", profiler().status()}};
    r["breaks"] = nlohmann::json::array();
    for (const BreakInfo& b : s.breaks) r["breaks"].push_back(break_json(b));
    r["recompile_reasons"] = s.recompile_reasons;
    std::vector<std::string> notes = s.notes;  // and the compiled graphs' notes, below
    r["graphs"] = nlohmann::json::array();
    r["cache_entries"] = nlohmann::json::array();
    // The entries of the compiled code, then those of its resume functions (the segments
    // after graph breaks), each with where its segment starts and ends.
    // Compiling done inside replays (torchscript traces on first use) counts as compile time.
    int64_t deferred = 0;
    const std::string code_filename =
        st.code ? py::str_of(reinterpret_cast<PyCodeObject*>(st.code.get())->co_filename) : "";
    auto add_entries = [&](CodeCache* cc, int starts_at_line) {
        for (const CacheEntry& e : cc->entries) {
            if (e.options_key != st.options_key || !e.used_by(st.id)) continue;  // another's
            nlohmann::json entry;
            entry["id"] = e.id;
            entry["kind"] = e.plan ? "graph" : "eager";
            entry["hits"] = e.hits;
            entry["guards"] = e.guards ? e.guards->describe() : std::vector<std::string>{};
            entry["capture_ns"] = e.capture_ns;
            entry["compile_ns"] = e.compile_ns;
            int64_t deferred_e = e.graph ? e.graph->deferred_compile_ns() : 0;
            deferred += deferred_e;
            entry["compile_ns"] = e.compile_ns + deferred_e;
            entry["replay_ns"] = std::max<int64_t>(0, e.replay_ns - deferred_e);
            nlohmann::json kernels = kernels_json(e.id);
            if (!kernels.is_null()) entry["kernels"] = kernels;
            entry["instructions"] = e.instructions;
            if (starts_at_line > 0) entry["starts_at_line"] = starts_at_line;
            if (e.cont) entry["ends_at_line"] = e.cont->line;
            entry["breaks"] = nlohmann::json::array();
            for (const BreakInfo& b : e.breaks) entry["breaks"].push_back(break_json(b));
            nlohmann::json nodes = nlohmann::json::array(), edges = nlohmann::json::array();
            for (const std::string& n : e.refgraph_nodes) {
                auto f = split_tabs(n);
                if (f.size() == 4)
                    nodes.push_back({{"id", std::stoi(f[0])}, {"kind", f[1]}, {"scope", f[2]},
                                     {"label", f[3]}});
            }
            for (const std::string& n : e.refgraph_edges) {
                auto f = split_tabs(n);
                if (f.size() == 3)
                    edges.push_back({{"src", std::stoi(f[0])}, {"dst", std::stoi(f[1])},
                                     {"label", f[2]}});
            }
            entry["refgraph"] = {{"nodes", nodes}, {"edges", edges}};
            if (e.plan) {
                nlohmann::json g;
                g["entry"] = e.id;
                g["backend"] = e.backend;
                g["backend_note"] = e.backend_note;
                if (e.graph) {
                    g["backend_summary"] = e.graph->summary();
                    g["backend_graphs"] = e.graph->graph_texts();
                    for (const std::string& n : e.graph->notes()) {
                        g["backend_notes"].push_back(n);
                        if (std::find(notes.begin(), notes.end(), n) == notes.end())
                            notes.push_back(n);
                    }
                }
                g["op_count"] = e.plan->graph_op_count();
                nlohmann::json ops = nlohmann::json::array();
                for (const Step& step : e.plan->steps()) {
                    if (!step.graph_op) continue;
                    std::string target = step.kind == StepKind::Call && !step.args.empty()
                                             ? e.plan->render_arg(step.args[0])
                                             : "";
                    nlohmann::json op = {{"kind", static_cast<int>(step.kind)},
                                         {"target", target},
                                         {"line", step.line},
                                         {"out", step.out}};
                    const auto& locs = e.plan->locations();
                    if (step.loc >= 0 && static_cast<size_t>(step.loc) < locs.size())
                        op["filename"] = locs[static_cast<size_t>(step.loc)].filename;
                    ops.push_back(std::move(op));
                }
                g["ops"] = ops;
                g["replay_python"] = e.plan->render(st.name.substr(st.name.rfind('.') + 1),
                                                    code_filename);
                entry["replay_python"] = g["replay_python"];
                r["graphs"].push_back(g);
            }
            r["cache_entries"].push_back(entry);
        }
    };
    PyCodeObject* code = reinterpret_cast<PyCodeObject*>(st.code.get());
    CodeCache* cc = code ? code_cache(code, false) : nullptr;
    if (cc) {
        add_entries(cc, 0);
        for (const auto& [key, resume] : cc->resumes) {
            CodeCache* rc = code_cache(reinterpret_cast<PyCodeObject*>(resume.get()), false);
            if (rc) add_entries(rc, py::code_line_of(code, rc->target));
        }
    }
    r["timings_ns"] = {{"capture", s.capture_ns},
                       {"compile", s.compile_ns + deferred},
                       {"guard", s.guard_ns},
                       {"replay", std::max<int64_t>(0, s.replay_ns - deferred)}};
    r["notes"] = notes;
    // Callees that broke inside, run as compiled callables of their own ([Note: callees compiled
    // on their own] in frame_hook.cpp): each with its own report.
    r["callees"] = nlohmann::json::array();
    for (const std::unique_ptr<CompiledState>& c : st.callees)
        if (c->stats.calls > 0) r["callees"].push_back(make_report(*c));
    r["graph_count"] = r["graphs"].size();
    r["break_count"] = r["breaks"].size();
    return r;
}

}  // namespace magpy
