// Moving a traced graph's linear layers and 2-D convolutions to oneDNN kernels where that is
// measured to be faster, with the weights still read live on every call (no freezing).
// See core/NOTES.md [Note: oneDNN kernels].
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <string>

namespace magpy {

struct OneDnnChoice {
    int linear = 0, linear_moved = 0;  // aten::linear nodes seen, and moved to oneDNN
    int conv = 0, conv_moved = 0;      // 2-D convolutions seen, and moved
    std::string text() const;          // "2 of 3 linear ops run on oneDNN ..." ("" when none seen)
};

// Rewrites the nodes of `graph` (a trace run with autograd off, or with no input needing grad)
// whose oneDNN kernel beat the ATen kernel eager runs for the same shapes on this machine, in
// a timing made once per shape and thread count. Float32 CPU tensors only. Without
// `convolutions`, linear ops only (a graph to be frozen: LibTorch's passes fold batch norms
// into its convolutions and move those to oneDNN themselves).
OneDnnChoice use_onednn_kernels(const std::shared_ptr<torch::jit::Graph>& graph, bool grad_mode,
                                bool convolutions);

}  // namespace magpy
