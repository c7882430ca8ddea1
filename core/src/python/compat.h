// The one place that knows CPython's private layouts: frames, the eval-frame hook, tracing and
// bytecode decoding. Everything else in core/ goes through these accessors, so the next Python
// version is a change to this file (and compat_opcode.c) only.
#pragma once

#include <Python.h>
#include <frameobject.h>
#include <opcode.h>

#include <cstdint>
#include <vector>

#define MAGPY_IS_PYTHON_311 (PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000)
#define MAGPY_IS_PYTHON_312 (PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000)

#if PY_VERSION_HEX >= 0x030D0000
#error "magpy: check the frame layout (f_executable, instr_ptr), the eval-frame hook and the opcodes before building for Python 3.13"
#elif PY_VERSION_HEX < 0x030B0000
#error "magpy needs CPython 3.11 or 3.12"
#endif

#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE

#if MAGPY_IS_PYTHON_312
// [Note: Python 3.12 opcodes] The engine switches on 3.11's instruction set. The 3.12 decoder
// below hands it 3.12's instructions in those terms where their meaning is the same: the
// POP_JUMP_IF_* (all forward in 3.12) as POP_JUMP_FORWARD_IF_*, LOAD_ATTR with its method bit
// as LOAD_METHOD, COMPARE_OP's operator without its mask bits, LOAD_FAST_CHECK as LOAD_FAST,
// CALL_INTRINSIC_1 UNARY_POSITIVE / LIST_TO_TUPLE as the 3.11 instructions. 3.11 names that
// 3.12 lacks get values no decoded instruction has (past every opcode and pseudo-opcode), so
// the cases that name them compile and never match. New instructions with no 3.11
// counterpart (RETURN_CONST, BINARY_SLICE, STORE_SLICE, LOAD_FAST_AND_CLEAR, END_FOR, ...) are
// handled by the engine under their own names.
#define POP_JUMP_FORWARD_IF_FALSE POP_JUMP_IF_FALSE
#define POP_JUMP_FORWARD_IF_TRUE POP_JUMP_IF_TRUE
#define POP_JUMP_FORWARD_IF_NONE POP_JUMP_IF_NONE
#define POP_JUMP_FORWARD_IF_NOT_NONE POP_JUMP_IF_NOT_NONE
#define POP_JUMP_BACKWARD_IF_FALSE 1000
#define POP_JUMP_BACKWARD_IF_TRUE 1001
#define POP_JUMP_BACKWARD_IF_NONE 1002
#define POP_JUMP_BACKWARD_IF_NOT_NONE 1003
#define JUMP_IF_FALSE_OR_POP 1004
#define JUMP_IF_TRUE_OR_POP 1005
#define PRECALL 1006
#define LOAD_CLASSDEREF 1007
#define UNARY_POSITIVE 1008
#define LIST_TO_TUPLE 1009
#else
// 3.12 names the engine handles, given values no 3.11 instruction has.
#define RETURN_CONST 1100
#define BINARY_SLICE 1101
#define STORE_SLICE 1102
#define LOAD_FAST_AND_CLEAR 1103
#define END_FOR 1104
#define LOAD_SUPER_ATTR 1105
#endif

