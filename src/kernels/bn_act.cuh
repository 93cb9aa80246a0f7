// The parts bn_act.cu (one branch) and bn_act_dual.cu (two branches summed before the activation)
// share: the block layout's constants (described at the head of bn_act.cu), vector accesses and
// block reductions on the device, the launch grids and the element-type dispatch on the host.
#pragma once
#include "kernels/bn_act.hpp"

#include "kernels/elements.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace libreyolo::kernels::bn_detail {

constexpr int kThreads = 256;
constexpr int kVec = kernels::bn_act_max_vector_width();

__device__ __forceinline__ float sigmoid(float z) { return 1.f / (1.f + expf(-z)); }

// V consecutive channels of one row as one vector access (Pack: kernels/elements.cuh).
template <typename T, int V>
__device__ __forceinline__ void load_pack(const T* __restrict__ p, int64_t i, float (&out)[V]) {
  const Pack<T, V> k = *reinterpret_cast<const Pack<T, V>*>(p + i);
#pragma unroll
  for (int j = 0; j < V; ++j) out[j] = to_float(k.v[j]);
}

template <typename T, int V>
__device__ __forceinline__ void store_pack(T* __restrict__ p, int64_t i, const float (&in)[V]) {
  Pack<T, V> k;
#pragma unroll
  for (int j = 0; j < V; ++j) k.v[j] = from_float<T>(in[j]);
  *reinterpret_cast<Pack<T, V>*>(p + i) = k;
}

// Loads in flight per thread in the statistics kernel's loops: the loads of kUnroll rows (or
// partials) are issued before any of their arithmetic, so each thread waits for memory once per
// kUnroll rows instead of once per row (each row's Welford update depends on the previous one's).
// Not in the backward reduction: two [kUnroll][V] arrays there spilled to local memory and
// doubled its time on large activations (H200, bench_bn_act).
constexpr int kUnroll = 4;

// V consecutive floats of the partials (written by other blocks of this launch: read through L2).
template <int V>
__device__ __forceinline__ void load_partial(const float* p, float (&out)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      const float4 q = __ldcg(reinterpret_cast<const float4*>(p + j));
      out[j] = q.x, out[j + 1] = q.y, out[j + 2] = q.z, out[j + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = __ldcg(p + j);
  }
}

// Reduces each thread's V (mean, M2) pairs with its count over threadIdx.y (Chan's merge); the
// result lands in row 0: sn[tx], sm[j * kThreads + tx], sq[j * kThreads + tx].
template <int V>
__device__ void block_welford(float n, const float (&mean)[V], const float (&m2)[V], float* sn, float* sm,
                              float* sq) {
  const int tx = threadIdx.x, ty = threadIdx.y, cx = blockDim.x;
  const int i = ty * cx + tx;
  sn[i] = n;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    sm[j * kThreads + i] = mean[j];
    sq[j * kThreads + i] = m2[j];
  }
  __syncthreads();
  for (int s = blockDim.y / 2; s > 0; s >>= 1) {
    if (ty < s) {
      const int k = (ty + s) * cx + tx;
      const float na = sn[i], nb = sn[k];
      if (nb != 0.f) {
        const float nn = na + nb, f = nb / nn;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = sm[j * kThreads + k] - sm[j * kThreads + i];
          sm[j * kThreads + i] += d * f;
          sq[j * kThreads + i] += sq[j * kThreads + k] + d * d * na * f;
        }
        sn[i] = nn;
      }
    }
    __syncthreads();
  }
}

// Calls f(r) for the rows this thread visits: a grid-stride loop over rows, blockDim.y rows per
// block at a time.
template <class F>
__device__ __forceinline__ void for_my_rows(int64_t rows, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += step) f(r);
}

// Sums each thread's K x V values over threadIdx.y; the result lands in row 0:
// s[k][j * kThreads + threadIdx.x].
template <int K, int V>
__device__ void block_sum(const float (&v)[K][V], float (*s)[V * kThreads]) {
  const int tx = threadIdx.x, ty = threadIdx.y, cx = blockDim.x;
  const int i = ty * cx + tx;
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j) s[k][j * kThreads + i] = v[k][j];
  __syncthreads();
  for (int step = blockDim.y / 2; step > 0; step >>= 1) {
    if (ty < step) {
      const int from = (ty + step) * cx + tx;
#pragma unroll
      for (int k = 0; k < K; ++k)
#pragma unroll
        for (int j = 0; j < V; ++j) s[k][j * kThreads + i] += s[k][j * kThreads + from];
    }
    __syncthreads();
  }
}

// Every block increments its channel block's counter after publishing its partials; the block
// that takes the last ticket sees all of them. It resets the counter for the next launch.
__device__ inline bool last_block(unsigned* counters) {
  __shared__ bool is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    const unsigned ticket = atomicAdd(&counters[blockIdx.y], 1u);
    is_last = ticket == gridDim.x - 1;
    if (is_last) counters[blockIdx.y] = 0u;
  }
  __syncthreads();
  return is_last;
}

