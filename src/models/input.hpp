// The one conversion from loader/decoder images to network input, for training, validation and
// predict alike.
#pragma once
#include <torch/torch.h>

#include "models/detector.hpp"

namespace libreyolo::models {

// [B, H, W, 3] uint8 RGB on any device -> float [B, 3, H, W] on `device` (channels_last strides
// when asked), divided and channel-ordered as `spec` says. With `out` defined (float, same shape
// and device) the result is written into it, whatever its layout (a persistent buffer), and
// `out` is returned.
torch::Tensor to_network_input(const torch::Tensor& images, const InputSpec& spec, const torch::Device& device,
                               bool channels_last, torch::Tensor out = {});

}  // namespace libreyolo::models
