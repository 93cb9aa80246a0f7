// DFL head decode in one kernel. See dfl_decode.hpp for the contract.
#include "kernels/dfl_decode.hpp"

#include "kernels/elements.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace libreyolo::kernels {
namespace {

constexpr int kThreads = 128;

struct Levels {
  const void* data[4];
  int height[4], width[4], stride[4];
  int64_t first[5];  // first anchor of each level; first[levels] = A
  int count;
};

// One thread per (image, anchor): reads the anchor's 4R + nc channels, writes its 4 + nc outputs
// (consecutive threads write consecutive anchors of each output row).
template <typename T, int R>
__global__ void __launch_bounds__(kThreads)
    dfl_decode_kernel(Levels lv, int64_t batch, int nc, float* __restrict__ out) {
  const int64_t A = lv.first[lv.count];
  const int64_t total = batch * A;
  const int C = 4 * R + nc;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t b = i / A, a = i % A;
    int l = 0;
    while (l + 1 < lv.count && a >= lv.first[l + 1]) ++l;
    const int64_t cell = a - lv.first[l];
    const int W = lv.width[l], H = lv.height[l], s = lv.stride[l];
    const int gx = static_cast<int>(cell % W), gy = static_cast<int>(cell / W);
    const T* p = static_cast<const T*>(lv.data[l]) + ((b * H + gy) * W + gx) * C;
    float* o = out + b * (4 + nc) * A + a;
    const float cx = static_cast<float>(gx * s + s / 2), cy = static_cast<float>(gy * s + s / 2);
    float dist[4];
#pragma unroll
    for (int side = 0; side < 4; ++side) {
      float v[R];
      float m = -INFINITY;
#pragma unroll
      for (int k = 0; k < R; ++k) {
        v[k] = to_float(p[side * R + k]);
        m = fmaxf(m, v[k]);
      }
      float sum = 0.f;
#pragma unroll
      for (int k = 0; k < R; ++k) {
        v[k] = expf(v[k] - m);
        sum += v[k];
      }
      float e = 0.f;
#pragma unroll
      for (int k = 0; k < R; ++k) e += (v[k] / sum) * static_cast<float>(k);
      dist[side] = e * static_cast<float>(s);
    }
    o[0] = cx - dist[0];
    o[A] = cy - dist[1];
    o[2 * A] = cx + dist[2];
    o[3 * A] = cy + dist[3];
    for (int c = 0; c < nc; ++c) o[(4 + c) * A] = 1.f / (1.f + expf(-to_float(p[4 * R + c])));
  }
}

}  // namespace

void dfl_decode(const DflDecodeLaunch& l, float* out) {
  if (l.levels < 1 || l.levels > 4 || l.reg_max != 16 || l.classes < 0 || l.batch < 0)
    throw std::invalid_argument("dfl_decode: bad launch");
  Levels lv{};
  lv.count = l.levels;
  lv.first[0] = 0;
  for (int i = 0; i < l.levels; ++i) {
    const DflDecodeLevel& d = l.level[i];
    if (!d.data || d.height < 1 || d.width < 1 || d.stride < 1) throw std::invalid_argument("dfl_decode: bad level");
    lv.data[i] = d.data;
    lv.height[i] = d.height;
    lv.width[i] = d.width;
    lv.stride[i] = d.stride;
    lv.first[i + 1] = lv.first[i] + static_cast<int64_t>(d.height) * d.width;
  }
  const int64_t total = l.batch * lv.first[l.levels];
  if (total == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65535));
  switch (l.dtype) {
    case DType::Float32: dfl_decode_kernel<float, 16><<<blocks, kThreads, 0, l.stream>>>(lv, l.batch, l.classes, out); break;
    case DType::Float16: dfl_decode_kernel<__half, 16><<<blocks, kThreads, 0, l.stream>>>(lv, l.batch, l.classes, out); break;
    case DType::BFloat16:
      dfl_decode_kernel<__nv_bfloat16, 16><<<blocks, kThreads, 0, l.stream>>>(lv, l.batch, l.classes, out);
      break;
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("dfl_decode: ") + cudaGetErrorString(e));
}

}  // namespace libreyolo::kernels
