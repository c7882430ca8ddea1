// [SECTION] arming  [SECTION] entry frame: hit, capture or eager
#include "hook/frame_hook.h"

#include "api/compiled_function.h"

#include "profile/profiler.h"

#include "cache/code_cache.h"
#include "capture/break_reasons.h"
#include "capture/monitor.h"
#include "python/compat.h"
#include "python/torch_api.h"

#include <map>
#include <string>
#include <string_view>

namespace magpy {

namespace {

struct ActiveCall {
    CompiledState* st;
    PyCodeObject* code;
    PyObject* self;
    PyObject* function;  // when set: the frame must be this function's (a decorator's wrapper)
    bool entered;
    ActiveCall* prev;
};

thread_local ActiveCall* t_active = nullptr;

// A call whose arguments the engine drops when its frame starts ([Note: references handed
// over]).
struct HandOver {
    PyCodeObject* code;
    std::vector<py::Ref>* refs;
};
thread_local HandOver* t_hand_over = nullptr;

// The frame the hook waits for while a call is under way (the innermost one is t_active).
struct ActiveScope {
    ActiveCall call;
    ActiveScope(CompiledState& st, PyCodeObject* code, PyObject* self, PyObject* function)
        : call{&st, code, self, function, false, t_active} {
        t_active = &call;
    }
    ~ActiveScope() { t_active = call.prev; }
    ActiveScope(const ActiveScope&) = delete;
    ActiveScope& operator=(const ActiveScope&) = delete;
};
int g_hook_users = 0;  // guarded by the GIL
PyObject* g_progress = nullptr;  // set_progress_hook; owned

void progress(const char* event, CompiledState& st,
              std::initializer_list<std::pair<const char*, long long>> info) {
    if (!g_progress) return;
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    py::Ref d = py::Ref::steal(PyDict_New());
    py::Ref label = py::Ref::steal(PyUnicode_FromString(st.name.c_str()));
    if (d && label) {
        PyDict_SetItemString(d.get(), "function", label.get());
        for (const auto& [k, v] : info) {
            py::Ref n = py::Ref::steal(PyLong_FromLongLong(v));
            if (n) PyDict_SetItemString(d.get(), k, n.get());
        }
        py::Ref hook = py::Ref::borrow(g_progress);  // the hook may replace itself
        py::Ref r = py::Ref::steal(PyObject_CallFunction(hook.get(), "sO", event, d.get()));
    }
    if (PyErr_Occurred()) py::clear_error_keep_interrupt();
    PyErr_Restore(et, ev, etb);
}
py::EvalFrameFn g_prev_eval = nullptr;

PyObject* handle_entry(CompiledState& st, PyThreadState* ts, py::IFrame* frame);
PyObject* resume(CompiledState& st, const Continuation& c, py::IFrame* frame, PyObject* live);

// The guard tree's fetched values for one call. Buffers are reused (no allocation on a cache
// hit) and leased, so a compiled function called while another replays gets its own.
thread_local std::vector<std::vector<PyObject*>*> t_value_buffers;
struct ValuesLease {
    std::vector<PyObject*>* values;
    ValuesLease() {
        if (t_value_buffers.empty()) {
            values = new std::vector<PyObject*>();
        } else {
            values = t_value_buffers.back();
            t_value_buffers.pop_back();
        }
    }
    ~ValuesLease() { t_value_buffers.push_back(values); }
    ValuesLease(const ValuesLease&) = delete;
    ValuesLease& operator=(const ValuesLease&) = delete;
};

// The last entry frame that handle_entry had evaluated (set after its evaluation returned, so
// after those of the calls inside it).
thread_local py::IFrame* t_last_evaluated = nullptr;

PyObject* evaluate(PyThreadState* ts, py::IFrame* frame) {
    PyObject* result = g_prev_eval(ts, frame, 0);
    t_last_evaluated = frame;
    return result;
}

// `self` of a frame: its first local, or the first of its *args when it takes only those (a
// forward under a decorator whose wrapper is `def wrapped(*args, **kwargs)`).
PyObject* self_of(py::IFrame* frame) {
    PyObject* first = py::frame_local(frame, 0);
    PyCodeObject* co = py::frame_code(frame);
    if (first && co->co_argcount == 0 && (co->co_flags & CO_VARARGS) && PyTuple_Check(first) &&
        PyTuple_GET_SIZE(first) > 0)
        return PyTuple_GET_ITEM(first, 0);
    return first;
}

PyObject* magpy_eval_frame(PyThreadState* ts, py::IFrame* frame, int throwflag) {
    if (Monitor::watching()) Monitor::frame_evaluated(frame);
    if (HandOver* h = t_hand_over; h && py::frame_code(frame) == h->code) {
        t_hand_over = nullptr;  // [Note: references handed over]
        h->refs->clear();
    }
    ActiveCall* a = t_active;
    if (a && !a->entered && !throwflag && py::frame_code(frame) == a->code &&
        (a->function ? py::frame_function(frame) == a->function
                     : !a->self || self_of(frame) == a->self)) {
        a->entered = true;
        t_last_evaluated = nullptr;
        PyObject* result = handle_entry(*a->st, ts, frame);
        // Answered from the cache (or resumed elsewhere): the frame never ran.
        if (t_last_evaluated != frame) py::discard_unevaluated_frame(ts, frame);
        return result;
    }
    return g_prev_eval(ts, frame, throwflag);
}

// [SECTION] entry frame ------------------------------------------------------------------------

PyObject* run_eagerly(CompiledState& st, PyThreadState* ts, py::IFrame* frame) {
    st.stats.eager_calls++;
    return evaluate(ts, frame);
}

// [Note: fullgraph and unwinding] fullgraph=True raises GraphBreakError at the break, and the
// with blocks and finally clauses on its way out run for it, as for any error. One of them may
// raise an error of its own over it (an __exit__ that fails); Python would pass that one on,
// and the caller's `except magpy.GraphBreakError` would miss the break. The GraphBreakError is
// raised again instead, with the other error as its __context__ and a note that names it.
static void put_back_graph_break(PyObject* gbe) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (!v || v == gbe || PyErr_GivenExceptionMatches(t, PyExc_KeyboardInterrupt)) {
        PyErr_Restore(t, v, tb);
        return;
    }
    if (tb) PyException_SetTraceback(v, tb);
    Py_XDECREF(t);
    Py_XDECREF(tb);
    // The other error's chain leads back to the GraphBreakError: cut it there.
    for (py::Ref c = py::Ref::borrow(v); c;) {
        py::Ref ctx = py::Ref::steal(PyException_GetContext(c.get()));
        if (ctx.get() == gbe) {
            PyException_SetContext(c.get(), nullptr);
            break;
        }
        c = ctx;
    }
    py::Ref text = py::Ref::steal(PyObject_Repr(v));
    std::string note = "while it passed through the call, a with block's __exit__ or a finally "
                       "clause raised " + std::string(text ? PyUnicode_AsUTF8(text.get()) : "an error") +
                       " (shown above)";
    if (!text) PyErr_Clear();
    py::Ref r = py::Ref::steal(PyObject_CallMethod(gbe, "add_note", "s", note.c_str()));
    if (!r) PyErr_Clear();
    PyException_SetContext(gbe, v);  // steals v
    PyErr_Restore(Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(gbe))), Py_NewRef(gbe),
                  PyException_GetTraceback(gbe));
}

