#include "loss/classify.hpp"

#include <stdexcept>

namespace libreyolo::loss {

torch::Tensor classification_loss(const torch::Tensor& logits, const torch::Tensor& targets,
                                  const torch::Tensor& class_weights) {
  if (logits.dim() != 2) throw std::invalid_argument("classification_loss: logits must be [B, nc]");
  // Half-precision logits (AMP) are taken in float32; float64 stays float64.
  const auto dtype = torch::promote_types(logits.scalar_type(), torch::kFloat);
  const auto logp = torch::log_softmax(logits.to(dtype), 1);
  torch::Tensor per_sample;
  if (targets.dim() == 1) {
    per_sample = -logp.gather(1, targets.to(torch::kLong).unsqueeze(1)).squeeze(1);
    if (class_weights.defined()) per_sample = per_sample * class_weights.to(logp.device()).index_select(0, targets);
  } else {
    const auto soft = targets.to(dtype);
    per_sample = -(soft * logp).sum(1);
    if (class_weights.defined()) per_sample = per_sample * (soft * class_weights.to(logp.device())).sum(1);
  }
  return per_sample.mean();
}

LossOutput ClassificationLoss::compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets,
                                       int64_t /*img_h*/, int64_t /*img_w*/) {
  if (raw.size() != 1) throw std::invalid_argument("ClassificationLoss: expected one output, the logits");
  if (targets.dim() != 1 || targets.size(0) != raw[0].size(0))
    throw std::invalid_argument("ClassificationLoss: targets must be the class ids [B] of the batch");
  LossOutput o;
  o.total = classification_loss(raw[0], targets);
  o.terms = o.total.detach().reshape({1});
  o.num_fg = torch::ones({}, o.total.options()).detach();
  o.names = &term_names();
  return o;
}

const std::vector<std::string>& ClassificationLoss::term_names() const {
  static const std::vector<std::string> names = {"ce"};
  return names;
}

}  // namespace libreyolo::loss