extern "C" {
// Copies of CPython's _PyOpcode_Deopt / _PyOpcode_Caches tables (not exported by libpython);
// defined in compat_opcode.c, which can include the C99 header that C++ cannot.
extern const unsigned char* const magpy_opcode_deopt;
extern const unsigned char* const magpy_opcode_caches;
// 3.12: lets PyEval_SetTrace turn on per-instruction events (the interpreter's
// f_opcode_trace_set, which the Python-level setter of frame.f_trace_opcodes sets), returning
// what it was; the restore puts that back after PyEval_SetTrace(NULL) (otherwise every later
// sys.settrace, a debugger's or coverage's, would get per-instruction events for all code).
// No-ops on 3.11.
int magpy_allow_opcode_events(void);
void magpy_restore_opcode_events(int was);
// 3.12: clears and pops a frame that the eval-frame hook answered without evaluating it (what
// the evaluator does when a frame returns). No-op on 3.11, where the caller does it.
void magpy_discard_frame(PyThreadState* ts, struct _PyInterpreterFrame* frame);
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
#if MAGPY_IS_PYTHON_312
inline PyObject* frame_function(IFrame* f) { return f->f_funcobj; }
#else
inline PyObject* frame_function(IFrame* f) { return reinterpret_cast<PyObject*>(f->f_func); }
#endif
inline PyObject* frame_globals(IFrame* f) { return f->f_globals; }
inline PyObject* frame_builtins(IFrame* f) { return f->f_builtins; }
inline PyObject* frame_local(IFrame* f, int i) { return f->localsplus[i]; }
// Drops a frame's references to its locals and arguments; only for a frame that has not run
// and will not (it is discarded: discard_unevaluated_frame).
inline void frame_clear_locals(IFrame* f) {
    for (int i = 0, n = frame_code(f)->co_nlocalsplus; i < n; ++i) Py_CLEAR(f->localsplus[i]);
}
// The frame that was running when `f` was entered (C calls in between make no frames).
// 3.12 links a frame entered from C to a frame of the C stack (the evaluator's entry frame),
// which is skipped.
inline IFrame* frame_previous(IFrame* f) {
    IFrame* p = f->previous;
#if MAGPY_IS_PYTHON_312
    while (p && p->owner == FRAME_OWNED_BY_CSTACK) p = p->previous;
#endif
    return p;
}
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
// A type's own namespace (borrowed; may be null for a type not ready). 3.12 keeps the dict of a
// static builtin type (object, dict, list, ...) in the interpreter, and its tp_dict is null.
inline PyObject* type_dict(PyTypeObject* t) {
#if MAGPY_IS_PYTHON_312
    if (t->tp_dict) return t->tp_dict;
    PyObject* d = PyType_GetDict(t);  // new reference; the interpreter keeps the dict alive
    Py_XDECREF(d);
    return d;
#else
    return t->tp_dict;
#endif
}
// Whether instances of `type` keep their attributes in a __dict__ (a managed one from 3.11 on).
inline bool has_instance_dict(PyTypeObject* type) {
    return (type->tp_flags & Py_TPFLAGS_MANAGED_DICT) || type->tp_dictoffset != 0;
}
inline PyObject* code_const(PyCodeObject* co, int i) { return PyTuple_GET_ITEM(co->co_consts, i); }
inline PyObject* code_name(PyCodeObject* co, int i) { return PyTuple_GET_ITEM(co->co_names, i); }


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
    int opcode = 0;  // de-specialised opcode, in 3.11's terms ([Note: Python 3.12 opcodes])
    int oparg = 0;   // with EXTENDED_ARG prefixes applied
    int raw = 0;     // the de-specialised opcode as it is in the bytecode (decides its length)
    int raw_arg = 0; // its argument as it is in the bytecode
    bool prefixed = false;  // decoded from an EXTENDED_ARG before it
};

// Code units taken by an instruction's inline caches (`opcode` as in the bytecode).
inline int instruction_caches(int opcode) {
    return opcode >= 0 && opcode < 256 ? magpy_opcode_caches[opcode] : 0;
}

// The de-specialised bytecode. 3.12 rewrites the code object's own bytecode while a tracer is
// installed (INSTRUMENTED_* opcodes); co_code is the original, which the code object caches.
// Keep `holder` alive while reading.
inline const _Py_CODEUNIT* code_units(PyCodeObject* co, PyObject*& holder) {
#if MAGPY_IS_PYTHON_312
    holder = PyCode_GetCode(co);
    if (holder) return reinterpret_cast<const _Py_CODEUNIT*>(PyBytes_AS_STRING(holder));
    PyErr_Clear();
#endif
    holder = nullptr;
    return _PyCode_CODE(co);
}

// Decodes the instruction at `offset` (its first EXTENDED_ARG prefix, if any) of `code`.
inline Instruction decode_at(const _Py_CODEUNIT* code, Py_ssize_t size, int offset) {
    Instruction ins;
    int oparg = 0;
    int op = magpy_opcode_deopt[_Py_OPCODE(code[offset])];
    while (op == EXTENDED_ARG && offset + 1 < size) {
        oparg = (oparg | _Py_OPARG(code[offset])) << 8;
        op = magpy_opcode_deopt[_Py_OPCODE(code[++offset])];
        ins.prefixed = true;
    }
    ins.opcode = ins.raw = op;
    ins.oparg = ins.raw_arg = oparg | _Py_OPARG(code[offset]);
    ins.offset = offset;
#if MAGPY_IS_PYTHON_312
    switch (op) {
    case LOAD_ATTR:  // name index << 1 | method bit
        ins.opcode = (ins.oparg & 1) ? LOAD_METHOD : LOAD_ATTR;
        ins.oparg >>= 1;
        break;
    case COMPARE_OP: ins.oparg >>= 4; break;  // operator << 4 | mask bits
    case LOAD_FAST_CHECK: ins.opcode = LOAD_FAST; break;
    case CALL_INTRINSIC_1:
        if (ins.oparg == 5) ins.opcode = UNARY_POSITIVE;  // INTRINSIC_UNARY_POSITIVE
        if (ins.oparg == 6) ins.opcode = LIST_TO_TUPLE;   // INTRINSIC_LIST_TO_TUPLE
        break;
    default: break;
    }
#endif
    return ins;
}

