// magpy.compile()'s result: a Python callable type written against the C API (vectorcall), so a
// cache hit pays no pybind11 dispatch.
#pragma once

#include "api/compiled_state.h"

namespace magpy {

// New reference, or NULL with TypeError/ValueError naming the user's input.
PyObject* make_compiled_function(PyObject* target, const CompileOptions& options);
// Borrowed state of a CompiledFunction, or nullptr if `obj` is not one.
CompiledState* compiled_state(PyObject* obj);
PyTypeObject* compiled_function_type();  // registered by the bindings

}  // namespace magpy
