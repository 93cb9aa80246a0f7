// Detection post-processing with class-aware NMS on the GPU. See detect_nms.hpp for the contract.
//
// Sort key of a candidate: the high 32 bits order scores descending (the float's bits mapped to an
// unsigned order, then inverted), the low 32 bits are c * A + a, the candidate's position in the
// image's class-major score rows: ascending keys give descending scores with equal scores in
// (class, anchor) order, the order of the host path. The key alone identifies the candidate, so
// the first kernel writes only keys.
//
// Arithmetic that decides which boxes are kept (the mapping to the original image, areas, IoU) is
// written with round-to-nearest intrinsics so that nvcc does not contract it into fused
// multiply-adds: the host path computes each operation rounded on its own.
#include "kernels/detect_nms.hpp"

#include "kernels/elements.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace libreyolo::kernels {
namespace {

constexpr int kCap = kDetectNmsCapacity;
constexpr int kGatherThreads = 256;
constexpr int kNmsThreads = 512;
static_assert((kCap & (kCap - 1)) == 0, "the bitonic sort needs a power-of-two capacity");

struct Images {
  DetectImage image[kDetectNmsMaxImages];
};

__device__ __forceinline__ unsigned long long make_key(float score, unsigned position) {
  const float s = score == 0.f ? 0.f : score;  // -0 and +0 are equal scores
  const unsigned u = __float_as_uint(s);
  const unsigned ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(~ordered) << 32) | position;
}

__device__ __forceinline__ float key_score(unsigned long long key) {
  const unsigned ordered = ~static_cast<unsigned>(key >> 32);
  return __uint_as_float((ordered & 0x80000000u) ? (ordered & 0x7fffffffu) : ~ordered);
}

// Every (image, class, anchor) score above conf appends its key to the image's buffer; the
// counter keeps counting past the capacity so the caller learns how many there were.
template <typename T>
__global__ void __launch_bounds__(kGatherThreads)
    gather_kernel(const T* __restrict__ pred, int64_t anchors, int classes, int64_t total, float conf,
                  int* __restrict__ counts, unsigned long long* __restrict__ keys) {
  const int64_t per_image = static_cast<int64_t>(classes) * anchors;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int lane = threadIdx.x & 31;
  // Whole warps iterate together (the bound is rounded up) so the ballots below see every lane.
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t rounded = (total + 31) / 32 * 32;
  for (int64_t i = first; i < rounded; i += step) {
    const bool inside = i < total;
    const int64_t b = inside ? i / per_image : 0, r = inside ? i % per_image : 0;
    const float v = inside ? to_float(pred[(b * (4 + classes) + 4) * anchors + r]) : 0.f;
    const bool hit = inside && v > conf;
    const unsigned hits = __ballot_sync(0xffffffffu, hit);
    if (hits == 0u) continue;
    // One atomic per warp when all its hits belong to one image (the usual case).
    const int64_t b_first = __shfl_sync(0xffffffffu, b, __ffs(hits) - 1);
    const bool same = __all_sync(0xffffffffu, !hit || b == b_first);
    int pos;
    if (same) {
      int base = 0;
      if (lane == __ffs(hits) - 1) base = atomicAdd(&counts[b_first], __popc(hits));
      base = __shfl_sync(0xffffffffu, base, __ffs(hits) - 1);
      pos = base + __popc(hits & ((1u << lane) - 1u));
    } else {
      pos = hit ? atomicAdd(&counts[b], 1) : 0;
    }
    if (hit && pos < kCap) keys[b * kCap + pos] = make_key(v, static_cast<unsigned>(r));
  }
}

// clamp(v, 0, hi) keeping NaN, with the host path's comparisons.
__device__ __forceinline__ float clip(float v, float hi) {
  if (isnan(v)) return v;
  const float lo = v < 0.f ? 0.f : v;
  return hi < lo ? hi : lo;
}

