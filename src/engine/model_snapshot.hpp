// What a probe of a model (AutoBatch, the memory check) changes in it, saved and put back.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <utility>
#include <vector>

#include "models/detector.hpp"

namespace libreyolo::engine {

// Everything probing changes in a model, captured before and put back after: each module's
// train/eval flag (frozen BatchNorm layers may be in eval inside a training model) and each
// BatchNorm's running statistics and batch counter (a train-mode forward updates them).
class ModelStateSnapshot {
 public:
  explicit ModelStateSnapshot(torch::nn::Module& root) : root_(root), root_training_(root.is_training()) {
    torch::NoGradGuard ng;
    // modules() lists depth first, parents before their children: restoring in this order lets
    // each module's own flag win over the recursive train(flag) of its parent.
    for (const auto& m : root.modules(/*include_self=*/false)) {
      modes_.emplace_back(m, m->is_training());
      if (!models::is_batchnorm(*m)) continue;
      for (const auto& b : m->named_buffers(/*recurse=*/false)) {
        const std::string& name = b.key();
        if ((name == "running_mean" || name == "running_var" || name == "num_batches_tracked") && b.value().defined())
          buffers_.emplace_back(b.value(), b.value().clone());
      }
    }
  }

  void restore() {
    torch::NoGradGuard ng;
    root_.train(root_training_);
    for (auto& [m, training] : modes_) m->train(training);
    for (auto& [live, saved] : buffers_) live.copy_(saved);
  }

 private:
  torch::nn::Module& root_;
  bool root_training_;
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> modes_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> buffers_;  // live buffer, saved copy
};

}  // namespace libreyolo::engine
