// The memory layout the inference paths that read and write channel slices accept.
#pragma once
#include <torch/torch.h>

namespace libreyolo::models::common {

// Elements from one pixel's channels to the next pixel's when t [N, C, H, W] is channels-last
// with packed pixels (a channels_last tensor, or a channel slice of one: e.g. a part of a
// concatenation assembled in place, common/concat.hpp), else 0.
inline int64_t pixel_stride(const torch::Tensor& t) {
  if (t.dim() != 4) return 0;
  if (t.is_contiguous(at::MemoryFormat::ChannelsLast)) return t.size(1);
  const auto d = t.sizes();
  const auto s = t.strides();
  if (s[1] != 1 || s[3] < d[1] || s[2] != d[3] * s[3] || (d[0] > 1 && s[0] != d[2] * s[2])) return 0;
  return s[3];
}

}  // namespace libreyolo::models::common
