// Fused training BatchNorm + SiLU over NHWC memory. See bn_act.hpp for the contract.
//
// Block layout (all kernels): each thread owns a group of V consecutive channels (V = 4 when C is a
// multiple of 4 and the pointers allow 4-element vector accesses, else 1; launches may also ask for
// 8), read and written as one vector (8 bytes in bf16/fp16). blockDim.x = CX channel groups (32, or the next power of
// two of C/V when smaller), blockDim.y = RY = 256 / CX rows. Thread (tx, ty) of block (bx, by) owns
// group by*CX + tx and walks rows bx*RY + ty, stepping by gridDim.x*RY. Consecutive lanes read
// consecutive groups of a row, so a warp's loads are contiguous in NHWC.
#include "kernels/bn_act.hpp"

#include "kernels/elements.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>
#include <stdexcept>
#include <string>

namespace libreyolo::kernels {
namespace {

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

// Sums each thread's V pairs of values over threadIdx.y; the result lands in row 0.
template <int V>
__device__ void block_sum2(const float (&a)[V], const float (&b)[V], float* sa, float* sb) {
  const int tx = threadIdx.x, ty = threadIdx.y, cx = blockDim.x;
  const int i = ty * cx + tx;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    sa[j * kThreads + i] = a[j];
    sb[j * kThreads + i] = b[j];
  }
  __syncthreads();
  for (int s = blockDim.y / 2; s > 0; s >>= 1) {
    if (ty < s) {
      const int k = (ty + s) * cx + tx;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sa[j * kThreads + i] += sa[j * kThreads + k];
        sb[j * kThreads + i] += sb[j * kThreads + k];
      }
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

// In all four kernels thread (tx, ty) of block (bx, by) owns the channel group g = by*CX + tx,
// i.e. channels g*V .. g*V+V-1, and walks rows bx*RY + ty stepping by gridDim.x*RY.

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    bn_stats_kernel(const T* __restrict__ x, int64_t rows, int channels, float* partials,
                    unsigned* counters, float* mean_out, float* invstd_out, float* running_mean,
                    float* running_var, float momentum, float eps, float* row) {
  __shared__ float sn[kThreads], sm[V * kThreads], sq[V * kThreads];
  const int g = blockIdx.y * blockDim.x + threadIdx.x;
  const bool mine = g * V < channels;
  const int p_count = gridDim.x;
  float n = 0.f, mean[V], m2[V];
#pragma unroll
  for (int j = 0; j < V; ++j) mean[j] = m2[j] = 0.f;
  if (mine) {
    const int64_t step = static_cast<int64_t>(p_count) * blockDim.y;
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += kUnroll * step) {
      float vs[kUnroll][V];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (r + u * step < rows) load_pack<T, V>(x, (r + u * step) * channels + g * V, vs[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (r + u * step >= rows) break;
        n += 1.f;
        const float inv = __fdividef(1.f, n);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = vs[u][j] - mean[j];
          mean[j] += d * inv;
          m2[j] += d * (vs[u][j] - mean[j]);
        }
      }
    }
  }
  block_welford<V>(n, mean, m2, sn, sm, sq);
  const int64_t plane = static_cast<int64_t>(p_count) * channels;
  if (threadIdx.y == 0 && mine) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int64_t at = static_cast<int64_t>(blockIdx.x) * channels + g * V + j;
      partials[at] = sn[threadIdx.x];
      partials[plane + at] = sm[j * kThreads + threadIdx.x];
      partials[2 * plane + at] = sq[j * kThreads + threadIdx.x];
    }
  }
  if (!last_block(counters)) return;
  // The last block merges the row-blocks' partials, each thread its V channels.
  n = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) mean[j] = m2[j] = 0.f;
  if (mine) {
    for (int p = threadIdx.y; p < p_count; p += kUnroll * blockDim.y) {
      float nbs[kUnroll], mb[kUnroll][V], qb[kUnroll][V];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int pu = p + u * blockDim.y;
        nbs[u] = 0.f;
        if (pu >= p_count) continue;
        const int64_t at = static_cast<int64_t>(pu) * channels + g * V;
        nbs[u] = __ldcg(partials + at);
        load_partial<V>(partials + plane + at, mb[u]);
        load_partial<V>(partials + 2 * plane + at, qb[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (nbs[u] == 0.f) continue;
        const float nn = n + nbs[u], f = nbs[u] / nn;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = mb[u][j] - mean[j];
          mean[j] += d * f;
          m2[j] += qb[u][j] + d * d * n * f;
        }
        n = nn;
      }
    }
  }
  block_welford<V>(n, mean, m2, sn, sm, sq);
  if (threadIdx.y == 0 && mine) {
    const float cnt = sn[threadIdx.x];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int c = g * V + j;
      const float mu = sm[j * kThreads + threadIdx.x], ss = sq[j * kThreads + threadIdx.x];
      if (row) {  // SyncBN: this process's row, merged with the others' after the all-reduce
        row[c] = mu;
        row[channels + c] = rsqrtf(ss / cnt + eps);
        if (c == 0) row[2 * channels] = cnt;
        continue;
      }
      mean_out[c] = mu;
      invstd_out[c] = rsqrtf(ss / cnt + eps);
      running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * mu;
      running_var[c] = (1.f - momentum) * running_var[c] + momentum * (ss / (cnt - 1.f));
    }
  }
}

