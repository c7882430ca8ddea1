// The one place that knows CPython's private layouts: frames, the eval-frame hook, tracing and
// bytecode decoding. Everything else in core/ goes through these accessors, so the next Python
// version is a change to this file (and compat_opcode.c) only.
#pragma once

#include <Python.h>
#include <frameobject.h>
#include <opcode.h>

#define MAGPY_IS_PYTHON_311 (PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000)

#if PY_VERSION_HEX >= 0x030C0000
#error "magpy: check the frame layout, the eval-frame hook (frames are cleared by the evaluator in 3.12) and sys.monitoring before building for Python 3.12"
#elif PY_VERSION_HEX < 0x030B0000
#error "magpy needs CPython 3.11"
#endif

#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE

extern "C" {
// Copies of CPython's _PyOpcode_Deopt / _PyOpcode_Caches tables (not exported by libpython);
// defined in compat_opcode.c, which can include the C99 header that C++ cannot.
extern const unsigned char* const magpy_opcode_deopt;
extern const unsigned char* const magpy_opcode_caches;
}

namespace magpy::py {

using IFrame = _PyInterpreterFrame;
using EvalFrameFn = _PyFrameEvalFunction;

// Local kinds (CPython's CO_FAST_* flags, private in pycore_code.h).
constexpr unsigned char kLocalKindArg = 0x20;
constexpr unsigned char kLocalKindCell = 0x40;
constexpr unsigned char kLocalKindFree = 0x80;

// All accessors take borrowed pointers and return borrowed references.
inline PyCodeObject* frame_code(IFrame* f) { return f->f_code; }
inline PyObject* frame_function(IFrame* f) { return reinterpret_cast<PyObject*>(f->f_func); }
inline PyObject* frame_globals(IFrame* f) { return f->f_globals; }
inline PyObject* frame_builtins(IFrame* f) { return f->f_builtins; }
inline PyObject* frame_local(IFrame* f, int i) { return f->localsplus[i]; }
// The frame that was running when `f` was entered (C calls in between make no frames).
inline IFrame* frame_previous(IFrame* f) { return f->previous; }
// The generator (or coroutine) object whose frame `f` is, or null for a function's frame.
inline PyObject* frame_generator(IFrame* f) {
    return f->owner == FRAME_OWNED_BY_GENERATOR
               ? reinterpret_cast<PyObject*>(_PyFrame_GetGenerator(f))
               : nullptr;
}
inline int code_nlocalsplus(PyCodeObject* co) { return co->co_nlocalsplus; }
inline PyObject* code_localsplus_name(PyCodeObject* co, int i) {
    return PyTuple_GET_ITEM(co->co_localsplusnames, i);
}
inline unsigned char code_local_kind(PyCodeObject* co, int i) {
    return static_cast<unsigned char>(PyBytes_AS_STRING(co->co_localspluskinds)[i]);
}
// A local's value, read through its cell when the code made it one (MAKE_CELL has run).
inline PyObject* frame_local_value(IFrame* f, PyCodeObject* co, int i) {
    PyObject* o = f->localsplus[i];
    if (o && (code_local_kind(co, i) & kLocalKindCell)) o = PyCell_GET(o);
    return o;
}
// Whether instances of `type` keep their attributes in a __dict__ (a managed one from 3.11 on).
inline bool has_instance_dict(PyTypeObject* type) {
    return (type->tp_flags & Py_TPFLAGS_MANAGED_DICT) || type->tp_dictoffset != 0;
}
inline PyObject* code_const(PyCodeObject* co, int i) { return PyTuple_GET_ITEM(co->co_consts, i); }
inline PyObject* code_name(PyCodeObject* co, int i) { return PyTuple_GET_ITEM(co->co_names, i); }

// PRECONDITION: called from a trace callback, where CPython has saved the stack pointer.
inline int frame_stack_depth(IFrame* f) { return f->stacktop - f->f_code->co_nlocalsplus; }
// i = 0 is the top of the stack. May be NULL (3.11 pushes NULL before some callables).
inline PyObject* frame_stack_peek(IFrame* f, int i) { return f->localsplus[f->stacktop - 1 - i]; }

inline IFrame* frame_of(PyFrameObject* fo) { return fo->f_frame; }
inline void frame_set_trace_opcodes(PyFrameObject* fo, bool on) {
    fo->f_trace_opcodes = on ? 1 : 0;
    fo->f_trace_lines = 0;
}

// Generators, coroutines and async generators are never captured (their frames outlive calls).
inline bool code_is_plain_function(PyCodeObject* co) {
    return (co->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR |
                            CO_ITERABLE_COROUTINE)) == 0;
}

