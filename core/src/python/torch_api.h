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
    PyTypeObject* size_type = nullptr;    // torch.Size
    PyTypeObject* dtype_type = nullptr;   // torch.dtype
    PyTypeObject* device_type = nullptr;  // torch.device
    PyTypeObject* layout_type = nullptr;  // torch.layout
    PyTypeObject* ordered_dict_type = nullptr;  // collections.OrderedDict
    // torch.nn.modules.module's global hook dicts (forward, pre-forward, backward ...): a hook
    // there runs around every module call.
    std::vector<std::pair<std::string, py::Ref>> global_hooks;
    py::Ref is_grad_enabled;              // torch.is_grad_enabled
    py::Ref tensor_size;                  // torch.Tensor.size (symbolic sizes read at replay)
    py::Ref tensor_numel;                 // torch.Tensor.numel
    py::Ref torch_module;                 // torch
    py::Ref module_call;                  // torch.nn.Module.__call__ (the function)
    py::Ref tensor_base_type;             // torch._C._TensorBase
};

// PRECONDITION: GIL held. Returns false with a Python error set when torch cannot be used.
bool init_torch_api();
const TorchApi& torch_api();

}  // namespace magpy