PyObject* capture(CompiledState& st, CodeCache& cc, PyThreadState* ts, py::IFrame* frame) {
    st.stats.captures++;
    progress("capture", st, {});
    int64_t t0 = now_ns();
    refresh_python_kernels();  // ops with a Python kernel, as they are now
    Capture cap(py::frame_function(frame));
    cap.set_dynamic({st.options.dynamic, &cc.dynamic_dims, &cc.dynamic_numbers, &cc.speculations});
    SegmentOptions seg;
    seg.sites = &cc.sites;
    seg.origin = cc.shift ? cc.origin : py::frame_code(frame);  // a resume code continues origin
    seg.shift = cc.shift;
    seg.dynamic_args = &cc.dynamic_args;
    seg.progress = [&st](const char* event, long long n) {
        const char* key = std::string_view(event) == "graph_found" ? "ops" : "breaks";
        progress(event, st, {{key, n}});
    };
    Monitor mon(cap, py::frame_code(frame), st.options.fullgraph, seg);
    mon.install();
    PyObject* result = evaluate(ts, frame);
    mon.uninstall();
    if (!result && mon.graph_break_error()) put_back_graph_break(mon.graph_break_error());
    int64_t t1 = now_ns();
    st.stats.capture_ns += t1 - t0;

    std::shared_ptr<const Continuation> cont = mon.continuation();
    int result_value = cont ? mon.live_value() : mon.return_value();
    CaptureResult r = mon.root_returned() && !cap.failed() ? cap.finish(result_value)
                                                            : cap.finish_failed();
    if (result || !mon.raising())  // the user's exception is no break ([Note: calls that raise])
        for (const BreakInfo& b : r.breaks) st.add_break(b);
    for (const BreakInfo& b : mon.sites_reached()) st.add_break(b);
    if (!mon.note().empty()) st.add_note(mon.note());
    progress("captured", st, {{"ok", r.ok ? 1 : 0},
                              {"ops", r.ok && r.plan ? static_cast<long long>(r.plan->graph_op_count()) : 0},
                              {"breaks", static_cast<long long>(r.breaks.size())},
                              {"capture_ns", t1 - t0}});
    if (r.internal_error && !r.breaks.empty())
        st.add_note("engine error, the call ran eagerly: " + r.breaks.front().reason);
    if (!result) return nullptr;  // the user's exception (or GraphBreakError): nothing cached
    if (!mon.root_returned()) return result;
    // A new break site: the next capture ends a segment there instead of caching this call
    // as eager.
    if (mon.found_site() && !r.ok) return result;

    CacheEntry e;
    e.id = next_entry_id();
    e.options_key = st.options_key;
    e.users = {st.id};
    e.guards = std::move(r.guards);
    e.breaks = r.breaks;
    e.breaks.insert(e.breaks.end(), mon.sites_reached().begin(), mon.sites_reached().end());
    e.refgraph_nodes = std::move(r.refgraph_nodes);
    e.refgraph_edges = std::move(r.refgraph_edges);
    e.capture_ns = t1 - t0;
    e.instructions = r.instructions;
    if (r.ok) {
        e.plan = r.plan;
        e.cont = cont;
        progress("compile", st, {});
        int64_t c0 = now_ns();
        e.graph = st.backend->compile(r.plan, e.backend_note);
        e.compile_ns = now_ns() - c0;
        progress("compiled", st, {{"compile_ns", e.compile_ns}});
        st.stats.compile_ns += e.compile_ns;
        e.backend = st.backend->name();
        if (!e.backend_note.empty()) st.add_note(e.backend_note);
    }
    cc.entries.push_front(std::move(e));
    return result;
}

