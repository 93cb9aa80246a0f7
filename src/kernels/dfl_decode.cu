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

// An anchor's work is 4 + ceil(nc / 16) tasks: one per box side (the softmax over its R bins and
// the expectation) and one per group of up to 16 classes (their sigmoids). Split, thread i does
// task i / (B * A) of anchor i % (B * A): a small batch (a one-image forward is ~8,400 anchors,
// under a tenth of an H200's resident threads) fills the GPU nine times wider. Unsplit, a thread
// does all tasks of its anchor in the same order: a large batch fills the GPU anyway, and each
// thread then reads its anchor's channels once. Consecutive threads take consecutive anchors of
// one task, so the writes to each output row are coalesced either way.
constexpr int kClassGroup = 16;

template <typename T, int R>
__device__ inline void run_task(const T* p, float* o, int64_t A, float cx, float cy, int s, int nc, int task) {
  if (task < 4) {
    float v[R];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < R; ++k) {
      v[k] = to_float(p[task * R + k]);
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
    const float d = e * static_cast<float>(s);
    // sides 0, 1 (left, top) are subtracted from the centre, 2, 3 (right, bottom) added
    const float c = (task & 1) ? cy : cx;
    o[task * A] = task < 2 ? c - d : c + d;
    return;
  }
  const int c0 = (task - 4) * kClassGroup, c1 = min(nc, c0 + kClassGroup);
  for (int c = c0; c < c1; ++c) o[(4 + c) * A] = 1.f / (1.f + expf(-to_float(p[4 * R + c])));
}

template <typename T, int R>
__global__ void __launch_bounds__(kThreads)
    dfl_decode_kernel(Levels lv, int64_t batch, int nc, int tasks, bool split, float* __restrict__ out) {
  const int64_t A = lv.first[lv.count];
  const int64_t anchors = batch * A;
  const int64_t total = split ? anchors * tasks : anchors;
  const int C = 4 * R + nc;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t j = split ? i % anchors : i;
    const int64_t b = j / A, a = j % A;
    int l = 0;
    while (l + 1 < lv.count && a >= lv.first[l + 1]) ++l;
    const int64_t cell = a - lv.first[l];
    const int W = lv.width[l], H = lv.height[l], s = lv.stride[l];
    const int gx = static_cast<int>(cell % W), gy = static_cast<int>(cell / W);
    const T* p = static_cast<const T*>(lv.data[l]) + ((b * H + gy) * W + gx) * C;
    float* o = out + b * (4 + nc) * A + a;
    const float cx = static_cast<float>(gx * s + s / 2), cy = static_cast<float>(gy * s + s / 2);
    if (split) {
      run_task<T, R>(p, o, A, cx, cy, s, nc, static_cast<int>(i / anchors));
    } else {
      for (int t = 0; t < tasks; ++t) run_task<T, R>(p, o, A, cx, cy, s, nc, t);
    }
  }
}

int resident_threads() {
  static const int n = [] {
    int device = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device) != cudaSuccess) return 0;
    return sms * per_sm;
  }();
  return n;
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
  const int64_t anchors = l.batch * lv.first[l.levels];
  if (anchors == 0) return;
  const int tasks = 4 + (l.classes + kClassGroup - 1) / kClassGroup;
  // Split while the split grid fits in two waves of resident threads (counted once, on the
  // device current at the first call: the GPUs of one host are alike).
  const bool split = static_cast<int64_t>(tasks) * anchors <= 2 * static_cast<int64_t>(resident_threads());
  const int64_t threads = split ? anchors * tasks : anchors;
  const int blocks = static_cast<int>(std::min<int64_t>((threads + kThreads - 1) / kThreads, 65535));
  switch (l.dtype) {
    case DType::Float32:
      dfl_decode_kernel<float, 16><<<blocks, kThreads, 0, l.stream>>>(lv, l.batch, l.classes, tasks, split, out);
      break;
    case DType::Float16:
      dfl_decode_kernel<__half, 16><<<blocks, kThreads, 0, l.stream>>>(lv, l.batch, l.classes, tasks, split, out);
      break;
    case DType::BFloat16:
      dfl_decode_kernel<__nv_bfloat16, 16><<<blocks, kThreads, 0, l.stream>>>(lv, l.batch, l.classes, tasks, split, out);
      break;
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("dfl_decode: ") + cudaGetErrorString(e));
}

}  // namespace libreyolo::kernels
