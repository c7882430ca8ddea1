// The execution-state monitor: a C trace function (no Python callback per instruction) that
// sees every instruction of the captured frame and of the user code it calls, reads the real
// values on the value stack, and keeps a shadow stack of value ids beside it.
// See core/capture/NOTES.md.
#pragma once

#include "capture/callee_rules.h"
#include "capture/capture.h"
#include "replay/resume.h"

#include <functional>
#include <map>
#include <memory>

#include <unordered_map>
#include <vector>

namespace magpy {

// Where a capture may end a segment (graph breaks that resume): the break sites known for the
// root code, and the original code it belongs to (a resume code continues another code).
struct SegmentOptions {
    std::vector<BreakSite>* sites = nullptr;  // null: no segments (fullgraph=True)
    PyCodeObject* origin = nullptr;
    int shift = 0;  // the root code's offset minus the origin's (a resume code's prologue)
    const std::vector<bool>* dynamic_args = nullptr;  // resume codes: see Value::dyn_scalar
    // Tells the progress hook what the capture finds as it goes (the notebook's live view):
    // ("break_found", 1) at a break, ("graph_found", its ops) when a segment ends.
    std::function<void(const char* event, long long n)> progress;
};

class Monitor {
public:
    Monitor(Capture& capture, PyCodeObject* root_code, bool fullgraph, SegmentOptions segments);
    // Installs the trace function on this thread, for the duration of one frame evaluation.
    // PRECONDITION: GIL held, no other tracer installed (checked by the caller).
    void install();
    void uninstall();

    bool root_returned() const { return m_root_returned; }
    int return_value() const { return m_return_value; }
    // The capture broke at a new site (recorded): the next capture ends a segment there.
    bool found_site() const { return m_found_site; }
    // The breaks of the known sites this capture ended a segment at (found by an earlier one)
    const std::vector<BreakInfo>& sites_reached() const { return m_sites_reached; }
    // The call is on its way out with an exception of the user's ([Note: calls that raise]).
    bool raising() const { return m_raising; }
    // fullgraph=True: the GraphBreakError raised at the break (null if none was), which the
    // call raises whatever its unwinding raised over it (see put_back_graph_break).
    PyObject* graph_break_error() const { return m_break_error.get(); }
    // The capture ended a segment at a known site: finish it with live_value() as its result.
    std::shared_ptr<const Continuation> continuation() const { return m_cont; }
    int live_value() const { return m_live; }
    const std::string& note() const { return m_note; }  // why a segment could not end here

