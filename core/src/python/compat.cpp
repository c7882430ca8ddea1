// The parts of the compatibility layer (compat.h) that are not inline.
#include "python/compat.h"

namespace magpy::py {

// [Note: stack depth in 3.12] in compat.h.
std::vector<int16_t> code_stack_depths(PyCodeObject* co) {
    PyObject* holder;
    const _Py_CODEUNIT* code = code_units(co, holder);
    const int n = static_cast<int>(Py_SIZE(co));
    std::vector<int16_t> depth(static_cast<size_t>(n), -1);
    std::vector<int> work;
    bool ok = true;
    auto reach = [&](int offset, int d) {
        if (offset < 0 || offset >= n || d < 0 || d > INT16_MAX) return;
        if (depth[static_cast<size_t>(offset)] < 0) {
            depth[static_cast<size_t>(offset)] = static_cast<int16_t>(d);
            work.push_back(offset);
        }
    };
    reach(0, 0);
    while (!work.empty() && ok) {
        int start = work.back();
        work.pop_back();
        int d = depth[static_cast<size_t>(start)];
        Instruction ins = decode_at(code, n, start);
        for (int k = start; k <= ins.offset; ++k) depth[static_cast<size_t>(k)] = static_cast<int16_t>(d);
        Handler h = code_handler(co, ins.offset);
        if (h.target >= 0) reach(h.target, h.depth + (h.lasti ? 1 : 0) + 1);
        int next = next_offset(ins);
        switch (ins.opcode) {  // 3.11's names ([Note: Python 3.12 opcodes])
        case RETURN_GENERATOR:  // the frame is resumed with the value sent in on its stack
            reach(next, d + 1);
            continue;
        case RETURN_VALUE: case RETURN_CONST: case RAISE_VARARGS: case RERAISE:
            continue;
        case JUMP_FORWARD: case JUMP_BACKWARD: case JUMP_BACKWARD_NO_INTERRUPT:
            reach(jump_target(ins), d);
            continue;
        case FOR_ITER:  // exhausted: the iterator is popped (and 3.12's END_FOR skipped)
            reach(jump_target(ins), d - 1);
            reach(next, d + 1);
            continue;
        case PRECALL:  // 3.11: the arguments stay until CALL (the compiler counts them off here)
            reach(next, d);
            continue;
        case CALL:
            reach(next, d - ins.oparg - 1);
            continue;
        case POP_JUMP_FORWARD_IF_FALSE: case POP_JUMP_FORWARD_IF_TRUE:
        case POP_JUMP_FORWARD_IF_NONE: case POP_JUMP_FORWARD_IF_NOT_NONE:
        case POP_JUMP_BACKWARD_IF_FALSE: case POP_JUMP_BACKWARD_IF_TRUE:
        case POP_JUMP_BACKWARD_IF_NONE: case POP_JUMP_BACKWARD_IF_NOT_NONE:
        case JUMP_IF_FALSE_OR_POP: case JUMP_IF_TRUE_OR_POP: case SEND: {
            int jump = PyCompile_OpcodeStackEffectWithJump(ins.raw, ins.raw_arg, 1);
            int fall = PyCompile_OpcodeStackEffectWithJump(ins.raw, ins.raw_arg, 0);
            reach(jump_target(ins), d + jump);
            reach(next, d + fall);
            continue;
        }
        default: {
            int effect = PyCompile_OpcodeStackEffectWithJump(
                ins.raw, ins.raw >= HAVE_ARGUMENT ? ins.raw_arg : 0, 0);
            if (effect == PY_INVALID_STACK_EFFECT) {
                ok = false;
                break;
            }
            reach(next, d + effect);
        }
        }
    }
    Py_XDECREF(holder);
    if (PyErr_Occurred()) PyErr_Clear();
    if (!ok) depth.clear();
    return depth;
}

}  // namespace magpy::py