// One thread per channel: merges the processes' rows [mean, invstd, count] (see bn_act.hpp).
__global__ void bn_merge_rows_kernel(const float* __restrict__ rows, int world, int channels, float eps,
                                     float momentum, float* running_mean, float* running_var, float* stats) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const int64_t stride = 2 * static_cast<int64_t>(channels) + 1;
  float n = 0.f, mean = 0.f, m2 = 0.f;
  for (int r = 0; r < world; ++r) {
    const float* row = rows + r * stride;
    const float nb = row[2 * channels];
    if (nb == 0.f) continue;
    const float is = row[channels + c];
    const float var_b = fmaxf(1.f / (is * is) - eps, 0.f);
    const float nn = n + nb, f = nb / nn, d = row[c] - mean;
    mean += d * f;
    m2 += var_b * nb + d * d * n * f;
    n = nn;
  }
  stats[c] = mean;
  stats[channels + c] = rsqrtf(m2 / n + eps);
  if (c == 0) stats[2 * channels] = n;
  running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * mean;
  running_var[c] = (1.f - momentum) * running_var[c] + momentum * (m2 / (n - 1.f));
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    bn_apply_act_kernel(const T* __restrict__ x, int64_t rows, int channels, const float* __restrict__ gamma,
                        const float* __restrict__ beta, const float* __restrict__ mean,
                        const float* __restrict__ invstd, bool act, const T* __restrict__ addend, bool after_act,
                        T* __restrict__ y) {
  const int g = blockIdx.y * blockDim.x + threadIdx.x;
  if (g * V >= channels) return;
  float scale[V], shift[V], v[V], a[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int c = g * V + j;
    scale[j] = gamma[c] * invstd[c];
    shift[j] = beta[c] - mean[c] * scale[j];
  }
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += step) {
    const int64_t i = r * channels + g * V;
    load_pack<T, V>(x, i, v);
    if (addend) {
      load_pack<T, V>(addend, i, a);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) a[j] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float z = v[j] * scale[j] + shift[j] + (after_act ? 0.f : a[j]);
      v[j] = (act ? z * sigmoid(z) : z) + (after_act ? a[j] : 0.f);
    }
    store_pack<T, V>(y, i, v);
  }
}

