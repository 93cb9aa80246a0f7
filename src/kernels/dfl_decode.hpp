// The inference decode of an anchor-free DFL head in one kernel: from the level maps
// [B, H, W, 4R + nc] (NHWC, packed) straight to the predictions [B, 4 + nc, A] in float32, A the
// anchors of all levels (level-major, row-major inside a level): per anchor and side the softmax
// over the R bins, its expectation (p_k = e_k / sum, then sum of p_k * k), times the level's
// stride, taken from the cell centre (x * s + s / 2) into xyxy; per class the sigmoid. The same
// arithmetic as ops::dfl_boxes and the sigmoid in float32 (sums in another order: equal within a
// few ulp). Replaces the reshapes, concatenations, casts, softmax and elementwise passes of the
// ATen form (~1 ms of a 32-image batch on an H200).
//
// Plain pointers and a cudaStream_t only; ops/dfl.hpp is the torch side.
#pragma once
#include <cstdint>

#include "kernels/bn_act.hpp"  // DType

namespace libreyolo::kernels {

struct DflDecodeLevel {
  const void* data = nullptr;  // [B, height, width, channels] NHWC, packed
  int height = 0, width = 0, stride = 0;
};

struct DflDecodeLaunch {
  int64_t batch = 0;
  int levels = 0;  // at most 4
  DflDecodeLevel level[4];
  int reg_max = 16;  // R: 16 is the one compiled
  int classes = 0;
  DType dtype = DType::Float32;  // of the level maps
  cudaStream_t stream = nullptr;
};

// out: [batch, 4 + classes, A] float32, A = sum of height * width.
void dfl_decode(const DflDecodeLaunch& l, float* out);

}  // namespace libreyolo::kernels
