#include "guards/tensor_check.h"

#include "python/py_ref.h"

#include <ATen/autocast_mode.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/version.h>

namespace magpy {

void tensor_key_of(PyObject* t, TensorKey& key, bool with_strides) {
    const at::Tensor& x = THPVariable_Unpack(t);
    key.dtype = static_cast<int8_t>(x.scalar_type());
    key.device_type = static_cast<int8_t>(x.device().type());
    key.device_index = x.device().index();
    key.layout = static_cast<int8_t>(x.layout());
    key.requires_grad = x.requires_grad();
    key.inference = x.is_inference();
    key.named = x.has_names();
    auto sizes = x.sizes();
    key.sizes.assign(sizes.begin(), sizes.end());
    key.with_strides = with_strides;
    key.strides.clear();
    if (with_strides) {
        auto strides = x.strides();
        key.strides.assign(strides.begin(), strides.end());
        key.storage_offset = x.storage_offset();
    }
}

bool tensor_is_nested(PyObject* t) { return THPVariable_Unpack(t).is_nested(); }

const void* tensor_storage(PyObject* t) {
    const at::Tensor& x = THPVariable_Unpack(t);
    if (x.is_nested() || !x.has_storage()) return nullptr;
    return x.storage().unsafeGetStorageImpl();
}
int64_t tensor_dim(PyObject* t) { return THPVariable_Unpack(t).dim(); }
bool tensor_is_named(PyObject* t) { return THPVariable_Unpack(t).has_names(); }
bool tensor_may_be_a_number(PyObject* t) {
    const at::Tensor& x = THPVariable_Unpack(t);
    if (x.is_nested()) return false;
    return x.dim() == 0 || (x.numel() == 1 && !x.is_floating_point() && !x.is_complex());
}

bool tensor_key_matches(PyObject* t, const TensorKey& key) {
    const at::Tensor& x = THPVariable_Unpack(t);
    if (x.is_nested()) return false;
    if (static_cast<int8_t>(x.scalar_type()) != key.dtype) return false;
    c10::Device d = x.device();
    if (static_cast<int8_t>(d.type()) != key.device_type || d.index() != key.device_index)
        return false;
    if (x.requires_grad() != key.requires_grad) return false;
    if (x.is_inference() != key.inference || x.has_names() != key.named) return false;
    if (static_cast<int8_t>(x.layout()) != key.layout) return false;
    auto sizes = x.sizes();
    if (sizes.size() != key.sizes.size()) return false;
    // A symbolic dim takes any size from 2 up: 0 and 1 change what ops do (squeeze,
    // broadcasting, emptiness), so they are captured apart.
    for (size_t i = 0; i < sizes.size(); ++i)
        if (i < 64 && (key.dynamic >> i) & 1 ? sizes[i] < 2 : sizes[i] != key.sizes[i])
            return false;
    if (key.with_strides) {
        if (x.storage_offset() != key.storage_offset) return false;
        auto strides = x.strides();
        for (size_t i = 0; i < strides.size(); ++i)
            if (strides[i] != key.strides[i]) return false;
    }
    return true;
}

}  // namespace magpy

namespace magpy {
bool grad_mode_enabled() { return c10::GradMode::is_enabled(); }

DispatchState DispatchState::current() {
    DispatchState s;
    s.inference = c10::InferenceMode::is_enabled();
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    s.autocast_cpu = at::autocast::is_autocast_enabled(at::kCPU);
    s.autocast_cuda = at::autocast::is_autocast_enabled(at::kCUDA);
    s.autocast_cpu_dtype = static_cast<int8_t>(at::autocast::get_autocast_dtype(at::kCPU));
    s.autocast_cuda_dtype = static_cast<int8_t>(at::autocast::get_autocast_dtype(at::kCUDA));
#else
    s.autocast_cpu = at::autocast::is_cpu_enabled();
    s.autocast_cuda = at::autocast::is_enabled();
    s.autocast_cpu_dtype = static_cast<int8_t>(at::autocast::get_autocast_cpu_dtype());
    s.autocast_cuda_dtype = static_cast<int8_t>(at::autocast::get_autocast_gpu_dtype());
#endif
    s.default_dtype = static_cast<int8_t>(c10::typeMetaToScalarType(c10::get_default_dtype()));
    return s;
}

bool DispatchState::same_as(const DispatchState& o) const {
    return inference == o.inference && autocast_cpu == o.autocast_cpu &&
           autocast_cuda == o.autocast_cuda && default_dtype == o.default_dtype &&
           (!autocast_cpu || autocast_cpu_dtype == o.autocast_cpu_dtype) &&
           (!autocast_cuda || autocast_cuda_dtype == o.autocast_cuda_dtype);
}

namespace {

std::string dtype_name(int8_t t) {  // torch.float32
    PyObject* d = reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(t)));
    return d ? py::repr_string(d) : "?";
}

const char* py_bool(bool b) { return b ? "True" : "False"; }

// (Python query, expected value) for each part, in the order they are described.
std::vector<std::pair<std::string, std::string>> parts_of(const DispatchState& s) {
    std::vector<std::pair<std::string, std::string>> out = {
        {"torch.is_inference_mode_enabled()", py_bool(s.inference)},
        {"torch.is_autocast_cpu_enabled()", py_bool(s.autocast_cpu)}};
    if (s.autocast_cpu) out.push_back({"torch.get_autocast_cpu_dtype()", dtype_name(s.autocast_cpu_dtype)});
    out.push_back({"torch.is_autocast_enabled()", py_bool(s.autocast_cuda)});
    if (s.autocast_cuda) out.push_back({"torch.get_autocast_gpu_dtype()", dtype_name(s.autocast_cuda_dtype)});
    out.push_back({"torch.get_default_dtype()", dtype_name(s.default_dtype)});
    return out;
}

}  // namespace

std::string DispatchState::describe() const {
    std::string out;
    for (const auto& [query, value] : parts_of(*this))
        out += (out.empty() ? "" : " and ") + query + " == " + value;
    return out;
}

std::string DispatchState::difference(const DispatchState& now) const {
    auto want = parts_of(*this), got = parts_of(now);
    for (const auto& [query, value] : want)
        for (const auto& [q2, v2] : got)
            if (query == q2 && value != v2)
                return "torch state: expected " + query + " == " + value + ", got " + v2;
    return {};
}

}  // namespace magpy
