// The replay plan (the MagPy paper's "mock code"): what runs on a cache hit instead of the
// frame. Inputs come from the guard tree's fetched values; steps run in program order (tensor
// ops, Python-visible writes); the result is rebuilt from the slots. It is data, interpreted in
// C++, and renders itself as readable Python for the notebook.
#pragma once

#include "python/py_ref.h"

#include <memory>
#include <string>
#include <vector>

namespace magpy {

struct Arg {
    enum class Kind : uint8_t { Input, Const, Slot };
    Kind kind = Kind::Const;
    int index = -1;  // Input: guard node; Slot: plan slot
    py::Ref constant;
    static Arg input(int node) { return Arg{Kind::Input, node, {}}; }
    static Arg slot(int s) { return Arg{Kind::Slot, s, {}}; }
    static Arg value(PyObject* o) { return Arg{Kind::Const, -1, py::Ref::borrow(o)}; }
};

enum class StepKind : uint8_t {
    Call,        // out = args[0](*args[1:n-k], **dict(zip(kwnames, args[n-k:])))
    Binary,      // out = args[0] <op> args[1]   (op: NB_* code)
    Compare,     // out = args[0] <op> args[1]   (op: Py_LT ...)
    Unary,       // out = <op> args[0]           (op: 0 neg, 1 pos, 2 invert, 3 not)
    GetItem,     // out = args[0][args[1]]
    GetAttr,     // out = getattr(args[0], name)
    BuildList,   // out = [args...]
    BuildTuple,  // out = (args...)
    BuildDict,   // out = {args[0]: args[1], ...}, or name() filled item by item (OrderedDict)
    BuildSlice,  // out = slice(*args)
    SetAttr,     // setattr(args[0], name, args[1])
    SetItem,     // args[0][args[1]] = args[2]
    CallEx,      // out = args[0](*args[1], **args[2])   (args[2] may be None)
    Check,       // args[0] == args[1] (op: CheckOp), or the plan gives up: a relation between
                 // sizes the capture relied on ([Note: dynamic shapes]), or the truth of a
                 // tensor a branch to a `raise` tested ([Note: branches to a raise])
};

// A branch the capture followed on a guess ([Note: speculated branches] in monitor.cpp). Its
// Check step marks it when the guess fails at replay; later captures break there instead.
struct Speculation {
    std::string what;       // what went otherwise and where, for recompile reasons
    bool failed = false;
    bool reported = false;  // the failure is in a recompile reason
};

// What a Check step compares with args[1].
enum CheckOp : int { kCheckEqual = 0, kCheckLength = 1, kCheckTruth = 2, kCheckRank = 3 };

// Why a plan gave up before any visible effect (Plan::run returned NULL with no error set).
enum class Declined : uint8_t {
    No,
    RunEagerly,  // a step inside the user's try block raised: the handler must run
    Recapture,   // a Check failed: these inputs need a capture of their own
    Warned,      // a step gave a warning where the plan could still decline ([Note: warnings
                 // before a decline])
};

struct Step {
    StepKind kind = StepKind::Call;
    int op = 0;
    int out = -1;  // slot written, or -1
    std::vector<Arg> args;
    py::Ref kwnames;  // tuple of str for Call, or null
    py::Ref name;     // GetAttr / SetAttr
    bool graph_op = false;  // part of the operator graph (tensor computation)
    bool effect = false;    // changes state the caller can see: a write, an in-place op, the RNG
    bool draws = false;     // draws from the global generators, and changes nothing else but
                            // args[mutates] (op_draws)
    bool undoable = false;  // a SetAttr or SetItem whose old state the plan can put back when
                            // it declines: it changes dict entries only ([Note: writes undone])
    bool in_try = false;    // an exception here would reach a handler of the captured code
    // What the step produced during the capture (compiling backends only take tensor results
    // into a graph): 0 anything else, 1 a tensor, 2 a tuple or list of tensors.
    uint8_t result_kind = 0;
    // An in-place tensor op: the index in `args` of the tensor it changes, when changing it is
    // the step's only effect besides drawing (`draws`), not module state; -1 otherwise.
    int8_t mutates = -1;
    // The innermost `with` block open while this step runs (Plan::contexts()), or -1. A step
    // that raises at replay leaves through that block's __exit__ and its parents'.
    int16_t ctx = -1;
    std::shared_ptr<Speculation> speculation;  // Check: the guess it verifies, or null
    int line = 0;           // source line of the user's code, for messages
    int loc = -1;           // Plan::location(): the file and function of that line
    bool frame_added = false;  // a failure already has the user's frame (a compiled region,
                               // whose own steps add it): loc only names the frame for an
                               // error that a block's __exit__ raises over it
    // The frame that ran it, library code included ([Note: site frames]): Plan::sites(), or
    // -1, and its line there.
    int site = -1;
    int site_line = 0;
};

// A captured `with` block ([Note: with blocks]): the slot holding its bound __exit__, and the
// block it sits in (-1 for none).
struct PlanContext {
    int exit_slot = -1;
    int parent = -1;
    bool inherited = false;  // entered before the plan (a resumed frame's open block): a plan
                             // that declines leaves it to the frame that runs again
    bool user = false;       // a context manager class of the user's: its __enter__ ran as
                             // steps, which a declining plan undoes or never passed, so only an
                             // exception calls its __exit__ ([Note: user context managers])
};

struct SourceLocation {
    std::string filename;
    std::string function;
};

class Plan {
public:
    int add_slot() { return m_num_slots++; }
    void add_step(Step s) { m_steps.push_back(std::move(s)); }
    void set_result(Arg a) { m_result = std::move(a); }
    int add_location(SourceLocation loc) {
        m_locations.push_back(std::move(loc));
        return static_cast<int>(m_locations.size() - 1);
    }
    // [Note: site frames] py::new_site_frame for a frame of the user's code.
    int add_site(PyObject* frame) {
        m_sites.push_back(py::Ref::borrow(frame));
        return static_cast<int>(m_sites.size() - 1);
    }
    const std::vector<py::Ref>& sites() const { return m_sites; }
    int add_context(PlanContext c) {
        m_contexts.push_back(c);
        return static_cast<int>(m_contexts.size() - 1);
    }
    const std::vector<PlanContext>& contexts() const { return m_contexts; }
    // The plan changes grad mode (a `with torch.no_grad()` block, set_grad_enabled): when it
    // declines, grad mode goes back to what it was when the run started.
    void set_changes_grad_mode() { m_changes_grad = true; }
    // The plan may give up after drawing random numbers (a Check, or a step inside try, after a
    // draw): it saves the generators' state on entry and puts it back when it declines, so the
    // frame that runs again draws what eager draws.
    void set_restores_generators() { m_restores_generators = true; }
    // The plan may give up after an undoable write: it notes the old dict entries before each
    // such write and puts them back when it declines ([Note: writes undone]).
    void set_undoes_writes() { m_undoes_writes = true; }
    // Input names for rendering, one per guard node (the accessor's source text).
    void set_input_names(std::vector<std::string> names) { m_input_names = std::move(names); }

