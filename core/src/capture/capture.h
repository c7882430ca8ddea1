// A capture: one real run of a frame (and the user code it calls) under the execution-state
// monitor. It keeps a value for every object the program touches, labelled with where it came
// from (the RefGraph: access path for external values, recorded op for computed ones, contents
// for containers made during the run), and from them builds the guard tree and the replay plan.
// See core/capture/NOTES.md.
#pragma once

#include "guards/guard_tree.h"
#include "replay/plan.h"

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace magpy {

struct BreakInfo {
    std::string reason_id;  // stable id from core/capture/break_reasons.h
    std::string reason;     // in the user's terms
    std::string hint;       // what to change
    std::string filename;
    int lineno = 0;
    std::string function;
    std::string source_line;
};

// An instruction where captures of a code object stop, so that a segment ends before it and
// the frame goes on in Python (found by an earlier capture that broke there).
struct BreakSite {
    int offset = 0;                // code units, in the code object that owns the site
    const void* callee = nullptr;  // CALL: the callable (identity only, never dereferenced)
    BreakInfo info;                // the break that put it here
};
constexpr size_t kMaxBreakSites = 64;  // per code object; past it, breaks stay eager
// Steps one capture may record: a loop unrolled past it (tens of thousands of iterations)
// runs eagerly instead of holding a plan that is slower to replay than the bytecode.
constexpr size_t kMaxPlanSteps = 20000;

enum class ValueKind : uint8_t {
    Null,        // the NULL 3.11 pushes before some callables
    Input,       // external: existed before the call, reached by an access path (guard node)
    Const,       // determined by the guards: literals, value-guarded scalars, folded results
    OpResult,    // computed by a recorded step at replay (plan slot)
    FreshList,   // containers created during the call; rebuilt from their items at replay
    FreshTuple,
    FreshDict,
    FreshSet,    // a set of constants made in the call ([Note: sets made in the call]): its
                 // elements are read from the set itself when needed (Capture::set_items)
    FreshObject, // an instance of a plain user class made in the call ([Note: objects made in
                 // the call]): `items` its attributes as name, value pairs; `cls` its class;
                 // `mapping` its items when it is a dict
    Iterator,
    Cell,        // a closure cell object (LOAD_CLOSURE)
    Function,    // a function made during the call (MAKE_FUNCTION: lambdas, comprehensions)
    Super,       // the object super() made: `items` {the class it starts after, the object}
    Partial,     // a functools.partial made in the call: `items` {func, args..., keyword
                 // values...}, the keyword names those of `real`'s keywords ([Note: partials])
    GenContext,  // what a @contextlib.contextmanager function returned, made in the call, or
                 // (its `real` a bound method) that object's __exit__ after BEFORE_WITH:
                 // `items` {its generator's iterator value} ([Note: generator context
                 // managers] in monitor.cpp)
    BoundMethod, // a list, dict, set or tuple method read as an attribute (`log.append` where
                 // CPython emits LOAD_ATTR, not LOAD_METHOD), or the __exit__ of a user's
                 // context manager after BEFORE_WITH (`ctx_exit` set): `items` {the method
                 // descriptor or function, the object}; calling it calls the first with the
                 // object first
};

enum class IterKind : uint8_t {
    ConstSeq, FreshSeq, InputSeq, ModuleSeq, OpSeq,
    Flat,       // `items` in order, `iter_width` at a time (dict views, reversed)
    Zip,        // `items`: one iterator per input
    Enumerate,  // `items`: the one inner iterator; the count comes from the yielded tuple
    Generator,  // a generator made in the call (`iter_source`: Monitor's record of it)
    Map,        // map(f, xs) with f traced (`iter_source`: Monitor's record of it)
};

struct Value {
    ValueKind kind = ValueKind::Null;
    py::Ref real;     // the object during capture
    int node = -1;    // guard node (Input, and value-guarded Const)
    int slot = -1;    // OpResult
    std::vector<int> items;  // Fresh*, shadowed inputs: items (dict: key, value, key, value ...)
    IterKind iter_kind = IterKind::ConstSeq;
    int iter_source = -1;
    int iter_pos = 0;
    int iter_width = 1;      // Flat: items per step (2 for dict.items())
    Py_ssize_t iter_start = 0;  // Enumerate: the count of its first item
    bool iter_rows = false;  // Flat: each step yields a tuple of its items, even of one
    bool iter_view = false;  // a dict view or similar: iter() of it starts a new iterator
    // Flat over a dict or list that may change (`for k in d`, d.values(), reversed(l)): the
    // container and how its own iterator is made, which a break rebuilds ([Note: loops over
    // containers at a break] in segment.cpp)
    int iter_container = -1;
    const char* iter_method = nullptr;  // "keys", "values", "items", "reversed"; null: iter(c)
    py::Ref iter_snapshot;  // container_state() of it when the loop began
    // InputSeq over an iterator passed in ([Note: iterators passed in] in monitor.cpp): that
    // iterator's value, advanced at replay by one next() per item the capture took.
    int iter_advance = -1;
    // taken by a zip() or enumerate() not run out yet, made in this frame: another frame (a
    // generator over it, zipped with it) reading it while the zip steps would be out of order
    const void* zipped_by = nullptr;
    bool tensor = false;
    bool identity = false;  // identity-guarded (modules, functions, classes)
    bool dyn_shape = false; // tensor whose shape depends on data (nonzero, masks)
    bool dyn_scalar = false; // a float read from tensor data before a break (`.item()`):
                             // guarded by type only; arithmetic on it is replayed
    bool own_storage = false;  // an op result in memory the call made ([Note: memory made in
                               // the call]): changing it in place is not a visible effect
    bool data_size = false;  // a dyn_scalar that depends on tensor data only through the
                             // sizes of tensors whose shape does (`boxes.numel() > 4000`)
    bool mutated = false;   // an Input the capture changed: a dict (reads after that are
                            // unsupported) or a list only appended to (`items`: the appended)
    bool shadow = false;    // an Input list/tuple whose items are tracked in `items` (guarded)
    bool keyed_writes = false;  // a mutated Input dict changed only by d["name"] = v: the
                                // written items are in Capture::overlay() under "[name]",
                                // every other key still holds what it held at entry
    bool ctx_exit = false;  // the bound __exit__ of a captured with block
    int built = -1;         // Fresh*: the plan slot of the object once it escaped (identity fixed);
                            // a Const exception: the one made at replay (fresh_exception)
    int cls = -1;           // FreshObject: the value of its class
    // FreshObject of a dict or OrderedDict subclass: the FreshDict that holds its items (its
    // `real` is the object too); that FreshDict's `owner` is the object. The items are made
    // only with the object ([Note: objects made in the call] in monitor.cpp).
    int mapping = -1;
    int owner = -1;
    int default_factory = -1;  // FreshDict of a collections.defaultdict: its factory
    int dict_of = -1;  // an Input dict that is `obj.__dict__` of the Input `obj`
    // An op result that follows from the guards alone (torch.tensor(x.shape), arange(n) and
    // what is computed from them): Python may read its data as a constant while the tensor's
    // version counter is still `const_version` ([Note: tensors of constants]).
    bool const_data = false;
    int64_t const_version = -1;
    // Dynamic shapes ([Note: dynamic shapes]): a tensor whose sizes may differ at replay (an
    // op result computed from one; inputs read their symbolic dims from the guard tree), or a
    // number computed at replay from such sizes. `sym_deps`: the (guard node, dims) the number
    // depends on; `sym_all`: it depends on every symbolic dim (sizes of op results).
    bool sym = false;
    bool sym_all = false;
    std::vector<std::pair<int, uint64_t>> sym_deps;
    // [Note: ranks that may change] a tensor whose number of dims may differ at replay
    // (`x[: T // 2].squeeze()`, `x.flatten(d)` with d dynamic, what is computed from them);
    // `rank_checked`: its rank is checked at replay (Capture::read_rank).
    bool rank_varies = false;
    bool rank_checked = false;
    // An input whose shape the call changed in place (set_, resize_, unsqueeze_, out=, .data
    // =): its sizes and rank are read at replay like an op result's, not from its guards
    bool reshaped = false;
    // A symbolic size of a tensor passed in (or its numel): at least 2 at replay (the guards
    // hold symbolic dims to that), so its truth is known
    bool positive = false;
    // A number computed at replay from symbolic sizes only (not from tensor data).
    bool sym_number() const {
        PyObject* o = real.get();
        return sym && !tensor && !dyn_scalar && o && (PyLong_Check(o) || PyFloat_Check(o));
    }
    std::string label;      // how the user would name it
};

struct CaptureResult {
    bool ok = false;        // a plan was built
    bool internal_error = false;
    std::unique_ptr<GuardTree> guards;
    std::shared_ptr<Plan> plan;
    std::vector<BreakInfo> breaks;
    std::vector<std::string> refgraph_nodes;  // "id kind label" lines for the report
    std::vector<std::string> refgraph_edges;
    size_t ops = 0;
    size_t instructions = 0;
};

class Monitor;

// What earlier captures of the code learnt: which input dims are symbolic ([Note: dynamic
// shapes]), which guessed branches went the other way ([Note: speculated branches]).
struct DynamicConfig {
    int mode = -1;  // -1 automatic (dims that changed between calls), 0 off, 1 every dim
    const std::map<std::string, uint64_t>* dims = nullptr;  // automatic: by accessor source
    const std::set<std::string>* numbers = nullptr;  // automatic: ints and floats read at replay
    std::map<std::string, std::shared_ptr<Speculation>>* speculations = nullptr;  // by site
};

// magpy.GraphBreakError (set by the Python module at import). Borrowed.
PyObject* graph_break_error();
void set_graph_break_error(PyObject* type);
// A value guarded by equality and used as a constant: None, numbers, strings, dtypes, devices,
// ranges, and tuples and frozensets of them.
bool is_constant_like(PyObject* o, int depth = 0);
// typing's special forms and aliases (`List[Tensor]`) and `list[int]`: guarded by identity.
bool is_typing_object(PyObject* o);
std::string format_break(const BreakInfo& b);

// PRECONDITION for every method: GIL held, called from the trace callback of this thread.
class Capture {
public:
    explicit Capture(PyObject* entry_function /*borrowed*/);
    ~Capture();

    // --- values -------------------------------------------------------------------------
    Value& v(int id) { return m_values[static_cast<size_t>(id)]; }
    int null_value() const { return 0; }
    int value_count() const { return static_cast<int>(m_values.size()); }
    int new_value(ValueKind kind, PyObject* real, std::string label);
    int const_value(PyObject* real, std::string label = {});
    // Whether the value follows from the guards alone: a constant, an op result computed only
    // from such values (and its data not changed since), or a container of them.
    bool folds(int value, int depth = 0);
    bool callee_folds(int value);  // folds, or a function guarded by identity
    // External values: a root access, or a step from an Input value. Guards by type.
    // `by_type`: a float guarded by its type only, not its value (Value::dyn_scalar).
    int input_root(AccessKind kind, int index, PyObject* key, const std::string& source,
                   PyObject* real, bool by_type = false);
    int input_child(int parent_value, AccessKind kind, int index, PyObject* key,
                    const std::string& suffix, PyObject* real,
                    bool by_type = false);
    // [Note: library calls that change state] `call` (a recorded op) may have changed any
    // Python object it reaches from `roots`: reading one of them from here on breaks.
    void changed_by_call(const std::vector<PyObject*>& roots, const std::string& call,
                         bool hidden_code = false);
    // A read of global `name` of the module dict `globals` after such a call rebound it (its
    // code stores it): a break (true). Null globals: false.
    bool global_changed(PyObject* globals, PyObject* name, const std::string& what);
    // A read of `obj` (spelled `what`) after such a call reached it: a break (true).
    bool read_after_change(PyObject* obj, const std::string& what);
    void rebound(PyObject* obj);  // a write of the capture's own replaces what a call changed
    // [Note: code that ran inside a call] The hooks of every tensor passed in that requires
    // grad are those backward() ran: guarded as they are (a hook added later recompiles).
    void guard_tensor_hooks();
    // A leaf module called in the call: its parameters' hooks as the call found them, for
    // guard_tensor_hooks (they are not inputs of their own).
    // `made_in_call`: the ids of the hooks the call registered before (left out)
    void entry_hooks_of_module(int value, const std::set<long>& made_in_call);
    // After a failure: the capture holds `obj` no longer (its values read as null), so that
    // the frame's own drop of it is its last reference, as in eager.
    void forget(PyObject* obj);
    // An object held by the guards, not reached by a path. `pinned`: it stands for itself
    // (identity: a class, a module); never for a container, whose contents would then be
    // taken as fixed (known())
    int constant_root(PyObject* obj, const std::string& source, bool pinned = false);
    int fresh(ValueKind kind, std::vector<int> items, PyObject* real);

    // --- guards -------------------------------------------------------------------------
    void guard_no_hooks(int id);  // an nn.Module passed in has no hooks of its own
    void guard_len(int value, Py_ssize_t n);
    void guard_equals(int value, PyObject* expected = nullptr);  // (its own real by default)
    // Whether values a and b (read from the inputs) are one object, guarded; false when one
    // of them is not an input read by a path.
    bool guard_same_object(int a, int b);
    void guard_identity(int value);  // `is` the object it is now (parameters(): tied weights)
    void guard_strides(int value);
    // A key absent from a dict, an attribute absent from obj.__dict__, or from obj altogether.
    void guard_no_key(int value, PyObject* key) { guard_key_in(value, key, false); }
    void guard_key_in(int value, PyObject* key, bool present) {
        guard_absent(value, CheckKind::KeyIn, key, present);
    }
    void guard_no_instance_attr(int value, PyObject* name) {
        guard_absent(value, CheckKind::NoInstanceAttr, name);
    }
    void guard_no_attr(int value, PyObject* name) { guard_absent(value, CheckKind::NoAttr, name); }
    // A check on `key` of the value's node (KeyIn, NoInstanceAttr, NoAttr).
    void guard_absent(int value, CheckKind kind, PyObject* key, bool flag = false);
    GuardTree& guards() { return *m_guards; }

    // --- plan ---------------------------------------------------------------------------
    // Records a computation run at replay; returns the value of its result.
    int record(Step step, PyObject* real_result, const std::string& label, bool graph_op);
    // Records a write visible to the caller (attribute, item, global, container mutation),
    // replayed in program order among the ops. `values` become the step's arguments; they
    // escape (see escape_arg).
    void record_effect(Step step, const std::vector<int>& values);
    // The plan argument that gives an op this value at this point of the program. An input
    // list or tuple has its items guarded (the op reads them).
    bool arg_of(int value, Arg& out);
    // The plan argument for a value that becomes visible outside the call (stored, returned):
    // a fresh container is built now, once, so later mutations replay on the same object.
    bool escape_arg(int value, Arg& out);
    bool fresh_exception(int value, Arg& out);  // see escape_arg
    // Tracks the items of an input list or tuple from here on (guards its length and items).
    bool shadow(int value);
    // `obj` is an input of this capture that the call has changed so far (written or appended
    // to), as recorded.
    bool input_changed(PyObject* obj) const;
    // The elements a set made in the call holds now, as constants ([Note: sets made in the
    // call]); in_order: only if set([...]) of them iterates as the set does (else a break).
    bool set_items(int id, std::vector<int>& out);
    bool set_items_in_order(int id, std::vector<int>& out);
    // A mutation of a container that exists at replay (input list, escaped fresh container):
    // true when it must be replayed.
    bool exists_at_replay(int value) { return v(value).kind == ValueKind::Input || v(value).built >= 0; }

    // --- dynamic shapes -----------------------------------------------------------------
    void set_dynamic(DynamicConfig c) { m_dynamic = c; }
    const DynamicConfig& dynamic() const { return m_dynamic; }
    // A tensor whose sizes may differ at replay.
    bool sym_tensor(int value);
    // Whether `value`, or an item of a container made in the call (or of an input list whose
    // items are tracked), has `flag` set (dyn_scalar: a number read from tensor data;
    // dyn_shape: a tensor whose shape depends on data).
    bool holds(int value, bool Value::*flag, int depth = 0);
    // Dim `dim` of tensor `value`: a constant when it is fixed by the guards, else a number
    // read at replay (Value::sym; Value::dyn_scalar for a tensor whose shape depends on data).
    int size_of(int value, int dim, PyObject* real);
    static constexpr int kNumel = -1;  // size_of(t, kNumel): t.numel()
    // Python needs the number itself (a branch, range(), a list index): from here on it is a
    // constant, and the dims it came from are guarded by value again. Always succeeds.
    void concretize(int value);
    void pin_all_dims();
    void pin_number(int value);
    void fix_length(int tensor);  // Python reads len(tensor) (iteration, unpacking)
    void check_length(int op_result);
    // Python reads the number of dims of tensor `value` (its shape, dim(), a negative dim):
    // checked at replay if it may change ([Note: ranks that may change]); false: failed.
    bool read_rank(int value);
    // A tensor's shape was changed in place (x.set_(...), x.unsqueeze_(0), out=x): from here
    // on its sizes and rank are read at replay, whatever the guards held (a review probe).
    void reshaped_in_place(int value);
    // A tensor passed in whose sizes or requires_grad the call changed in place ([Note:
    // metadata changed through one path]): its identity against other tensor paths guarded.
    void metadata_changed(int value);
    // Guards that the class of value `id` (passed in) is not changed later; false: failed.
    bool guard_class_unchanged(int id);
    bool add_replay_check(int value, PyObject* expected, CheckOp how,
                          std::shared_ptr<Speculation> guess = nullptr);

    // --- breaks -------------------------------------------------------------------------
    void fail(const char* reason_id, std::string reason, std::string hint);
    void internal_error(std::string what);
    bool failed() const { return m_failed; }
    bool internal() const { return m_internal; }
    const std::vector<BreakInfo>& breaks() const { return m_breaks; }
    // The capture failed because of `b` (a break met earlier), whatever failed since.
    void set_break(BreakInfo b) { m_breaks.assign(1, std::move(b)); }
    // The capture goes on after all (the break ends a segment instead): the break stays
    // listed in the result, and the capture no longer counts as failed.
    BreakInfo retract_failure() {
        m_failed = false;
        return m_breaks.back();
    }
    size_t step_count() const { return m_plan->steps().size(); }
    size_t graph_op_count() const { return m_graph_ops; }
    std::string break_message() const;  // the first break, formatted for an exception
    py::Ref raise_graph_break() const;  // sets GraphBreakError for the first break; returns it

    void set_location(PyCodeObject* code, int line) {
        m_code = code;
        m_line = line;
    }
    int line() const { return m_line; }
    // The frame running now, library code included ([Note: site frames] in plan.cpp): its code,
    // module globals and instruction offset (code units).
    void set_site(PyCodeObject* code, PyObject* globals, int offset) {
        m_site_code = code;
        m_site_globals = globals;
        m_site_offset = offset;
    }
    // Whether an exception at the current instruction would reach a handler of the captured
    // code (a try or with block of this frame or of a caller being traced).
    void set_in_try(bool in_try) { m_in_try = in_try; }
    // `with` blocks ([Note: with blocks]): steps recorded between enter_context and
    // exit_context leave through that block's __exit__ (the value `exit_value`, a plan slot)
    // when they raise at replay.
    bool enter_context(int exit_value, bool inherited = false, bool user = false);
    void exit_context();
    bool in_context() const { return m_ctx >= 0; }
    void changes_grad_mode() { m_plan->set_changes_grad_mode(); }

    // Attribute writes made by the capture, read back by later loads: (object value, name).
    std::map<std::pair<int, std::string>, int>& overlay() { return m_overlay; }
    // Global writes by name (entry frame's globals only).
    std::map<std::string, int>& global_overlay() { return m_global_overlay; }
    // Closure cells the capture knows: cell object -> value of its contents (-1 empty).
    std::unordered_map<PyObject*, int>& cells() { return m_cells; }
    std::unordered_map<PyObject*, int>& external_cells() { return m_external_cells; }
    // [Note: functions made in the call]: a cell a function made at replay closes over, with
    // the value it was made with; assigning the cell another value after that fails.
    // Whether a function made in the call over `cell` was built for replay (it escaped).
    bool cell_frozen(PyObject* cell) const { return m_frozen_cells.count(cell) != 0; }
    bool cell_frozen_at(PyObject* cell, int value) {
        auto it = m_frozen_cells.find(cell);
        return it != m_frozen_cells.end() && it->second != value;
    }
    void set_ending_segment() { m_ending_segment = true; }

    PyObject* entry_function() const { return m_entry_function; }
    size_t instructions = 0;

    CaptureResult finish(int return_value);
    CaptureResult finish_failed();

private:
    // Fails the capture if value `id` is a tensor whose class runs Python on every op
    // ([Note: tensors that run Python on every op]); true if it did.
    bool fail_python_tensor(int id);
    void add_type_guards(int value, PyObject* real, bool by_type);
    bool build_arg(int value, Arg& out, bool escape, int depth);
    bool guard_contents(int value, int depth);
    bool guard_array(int value);  // a numpy array given to a step: its dtype, shape, strides
    void add_step(Step step);
    void may_decline();
    void guard_set_order(int id);
    bool read_after_change(int id);
    bool undoable_write(const Step& step, const std::vector<int>& values);
    bool step_folds(const Step& step, PyObject* real_result);
    int register_input(int node, PyObject* real, bool by_type = false);
    void describe_graph(CaptureResult& r);

    PyObject* m_entry_function;  // borrowed: alive for the whole call
    std::deque<Value> m_values;  // stable addresses: a Value& survives new values
    std::unique_ptr<GuardTree> m_guards;
    std::shared_ptr<Plan> m_plan;
    std::map<std::pair<int, std::string>, int> m_overlay;
    std::map<std::string, int> m_global_overlay;
    std::unordered_map<PyObject*, int> m_cells;
    std::unordered_map<PyObject*, int> m_external_cells;  // cell -> Input value of the cell's contents
    std::unordered_map<int, int> m_node_values;  // guard node -> value (one value per path)
    std::unordered_map<PyObject*, int> m_input_objects;  // object -> its Input value (aliasing)
    std::vector<int> m_metadata_changed;  // tensors passed in changed in place (metadata_changed)
    std::vector<BreakInfo> m_breaks;
    std::unordered_map<PyCodeObject*, int> m_locations;  // code -> plan location index
    std::map<std::pair<PyCodeObject*, PyObject*>, int> m_sites;  // (code, globals) -> plan site
    struct WriteEdge {
        int target, value;
        std::string label;
    };
    std::vector<WriteEdge> m_write_edges;                   // RefGraph: writes, in order
    std::map<std::pair<int, std::string>, int> m_versions;  // (object, place) -> last version
    bool m_failed = false;
    bool m_internal = false;
    bool m_writes = false;  // an effect was recorded
    bool m_effects = false; // a step with a visible effect was recorded (writes, in-place ops
                            // on memory from outside, draws from a generator of the user's)
    bool m_draws = false;   // a step drew from the global generators (Step::draws)
    bool m_undoable_writes = false;  // a write the plan can undo was recorded (Step::undoable)
    bool m_in_try = false;
    // changed_by_call: each object, held while capturing, and the first call that reached it
    std::unordered_map<PyObject*, std::pair<py::Ref, std::string>> m_changed;
    std::unordered_map<PyObject*, std::pair<py::Ref, std::string>> m_changed_tensors;  // (changed_by_call)
    std::vector<py::Ref> m_changed_parts;  // a partial's parts, read to walk them
    // the hook ids of each tensor passed in, as the call found them (guard node -> tuple), and
    // the nodes guard_tensor_hooks guarded
    std::unordered_map<int, py::Ref> m_entry_hooks;
    std::unordered_set<int> m_hooks_guarded;
    // changed_by_call: module globals rebound by the code it ran: (globals dict, name) -> call
    std::map<std::pair<PyObject*, std::string>, std::string> m_changed_globals;
    int m_ctx = -1;                     // innermost open `with` block (Plan::contexts())
    DynamicConfig m_dynamic;
    std::vector<int> m_dynamic_nodes;   // tensor guard nodes with symbolic dims
    std::vector<int> m_dynamic_numbers; // input numbers read at replay (automatic dynamic)
    std::vector<int> m_slot_values;     // plan slot -> value recorded into it (-1: none)
    std::unordered_map<int, int> m_built_slots;  // plan slot -> the fresh container built there
    std::unordered_map<PyObject*, int> m_frozen_cells;  // cell -> its value when first built
    std::unordered_map<PyObject*, int> m_built_cells;   // cell -> the plan slot of its copy
    bool m_ending_segment = false;  // live values are being built for a graph break
    uint64_t dynamic_dims_for(int node, PyObject* tensor);
    bool arg_sym(const Arg& a);
    // The value a Slot argument holds (an op result, or a container built there); -1 for
    // inputs and constants.
    int slot_value(const Arg& a) const;
    // The value any argument reads (a slot's, or an input's), -1 for constants and unknown.
    int arg_value(const Arg& a) const;
    // [Note: steps that cannot raise on new data]
    bool raises_only_on_metadata(const Step& step);
    // Guards a leaf module's parameters, buffers and plain attributes (value `module`, passed
    // in); false when one cannot be guarded.
    bool guard_module_state(int module);
    // Guards warnings.filters by value (once per capture): a step let through may warn, and a
    // filter turned to "error" after the capture would make it raise; false: failed.
    bool guard_warning_filters();
    bool m_filters_guarded = false;
    bool arg_data_shaped(const Arg& a);
    bool arg_made_in_call(const Arg& a);
    bool made_in_call(const Step& step, PyObject* result);
    PyCodeObject* m_code = nullptr;
    int m_line = 0;
    PyCodeObject* m_site_code = nullptr;
    PyObject* m_site_globals = nullptr;
    int m_site_offset = 0;
    size_t m_graph_ops = 0;
};

}  // namespace magpy
