/* Exposes CPython's private opcode tables, which libpython does not export, and the two 3.12
 * helpers that need the interpreter's internal structs (see compat.h). This is C because the
 * internal headers use designated initialisers that C++17 rejects. */
#define Py_BUILD_CORE 1  /* before Python.h: the internal headers need its core-only view */
#include <Python.h>
#define NEED_OPCODE_TABLES
#include <internal/pycore_opcode.h>

const unsigned char* const magpy_opcode_deopt = _PyOpcode_Deopt;
const unsigned char* const magpy_opcode_caches = _PyOpcode_Caches;

#if PY_VERSION_HEX >= 0x030C0000
#include <internal/pycore_interp.h>

int magpy_allow_opcode_events(void) {
    PyInterpreterState* interp = PyInterpreterState_Get();
    int was = interp->f_opcode_trace_set;
    interp->f_opcode_trace_set = true;
    return was;
}

void magpy_restore_opcode_events(int was) {
    PyInterpreterState_Get()->f_opcode_trace_set = was != 0;
}

/* A frame pushed for a call that the hook answered itself. The evaluator is asked to throw into
 * it before its first instruction: no handler covers that point, so it unwinds the frame,
 * clears and pops it as it does for any frame that raises, and returns NULL. The exception is
 * then dropped and the caller's own error state put back. (Neither _PyFrame_ClearExceptCode
 * nor _PyThreadState_PopFrame is part of the API of 3.12.) */
void magpy_discard_frame(PyThreadState* ts, struct _PyInterpreterFrame* frame) {
    PyObject* saved = PyErr_GetRaisedException();
    PyErr_SetNone(PyExc_SystemError);
    /* Marked as tracing, the thread sends no throw, raise or unwind events for this: tracers
     * and sys.monitoring tools would take them for events of the caller's frame. */
    PyThreadState_EnterTracing(ts);
    PyObject* r = _PyEval_EvalFrameDefault(ts, frame, 1);
    PyThreadState_LeaveTracing(ts);
    Py_XDECREF(r);
    PyErr_Clear();
    PyErr_SetRaisedException(saved);
}
#else
int magpy_allow_opcode_events(void) { return 0; }
void magpy_restore_opcode_events(int was) { (void)was; }
void magpy_discard_frame(PyThreadState* ts, struct _PyInterpreterFrame* frame) {
    (void)ts;
    (void)frame;
}
#endif