// Gradient at the BatchNorm output: dy through SiLU (recomputed from the BN output z) or dy.
__device__ __forceinline__ float bn_out_grad(float dy, float z, bool act) {
  if (!act) return dy;
  const float s = sigmoid(z);
  return dy * s * (1.f + z * (1.f - s));
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    bn_backward_reduce_kernel(const T* __restrict__ dy, int64_t ldy, const T* __restrict__ x, int64_t rows, int channels,
                              const float* __restrict__ gamma, const float* __restrict__ beta,
                              const float* __restrict__ mean, const float* __restrict__ invstd, bool act,
                              const T* __restrict__ addend, float* partials, unsigned* counters, float* dsum,
                              float* dgamma, float* dbeta, bool accumulate, bool sync_sums) {
  __shared__ float sa[V * kThreads], sb[V * kThreads];
  const int g = blockIdx.y * blockDim.x + threadIdx.x;
  const bool mine = g * V < channels;
  const int p_count = gridDim.x;
  float sum_g[V], sum_gx[V];
#pragma unroll
  for (int j = 0; j < V; ++j) sum_g[j] = sum_gx[j] = 0.f;
  if (mine) {
    float mu[V], is[V], ga[V], be[V], xv[V], gv[V], av[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int c = g * V + j;
      mu[j] = mean[c];
      is[j] = invstd[c];
      ga[j] = gamma[c];
      be[j] = beta[c];
      av[j] = 0.f;
    }
    const int64_t step = static_cast<int64_t>(p_count) * blockDim.y;
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += step) {
      const int64_t i = r * channels + g * V;
      load_pack<T, V>(x, i, xv);
      load_pack<T, V>(dy, r * ldy + g * V, gv);
      if (addend) load_pack<T, V>(addend, i, av);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float xhat = (xv[j] - mu[j]) * is[j];
        const float gr = bn_out_grad(gv[j], xhat * ga[j] + be[j] + av[j], act);
        sum_g[j] += gr;
        sum_gx[j] += gr * xhat;
      }
    }
  }
  block_sum2<V>(sum_g, sum_gx, sa, sb);
  const int64_t plane = static_cast<int64_t>(p_count) * channels;
  if (threadIdx.y == 0 && mine) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int64_t at = static_cast<int64_t>(blockIdx.x) * channels + g * V + j;
      partials[at] = sa[j * kThreads + threadIdx.x];
      partials[plane + at] = sb[j * kThreads + threadIdx.x];
    }
  }
  if (!last_block(counters)) return;
#pragma unroll
  for (int j = 0; j < V; ++j) sum_g[j] = sum_gx[j] = 0.f;
  if (mine) {
    for (int p = threadIdx.y; p < p_count; p += blockDim.y) {
      const int64_t at = static_cast<int64_t>(p) * channels + g * V;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sum_g[j] += __ldcg(partials + at + j);
        sum_gx[j] += __ldcg(partials + plane + at + j);
      }
    }
  }
  block_sum2<V>(sum_g, sum_gx, sa, sb);
  if (threadIdx.y == 0 && mine) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int c = g * V + j;
      const float sg = sa[j * kThreads + threadIdx.x], sgx = sb[j * kThreads + threadIdx.x];
      dsum[c] = sg;
      dsum[channels + c] = sync_sums ? sgx / invstd[c] : sgx;
      if (dgamma) dgamma[c] = accumulate ? dgamma[c] + sgx : sgx;
      if (dbeta) dbeta[c] = accumulate ? dbeta[c] + sg : sg;
    }
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    bn_backward_elemt_kernel(const T* __restrict__ dy, int64_t ldy, const T* __restrict__ x, int64_t rows, int channels,
                             const float* __restrict__ gamma, const float* __restrict__ beta,
                             const float* __restrict__ mean, const float* __restrict__ invstd, bool act,
                             const float* __restrict__ dsum, const float* __restrict__ count, bool sync_sums,
                             const T* __restrict__ addend, T* __restrict__ daddend, T* __restrict__ dx) {
  const int g = blockIdx.y * blockDim.x + threadIdx.x;
  if (g * V >= channels) return;
  const float inv_m = 1.f / (count ? *count : static_cast<float>(rows));
  float mu[V], is[V], ga[V], be[V], mean_g[V], mean_gx[V], xv[V], gv[V], av[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int c = g * V + j;
    av[j] = 0.f;
    mu[j] = mean[c];
    is[j] = invstd[c];
    ga[j] = gamma[c];
    be[j] = beta[c];
    mean_g[j] = dsum[c] * inv_m;
    // sum(g * xhat) = invstd * sum(g * (x - mean))
    mean_gx[j] = dsum[channels + c] * inv_m * (sync_sums ? is[j] : 1.f);
  }
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += step) {
    const int64_t i = r * channels + g * V;
    load_pack<T, V>(x, i, xv);
    load_pack<T, V>(dy, r * ldy + g * V, gv);
    if (addend) load_pack<T, V>(addend, i, av);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float xhat = (xv[j] - mu[j]) * is[j];
      const float gr = bn_out_grad(gv[j], xhat * ga[j] + be[j] + av[j], act);
      xv[j] = ga[j] * is[j] * (gr - mean_g[j] - xhat * mean_gx[j]);
      gv[j] = gr;
    }
    if (daddend) store_pack<T, V>(daddend, i, gv);
    if (dx) store_pack<T, V>(dx, i, xv);
  }
}

