// Anchor points and DFL (distribution focal loss) box decoding of anchor-free detect heads, one
// implementation for a DFL model's decode and its loss (the model's and the loss's decoders
// give the same boxes).
#pragma once
#include <torch/types.h>

#include <array>
#include <cstdint>
#include <vector>

namespace libreyolo::ops {

// The constants of one set of level sizes on one device (float32). Anchors are level-major, then
// row-major inside a level (y outer, x inner).
struct AnchorPoints {
  torch::Tensor xy;      // [2, A] anchor centres in input pixels: gx * s + s / 2 (integer s / 2)
  torch::Tensor stride;  // [A] the stride s of each anchor's level
  torch::Tensor bins;    // [R] the DFL bin values 0 .. R-1
};

// The centres of the n cells along one axis of a level with stride s, in input pixels:
// i * s + s / 2 with integer s / 2 (float32 [n]).
torch::Tensor cell_centres(int64_t n, int64_t stride, const torch::Device& device);

// level_hw[l] = (H, W) of level l, whose stride is strides[l]; reg_max = R bins per side. Built
// with device kernels only (no host-to-device copy), so it may run during a CUDA graph capture.
AnchorPoints make_anchor_points(const std::vector<std::array<int64_t, 2>>& level_hw,
                                const std::vector<int64_t>& strides, int64_t reg_max,
                                const torch::Device& device);

// Boxes from DFL logits [B, 4, R, A] (sides l, t, r, b): per side the expectation of the softmax
// over the R bins (grid units), times the anchor's stride, taken from the anchor centre.
// Returns xyxy [B, 4, A] in input pixels, in the logits' dtype (float32 constants promote to
// float64); differentiable in the logits.
torch::Tensor dfl_boxes(const torch::Tensor& box_logits, const AnchorPoints& anchors);

// The whole inference decode of DFL level maps raw[l] [B, 4R + nc, H_l, W_l] (stride strides[l])
// into predictions [B, 4 + nc, A] float32: xyxy from dfl_boxes, then the class sigmoids. One CUDA
// kernel (kernels/dfl_decode.hpp) when the maps are channels_last float32/float16/bfloat16 CUDA
// tensors, R is 16, nothing records autograd and LIBREYOLO_DECODE_KERNEL is not 0; otherwise an
// undefined tensor (the caller decodes with ATen ops).
torch::Tensor dfl_decode_kernel(const std::vector<torch::Tensor>& raw, const std::vector<int64_t>& strides,
                                int64_t reg_max, int64_t classes);

}  // namespace libreyolo::ops