// What a bridge returns once its statement has run: the resume function that goes on after
// it, and its arguments (bridge_continue).
constexpr const char* kBridgeExit = "magpy.bridge_exit";
struct BridgeExit {
    py::Ref fn;
    std::vector<py::Ref> live;
};

// [Note: references handed over] The values a segment hands on live in its resume function's
// frame alone once that frame exists, as they lived in the one frame of eager: the engine's own
// references to them are dropped when the frame starts (magpy_eval_frame), and the replayed
// frame's locals and the guards' fetched values once the segment has run, so that `del obj`
// there frees obj where eager frees it (its __del__ runs at that line; [Note: finalizers] in
// capture/monitor.cpp).

// Calls `fn` (a Python function) with `args`, which it empties once fn's frame holds them
// (t_hand_over).
PyObject* call_handing_over(PyObject* fn, std::vector<py::Ref>& args) {
    std::vector<PyObject*> argv;
    argv.reserve(args.size());
    for (const py::Ref& a : args) argv.push_back(a.get());
    HandOver h{reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fn)), &args};
    HandOver* outer = t_hand_over;
    t_hand_over = &h;
    PyObject* r = PyObject_Vectorcall(fn, argv.data(), argv.size(), nullptr);
    t_hand_over = outer;
    return r;
}

