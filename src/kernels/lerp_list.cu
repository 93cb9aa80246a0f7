#include "kernels/lerp_list.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace libreyolo::kernels {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float lerp_one(float d, float s, float w) {
  // diff = s - d; diff *= w; d += diff: each rounded on its own, as ATen's three passes do.
  return __fadd_rn(d, __fmul_rn(__fsub_rn(s, d), w));
}

__global__ void __launch_bounds__(kThreads) lerp_items_kernel(const LerpItem* __restrict__ items,
                                                              const float* __restrict__ weight) {
  const LerpItem it = items[blockIdx.x];
  const float w = *weight;
  const bool aligned = ((reinterpret_cast<uintptr_t>(it.dst) | reinterpret_cast<uintptr_t>(it.src)) & 15) == 0;
  int64_t done = 0;
  if (aligned) {
    const int64_t n4 = it.count / 4;
    auto* d4 = reinterpret_cast<float4*>(it.dst);
    const auto* s4 = reinterpret_cast<const float4*>(it.src);
    for (int64_t i = threadIdx.x; i < n4; i += kThreads) {
      float4 d = d4[i];
      const float4 s = s4[i];
      d.x = lerp_one(d.x, s.x, w);
      d.y = lerp_one(d.y, s.y, w);
      d.z = lerp_one(d.z, s.z, w);
      d.w = lerp_one(d.w, s.w, w);
      d4[i] = d;
    }
    done = n4 * 4;
  }
  for (int64_t i = done + threadIdx.x; i < it.count; i += kThreads) it.dst[i] = lerp_one(it.dst[i], it.src[i], w);
}

}  // namespace

void lerp_items(const LerpItem* items, int n_items, const float* weight, cudaStream_t stream) {
  if (n_items <= 0) return;
  lerp_items_kernel<<<n_items, kThreads, 0, stream>>>(items, weight);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("lerp_items: ") + cudaGetErrorString(e));
}

}  // namespace libreyolo::kernels