// ---- Two branches summed before the activation (bn_act.hpp, BnBranch).
// One branch's normalisation as a kernel argument (by value).
struct Affine {
  const float* gamma;
  const float* beta;
  const float* mean;
  const float* invstd;
};

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    bn_dual_apply_kernel(const T* __restrict__ x1, const T* __restrict__ x2, int64_t rows, int channels, Affine a1,
                         Affine a2, bool act, T* __restrict__ y) {
  const int g = blockIdx.y * blockDim.x + threadIdx.x;
  if (g * V >= channels) return;
  float s1[V], s2[V], h[V], v1[V], v2[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int c = g * V + j;
    s1[j] = a1.gamma[c] * a1.invstd[c];
    s2[j] = a2.gamma[c] * a2.invstd[c];
    h[j] = (a1.beta[c] - a1.mean[c] * s1[j]) + (a2.beta[c] - a2.mean[c] * s2[j]);
  }
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += step) {
    const int64_t i = r * channels + g * V;
    load_pack<T, V>(x1, i, v1);
    load_pack<T, V>(x2, i, v2);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float z = v1[j] * s1[j] + v2[j] * s2[j] + h[j];
      v1[j] = act ? z * sigmoid(z) : z;
    }
    store_pack<T, V>(y, i, v1);
  }
}

// Sums each thread's V triples over threadIdx.y; the result lands in row 0.
template <int V>
__device__ void block_sum3(const float (&a)[V], const float (&b)[V], const float (&c)[V], float* sa, float* sb,
                           float* sc) {
  const int tx = threadIdx.x, ty = threadIdx.y, cx = blockDim.x;
  const int i = ty * cx + tx;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    sa[j * kThreads + i] = a[j];
    sb[j * kThreads + i] = b[j];
    sc[j * kThreads + i] = c[j];
  }
  __syncthreads();
  for (int s = blockDim.y / 2; s > 0; s >>= 1) {
    if (ty < s) {
      const int k = (ty + s) * cx + tx;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sa[j * kThreads + i] += sa[j * kThreads + k];
        sb[j * kThreads + i] += sb[j * kThreads + k];
        sc[j * kThreads + i] += sc[j * kThreads + k];
      }
    }
    __syncthreads();
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    bn_dual_backward_reduce_kernel(const T* __restrict__ dy, int64_t ldy, const T* __restrict__ x1,
                                   const T* __restrict__ x2, int64_t rows, int channels, Affine a1, Affine a2,
                                   bool act, float* partials, unsigned* counters, float* dsum, float* dgamma1,
                                   float* dbeta1, float* dgamma2, float* dbeta2, bool accumulate) {
  __shared__ float sa[V * kThreads], sb[V * kThreads], sc[V * kThreads];
  const int g = blockIdx.y * blockDim.x + threadIdx.x;
  const bool mine = g * V < channels;
  const int p_count = gridDim.x;
  float sum_g[V], sum_g1[V], sum_g2[V];
#pragma unroll
  for (int j = 0; j < V; ++j) sum_g[j] = sum_g1[j] = sum_g2[j] = 0.f;
  if (mine) {
    float mu1[V], is1[V], ga1[V], mu2[V], is2[V], ga2[V], be[V], v1[V], v2[V], gv[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int c = g * V + j;
      mu1[j] = a1.mean[c], is1[j] = a1.invstd[c], ga1[j] = a1.gamma[c];
      mu2[j] = a2.mean[c], is2[j] = a2.invstd[c], ga2[j] = a2.gamma[c];
      be[j] = a1.beta[c] + a2.beta[c];
    }
    const int64_t step = static_cast<int64_t>(p_count) * blockDim.y;
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += step) {
      const int64_t i = r * channels + g * V;
      load_pack<T, V>(x1, i, v1);
      load_pack<T, V>(x2, i, v2);
      load_pack<T, V>(dy, r * ldy + g * V, gv);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float h1 = (v1[j] - mu1[j]) * is1[j], h2 = (v2[j] - mu2[j]) * is2[j];
        const float gr = bn_out_grad(gv[j], h1 * ga1[j] + h2 * ga2[j] + be[j], act);
        sum_g[j] += gr;
        sum_g1[j] += gr * h1;
        sum_g2[j] += gr * h2;
      }
    }
  }
  block_sum3<V>(sum_g, sum_g1, sum_g2, sa, sb, sc);
  const int64_t plane = static_cast<int64_t>(p_count) * channels;
  if (threadIdx.y == 0 && mine) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int64_t at = static_cast<int64_t>(blockIdx.x) * channels + g * V + j;
      partials[at] = sa[j * kThreads + threadIdx.x];
      partials[plane + at] = sb[j * kThreads + threadIdx.x];
      partials[2 * plane + at] = sc[j * kThreads + threadIdx.x];
    }
  }
  if (!last_block(counters)) return;