    // [Note: code that ran inside a call] The frame hook reports every Python frame it
    // evaluates, on any thread, while a call that may run hidden code (backward(), an
    // optimizer's step) is in flight. PRECONDITION: GIL held.
    static bool watching() { return !s_watchers.empty(); }
    static void frame_evaluated(py::IFrame* frame);

private:
    struct Pending {
        int opcode = -1;
        int oparg = 0;
        int depth_after = 0;      // expected real stack depth at the next event
        std::vector<int> in;      // input values, popped at dispatch
        CalleeInfo callee;        // CALL
        int callee_value = -1;
        PyObject* kwnames = nullptr;
        int inline_result = -1;   // set by the callee's return event
        bool inline_bound = false;
        PyObject* expect_self = nullptr;  // InlineModule: borrowed
        int forward_value = -1;           // InlineModule: the forward function, by path;
                                          // UserClass: its __init__
        int made = -1;                    // UserClass: the object made (bound as self)
        bool property_get = false;        // LOAD_ATTR of a property: its getter is traced
        bool hook = false;                // a class's own __setattr__/__setitem__/__getitem__
                                          // the instruction runs, traced ([Note: hooks of
                                          // objects made in the call]); `in` its arguments
        py::Ref cache_as;                 // a cached_property's name: the getter's result is
                                          // set on the object made in the call (in[0])
        int key_map = -1;                 // sorted/min/max(key=f): the record of f's calls
        int fold_map = -1;                // functools.reduce(f, xs[, init]): the same for f
        int had_key = -1;                 // d.setdefault(k, v): 1 if d held k before the call
        py::Ref dict_before;              // d.update(...) on a dict passed in: a copy of d
                                          // before the call
        bool hidden_code = false;         // a recorded op that may run Python the capture does
                                          // not trace (runs_hidden_code, or a callable argument)
    };
    struct ShadowFrame {
        py::IFrame* frame = nullptr;
        PyFrameObject* frame_obj = nullptr;
        PyCodeObject* code = nullptr;
        std::vector<int> locals;
        std::vector<int> stack;
        Pending pending;
        PyObject* kwnames = nullptr;  // from KW_NAMES, for the next CALL
        int kwnames_at = -1;          // where that KW_NAMES starts (its EXTENDED_ARGs included)
        int func_value = -1;          // the function object's value (callees)
        bool is_root = false;
        bool library_code = false;  // torch's own Python, traced through
        bool caller_in_try = false; // the call into this frame sits in a try/with of a caller
        bool in_try = false;        // the current instruction is (Capture::set_in_try)
        // The with blocks open in this frame over a @contextmanager whose yield sits in a try
        // with a handler: their __exit__ values ([Note: generator context managers])
        std::vector<int> handler_contexts;
        int return_value = -1;
        int prefixed_at = -1;  // 3.12: an instruction decoded from its EXTENDED_ARG's event
        int prefixed_from = -1;  // and where that event was (its first prefix)
        std::vector<int16_t> depths;  // 3.12: py::code_stack_depths(code)
        int gen = -1;  // a generator's frame: its index in m_gens
        int map = -1;  // a call made by map(): the index of its record in m_maps
        int handlers = 0;  // except clauses running (PUSH_EXC_INFO ... POP_EXCEPT)
    };
    // [Note: generators] A generator made in the call: its frame is traced each time it is
    // resumed (by a builtin consuming it, a for loop, unpacking), its shadow frame kept between
    // yields, and what it yielded collected. A consumer that ran it to its end sees the items
    // as a list made in the call.
    struct GenRecord {
        PyCodeObject* code = nullptr;
        Pending call;         // the call that made it: binds its arguments on first resume
        int func_value = -1;
        bool started = false;
        bool done = false;
        bool in_cleanup = false;  // its last yield is inside a try or with block of its own
        ShadowFrame frame;    // between yields
        std::vector<int> yielded;
        PyObject* object = nullptr;  // borrowed: its iterator value holds it for the capture
    };
    std::vector<GenRecord> m_gens;
    std::vector<py::Ref> m_hooks_made;  // hooks registered on tensors in the call
    std::set<long> m_hook_ids_made;     // and their handles' ids
    // [Note: code that ran inside a call]: the functions evaluated while the watched call ran,
    // and the arguments they were given (what they may have changed)
    static std::vector<Monitor*> s_watchers;  // (captures on several threads at once)
    bool m_watching = false;
    bool m_ran_overflow = false;  // more than m_ran holds ran: the call breaks
    std::vector<py::Ref> m_ran;
    void watch_call(bool on);
    std::vector<BreakInfo> m_sites_reached;
    GenRecord* generator_of(int value);
    bool generators_left_in_cleanup(bool at_return);
    std::vector<PyObject*> backward_hooks(const Pending& p, std::vector<py::Ref>& held);
    void forget_generators();
    bool rank_may_change(const Pending& p);
    int grad_of(int t, PyObject* name, PyObject* real);
    bool guard_leaf_parameters();
    std::vector<int> m_grad_leaves;  // leaf modules called with autograd on (guard_leaf_parameters)
    int attr_at_replay(int obj, PyObject* name, PyObject* real, bool op);
    int call_at_replay(PyObject* fn, const std::vector<int>& args, PyObject* real,
                       const std::string& label);
    bool m_grads_changed = false;  // backward(), zero_grad(), a step or `p.grad = ` ran
    std::unordered_map<PyObject*, py::Ref> m_reached_leaves;  // see grad_of
    bool resume_generator(PyFrameObject* fo, py::IFrame* f, PyCodeObject* co);
    // [Note: map] map(f, xs) with f a Python function: each call the consumer's next() makes
    // is traced like a callee, its arguments the items of xs, its result collected.
    struct MapRecord {
        PyCodeObject* code = nullptr;  // f's code
        CalleeInfo callee;
        int func_value = -1;
        int self_value = -1;           // f a bound method: its self, bound first
        std::vector<std::vector<int>> steps;  // the arguments of each call, in order
        std::vector<int> results;      // what the calls made so far returned
        bool fold = false;             // functools.reduce: each call's first argument (after
                                       // self) is what the call before returned
        bool pure = false;             // a pure builtin (no frames): each result folded here
        bool opaque = false;           // a torch op or module (no frames): each call recorded
                                       // once its result is known (fill_opaque_map)
        std::string role;              // what f is to the caller, for messages
        int gen = -1;                  // the key over a generator's items (sorted(g, key=f)):
        size_t gen_from = 0;           // its record, and how many it had yielded before;
                                       // steps are added as it yields (sync_gen_steps)
    };
    std::vector<MapRecord> m_maps;
    MapRecord* map_of(int value);
    int make_map(const std::vector<int>& args, PyObject* result);
    void prepare_key(Pending& p);
    bool fold_pure_step(MapRecord& rec, const std::vector<int>& step);
    bool sync_gen_steps(MapRecord& rec);
    bool fill_opaque_map(MapRecord& rec, PyObject* kept);
    bool opaque_step(MapRecord& rec, PyObject* real);
    bool remake_opaque_step(MapRecord& rec);
    int iter_left(int sub);
    bool take_one(int sub);
    bool zip_ran_out(const std::vector<int>& inner);
    void pin_zip_inputs(const std::vector<int>& inner);
    void prepare_fold(Pending& p);
    int fold_result(const Pending& p, PyObject* result);
    // warnings.warn, logger.info & co: the site they report, found while the frames run
    // ([Note: effects that read the caller's frame])
    void prepare_caller_effect(ShadowFrame& f, Pending& p);
    int keyed_result(const Pending& p, PyObject* result);
    bool keys_fixed(const Pending& p, const std::vector<int>& keys);
    bool orders_as_constant(int id, int depth = 0);
    int kwarg(const Pending& p, const char* name);
    void replay_list_call(int callee, const std::vector<int>& in, PyObject* kwnames);
    bool reorder(std::vector<int>& items, PyObject* seq);
    int sort_list(const Pending& p);
    int map_record(int fv, const std::vector<std::vector<int>>& columns, const std::string& role,
                   const std::string& hint, bool records_ops = false);
    bool enter_map_step(PyFrameObject* fo, py::IFrame* f, PyCodeObject* co);
    // `ins` drops a frame's reference to an object whose class has a `__del__`: the capture
    // fails there, before it runs ([Note: finalizers] in monitor.cpp).
    bool drops_finalized(ShadowFrame& f, const py::Instruction& ins);
    // `call` null: the call pending in the caller (the frame below).
    void enter_callee(PyFrameObject* fo, py::IFrame* f, PyCodeObject* co, Pending* call,
                      int func_value, int gen = -1, int map = -1);
    // The items a generator yielded or a map made, once the consumer ran it to its end (or
    // as far as it went, with `partial_ok`).
    bool lazy_items(int value, std::vector<int>& out, bool partial_ok = false);

