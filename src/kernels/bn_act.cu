// Fused training BatchNorm + SiLU over NHWC memory. See bn_act.hpp for the contract.
//
// Block layout (all four kernels): blockDim.x = CX channels (32, or the next power of two of C
// when C < 32), blockDim.y = RY = 256 / CX rows. Thread (tx, ty) of block (bx, by) owns channel
// by*CX + tx and walks rows bx*RY + ty, stepping by gridDim.x*RY. Consecutive lanes read
// consecutive channels of a row, so loads are coalesced in NHWC.
#include "kernels/bn_act.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace libreyolo::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

__device__ __forceinline__ float sigmoid(float z) { return 1.f / (1.f + expf(-z)); }

// Chan et al.'s pairwise merge of (count, mean, M2) triples.
__device__ __forceinline__ void welford_merge(float& n, float& mean, float& m2, float nb, float meanb,
                                              float m2b) {
  if (nb == 0.f) return;
  const float nn = n + nb;
  const float d = meanb - mean;
  const float f = nb / nn;
  mean += d * f;
  m2 += m2b + d * d * n * f;
  n = nn;
}

// Reduces the per-thread triples over threadIdx.y; the result lands in row 0 of the shared arrays.
__device__ void block_welford(float n, float mean, float m2, float* sn, float* smean, float* sm2) {
  const int tx = threadIdx.x, ty = threadIdx.y, cx = blockDim.x;
  const int i = ty * cx + tx;
  sn[i] = n;
  smean[i] = mean;
  sm2[i] = m2;
  __syncthreads();
  for (int s = blockDim.y / 2; s > 0; s >>= 1) {
    if (ty < s) {
      const int j = (ty + s) * cx + tx;
      float a = sn[i], b = smean[i], c = sm2[i];
      welford_merge(a, b, c, sn[j], smean[j], sm2[j]);
      sn[i] = a;
      smean[i] = b;
      sm2[i] = c;
    }
    __syncthreads();
  }
}

// Sums two per-thread values over threadIdx.y; the result lands in row 0.
__device__ void block_sum2(float a, float b, float* sa, float* sb) {
  const int tx = threadIdx.x, ty = threadIdx.y, cx = blockDim.x;
  const int i = ty * cx + tx;
  sa[i] = a;
  sb[i] = b;
  __syncthreads();
  for (int s = blockDim.y / 2; s > 0; s >>= 1) {
    if (ty < s) {
      sa[i] += sa[i + s * cx];
      sb[i] += sb[i + s * cx];
    }
    __syncthreads();
  }
}

// Every block increments its channel block's counter after publishing its partials; the block
// that takes the last ticket sees all of them. It resets the counter for the next launch.
__device__ bool last_block(unsigned* counters) {
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

template <typename T>
__global__ void __launch_bounds__(kThreads)
    bn_stats_kernel(const T* __restrict__ x, int64_t rows, int channels, float* partials,
                 unsigned* counters, float* mean_out, float* invstd_out, float* running_mean,
                 float* running_var, float momentum, float eps) {
  __shared__ float sn[kThreads], smean[kThreads], sm2[kThreads];
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  const int p_count = gridDim.x;
  float n = 0.f, mean = 0.f, m2 = 0.f;
  if (c < channels) {
    const int64_t step = static_cast<int64_t>(p_count) * blockDim.y;
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += step) {
      const float v = load(x, r * channels + c);
      n += 1.f;
      const float d = v - mean;
      mean += __fdividef(d, n);
      m2 += d * (v - mean);
    }
  }
  block_welford(n, mean, m2, sn, smean, sm2);
  const int64_t plane = static_cast<int64_t>(p_count) * channels;
  if (threadIdx.y == 0 && c < channels) {
    const int64_t at = static_cast<int64_t>(blockIdx.x) * channels + c;
    partials[at] = sn[threadIdx.x];
    partials[plane + at] = smean[threadIdx.x];
    partials[2 * plane + at] = sm2[threadIdx.x];
  }
  if (!last_block(counters)) return;
  n = mean = m2 = 0.f;
  if (c < channels) {
    for (int p = threadIdx.y; p < p_count; p += blockDim.y) {
      const int64_t at = static_cast<int64_t>(p) * channels + c;
      welford_merge(n, mean, m2, __ldcg(partials + at), __ldcg(partials + plane + at),
                    __ldcg(partials + 2 * plane + at));
    }
  }
  block_welford(n, mean, m2, sn, smean, sm2);
  if (threadIdx.y == 0 && c < channels) {
    const float cnt = sn[threadIdx.x], mu = smean[threadIdx.x], ss = sm2[threadIdx.x];
    mean_out[c] = mu;
    invstd_out[c] = rsqrtf(ss / cnt + eps);
    running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * mu;
    running_var[c] = (1.f - momentum) * running_var[c] + momentum * (ss / (cnt - 1.f));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    bn_apply_act_kernel(const T* __restrict__ x, int64_t rows, int channels, const float* __restrict__ gamma,
                 const float* __restrict__ beta, const float* __restrict__ mean,
                 const float* __restrict__ invstd, bool act, T* __restrict__ y) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const float scale = gamma[c] * invstd[c];
  const float shift = beta[c] - mean[c] * scale;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += step) {
    const int64_t i = r * channels + c;
    const float z = load(x, i) * scale + shift;
    store(y, i, act ? z * sigmoid(z) : z);
  }
}