    int num_slots() const { return m_num_slots; }
    const std::vector<Step>& steps() const { return m_steps; }
    const std::vector<SourceLocation>& locations() const { return m_locations; }
    // Backends that rewrite a plan (replace stretches of steps by a compiled graph).
    void set_steps(std::vector<Step> steps) {
        m_steps = std::move(steps);
        m_release.clear();
    }
    const Arg& result() const { return m_result; }
    size_t graph_op_count() const;

    // Runs the plan. `inputs` are the guard tree's fetched values (borrowed). Returns a new
    // reference, or NULL with the Python error raised by the failing step; its traceback then
    // ends at the user's line that step came from, as if the function had run.
    // Returns NULL with NO error set, and `declined` saying why, when the plan gives up
    // before anything visible has happened (the capture makes sure of that): a step inside
    // the user's try block raised an Exception, so the frame must run eagerly for its handler
    // ([Note: replay errors inside try]); or a Check failed ([Note: dynamic shapes]).
    // PRECONDITION: GIL held.
    PyObject* run(PyObject* const* inputs, Declined& declined) const;

    // Readable Python: "def replay(L, G):\n    v0 = torch.add(L['x'], 1)\n ...".
    // `filename`: the compiled function's file; a step from another file (a function of another
    // module or notebook cell, traced into) names its function in its `# line` comment.
    std::string render(const std::string& fn_name, const std::string& filename = "") const;
    std::string render_arg(const Arg& a) const;

private:
    PyObject* add_user_frame(const Step& s) const;  // always NULL
    // Per step: the slots read there for the last time (freed after it). Made on first run.
    const std::vector<std::vector<int>>& releases() const;
    mutable std::vector<std::vector<int>> m_release;
    // The last step that may decline (inside try, or a Check), or -1. Made on first run.
    int last_declining() const;
    mutable int m_last_declining = -2;
    // What a run that declines puts back as it found it (Plan::run): grad mode, the
    // generators' state ([Note: draws before a check]), the entries undoable writes changed.
    struct OnEntry {
        py::Ref grad;
        py::Ref generators;  // a tuple of the states saved, or null
        struct Entry {
            py::Ref map, key, old;  // old: null when the key was absent
        };
        std::vector<Entry> writes;  // in the order written
        bool save(const Plan& plan);  // false with a Python error set
        // Before an undoable write: the entries it may change. False with an error set.
        bool note_write(const Step& s, PyObject* target, PyObject* key);
        void restore() const;
    };
    PyObject* fail(const Step& s, Declined& declined, PyObject** slots,
                   const OnEntry& entry) const;  // always NULL
    // Leaves the `with` blocks open at a failing step, innermost first, as the unwinding
    // frame would: __exit__ gets the pending exception (or None when the plan declines).
    void unwind(int ctx, PyObject** slots, bool declined) const;
    int m_num_slots = 0;
    std::vector<Step> m_steps;
    Arg m_result;
    std::vector<std::string> m_input_names;
    std::vector<SourceLocation> m_locations;
    std::vector<py::Ref> m_sites;
    std::vector<PlanContext> m_contexts;
    bool m_changes_grad = false;
    bool m_restores_generators = false;
    bool m_undoes_writes = false;
};

// Over a plan's run: the frame that stands for the one that ran the current step at capture,
// linked as the thread's innermost frame ([Note: site frames] in plan.cpp).
class SiteLink {
public:
    SiteLink(PyThreadState* ts, const std::vector<py::Ref>& sites) : m_ts(ts), m_sites(sites) {}
    ~SiteLink() { unlink(); }
    SiteLink(const SiteLink&) = delete;
    SiteLink& operator=(const SiteLink&) = delete;
    // Before step `s` runs: its site, at its line (none for a step without one).
    void at(const Step& s);

private:
    void unlink();
    PyThreadState* m_ts;
    const std::vector<py::Ref>& m_sites;
    PyObject* m_linked = nullptr;
    int m_site = -1;
    py::Ref m_copy;  // when the plan's own frame was linked already
};

// Python spelling of a Binary / Compare step's operator ("+", "<=").
const char* binary_symbol(int op);
const char* compare_symbol(int op);

// The callable's display name, e.g. torch.add, torch.Tensor.relu, F.linear.
std::string callable_name(PyObject* f);

}  // namespace magpy