    static int trace(PyObject* obj, PyFrameObject* frame, int what, PyObject* arg);
    void on_call(PyFrameObject* frame);
    void on_return(PyFrameObject* frame, PyObject* value);
    void on_opcode(PyFrameObject* frame);
    void on_exception(PyFrameObject* frame, PyObject* exc_info);
    bool raise_is_determined(ShadowFrame& f, PyObject* exc_type, PyObject* exc);
    bool import_fails_for_good(ShadowFrame& f, PyObject* exc);
    void stop_tracing();
    void drop_raising_call();
    void untrace_frames();  // no more opcode events from the traced frames

    // Segments (capture/segment.cpp).
    const void* callee_at(ShadowFrame& f, const py::Instruction& ins);
    bool at_site(ShadowFrame& f, const py::Instruction& ins);
    void note_site();
    bool break_here(ShadowFrame& f, const py::Instruction& ins);
    void end_segment(ShadowFrame& f, const py::Instruction& ins);
    bool compile_callee_on_stack(const py::Instruction& at, PyObject*& callee,
                                 std::vector<int>& stack);
    bool break_step(ShadowFrame& f, const py::Instruction& ins, std::vector<int>& stack,
                    Continuation& c);
    int iterator_state(int iter, int depth = 0);
    // What a live iterator over `c` relies on not changing while the loop runs ([Note: loops
    // over containers at a break] in segment.cpp): a dict's keys and a set's elements in their
    // order, a list's length. Null if `c` is none of those.
    static py::Ref container_state(PyObject* c);
    void mark_live(int it, int container, const char* method);
    int rebuilt_iterator(int iter, int depth);  // (iterator_state's work, once per value)
    // One rebuilt iterator per iterator value at a break, the same object wherever it is held:
    // a local naming the loop's iterator (`it = iter(xs); for x in zip(it, ys):`) must go on as
    // the iterator the rebuilt zip holds.
    std::map<int, int> m_rebuilt;