// One block per image: sort the keys, map and filter the boxes, greedy class-aware NMS.
template <typename T>
__global__ void __launch_bounds__(kNmsThreads)
    nms_kernel(const T* __restrict__ pred, int64_t anchors, int classes, float iou, int max_det, Images images,
               int64_t first_image, const int* __restrict__ counts, const unsigned long long* __restrict__ all_keys,
               float4* __restrict__ all_boxes, int2* __restrict__ all_aux, float* __restrict__ out) {
  __shared__ unsigned long long keys[kCap];
  __shared__ unsigned char removed[kCap];
  __shared__ int next;
  const int64_t b = first_image + blockIdx.x;
  const DetectImage geo = images.image[blockIdx.x];
  const int count = counts[b];
  float* o = out + b * (2 + 6 * static_cast<int64_t>(max_det));
  if (count > kCap) {
    if (threadIdx.x == 0) o[0] = static_cast<float>(count), o[1] = 0.f;
    return;
  }
  const int n = count;
  int m = 1;
  while (m < n) m <<= 1;
  const unsigned long long* in = all_keys + b * kCap;
  for (int i = threadIdx.x; i < m; i += blockDim.x) keys[i] = i < n ? in[i] : ~0ull;
  __syncthreads();
  // Bitonic sort, ascending (the keys are unique within an image).
  for (int k = 2; k <= m; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < m; i += blockDim.x) {
        const int l = i ^ j;
        if (l > i) {
          const unsigned long long a = keys[i], c = keys[l];
          if (((i & k) == 0) == (a > c)) keys[i] = c, keys[l] = a;
        }
      }
      __syncthreads();
    }
  }
  // The candidates in order: boxes in the original image, clipped; degenerate or non-finite rows
  // start out removed (they neither suppress nor are kept).
  float4* boxes = all_boxes + b * kCap;
  int2* aux = all_aux + b * kCap;  // area (float bits), class
  const T* p = pred + b * (4 + classes) * anchors;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const unsigned position = static_cast<unsigned>(keys[i]);
    const int cls = static_cast<int>(position / anchors);
    const int64_t a = position % anchors;
    const float x1 = clip(__fdiv_rn(to_float(p[a]), geo.sx), geo.width);
    const float y1 = clip(__fdiv_rn(to_float(p[anchors + a]), geo.sy), geo.height);
    const float x2 = clip(__fdiv_rn(to_float(p[2 * anchors + a]), geo.sx), geo.width);
    const float y2 = clip(__fdiv_rn(to_float(p[3 * anchors + a]), geo.sy), geo.height);
    const float w = __fsub_rn(x2, x1), h = __fsub_rn(y2, y1);
    const bool keep = w > 0.f && h > 0.f && isfinite(key_score(keys[i]));
    boxes[i] = make_float4(x1, y1, x2, y2);
    aux[i] = make_int2(__float_as_int(__fmul_rn(w, h)), cls);
    removed[i] = keep ? 0 : 1;
  }
  __syncthreads();
  // Greedy pass: warp 0 finds the next box not removed; every thread then removes the later boxes
  // of its class that overlap it.
  const int lane = threadIdx.x & 31;
  int start = 0, kept = 0;
  while (kept < max_det) {
    if (threadIdx.x < 32) {
      int found = n;
      for (int base = start; base < n; base += 32) {
        const int j = base + lane;
        const unsigned free_lanes = __ballot_sync(0xffffffffu, j < n && !removed[j]);
        if (free_lanes) {
          found = base + __ffs(free_lanes) - 1;
          break;
        }
      }
      if (lane == 0) next = found;
    }
    __syncthreads();
    const int i = next;
    if (i >= n) break;
    const float4 bi = boxes[i];
    const int2 ai = aux[i];
    const float area_i = __int_as_float(ai.x);
    if (threadIdx.x == 0) {
      float* row = o + 2 + 6 * static_cast<int64_t>(kept);
      row[0] = bi.x, row[1] = bi.y, row[2] = bi.z, row[3] = bi.w;
      row[4] = key_score(keys[i]);
      row[5] = static_cast<float>(ai.y);
    }
    for (int j = i + 1 + threadIdx.x; j < n; j += blockDim.x) {
      if (removed[j]) continue;
      const int2 aj = aux[j];
      if (aj.y != ai.y) continue;
      const float4 bj = boxes[j];
      const float xx1 = bi.x < bj.x ? bj.x : bi.x, yy1 = bi.y < bj.y ? bj.y : bi.y;  // max
      const float xx2 = bj.z < bi.z ? bj.z : bi.z, yy2 = bj.w < bi.w ? bj.w : bi.w;  // min
      const float dw = __fsub_rn(xx2, xx1), dh = __fsub_rn(yy2, yy1);
      const float w = 0.f < dw ? dw : 0.f, h = 0.f < dh ? dh : 0.f;
      const float inter = __fmul_rn(w, h);
      const float ovr = __fdiv_rn(inter, __fsub_rn(__fadd_rn(area_i, __int_as_float(aj.x)), inter));
      if (ovr > iou) removed[j] = 1;
    }
    ++kept;
    start = i + 1;
    __syncthreads();
  }
  if (threadIdx.x == 0) o[0] = static_cast<float>(count), o[1] = static_cast<float>(kept);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("detect_nms: ") + what + ": " + cudaGetErrorString(e));
}

