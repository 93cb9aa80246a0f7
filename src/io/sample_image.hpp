// The built-in sample image (SAMPLE_IMAGE): a synthetic scene painted in code, so predict can
// run without downloads. assets/sample.jpg is the same scene at 640x480, encoded once.
#pragma once
#include <torch/types.h>

namespace libreyolo::io {

// [height, width, 3] uint8 RGB: sky and ground gradients, a sun, a house with a roof and a door,
// a tree, a ball and a triangle, with a mild deterministic noise texture. The scene scales with
// the size; the same size always gives the same pixels.
torch::Tensor make_sample_image(int height = 480, int width = 640);

}  // namespace libreyolo::io