// Channel sums over the whole grid of each thread's K x V values (thread (x, y) of block (bx, by)
// holds channels g * V .. g * V + V - 1, g = by * blockDim.x + x; `mine` when they exist): every block
// publishes its block sums into `partials` (K planes of gridDim.x * channels floats) and takes a
// ticket; the last block re-reduces all of them. True in that block only, with the totals in row 0:
// s[k][j * kThreads + threadIdx.x]. v is clobbered.
template <int K, int V>
__device__ bool grid_channel_sums(float (&v)[K][V], float (*s)[V * kThreads], bool mine, int g, int channels,
                                  float* partials, unsigned* counters) {
  block_sum<K, V>(v, s);
  const int64_t plane = static_cast<int64_t>(gridDim.x) * channels;
  if (threadIdx.y == 0 && mine) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int64_t at = static_cast<int64_t>(blockIdx.x) * channels + g * V + j;
#pragma unroll
      for (int k = 0; k < K; ++k) partials[k * plane + at] = s[k][j * kThreads + threadIdx.x];
    }
  }
  if (!last_block(counters)) return false;
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j) v[k][j] = 0.f;
  if (mine) {
    for (int p = threadIdx.y; p < static_cast<int>(gridDim.x); p += blockDim.y) {
      const int64_t at = static_cast<int64_t>(p) * channels + g * V;
#pragma unroll
      for (int j = 0; j < V; ++j)
#pragma unroll
        for (int k = 0; k < K; ++k) v[k][j] += __ldcg(partials + k * plane + at + j);
    }
  }
  block_sum<K, V>(v, s);
  return true;
}

// Gradient at the BatchNorm output: dy through SiLU (recomputed from the BN output z) or dy.
__device__ __forceinline__ float bn_out_grad(float dy, float z, bool act) {
  if (!act) return dy;
  const float s = sigmoid(z);
  return dy * s * (1.f + z * (1.f - s));
}

// The smallest power of two >= groups, at most `most`.
inline int channels_per_block(int groups, int most) {
  int cx = 1;
  while (cx < groups && cx < most) cx <<= 1;
  return cx;
}

struct Grid {
  dim3 block;
  int channel_blocks;
};

// Over channel groups of `vec` channels, at most `most` groups (a power of two <= 32) per block.
inline Grid grid_for(int channels, int vec, int most = 32) {
  const int groups = channels / vec;
  const int cx = channels_per_block(groups, most);
  return {dim3(cx, kThreads / cx), (groups + cx - 1) / cx};
}

// The reductions' grid: bn_act_reduce_block_channels() channels per block unless the launch
// says otherwise (the last block of a channel block merges the P partials of its channels alone,
// so narrower blocks merge less each; bench_bn_act sweeps this).
inline Grid reduce_grid(int channels, int vec, int block_groups) {
  if (block_groups <= 0) block_groups = std::max(1, std::min(32, bn_act_reduce_block_channels() / vec));
  return grid_for(channels, vec, std::min(block_groups, 32));
}
inline Grid reduce_grid(const BnActLaunch& l) { return reduce_grid(l.channels, l.vec, l.block_groups); }

// Row-blocks for the elementwise kernels: enough blocks to fill the GPU several times over.
inline int elementwise_row_blocks(int64_t rows, const Grid& g) {
  const int64_t want = (rows + g.block.y - 1) / g.block.y;
  const int64_t cap = std::max<int64_t>(1, 2048 / g.channel_blocks);
  return static_cast<int>(std::max<int64_t>(1, std::min(want, cap)));
}

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <typename Fn>
void dispatch(DType t, Fn&& fn) {
  switch (t) {
    case DType::Float32: fn(static_cast<float*>(nullptr)); break;
    case DType::Float16: fn(static_cast<__half*>(nullptr)); break;
    case DType::BFloat16: fn(static_cast<__nv_bfloat16*>(nullptr)); break;
  }
}

template <typename Fn>
void dispatch_vec(int vec, Fn&& fn) {
  if (vec == kVec)
    fn(std::integral_constant<int, kVec>{});
  else if (vec == 4)
    fn(std::integral_constant<int, 4>{});
  else
    fn(std::integral_constant<int, 1>{});
}

// fn(T*, integral_constant<int, V>) for the launch's element type T and vector width V.
template <typename Fn>
void dispatch_launch(const BnActLaunch& l, Fn&& fn) {
  dispatch(l.dtype, [&](auto* tag) { dispatch_vec(l.vec, [&](auto vc) { fn(tag, vc); }); });
}

inline void check_vec(const BnActLaunch& l, const char* what) {
  if (l.vec != 1 && l.vec != 4 && l.vec != kVec)
    throw std::invalid_argument(std::string(what) + ": unsupported vector width");
  if (l.dy_ld != 0 && (l.dy_ld < l.channels || l.dy_ld % l.vec != 0))
    throw std::invalid_argument(std::string(what) + ": dy's row stride must be >= channels and a multiple of vec");
}

inline int64_t dy_stride(const BnActLaunch& l) { return l.dy_ld != 0 ? l.dy_ld : l.channels; }

// Launches the statistics kernel: the full forward's (mean/invstd/running update) or, with `row`,
// SyncBN's local half. Defined in bn_act.cu; the dual forward takes each branch's statistics with it.
void launch_stats(const BnActLaunch& l, const Grid& g, const void* x, float* partials, unsigned* counters,
                  float* mean, float* invstd, float* running_mean, float* running_var, float momentum, float eps,
                  float* row);

}  // namespace libreyolo::kernels::bn_detail
