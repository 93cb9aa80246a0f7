// avg_pool2d(x, kernel 2, stride 1, no padding) with its output's channels split at `split`:
// the pooling of YOLOv9's AConv (split = C, the second part empty) and ADown (two halves).
//
// On CUDA with channels_last activations in float32/float16/bfloat16, and when switched on, one
// autograd node runs this project's kernels (kernels/pool2.hpp: 8 channels per thread, both parts
// written as contiguous channels_last tensors, ATen's arithmetic); elsewhere ATen's avg_pool2d
// and two channel slices of its output. Off by default (LIBREYOLO_FUSED_POOL=1 turns it on) until
// measured on the GPU machine.
#pragma once
#include <torch/torch.h>

#include <utility>

namespace libreyolo::models {

std::pair<torch::Tensor, torch::Tensor> avg_pool2_split(const torch::Tensor& x, int64_t split);

// Process-wide switch of the kernel path (default: LIBREYOLO_FUSED_POOL=1 in the environment).
void set_fused_pool(bool on);
bool fused_pool();

}  // namespace libreyolo::models
