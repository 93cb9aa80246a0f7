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

// Separable: the maximum over a k x k window is the maximum over its k rows of each row's k-wide
// maximum (NaN included: a NaN anywhere reaches the row maximum, then the window's). Pass 1 reduces
// along W into rows[3][N, H, W, C] (packed), pass 2 along H into the outputs: 13 + 27 reads per
// element instead of 169 (one pass over the 13 x 13 square took 138 us at v9-t batch 32, H200).
// One thread per (pixel, channel), channels fastest: neighbouring threads read neighbouring
// channels of one pixel.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    spp_rows_kernel(const T* __restrict__ x, int64_t total, int H, int W, int C, int64_t in_pixel,
                    T* __restrict__ rows) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int c = static_cast<int>(i % C);
    const int64_t pixel = i / C;  // n * H * W + h * W + w
    const int w = static_cast<int>(pixel % W);
    const T* row = x + (pixel - w) * in_pixel + c;
    float a5 = -INFINITY, a9 = -INFINITY, a13 = -INFINITY;
    const int q0 = max(w - 6, 0), q1 = min(w + 6, W - 1);
    for (int q = q0; q <= q1; ++q) {
      const int dq = q > w ? q - w : w - q;
      const float v = to_float(row[q * in_pixel]);
      a13 = take_max(a13, v);
      if (dq <= 4) a9 = take_max(a9, v);
      if (dq <= 2) a5 = take_max(a5, v);
    }
    rows[i] = from_float<T>(a5);  // maxima of element values: exact in the element type
    rows[total + i] = from_float<T>(a9);
    rows[2 * total + i] = from_float<T>(a13);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    spp_cols_kernel(const T* __restrict__ rows, int64_t total, int H, int W, int C, int64_t out_pixel,
                    T* __restrict__ y5, T* __restrict__ y9, T* __restrict__ y13) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t line = static_cast<int64_t>(W) * C;  // from one image row to the next in `rows`
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int c = static_cast<int>(i % C);
    const int64_t pixel = i / C;
    const int h = static_cast<int>((pixel / W) % H);
    const int r0 = max(h - 6, 0), r1 = min(h + 6, H - 1);
    float m5 = -INFINITY, m9 = -INFINITY, m13 = -INFINITY;
    for (int r = r0; r <= r1; ++r) {
      const int dr = r > h ? r - h : h - r;
      const int64_t at = i + (r - h) * line;
      m13 = take_max(m13, to_float(rows[2 * total + at]));
      if (dr <= 4) m9 = take_max(m9, to_float(rows[total + at]));
      if (dr <= 2) m5 = take_max(m5, to_float(rows[at]));
    }
    const int64_t o = pixel * out_pixel + c;
    y5[o] = from_float<T>(m5);
    y9[o] = from_float<T>(m9);
    y13[o] = from_float<T>(m13);
  }
}

template <typename T>
void launch(const SppPoolLaunch& l, const void* x, void* rows, void* y5, void* y9, void* y13) {
  const int64_t total = l.batch * l.height * l.width * l.channels;
  if (total == 0) return;
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((total + kThreads - 1) / kThreads, 8192)));
  spp_rows_kernel<T><<<blocks, kThreads, 0, l.stream>>>(static_cast<const T*>(x), total, l.height, l.width,
                                                        l.channels, l.in_pixel, static_cast<T*>(rows));
  spp_cols_kernel<T><<<blocks, kThreads, 0, l.stream>>>(static_cast<const T*>(rows), total, l.height, l.width,
                                                        l.channels, l.out_pixel, static_cast<T*>(y5),
                                                        static_cast<T*>(y9), static_cast<T*>(y13));
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("spp_max_pools: ") + cudaGetErrorString(e));
}

}  // namespace

void spp_max_pools(const SppPoolLaunch& l, const void* x, void* rows, void* y5, void* y9, void* y13) {
  if (l.batch < 0 || l.height < 1 || l.width < 1 || l.channels < 1 || l.in_pixel < l.channels ||
      l.out_pixel < l.channels)
    throw std::invalid_argument("spp_max_pools: bad shape");
  switch (l.dtype) {
    case DType::Float32: launch<float>(l, x, rows, y5, y9, y13); break;
    case DType::Float16: launch<__half>(l, x, rows, y5, y9, y13); break;
    case DType::BFloat16: launch<__nv_bfloat16>(l, x, rows, y5, y9, y13); break;
  }
}

}  // namespace libreyolo::kernels