struct Instruction {
    int offset = 0;  // in code units, of the instruction itself (after any EXTENDED_ARG)
    int opcode = 0;  // de-specialised opcode
    int oparg = 0;   // with EXTENDED_ARG prefixes applied
};

// The instruction about to run in a frame seen by an opcode trace event. In 3.11 the instruction
// after an EXTENDED_ARG runs without its own event, so the prefix is decoded here.
inline Instruction frame_current_instruction(IFrame* f) {
    const _Py_CODEUNIT* first = _PyCode_CODE(f->f_code);
    const _Py_CODEUNIT* p = f->prev_instr;
    Instruction ins;
    int oparg = 0;
    int op = magpy_opcode_deopt[_Py_OPCODE(*p)];
    while (op == EXTENDED_ARG) {
        oparg = (oparg | _Py_OPARG(*p)) << 8;
        ++p;
        op = magpy_opcode_deopt[_Py_OPCODE(*p)];
    }
    ins.opcode = op;
    ins.oparg = oparg | _Py_OPARG(*p);
    ins.offset = static_cast<int>(p - first);
    return ins;
}

// Code units taken by an instruction's inline caches.
inline int instruction_caches(int opcode) { return magpy_opcode_caches[opcode]; }

// Where a jump goes, in code units (3.11: every jump is relative to the next instruction).
inline int jump_target(const Instruction& ins) {
    int next = ins.offset + 1 + instruction_caches(ins.opcode);
    switch (ins.opcode) {
    case POP_JUMP_BACKWARD_IF_TRUE: case POP_JUMP_BACKWARD_IF_FALSE:
    case POP_JUMP_BACKWARD_IF_NONE: case POP_JUMP_BACKWARD_IF_NOT_NONE:
    case JUMP_BACKWARD: case JUMP_BACKWARD_NO_INTERRUPT:
        return next - ins.oparg;
    default:
        return next + ins.oparg;  // FOR_ITER: where an exhausted iterator goes (popped)
    }
}

// The instruction at `offset` (code units, its first EXTENDED_ARG prefix if it has any), and the
// offset of the one after it.
inline Instruction code_instruction_at(PyCodeObject* co, int offset) {
    const _Py_CODEUNIT* code = _PyCode_CODE(co);
    Instruction ins;
    int oparg = 0;
    int op = magpy_opcode_deopt[_Py_OPCODE(code[offset])];
    while (op == EXTENDED_ARG && offset + 1 < Py_SIZE(co)) {
        oparg = (oparg | _Py_OPARG(code[offset])) << 8;
        op = magpy_opcode_deopt[_Py_OPCODE(code[++offset])];
    }
    ins.opcode = op;
    ins.oparg = oparg | _Py_OPARG(code[offset]);
    ins.offset = offset;
    return ins;
}
inline int next_offset(const Instruction& ins) {
    return ins.offset + 1 + instruction_caches(ins.opcode);
}

// Whether the code from `offset` runs straight (no jump, loop, return or yield) into a `raise`
// of an exception that no handler of this frame catches: the side of `if not ok: raise ...`
// or of an `assert` that fails. At most `limit` instructions are looked at.
inline bool code_runs_into_raise(PyCodeObject* co, int offset, int limit = 256);

