// Bias + optional SiLU in place, per channel. See bias_act.hpp for the contract.
//
// NHWC with C a multiple of the vector width: each thread takes 16 bytes of one pixel (4 float32 or
// 8 half/bfloat16 channels) as one vector load and store. Otherwise one element per thread, its
// channel found by division. 32-bit indices when every index fits.
#include "kernels/bias_act.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/elements.cuh"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace libreyolo::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

__device__ __forceinline__ float epilogue(float v, float b, bool act) {
  v += b;
  return act ? v / (1.f + expf(-v)) : v;
}


// NHWC: pack p covers channels (p % packs_per_row) * V ... + V - 1 of one pixel.
template <typename T, int V, typename I>
__global__ void bias_act_nhwc(T* __restrict__ y, I packs, I packs_per_row, const float* __restrict__ bias, bool act) {
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I p = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    const int c0 = static_cast<int>(p % packs_per_row) * V;
    Pack<T, V> k = reinterpret_cast<const Pack<T, V>*>(y)[p];
#pragma unroll
    for (int j = 0; j < V; ++j) k.v[j] = from_float<T>(epilogue(to_float(k.v[j]), __ldg(bias + c0 + j), act));
    reinterpret_cast<Pack<T, V>*>(y)[p] = k;
  }
}

// Any layout that `inner` describes, one element per thread.
template <typename T, typename I>
__global__ void bias_act_any(T* __restrict__ y, I numel, I inner, I channels, const float* __restrict__ bias,
                             bool act) {
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const I c = (i / inner) % channels;
    y[i] = from_float<T>(epilogue(to_float(y[i]), __ldg(bias + c), act));
  }
}

unsigned blocks_for(int64_t items) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads, kMaxBlocks)));
}

template <typename T>
void launch(const BiasActLaunch& l, void* y, const float* bias) {
  T* p = static_cast<T*>(y);
  constexpr int V = static_cast<int>(16 / sizeof(T));
  // Every index (and index + grid stride) below 2^32 when numel <= 2^31.
  const bool narrow = l.numel <= (int64_t{1} << 31);
  const bool vec = l.inner == 1 && l.channels % V == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  if (vec) {
    const int64_t packs = l.numel / V, per_row = l.channels / V;
    if (narrow) {
      bias_act_nhwc<T, V, uint32_t><<<blocks_for(packs), kThreads, 0, l.stream>>>(
          p, static_cast<uint32_t>(packs), static_cast<uint32_t>(per_row), bias, l.act);
    } else {
      bias_act_nhwc<T, V, uint64_t><<<blocks_for(packs), kThreads, 0, l.stream>>>(
          p, static_cast<uint64_t>(packs), static_cast<uint64_t>(per_row), bias, l.act);
    }
  } else if (narrow) {
    bias_act_any<T, uint32_t><<<blocks_for(l.numel), kThreads, 0, l.stream>>>(
        p, static_cast<uint32_t>(l.numel), static_cast<uint32_t>(l.inner), static_cast<uint32_t>(l.channels), bias,
        l.act);
  } else {
    bias_act_any<T, uint64_t><<<blocks_for(l.numel), kThreads, 0, l.stream>>>(
        p, static_cast<uint64_t>(l.numel), static_cast<uint64_t>(l.inner), static_cast<uint64_t>(l.channels), bias,
        l.act);
  }
}

}  // namespace

void bias_act_inplace(const BiasActLaunch& l, void* y, const float* bias) {
  if (l.numel == 0) return;
  if (l.channels < 1 || l.inner < 1) throw std::invalid_argument("bias_act_inplace: bad channels or inner size");
  switch (l.dtype) {
    case DType::Float32: launch<float>(l, y, bias); break;
    case DType::Float16: launch<__half>(l, y, bias); break;
    case DType::BFloat16: launch<__nv_bfloat16>(l, y, bias); break;
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("bias_act_inplace: ") + cudaGetErrorString(e));
}

}  // namespace libreyolo::kernels
