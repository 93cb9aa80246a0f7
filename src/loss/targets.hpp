// The loader's targets as the losses' ground-truth rows, in fixed shapes and without host-to-device
// copies (a training step that captures as one CUDA graph may not copy from pageable host memory).
#pragma once
#include <torch/torch.h>

namespace libreyolo::loss {

// targets [B, T, 5] (class, x1, y1, x2, y2 normalised to the input; class < 0: a padding row) as
// float32 rows on `device` with the box in input pixels; one padding row (all -1) per image when
// T is 0.
torch::Tensor xyxy_pixel_rows(const torch::Tensor& targets, int64_t batch, int64_t img_h, int64_t img_w,
                              const torch::Device& device);

}  // namespace libreyolo::loss