    void bind_root(ShadowFrame& f);
    bool bind_callee(ShadowFrame& f, Pending& call, int func_value);
    int module_hooks(int callable);
    void store_attr(int obj, PyObject* name, int val);
    int made_default(int func_value, bool positional, int d, PyObject* name, PyObject* real);
    void complete(ShadowFrame& f);
    void dispatch(ShadowFrame& f, const py::Instruction& ins);
    void dispatch_call(ShadowFrame& f, int callable, std::vector<int> args, PyObject* kwnames);
    void complete_call(ShadowFrame& f, Pending& p, PyObject* result);
    int record_call(Pending& p, PyObject* result, bool dyn_shape, bool graph_op = true);
    bool runs_callable_argument(const std::vector<int>& args, PyObject* fn);
    // Whether isinstance()/issubclass() (`test`) against value `classes` is decided by the
    // types the guards fix; adds the ABC registry's guard; fails the capture where a
    // metaclass decides otherwise ([Note: class tests]).
    bool class_test_follows_type(const std::string& test, int subject, int classes);
    void split_display(const char* what);
    void set_in_try(ShadowFrame& f, int offset);
    // A Python number computed from tensor data (t.item(), int(t), float(t), round(of one)):
    // read at replay, never guarded (Value::dyn_scalar, [Note: numbers from tensor data]).
    int number_from_data(Pending& p, PyObject* result);
    int tolist_numbers(Pending& p, PyObject* result);  // lengths.tolist()
    // Data that follows from the guards ([Note: tensors of constants]): whether the callee and
    // every argument fold, and the value Python gets for what the call returned.
    bool args_fold(const Pending& p);
    int constant_of(PyObject* real, int depth = 0);
    int format_step(int opcode, int oparg, const std::vector<int>& in, PyObject* real);
    // A with block over a captured context manager ([Note: with blocks]): records its
    // __exit__ and __enter__, pushes both as BEFORE_WITH does.
    void with_enter(ShadowFrame& f, int ctx, PyObject* exit, PyObject* entered);
    void note_context_type(PyObject* ctx_type);
    // m.parameters() & co: the members nn.Module's generator will yield, in its order, as an
    // iterator value (module structure, names and member identities guarded).
    int module_members(const Pending& p, PyObject* generator);
    bool dict_entries(int module, const char* dict_name,
                      std::vector<std::pair<PyObject*, int>>& out);
    bool split_method(int method, int& func, int& self);
    bool split_bound_method(ShadowFrame& f, int n);
    bool user_context_manager(Pending& p);            // [Note: user context managers]
    bool user_context_class(PyObject* obj, const std::string& label);
    int bind_exit(int fn, const Arg& self, PyObject* real, const std::string& label);
    void user_with_enter(ShadowFrame& f, Pending& p);
    std::vector<int16_t> shadow_depths(PyCodeObject* co);
    int slice_value(const std::vector<int>& bounds, PyObject* real);
    bool reopen_with_block(ShadowFrame& f, int local);  // [Note: breaks inside with blocks]
    int remove_dict_item(int dict, int key, PyObject* present, bool want_value);
    bool guard_saved_state(int ctx);
    bool walk_modules(int module, const std::string& prefix, std::vector<PyObject*>& memo,
                      std::vector<std::pair<std::string, int>>& out);

