#include "guards/tensor_check.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/python_variable.h>

namespace magpy {

void tensor_key_of(PyObject* t, TensorKey& key, bool with_strides) {
    const at::Tensor& x = THPVariable_Unpack(t);
    key.dtype = static_cast<int8_t>(x.scalar_type());
    key.device_type = static_cast<int8_t>(x.device().type());
    key.device_index = x.device().index();
    key.layout = static_cast<int8_t>(x.layout());
    key.requires_grad = x.requires_grad();
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
int64_t tensor_dim(PyObject* t) { return THPVariable_Unpack(t).dim(); }

bool tensor_key_matches(PyObject* t, const TensorKey& key) {
    const at::Tensor& x = THPVariable_Unpack(t);
    if (x.is_nested()) return false;
    if (static_cast<int8_t>(x.scalar_type()) != key.dtype) return false;
    c10::Device d = x.device();
    if (static_cast<int8_t>(d.type()) != key.device_type || d.index() != key.device_index)
        return false;
    if (x.requires_grad() != key.requires_grad) return false;
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
}  // namespace magpy
