// The classification side of the family interface. A classifier is a Detector whose raw output is
// one tensor, the logits [B, nc], and whose decode is the softmax over them: the loaders, the
// checkpoint writer, the weights rules and the facade treat both tasks alike, while the engine's
// task dispatch (Family::task) sends a classifier's train, val and predict to the classify task.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "models/detector.hpp"

namespace libreyolo::models {

class Classifier : public Detector {
 public:
  // The logits [B, nc] of an image batch [B, 3, H, W] already converted (InputSpec).
  virtual torch::Tensor logits(const torch::Tensor& x) = 0;

  std::vector<torch::Tensor> forward_raw(const torch::Tensor& x) override { return {logits(x)}; }
  // Probabilities [B, nc] (float32).
  torch::Tensor decode(const std::vector<torch::Tensor>& raw) override {
    return torch::softmax(raw.at(0).to(torch::kFloat), 1);
  }
  std::vector<int64_t> strides() const override { return {}; }
  std::string size() const override { return size_; }
  int num_classes() const override { return nc_; }
  // A new head for nc classes (PyTorch's default Linear initialisation, on the old head's device
  // and dtype); nothing happens when nc is the current count.
  void reset_num_classes(int nc) override;

 protected:
  // `display` names the family in messages (its product name); nc must be at least 1.
  Classifier(std::string display, int nc, std::string size);
  // Registers the final Linear (in_features -> the class count) under `name` ("fc", "classifier"),
  // where the family's state-dict order puts it.
  void register_head(const std::string& name, int64_t in_features);
  // The head applied to pooled features [B, in_features].
  torch::Tensor head(const torch::Tensor& features) { return head_(features); }

  std::string size_;  // the family's constructor may settle it

 private:
  std::string display_, head_name_;
  int nc_;
  int64_t head_in_ = 0;
  torch::nn::Linear head_{nullptr};
};


// The classifier a Detector is, or nullptr (a detection network).
inline Classifier* as_classifier(Detector& model) { return dynamic_cast<Classifier*>(&model); }

}  // namespace libreyolo::models