#pragma unroll
  for (int j = 0; j < V; ++j) sum_g[j] = sum_g1[j] = sum_g2[j] = 0.f;
  if (mine) {
    for (int p = threadIdx.y; p < p_count; p += blockDim.y) {
      const int64_t at = static_cast<int64_t>(p) * channels + g * V;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sum_g[j] += __ldcg(partials + at + j);
        sum_g1[j] += __ldcg(partials + plane + at + j);
        sum_g2[j] += __ldcg(partials + 2 * plane + at + j);
      }
    }
  }
  block_sum3<V>(sum_g, sum_g1, sum_g2, sa, sb, sc);
  if (threadIdx.y == 0 && mine) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int c = g * V + j;
      const float sg = sa[j * kThreads + threadIdx.x], s1 = sb[j * kThreads + threadIdx.x],
                  s2 = sc[j * kThreads + threadIdx.x];
      dsum[c] = sg;
      dsum[channels + c] = s1;
      dsum[2 * channels + c] = s2;
      if (dgamma1) dgamma1[c] = accumulate ? dgamma1[c] + s1 : s1;
      if (dbeta1) dbeta1[c] = accumulate ? dbeta1[c] + sg : sg;
      if (dgamma2) dgamma2[c] = accumulate ? dgamma2[c] + s2 : s2;
      if (dbeta2) dbeta2[c] = accumulate ? dbeta2[c] + sg : sg;
    }
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    bn_dual_backward_elemt_kernel(const T* __restrict__ dy, int64_t ldy, const T* __restrict__ x1,
                                  const T* __restrict__ x2, int64_t rows, int channels, Affine a1, Affine a2, bool act,
                                  const float* __restrict__ dsum, T* __restrict__ dx1, T* __restrict__ dx2) {
  const int g = blockIdx.y * blockDim.x + threadIdx.x;
  if (g * V >= channels) return;
  const float inv_m = 1.f / static_cast<float>(rows);
  float mu1[V], is1[V], ga1[V], mu2[V], is2[V], ga2[V], be[V], mg[V], m1[V], m2[V], v1[V], v2[V], gv[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int c = g * V + j;
    mu1[j] = a1.mean[c], is1[j] = a1.invstd[c], ga1[j] = a1.gamma[c];
    mu2[j] = a2.mean[c], is2[j] = a2.invstd[c], ga2[j] = a2.gamma[c];
    be[j] = a1.beta[c] + a2.beta[c];
    mg[j] = dsum[c] * inv_m;
    m1[j] = dsum[channels + c] * inv_m;
    m2[j] = dsum[2 * channels + c] * inv_m;
  }
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += step) {
    const int64_t i = r * channels + g * V;
    load_pack<T, V>(x1, i, v1);
    load_pack<T, V>(x2, i, v2);
    load_pack<T, V>(dy, r * ldy + g * V, gv);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float h1 = (v1[j] - mu1[j]) * is1[j], h2 = (v2[j] - mu2[j]) * is2[j];
      const float gr = bn_out_grad(gv[j], h1 * ga1[j] + h2 * ga2[j] + be[j], act);
      v1[j] = ga1[j] * is1[j] * (gr - mg[j] - h1 * m1[j]);
      v2[j] = ga2[j] * is2[j] * (gr - mg[j] - h2 * m2[j]);
    }
    if (dx1) store_pack<T, V>(dx1, i, v1);
    if (dx2) store_pack<T, V>(dx2, i, v2);
  }
}

