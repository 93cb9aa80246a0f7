// The classify task's loss, shared by every classifier family: cross-entropy of the logits
// against class ids [B] (int64) or soft labels [B, nc], the mean over the batch, computed in
// float32 whatever the logits' dtype. With per-class weights [nc], each sample's term is weighted
// by its class's weight and the batch mean taken plainly (not divided by the summed weights).
#pragma once
#include <torch/torch.h>

namespace libreyolo::loss {

torch::Tensor classification_loss(const torch::Tensor& logits, const torch::Tensor& targets,
                                  const torch::Tensor& class_weights = {});

}  // namespace libreyolo::loss
