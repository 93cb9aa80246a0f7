// RT-DETR's training criterion. Every output level is scored against the ground truth of its
// matched queries: the last decoder layer, the auxiliary levels (decoder layers 0..L-2, then the
// encoder top-k), each matched on its own by the Hungarian matcher (families/rtdetr/matcher.hpp),
// and with denoising every decoder layer's denoising queries, matched by construction (the
// positive copies of each GT). Per level, with num_boxes = max(GT count of the batch, 1) (the
// mean over processes under data parallelism), times G for the denoising levels:
//   vfl  (x1): sum over queries x classes of BCE(logit, s) * (0.75 p^2 (1 - t) + s) / num_boxes,
//              t the one-hot GT class of a matched query, s = t * IoU(box, GT) (detached),
//              p = sigmoid(logit) detached;
//   bbox (x5): sum |box - GT| (cxcywh) / num_boxes;   giou (x2): sum (1 - GIoU) / num_boxes.
// Outputs are taken in float32. Matching synchronises with the host (the assignment is solved
// there): RtdetrLoss::plan does it, and the scoring of a plan reads only device tensors.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "families/rtdetr/matcher.hpp"
#include "families/rtdetr/model.hpp"
#include "loss/loss.hpp"

namespace libreyolo::loss {

struct RtdetrLossWeights {
  double vfl = 1.0, bbox = 5.0, giou = 2.0;
  double vfl_alpha = 0.75, vfl_gamma = 2.0;
  models::rtdetr::MatcherWeights matcher;
};

// Every term under the reference implementation's names, in its order: loss_vfl, loss_bbox,
// loss_giou of the last layer, the same with _aux_{i} for each auxiliary level i, then with
// _dn_{i} for each decoder layer's denoising queries (absent without denoising), then with
// _enc_{i} for the encoder top-k when it is a level of its own (RT-DETRv2). Weighted, with
// their gradients.
struct RtdetrLossTerms {
  std::vector<std::string> names;
  std::vector<torch::Tensor> values;
  torch::Tensor total;      // the sum of all values
  torch::Tensor num_boxes;  // the normaliser of the matched levels (float32 scalar)
  // Matches of the last layer, then of each auxiliary level, then of each encoder level; then the
  // denoising pairs per image.
  std::vector<std::vector<models::rtdetr::ImageMatch>> matches;
  std::vector<models::rtdetr::ImageMatch> dn_matches;
  torch::Tensor value(const std::string& name) const;  // throws std::out_of_range
};

// What the criterion resolves before scoring: the matching (on the host) and every index, target
// row and normaliser the scoring reads, as device tensors. With `pad` > 0 boxes per image their
// shapes depend only on the batch size, the levels' shapes and pad, and the scoring
// (RtdetrLoss::planned_terms) reads nothing else from the host.
struct RtdetrPlan final : LossPlan {
  struct Group {  // levels of one shape scored together
    std::vector<size_t> levels;  // into the plan's level order: last, auxiliary, denoising, encoder
    models::rtdetr::StackedPairs pairs;
    size_t targets = 0;          // which target rows
    torch::Tensor num_boxes;
    int nc = 0;
  };
  std::vector<models::rtdetr::TargetRows> targets;  // the GT, then each relabelled encoder set
  std::vector<Group> groups;
  std::vector<std::string> names;  // every term's name, in order
  torch::Tensor num_boxes;         // the matched levels' normaliser (float32 scalar)
  torch::Tensor num_fg;            // the last layer's matched queries per image (float32 scalar)
  // Matches of the last layer, then of each auxiliary level, then of each encoder level; then the
  // denoising pairs per image.
  std::vector<std::vector<models::rtdetr::ImageMatch>> matches;
  std::vector<models::rtdetr::ImageMatch> dn_matches;

  std::vector<torch::Tensor> tensors() const override;
};

class RtdetrLoss : public TrainingLoss {
 public:
  explicit RtdetrLoss(int nc, RtdetrLossWeights weights = {});

  // The CSV's terms: each the sum of that kind over every level (main, auxiliary, denoising).
  const std::vector<std::string>& term_names() const override {
    static const std::vector<std::string> names = {"vfl", "bbox", "giou"};
    return names;
  }
  // raw: RtdetrModel::forward_train in training mode (pack_train_outputs' layout); targets as
  // the interface says. num_fg: the last layer's matched queries per image.
  LossOutput compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                     int64_t img_w) override;

  // compute() in two parts (TrainingLoss::plan): an RtdetrPlan, and the loss from it.
  std::unique_ptr<LossPlan> plan(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets,
                                 int64_t pad) override;
  LossOutput score(const std::vector<torch::Tensor>& raw, const LossPlan& plan) override;

  // The whole criterion, term by term: planned_terms(in, plan(in, gts)).
  RtdetrLossTerms terms(const models::rtdetr::CriterionInputs& in,
                        const std::vector<models::rtdetr::ImageTargets>& gts) const;
  // The matching and what the scoring reads; pad > 0: room for that many boxes per image (at least
  // every image's count, else UsageError), 0: exactly the batch's.
  RtdetrPlan plan(const models::rtdetr::CriterionInputs& in, const std::vector<models::rtdetr::ImageTargets>& gts,
                  int64_t pad = 0) const;
  // The terms of a plan made for outputs of these shapes (matches and pairs copied from it).
  RtdetrLossTerms planned_terms(const models::rtdetr::CriterionInputs& in, const RtdetrPlan& plan) const;
  int num_classes() const { return nc_; }
  const RtdetrLossWeights& weights() const { return w_; }

 private:
  // The weighted {vfl, bbox, giou} of several levels of one shape scored together (their outputs
  // stacked: one set of operations for all), [L] each; matches[l] are level l's pairs and every
  // level has as many (padding kept out of the terms). nc: the class count of the levels' logits (1: a
  // class-agnostic encoder level).
  std::array<torch::Tensor, 3> stacked_terms(const std::vector<models::rtdetr::OutputLevel>& levels,
                                             const models::rtdetr::TargetRows& gts,
                                             const models::rtdetr::StackedPairs& pairs, const torch::Tensor& num_boxes,
                                             int nc) const;
  int nc_;
  RtdetrLossWeights w_;
};

}  // namespace libreyolo::loss
