// avg_pool2d(x, kernel 2, stride 1, no padding) with its output's channels split at `split`:
// the pooling of the AConv (split = C, the second part empty) and ADown (two halves).
//
// On CUDA with channels_last activations in float32/float16/bfloat16, and when switched on, one
// autograd node runs this project's kernels (kernels/pool2.hpp: 8 channels per thread, both parts
// written as contiguous channels_last tensors, ATen's arithmetic); elsewhere ATen's avg_pool2d
// and two channel slices of its output. On by default (LIBREYOLO_FUSED_POOL=0 turns it off): on
// the H200 the graphed v9-t bf16 step took 19.8/27.1/41.3 ms (b8/16/32, min) with ATen's pooling
// and 19.0/25.7/38.5 ms with these kernels, gradients equal (2026-12-01).
#pragma once
#include <torch/torch.h>

#include <utility>

namespace libreyolo::models {

std::pair<torch::Tensor, torch::Tensor> avg_pool2_split(const torch::Tensor& x, int64_t split);

// Process-wide switch of the kernel path (default on; LIBREYOLO_FUSED_POOL=0 in the environment: off).
void set_fused_pool(bool on);
bool fused_pool();

}  // namespace libreyolo::models
