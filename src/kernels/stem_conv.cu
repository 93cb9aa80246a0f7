// The 3-channel 3x3 first convolution as a direct kernel. See stem_conv.hpp for the contract.
#include "kernels/stem_conv.hpp"

#include "kernels/elements.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace libreyolo::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kTaps = 27;  // 3 x 3 x 3 inputs per output value, index (kh * 3 + kw) * 3 + ci

struct Geometry {
  int64_t pixels;  // N * OH * OW
  int H, W, OH, OW, stride, padding;
  int64_t out_pixel;
  int64_t ws[4];
};

Geometry geometry(const StemConvLaunch& l) {
  return {l.batch * l.out_height * l.out_width, l.height, l.width, l.out_height, l.out_width, l.stride, l.padding,
          l.out_pixel, {l.w_stride[0], l.w_stride[1], l.w_stride[2], l.w_stride[3]}};
}

__device__ __forceinline__ int64_t tap_offset(int tap, int co, const int64_t* s) {
  const int ci = tap % 3, kk = tap / 3;
  return co * s[0] + ci * s[1] + (kk / 3) * s[2] + (kk % 3) * s[3];
}

// Output pixel p = (n * OH + oh) * OW + ow; in 32 bits where it fits (a 64-bit division is a long
// instruction sequence, a 32-bit one a multiply-high).
__device__ __forceinline__ void decode(int64_t p, const Geometry& g, int64_t* n, int* oh, int* ow) {
  if (g.pixels <= INT32_MAX) {
    const unsigned q = static_cast<unsigned>(p), rest = q / static_cast<unsigned>(g.OW);
    *ow = static_cast<int>(q - rest * static_cast<unsigned>(g.OW));
    const unsigned nn = rest / static_cast<unsigned>(g.OH);
    *oh = static_cast<int>(rest - nn * static_cast<unsigned>(g.OH));
    *n = nn;
  } else {
    const int64_t rest = p / g.OW;
    *ow = static_cast<int>(p - rest * g.OW);
    *n = rest / g.OH;
    *oh = static_cast<int>(rest - *n * g.OH);
  }
}

// The 27 input values of output pixel p (zero outside the image).
template <typename T>
__device__ __forceinline__ void gather_taps(const T* __restrict__ x, const Geometry& g, int64_t p, float* v) {
  int64_t n;
  int oh, ow;
  decode(p, g, &n, &oh, &ow);
  const int ih0 = oh * g.stride - g.padding, iw0 = ow * g.stride - g.padding;
#pragma unroll
  for (int kh = 0; kh < 3; ++kh) {
#pragma unroll
    for (int kw = 0; kw < 3; ++kw) {
      const int ih = ih0 + kh, iw = iw0 + kw;
      const bool in = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
      const T* px = x + ((n * g.H + (in ? ih : 0)) * g.W + (in ? iw : 0)) * 3;
#pragma unroll
      for (int ci = 0; ci < 3; ++ci) v[(kh * 3 + kw) * 3 + ci] = in ? to_float(px[ci]) : 0.f;
    }
  }
}

// 8 channels of one pixel: bias, SiLU, one vector store (or 8 scalar ones).
template <typename T>
__device__ __forceinline__ void store8(float* acc, const float* sb, bool silu, bool vec, T* out) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float r = acc[j] + sb[j];
    acc[j] = silu ? r / (1.f + expf(-r)) : r;
  }
  constexpr int V = 16 / sizeof(T);  // 8 half/bfloat16 or 4 float32 values per store
  if (vec) {
#pragma unroll
    for (int h = 0; h < 8 / V; ++h) {
      Pack<T, V> pk;
#pragma unroll
      for (int j = 0; j < V; ++j) pk.v[j] = from_float<T>(acc[h * V + j]);
      *reinterpret_cast<Pack<T, V>*>(out + h * V) = pk;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = from_float<T>(acc[j]);
  }
}

