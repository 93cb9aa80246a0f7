// ema += w * (model - ema) over a list of float32 tensors in one launch (engine/ema.cpp): the
// EMA update of every parameter and BatchNorm statistic of a model, which ATen's multi-tensor ops
// do in three passes of about twenty launches each (H200, v9-t: 57 launches, ~0.3 ms a step).
//
// The work is cut into items of at most kLerpItemElements consecutive elements of one tensor; one
// block per item. The item table lives in device memory (built once by the caller while nothing is
// being captured, since the tensors' addresses do not change between steps), so the launch can be
// captured in a CUDA graph. Each element is rounded as the three ATen passes round it (a subtract,
// a multiply by w, an add, no fused multiply-add), so both ways give the same bits.
//
// Plain pointers and a cudaStream_t only.
#pragma once
#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

namespace libreyolo::kernels {

struct LerpItem {
  float* dst = nullptr;        // the average (updated in place)
  const float* src = nullptr;  // the model's tensor
  int64_t count = 0;           // elements, <= kLerpItemElements
};

constexpr int64_t kLerpItemElements = 8192;

// `items`: device memory, n_items entries. `weight`: a device float (w).
void lerp_items(const LerpItem* items, int n_items, const float* weight, cudaStream_t stream);

}  // namespace libreyolo::kernels
