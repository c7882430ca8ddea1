// Graph breaks that resume. A capture that stops at a break site ends a segment: its plan
// returns the frame's live state (locals, cells, value stack) as one tuple, after running the
// break instruction itself as a plan step when it is a call or an operator. The Continuation
// says where the frame goes on: a resume function made from the original code (bytecode in
// magpy/_resume.py) that rebuilds that state and jumps to the next instruction. It is a frame
// like any other, so the hook captures and caches it by its own code object.
// See core/capture/NOTES.md, [Note: graph breaks that resume].
#pragma once

#include "python/compat.h"
#include "python/py_ref.h"

#include <string>
#include <utility>
#include <vector>

namespace magpy {

// [Note: inner functions at a break]
// A function made in the frame (a nested def, a lambda) closes over the frame's cells. The
// resume code makes new cells, so handing it the old function would split them: a write
// through `nonlocal` in one would not be seen by the other. Nor can a replay plan make the
// function, which never existed at replay. So the resume code's prologue makes it again, with
// MAKE_FUNCTION over its own new cells, from the same code, defaults, keyword defaults and
// annotations, and stores it wherever the frame held it (locals, stack entries, cells). Its
// defaults are live-state items after the cells; its code is a constant of the resumed code.
// A function that closes over other cells, or that has attributes of its own, or that is also
// held anywhere else (a list, an object) is not rebuilt: the state then cannot be rebuilt and
// the call runs eagerly after the break, as before.
struct InnerFunction {
    py::Ref code;           // its code (a constant of the resumed code)
    py::Ref annotations;    // as MAKE_FUNCTION takes them (names and values in a tuple), or null
    bool defaults = false;  // its defaults (a tuple), then its keyword defaults (a dict), are
    bool kwdefaults = false;  // live-state items after the cells, in order of the functions
    // Where the frame holds it, in the live-state layout: 'v' a co_varnames index, 's' a
    // non-NULL stack entry (bottom first), 'c' a cell that is not an argument (in order).
    std::vector<std::pair<char, int>> targets;

    // Records that item `live_index` of a live state [nvar varnames | nstack stack entries |
    // cells] holds it.
    void held_at(size_t live_index, size_t nvar, size_t nstack);
};

// The rebuild of `fn` if it is a function made in `frame` (code `code`, resuming `origin`):
// its closure is made only of the frame's own cells and free variables, and its code is a
// constant of `origin`. `made_here`: the caller knows it was made in the frame (a capture's
// MAKE_FUNCTION), so it is rebuilt even with no closure; otherwise a function that closes over
// none of the frame's cells is not this function's business. Returns false with `why` when it
// must be rebuilt but cannot be; false with `why` empty when it need not be.
// PRECONDITION: GIL held; `fn` borrowed.
bool inner_function(PyObject* fn, py::IFrame* frame, PyCodeObject* code, PyCodeObject* origin,
                    bool made_here, InnerFunction& out, std::string& why);

struct Continuation {
    enum class Kind : uint8_t {
        Next,     // go on at `next` (the break instruction ran as the plan's last step)
        Branch,   // the stack's top decides: jump to `jump` when `test` holds, else `next`
        ForIter,  // next(top): the item is pushed and the frame goes on at `next`; when the
                  // iterator is exhausted it is popped and the frame goes on at `jump`
    };
    enum class Test : uint8_t { IsFalse, IsTrue, IsNone, IsNotNone };
    Kind kind = Kind::Next;
    Test test = Test::IsFalse;
    bool pop_on_jump = true;  // false for JUMP_IF_*_OR_POP, which keeps the value
    // The frame goes on as plain Python (no capture, no more segments) at `next`, which is
    // the break instruction itself: a call that reads the frame calling it (`locals()`,
    // zero-argument `super()`, logging's caller lookup) must run in a frame of the user's
    // code. The resume code hides its own arguments, so the frame holds what the original
    // did. See [Note: calls that read their caller's frame] in capture/segment.cpp.
    bool eager = false;
    int next = 0;             // offsets in code units, in the original code
    int jump = -1;
    // The live-state tuple: co_varnames (None where unbound), the non-NULL stack entries
    // (bottom first), then the contents of the cells that are not arguments.
    int nvar = 0;
    std::vector<int> unbound;       // fast-local indices with no value (varnames and cells)
    std::vector<bool> stack_nulls;  // one per stack entry, bottom first
    std::vector<bool> computed;     // one per live-state item: computed from tensor data
    std::vector<InnerFunction> functions;  // remade by the resume code (see above)
    PyCodeObject* origin = nullptr; // borrowed: the entry holding this lives no longer
    int line = 0;                   // the break's line, for reports
    // The resume code for each way on (0: `next`, 1: `jump`), found on first use. Borrowed:
    // the origin's cache keeps it, and the origin outlives the entry holding this.
    mutable PyCodeObject* resolved[2] = {nullptr, nullptr};
};

// The resume function that continues the segment, and its positional arguments, from the
// plan's result (`live`, a tuple). Branch and ForIter decide here (calling bool() / next() on
// the stack's top, as the instruction would). `frame_function` gives globals and closure.
// Returns false with a Python error set (a raising bool() or next(), or no resume code).
// PRECONDITION: GIL held.
// `launcher`: for an eager continuation, the engine's bridge launcher ([Note: bridges] in
// magpy/_resume.py); null: none.
bool prepare_resume(const Continuation& c, PyObject* live, PyObject* frame_function,
                    PyObject* launcher, py::Ref& resume_fn, std::vector<py::Ref>& args);

// A function running `code` with the globals and closure of `frame_function` (the function
// whose frame it continues). Null with a Python error set. PRECONDITION: GIL held.
py::Ref resume_function(PyCodeObject* code, PyObject* frame_function);

// The resume code continuing `origin` at `target` with this state layout (see magpy/_resume.py),
// made once per layout and kept by the origin's cache (so its own cache of entries is shared by
// every segment that ends there). `eager`: the code hides its arguments (Continuation::eager),
// and is a bridge through `launcher` where the statement allows. Borrowed; NULL with a Python
// error set. PRECONDITION: GIL held.
// `functions`: the inner functions it remakes ([Note: inner functions at a break]); a bridge is
// not made for a layout with any.
PyCodeObject* resume_code(PyCodeObject* origin, int target, const std::vector<bool>& nulls,
                          const std::vector<int>& unbound, bool eager, PyObject* launcher,
                          const std::vector<InnerFunction>& functions = {});

}  // namespace magpy