    // Annotation helpers: each returns a value id, or -1 after calling m_cap.fail().
    int load_global(ShadowFrame& f, PyObject* name);
    int frame_globals_value(ShadowFrame& f);
    int load_deref(ShadowFrame& f, int index);
    int load_attr(int obj, PyObject* name, PyObject* real);
    int subscript(int container, int key, PyObject* real);
    int default_item(int dict, int key, PyObject* real);
    struct IndexKey {
        bool ok;
        bool dyn_shape;
    };
    IndexKey index_key(int key, int depth = 0);
    int binary(int op, int a, int b, PyObject* real);
    // `graph_op`: an item of an op result that is a tensor op of the graph (false: a number of
    // a Python list a step made, t.tolist())
    int item_of(int seq, Py_ssize_t i, PyObject* real, bool graph_op = true);
    bool truthiness_known(int value);
    bool branch_to_raise(ShadowFrame& f, const py::Instruction& ins, int value);
    bool speculate_branch(int value, std::string& why_not);
    bool speculate_length(int value, std::string& why_not);
    std::shared_ptr<Speculation> guess_here(const std::string& what, const char* failed,
                                            std::string& why_not);
    int container_method(int obj, PyObject* name, PyObject* real);
    bool expect_getattribute(ShadowFrame& f, PyObject* name);
    int input_dict_key(int dict, Py_ssize_t i, PyObject* key);
    bool root_closure_cell(const ShadowFrame& f, PyObject* cell);
    bool getattribute_slot(Pending& p, int callable, std::vector<int>& args, PyObject* kwnames);
    void expect_property_getter(ShadowFrame& f, PyObject* name);  // [Note: properties]
    bool expect_property_setter(Pending& p, int obj, PyObject* name, int val);
    bool prints_the_same(int value, int depth = 0);  // print(value) replayed ([Note: print])
    bool require_prints_the_same(const std::vector<int>& values, const std::string& what);
    bool require_const(const std::vector<int>& values, const std::string& what);
    // [Note: numpy arrays from constants]
    bool numpy_from_constants(const std::vector<int>& in);
    int operator_step(StepKind kind, int op, int a, int b, PyObject* real, bool graph_op,
                      bool effect = false);
    int numpy_operator(StepKind kind, int op, int a, int b, PyObject* real);
    int shape_compare(int op, int a, int b, PyObject* real);  // x.shape != skip.shape
    bool formatted_at_replay(int id);  // an f-string part made at replay
    int array_result(int r);
    bool known(int value, int depth = 0);
    void guard_set_value(int value);  // a set passed in, compared with a frozen copy
    bool number_operands(int a, int b);
    // Dynamic shapes (capture.h, [Note: dynamic shapes]).
    int shape_of(int tensor, PyObject* real_size);
    int symbolic_query(const Pending& p, int tensor, PyObject* result);
    // A number computed from `operands`: read at replay when any of them is (symbolic, or read
    // from tensor data), and then which.
    void number_from(int r, const std::vector<int>& operands);
    bool sym_number_call(const Pending& p, PyObject* result);
    // The truth of a symbolic number without fixing its value (a size of an input is true;
    // any other number's truth is checked at replay); -1 when it cannot be had so.
    int sym_truth(int value);
    // bool(n), operator.truth(n), all(x.shape), any(...) over symbolic numbers: the answer as
    // a constant, the truths it rests on checked at replay (sym_truth). -1: not such a call.
    int sym_truth_call(const Pending& p);
    // str(n), repr(n), "...".format(...) whose arguments are constants and at least one is made
    // at replay (formatted_at_replay): the text is made at replay too.
    bool text_at_replay(const Pending& p);
    int record_sym_number(Pending& p, PyObject* result);
    void guard_all_strides();
    int modules_dict(int container);
    long parameter_list_size(int list);
    int parameter_list_item(int list, long i, PyObject* real);
    enum class DictView { Keys, Values, Items };
    int make_iter(int source, PyObject* real_iter);
    int input_iterator(int value);
    bool rest_item_is(int rest, int pos, PyObject* real);  // [Note: iterators passed in]  // [Note: iterators passed in]; -1: not one of those
    void advance_iterator(int it, bool ran_out);
    int next_item(int iter, PyObject* real);
    void iter_done(int iter);
    bool dict_view(int dict, DictView view, std::vector<int>& out);
    int getter_parts(const Pending& p, PyObject* result);
    int length_value(int seq, PyObject* result);
    int deep_copied(int src, PyObject* copy, std::unordered_map<PyObject*, int>& made);
    void match_class(ShadowFrame& f, const Pending& p, PyObject* tos);
    int getter_value(int getter, const CalleeInfo& callee, int obj, PyObject* result);
    bool stands_for(int want, PyObject* got);
    int itertools_call(const std::string& name, const std::vector<int>& args, PyObject* result,
                       int fill, int initial);
    int iter_call(const std::string& name, const std::vector<int>& args, PyObject* result,
                  int had_key = -1);
    int class_attr(int obj, PyObject* name, PyObject* real);
    void dispatch_super(ShadowFrame& f, Pending& p);  // [Note: super]
    void dispatch_gen_context(Pending& p, int callable, std::vector<int> args, PyObject* kwnames);
    int super_method(int sup, PyObject* name, PyObject* real);
    bool items_of(int seq, std::vector<int>& out);
    bool iterator_items(int it, std::vector<int>& out);
    int fresh_dict(const std::vector<int>& pairs, PyObject* real);
    int fresh_set(PyObject* real);
    int set_method(const Pending& p, PyObject* result);
    bool set_source_known(int src);
    void pin_type_attr(int obj, const char* name);
    bool expect_text_hook(Pending& p, bool repr);
    int type_attr(int obj, PyObject* name, PyObject* attr);
    // A new list (or tuple) of the objects the values stand for (None where one has none).
    py::Ref reals_of(const std::vector<int>& items, bool list);
    int new_object(int cls, PyObject* real);
    int as_mapping(int value, const char* slot);
    bool input_dict(int value);  // a dict (or dict subclass) passed in
    bool escaped_mapping_write(int dict, const char* method, const std::vector<int>& args);
    bool expect_hook(Pending& p, const char* dunder);
    int object_slot_call(const Pending& p, PyObject* result);
    int environ_read(int name, PyObject* result, int fallback);  // [Note: environment reads]
    int object_attr(int obj, PyObject* name, PyObject* real, bool method);
    int class_member(int obj, PyObject* name, PyObject* attr);
    bool set_object_attr(int obj, PyObject* name, int val);
    bool pairs_of(int dict, std::vector<int>& out);
    int sorted_items(const Pending& p, PyObject* result);
    void dict_set(int dict, int key, int val);
    bool formats_at_replay(int value, int depth = 0);  // "%d" % value made at replay
    int dict_update(int dict, int other, const std::vector<std::pair<int, int>>& keywords,
                    PyObject* before);
    void set_fresh_item(int dict, int key, int val);  // d[key] = val, replayed once d escaped
    int fresh_dict_slot(int dict, PyObject* key);
    int dict_item(int dict, PyObject* key, PyObject* real);
    int dict_lookup(int dict, PyObject* key);
    bool stale_instance_dict(int dict);
    // Input dicts changed by d["name"] = v ([Note: dict writes]).
    // `added`: the key was not in the dict before (it goes last in iteration order).
    // `via`: the dict's own __setitem__, called past a class's hook (replayed as that call)
    void write_input_item(int dict, int key, int val, bool added = false, PyObject* via = nullptr);
    std::map<int, std::vector<int>> m_added_keys;  // per input dict: the keys the call added
    int written_item(int dict, PyObject* key);  // the value written this call, or -1
    int mutate_list(int callee, const std::string& name, const std::vector<int>& in);
    int index_items(const std::vector<int>& items, PyObject* key, ValueKind kind, PyObject* real);