// After a segment: the frame goes on in its resume function, called like any compiled frame (its
// own cache entries, captured on its first calls). `live` is the segment's result (stolen).
PyObject* resume(CompiledState& st, const Continuation& c, py::IFrame* frame, PyObject* live) {
    py::Ref state = py::Ref::steal(live);
    py::Ref fn;
    std::vector<py::Ref> args;
    PyObject* launcher = c.eager ? bridge_launcher() : nullptr;
    if (!prepare_resume(c, state.get(), py::frame_function(frame), launcher, fn, args))
        return nullptr;
    state = py::Ref();
    // [Note: calls that read their caller's frame] in capture/segment.cpp.
    if (c.eager) {
        py::Ref r = py::Ref::steal(call_handing_over(fn.get(), args));
        if (!r || !PyCapsule_IsValid(r.get(), kBridgeExit)) return r.release();
        // A bridge ran its statement and returned how to go on: the rest of the function runs
        // from here, so its frame's caller is the function's caller, as in eager (the bridge
        // frame has gone).
        auto* exit = static_cast<BridgeExit*>(PyCapsule_GetPointer(r.get(), kBridgeExit));
        fn = std::move(exit->fn);
        args = std::move(exit->live);
    }
    PyCodeObject* code = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fn.get()));
    ActiveScope scope(st, code, nullptr, nullptr);
    return call_handing_over(fn.get(), args);
}

// Why an entry whose guards passed declined at a Check step.
std::string failed_check_reason(CodeCache& cc, bool fullgraph) {
    for (auto& [site, guess] : cc.speculations)
        if (guess->failed && !guess->reported) {
            guess->reported = true;
            return guess->what + "; " +
                   (fullgraph ? "each outcome gets a cache entry of its own (fullgraph=True)"
                              : "it is a graph break from now on");
        }
    return "a replay check failed: a relation between sizes that the code relied on no longer "
           "holds, or a tensor tested by a branch to a `raise` has the other truth value";
}

