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

// Which frame a call of `target` is captured as: the function's own, a bound method's function
// (with its self), or a module's forward (self is the module; Module.__call__ runs hooks around
// it). `function` is set for a forward wrapped by a decorator (functools.wraps): the wrapper's
// frame is captured, recognised by its function. All borrowed (the target keeps them alive).
struct CaptureTarget {
    PyCodeObject* code = nullptr;  // null: no plain Python code to capture
    PyObject* self = nullptr;
    PyObject* function = nullptr;
};
CaptureTarget capture_target(PyObject* target);

// The qualified name shown for a compiled callable (its __qualname__, or its type's).
std::string qualname_of(PyObject* target);

}  // namespace magpy
