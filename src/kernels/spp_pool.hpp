// The three chained 5x5 stride-1 max pools (padding 2) of an SPPELAN block in one pass, for
// inference: from y0 [N, H, W, C] (NHWC, each pixel's C channels `in_pixel` elements after the
// previous pixel's: a channel slice of a wider tensor), the maxima over the 5x5, 9x9 and 13x13
// windows clipped to the image, written into three NHWC outputs of pixel stride `out_pixel`.
// Chaining 5x5 pools whose padding never wins (ATen pads with -inf) gives exactly these windows,
// so the results are ATen's bits; NaN propagates as in ATen's max pooling. `rows`: scratch of
// 3 * N * H * W * C elements (the row maxima between the two passes).
//
// Plain pointers and a cudaStream_t only; models/spp_pool.cpp is the torch side.
#pragma once
#include <cstdint>

#include "kernels/bn_act.hpp"  // DType

namespace libreyolo::kernels {

struct SppPoolLaunch {
  int64_t batch = 0;
  int height = 0, width = 0, channels = 0;
  int64_t in_pixel = 0, out_pixel = 0;  // elements from one pixel's channels to the next pixel's
  DType dtype = DType::Float32;
  cudaStream_t stream = nullptr;
};

void spp_max_pools(const SppPoolLaunch& l, const void* y0, void* rows, void* y5, void* y9, void* y13);

}  // namespace libreyolo::kernels