PyObject* handle_entry(CompiledState& st, PyThreadState* ts, py::IFrame* frame) {
    PyCodeObject* code = py::frame_code(frame);
    CodeCache* cc = code_cache(code, true);
    if (!cc) return run_eagerly(st, ts, frame);
    if (python_modes_active()) {
        // Its Python runs for each op called from Python; a graph's ops would skip it
        st.add_note("a TorchFunctionMode or TorchDispatchMode was active, so the call ran "
                    "eagerly (the mode sees every op)");
        return run_eagerly(st, ts, frame);
    }
    ValuesLease lease;
    std::vector<PyObject*>& values = *lease.values;
    const std::string& key = st.options_key;
    size_t own_entries = 0;          // made by this wrapper
    size_t shared_entries = 0;       // made under these options by any wrapper
    CacheEntry* last_own = nullptr;  // most recently used entry of these options this wrapper used
    bool relation_failed = false;    // an entry's guards passed but a replay Check did not
    auto count_hit = [&](std::list<CacheEntry>::iterator it) {
        (reinterpret_cast<PyObject*>(code) == st.code.get() ? st.stats.hits : st.stats.resume_hits)++;
        it->hits++;
        if (!it->used_by(st.id)) {  // another wrapper's entry: its breaks are this one's too
            it->users.push_back(st.id);
            for (const BreakInfo& b : it->breaks) st.add_break(b);
        }
        if (it != cc->entries.begin()) cc->entries.splice(cc->entries.begin(), cc->entries, it);
    };
    uint64_t guard_start = now_ticks();  // (a cheap clock: [profiler.h] now_ticks)
    for (auto it = cc->entries.begin(); it != cc->entries.end(); ++it) {
        if (it->options_key != key) continue;
        ++shared_entries;
        if (it->users.front() == st.id) ++own_entries;
        if (!last_own && it->used_by(st.id)) last_own = &*it;
        bool ok = it->guards->check(frame, values);
        if (!ok) {
            GuardTree::release_values(values);
            continue;
        }
        uint64_t replay_start = now_ticks();
        st.stats.guard_ns += ticks_to_ns(replay_start - guard_start);
        PyObject* result;
        if (it->graph) {
            std::shared_ptr<const Continuation> cont = it->cont;  // `it` may move while resuming
            Declined declined;
            // Kernels launched by this run are attributed to the entry (CUPTI, on a GPU).
            uint64_t id = it->id;
            static Profiler& prof = profiler();
            prof.begin_graph(id);
            result = it->graph->run(values.data(), declined);
            prof.end_graph(id);
            uint64_t replay_end = now_ticks();
            int64_t replay_ns = ticks_to_ns(replay_end - replay_start);
            it->replay_ns += replay_ns;
            st.stats.replay_ns += replay_ns;
            guard_start = replay_end;  // a declined run goes on to the next entry
            if (declined == Declined::Recapture) {
                // A size relation the capture relied on does not hold: like a failed guard.
                GuardTree::release_values(values);
                relation_failed = relation_failed || &*it == last_own;
                continue;
            }
            count_hit(it);
            if (result && cont) {
                // [Note: references handed over]: the segment's result holds what goes on.
                GuardTree::release_values(values);
                py::frame_clear_locals(frame);
                result = resume(st, *cont, frame, result);
            } else if (declined == Declined::RunEagerly) {
                st.add_note("an operation inside a try block raised when replayed, so the call "
                            "ran eagerly for its handler (new data made it fail)");
                result = run_eagerly(st, ts, frame);
            } else if (declined == Declined::Warned) {
                st.add_note("an operation gave a warning when replayed before a point where the "
                            "replay could still give up, so the call ran eagerly and gave it "
                            "once");
                result = run_eagerly(st, ts, frame);
            }
        } else {
            count_hit(it);
            result = run_eagerly(st, ts, frame);
        }
        GuardTree::release_values(values);
        return result;
    }
    st.stats.guard_ns += ticks_to_ns(now_ticks() - guard_start);
    (reinterpret_cast<PyObject*>(code) == st.code.get() ? st.stats.misses : st.stats.resume_misses)++;
    if (last_own) {
        std::string why = relation_failed ? failed_check_reason(*cc, st.options.fullgraph)
                                          : last_own->guards->check_verbose(frame);
        if (PyErr_Occurred()) PyErr_Clear();
        // Automatic dynamic: sizes and numbers that changed since the last capture become
        // symbolic in the next one ([Note: dynamic shapes]); with dynamic=True too, for what
        // did not start symbolic (module attributes, numbers).
        if (st.options.dynamic != 0) {
            // Against the most recent entry that differs only in sizes or numbers (the last
            // one may have another rank: inputs alternating between 2-d and 3-d)
            std::string dims;
            GuardTree::Changes changes;
            for (const CacheEntry& e : cc->entries) {
                if (e.options_key != key || !e.used_by(st.id)) continue;
                changes = e.guards->changes(frame);
                if (!changes.dims.empty() || !changes.numbers.empty()) break;
            }
            for (const auto& [source, changed] : changes.dims) {
                uint64_t& known = cc->dynamic_dims[source];
                for (int d = 0; d < 64; ++d)
                    if ((changed >> d & 1) && !(known >> d & 1))
                        dims += (dims.empty() ? "" : ", ") + source + " dim " + std::to_string(d);
                known |= changed;
            }
            for (const std::string& source : changes.numbers)
                if (cc->dynamic_numbers.insert(source).second)
                    dims += (dims.empty() ? "" : ", ") + source;
            if (!dims.empty()) why += "; now dynamic: " + dims;
        }
        st.stats.recompile_reasons.push_back(why.empty() ? "guard failed" : why);
    }
    if (own_entries >= st.options.cache_limit || shared_entries >= kMaxSharedEntries) {
        BreakInfo b;
        b.reason_id = breaks::kCacheLimit;
        b.reason = own_entries >= st.options.cache_limit
                       ? "`" + st.name + "` was recompiled " + std::to_string(own_entries) +
                             " times (cache limit " + std::to_string(st.options.cache_limit) +
                             "); further new inputs run eagerly"
                       : "the code of `" + st.name + "` has " + std::to_string(shared_entries) +
                             " cache entries from all its compiled objects (limit " +
                             std::to_string(kMaxSharedEntries) + "); further new inputs run eagerly";
        b.hint = "see recompile_reasons: mark changing sizes dynamic or keep Python values fixed";
        st.add_break(b);
        st.add_note("cache limit reached: " + b.reason);
        return run_eagerly(st, ts, frame);
    }
    if (py::thread_has_tracer(ts)) {
        BreakInfo b;
        b.reason_id = breaks::kTracerActive;
        b.reason = "another tracer (a debugger or coverage tool) is active, so magpy did not "
                   "capture";
        b.hint = "run without the debugger to capture";
        st.add_break(b);
        return run_eagerly(st, ts, frame);
    }
    return capture(st, *cc, ts, frame);
}

}  // namespace

