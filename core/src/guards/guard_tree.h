// The guard tree: accessors (how to reach a value from the frame) owning leaf checks (what must
// hold of it). Checked in C with raw C API calls on every call of a compiled function; the values
// the accessors fetch are kept for the replay plan, so inputs are fetched once per call.
// See core/guards/NOTES.md.
#pragma once

#include "python/compat.h"
#include "guards/tensor_check.h"
#include "python/py_ref.h"

#include <cstdint>
#include <string>
#include <vector>
#include <utility>

namespace magpy {

enum class AccessKind : uint8_t {
    // roots
    FrameLocal,   // argument slot `index` of the entry frame
    Global,       // key `key` in the entry frame's globals
    Builtin,      // key `key` in the entry frame's builtins
    ClosureCell,  // contents of cell `index` of the entry function's closure
    GlobalsDict,  // the entry frame's globals dict itself (target of global writes)
    Constant,     // a long-lived object held by the tree (torch's global hook dicts)
    CallResult,   // key() for a function of global state (torch.get_default_dtype)
    // steps from the parent's value
    Attr,          // getattr(parent, key)
    ModuleAttr,    // nn.Module attribute: __dict__, then _parameters/_buffers/_modules
    Item,          // parent[index] for a list or tuple (type guarded)
    DictItem,      // parent[key] for a dict (type guarded)
    FuncGlobal,    // parent.__globals__[key] (parent is a function)
    FuncClosure,   // parent.__closure__[index].cell_contents
    FuncDefault,   // parent.__defaults__[index]
    DictValueAt,   // list(parent.values())[index] (nn.Module._modules in order)
    TypeOf,        // type(parent)
    TypeLookup,    // the attribute `key` found on the class parent (no binding)
    FuncKwDefault, // parent.__kwdefaults__[key]
    DictKeys,      // tuple(parent.keys()): the keys in iteration order (a set's items)
    IterRest,      // iterator_rest(parent): a list of the items an iterator has left
    SuperLookup,   // the attribute `key` found on the classes of parent.__mro__ after the one
                   // at `index` (what super() finds; parent is a class, no binding)
    GenericAttr,   // object.__getattribute__(parent, key): past the class's own __getattribute__
};

// The items the iterator `it` has left, as a new list, without advancing it: list, tuple and
// range iterators, and zip and enumerate over those (what a resumed loop iterates: segments
// rebuild loop iterators in these forms). Null, with no error set, for any other iterator (a
// generator cannot be looked into) or one with more than `kMaxIterRest` items left.
// PRECONDITION: GIL held.
PyObject* iterator_rest(PyObject* it);
// The lists an iterator iterator_rest() can read walks (inside a zip or enumerate too), added
// to `out` (borrowed: the iterator holds them). PRECONDITION: GIL held.
void iterator_lists(PyObject* it, std::vector<PyObject*>& out, int depth = 0);

// What super() finds for `name`: the attribute in the __dict__ of the first class of
// type->__mro__ after position `after` that has it (no binding). Borrowed; null when none,
// with no error set. PRECONDITION: GIL held.
PyObject* lookup_after(PyTypeObject* type, Py_ssize_t after, PyObject* name);
constexpr Py_ssize_t kMaxIterRest = 4096;

enum class CheckKind : uint8_t {
    TypeIs, IdIs, Equals, LenEq, TensorMatch, GradMode,
    Dispatch,   // inference mode, autocast and the default dtype (DispatchState)
    SameAs,     // the same object as node `other` (two paths to one object)
    NotSameAs,  // not the same object as node `other` (an `is` test that was False)
    KeyIn,      // `key` is in this dict when `flag`, is not otherwise (a global that would
                // shadow a builtin; `k in d`)
    NoInstanceAttr,  // `key` is not in the object's __dict__ (would shadow a class attribute)
    NoAttr,     // the object has no attribute `key` (hasattr() was False, getattr's default)
    NoHooks,    // an nn.Module whose own hook dicts (forward, forward pre, backward) are empty
    TensorHooks,  // a tensor (or a module's parameters) whose backward hooks are those
                  // `value` names (tensor_hook_keys)
    CodeIs,     // a Python function with this code and these globals (a nested function or
                // lambda, made again by every call of its maker: [Note: functions by code])
    TypeVersion,  // a class not changed since (its tp_version_tag is `length`): what an answer
                  // folded from the class's slots relies on (`if obj:`, callable(obj))
};

struct TensorMeta {
    py::Ref dtype;   // torch.dtype (a singleton)
    py::Ref device;  // torch.device
    std::vector<int64_t> sizes;
    std::vector<int64_t> strides;  // only when `with_strides` (strides were read)
    int64_t storage_offset = 0;    // only when `with_strides`
    bool with_strides = false;
    bool requires_grad = false;
    TensorKey key;  // the same facts in C++ form, for the fast check
};

struct Check {
    CheckKind kind;
    py::WeakOrStrong expected;  // TypeIs: the type; IdIs: the object; CodeIs: the code
    py::Ref value;              // Equals; CodeIs: the globals dict
    Py_ssize_t length = 0;      // LenEq
    bool flag = false;          // GradMode; KeyIn: present
    DispatchState dispatch;     // Dispatch
    int other = -1;             // SameAs, NotSameAs: an earlier node
    py::Ref key;                // KeyIn, NoInstanceAttr, NoAttr
    TensorMeta tensor;          // TensorMatch
    uint32_t failures = 0;
    // NoHooks, as it last passed: the module's __dict__ (its version) and the hook dicts found
    // in it, whose sizes are then all that is read ([Note: guard fetches by dict versions])
    mutable PyObject* memo_dict = nullptr;  // compared only
    mutable uint64_t memo_version = 0;
    mutable PyObject* memo_hooks[4] = {};   // held by memo_dict while its version holds
};

// What the last fetch of a node read, when it read only dicts: the value is found again
// without a lookup while each of those dicts keeps its version ([Note: guard fetches by dict
// versions]).
struct FetchMemo {
    static constexpr int kMaxDicts = 4;
    PyObject* parent = nullptr;  // the parent value it was read from (compared only)
    PyObject* dicts[kMaxDicts] = {};
    uint64_t versions[kMaxDicts] = {};
    int count = 0;               // 0: nothing kept
    PyObject* value = nullptr;   // held by the last of `dicts` while the versions hold
    PyTypeObject* type = nullptr;  // the parent's class, whose version tag is kept too: a
    unsigned int type_tag = 0;     // property or __getitem__ added to it changes what is read
    bool ordered = false;        // an OrderedDict's n-th value: its own order kept too
    size_t order = 0;            // (py::odict_state)
    bool passed = false;         // `value` passed the node's checks (IdIs need not run again)
};

struct Accessor {
    AccessKind kind;
    int parent = -1;  // -1 for roots
    int index = 0;
    py::Ref key;         // name (str) or dict key
    std::string source;  // Python spelling, e.g. L['self'].linear.weight
    std::vector<Check> checks;
    mutable FetchMemo memo;
};

class GuardTree {
public:
    // Returns the node index; reuses an equal node if one exists.
    int add_accessor(AccessKind kind, int parent, int index, PyObject* key /*borrowed*/,
                     std::string source);
    void add_check(int node, Check check);
    void add_root_check(Check check);  // checks on no value (grad mode)
    // Nodes whose objects must be pairwise distinct objects (checked after all nodes).
    void set_distinct(std::vector<int> nodes) { m_distinct = std::move(nodes); }

