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

// A callable told what the engine is doing, for live views: hook(event, info) with event
// "capture" (a capture starts), "captured" (it ended: ok, ops, breaks), "compile" and
// "compiled" (the backend, with compile_ns). Called outside tracing, with the GIL held; what
// it raises is dropped (an interrupt stays pending). Null: none (the default).
void set_progress_hook(PyObject* hook);

}  // namespace magpy