// The smallest power of two >= groups, at most `most`.
int channels_per_block(int groups, int most) {
  int cx = 1;
  while (cx < groups && cx < most) cx <<= 1;
  return cx;
}

struct Grid {
  dim3 block;
  int channel_blocks;
};

// Over channel groups of `vec` channels, at most `most` groups (a power of two <= 32) per block.
Grid grid_for(int channels, int vec, int most = 32) {
  const int groups = channels / vec;
  const int cx = channels_per_block(groups, most);
  return {dim3(cx, kThreads / cx), (groups + cx - 1) / cx};
}

// The reductions' grid: bn_act_reduce_block_channels() channels per block unless the launch
// says otherwise (the last block of a channel block merges the P partials of its channels alone,
// so narrower blocks merge less each; bench_bn_act sweeps this).
Grid reduce_grid(int channels, int vec, int block_groups) {
  if (block_groups <= 0) block_groups = std::max(1, std::min(32, bn_act_reduce_block_channels() / vec));
  return grid_for(channels, vec, std::min(block_groups, 32));
}
Grid reduce_grid(const BnActLaunch& l) { return reduce_grid(l.channels, l.vec, l.block_groups); }

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

}  // namespace

int bn_act_vector_width(int channels) { return channels % 4 == 0 ? 4 : 1; }

int bn_act_row_blocks(int64_t rows, int channels, int vec, int block_groups, int rows_per_thread) {
  const Grid g = reduce_grid(channels, vec, block_groups);
  if (rows_per_thread <= 0) rows_per_thread = bn_act_rows_per_thread();
  // About rows_per_thread rows per thread, at most ~1024 blocks in all.
  const int64_t per_block = static_cast<int64_t>(rows_per_thread) * g.block.y;
  const int64_t want = (rows + per_block - 1) / per_block;
  const int64_t cap = std::max<int64_t>(1, 1024 / g.channel_blocks);
  return static_cast<int>(std::max<int64_t>(1, std::min(want, cap)));
}

BnActGrid bn_act_reduce_grid_for(int64_t rows, int channels, int vec) {
  constexpr int64_t kMi = int64_t{1} << 20;
  const int64_t elements = rows * channels;
  int block_channels = 64, rows_per_thread = 4;  // below 2 Mi elements, and above 20 Mi
  if (elements >= 2 * kMi && elements < 5 * kMi) {
    rows_per_thread = 8;
  } else if (elements >= 5 * kMi && elements < 20 * kMi) {
    block_channels = 32;
    rows_per_thread = 16;
  }
  BnActGrid g;
  g.block_groups = std::max(1, std::min(32, block_channels / std::max(1, vec)));
  g.rows_per_thread = rows_per_thread;
  return g;
}

int bn_act_counters(int channels, int vec, int block_groups) {
  return reduce_grid(channels, vec, block_groups).channel_blocks;
}

namespace {

// Launches the statistics kernel: the full forward's (mean/invstd/running update) or, with `row`,
// SyncBN's local half.
void launch_stats(const BnActLaunch& l, const Grid& g, const void* x, float* partials, unsigned* counters,
                  float* mean, float* invstd, float* running_mean, float* running_var, float momentum, float eps,
                  float* row) {
  dispatch_launch(l, [&](auto* tag, auto vc) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int V = decltype(vc)::value;
    bn_stats_kernel<T, V><<<dim3(l.row_blocks, g.channel_blocks), g.block, 0, l.stream>>>(
        static_cast<const T*>(x), l.rows, l.channels, partials, counters, mean, invstd, running_mean,
        running_var, momentum, eps, row);
  });
}

void launch_apply(const BnActLaunch& l, const Grid& g, const void* x, const float* gamma, const float* beta,
                  const float* mean, const float* invstd, void* y) {
  dispatch_launch(l, [&](auto* tag, auto vc) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int V = decltype(vc)::value;
    bn_apply_act_kernel<T, V>
        <<<dim3(elementwise_row_blocks(l.rows, g), g.channel_blocks), g.block, 0, l.stream>>>(
            static_cast<const T*>(x), l.rows, l.channels, gamma, beta, mean, invstd, l.act,
            static_cast<const T*>(l.addend), l.addend_after_act, static_cast<T*>(y));
  });
}