// Gradient at the BatchNorm output: dy through SiLU (recomputed from x) or dy itself.
template <typename T>
__device__ __forceinline__ float bn_out_grad(const T* dy, int64_t i, float z, bool act) {
  const float g = load(dy, i);
  if (!act) return g;
  const float s = sigmoid(z);
  return g * s * (1.f + z * (1.f - s));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    bn_backward_reduce_kernel(const T* __restrict__ dy, const T* __restrict__ x, int64_t rows, int channels,
                           const float* __restrict__ gamma, const float* __restrict__ beta,
                           const float* __restrict__ mean, const float* __restrict__ invstd, bool act,
                           float* partials, unsigned* counters, float* dsum, float* dgamma, float* dbeta,
                           bool accumulate) {
  __shared__ float sa[kThreads], sb[kThreads];
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  const int p_count = gridDim.x;
  float sum_g = 0.f, sum_gx = 0.f;
  if (c < channels) {
    const float mu = mean[c], is = invstd[c], ga = gamma[c], be = beta[c];
    const int64_t step = static_cast<int64_t>(p_count) * blockDim.y;
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += step) {
      const int64_t i = r * channels + c;
      const float xhat = (load(x, i) - mu) * is;
      const float g = bn_out_grad(dy, i, xhat * ga + be, act);
      sum_g += g;
      sum_gx += g * xhat;
    }
  }
  block_sum2(sum_g, sum_gx, sa, sb);
  const int64_t plane = static_cast<int64_t>(p_count) * channels;
  if (threadIdx.y == 0 && c < channels) {
    const int64_t at = static_cast<int64_t>(blockIdx.x) * channels + c;
    partials[at] = sa[threadIdx.x];
    partials[plane + at] = sb[threadIdx.x];
  }
  if (!last_block(counters)) return;
  sum_g = sum_gx = 0.f;
  if (c < channels) {
    for (int p = threadIdx.y; p < p_count; p += blockDim.y) {
      const int64_t at = static_cast<int64_t>(p) * channels + c;
      sum_g += __ldcg(partials + at);
      sum_gx += __ldcg(partials + plane + at);
    }
  }
  block_sum2(sum_g, sum_gx, sa, sb);
  if (threadIdx.y == 0 && c < channels) {
    const float g = sa[threadIdx.x], gx = sb[threadIdx.x];
    dsum[c] = g;
    dsum[channels + c] = gx;
    if (dgamma) dgamma[c] = accumulate ? dgamma[c] + gx : gx;
    if (dbeta) dbeta[c] = accumulate ? dbeta[c] + g : g;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    bn_backward_elemt_kernel(const T* __restrict__ dy, const T* __restrict__ x, int64_t rows, int channels,
                          const float* __restrict__ gamma, const float* __restrict__ beta,
                          const float* __restrict__ mean, const float* __restrict__ invstd, bool act,
                          const float* __restrict__ dsum, T* __restrict__ dx) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const float mu = mean[c], is = invstd[c], ga = gamma[c], be = beta[c];
  const float inv_m = 1.f / static_cast<float>(rows);
  const float mean_g = dsum[c] * inv_m, mean_gx = dsum[channels + c] * inv_m;
  const float k = ga * is;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += step) {
    const int64_t i = r * channels + c;
    const float xhat = (load(x, i) - mu) * is;
    const float g = bn_out_grad(dy, i, xhat * ga + be, act);
    store(dx, i, k * (g - mean_g - xhat * mean_gx));
  }
}