void set_progress_hook(PyObject* hook) {
    Py_XINCREF(hook);
    Py_XSETREF(g_progress, hook);
}

// [SECTION] arming -----------------------------------------------------------------------------

namespace {

// Calls `callable` with the hook armed for `code` (its frame, recognised by `self` or
// `function` when set), on behalf of `st`.
PyObject* call_armed(CompiledState& st, PyObject* callable, PyObject* const* args,
                     size_t nargsf, PyObject* kwnames) {
    ActiveScope scope(st, reinterpret_cast<PyCodeObject*>(st.code.get()), st.expect_self,
                      st.expect_function);
    if (g_hook_users++ == 0) {
        g_prev_eval = py::get_eval_frame();
        py::set_eval_frame(magpy_eval_frame);
    }
    PyObject* r = PyObject_Vectorcall(callable, args, nargsf, kwnames);
    if (--g_hook_users == 0) py::set_eval_frame(g_prev_eval);
    if (!scope.call.entered && r) {
        // The code we wait for never ran as the call's frame: a decorator wraps it (its frame
        // is the wrapper's, `self` is not its first local), or the call never reached it.
        st.stats.eager_calls++;
        st.add_note("`" + st.name + "` ran eagerly: its code (" +
                    py::str_of(reinterpret_cast<PyCodeObject*>(st.code.get())->co_qualname) +
                    ") was not called as expected, for example because a decorator wraps it; "
                    "compile the undecorated function, or a module whose forward is not "
                    "decorated");
    }
    return r;
}

// [Note: callees compiled on their own]
// A break inside a callee ends the caller's segment before the call (a break site of the
// caller's code), and the call itself becomes the segment's last step. Run plainly, the whole
// callee would then be eager: for a detection model whose NMS branches on data, that is all
// of roi_heads. Instead that step calls `compiled_call(callee, *args)`, which runs the callee
// as a compiled callable of its own (as torch.compile does with the frame of a callee that
// broke): its own captures, segments and cache entries, under the caller's options. The state
// is kept in the caller's `callees`, one per code and self (a module, a bound method's
// object), so the report shows it under the caller. Python's standard library is not compiled
// this way (logging, I/O helpers): it runs as it is.
bool in_stdlib(PyCodeObject* code) {
    static std::string dir = [] {
        std::string d;
        py::Ref sysconfig = py::Ref::steal(PyImport_ImportModule("sysconfig"));
        py::Ref path = sysconfig ? py::Ref::steal(PyObject_CallMethod(sysconfig.get(), "get_path",
                                                                      "s", "stdlib"))
                                 : py::Ref();
        if (path && PyUnicode_Check(path.get())) d = py::str_of(path.get()) + "/";
        PyErr_Clear();
        return d;
    }();
    std::string file = py::str_of(code->co_filename);
    return !dir.empty() && file.compare(0, dir.size(), dir) == 0 &&
           file.find("-packages/") == std::string::npos;
}

// Runs on every replay of a segment that ends at such a call: the callable seen before (a
// module, a function) is found by identity, without looking up its forward again.
CompiledState* callee_state(CompiledState& caller, PyObject* callable) {
    for (const std::unique_ptr<CompiledState>& c : caller.callees)
        if (c->target.get() == callable) return c.get();
    CaptureTarget t = capture_target(callable);
    if (!t.code) {
        PyErr_Clear();
        return nullptr;
    }
    for (const std::unique_ptr<CompiledState>& c : caller.callees)
        if (c->code.get() == reinterpret_cast<PyObject*>(t.code) && c->expect_self == t.self &&
            c->expect_function == t.function)
            return c.get();
    if (caller.callees.size() >= CompiledState::kMaxCallees) return nullptr;
    auto c = std::make_unique<CompiledState>();
    c->target = py::Ref::borrow(callable);  // keeps self and function alive
    c->code = py::Ref::borrow(reinterpret_cast<PyObject*>(t.code));
    c->expect_self = t.self;
    c->expect_function = t.function;
    c->options = caller.options;
    c->options_key = caller.options_key;
    c->backend = caller.backend;
    c->name = qualname_of(callable);
    caller.callees.push_back(std::move(c));
    return caller.callees.back().get();
}

PyObject* compiled_call_impl(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                             PyObject* kwnames) {
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "compiled_call() needs the callable to call");
        return nullptr;
    }
    PyObject* callable = args[0];
    CompiledState* caller = t_active ? t_active->st : nullptr;
    CompiledState* st = caller ? callee_state(*caller, callable) : nullptr;
    if (!st) return PyObject_Vectorcall(callable, args + 1, nargs - 1, kwnames);
    st->stats.calls++;
    return call_armed(*st, callable, args + 1, nargs - 1, kwnames);
}

