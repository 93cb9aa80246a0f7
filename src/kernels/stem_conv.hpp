// The forward of a detector's first convolution: 3 input channels (an image), 3x3, any stride and
// padding, as a direct kernel. cuDNN has no tensor-core engine for 3 channels and takes a generic
// one: 0.47-0.48 ms for a batch of 32 640 px bf16 images into 16 or 32 channels on an H200
// (bench_stem_conv), where reading the input and writing the output once takes under 0.1 ms. A
// thread computes all channels of one output pixel from its 27 inputs, the weights in shared
// memory, accumulating in float32: 140 / 248 us there (16 / 32 channels). (A direct weight
// gradient, a tiled reduction, was slower than cuDNN's at batch 32 and was not kept.)
//
// Layouts: x is NHWC, packed ([N, H, W, 3]); y is NHWC with `out_pixel` elements from one
// pixel's channels to the next (a channel slice of a wider tensor), channels packed; weights are
// [Cout, 3, 3, 3] with the strides given (in elements).
// Plain pointers and a cudaStream_t only; layers/stem_conv.cpp is the torch side.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/bn_act.hpp"  // DType

namespace libreyolo::kernels {

struct StemConvLaunch {
  int64_t batch = 0;
  int height = 0, width = 0;          // input
  int out_height = 0, out_width = 0;  // output
  int out_channels = 0;               // stem_conv_supports
  int stride = 1, padding = 0;
  int64_t out_pixel = 0;              // elements between consecutive output pixels (>= out_channels)
  int64_t w_stride[4] = {0, 0, 0, 0}; // the weight's strides over [Cout, Cin, KH, KW]
  DType dtype = DType::Float32;       // x, weight, y
  cudaStream_t stream = nullptr;
};

// Whether the kernel takes this output channel count in this dtype (3 input channels, 3x3
// assumed): 16, 32 or 64 in float16/bfloat16; 16 in float32 (into 32 channels cuDNN's float32
// engine was faster: 346 us against 380 at batch 32).
bool stem_conv_supports(int out_channels, DType dtype);

// y = conv(x, w) (+ bias, then SiLU when `silu`); bias: float32 [Cout] or null.
void stem_conv_forward(const StemConvLaunch& l, const void* x, const void* w, const float* bias, bool silu, void* y);

}  // namespace libreyolo::kernels
