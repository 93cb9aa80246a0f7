// Antialiased bicubic resampling with Pillow's arithmetic (Image.resize with BICUBIC, the filter a
// = -0.5 widened by the downscale factor, 22-bit fixed-point weights, a horizontal pass then a
// vertical one, each rounded and clipped to 8 bits): what torchvision's Resize and
// RandomResizedCrop do to a PIL image, bit for bit.
#pragma once
#include <torch/types.h>

namespace libreyolo::ops {

// [H, W, C] uint8 -> [out_h, out_w, C] uint8: the box (x0, y0, x1, y1) of the source (in pixels,
// Pillow's `box`; the whole image by default) resampled to out_w x out_h. On the CPU, or on a
// CUDA device with the same bytes (kernels/resample.hpp; the build's CUDA kernels).
torch::Tensor resize_bicubic_pil(const torch::Tensor& hwc, int64_t out_h, int64_t out_w);
torch::Tensor resize_bicubic_pil(const torch::Tensor& hwc, int64_t out_h, int64_t out_w, double x0, double y0,
                                 double x1, double y1);
// resize_bicubic_pil(hwc, out_h, out_w)[top : top + win_h, left : left + win_w], computing only
// that window (the same bytes).
torch::Tensor resize_bicubic_pil_window(const torch::Tensor& hwc, int64_t out_h, int64_t out_w, int64_t top,
                                        int64_t left, int64_t win_h, int64_t win_w);

}  // namespace libreyolo::ops