// The instruction about to run in a frame seen by an opcode trace event. In 3.11 the instruction
// after an EXTENDED_ARG runs without its own event, so the prefix is decoded here; 3.12 may
// report the instruction itself as well, after its prefix (see Monitor::on_opcode).
inline Instruction frame_current_instruction(IFrame* f) {
    PyObject* holder;
    const _Py_CODEUNIT* code = code_units(f->f_code, holder);
    Instruction ins = decode_at(code, Py_SIZE(f->f_code),
                                static_cast<int>(f->prev_instr - _PyCode_CODE(f->f_code)));
    Py_XDECREF(holder);
    return ins;
}

// Where a jump goes, in code units (every jump is relative to the next instruction).
inline int jump_target(const Instruction& ins) {
    int next = ins.offset + 1 + instruction_caches(ins.raw);
    switch (ins.opcode) {
    case POP_JUMP_BACKWARD_IF_TRUE: case POP_JUMP_BACKWARD_IF_FALSE:
    case POP_JUMP_BACKWARD_IF_NONE: case POP_JUMP_BACKWARD_IF_NOT_NONE:
    case JUMP_BACKWARD: case JUMP_BACKWARD_NO_INTERRUPT:
        return next - ins.oparg;
#if MAGPY_IS_PYTHON_312
    case FOR_ITER:  // an exhausted iterator is popped and END_FOR skipped
        return next + ins.oparg + 1;
#endif
    default:
        return next + ins.oparg;  // FOR_ITER (3.11): where an exhausted iterator goes (popped)
    }
}

// The names a code object's own instructions give: `name_of(ins)` for each instruction, or null.
template <class NameOf>
inline std::vector<PyObject*> code_instruction_names(PyCodeObject* co, NameOf name_of) {
    PyObject* holder;
    const _Py_CODEUNIT* code = code_units(co, holder);
    Py_ssize_t n = Py_SIZE(co);
    std::vector<PyObject*> names;
    for (int i = 0; i < n;) {
        Instruction ins = decode_at(code, n, i);
        if (PyObject* name = name_of(ins)) names.push_back(name);
        i = ins.offset + 1 + instruction_caches(ins.raw);
    }
    Py_XDECREF(holder);
    return names;
}

// The names a code object's own instructions store or delete: as globals (`global n; n += 1`),
// or with `attrs`, as attributes (`Stats.n += 1`).
inline std::vector<PyObject*> code_stored_names(PyCodeObject* co, bool attrs) {
    return code_instruction_names(co, [&](const Instruction& ins) -> PyObject* {
        bool store = attrs ? ins.opcode == STORE_ATTR || ins.opcode == DELETE_ATTR
                           : ins.opcode == STORE_GLOBAL || ins.opcode == DELETE_GLOBAL;
        return store && ins.oparg < PyTuple_GET_SIZE(co->co_names)
                   ? PyTuple_GET_ITEM(co->co_names, ins.oparg)
                   : nullptr;
    });
}

// The names of the cell and free variables a code object's own instructions store or delete
// (`nonlocal n; n += 1`).
inline std::vector<PyObject*> code_stored_derefs(PyCodeObject* co) {
    return code_instruction_names(co, [&](const Instruction& ins) -> PyObject* {
        bool store = ins.opcode == STORE_DEREF || ins.opcode == DELETE_DEREF;
        return store && ins.oparg < code_nlocalsplus(co) ? code_localsplus_name(co, ins.oparg)
                                                         : nullptr;
    });
}

// The instruction at `offset` (code units, its first EXTENDED_ARG prefix if it has any), and the
// offset of the one after it.
inline Instruction code_instruction_at(PyCodeObject* co, int offset) {
    PyObject* holder;
    const _Py_CODEUNIT* code = code_units(co, holder);
    Instruction ins = decode_at(code, Py_SIZE(co), offset);
    Py_XDECREF(holder);
    return ins;
}
inline int next_offset(const Instruction& ins) {
    return ins.offset + 1 + instruction_caches(ins.raw);
}

