// 2x2 average pooling with stride 1 and no padding over NHWC (channels_last) activations, the
// pooling of the AConv and ADown downsampling blocks: y[n, h, w, c] = (x[h, w] + x[h, w+1] + x[h+1, w] +
// x[h+1, w+1]) / 4 in float32, rounded once to the element type, for h < H-1, w < W-1, in ATen's
// order of summation (its NHWC kernels', so results are the same bits). The output's channels are
// written split at `split` into two NHWC tensors (ADown convolves the halves separately; AConv
// passes split = C), so no caller slices a channel range out of an NHWC tensor.
//
// ATen's NHWC pooling kernels compute one element per thread with 64-bit index arithmetic; these
// move `vec` channels (16 bytes in bf16/fp16) per thread. Plain pointers and a cudaStream_t only,
// so the .cu file needs no torch headers; layers/pool2.cpp is the torch side.
#pragma once
#include <cstdint>

#include "kernels/bn_act.hpp"  // DType

namespace libreyolo::kernels {

struct Pool2Launch {
  int64_t batch = 0;
  int height = 0, width = 0;  // of the input; the output is (height-1) x (width-1)
  int channels = 0;
  int split = 0;              // output channels [0, split) go to `a`, [split, channels) to `b`
  int64_t in_pixel = 0;       // forward: elements from one input pixel to the next (0: channels; more
                              // for a channel slice of a wider NHWC tensor)
  DType dtype = DType::Float32;
  int vec = 1;                // from avg_pool2_vector_width(), 1 unless every pointer is aligned for it
  cudaStream_t stream = nullptr;
};

// Channels per thread the shape allows (the caller still checks pointer alignment).
int avg_pool2_vector_width(int channels, int split);

// x: [N, H, W, C] (pixel stride in_pixel); a: [N, H-1, W-1, split]; b: [N, H-1, W-1, C-split]
// (null when split == C).
void avg_pool2_forward(const Pool2Launch& l, const void* x, void* a, void* b);
// The input gradient from the two output gradients (ga, gb as a, b above; gb may be null when
// split == C; a null ga or gb counts as zeros). ATen's rounding: each output gradient divided by 4
// in the element type, summed in float32, rounded once.
void avg_pool2_backward(const Pool2Launch& l, const void* ga, const void* gb, void* gx);

}  // namespace libreyolo::kernels