// Where an exception at `offset` (code units) goes in this frame: the handler's first
// instruction, the stack depth it unwinds to, and whether the raising offset is pushed first.
struct Handler {
    int target = -1;
    int depth = 0;
    bool lasti = false;
};

// The 3.11 exception table: varint entries (start, size, target, depth << 1 | lasti).
inline Handler code_handler(PyCodeObject* co, int offset) {
    const unsigned char* p =
        reinterpret_cast<const unsigned char*>(PyBytes_AS_STRING(co->co_exceptiontable));
    const unsigned char* end = p + PyBytes_GET_SIZE(co->co_exceptiontable);
    auto varint = [&]() {
        int b = *p++;
        int v = b & 63;
        while ((b & 64) && p < end) {
            b = *p++;
            v = (v << 6) | (b & 63);
        }
        return v;
    };
    while (p < end) {
        int start = varint();
        int size = varint();
        int target = varint();
        int depth_lasti = varint();
        if (offset >= start && offset < start + size)
            return Handler{target, depth_lasti >> 1, (depth_lasti & 1) != 0};
    }
    return Handler{};
}

inline int code_handler_of(PyCodeObject* co, int offset) { return code_handler(co, offset).target; }

// True when an exception at `offset` (code units) has a handler in this frame.
inline bool code_offset_in_handler(PyCodeObject* co, int offset) {
    return code_handler_of(co, offset) >= 0;
}

// True when an exception at `offset` reaches code of the user's that handles it: an except or
// finally clause. The cleanup of a with block (PUSH_EXC_INFO, WITH_EXCEPT_START ... RERAISE 2)
// and the cleanup that pops the exception state (COPY 3, POP_EXCEPT, RERAISE 1) pass the
// exception on, so the search goes on from their RERAISE. A with block's __exit__ is then the
// only code on the way, which a replay plan runs itself ([Note: with blocks]).
inline bool code_offset_reaches_user_handler(PyCodeObject* co, int offset) {
    const _Py_CODEUNIT* code = _PyCode_CODE(co);
    Py_ssize_t n = Py_SIZE(co);
    auto op_at = [&](int i) { return i >= 0 && i < n ? _Py_OPCODE(code[i]) : -1; };
    for (int hops = 0; hops < 64; ++hops) {
        int target = code_handler_of(co, offset);
        if (target < 0) return false;
        if (op_at(target) == PUSH_EXC_INFO && op_at(target + 1) == WITH_EXCEPT_START &&
            op_at(target + 3) == RERAISE) {
            offset = target + 3;
        } else if (op_at(target) == COPY && op_at(target + 1) == POP_EXCEPT &&
                   op_at(target + 2) == RERAISE) {
            offset = target + 2;
        } else {
            return true;
        }
    }
    return true;
}

inline bool code_runs_into_raise(PyCodeObject* co, int offset, int limit) {
    for (int k = 0; k < limit && offset >= 0 && offset < Py_SIZE(co); ++k) {
        Instruction ins = code_instruction_at(co, offset);
        switch (ins.opcode) {
        case RAISE_VARARGS:
            return ins.oparg >= 1 && !code_offset_reaches_user_handler(co, ins.offset);
        case JUMP_FORWARD: case JUMP_BACKWARD: case JUMP_BACKWARD_NO_INTERRUPT:
        case POP_JUMP_FORWARD_IF_TRUE: case POP_JUMP_FORWARD_IF_FALSE:
        case POP_JUMP_BACKWARD_IF_TRUE: case POP_JUMP_BACKWARD_IF_FALSE:
        case POP_JUMP_FORWARD_IF_NONE: case POP_JUMP_FORWARD_IF_NOT_NONE:
        case POP_JUMP_BACKWARD_IF_NONE: case POP_JUMP_BACKWARD_IF_NOT_NONE:
        case JUMP_IF_TRUE_OR_POP: case JUMP_IF_FALSE_OR_POP: case FOR_ITER: case SEND:
        case RETURN_VALUE: case RERAISE: case YIELD_VALUE: case RETURN_GENERATOR:
            return false;
        default:
            offset = next_offset(ins);
        }
    }
    return false;
}