// The 3.11 exception table: varint entries (start, size, target, depth << 1 | lasti).
struct Handler;
inline Handler code_handler(PyCodeObject* co, int offset);

// [Note: stack depth in 3.12] The number of values on a frame's stack before each instruction
// (code units; an EXTENDED_ARG prefix gets its instruction's), -1 where no path reaches. 3.11
// saves the stack pointer before calling a tracer; 3.12 does not (stacktop is -1 while a frame
// runs), but the values are in the frame's memory, so the depth is enough to read them. It is
// found from the bytecode the way CPython's mark_stacks finds it (frameobject.c, for jumps of
// f_lineno): each instruction's stack effect along both ways of each jump, and into each
// exception handler at the depth its table entry gives. Empty if some instruction has no
// known effect. 3.11 needs none (the engine checks the two against each other there when
// MAGPY_CHECK_DEPTHS=1 is set, which is how the table is tested on machines without 3.12).
std::vector<int16_t> code_stack_depths(PyCodeObject* co);

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

// Calls visit(start, size, target, depth_lasti) for each entry of the exception table (varints
// of 6 bits, code units) until it returns true.
template <typename Visit>
inline void code_exception_entries(PyCodeObject* co, Visit visit) {
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
        if (visit(start, size, target, depth_lasti)) return;
    }
}

inline Handler code_handler(PyCodeObject* co, int offset) {
    Handler h;
    code_exception_entries(co, [&](int start, int size, int target, int depth_lasti) {
        if (offset < start || offset >= start + size) return false;
        h = Handler{target, depth_lasti >> 1, (depth_lasti & 1) != 0};
        return true;
    });
    return h;
}

inline int code_handler_of(PyCodeObject* co, int offset) { return code_handler(co, offset).target; }

// A generator suspended at `offset` (code units) inside a try or with block of its own, whose
// cleanup (finally, except, __exit__) close() would run. (3.12 wraps every generator body in a
// handler that only turns StopIteration into RuntimeError: not cleanup.)
inline bool code_yield_has_cleanup(PyCodeObject* co, int offset) {
    int target = code_handler(co, offset).target;
    if (target < 0) return false;
#if MAGPY_IS_PYTHON_312
    PyObject* holder;
    const _Py_CODEUNIT* code = code_units(co, holder);
    Instruction ins = decode_at(code, Py_SIZE(co), target);
    Py_XDECREF(holder);
    if (ins.raw == CALL_INTRINSIC_1 && ins.raw_arg == 3) return false;  // STOPITERATION_ERROR
#endif
    return true;
}

// True when an exception at `offset` (code units) has a handler in this frame.
inline bool code_offset_in_handler(PyCodeObject* co, int offset) {
    return code_handler_of(co, offset) >= 0;
}

// True when an exception at `offset` reaches code of the user's that handles it: an except or
// finally clause. Handlers that only clean up and pass the exception on are looked through,
// the search going on from their RERAISE: the cleanup of a with block (PUSH_EXC_INFO,
// WITH_EXCEPT_START, a jump, RERAISE 2), the one that pops the exception state (COPY 3,
// POP_EXCEPT, RERAISE 1), and in 3.12 the one of an inlined comprehension that puts back the
// locals it shadowed (SWAPs, POP_TOP, STORE_FASTs, RERAISE 0) and the one around every
// generator body (CALL_INTRINSIC_1 STOPITERATION_ERROR, RERAISE 1). A with block's __exit__ is then
// the only code on the way, which a replay plan runs itself ([Note: with blocks]).
// The RERAISE that a cleanup-only handler starting at `target` ends in, or -1 (see below).
inline int code_cleanup_reraise(const _Py_CODEUNIT* code, Py_ssize_t n, int target) {
    auto op_at = [&](int i) { return i >= 0 && i < n ? magpy_opcode_deopt[_Py_OPCODE(code[i])] : -1; };
    if (op_at(target) == PUSH_EXC_INFO && op_at(target + 1) == WITH_EXCEPT_START &&
        op_at(target + 3) == RERAISE)
        return target + 3;
    for (int i = target, k = 0; k < 16 && i < n; ++k) {
        Instruction ins = decode_at(code, n, i);
        switch (ins.raw) {
        case RERAISE: return ins.offset;
        case COPY: case SWAP: case POP_TOP: case POP_EXCEPT: case STORE_FAST: break;
#if MAGPY_IS_PYTHON_312
        case CALL_INTRINSIC_1:  // a generator's StopIteration -> RuntimeError, re-raised
            if (ins.raw_arg == 3) break;  // INTRINSIC_STOPITERATION_ERROR
            return -1;
#endif
        default: return -1;
        }
        i = next_offset(ins);
    }
    return -1;
}

