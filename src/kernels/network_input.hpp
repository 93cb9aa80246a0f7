// Images to network input in one pass: [B, H, W, 3] uint8 on the device -> the network's input in
// float32, float16 or bfloat16, channel order flipped when asked, multiplied by `scale`, written
// as NCHW with channels_last (NHWC memory) or contiguous strides. ATen takes three passes over
// the float tensor for the same (the uint8 -> float copy, the division, the first convolution's
// cast to the autocast dtype). Plain pointers only; models/input.cpp is the torch side.
#pragma once
#include <cstdint>

#include "kernels/bn_act.hpp"  // DType

namespace libreyolo::kernels {

struct NetworkInputLaunch {
  int64_t batch = 0, height = 0, width = 0;
  bool bgr = false;            // output channel c takes input channel 2 - c
  float scale = 1.f;           // value = float(pixel) * scale, rounded once to dtype
  bool channels_last = true;   // NHWC memory; else NCHW
  DType dtype = DType::Float32;
  cudaStream_t stream = nullptr;
};

// src: batch*height*width*3 contiguous bytes; dst: the same count of dtype elements.
void network_input(const NetworkInputLaunch& l, const uint8_t* src, void* dst);

}  // namespace libreyolo::kernels
