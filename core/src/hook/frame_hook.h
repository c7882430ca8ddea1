// The PEP 523 frame hook. It is installed only while a compiled callable runs, and it handles
// only that callable's entry frame: a cache hit replays the plan instead of running the frame;
// a miss runs the frame for real under the monitor and stores what the capture learned.
#pragma once

#include "api/compiled_state.h"

namespace magpy {

// Calls the compiled callable's target with the hook armed for its code object.
// Returns a new reference, or NULL with an exception (the user's, or GraphBreakError).
// PRECONDITION: GIL held.
PyObject* call_with_hook(CompiledState& st, PyObject* const* args, size_t nargsf,
                         PyObject* kwnames);

// The builtin a segment's last step calls a callee through when the callee broke inside
// (compiled_call(callee, *args)): the callee runs as a compiled callable of its own, under the
// options of the compiled callable whose plan runs. Borrowed, never freed. See [Note: callees
// compiled on their own] in frame_hook.cpp. `compiles_on_its_own`: whether it would (Python
// code outside the standard library).
PyObject* compiled_call();

// The launcher a bridge calls to go on compiled after a call that reads its caller's frame
// ([Note: bridges] in magpy/_resume.py). Borrowed, never freed.
PyObject* bridge_launcher();
bool compiles_on_its_own(PyObject* callable);

// A callable told what the engine is doing, for live views: hook(event, info) with event
// "capture" (a capture starts), "captured" (it ended: ok, ops, breaks), "compile" and
// "compiled" (the backend, with compile_ns). Called outside tracing, with the GIL held; what
// it raises is dropped (an interrupt stays pending). Null: none (the default).
void set_progress_hook(PyObject* hook);

}  // namespace magpy
