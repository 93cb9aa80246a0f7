#include "models/input.hpp"

namespace libreyolo::models {

torch::Tensor to_network_input(const torch::Tensor& images, const InputSpec& spec, const torch::Device& device,
                               bool channels_last, torch::Tensor out) {
  TORCH_CHECK(images.dim() == 4 && images.size(3) == 3, "network input: expected [B, H, W, 3] images, got ",
              images.sizes());
  // The NCHW view of NHWC memory has channels_last strides already: with channels_last the
  // conversion to float is the only copy.
  torch::Tensor x = images.to(device, /*non_blocking=*/true).permute({0, 3, 1, 2});
  if (spec.bgr) x = x.flip(1);
  const auto layout = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  if (out.defined() && out.sizes() == x.sizes() && out.device() == x.device() && out.scalar_type() == torch::kFloat) {
    out.copy_(x);
  } else {
    out = x.to(torch::TensorOptions().dtype(torch::kFloat), false, false, layout);
  }
  if (spec.divisor != 1.0) out.div_(spec.divisor);
  return out;
}

}  // namespace libreyolo::models
