#include "loss/targets.hpp"

namespace libreyolo::loss {

torch::Tensor xyxy_pixel_rows(const torch::Tensor& targets, int64_t batch, int64_t img_h, int64_t img_w,
                              const torch::Device& device) {
  const auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
  if (targets.size(1) == 0) return torch::full({batch, 1, 5}, -1.0, opts);
  const auto gt = targets.to(opts);
  // Scalar factors per column: a tensor of them would be made on the host and copied over.
  const auto w = static_cast<double>(img_w), h = static_cast<double>(img_h);
  return torch::cat({gt.narrow(2, 0, 1), gt.narrow(2, 1, 1) * w, gt.narrow(2, 2, 1) * h, gt.narrow(2, 3, 1) * w,
                     gt.narrow(2, 4, 1) * h},
                    2);
}

}  // namespace libreyolo::loss
