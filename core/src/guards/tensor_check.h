// The fast tensor check: reads an at::Tensor's metadata in C++ (no Python attribute calls).
// Kept in its own file because it is the only part of guards/ that includes LibTorch headers.
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <vector>

namespace magpy {

struct TensorKey {
    int8_t dtype = -1;        // c10::ScalarType
    int8_t device_type = -1;  // c10::DeviceType
    int8_t device_index = -1;
    int8_t layout = -1;       // c10::Layout (strided, sparse ...)
    bool requires_grad = false;
    // An inference tensor (made under inference_mode) or one with dimension names: ops that
    // succeed on the others raise on these (saved for backward, changed in place, names that
    // do not match), so a replay would raise where the capture did not.
    bool inference = false;
    bool named = false;
    std::vector<int64_t> sizes;
    uint64_t dynamic = 0;          // bit d: dim d is symbolic (any size; the rank is checked)
    bool with_strides = false;     // strides and storage offset checked
    std::vector<int64_t> strides;
    int64_t storage_offset = 0;
};

// PRECONDITION (all three): `t` is a torch.Tensor (type already checked).
// A nested tensor has no sizes(): no key is made from one, and none matches it.
bool tensor_is_nested(PyObject* t);
int64_t tensor_dim(PyObject* t);
bool tensor_is_named(PyObject* t);  // it has dimension names
// 0-dim, or one element of an integer or bool dtype: torch may read it as a number (a size,
// a dim, a step) where an op takes one.
bool tensor_may_be_a_number(PyObject* t);
// Fills `key`; `t` is not nested.
void tensor_key_of(PyObject* t, TensorKey& key, bool with_strides);
bool tensor_key_matches(PyObject* t, const TensorKey& key);
// Which memory the tensor's elements live in (its StorageImpl; views share it with their base);
// null when it has none (sparse, nested, meta-less). Compared, never dereferenced.
const void* tensor_storage(PyObject* t);
// torch.is_grad_enabled() for this thread, read in C++.
bool grad_mode_enabled();

// The rest of this thread's state that changes what the same ops on the same inputs give:
// inference mode (inference tensors, no autograd), autocast for CPU and CUDA (the dtype ops
// compute in) and the default dtype (what factory functions make). A capture holds for the
// state it was made in: the dtypes it saw, the branches on them. Autocast's dtype counts only
// while autocast is on.
struct DispatchState {
    bool inference = false;
    bool autocast_cpu = false;
    bool autocast_cuda = false;
    int8_t autocast_cpu_dtype = -1;   // c10::ScalarType
    int8_t autocast_cuda_dtype = -1;
    int8_t default_dtype = -1;

    static DispatchState current();
    bool same_as(const DispatchState& o) const;
    // As Python reads it: `torch.is_inference_mode_enabled() == False and ...`.
    std::string describe() const;
    // The first part that differs from `now`, in the user's terms; empty when none does.
    std::string difference(const DispatchState& now) const;
};

}  // namespace magpy
