// Pixel operations on uint8 HWC tensors (CPU), written for the data loader's hot path.
#pragma once
#include <torch/types.h>

#include <cstdint>

namespace libreyolo::ops {

// Bilinear resize with OpenCV INTER_LINEAR semantics (half-pixel centres, no antialiasing),
// [H, W, C] uint8 -> [out_h, out_w, C] uint8 (any C; 1 and 3 have unrolled loops). Results are
// within one level of the exact real-valued interpolation (fixed-point weights).
torch::Tensor resize_bilinear(const torch::Tensor& hwc, int out_h, int out_w);
// Resize so the longer side becomes `target` (sizes truncated with int(), at least 1),
// as LibreYOLO's load_resized_img does. Returns the ratio used via *ratio if given, and the
// input itself (no copy) when the size already matches.
torch::Tensor resize_longest(const torch::Tensor& hwc, int target, double* ratio = nullptr);
// Pastes the image at the top-left of an S x S canvas filled with `pad` (resizing first with
// ratio min(S/h, S/w)). Returns the canvas; *ratio receives the ratio.
torch::Tensor letterbox_topleft(const torch::Tensor& hwc, int size, double* ratio = nullptr,
                                uint8_t pad = 114);

}  // namespace libreyolo::ops