inline int code_line_of(PyCodeObject* co, int offset_units) {
    return PyCode_Addr2Line(co, offset_units * static_cast<int>(sizeof(_Py_CODEUNIT)));
}

inline EvalFrameFn get_eval_frame() {
    return _PyInterpreterState_GetEvalFrameFunc(PyInterpreterState_Get());
}
inline void set_eval_frame(EvalFrameFn fn) {
    _PyInterpreterState_SetEvalFrameFunc(PyInterpreterState_Get(), fn);
}
// In 3.11 the caller of the eval function clears and pops the frame, so a hook that answers a
// call without evaluating the frame just returns the result. (3.12 differs: see the #error.)
inline PyObject* eval_frame_default(PyThreadState* ts, IFrame* f, int throwflag) {
    return _PyEval_EvalFrameDefault(ts, f, throwflag);
}

// True when some tracer (a debugger, coverage) is already installed on this thread.
inline bool thread_has_tracer(PyThreadState* ts) { return ts->c_tracefunc != nullptr; }

// [Note: site frames] in replay/plan.cpp. A frame object with no locals that stands for a frame
// of the user's code: its file, function name and module globals (as _PyTraceback_Add makes
// one). New reference, or NULL with an error set.
inline PyObject* new_site_frame(PyCodeObject* like, PyObject* globals) {
    const char* file = PyUnicode_AsUTF8(like->co_filename);
    const char* name = file ? PyUnicode_AsUTF8(like->co_name) : nullptr;
    PyCodeObject* code = name ? PyCode_NewEmpty(file, name, like->co_firstlineno) : nullptr;
    if (!code) return nullptr;
    PyFrameObject* f = PyFrame_New(PyThreadState_Get(), code, globals, nullptr);
    Py_DECREF(code);
    return reinterpret_cast<PyObject*>(f);  // complete: its first instruction counts as run
}

// Another site frame standing for the same frame as `fo`.
inline PyObject* copy_site_frame(PyObject* fo) {
    IFrame* d = reinterpret_cast<PyFrameObject*>(fo)->f_frame;
    return new_site_frame(d->f_code, d->f_globals);
}

// Makes the site frame `fo`, at `line`, the thread's innermost frame, above the one running
// now, until unlink_site_frame; what warnings, sys._getframe and f_back see. False when it is
// linked already (its plan runs inside one of its own steps).
inline bool link_site_frame(PyThreadState* ts, PyObject* fo, int line) {
    auto* f = reinterpret_cast<PyFrameObject*>(fo);
    IFrame* d = f->f_frame;
    if (d->frame_obj) return false;
    // CPython finds the object of an innermost frame through frame_obj; it holds a reference
    // while linked (the collector counts the one it visits there).
    d->frame_obj = reinterpret_cast<PyFrameObject*>(Py_NewRef(fo));
    d->previous = ts->cframe->current_frame;
    ts->cframe->current_frame = d;
    f->f_lineno = line;
    return true;
}
inline void set_site_frame_line(PyObject* fo, int line) {
    reinterpret_cast<PyFrameObject*>(fo)->f_lineno = line;
}
inline void unlink_site_frame(PyThreadState* ts, PyObject* fo) {
    IFrame* d = reinterpret_cast<PyFrameObject*>(fo)->f_frame;
    ts->cframe->current_frame = d->previous;
    d->previous = nullptr;  // f_back is None once the step is over
    PyFrameObject* self = d->frame_obj;
    d->frame_obj = nullptr;
    Py_DECREF(self);
}

}  // namespace magpy::py
