// D-FINE's training criterion. The levels [last decoder layer, layers 0..L-2, layer 0's own
// prediction ("pre"), the encoder top-k] are each matched by RT-DETR's Hungarian matcher; the
// union of all those matches (GO-LSD: per image every matched (query, GT) pair, the most
// frequent pair of each query kept) supervises the boxes and the distributions of every level,
// the level's own matches its classes. With num_boxes = max(GT count, 1) and num_go = max(union
// size, 1) (means over processes under data parallelism):
//   vfl  (x1):    varifocal loss against IoU-valued targets at the level's own matches / num_boxes
//                 (alpha 0.75, gamma 2);
//   bbox (x5), giou (x2): L1 and 1 - GIoU over the union's pairs / num_go;
//   fgl  (x0.15): per box edge, cross entropy against the two bins around the GT's edge distance
//                 (measured from the layer-0 reference box in units of the weighting function),
//                 weighted by their closeness and by the pair's IoU / num_go;
//   ddf  (x1.5):  on layers 0..L-2, KL divergence of every query's edge distributions (temperature
//                 5) from the last layer's, weighted by IoU on matched queries and by the last
//                 layer's best class score elsewhere, the two means mixed by sqrt of their counts.
// Denoising levels (every layer and "pre") use the positive copies' pairs and num_boxes x G.
// IoU and GIoU here divide without an epsilon, as D-FINE's box operations do.
// DEIM's criterion (also RT-DETRv4's) is the same with its matchability-aware class term in place
// of vfl, under the name mal (DfineLossWeights::mal): binary cross entropy against IoU^gamma at
// the level's own matches, negatives weighted by p^gamma, positives by 1 (gamma 1.5).
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "families/rtdetr/dfine.hpp"
#include "families/rtdetr/matcher.hpp"
#include "loss/loss.hpp"

namespace libreyolo::loss {

struct DfineLossWeights {
  bool mal = false;  // the class term: varifocal (D-FINE), or matchability-aware (DEIM)
  double vfl = 1.0, bbox = 5.0, giou = 2.0, fgl = 0.15, ddf = 1.5;  // vfl: the class term's weight
  double vfl_alpha = 0.75, vfl_gamma = 2.0;                         // mal: gamma only

  double ddf_temperature = 5.0;
  models::rtdetr::MatcherWeights matcher;
};

// Every term under the reference implementation's names, in its order (loss_mal for loss_vfl with
// DfineLossWeights::mal): loss_vfl, loss_bbox,
// loss_giou, loss_fgl of the last layer; then vfl, bbox, giou, fgl, ddf with _aux_{i} for layers
// 0..L-2; vfl, bbox, giou with _pre and with _enc_0; with denoising vfl, bbox, giou, fgl, ddf with
// _dn_{i} for every layer and vfl, bbox, giou with _dn_pre. Weighted, with their gradients.
struct DfineLossTerms {
  std::vector<std::string> names;
  std::vector<torch::Tensor> values;
  torch::Tensor total;
  torch::Tensor num_boxes, num_go;
  // Matches of [last, layers 0..L-2, pre, encoder], the union, the denoising pairs.
  std::vector<std::vector<models::rtdetr::ImageMatch>> matches;
  std::vector<models::rtdetr::ImageMatch> go, dn_matches;
  torch::Tensor value(const std::string& name) const;  // throws std::out_of_range
};

// The union of several levels' matches (the first level's first), per image: every distinct
// (query, GT) pair counted over the levels, taken by descending count (ties in (query, GT)
// order), each query once.
std::vector<models::rtdetr::ImageMatch> union_matches(
    const std::vector<std::vector<models::rtdetr::ImageMatch>>& levels);

// What the criterion resolves before scoring (DfineLoss::plan): the matching of every level, the
// union, the denoising pairs, as stacked pairs per group of levels scored together, the target
// rows and the normalisers; with `pad` > 0 of shapes fixed by the outputs' and pad.
struct DfinePlan final : LossPlan {
  models::rtdetr::TargetRows rows;
  // Every matched level's own pairs; the union's over all matched levels, over the decoder layers,
  // over layers 0..L-2; with denoising the positives' over [layers, pre], the layers, layers 0..L-2.
  models::rtdetr::StackedPairs own, go_all, go_layers, go_students, dn_all, dn_layers, dn_students;
  torch::Tensor num_boxes, num_go, num_boxes_dn, num_fg;
  std::vector<std::vector<models::rtdetr::ImageMatch>> matches;
  std::vector<models::rtdetr::ImageMatch> go, dn_matches;

  std::vector<torch::Tensor> tensors() const override;
};

class DfineLoss : public TrainingLoss {
 public:
  explicit DfineLoss(int nc, DfineLossWeights weights = {});

  // {"vfl" or "mal", "bbox", "giou", "fgl", "ddf"}.
  const std::vector<std::string>& term_names() const override { return names_; }
  // raw: DfineModel::forward_train in training mode (pack_dfine_outputs' layout).
  LossOutput compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                     int64_t img_w) override;
  // compute() in two parts (TrainingLoss::plan): a DfinePlan, and the loss from it.
  std::unique_ptr<LossPlan> plan(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets,
                                 int64_t pad) override;
  LossOutput score(const std::vector<torch::Tensor>& raw, const LossPlan& plan) override;
  // The whole criterion, term by term: planned_terms(out, plan(out, gts)).
  DfineLossTerms terms(const models::rtdetr::DfineTrainOutputs& out,
                       const std::vector<models::rtdetr::ImageTargets>& gts) const;
  // The matching and what the scoring reads (pad: as RtdetrLoss::plan).
  DfinePlan plan(const models::rtdetr::DfineTrainOutputs& out, const std::vector<models::rtdetr::ImageTargets>& gts,
                 int64_t pad = 0) const;
  DfineLossTerms planned_terms(const models::rtdetr::DfineTrainOutputs& out, const DfinePlan& plan) const;

 private:
  int nc_;
  DfineLossWeights w_;
  std::vector<std::string> names_;
};

// DEIM's (and RT-DETRv4's) weights: D-FINE's with the mal class term at gamma 1.5.
DfineLossWeights deim_loss_weights();

}  // namespace libreyolo::loss