inline bool code_offset_reaches_user_handler(PyCodeObject* co, int offset) {
    PyObject* holder;
    const _Py_CODEUNIT* code = code_units(co, holder);
    Py_ssize_t n = Py_SIZE(co);
    struct Release {
        PyObject* o;
        ~Release() { Py_XDECREF(o); }
    } release{holder};
    for (int hops = 0; hops < 64; ++hops) {
        int target = code_handler_of(co, offset);
        if (target < 0) return false;
        int reraise = code_cleanup_reraise(code, n, target);
        if (reraise < 0) return true;
        offset = reraise;
    }
    return true;
}

// The RERAISE 0 that the handler of a `finally:` clause starting at `target` ends in (or the
// `raise` that is its last statement), or -1. Its body runs with the exception kept on the stack
// (PUSH_EXC_INFO, the body, RERAISE 0), so it passes the exception on, or raises another (which
// fullgraph=True puts back: [Note: fullgraph and unwinding] in hook/frame_hook.cpp). -1 for a
// handler that may return or jump out (swallowing the exception), that could be an except
// clause (POP_TOP of the exception, CHECK_EXC_MATCH, POP_EXCEPT), or that holds a handler of
// its own.
inline int code_finally_reraise(const _Py_CODEUNIT* code, Py_ssize_t n, int target) {
    if (target < 0 || target >= n || magpy_opcode_deopt[_Py_OPCODE(code[target])] != PUSH_EXC_INFO)
        return -1;
    int lowest = target, highest = target;  // where the body's jumps go
    int i = target + 1;
    for (int k = 0; k < 4096 && i < n; ++k) {
        Instruction ins = decode_at(code, n, i);
        switch (ins.opcode) {
        case RERAISE:
            if (ins.oparg != 0 || lowest < target || highest > ins.offset) return -1;
            return ins.offset;
        case RAISE_VARARGS:  // the body's last statement (what follows it was dead code)
            if (lowest >= target && highest <= ins.offset) return ins.offset;
            break;
        case POP_TOP:
            if (i == target + 1) return -1;  // a bare except: drops the exception
            break;
        case POP_EXCEPT: case CHECK_EXC_MATCH: case CHECK_EG_MATCH: case PUSH_EXC_INFO:
        case WITH_EXCEPT_START: case RETURN_VALUE: case RETURN_CONST: case YIELD_VALUE:
        case RETURN_GENERATOR: case SEND:
            return -1;
        case JUMP_FORWARD: case JUMP_BACKWARD: case JUMP_BACKWARD_NO_INTERRUPT:
        case POP_JUMP_FORWARD_IF_TRUE: case POP_JUMP_FORWARD_IF_FALSE:
        case POP_JUMP_BACKWARD_IF_TRUE: case POP_JUMP_BACKWARD_IF_FALSE:
        case POP_JUMP_FORWARD_IF_NONE: case POP_JUMP_FORWARD_IF_NOT_NONE:
        case POP_JUMP_BACKWARD_IF_NONE: case POP_JUMP_BACKWARD_IF_NOT_NONE:
        case JUMP_IF_TRUE_OR_POP: case JUMP_IF_FALSE_OR_POP: case FOR_ITER: {
            int to = jump_target(ins);
            lowest = std::min(lowest, to);
            highest = std::max(highest, to);
            break;
        }
        default: break;
        }
        i = next_offset(ins);
    }
    return -1;
}

// True when `offset` lies in a handler that passes the exception on (from its first
// instruction to its RERAISE): the exit of a with block running because of an exception, the
// body of a `finally:` clause, and the like. fullgraph=True lets them run for its error.
inline bool code_offset_in_cleanup(PyCodeObject* co, int offset) {
    PyObject* holder;
    const _Py_CODEUNIT* code = code_units(co, holder);
    Py_ssize_t n = Py_SIZE(co);
    bool inside = false;
    code_exception_entries(co, [&](int, int, int target, int) {
        if (offset < target) return false;
        int reraise = code_cleanup_reraise(code, n, target);
        if (reraise < 0) reraise = code_finally_reraise(code, n, target);
        inside = reraise >= 0 && offset <= reraise;
        return inside;
    });
    Py_XDECREF(holder);
    return inside;
}

