// One training or validation batch as the loader hands it to the engine.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace libreyolo::data {

struct Batch {
  // [B, S, S, 3] uint8 RGB (HWC per image). Pinned when the loader was asked to pin.
  // The engine moves it to the device and turns it into float NCHW in [0,1] there:
  // images.permute({0,3,1,2}) is already a channels_last-strided NCHW view.
  torch::Tensor images;
  // [B, max_labels, 5] float32 rows (class, x1, y1, x2, y2) normalised to [0,1]; padding class -1.
  torch::Tensor targets;
  std::vector<std::pair<int, int>> orig_hw;  // original image (height, width) per sample
  std::vector<int64_t> indices;              // dataset index per sample
};

}  // namespace libreyolo::data
