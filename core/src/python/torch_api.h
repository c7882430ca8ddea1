// Python objects from torch that the engine compares against, looked up once at import.
#pragma once

#include "python/py_ref.h"

#include <string>
#include <utility>
#include <vector>

namespace magpy {

struct TorchApi {
    PyTypeObject* tensor_type = nullptr;     // torch.Tensor
    PyTypeObject* parameter_type = nullptr;  // torch.nn.Parameter
    PyTypeObject* module_type = nullptr;     // torch.nn.Module
    PyTypeObject* sequential_type = nullptr;
    PyTypeObject* module_list_type = nullptr;
    PyTypeObject* module_dict_type = nullptr;
    PyTypeObject* parameter_list_type = nullptr;  // nn.ParameterList (optional)
    PyTypeObject* parameter_dict_type = nullptr;  // nn.ParameterDict (optional)
    PyTypeObject* size_type = nullptr;    // torch.Size
    PyTypeObject* dtype_type = nullptr;   // torch.dtype
    PyTypeObject* device_type = nullptr;  // torch.device
    PyTypeObject* layout_type = nullptr;  // torch.layout
    PyTypeObject* ordered_dict_type = nullptr;  // collections.OrderedDict
    PyTypeObject* defaultdict_type = nullptr;   // collections.defaultdict
    PyTypeObject* version_type = nullptr;  // torch.torch_version.TorchVersion (optional)
    // torch._ops.OpOverloadPacket and OpOverload: torch.ops.ns.op(...) (optional)
    std::vector<PyTypeObject*> op_types;
    // torch.nn.modules.module's global hook dicts (forward, pre-forward, backward ...): a hook
    // there runs around every module call.
    std::vector<std::pair<std::string, py::Ref>> global_hooks;
    py::Ref is_grad_enabled;              // torch.is_grad_enabled
    py::Ref tensor_size;                  // torch.Tensor.size (symbolic sizes read at replay)
    py::Ref tensor_numel;                 // torch.Tensor.numel
    py::Ref torch_module;                 // torch
    py::Ref module_call;                  // torch.nn.Module.__call__ (the function)
    py::Ref tensor_base_type;             // torch._C._TensorBase
    py::Ref set_grad_enabled_fn;          // torch._C._set_grad_enabled
    py::Ref cached_property_get;          // functools.cached_property.__get__ (a function)
    py::Ref functools_partial;            // functools.partial
    // What torch.Tensor's own __torch_function__ and __torch_dispatch__ are (as found in its
    // __dict__), and torch._C._disabled_torch_function_impl (nn.Parameter's): a tensor class
    // with others runs Python of its own on every op (runs_python_on_ops)
    py::Ref tensor_torch_function, tensor_torch_dispatch, disabled_torch_function;
    // torch.library._impls: "ns/op[.overload]/DispatchKey" for each kernel registered from
    // Python (optional; op_has_python_kernel)
    py::Ref library_impls;
    // Context managers whose `with` blocks are captured (their __enter__/__exit__ replayed as
    // steps): torch.no_grad, enable_grad, set_grad_enabled, inference_mode, autocast (and its
    // cpu/cuda variants), contextlib.nullcontext. Missing ones are skipped.
    std::vector<py::Ref> context_types;
    // nn.Module's generators over its members (parameters, named_parameters, buffers,
    // named_buffers, children, named_children, modules, named_modules), by name.
    std::vector<std::pair<std::string, py::Ref>> module_member_fns;
    const std::string* module_member_fn(PyObject* f) const {
        for (const auto& [name, fn] : module_member_fns)
            if (fn.get() == f) return &name;
        return nullptr;
    }
    bool is_context_type(PyObject* t) const {
        for (const py::Ref& c : context_types)
            if (c.get() == t) return true;
        return false;
    }
};

// PRECONDITION: GIL held. Returns false with a Python error set when torch cannot be used.
bool init_torch_api();
const TorchApi& torch_api();

// Whether tensors of class `t` run Python of their own on every op: a subclass whose
// __torch_function__ or __torch_dispatch__ is not torch.Tensor's (nn.Parameter's disabled one
// is not). PRECONDITION: GIL held.
bool runs_python_on_ops(PyTypeObject* t);
// Whether operator `ns::name` (any overload) has a kernel registered from Python
// (torch.library) for a dispatch key other than Meta, which runs only on meta tensors, as
// refresh_python_kernels() last found them (each capture starts with it).
// PRECONDITION: GIL held.
bool op_has_python_kernel(const std::string& ns, const std::string& name);
void refresh_python_kernels();

// Whether a TorchFunctionMode or TorchDispatchMode is active on this thread: it runs Python
// for every op the code calls, which a compiled graph would not. PRECONDITION: GIL held.
bool python_modes_active();

// A module of torch's own: "torch" or "torch.<anything>".
bool is_torch_module_name(const std::string& name);
// The same for a name held as a Python str (a module's __name__, a class's __module__); false
// for null or anything else.
bool names_torch_module(PyObject* name);

}  // namespace magpy
