// Training loss interface. Implementations must not synchronise with the host (no .item(),
// no boolean-mask indexing with data-dependent shapes): the step may be captured in a CUDA graph.
#pragma once
#include <torch/torch.h>

#include <vector>

namespace libreyolo {

struct LossOutput {
  torch::Tensor total;   // scalar, backpropagated; already the weighted sum
  torch::Tensor box;     // scalar, weighted (gain applied), detached
  torch::Tensor dfl;     // scalar, weighted, detached
  torch::Tensor cls;     // scalar, weighted, detached
  torch::Tensor num_fg;  // scalar float: positives / batch size, detached
};

class DetectionLoss {
 public:
  virtual ~DetectionLoss() = default;
  // raw: the model's forward_raw() output. targets: [B, T, 5] rows (class, x1, y1, x2, y2)
  // normalised to [0,1] by the input width/height; padding rows have class -1.
  // img_h/img_w: the input tensor's spatial size.
  virtual LossOutput compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets,
                             int64_t img_h, int64_t img_w) = 0;
};

}  // namespace libreyolo