template <typename T>
void launch(const DetectNmsLaunch& l, const T* pred, const DetectImage* images, void* workspace, float* out) {
  auto* keys = static_cast<unsigned long long*>(workspace);
  auto* boxes = reinterpret_cast<float4*>(keys + l.batch * kCap);
  auto* aux = reinterpret_cast<int2*>(boxes + l.batch * kCap);
  auto* counts = reinterpret_cast<int*>(aux + l.batch * kCap);
  check(cudaMemsetAsync(counts, 0, sizeof(int) * l.batch, l.stream), "counter reset");
  const int64_t total = l.batch * l.classes * l.anchors;
  const int64_t blocks = std::min<int64_t>((total + kGatherThreads - 1) / kGatherThreads, 8192);
  gather_kernel<T><<<static_cast<unsigned>(blocks), kGatherThreads, 0, l.stream>>>(pred, l.anchors, l.classes, total,
                                                                                  l.conf, counts, keys);
  check(cudaGetLastError(), "gather launch");
  for (int64_t first = 0; first < l.batch; first += kDetectNmsMaxImages) {
    const int64_t chunk = std::min<int64_t>(kDetectNmsMaxImages, l.batch - first);
    Images im;
    for (int64_t i = 0; i < chunk; ++i) im.image[i] = images[first + i];
    nms_kernel<T><<<static_cast<unsigned>(chunk), kNmsThreads, 0, l.stream>>>(
        pred, l.anchors, l.classes, l.iou, l.max_det, im, first, counts, keys, boxes, aux, out);
    check(cudaGetLastError(), "nms launch");
  }
}

}  // namespace

int64_t detect_nms_workspace_bytes(int64_t batch) {
  return batch * kCap * static_cast<int64_t>(sizeof(unsigned long long) + sizeof(float4) + sizeof(int2)) +
         batch * static_cast<int64_t>(sizeof(int));
}

void detect_nms(const DetectNmsLaunch& l, const void* pred, const DetectImage* images, void* workspace, float* out) {
  if (l.batch <= 0) return;
  if (l.classes <= 0 || l.anchors <= 0 || l.max_det <= 0 || l.max_det > kCap ||
      static_cast<int64_t>(l.classes) * l.anchors > 0xffffffffLL)
    throw std::invalid_argument("detect_nms: bad launch (classes, anchors or max_det out of range)");
  switch (l.dtype) {
    case DType::Float32:
      launch(l, static_cast<const float*>(pred), images, workspace, out);
      break;
    case DType::Float16:
      launch(l, static_cast<const __half*>(pred), images, workspace, out);
      break;
    case DType::BFloat16:
      launch(l, static_cast<const __nv_bfloat16*>(pred), images, workspace, out);
      break;
  }
}

}  // namespace libreyolo::kernels
