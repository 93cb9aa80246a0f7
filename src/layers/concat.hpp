// Channel concatenations assembled in place for inference: each part is written by its producer
// (a ConvBnAct block, ConvOutput::into) straight into its channel slice of one tensor, instead of
// being produced on its own and copied once more by torch::cat. With cuDNN's fused convolutions
// (layers/cudnn_fusion.hpp) the slice is the convolution's output: the concatenation costs no
// kernel at all, and a later block reads its input from a slice the same way. Elsewhere the
// producer's result is copied into its slice: the same values as torch::cat.
//
// Blocks use it when no autograd graph is recorded (eval, validation, predict); training keeps
// torch::cat. LIBREYOLO_CONCAT_IN_PLACE=0 turns it off (for comparisons).
#pragma once
#include <torch/torch.h>

#include <vector>

#include "layers/conv.hpp"

namespace libreyolo::models::common {

void set_concat_in_place(bool on);
bool concat_in_place();

class ChannelConcat {
 public:
  // Whether a block assembles its concatenation in place for input x: the switch is on and no
  // autograd graph is recorded.
  static bool applies(const torch::Tensor& x);
  // [N, sum(channels), H, W] with x's batch and spatial size (the blocks' concatenations keep it),
  // in the dtype and memory format `producer` gives its result for input x.
  ChannelConcat(const torch::Tensor& x, const ConvBnActImpl& producer, const std::vector<int64_t>& channels);
  // The dtype, device and memory format `producer` gives its result for input x.
  static torch::TensorOptions options(const torch::Tensor& x, const ConvBnActImpl& producer);
  // [n, sum(channels), h, w] with `options` (dtype, device, memory format).
  ChannelConcat(int64_t n, int64_t h, int64_t w, const torch::TensorOptions& options,
                const std::vector<int64_t>& channels);
  // Part i's slice, to pass as ConvOutput::into; whole(): the concatenation.
  const torch::Tensor* part(size_t i) const { return &parts_.at(i); }
  const torch::Tensor& whole() const { return whole_; }

 private:
  torch::Tensor whole_;
  std::vector<torch::Tensor> parts_;
};

}  // namespace libreyolo::models::common
