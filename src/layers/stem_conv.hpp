// The torch side of the direct 3-channel 3x3 convolution kernel (kernels/stem_conv.hpp): the
// forward of a detector's first convolution, for which cuDNN has only a generic engine. Used by
// the training node (layers/conv_bn_act.cpp; its gradients stay cuDNN's) and by folded inference
// (with the bias and SiLU as its epilogue). LIBREYOLO_STEM_KERNEL=0 (or set_stem_kernel(false))
// leaves the convolution to cuDNN.
#pragma once
#include <torch/torch.h>

namespace libreyolo::models {

void set_stem_kernel(bool on);
bool stem_kernel();
// Kernel launches so far in this process (tests: that a path took the kernel).
int64_t stem_conv_launches();

// Whether the kernels take conv(x, w, stride, padding) with groups 1: CUDA, the switch on, x
// [N, 3, H, W] and w [Cout, 3, 3, 3] of one kernel dtype, Cout as kernels::stem_conv_supports
// says (16, 32 or 64; 16 only in float32). x need not be channels-last (it is made so).
bool stem_conv_applies(const at::Tensor& x, const at::Tensor& w, int64_t stride, int64_t padding, int64_t groups);

// conv(x, w) [+ bias (float32 [Cout])] [then SiLU], in x's dtype, channels-last; written into
// `into` instead (and returned) when it is defined: [N, Cout, OH, OW] of x's dtype, channels-last
// or a channel slice of such a tensor, 16-byte aligned pixels.
at::Tensor stem_conv_forward(const at::Tensor& x, const at::Tensor& w, int64_t stride, int64_t padding,
                             const at::Tensor& bias = {}, bool silu = false, const at::Tensor& into = {});

// Whether stem_conv_forward can write into `into` for this x and w.
bool stem_conv_writes_into(const at::Tensor& into, const at::Tensor& x, const at::Tensor& w, int64_t stride,
                           int64_t padding);

}  // namespace libreyolo::models
