// The classify task's data: LibreYOLO's class-folder layout (root/train/<class>/*, root/val/<class>/*,
// optionally root/test/<class>/*; classes are the sorted folder names of train/) and its two
// transforms: the evaluation one (shorter side resized bicubically to floor(S / crop_pct), the
// centre S x S crop) and the training one (a random resized crop of 50-100 % of the area and an
// aspect ratio in [3/4, 4/3], bicubic to S x S, then a horizontal flip with probability flip_prob).
// Both give uint8 [S, S, 3] RGB; the network's normalisation is the model's input convention.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "data/rng.hpp"

namespace libreyolo::data {

struct ClassifySample {
  std::string path;
  int64_t label = 0;
};

struct ClassifySplit {
  std::string dir;
  std::vector<ClassifySample> samples;
};

struct ClassifyDataset {
  std::string root;
  std::vector<std::string> names;  // index = class id
  ClassifySplit train, val;
  bool has_val = false;
};

// Reads the layout at `data`: the root (with train/) or one of its split folders (train, val or
// test). DataError when the path is missing, is a detection dataset (a YAML file, or images/ and
// labels/ folders), holds images but no class folders, has a class folder without images, or when
// the validation split's classes differ from train's. Without val/ the training split is also the
// validation one (has_val false), with a warning.
ClassifyDataset load_classify_dataset(const std::string& data);
// Only a split folder (class folders directly under it) against the classes `names` (empty: take
// the folder's own, sorted). DataError as above.
ClassifySplit load_classify_split(const std::string& dir, std::vector<std::string>& names);

// The evaluation transform of an RGB image [H, W, 3] uint8 (on the CPU or a CUDA device: the same bytes).
torch::Tensor classify_eval_transform(const torch::Tensor& hwc, int size, double crop_pct);
// The training transform, its random draws from `rng`.
torch::Tensor classify_train_transform(const torch::Tensor& hwc, int size, double flip_prob, Rng& rng,
                                       double scale_min = 0.5, double scale_max = 1.0);

}  // namespace libreyolo::data
