// Fused training BatchNorm + SiLU of two branches summed before the activation (bn_act.hpp,
// BnBranch): the forward, and the backward's reduction and elementwise halves. Block layout as in
// bn_act.cu.
#include "kernels/bn_act.hpp"

#include "kernels/bn_act.cuh"

namespace libreyolo::kernels {

using namespace bn_detail;

namespace {

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
  for_my_rows(rows, [&](int64_t r) {
    const int64_t i = r * channels + g * V;
    load_pack<T, V>(x1, i, v1);
    load_pack<T, V>(x2, i, v2);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float z = v1[j] * s1[j] + v2[j] * s2[j] + h[j];
      v1[j] = act ? z * sigmoid(z) : z;
    }
    store_pack<T, V>(y, i, v1);
  });
}

// Both branches' parameters of one channel group; be = beta1 + beta2.
template <int V>
struct DualParams {
  float mu1[V], is1[V], ga1[V], mu2[V], is2[V], ga2[V], be[V];
  __device__ DualParams(const Affine& a1, const Affine& a2, int g) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int c = g * V + j;
      mu1[j] = a1.mean[c], is1[j] = a1.invstd[c], ga1[j] = a1.gamma[c];
      mu2[j] = a2.mean[c], is2[j] = a2.invstd[c], ga2[j] = a2.gamma[c];
      be[j] = a1.beta[c] + a2.beta[c];
    }
  }
};

// Row r of one channel group: both branches' normalised inputs h1, h2 and the gradient at the
// sum's output, gr (dy through the activation).
template <typename T, int V>
__device__ void dual_row_grads(const T* __restrict__ dy, int64_t ldy, const T* __restrict__ x1,
                               const T* __restrict__ x2, int64_t r, int channels, int g, const DualParams<V>& p,
                               bool act, float (&h1)[V], float (&h2)[V], float (&gr)[V]) {
  const int64_t i = r * channels + g * V;
  load_pack<T, V>(x1, i, h1);
  load_pack<T, V>(x2, i, h2);
  load_pack<T, V>(dy, r * ldy + g * V, gr);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    h1[j] = (h1[j] - p.mu1[j]) * p.is1[j];
    h2[j] = (h2[j] - p.mu2[j]) * p.is2[j];
    gr[j] = bn_out_grad(gr[j], h1[j] * p.ga1[j] + h2[j] * p.ga2[j] + p.be[j], act);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    bn_dual_backward_reduce_kernel(const T* __restrict__ dy, int64_t ldy, const T* __restrict__ x1,
                                   const T* __restrict__ x2, int64_t rows, int channels, Affine a1, Affine a2,
                                   bool act, float* partials, unsigned* counters, float* dsum, float* dgamma1,
                                   float* dbeta1, float* dgamma2, float* dbeta2, bool accumulate) {
  __shared__ float s[3][V * kThreads];
  const int g = blockIdx.y * blockDim.x + threadIdx.x;
  const bool mine = g * V < channels;
  float sums[3][V];  // sum(g), sum(g * h1), sum(g * h2)
#pragma unroll
  for (int j = 0; j < V; ++j) sums[0][j] = sums[1][j] = sums[2][j] = 0.f;
  if (mine) {
    const DualParams<V> p(a1, a2, g);
    float h1[V], h2[V], gr[V];
    for_my_rows(rows, [&](int64_t r) {
      dual_row_grads<T, V>(dy, ldy, x1, x2, r, channels, g, p, act, h1, h2, gr);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sums[0][j] += gr[j];
        sums[1][j] += gr[j] * h1[j];
        sums[2][j] += gr[j] * h2[j];
      }
    });
  }
  if (!grid_channel_sums<3, V>(sums, s, mine, g, channels, partials, counters)) return;
  if (threadIdx.y == 0 && mine) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int c = g * V + j;
      const float sg = s[0][j * kThreads + threadIdx.x], s1 = s[1][j * kThreads + threadIdx.x],
                  s2 = s[2][j * kThreads + threadIdx.x];
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
  const DualParams<V> p(a1, a2, g);
  float mg[V], m1[V], m2[V], h1[V], h2[V], gr[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int c = g * V + j;
    mg[j] = dsum[c] * inv_m;
    m1[j] = dsum[channels + c] * inv_m;
    m2[j] = dsum[2 * channels + c] * inv_m;
  }
  for_my_rows(rows, [&](int64_t r) {
    dual_row_grads<T, V>(dy, ldy, x1, x2, r, channels, g, p, act, h1, h2, gr);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      h1[j] = p.ga1[j] * p.is1[j] * (gr[j] - mg[j] - h1[j] * m1[j]);
      h2[j] = p.ga2[j] * p.is2[j] * (gr[j] - mg[j] - h2[j] * m2[j]);
    }
    const int64_t i = r * channels + g * V;
    if (dx1) store_pack<T, V>(dx1, i, h1);
    if (dx2) store_pack<T, V>(dx2, i, h2);
  });
}

}  // namespace

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
