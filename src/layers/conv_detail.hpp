// What the fused convolution code shares between its files (conv_bn_act.cpp: the training node;
// conv_bias_act.cpp: the inference convolution). Internal to layers/.
#pragma once
#include <ATen/ATen.h>

namespace libreyolo::models::detail {

// [N, C, H, W] in NHWC memory as the [N*H*W, C] matrix it is (a view).
at::Tensor as_rows(const at::Tensor& t);
// The inverse: a GEMM's [N*H*W, K] rows as the [N, K, H, W] tensor they are in NHWC memory (a view),
// N, H and W those of `like`.
at::Tensor rows_as_nchw(const at::Tensor& rows, const at::Tensor& like);
// Channels_last CUDA convolutions in a dtype cuDNN takes, small enough for one cuDNN call (ATen
// splits larger batches itself): call cuDNN's operator directly.
bool direct_cudnn(const at::Tensor& x, const at::Tensor& w, int64_t groups);
// The project's CUDA kernels for the fused blocks are on (LIBREYOLO_FUSED_CONV_KERNELS).
bool fused_kernels_on();

}  // namespace libreyolo::models::detail
