// Fused training BatchNorm + SiLU over NHWC memory. See bn_act.hpp for the contract.
//
// Block layout (all kernels): each thread owns a group of V consecutive channels (V = 4 when C is a
// multiple of 4 and the pointers allow 4-element vector accesses, else 1; launches may also ask for
// 8), read and written as one vector (8 bytes in bf16/fp16). blockDim.x = CX channel groups (32, or the next power of
// two of C/V when smaller), blockDim.y = RY = 256 / CX rows. Thread (tx, ty) of block (bx, by) owns
// group by*CX + tx and walks rows bx*RY + ty, stepping by gridDim.x*RY. Consecutive lanes read
// consecutive groups of a row, so a warp's loads are contiguous in NHWC.
#include "kernels/bn_act.hpp"

#include "kernels/bn_act.cuh"

namespace libreyolo::kernels {

using namespace bn_detail;

namespace {

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
  for_my_rows(rows, [&](int64_t r) {
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
  });
}

// One channel group's affine parameters.
template <int V>
__device__ void load_affine(int g, const float* __restrict__ gamma, const float* __restrict__ beta,
                            const float* __restrict__ mean, const float* __restrict__ invstd, float (&ga)[V],
                            float (&be)[V], float (&mu)[V], float (&is)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int c = g * V + j;
    mu[j] = mean[c];
    is[j] = invstd[c];
    ga[j] = gamma[c];
    be[j] = beta[c];
  }
}

// Row r of one channel group: xhat = (x - mean) * invstd and the gradient at the BatchNorm's
// output, gr (dy through the activation, whose input is xhat * gamma + beta + addend).
template <typename T, int V>
__device__ void bn_row_grads(const T* __restrict__ dy, int64_t ldy, const T* __restrict__ x,
                             const T* __restrict__ addend, int64_t r, int channels, int g, const float (&mu)[V],
                             const float (&is)[V], const float (&ga)[V], const float (&be)[V], bool act,
                             float (&xhat)[V], float (&gr)[V]) {
  float av[V];
  const int64_t i = r * channels + g * V;
  load_pack<T, V>(x, i, xhat);
  load_pack<T, V>(dy, r * ldy + g * V, gr);
  if (addend)
    load_pack<T, V>(addend, i, av);
  else
#pragma unroll
    for (int j = 0; j < V; ++j) av[j] = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    xhat[j] = (xhat[j] - mu[j]) * is[j];
    gr[j] = bn_out_grad(gr[j], xhat[j] * ga[j] + be[j] + av[j], act);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    bn_backward_reduce_kernel(const T* __restrict__ dy, int64_t ldy, const T* __restrict__ x, int64_t rows, int channels,
                              const float* __restrict__ gamma, const float* __restrict__ beta,
                              const float* __restrict__ mean, const float* __restrict__ invstd, bool act,
                              const T* __restrict__ addend, float* partials, unsigned* counters, float* dsum,
                              float* dgamma, float* dbeta, bool accumulate, bool sync_sums) {
  __shared__ float s[2][V * kThreads];
  const int g = blockIdx.y * blockDim.x + threadIdx.x;
  const bool mine = g * V < channels;
  float sums[2][V];  // sum(g), sum(g * xhat)
#pragma unroll
  for (int j = 0; j < V; ++j) sums[0][j] = sums[1][j] = 0.f;
  if (mine) {
    float mu[V], is[V], ga[V], be[V], xhat[V], gr[V];
    load_affine<V>(g, gamma, beta, mean, invstd, ga, be, mu, is);
    for_my_rows(rows, [&](int64_t r) {
      bn_row_grads<T, V>(dy, ldy, x, addend, r, channels, g, mu, is, ga, be, act, xhat, gr);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sums[0][j] += gr[j];
        sums[1][j] += gr[j] * xhat[j];
      }
    });
  }
  if (!grid_channel_sums<2, V>(sums, s, mine, g, channels, partials, counters)) return;
  if (threadIdx.y == 0 && mine) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int c = g * V + j;
      const float sg = s[0][j * kThreads + threadIdx.x], sgx = s[1][j * kThreads + threadIdx.x];
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
  float mu[V], is[V], ga[V], be[V], mean_g[V], mean_gx[V], xhat[V], gr[V];
  load_affine<V>(g, gamma, beta, mean, invstd, ga, be, mu, is);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int c = g * V + j;
    mean_g[j] = dsum[c] * inv_m;
    // sum(g * xhat) = invstd * sum(g * (x - mean))
    mean_gx[j] = dsum[channels + c] * inv_m * (sync_sums ? is[j] : 1.f);
  }
  for_my_rows(rows, [&](int64_t r) {
    bn_row_grads<T, V>(dy, ldy, x, addend, r, channels, g, mu, is, ga, be, act, xhat, gr);
    const int64_t i = r * channels + g * V;
    if (daddend) store_pack<T, V>(daddend, i, gr);
#pragma unroll
    for (int j = 0; j < V; ++j) xhat[j] = ga[j] * is[j] * (gr[j] - mean_g[j] - xhat[j] * mean_gx[j]);
    if (dx) store_pack<T, V>(dx, i, xhat);
  });
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

void bn_detail::launch_stats(const BnActLaunch& l, const Grid& g, const void* x, float* partials,
                             unsigned* counters, float* mean, float* invstd, float* running_mean, float* running_var,
                             float momentum, float eps, float* row) {
  dispatch_launch(l, [&](auto* tag, auto vc) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int V = decltype(vc)::value;
    bn_stats_kernel<T, V><<<dim3(l.row_blocks, g.channel_blocks), g.block, 0, l.stream>>>(
        static_cast<const T*>(x), l.rows, l.channels, partials, counters, mean, invstd, running_mean,
        running_var, momentum, eps, row);
  });
}

}  // namespace libreyolo::kernels
