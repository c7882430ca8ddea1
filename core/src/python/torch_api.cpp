#include "python/torch_api.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <algorithm>
#include <string>
#include <unordered_set>

namespace magpy {

// Never destroyed: it holds Python references, which must not be released after the
// interpreter has finalised (static destructors run after Py_Finalize).
static TorchApi& g_api = *new TorchApi();

static PyTypeObject* get_type(PyObject* mod, const char* name) {
    PyObject* t = PyObject_GetAttrString(mod, name);  // new ref, kept for the process lifetime
    if (t && !PyType_Check(t)) {
        Py_DECREF(t);
        PyErr_Format(PyExc_TypeError, "magpy: torch attribute %s is not a type", name);
        return nullptr;
    }
    return reinterpret_cast<PyTypeObject*>(t);
}

bool init_torch_api() {
    if (g_api.tensor_type) return true;
    py::Ref torch = py::Ref::steal(PyImport_ImportModule("torch"));
    if (!torch) return false;
    py::Ref nn = py::Ref::steal(PyImport_ImportModule("torch.nn"));
    if (!nn) return false;
    TorchApi api;
    api.tensor_type = get_type(torch.get(), "Tensor");
    api.size_type = get_type(torch.get(), "Size");
    api.dtype_type = get_type(torch.get(), "dtype");
    api.device_type = get_type(torch.get(), "device");
    api.layout_type = get_type(torch.get(), "layout");
    api.parameter_type = get_type(nn.get(), "Parameter");
    api.module_type = get_type(nn.get(), "Module");
    api.sequential_type = get_type(nn.get(), "Sequential");
    api.module_list_type = get_type(nn.get(), "ModuleList");
    api.module_dict_type = get_type(nn.get(), "ModuleDict");
    api.parameter_list_type = get_type(nn.get(), "ParameterList");
    if (!api.parameter_list_type) PyErr_Clear();
    api.parameter_dict_type = get_type(nn.get(), "ParameterDict");
    if (!api.parameter_dict_type) PyErr_Clear();
    if (!api.tensor_type || !api.size_type || !api.dtype_type || !api.device_type || !api.layout_type ||
        !api.parameter_type || !api.module_type || !api.sequential_type ||
        !api.module_list_type || !api.module_dict_type)
        return false;
    api.is_grad_enabled = py::Ref::steal(PyObject_GetAttrString(torch.get(), "is_grad_enabled"));
    api.module_call = py::Ref::steal(
        PyObject_GetAttrString(reinterpret_cast<PyObject*>(api.module_type), "__call__"));
    py::Ref c = py::Ref::steal(PyObject_GetAttrString(torch.get(), "_C"));
    if (c) api.tensor_base_type = py::Ref::steal(PyObject_GetAttrString(c.get(), "_TensorBase"));
    api.tensor_size = py::Ref::steal(
        PyObject_GetAttrString(reinterpret_cast<PyObject*>(api.tensor_type), "size"));
    api.tensor_numel = py::Ref::steal(
        PyObject_GetAttrString(reinterpret_cast<PyObject*>(api.tensor_type), "numel"));
    if (!api.is_grad_enabled || !api.module_call || !api.tensor_base_type || !api.tensor_size ||
        !api.tensor_numel)
        return false;
    py::Ref collections = py::Ref::steal(PyImport_ImportModule("collections"));
    if (!collections) return false;
    api.ordered_dict_type = get_type(collections.get(), "OrderedDict");
    if (!api.ordered_dict_type) return false;
    api.defaultdict_type = get_type(collections.get(), "defaultdict");
    if (!api.defaultdict_type) return false;
    py::Ref tv = py::Ref::steal(PyImport_ImportModule("torch.torch_version"));
    api.version_type = tv ? get_type(tv.get(), "TorchVersion") : nullptr;
    if (!api.version_type) PyErr_Clear();
    py::Ref mm = py::Ref::steal(PyImport_ImportModule("torch.nn.modules.module"));
    if (!mm) return false;
    PyObject* mdict = PyModule_GetDict(mm.get());
    Py_ssize_t pos = 0;
    PyObject *name, *value;
    while (PyDict_Next(mdict, &pos, &name, &value)) {
        std::string n = py::str_of(name);
        if (n.rfind("_global_", 0) == 0 && n.find("hooks") != std::string::npos &&
            PyDict_Check(value))
            api.global_hooks.emplace_back("torch.nn.modules.module." + n, py::Ref::borrow(value));
    }
    if (c) api.set_grad_enabled_fn = py::Ref::steal(PyObject_GetAttrString(c.get(), "_set_grad_enabled"));
    if (!api.set_grad_enabled_fn) return false;
    struct { const char* module; const char* name; } kContexts[] = {
        {"torch", "no_grad"}, {"torch", "enable_grad"}, {"torch", "set_grad_enabled"},
        {"torch", "inference_mode"}, {"torch", "autocast"}, {"torch.cpu.amp", "autocast"},
        {"torch.cuda.amp", "autocast"}, {"contextlib", "nullcontext"}};
    for (const auto& k : kContexts) {
        py::Ref m = py::Ref::steal(PyImport_ImportModule(k.module));
        py::Ref t = m ? py::Ref::steal(PyObject_GetAttrString(m.get(), k.name)) : py::Ref();
        if (t && PyType_Check(t.get())) api.context_types.push_back(std::move(t));
        PyErr_Clear();
    }
    for (const char* n : {"parameters", "named_parameters", "buffers", "named_buffers", "children",
                          "named_children", "modules", "named_modules"}) {
        py::Ref fn = py::Ref::steal(
            PyObject_GetAttrString(reinterpret_cast<PyObject*>(api.module_type), n));
        if (fn) api.module_member_fns.emplace_back(n, std::move(fn));
        PyErr_Clear();
    }
    py::Ref functools = py::Ref::steal(PyImport_ImportModule("functools"));
    if (!functools) return false;
    api.functools_partial = py::Ref::steal(PyObject_GetAttrString(functools.get(), "partial"));
    py::Ref cached = py::Ref::steal(PyObject_GetAttrString(functools.get(), "cached_property"));
    if (!api.functools_partial || !cached) return false;
    api.cached_property_get = py::Ref::steal(PyObject_GetAttrString(cached.get(), "__get__"));
    if (!api.cached_property_get) return false;
    py::Ref ops = py::Ref::steal(PyImport_ImportModule("torch._ops"));
    for (const char* n : {"OpOverloadPacket", "OpOverload"})
        if (PyTypeObject* t = ops ? get_type(ops.get(), n) : nullptr) api.op_types.push_back(t);
    PyErr_Clear();
    for (auto [slot, name] : {std::pair{&api.tensor_torch_function, "__torch_function__"},
                              std::pair{&api.tensor_torch_dispatch, "__torch_dispatch__"}}) {
        PyObject* found = _PyType_Lookup(api.tensor_type, PyUnicode_InternFromString(name));
        *slot = py::Ref::borrow(found);
    }
    if (c) api.disabled_torch_function = py::Ref::steal(
        PyObject_GetAttrString(c.get(), "_disabled_torch_function_impl"));
    py::Ref library = py::Ref::steal(PyImport_ImportModule("torch.library"));
    if (library) api.library_impls = py::Ref::steal(PyObject_GetAttrString(library.get(), "_impls"));
    if (api.library_impls && !PySet_Check(api.library_impls.get())) api.library_impls = py::Ref();
    PyErr_Clear();
    api.torch_module = torch;
    g_api = std::move(api);
    return true;
}

const TorchApi& torch_api() { return g_api; }

bool runs_python_on_ops(PyTypeObject* t) {
    const TorchApi& api = torch_api();
    if (t == api.tensor_type || t == api.parameter_type) return false;
    static PyObject* function_name = PyUnicode_InternFromString("__torch_function__");  // kept
    static PyObject* dispatch_name = PyUnicode_InternFromString("__torch_dispatch__");  // kept
    PyObject* function = _PyType_Lookup(t, function_name);
    if (function != api.tensor_torch_function.get() && function != api.disabled_torch_function.get())
        return true;
    return _PyType_Lookup(t, dispatch_name) != api.tensor_torch_dispatch.get();
}

bool python_modes_active() {
    // (LibTorch's thread-local mode stacks, read directly: this runs on every compiled call)
    return at::impl::PythonTorchFunctionTLS::stack_len() > 0 ||
           c10::impl::TorchDispatchModeTLS::stack_len() > 0;
}

// The keys of torch.library._impls, kept as "ns/op" (overload dropped) for the kernels that
// run on real tensors (torch registers hundreds of its own: Meta kernels, prims).
static std::unordered_set<std::string>& python_kernel_ops() {
    static auto& ops = *new std::unordered_set<std::string>();
    return ops;
}

void refresh_python_kernels() {
    // Read again when the set changed (a Library made or dropped), which the sum of its keys'
    // hashes tells (kept in the set: no string is read for it).
    static Py_uhash_t seen = 0;
    static bool read = false;
    PyObject* impls = torch_api().library_impls.get();
    if (!impls) return;
    Py_uhash_t sum = static_cast<Py_uhash_t>(PySet_GET_SIZE(impls));
    Py_ssize_t pos = 0;
    PyObject* key;
    Py_hash_t hash;
    while (_PySet_NextEntry(impls, &pos, &key, &hash)) sum += static_cast<Py_uhash_t>(hash);
    if (read && sum == seen) return;
    auto& ops = python_kernel_ops();
    ops.clear();
    read = true;
    seen = sum;
    pos = 0;
    while (_PySet_NextEntry(impls, &pos, &key, &hash)) {
        if (!PyUnicode_Check(key)) continue;
        std::string k = py::str_of(key);
        size_t slash = k.rfind('/');
        if (slash == std::string::npos || k.compare(slash + 1, std::string::npos, "Meta") == 0)
            continue;
        std::string op = k.substr(0, slash);
        ops.insert(op.substr(0, std::min(op.find('.'), op.size())));
    }
}

bool op_has_python_kernel(const std::string& ns, const std::string& name) {
    const auto& ops = python_kernel_ops();
    return !ops.empty() && ops.count(ns + "/" + name) > 0;
}

bool is_torch_module_name(const std::string& name) {
    return name == "torch" || name.rfind("torch.", 0) == 0;
}

bool names_torch_module(PyObject* name) {
    return name && PyUnicode_Check(name) && is_torch_module_name(py::str_of(name));
}

}  // namespace magpy
