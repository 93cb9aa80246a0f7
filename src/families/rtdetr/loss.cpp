#include "families/rtdetr/loss.hpp"

#include <functional>
#include <stdexcept>

#include "libreyolo/errors.hpp"
#include "loss/normalizer.hpp"

namespace libreyolo::loss {

namespace rt = models::rtdetr;
namespace F = torch::nn::functional;

torch::Tensor RtdetrLossTerms::value(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return values[i];
  throw std::out_of_range("RT-DETR loss has no term '" + name + "'");
}

RtdetrLoss::RtdetrLoss(int nc, RtdetrLossWeights weights) : nc_(nc), w_(weights) {
  if (nc < 1) throw UsageError("RtdetrLoss: number of classes must be >= 1, got " + std::to_string(nc));
}

std::array<torch::Tensor, 3> RtdetrLoss::stacked_terms(const std::vector<rt::OutputLevel>& levels,
                                                       const rt::TargetRows& gts,
                                                       const std::vector<const std::vector<rt::ImageMatch>*>& matches,
                                                       const torch::Tensor& num_boxes, int nc) const {
  const auto nl = static_cast<int64_t>(levels.size());
  if (nl == 0 || matches.size() != levels.size()) throw UsageError("RT-DETR loss: a match list per level");
  std::vector<torch::Tensor> lg, bx;
  for (const auto& lv : levels) {
    lg.push_back(lv.logits);
    bx.push_back(lv.boxes);
  }
  // [L * B, n, nc] and [L * B, n, 4]: level l's image i at row l * B + i.
  const auto logits = (nl == 1 ? lg[0] : torch::cat(lg)).to(torch::kFloat);
  const auto boxes = (nl == 1 ? bx[0] : torch::cat(bx)).to(torch::kFloat);
  const auto device = logits.device();
  const int64_t b = levels[0].logits.size(0), n = logits.size(1);
  if (logits.size(0) != nl * b || static_cast<int64_t>(gts.counts.size()) != b)
    throw UsageError("RT-DETR loss: levels, matches or targets for another batch size");
  // Level l's pairs are [l P, (l + 1) P): as many per level (each image's GT count, or its
  // queries where fewer).
  const auto sp = rt::stacked_pairs(matches, gts, device);
  const int64_t pairs = sp.per_level;
  const auto& index = sp.index;
  const auto img = index[0], qry = index[1];
  const auto gt_labels = gts.labels.index_select(0, index[2]);
  const auto gt_boxes = gts.boxes.index_select(0, index[2]);
  const auto src = boxes.index({img, qry});  // [L P, 4]
  rt::Overlap overlap;
  if (pairs > 0) overlap = rt::box_overlap(rt::cxcywh_to_xyxy(src), rt::cxcywh_to_xyxy(gt_boxes));

  // Varifocal: IoU-valued targets at the matched queries' GT classes.
  auto cls = torch::full({nl * b, n}, static_cast<int64_t>(nc), torch::TensorOptions().dtype(torch::kLong).device(device));
  auto score = torch::zeros({nl * b, n}, logits.options());
  if (pairs > 0) {
    cls.index_put_({img, qry}, gt_labels);
    score.index_put_({img, qry}, overlap.iou.detach());
  }
  const auto onehot = F::one_hot(cls, nc + 1).narrow(-1, 0, nc);
  const auto target = score.unsqueeze(-1) * onehot;
  const auto p = torch::sigmoid(logits).detach();
  const auto weight = w_.vfl_alpha * p.pow(w_.vfl_gamma) * (1 - onehot) + target;
  const auto bce = F::binary_cross_entropy_with_logits(
      logits, target, F::BinaryCrossEntropyWithLogitsFuncOptions().weight(weight).reduction(torch::kNone));
  // Per level: sums over its images, queries and classes (its pairs).
  const auto vfl = bce.view({nl, -1}).sum(1) / num_boxes;
  torch::Tensor l1, giou;
  if (pairs == 0) {
    l1 = boxes.view({nl, -1}).sum(1) * 0;
    giou = l1;
  } else {
    l1 = (src - gt_boxes).abs().view({nl, -1}).sum(1) / num_boxes;
    giou = (1 - overlap.giou).view({nl, -1}).sum(1) / num_boxes;
  }
  return {vfl * w_.vfl, l1 * w_.bbox, giou * w_.giou};
}

RtdetrLossTerms RtdetrLoss::terms(const rt::CriterionInputs& in, const std::vector<rt::ImageTargets>& gts) const {
  const int64_t batch = in.last.logits.size(0);
  if (static_cast<int64_t>(gts.size()) != batch)
    throw UsageError("RT-DETR loss: " + std::to_string(gts.size()) + " target lists for a batch of " +
                     std::to_string(batch));
  if (in.last.logits.size(-1) != nc_)
    throw UsageError("RT-DETR loss: logits of " + std::to_string(in.last.logits.size(-1)) + " classes, the loss has " +
                     std::to_string(nc_));
  const auto device = in.last.logits.device();
  RtdetrLossTerms t;
  int64_t count = 0;
  for (const auto& g : gts) count += g.size();
  t.num_boxes = loss_normalizer(torch::tensor(static_cast<float>(count), torch::TensorOptions().device(device)));

  auto add = [&](const std::string& suffix, const std::array<torch::Tensor, 3>& v) {
    static const char* kinds[3] = {"loss_vfl", "loss_bbox", "loss_giou"};
    for (int k = 0; k < 3; ++k) {
      t.names.push_back(kinds[k] + suffix);
      t.values.push_back(v[k]);
    }
  };
  // The encoder top-k as its own level (RT-DETRv2): matched and scored like an auxiliary level,
  // against GT relabelled to one class when its score head is class-agnostic.
  std::vector<std::vector<rt::ImageTargets>> enc_gts;
  for (const auto& level : in.enc) {
    const int nc = static_cast<int>(level.logits.size(-1));
    enc_gts.push_back(gts);
    if (nc == 1 && nc_ != 1)
      for (auto& g : enc_gts.back()) g.labels = torch::zeros_like(g.labels);
    else if (nc != nc_)
      throw UsageError("RT-DETR loss: encoder logits of " + std::to_string(nc) + " classes, the loss has " +
                       std::to_string(nc_));
  }
  // Every matched level at once (one wait for the device): the decoder's last layer, its
  // auxiliary layers, then the encoder levels.
  std::vector<rt::OutputLevel> levels = {in.last};
  levels.insert(levels.end(), in.aux.begin(), in.aux.end());
  std::vector<const std::vector<rt::ImageTargets>*> level_gts(levels.size(), &gts);
  for (size_t l = 0; l < in.enc.size(); ++l) {
    levels.push_back(in.enc[l]);
    level_gts.push_back(&enc_gts[l]);
  }
  t.matches = rt::hungarian_match_levels(levels, level_gts, w_.matcher);
  const size_t decoder_levels = 1 + in.aux.size();
  const rt::TargetRows gt_rows = rt::concatenate_targets(gts, device);
  // Levels of one shape scored together; their terms added one level at a time, in order.
  const auto score_levels = [&](const std::vector<rt::OutputLevel>& group, const rt::TargetRows& rows,
                                const std::vector<const std::vector<rt::ImageMatch>*>& group_matches,
                                const torch::Tensor& nb, int nc, const std::function<std::string(size_t)>& suffix) {
    const auto v = stacked_terms(group, rows, group_matches, nb, nc);
    const auto vfl = v[0].unbind(), l1 = v[1].unbind(), giou = v[2].unbind();
    for (size_t l = 0; l < group.size(); ++l) add(suffix(l), {vfl[l], l1[l], giou[l]});
  };
  {
    std::vector<rt::OutputLevel> group(levels.begin(), levels.begin() + static_cast<std::ptrdiff_t>(decoder_levels));
    std::vector<const std::vector<rt::ImageMatch>*> group_matches;
    for (size_t l = 0; l < decoder_levels; ++l) group_matches.push_back(&t.matches[l]);
    score_levels(group, gt_rows, group_matches, t.num_boxes, nc_,
                 [](size_t l) { return l == 0 ? std::string() : "_aux_" + std::to_string(l - 1); });
  }

  if (!in.dn.empty()) {
    const auto pairs = in.dn_pairs.to(torch::kCPU, torch::kLong);
    if (pairs.dim() != 2 || pairs.size(1) != 3) throw UsageError("RT-DETR loss: denoising pairs must be [P, 3]");
    for (int64_t b = 0; b < batch; ++b) {
      const auto rows = pairs.index({pairs.select(1, 0) == b});
      t.dn_matches.push_back({rows.select(1, 1).contiguous(), rows.select(1, 2).contiguous()});
    }
    const auto num_boxes_dn = t.num_boxes * static_cast<double>(in.dn_groups);
    score_levels(in.dn, gt_rows, std::vector<const std::vector<rt::ImageMatch>*>(in.dn.size(), &t.dn_matches),
                 num_boxes_dn, nc_, [](size_t l) { return "_dn_" + std::to_string(l); });
  }
  for (size_t l = 0; l < in.enc.size(); ++l)
    score_levels({in.enc[l]}, rt::concatenate_targets(enc_gts[l], device), {&t.matches[decoder_levels + l]}, t.num_boxes,
                 static_cast<int>(in.enc[l].logits.size(-1)), [l](size_t) { return "_enc_" + std::to_string(l); });
  t.total = t.values[0];
  for (size_t i = 1; i < t.values.size(); ++i) t.total = t.total + t.values[i];
  return t;
}

LossOutput RtdetrLoss::compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                               int64_t img_w) {
  (void)img_h;
  (void)img_w;
  const auto in = rt::unpack_train_outputs(raw);
  const auto gts = rt::split_targets(targets);
  const auto t = terms(in, gts);
  std::array<torch::Tensor, 3> sums;
  for (size_t i = 0; i < t.values.size(); ++i) {
    auto& s = sums[i % 3];
    s = s.defined() ? s + t.values[i].detach() : t.values[i].detach();
  }
  int64_t matched = 0;
  for (const auto& m : t.matches.front()) matched += m.size();
  LossOutput o;
  o.total = t.total;
  o.terms = torch::stack({sums[0], sums[1], sums[2]});
  o.num_fg = torch::tensor(static_cast<double>(matched) / static_cast<double>(gts.size()),
                           torch::TensorOptions().dtype(torch::kFloat).device(t.total.device()));
  o.names = &term_names();
  return o;
}

}  // namespace libreyolo::loss