int channels_per_block(int channels) {
  int cx = 1;
  while (cx < channels && cx < 32) cx <<= 1;
  return cx;
}

struct Grid {
  dim3 block;
  int channel_blocks;
};

Grid grid_for(int channels) {
  const int cx = channels_per_block(channels);
  return {dim3(cx, kThreads / cx), (channels + cx - 1) / cx};
}

// Row-blocks for the elementwise kernels: enough blocks to fill the GPU several times over.
int elementwise_row_blocks(int64_t rows, const Grid& g) {
  const int64_t want = (rows + g.block.y - 1) / g.block.y;
  const int64_t cap = std::max<int64_t>(1, 2048 / g.channel_blocks);
  return static_cast<int>(std::max<int64_t>(1, std::min(want, cap)));
}

void check(cudaError_t e, const char* what) {
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

}  // namespace

int bn_act_row_blocks(int64_t rows, int channels) {
  const Grid g = grid_for(channels);
  // At least ~4 rows per thread, at most ~1024 blocks in all.
  const int64_t want = (rows + 4 * g.block.y - 1) / (4 * g.block.y);
  const int64_t cap = std::max<int64_t>(1, 1024 / g.channel_blocks);
  return static_cast<int>(std::max<int64_t>(1, std::min(want, cap)));
}

int bn_act_counters(int channels) { return grid_for(channels).channel_blocks; }

void bn_act_forward(const BnActLaunch& l, const void* x, const float* gamma, const float* beta,
                    float* running_mean, float* running_var, float momentum, float eps, float* partials,
                    unsigned* counters, float* mean, float* invstd, void* y) {
  const Grid g = grid_for(l.channels);
  dispatch(l.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    bn_stats_kernel<T><<<dim3(l.row_blocks, g.channel_blocks), g.block, 0, l.stream>>>(
        static_cast<const T*>(x), l.rows, l.channels, partials, counters, mean, invstd, running_mean,
        running_var, momentum, eps);
    bn_apply_act_kernel<T><<<dim3(elementwise_row_blocks(l.rows, g), g.channel_blocks), g.block, 0, l.stream>>>(
        static_cast<const T*>(x), l.rows, l.channels, gamma, beta, mean, invstd, l.act, static_cast<T*>(y));
  });
  check(cudaGetLastError(), "bn_act_forward");
}

void bn_act_backward(const BnActLaunch& l, const void* dy, const void* x, const float* gamma,
                     const float* beta, const float* mean, const float* invstd, float* partials,
                     unsigned* counters, float* dsum, float* dgamma, float* dbeta, bool accumulate,
                     void* dx) {
  const Grid g = grid_for(l.channels);
  dispatch(l.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    bn_backward_reduce_kernel<T><<<dim3(l.row_blocks, g.channel_blocks), g.block, 0, l.stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), l.rows, l.channels, gamma, beta, mean, invstd,
        l.act, partials, counters, dsum, dgamma, dbeta, accumulate);
    if (dx) {
      bn_backward_elemt_kernel<T>
          <<<dim3(elementwise_row_blocks(l.rows, g), g.channel_blocks), g.block, 0, l.stream>>>(
              static_cast<const T*>(dy), static_cast<const T*>(x), l.rows, l.channels, gamma, beta, mean,
              invstd, l.act, dsum, static_cast<T*>(dx));
    }
  });
  check(cudaGetLastError(), "bn_act_backward");
}

}  // namespace libreyolo::kernels
