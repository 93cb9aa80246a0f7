// 2x2 stride-1 average pooling over NHWC, split output. See pool2.hpp for the contract.
#include "kernels/pool2.hpp"

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
constexpr int kVec = 8;

template <typename T, int V>
__device__ __forceinline__ void add_pack(const T* __restrict__ p, float (&acc)[V]) {
  const Pack<T, V> k = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] += to_float(k.v[j]);
}

// An output gradient's share: divided by 4 in the element type (ATen divides a scalar_t by the
// integer pool size, which rounds to scalar_t for half and bfloat16), then widened.
template <typename T>
__device__ __forceinline__ float quarter(T g) {
  return to_float(from_float<T>(to_float(g) / 4.f));
}

// Element i of a grid-stride loop over (pixel, channel group) of an NHWC map of height h and width
// w, channel groups fastest: its pixel index (n * h + y) * w + x, and n, y, x, the group's first channel.
struct PixelGroup {
  int64_t pixel, n;
  int y, x, c0;
};
template <int V>
__device__ __forceinline__ PixelGroup pixel_group(int64_t i, int groups, int h, int w) {
  PixelGroup p;
  p.c0 = static_cast<int>(i % groups) * V;
  p.pixel = i / groups;
  p.x = static_cast<int>(p.pixel % w);
  const int64_t rest = p.pixel / w;
  p.y = static_cast<int>(rest % h);
  p.n = rest / h;
  return p;
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    avg_pool2_forward_kernel(const T* __restrict__ x, int64_t total, int H, int W, int C, int64_t P, int split,
                             T* __restrict__ a, T* __restrict__ b) {
  const int groups = C / V, oh_n = H - 1, ow_n = W - 1;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const PixelGroup o = pixel_group<V>(i, groups, oh_n, ow_n);  // an output pixel
    const int64_t pixel = o.pixel;
    const int c0 = o.c0;
    const T* p = x + ((o.n * H + o.y) * W + o.x) * P + c0;
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.f;
    // ATen's order: rows outer, columns inner.
    add_pack<T, V>(p, acc);
    add_pack<T, V>(p + P, acc);
    add_pack<T, V>(p + static_cast<int64_t>(W) * P, acc);
    add_pack<T, V>(p + static_cast<int64_t>(W) * P + P, acc);
    Pack<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_float<T>(acc[j] / 4.f);
    T* dst = c0 < split ? a + pixel * split + c0 : b + pixel * (C - split) + (c0 - split);
    *reinterpret_cast<Pack<T, V>*>(dst) = out;
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    avg_pool2_backward_kernel(const T* __restrict__ ga, const T* __restrict__ gb, int64_t total, int H, int W,
                              int C, int split, T* __restrict__ gx) {
  const int groups = C / V, oh_n = H - 1, ow_n = W - 1;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const PixelGroup in = pixel_group<V>(i, groups, H, W);  // an input pixel
    const int64_t pixel = in.pixel, n = in.n;
    const int h = in.y, w = in.x, c0 = in.c0;
    const bool first = c0 < split;
    const T* src = first ? ga : gb;
    const int width = first ? split : C - split;
    const int c = first ? c0 : c0 - split;
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.f;
    if (src) {
      // The outputs whose window holds (h, w): rows h-1 and h, columns w-1 and w, inside the output.
      const int ph0 = max(h - 1, 0), ph1 = min(h, oh_n - 1), pw0 = max(w - 1, 0), pw1 = min(w, ow_n - 1);
      for (int ph = ph0; ph <= ph1; ++ph)
        for (int pw = pw0; pw <= pw1; ++pw) {
          const Pack<T, V> k =
              *reinterpret_cast<const Pack<T, V>*>(src + ((n * oh_n + ph) * ow_n + pw) * width + c);
#pragma unroll
          for (int j = 0; j < V; ++j) acc[j] += quarter(k.v[j]);
        }
    }
    Pack<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_float<T>(acc[j]);
    *reinterpret_cast<Pack<T, V>*>(gx + pixel * C + c0) = out;
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

void check_launch(const Pool2Launch& l, const char* what) {
  if (l.height < 2 || l.width < 2 || l.channels < 1 || l.split < 0 || l.split > l.channels || l.batch < 0)
    throw std::invalid_argument(std::string(what) + ": bad shape");
  if (l.in_pixel != 0 && l.in_pixel < l.channels)
    throw std::invalid_argument(std::string(what) + ": bad pixel stride");
  if (l.vec != 1 && (l.vec != kVec || l.channels % kVec != 0 || l.split % kVec != 0 || l.in_pixel % kVec != 0))
    throw std::invalid_argument(std::string(what) + ": unsupported vector width");
}

int blocks_for(int64_t total) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((total + kThreads - 1) / kThreads, 8192)));
}

// fn(T*, integral_constant<int, V>) for the launch's element type and vector width.
template <typename Fn>
void dispatch(const Pool2Launch& l, Fn&& fn) {
  auto by_vec = [&](auto* tag) {
    if (l.vec == kVec)
      fn(tag, std::integral_constant<int, kVec>{});
    else
      fn(tag, std::integral_constant<int, 1>{});
  };
  switch (l.dtype) {
    case DType::Float32: by_vec(static_cast<float*>(nullptr)); break;
    case DType::Float16: by_vec(static_cast<__half*>(nullptr)); break;
    case DType::BFloat16: by_vec(static_cast<__nv_bfloat16*>(nullptr)); break;
  }
}

}  // namespace

int avg_pool2_vector_width(int channels, int split) {
  return channels % kVec == 0 && split % kVec == 0 ? kVec : 1;
}

void avg_pool2_forward(const Pool2Launch& l, const void* x, void* a, void* b) {
  check_launch(l, "avg_pool2_forward");
  const int64_t total = l.batch * (l.height - 1) * (l.width - 1) * (l.channels / l.vec);
  if (total == 0) return;
  dispatch(l, [&](auto* tag, auto vc) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int V = decltype(vc)::value;
    avg_pool2_forward_kernel<T, V><<<blocks_for(total), kThreads, 0, l.stream>>>(
        static_cast<const T*>(x), total, l.height, l.width, l.channels, l.in_pixel > 0 ? l.in_pixel : l.channels,
        l.split, static_cast<T*>(a), static_cast<T*>(b));
  });
  check(cudaGetLastError(), "avg_pool2_forward");
}

void avg_pool2_backward(const Pool2Launch& l, const void* ga, const void* gb, void* gx) {
  check_launch(l, "avg_pool2_backward");
  const int64_t total = l.batch * l.height * l.width * (l.channels / l.vec);
  if (total == 0) return;
  dispatch(l, [&](auto* tag, auto vc) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int V = decltype(vc)::value;
    avg_pool2_backward_kernel<T, V><<<blocks_for(total), kThreads, 0, l.stream>>>(
        static_cast<const T*>(ga), static_cast<const T*>(gb), total, l.height, l.width, l.channels, l.split,
        static_cast<T*>(gx));
  });
  check(cudaGetLastError(), "avg_pool2_backward");
}

}  // namespace libreyolo::kernels