    const std::vector<Accessor>& nodes() const { return m_nodes; }
    const Accessor& node(int i) const { return m_nodes[static_cast<size_t>(i)]; }
    size_t size() const { return m_nodes.size(); }
    size_t check_count() const;

    // Fast path. Fills `values` (one new reference per node, or NULL) that the caller must
    // release with release_values(). Returns false at the first failing check.
    // PRECONDITION: GIL held; `frame` is the entry frame before it runs.
    bool check(py::IFrame* frame, std::vector<PyObject*>& values) const;
    // Explains the first failure in the user's terms ("tensor L['x'] size: expected [3], got
    // [4]"); empty when every check passes.
    std::string check_verbose(py::IFrame* frame) const;
    static void release_values(std::vector<PyObject*>& values);

    // Dynamic shapes: the dims of a tensor node's check that take any size.
    void set_dynamic_dims(int node, uint64_t dims);
    uint64_t dynamic_dims(int node) const;
    // Automatic dynamic, read in one walk over the frame's values:
    // dims: per tensor node (by source) whose rank matches, the dims whose size differs from
    //   the one guarded;
    // numbers: the sources of value-guarded ints and floats that now hold another number of
    //   the same type (a running sum, a step counter).
    // PRECONDITION: GIL held; `frame` before it runs.
    struct Changes {
        std::vector<std::pair<std::string, uint64_t>> dims;
        std::vector<std::string> numbers;
    };
    Changes changes(py::IFrame* frame) const;

    // One line per check, as Python-like text (for explain() and the report).
    std::vector<std::string> describe() const;

private:
    PyObject* fetch(const Accessor& a, py::IFrame* frame, PyObject* parent) const;  // new ref
    // fetch() through the node's memo: `same` tells whether the value is the object that last
    // passed the node's checks
    PyObject* fetch_kept(const Accessor& a, py::IFrame* frame, PyObject* parent, bool& same) const;
    bool run_checks(const Accessor* a, PyObject* v, PyObject* const* values, std::string* why,
                    bool same_object = false) const;
    bool distinct_ok(PyObject* const* values, std::string* why) const;
    std::vector<Accessor> m_nodes;
    std::vector<int> m_distinct;
    std::vector<Check> m_root_checks;
};

std::string describe_check(const Check& c, const std::string& source);
bool tensor_meta_of(PyObject* t, TensorMeta& out, bool with_strides);  // false: not a tensor
bool module_has_no_hooks(PyObject* m);  // CheckKind::NoHooks
// The keys (handle ids) of a tensor's backward hooks, as a new tuple (empty: none); of an
// nn.Module, a tuple of those of its parameters and submodules in turn; null with an error set
// if they cannot be read. CheckKind::TensorHooks
PyObject* tensor_hook_keys(PyObject* t);
bool is_tensor(PyObject* o);
// `v` is the constant `expected` as far as a program can tell: floats by their bits (-0.0 is
// not 0.0, NaN is NaN), tuples, lists and slices item by item, anything else by ==.
bool same_constant(PyObject* expected, PyObject* v);

}  // namespace magpy
