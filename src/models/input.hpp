// The one conversion from loader/decoder images to network input, for training, validation and
// predict alike.
#pragma once
#include <torch/torch.h>

#include "models/detector.hpp"

namespace libreyolo::models {

// [B, H, W, 3] uint8 RGB on any device -> [B, 3, H, W] of `dtype` on `device` (channels_last
// strides when asked), divided, channel-ordered and normalised (mean, stddev) as `spec` says: the
// values in float32, rounded once to `dtype` (under autocast, the first convolution's input
// dtype: the cast it would make is then already done). With `out` defined (`dtype`, same shape and device) the result is written
// into it (a persistent buffer), and `out` is returned. On a CUDA device one kernel does it all
// (kernels/network_input.hpp; LIBREYOLO_INPUT_KERNEL=0: ATen's ops), equal to the ops bit for bit.
torch::Tensor to_network_input(const torch::Tensor& images, const InputSpec& spec, const torch::Device& device,
                               bool channels_last, torch::Tensor out = {}, torch::ScalarType dtype = torch::kFloat);

}  // namespace libreyolo::models