// One thread per output pixel, all CO channels: its 27 input values in registers, then 8 channels
// at a time, 27 FMAs each from the shared weights, stored as one vector. (Two pixels per thread,
// each weight read once for both, was slower: bench_stem_conv, H200, batch 32 bf16 into 32
// channels 270 us against 248.)
template <typename T, int CO>
__global__ void __launch_bounds__(kThreads)
    stem_forward_kernel(const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ bias, bool silu,
                        bool vec, Geometry g, T* __restrict__ y) {
  __shared__ __align__(16) float sw[kTaps * CO];  // [tap][co]
  __shared__ float sb[CO];
  for (int i = threadIdx.x; i < kTaps * CO; i += blockDim.x) sw[i] = to_float(w[tap_offset(i / CO, i % CO, g.ws)]);
  for (int i = threadIdx.x; i < CO; i += blockDim.x) sb[i] = bias ? bias[i] : 0.f;
  __syncthreads();
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < g.pixels; p += step) {
    float v[kTaps];
    gather_taps(x, g, p, v);
    T* out = y + p * g.out_pixel;
#pragma unroll 1
    for (int c8 = 0; c8 < CO; c8 += 8) {
      float a[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) a[j] = 0.f;
#pragma unroll
      for (int k = 0; k < kTaps; ++k) {
        const float4 lo = *reinterpret_cast<const float4*>(sw + k * CO + c8);
        const float4 hi = *reinterpret_cast<const float4*>(sw + k * CO + c8 + 4);
        a[0] = fmaf(v[k], lo.x, a[0]);
        a[1] = fmaf(v[k], lo.y, a[1]);
        a[2] = fmaf(v[k], lo.z, a[2]);
        a[3] = fmaf(v[k], lo.w, a[3]);
        a[4] = fmaf(v[k], hi.x, a[4]);
        a[5] = fmaf(v[k], hi.y, a[5]);
        a[6] = fmaf(v[k], hi.z, a[6]);
        a[7] = fmaf(v[k], hi.w, a[7]);
      }
      store8(a, sb + c8, silu, vec, out + c8);
    }
  }
}

void check(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

void validate(const StemConvLaunch& l, const char* what) {
  if (l.batch < 0 || l.height < 1 || l.width < 1 || l.out_height < 1 || l.out_width < 1 || l.stride < 1 ||
      l.padding < 0 || !stem_conv_supports(l.out_channels, l.dtype) || l.out_pixel < l.out_channels)
    throw std::invalid_argument(std::string(what) + ": bad shape");
}

template <typename T, int CO>
void forward_as(const StemConvLaunch& l, const void* x, const void* w, const float* bias, bool silu, void* y) {
  const Geometry g = geometry(l);
  if (g.pixels == 0) return;
  const bool vec = (l.out_pixel * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  const int blocks = static_cast<int>(std::min<int64_t>((g.pixels + kThreads - 1) / kThreads, 65535));
  stem_forward_kernel<T, CO><<<blocks, kThreads, 0, l.stream>>>(static_cast<const T*>(x), static_cast<const T*>(w),
                                                                 bias, silu, vec, g, static_cast<T*>(y));
  check("stem_conv_forward");
}

template <typename T, typename F>
void by_channels(int co, F&& f) {
  switch (co) {
    case 16: f(std::integral_constant<int, 16>()); break;
    case 32: f(std::integral_constant<int, 32>()); break;
    case 64: f(std::integral_constant<int, 64>()); break;
    default: throw std::invalid_argument("stem_conv: unsupported output channels");
  }
}

template <typename F>
void by_dtype(DType d, F&& f) {
  switch (d) {
    case DType::Float32: f(float()); break;
    case DType::Float16: f(__half()); break;
    case DType::BFloat16: f(__nv_bfloat16()); break;
  }
}

}  // namespace

bool stem_conv_supports(int out_channels, DType dtype) {
  // float32 into more than 16 channels: cuDNN's engine was faster (bench_stem_conv, H200).
  return out_channels == 16 || ((out_channels == 32 || out_channels == 64) && dtype != DType::Float32);
}

void stem_conv_forward(const StemConvLaunch& l, const void* x, const void* w, const float* bias, bool silu, void* y) {
  validate(l, "stem_conv_forward");
  by_dtype(l.dtype, [&](auto t) {
    using T = decltype(t);
    by_channels<T>(l.out_channels, [&](auto co) { forward_as<T, decltype(co)::value>(l, x, w, bias, silu, y); });
  });
}

}  // namespace libreyolo::kernels