void check_vec(const BnActLaunch& l, const char* what) {
  if (l.vec != 1 && l.vec != 4 && l.vec != kVec)
    throw std::invalid_argument(std::string(what) + ": unsupported vector width");
  if (l.dy_ld != 0 && (l.dy_ld < l.channels || l.dy_ld % l.vec != 0))
    throw std::invalid_argument(std::string(what) + ": dy's row stride must be >= channels and a multiple of vec");
}

int64_t dy_stride(const BnActLaunch& l) { return l.dy_ld != 0 ? l.dy_ld : l.channels; }

// What the backward reads of the addend: only one added before the activation changes SiLU's input.
const void* backward_addend(const BnActLaunch& l) { return l.addend_after_act ? nullptr : l.addend; }

}  // namespace

void bn_act_forward(const BnActLaunch& l, const void* x, const float* gamma, const float* beta,
                    float* running_mean, float* running_var, float momentum, float eps, float* partials,
                    unsigned* counters, float* mean, float* invstd, void* y) {
  check_vec(l, "bn_act_forward");
  launch_stats(l, reduce_grid(l), x, partials, counters, mean, invstd, running_mean, running_var, momentum, eps,
               nullptr);
  launch_apply(l, grid_for(l.channels, l.vec), x, gamma, beta, mean, invstd, y);
  check(cudaGetLastError(), "bn_act_forward");
}

void bn_act_local_stats(const BnActLaunch& l, const void* x, float eps, float* partials, unsigned* counters,
                        float* row) {
  check_vec(l, "bn_act_local_stats");
  launch_stats(l, reduce_grid(l), x, partials, counters, nullptr, nullptr, nullptr, nullptr, 0.f, eps, row);
  check(cudaGetLastError(), "bn_act_local_stats");
}

void bn_act_forward_merged(const BnActLaunch& l, const void* x, const float* rows, int world, const float* gamma,
                           const float* beta, float* running_mean, float* running_var, float momentum, float eps,
                           float* stats, void* y) {
  check_vec(l, "bn_act_forward_merged");
  constexpr int kMergeThreads = 128;
  bn_merge_rows_kernel<<<(l.channels + kMergeThreads - 1) / kMergeThreads, kMergeThreads, 0, l.stream>>>(
      rows, world, l.channels, eps, momentum, running_mean, running_var, stats);
  launch_apply(l, grid_for(l.channels, l.vec), x, gamma, beta, stats, stats + l.channels, y);
  check(cudaGetLastError(), "bn_act_forward_merged");
}

void bn_act_backward_reduce(const BnActLaunch& l, const void* dy, const void* x, const float* gamma,
                            const float* beta, const float* mean, const float* invstd, float* partials,
                            unsigned* counters, float* dsum, float* dgamma, float* dbeta, bool accumulate) {
  check_vec(l, "bn_act_backward_reduce");
  const Grid g = reduce_grid(l);
  dispatch_launch(l, [&](auto* tag, auto vc) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int V = decltype(vc)::value;
    bn_backward_reduce_kernel<T, V><<<dim3(l.row_blocks, g.channel_blocks), g.block, 0, l.stream>>>(
        static_cast<const T*>(dy), dy_stride(l), static_cast<const T*>(x), l.rows, l.channels, gamma, beta, mean,
        invstd, l.act, static_cast<const T*>(backward_addend(l)), partials, counters, dsum, dgamma, dbeta, accumulate,
        l.sync_sums);
  });
  check(cudaGetLastError(), "bn_act_backward_reduce");
}

void bn_act_backward_elemt(const BnActLaunch& l, const void* dy, const void* x, const float* gamma,
                           const float* beta, const float* mean, const float* invstd, const float* dsum,
                           const float* count, void* dx) {
  check_vec(l, "bn_act_backward_elemt");
  const Grid g = grid_for(l.channels, l.vec);
  dispatch_launch(l, [&](auto* tag, auto vc) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int V = decltype(vc)::value;
    bn_backward_elemt_kernel<T, V>
        <<<dim3(elementwise_row_blocks(l.rows, g), g.channel_blocks), g.block, 0, l.stream>>>(
            static_cast<const T*>(dy), dy_stride(l), static_cast<const T*>(x), l.rows, l.channels, gamma, beta,
            mean, invstd, l.act, dsum, count, l.sync_sums, static_cast<const T*>(backward_addend(l)),
            static_cast<T*>(backward_addend(l) ? l.daddend : nullptr), static_cast<T*>(dx));
  });
  check(cudaGetLastError(), "bn_act_backward_elemt");
}

