// SPPELAN's max pools in one pass. See spp_pool.hpp for the contract.
#include "kernels/spp_pool.hpp"

#include "kernels/elements.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace libreyolo::kernels {
namespace {

constexpr int kThreads = 256;

// ATen's max: a NaN wins and stays.
__device__ __forceinline__ float take_max(float m, float v) { return (v > m || isnan(v)) ? v : m; }

// One thread: V channels of one output pixel, all three windows. Each of the 13 rows around it
// is read once (13 columns) and reduced to its 5-, 9- and 13-wide maxima, then those are reduced
// over 5, 9 and 13 rows.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    spp_max_pools_kernel(const T* __restrict__ x, int64_t total, int H, int W, int C, int64_t in_pixel,
                         int64_t out_pixel, T* __restrict__ y5, T* __restrict__ y9, T* __restrict__ y13) {
  const int groups = C / V;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int c0 = static_cast<int>(i % groups) * V;
    const int64_t pixel = i / groups;  // n * H * W + h * W + w
    const int w = static_cast<int>(pixel % W);
    const int64_t rest = pixel / W;
    const int h = static_cast<int>(rest % H);
    const int64_t n = rest / H;
    float m5[V], m9[V], m13[V];
#pragma unroll
    for (int j = 0; j < V; ++j) m5[j] = m9[j] = m13[j] = -INFINITY;
    const int r0 = max(h - 6, 0), r1 = min(h + 6, H - 1), q0 = max(w - 6, 0), q1 = min(w + 6, W - 1);
    for (int r = r0; r <= r1; ++r) {
      const int dr = r > h ? r - h : h - r;
      const T* row = x + ((n * H + r) * W) * in_pixel + c0;
      float a5[V], a9[V], a13[V];
#pragma unroll
      for (int j = 0; j < V; ++j) a5[j] = a9[j] = a13[j] = -INFINITY;
      for (int q = q0; q <= q1; ++q) {
        const int dq = q > w ? q - w : w - q;
        const Pack<T, V> k = *reinterpret_cast<const Pack<T, V>*>(row + q * in_pixel);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float v = to_float(k.v[j]);
          a13[j] = take_max(a13[j], v);
          if (dq <= 4) a9[j] = take_max(a9[j], v);
          if (dq <= 2) a5[j] = take_max(a5[j], v);
        }
      }
#pragma unroll
      for (int j = 0; j < V; ++j) {
        m13[j] = take_max(m13[j], a13[j]);
        if (dr <= 4) m9[j] = take_max(m9[j], a9[j]);
        if (dr <= 2) m5[j] = take_max(m5[j], a5[j]);
      }
    }
    Pack<T, V> o5, o9, o13;
#pragma unroll
    for (int j = 0; j < V; ++j) {  // maxima of element values: exact in the element type
      o5.v[j] = from_float<T>(m5[j]);
      o9.v[j] = from_float<T>(m9[j]);
      o13.v[j] = from_float<T>(m13[j]);
    }
    const int64_t at = pixel * out_pixel + c0;
    *reinterpret_cast<Pack<T, V>*>(y5 + at) = o5;
    *reinterpret_cast<Pack<T, V>*>(y9 + at) = o9;
    *reinterpret_cast<Pack<T, V>*>(y13 + at) = o13;
  }
}

template <typename T, int V>
void launch(const SppPoolLaunch& l, const void* x, void* y5, void* y9, void* y13) {
  const int64_t total = l.batch * l.height * l.width * (l.channels / V);
  if (total == 0) return;
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((total + kThreads - 1) / kThreads, 8192)));
  spp_max_pools_kernel<T, V><<<blocks, kThreads, 0, l.stream>>>(
      static_cast<const T*>(x), total, l.height, l.width, l.channels, l.in_pixel, l.out_pixel, static_cast<T*>(y5),
      static_cast<T*>(y9), static_cast<T*>(y13));
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("spp_max_pools: ") + cudaGetErrorString(e));
}

}  // namespace

void spp_max_pools(const SppPoolLaunch& l, const void* x, void* y5, void* y9, void* y13) {
  if (l.batch < 0 || l.height < 1 || l.width < 1 || l.channels < 1 || l.in_pixel < l.channels ||
      l.out_pixel < l.channels)
    throw std::invalid_argument("spp_max_pools: bad shape");
  // One channel per thread: SPPELAN's maps are small (20x20 at 640 px) and 8 channels per thread
  // left too few threads to hide the reads' latency (H200, v9-t batch 1: 93 us per call).
  switch (l.dtype) {
    case DType::Float32: launch<float, 1>(l, x, y5, y9, y13); break;
    case DType::Float16: launch<__half, 1>(l, x, y5, y9, y13); break;
    case DType::BFloat16: launch<__nv_bfloat16, 1>(l, x, y5, y9, y13); break;
  }
}

}  // namespace libreyolo::kernels
