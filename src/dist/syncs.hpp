// The synchronisations of data-parallel training, implementations of the seams that the
// single-process code leaves empty:
//  - gradients (engine/step.hpp GradSync): bucketed all-reduce after the last backward of an
//    accumulation window, then divided by the world size: every rank steps with the mean;
//  - a sum across processes (core/cross_process.hpp), which the BatchNorm statistics seam
//    (layers/conv_bn_act.hpp, sync_bn) and the loss-normaliser seam (loss/normalizer.hpp) take.
// With all three, N ranks training at batch B/N compute the update of one process at batch B.
#pragma once
#include <memory>
#include <vector>

#include "dist/group.hpp"
#include "engine/step.hpp"
#include "core/cross_process.hpp"

namespace libreyolo::dist {

class AllReduceGradSync final : public engine::GradSync {
 public:
  explicit AllReduceGradSync(std::shared_ptr<Group> group, int64_t bucket_bytes = 25 << 20);
  void after_backward(std::vector<torch::Tensor>& grads) override;
  bool spans_processes() const override { return true; }

 private:
  std::shared_ptr<Group> group_;
  int64_t bucket_bytes_;
};

// The cross-process sum both the SyncBN and the loss-normaliser seams take, on the group.
class GroupSum final : public CrossProcessSum {
 public:
  explicit GroupSum(std::shared_ptr<Group> group) : group_(std::move(group)) {}
  int rank() const override { return group_->rank(); }
  int world_size() const override { return group_->world_size(); }
  void all_reduce_sum(torch::Tensor& t) override;

 private:
  std::shared_ptr<Group> group_;
};

// Rank src's parameters and buffers on every rank (the start of data-parallel training).
void broadcast_module(torch::nn::Module& m, Group& group, int src = 0);

}  // namespace libreyolo::dist
