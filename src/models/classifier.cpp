#include "models/classifier.hpp"

#include <libreyolo/errors.hpp>

namespace libreyolo::models {

Classifier::Classifier(std::string display, int nc, std::string size)
    : size_(std::move(size)), display_(std::move(display)), nc_(nc) {
  if (nc < 1) throw UsageError(display_ + ": the class count must be at least 1");
}

void Classifier::register_head(const std::string& name, int64_t in_features) {
  head_name_ = name;
  head_in_ = in_features;
  head_ = register_module(name, torch::nn::Linear(in_features, nc_));
}

void Classifier::reset_num_classes(int nc) {
  if (nc == nc_) return;
  if (nc < 1) throw UsageError(display_ + ": the class count must be at least 1");
  const auto& w = head_->weight;
  auto fresh = torch::nn::Linear(head_in_, nc);
  fresh->to(w.device(), w.scalar_type());
  head_ = replace_module(head_name_, fresh);
  nc_ = nc;
}


}  // namespace libreyolo::models