// [Note: bridges] in magpy/_resume.py: launcher(origin, end, stack), called by a bridge once
// the statement of a call that reads its caller's frame has run in it. The bridge frame's
// locals and cells, and `stack`, are the live state at `end` of `origin`; the frame goes on
// there in an ordinary resume function, compiled under the options of the call under way.
// The launcher returns that function and its arguments (a BridgeExit capsule), the bridge
// returns them, and resume() calls the function once the bridge frame has gone.
PyObject* bridge_continue(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyCode_Check(args[0]) || !PyLong_Check(args[1]) ||
        !PyTuple_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "magpy: a bridge called its launcher wrongly");
        return nullptr;
    }
    auto* origin = reinterpret_cast<PyCodeObject*>(args[0]);
    int end = static_cast<int>(PyLong_AsLong(args[1]));
    PyObject* stack = args[2];
    PyFrameObject* fo = PyEval_GetFrame();
    if (!fo) {
        PyErr_SetString(PyExc_RuntimeError, "magpy: a bridge launcher without its frame");
        return nullptr;
    }
    py::IFrame* f = py::frame_of(fo);
    PyCodeObject* bridge = py::frame_code(f);
    // [locals | stack | contents of the cells that are not arguments], as a segment's live
    // state; a local or cell without a value is None and listed in `unbound`.
    std::vector<PyObject*> live;
    std::vector<int> unbound;
    const int nvar = origin->co_nlocals;
    auto content = [&](int bridge_index, int origin_index) {
        PyObject* v = py::frame_local(f, bridge_index);
        if (v && (py::code_local_kind(bridge, bridge_index) & py::kLocalKindCell))
            v = PyCell_GET(v);
        if (!v) {
            unbound.push_back(origin_index);
            v = Py_None;
        }
        live.push_back(v);
    };
    for (int i = 0; i < nvar; ++i) content(i, i);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(stack); ++i) live.push_back(PyTuple_GET_ITEM(stack, i));
    for (int i = nvar, k = 0; i < py::code_nlocalsplus(origin); ++i) {
        if (py::code_local_kind(origin, i) != py::kLocalKindCell) continue;  // frees
        content(bridge->co_nlocals + k++, i);
    }
    // Functions made in the bridge's frame close over its cells: the resume code makes them
    // again over its own ([Note: inner functions at a break] in replay/resume.h).
    std::vector<InnerFunction> functions;
    std::vector<PyObject*> parts;
    std::map<PyObject*, size_t> remade;  // function -> index in `functions`
    for (size_t p = 0; p < live.size(); ++p) {
        auto it = remade.find(live[p]);
        if (it == remade.end()) {
            InnerFunction fn;
            std::string why;
            if (!inner_function(live[p], f, bridge, origin, false, fn, why)) continue;
            auto* func = reinterpret_cast<PyFunctionObject*>(live[p]);
            if (fn.defaults) parts.push_back(func->func_defaults);
            if (fn.kwdefaults) parts.push_back(func->func_kwdefaults);
            it = remade.emplace(live[p], functions.size()).first;
            functions.push_back(std::move(fn));
        }
        functions[it->second].held_at(p, static_cast<size_t>(nvar),
                                      static_cast<size_t>(PyTuple_GET_SIZE(stack)));
        live[p] = Py_None;
    }
    live.insert(live.end(), parts.begin(), parts.end());
    std::vector<bool> nulls(static_cast<size_t>(PyTuple_GET_SIZE(stack)), false);
    PyCodeObject* code = resume_code(origin, end, nulls, unbound, false, nullptr, functions);
    if (!code) return nullptr;
    auto exit = std::make_unique<BridgeExit>();
    exit->fn = resume_function(code, py::frame_function(f));
    if (!exit->fn) return nullptr;
    for (PyObject* v : live) exit->live.push_back(py::Ref::borrow(v));
    PyObject* capsule = PyCapsule_New(exit.get(), kBridgeExit, [](PyObject* c) {
        delete static_cast<BridgeExit*>(PyCapsule_GetPointer(c, kBridgeExit));
    });
    if (capsule) exit.release();
    return capsule;
}

