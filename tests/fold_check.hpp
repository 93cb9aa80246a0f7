// Helpers of the BatchNorm-folding tests (CPU and GPU): BatchNorm state far from its identity
// initialisation, and the process-wide fold switch for one scope.
#pragma once
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "layers/fold.hpp"

namespace libreyolo::test {

// Every BatchNorm2d of m gets random statistics and affine parameters (a fresh model's are the
// identity, which folding would reproduce trivially): mean ~ N(0, 0.5), var ~ U(0.25, 2.25),
// gamma ~ U(0.5, 1.5), beta ~ N(0, 0.3).
inline void randomize_batch_norms(torch::nn::Module& m, uint64_t seed) {
  torch::NoGradGuard ng;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& sub : m.modules(/*include_self=*/false)) {
    auto* bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(sub.get());
    if (!bn) continue;
    const int64_t c = bn->running_mean.size(0);
    const auto cpu = torch::TensorOptions().dtype(torch::kFloat);
    bn->running_mean.copy_(at::normal(0.0, 0.5, {c}, gen, cpu));
    bn->running_var.copy_(at::rand({c}, gen, cpu) * 2.0 + 0.25);
    bn->weight.copy_(at::rand({c}, gen, cpu) + 0.5);
    bn->bias.copy_(at::normal(0.0, 0.3, {c}, gen, cpu));
  }
}

// Sets the fold switch for the length of a scope, restores it after.
struct FoldSwitch {
  explicit FoldSwitch(bool on) : was_(models::common::fold_bn()) { models::common::set_fold_bn(on); }
  ~FoldSwitch() { models::common::set_fold_bn(was_); }
  FoldSwitch(const FoldSwitch&) = delete;
  FoldSwitch& operator=(const FoldSwitch&) = delete;

 private:
  bool was_;
};

}  // namespace libreyolo::test
