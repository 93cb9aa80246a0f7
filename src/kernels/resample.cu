// PIL's bicubic resampling on the device, one thread per output byte. See resample.hpp.
#include "kernels/resample.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace libreyolo::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kPrecisionBits = 32 - 8 - 2;  // as ops/resample.cpp

__device__ __forceinline__ uint8_t clip8(int64_t v) {
  v >>= kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

__global__ void horizontal_kernel(const uint8_t* __restrict__ src, int64_t src_w, int64_t channels, int64_t row0,
                                  int64_t rows, ResampleTaps tx, int64_t left, int64_t win_w,
                                  uint8_t* __restrict__ mid) {
  const int64_t total = rows * win_w * channels;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t ch = i % channels, ox = (i / channels) % win_w, r = i / (channels * win_w);
    const int64_t xx = left + ox;
    const int64_t f = tx.first[xx], n = tx.count[xx];
    const int32_t* k = tx.weights + xx * tx.ksize;
    const uint8_t* p = src + ((row0 + r) * src_w + f) * channels + ch;
    int64_t s = int64_t{1} << (kPrecisionBits - 1);
    for (int64_t x = 0; x < n; ++x) s += static_cast<int64_t>(p[x * channels]) * k[x];
    mid[i] = clip8(s);
  }
}

__global__ void vertical_kernel(const uint8_t* __restrict__ mid, int64_t stride_bytes, int64_t row0,
                                ResampleTaps ty, int64_t top, int64_t win_h, uint8_t* __restrict__ out) {
  const int64_t total = win_h * stride_bytes;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t oy = i / stride_bytes, b = i - oy * stride_bytes;
    const int64_t yy = top + oy;
    const int64_t f = ty.first[yy] - row0, n = ty.count[yy];
    const int32_t* k = ty.weights + yy * ty.ksize;
    const uint8_t* p = mid + f * stride_bytes + b;
    int64_t s = int64_t{1} << (kPrecisionBits - 1);
    for (int64_t y = 0; y < n; ++y) s += static_cast<int64_t>(p[y * stride_bytes]) * k[y];
    out[i] = clip8(s);
  }
}

int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

void resample_horizontal(const uint8_t* src, int64_t src_w, int64_t channels, int64_t row0, int64_t rows,
                         const ResampleTaps& tx, int64_t left, int64_t win_w, uint8_t* mid, cudaStream_t stream) {
  const int64_t total = rows * win_w * channels;
  if (total <= 0) return;
  horizontal_kernel<<<blocks_for(total), kThreads, 0, stream>>>(src, src_w, channels, row0, rows, tx, left, win_w,
                                                                mid);
  check_launch("resample_horizontal");
}

void resample_vertical(const uint8_t* mid, int64_t stride, int64_t row0, const ResampleTaps& ty, int64_t top,
                       int64_t win_h, uint8_t* out, cudaStream_t stream) {
  const int64_t total = win_h * stride;
  if (total <= 0) return;
  vertical_kernel<<<blocks_for(total), kThreads, 0, stream>>>(mid, stride, row0, ty, top, win_h, out);
  check_launch("resample_vertical");
}

}  // namespace libreyolo::kernels