PyMethodDef g_bridge_def = {
    "bridge_continue", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(bridge_continue)),
    METH_FASTCALL,
    "bridge_continue(origin, end, stack): goes on at `end` of `origin` from the calling "
    "frame's state, compiled (magpy's bridges after a call that reads its caller's frame)."};

PyMethodDef g_compiled_call_def = {
    "compiled_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(compiled_call_impl)),
    METH_FASTCALL | METH_KEYWORDS,
    "compiled_call(callee, *args, **kwargs): calls callee as a compiled callable of its own, "
    "with the options of the compiled callable running (a segment's last step)."};

}  // namespace

bool compiles_on_its_own(PyObject* callable) {
    CaptureTarget t = capture_target(callable);
    PyErr_Clear();
    return t.code && !in_stdlib(t.code);
}

PyObject* bridge_launcher() {
    static PyObject* fn = [] {
        py::Ref module = py::Ref::steal(PyUnicode_FromString("magpy"));
        return PyCFunction_NewEx(&g_bridge_def, nullptr, module.get());
    }();
    return fn;
}

PyObject* compiled_call() {
    static PyObject* fn = [] {
        py::Ref module = py::Ref::steal(PyUnicode_FromString("magpy"));
        return PyCFunction_NewEx(&g_compiled_call_def, nullptr, module.get());
    }();
    return fn;
}

PyObject* call_with_hook(CompiledState& st, PyObject* const* args, size_t nargsf,
                         PyObject* kwnames) {
    st.stats.calls++;
    if (!st.code) return PyObject_Vectorcall(st.target.get(), args, nargsf, kwnames);
    return call_armed(st, st.target.get(), args, nargsf, kwnames);
}

void CompiledState::add_break(const BreakInfo& b) {
    for (const BreakInfo& o : stats.breaks)
        if (o.reason_id == b.reason_id && o.lineno == b.lineno && o.filename == b.filename &&
            o.reason == b.reason)
            return;
    stats.breaks.push_back(b);
}

void CompiledState::add_note(const std::string& note) {
    for (const std::string& n : stats.notes)
        if (n == note) return;
    stats.notes.push_back(note);
}

}  // namespace magpy