    PyObject* real_stack(ShadowFrame& f, int i) { return py::frame_stack_peek(f.frame, f.depths, i); }
    void push(ShadowFrame& f, int v) { f.stack.push_back(v); }
    int pop(ShadowFrame& f);

    // [Note: partials]: a partial's function, positionals and keywords (names borrowed from
    // the partial's keywords dict or the call's kwnames)
    struct PartialParts {
        int func = -1;
        std::vector<int> args;
        std::vector<PyObject*> names;
        std::vector<int> values;
    };
    bool partial_parts(int partial, PartialParts& out);
    void apply_partial(PartialParts parts, std::vector<int>& args, PyObject*& kwnames);
    int make_partial(const Pending& p, PyObject* result);

    Capture& m_cap;
    PyCodeObject* m_root_code;
    std::vector<ShadowFrame> m_frames;
    std::vector<py::Ref> m_owned;  // objects made here that pending calls borrow (kwnames)
    std::vector<PyFrameObject*> m_untraced;
    bool m_stopped = false;
    int m_opcode_events_were = 0;  // 3.12: the interpreter's f_opcode_trace_set before install()
    // A captured context manager changed global state: grad mode (is_grad_enabled() is then
    // known from the guarded entry mode and the blocks), or other state (autocast, inference
    // mode), whose queries are refused.
    bool m_grad_state_set = false;
    bool m_other_state_set = false;
    bool m_fullgraph = false;
    PyCodeObject* m_at_code = nullptr;  // the instruction being traced (speculated branches)
    int m_at_offset = -1;
    bool m_raised = false;
    py::Ref m_break_error;
    bool m_raising = false;
    bool m_root_returned = false;
    int m_return_value = -1;
    SegmentOptions m_seg;
    py::Instruction m_root_ins{-1, 0, 0};  // the root frame's instruction in progress
    const void* m_root_callee = nullptr;
    bool m_found_site = false;
    bool m_ending = false;  // end_segment() is running
    std::string m_note;
    std::shared_ptr<Continuation> m_cont;
    int m_live = -1;
};

}  // namespace magpy