// Instructions that drop a frame's own reference to a value (a local, a cell's content, the
// stack's top) and nothing else: where an object's __del__ runs when that was the last one.
inline bool drops_frame_reference(int opcode) {
    switch (opcode) {
    case DELETE_FAST: case STORE_FAST: case DELETE_DEREF: case STORE_DEREF: case POP_TOP:
        return true;
    default:
        return false;
    }
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
        case RETURN_VALUE: case RETURN_CONST: case RERAISE: case YIELD_VALUE:
        case RETURN_GENERATOR:
            return false;
        default:
            offset = next_offset(ins);
        }
    }
    return false;
}

// The instruction a frame is at (code units), as frame_stack_depth sees it.
inline int frame_offset(IFrame* f) { return static_cast<int>(f->prev_instr - _PyCode_CODE(f->f_code)); }

// The depth of a frame's stack at the instruction it is at (in a trace event, or while it is
// suspended in a call); `depths` is code_stack_depths(frame's code), read in 3.12 only.
inline int frame_stack_depth(IFrame* f, const std::vector<int16_t>& depths) {
#if MAGPY_IS_PYTHON_312
    auto at = static_cast<size_t>(frame_offset(f));
    int d = at < depths.size() ? depths[at] : -1;
    return d <= f->f_code->co_stacksize ? d : -1;
#else
    (void)depths;
    return f->stacktop - f->f_code->co_nlocalsplus;
#endif
}
// i = 0 is the top of the stack. May be NULL (CPython pushes NULL before some callables).
inline PyObject* frame_stack_peek(IFrame* f, const std::vector<int16_t>& depths, int i) {
    int d = frame_stack_depth(f, depths);
    return i >= 0 && i < d ? f->localsplus[f->f_code->co_nlocalsplus + d - 1 - i] : nullptr;
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
inline PyObject* eval_frame_default(PyThreadState* ts, IFrame* f, int throwflag) {
    return _PyEval_EvalFrameDefault(ts, f, throwflag);
}
// A hook that answers a call without evaluating its frame discards the frame first: in 3.11 the
// caller of the eval function clears and pops it (nothing to do here); from 3.12 on the
// evaluator does, so the hook must.
inline void discard_unevaluated_frame(PyThreadState* ts, IFrame* f) { magpy_discard_frame(ts, f); }

// True when some tracer (a debugger, coverage) is already installed on this thread.
inline bool thread_has_tracer(PyThreadState* ts) { return ts->c_tracefunc != nullptr; }
inline Py_tracefunc thread_tracer(PyThreadState* ts) { return ts->c_tracefunc; }

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

// A number that changes whenever the dict `d` changes, and that no other dict has had (CPython's
// ma_version_tag, PEP 509: every dict made or changed takes the next number of one counter; a
// store of the value already there changes nothing). An attribute stored on an instance whose
// dict has been read through _PyObject_GetDictPtr goes through that dict in 3.11 and 3.12.
// PRECONDITION: `d` is a dict.
inline uint64_t dict_version(PyObject* d) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    return reinterpret_cast<PyDictObject*>(d)->ma_version_tag;
#pragma GCC diagnostic pop
}

// CPython's PyODictObject (Objects/odictobject.c; the same in 3.11 and 3.12): its od_state
// changes whenever its own order does (move_to_end, insertions, deletions), which its dict
// version does not follow. odict_state() is 0 and odict_state_known() false where the layout
// does not match this one (checked by size once).
struct ODictLayout {
    PyDictObject od_dict;
    void* od_first;
    void* od_last;
    void** od_fast_nodes;
    Py_ssize_t od_fast_nodes_size;
    size_t od_resize_sentinel;
    size_t od_state;
    PyObject* od_inst_dict;
    PyObject* od_weakreflist;
};
inline bool odict_state_known() {
    return PyODict_Type.tp_basicsize == static_cast<Py_ssize_t>(sizeof(ODictLayout));
}
// PRECONDITION: PyODict_Check(od).
inline size_t odict_state(PyObject* od) {
    return odict_state_known() ? reinterpret_cast<ODictLayout*>(od)->od_state : 0;
}

}  // namespace magpy::py
