// uint8 NHWC images -> network input, one thread per pixel. See network_input.hpp.
#include "kernels/network_input.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/elements.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace libreyolo::kernels {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void network_input_kernel(const uint8_t* __restrict__ src, int64_t pixels, int64_t plane, bool bgr,
                                     float scale, bool channels_last, T* __restrict__ dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < pixels; p += stride) {
    const uint8_t* px = src + p * 3;
    float v[3] = {static_cast<float>(px[0]), static_cast<float>(px[1]), static_cast<float>(px[2])};
    if (bgr) {
      const float t = v[0];
      v[0] = v[2];
      v[2] = t;
    }
    if (channels_last) {
#pragma unroll
      for (int c = 0; c < 3; ++c) dst[p * 3 + c] = from_float<T>(v[c] * scale);
    } else {
      const int64_t n = p / plane, hw = p - n * plane;
#pragma unroll
      for (int c = 0; c < 3; ++c) dst[(n * 3 + c) * plane + hw] = from_float<T>(v[c] * scale);
    }
  }
}

}  // namespace

void network_input(const NetworkInputLaunch& l, const uint8_t* src, void* dst) {
  const int64_t plane = l.height * l.width, pixels = l.batch * plane;
  if (pixels <= 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((pixels + kThreads - 1) / kThreads, 65535));
  switch (l.dtype) {
    case DType::Float32:
      network_input_kernel<float><<<blocks, kThreads, 0, l.stream>>>(src, pixels, plane, l.bgr, l.scale,
                                                                     l.channels_last, static_cast<float*>(dst));
      break;
    case DType::Float16:
      network_input_kernel<__half><<<blocks, kThreads, 0, l.stream>>>(src, pixels, plane, l.bgr, l.scale,
                                                                      l.channels_last, static_cast<__half*>(dst));
      break;
    case DType::BFloat16:
      network_input_kernel<__nv_bfloat16><<<blocks, kThreads, 0, l.stream>>>(
          src, pixels, plane, l.bgr, l.scale, l.channels_last, static_cast<__nv_bfloat16*>(dst));
      break;
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("network_input: ") + cudaGetErrorString(e));
}

}  // namespace libreyolo::kernels
