// How the monitor treats a called object: record it as an op, trace into it, fold it into a
// constant, or stop (a callee with no rule is never guessed at). One table for every callee.
#pragma once

#include "python/compat.h"

#include <string>

namespace magpy {

// Prefix and suffix tests of the names the rules match.
inline bool starts_with(const std::string& s, const char* prefix) {
    return s.rfind(prefix, 0) == 0;
}
inline bool ends_with(const std::string& s, const char* suffix) {
    size_t n = std::char_traits<char>::length(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}
// An in-place op's name: one trailing `_` (add_, relu_), not a dunder (__add__).
inline bool has_inplace_suffix(const std::string& n) {
    return n.size() > 1 && n.back() == '_' && n.compare(n.size() - 2, 2, "__") != 0;
}

enum class CallKind : uint8_t {
    TorchOp,         // torch function or Tensor method: recorded in the operator graph
    LeafModule,      // built-in torch.nn module: recorded as one op
    InlineFunction,  // user Python function: traced into
    InlineModule,    // user nn.Module (or Sequential): its forward is traced into
    PureBuiltin,     // builtins/math on constants: folded to a constant
    Len,
    IsInstance,
    ListMethod,      // list.append & co
    DictMethod,      // dict.items / keys / values / get
    SetMethod,       // set.add & co, on a set of constants made in the call
    Iteration,       // zip, enumerate, reversed, map
    EagerFact,       // torch.jit.is_scripting() & co: fixed answers in eager mode
    TypeCtor,        // int(), float(), tuple(), list(), range(), slice() ...
    IO,              // input, open, breakpoint
    Print,           // print(): replayed as a step when its arguments print the same at replay
    Warn,            // warnings.warn(): replayed as a step, filed where eager filed it
                     // ([Note: effects that read the caller's frame] in monitor.cpp)
    Log,             // a Logger's debug/info/warning/error/critical/log: replayed as a step,
                     // the record made as if from the caller eager found (same note)
    AttrQuery,       // hasattr(obj, "name"), getattr(obj, "name"[, default]): a guarded lookup
    Next,            // iter(x): an iterator as a for loop makes; next(it): its next item
    Context,         // torch.no_grad() & co (TorchApi::context_types): made for a with block
    ContextExit,     // the bound __exit__ of a captured with block, called when it ends
    NamedTuple,      // a collections.namedtuple class called: a fresh tuple of its fields
    Generator,       // a generator function (a generator expression) called: its frame is
                     // traced when it is resumed ([Note: generators])
    NamedTupleMethod,  // nt._replace(**fields), nt._asdict(): fresh tuple / dict of the fields
    TypeOf,          // type(x): known for every value (guarded, or fixed by how it was made)
    ModuleMembers,   // m.parameters(), m.named_modules() & co: an iterator over guarded members
    UserClass,       // a plain class of the user's called: an object made in the call, its
                     // __init__ (`code`, null for object's) traced ([Note: objects made in the call])
    GenContext,      // a @contextlib.contextmanager function called: its generator made, its
                     // context manager a GenContext value ([Note: generator context managers])
    GenContextExit,  // that context manager's __exit__(None, None, None): the generator runs
                     // on to its end, traced
    EnvRead,         // os.environ.get(name[, default]), os.getenv(...): the variable's value
                     // guarded in os.environ._data ([Note: environment reads] in monitor.cpp)
    ObjectSlot,      // a slot of object, dict or OrderedDict called on an object made in the
                     // call (`super().__setitem__(k, v)` in its class's own __setitem__):
                     // the plain store or lookup ([Note: objects made in the call])
    Super,           // super() / super(cls, obj): a method of a base class called next ([Note:
                     // super] in monitor.cpp)
    MakePartial,     // functools.partial(func, ...): a partial made in the call ([Note:
                     // partials] in monitor.cpp)
    RandomDraw,      // a draw from Python's random (random.random(), and random.uniform,
                     // randint & co through it): replayed in order, a number known at run time
    ClockRead,       // time.time(), perf_counter() & co: read again at replay, a number known
                     // at run time (timing code: `dt = time.time() - t0`)
    AutogradApply,   // MyFunction.apply(...) of a torch.autograd.Function: one step at replay
    CachedCall,      // a functools.lru_cache / cache wrapper: called at replay, where its cache
                     // decides what runs, as in eager; what it returns flows on
    Getter,          // an operator.itemgetter / attrgetter object called: the subscripts or
                     // attribute reads it stands for
    CountElements,   // collections' _count_elements(counter, items), which Counter(items)
                     // and counter.update(items) call: the counts, of constant items
    DeepCopy,        // copy.deepcopy(x) of plain data (lists, tuples, dicts and sets of
                     // numbers and strings): fresh containers of the same items, not traced
    MakeModule,      // a built-in torch.nn module class called (`CrossEntropyLoss()` in a
                     // forward): made again at replay, then called as a LeafModule
    Unsupported,
};

struct CalleeInfo {
    CallKind kind = CallKind::Unsupported;
    std::string name;                 // for messages and the plan
    std::string op;                   // the bare name (`unique` for torch.unique), for rules
    PyCodeObject* code = nullptr;     // Inline*: the code expected to run (borrowed)
    bool bound_self = false;          // a bound tensor method: the tensor is not in the args
    bool process_fact = false;        // EagerFact: the same answer for the whole process
    // TorchOp: library code that changes Python state it reaches from its arguments
    // (`opt.step()`, `sched.step()`): [Note: library calls that change state] in capture.cpp
    bool changes_state = false;
    // TorchOp: an operator with a kernel registered from Python (torch.library), which runs
    // Python the capture does not follow ([Note: code that ran inside a call] in monitor.cpp)
    bool python_kernel = false;
};

// functools.partial (borrowed; null if functools cannot be imported). PRECONDITION: GIL held.
PyTypeObject* functools_partial_type();
// A callable of no arguments that returns what the unbounded functools.lru_cache wrapper `fn`
// holds for positional arguments `args` (a hit of the wrapper's: it counts in cache_info()),
// and raises KeyError when it holds nothing for them
// ([Note: cached functions]); null with an error set when its cache cannot be read, or holds
// nothing for them now. PRECONDITION: GIL held; `args` a tuple.
PyObject* cached_result_lookup(PyObject* fn, PyObject* args, bool typed);

// PRECONDITION: GIL held. `callable` borrowed.
CalleeInfo classify_callee(PyObject* callable);

// The class `module.name`, imported (a new reference kept for the process's life; null, with
// no error set, when it cannot be). PRECONDITION: GIL held.
PyTypeObject* imported_type(const char* module, const char* name);

// A recorded op that may run Python the capture does not trace: backward() and
// torch.autograd.grad (hooks, custom Functions), and the calls that change state (an
// optimizer's step(closure)). [Note: code that ran inside a call] in capture/monitor.cpp
inline bool runs_hidden_code(const CalleeInfo& c) {
    return c.kind == CallKind::TorchOp &&
           (c.changes_state || c.op == "backward" ||
            (c.op == "grad" && c.name.find("autograd") != std::string::npos));
}

// The level a Logger method logs at, by its qualified name (`Logger.info`: 20); 0 for
// `Logger.log`, whose level is its first argument; -1 for anything else.
int logger_level(const std::string& qualname);

// For a namedtuple class: the index of field `name`, else -1 (also for other types).
int namedtuple_field(PyTypeObject* type, PyObject* name);
// Whether `type` is a collections.namedtuple class (a tuple subclass with _fields and _make).
bool is_namedtuple_type(PyTypeObject* type);
// Whether instances of `type` are attribute bags the capture can follow ([Note: objects made
// in the call] in monitor.cpp): a Python class whose only C base is object, dict or
// OrderedDict (returned; null: not followed), made by that base's __new__, attributes in
// __dict__ or slots through the generic getattr, set generically or by a __setattr__ in
// Python, no __del__.
PyTypeObject* user_class_base(PyTypeObject* type);
// The C class whose layout instances of `type` have (dict for a dict subclass, object for a
// plain class): the first base that is not a Python class. Borrowed.
PyTypeObject* layout_base(PyTypeObject* type);
bool is_plain_user_class(PyTypeObject* type);

// Whether calling `callable` with `nargs` positional arguments reads the frame that calls it:
// `locals()`, `vars()`, `dir()`, `globals()`, `eval`/`exec`, zero-argument `super()`,
// `sys._getframe`, `warnings.warn` (its stacklevel), and the Python functions of `logging`,
// `inspect`, `traceback`, `warnings`, `pdb` (they look up their caller's file and line). Such
// a call must run in a frame of the user's code, never from a replay plan (warnings.warn and
// Logger methods are replayed through magpy/_effects.py instead where they can be: Warn, Log).
// `callable` borrowed; nargs is SIZE_MAX when unknown (`f(*args)`).
// PRECONDITION: GIL held.
bool reads_caller_frame(PyObject* callable, size_t nargs);

// Tensor methods and torch functions that answer from metadata only (shape, dtype...).
// `nargs` counts the tensor itself for methods.
bool is_metadata_query(const std::string& op, size_t nargs);
// torch functions that read global state (the default dtype ...): guarded by calling them.
bool is_global_state_query(const std::string& op);
bool reads_strides(const std::string& name);
// Torch ops (by name, without a trailing `_`) that raise only on
// what the guards fix (shapes, dtypes, devices) and constant arguments, never on the values in
// a tensor: pointwise float maths, matmul and convolutions, norms, reductions, views with
// constant sizes. Not index ops (gather, embedding, nll_loss: an index out of range), integer
// division, pow or remainder (by zero, to a negative power), linear algebra that checks values
// (cholesky, inverse), nor ops with data-dependent shapes. ([Note: steps that cannot raise on
// new data] in capture.cpp)
bool op_raises_only_on_metadata(const std::string& op);
// torch.nn's own leaf modules of that kind (Linear, convolutions, activations, norms, pooling),
// exact types: they raise only on their input's and their own tensors' metadata and their
// plain attributes, which the capture then guards (Capture::guard_module_state).
bool module_raises_only_on_metadata(PyObject* module);
// Ops whose output shape depends on tensor data.
bool has_data_dependent_shape(const std::string& op, size_t nargs);
// A recorded op that changes state the caller can see: in-place (`add_`, `out=`,
// `inplace=True`), random (draws from the RNG), or a built-in module that updates its buffers
// in training (batch-norm running statistics) or draws (dropout). `callable` is the function or
// module; `kwnames`/`kwvalues` its keyword arguments (may be null). Conservative: unknown is no.
bool op_has_effects(const CalleeInfo& c, PyObject* callable, PyObject* kwnames,
                    PyObject* const* kwvalues);
// Which positional argument (0: the first after the callee) an op with effects changes in place
// when that is all it does besides drawing random numbers (op_draws): `t.add_(u)`,
// `torch.relu_(t)`, `F.relu(t, inplace=True)`, `t.normal_()`, a leaf module with inplace=True.
// -1 when it updates module state, writes an `out=` tensor, or is not an in-place op.
int op_inplace_target(const CalleeInfo& c, PyObject* callable, PyObject* kwnames,
                      PyObject* const* kwvalues, size_t npos);
// A recorded op that draws from the global generators (torch's default ones, the `random`
// module's) and changes nothing else, or nothing but its in-place tensor (op_inplace_target):
// torch.randn, F.dropout, t.normal_(), a training Dropout module, random.random(). Not one
// given a generator= or out=, nor a module that also updates its buffers (compiling backends
// keep such ops out of graphs; a plan that gives up after one puts the generators back).
bool leaf_module_ignores_training(PyObject* module);
bool op_draws(const CalleeInfo& c, PyObject* callable, PyObject* kwnames,
              PyObject* const* kwvalues);

// Tensor attributes that are metadata (x.shape) and those that are ops (x.T).
bool is_metadata_attribute(const char* name);
bool is_op_attribute(const char* name);

}  // namespace magpy
