// The epilogue of a BatchNorm-folded inference convolution: y = act(y + bias[channel]) in place,
// one elementwise kernel (ATen would take two: the bias add, then SiLU). Plain pointers and a
// cudaStream_t only, so the .cu file needs no torch headers; layers/conv_bn_act.cpp is the torch side.
#pragma once
#include <cstdint>

#include "kernels/bn_act.hpp"  // DType

namespace libreyolo::kernels {

struct BiasActLaunch {
  int64_t numel = 0;
  int channels = 0;
  // Elements between consecutive channels of one pixel's neighbourhood: 1 for NHWC (the channel of
  // element i is i % C), H*W for NCHW (the channel is (i / (H*W)) % C).
  int64_t inner = 1;
  DType dtype = DType::Float32;
  bool act = true;  // SiLU after the bias
  cudaStream_t stream = nullptr;
};

// y: numel elements of dtype (contiguous in the layout `inner` describes); bias: C float32 values.
// The bias is added and SiLU applied in float32, rounded once to dtype.
void bias_act_inplace(const BiasActLaunch& l, void* y, const float* bias);

}  // namespace libreyolo::kernels