namespace {

Affine affine_of(const BnBranch& b) { return {b.gamma, b.beta, b.mean, b.invstd}; }

// The dual launches read three or four activations per row: at most 4 channels per thread (8
// would take the registers of two blocks).
void check_dual(const BnActLaunch& l, const char* what) {
  if (l.vec != 1 && l.vec != 4) throw std::invalid_argument(std::string(what) + ": vec must be 1 or 4");
  check_vec(l, what);
}

template <typename Fn>
void dispatch_dual(const BnActLaunch& l, Fn&& fn) {
  dispatch(l.dtype, [&](auto* tag) {
    if (l.vec == 4)
      fn(tag, std::integral_constant<int, 4>{});
    else
      fn(tag, std::integral_constant<int, 1>{});
  });
}

}  // namespace

void bn_act_dual_forward(const BnActLaunch& l, const BnBranch& b1, const BnBranch& b2, float momentum, float eps,
                         float* partials, unsigned* counters, void* y) {
  check_dual(l, "bn_act_dual_forward");
  const Grid rg = reduce_grid(l);
  launch_stats(l, rg, b1.x, partials, counters, b1.mean, b1.invstd, b1.running_mean, b1.running_var, momentum, eps,
               nullptr);
  launch_stats(l, rg, b2.x, partials, counters, b2.mean, b2.invstd, b2.running_mean, b2.running_var, momentum, eps,
               nullptr);
  const Grid g = grid_for(l.channels, l.vec);
  dispatch_dual(l, [&](auto* tag, auto vc) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int V = decltype(vc)::value;
    bn_dual_apply_kernel<T, V><<<dim3(elementwise_row_blocks(l.rows, g), g.channel_blocks), g.block, 0, l.stream>>>(
        static_cast<const T*>(b1.x), static_cast<const T*>(b2.x), l.rows, l.channels, affine_of(b1), affine_of(b2),
        l.act, static_cast<T*>(y));
  });
  check(cudaGetLastError(), "bn_act_dual_forward");
}

void bn_act_dual_backward_reduce(const BnActLaunch& l, const void* dy, const BnBranch& b1, const BnBranch& b2,
                                 float* partials, unsigned* counters, float* dsum, float* dgamma1, float* dbeta1,
                                 float* dgamma2, float* dbeta2, bool accumulate) {
  check_dual(l, "bn_act_dual_backward_reduce");
  const Grid g = reduce_grid(l);
  dispatch_dual(l, [&](auto* tag, auto vc) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int V = decltype(vc)::value;
    bn_dual_backward_reduce_kernel<T, V><<<dim3(l.row_blocks, g.channel_blocks), g.block, 0, l.stream>>>(
        static_cast<const T*>(dy), dy_stride(l), static_cast<const T*>(b1.x), static_cast<const T*>(b2.x), l.rows,
        l.channels, affine_of(b1), affine_of(b2), l.act, partials, counters, dsum, dgamma1, dbeta1, dgamma2, dbeta2,
        accumulate);
  });
  check(cudaGetLastError(), "bn_act_dual_backward_reduce");
}

void bn_act_dual_backward_elemt(const BnActLaunch& l, const void* dy, const BnBranch& b1, const BnBranch& b2,
                                const float* dsum, void* dx1, void* dx2) {
  check_dual(l, "bn_act_dual_backward_elemt");
  const Grid g = grid_for(l.channels, l.vec);
  dispatch_dual(l, [&](auto* tag, auto vc) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int V = decltype(vc)::value;
    bn_dual_backward_elemt_kernel<T, V>
        <<<dim3(elementwise_row_blocks(l.rows, g), g.channel_blocks), g.block, 0, l.stream>>>(
            static_cast<const T*>(dy), dy_stride(l), static_cast<const T*>(b1.x), static_cast<const T*>(b2.x), l.rows,
            l.channels, affine_of(b1), affine_of(b2), l.act, dsum, static_cast<T*>(dx1), static_cast<T*>(dx2));
  });
  check(cudaGetLastError(), "bn_act_dual_backward_elemt");
}

}  // namespace libreyolo::kernels

