// The classify task's loss, shared by every classifier family: cross-entropy of the logits
// against class ids [B] (int64) or soft labels [B, nc], the mean over the batch, computed in
// float32 whatever the logits' dtype. With per-class weights [nc], each sample's term is weighted
// by its class's weight and the batch mean taken plainly (not divided by the summed weights).
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "loss/loss.hpp"

namespace libreyolo::loss {

torch::Tensor classification_loss(const torch::Tensor& logits, const torch::Tensor& targets,
                                  const torch::Tensor& class_weights = {});

// The classify task's training loss for the step runner: raw = {logits [B, nc]}, targets the
// class ids [B]; one term, "ce".
class ClassificationLoss final : public TrainingLoss {
 public:
  LossOutput compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                     int64_t img_w) override;
  const std::vector<std::string>& term_names() const override;
};

}  // namespace libreyolo::loss
