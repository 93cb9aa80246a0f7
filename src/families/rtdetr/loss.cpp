#include "families/rtdetr/loss.hpp"

#include <algorithm>
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
                                                       const rt::TargetRows& gts, const rt::StackedPairs& sp,
                                                       const torch::Tensor& num_boxes, int nc) const {
  const auto nl = static_cast<int64_t>(levels.size());
  if (nl == 0) throw UsageError("RT-DETR loss: no level to score");
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
  // queries where fewer; padded: B pad, the padding kept out of every term).
  const auto p = rt::gather_pairs(sp, nl, gts);
  const auto src = boxes.index({p.row, p.qry});  // [L P, 4]
  rt::Overlap overlap;
  if (!p.empty()) overlap = rt::box_overlap(rt::cxcywh_to_xyxy(src), rt::cxcywh_to_xyxy(p.boxes));

  // Varifocal: IoU-valued targets at the matched queries' GT classes.
  auto cls = torch::full({nl * b, n}, static_cast<int64_t>(nc), torch::TensorOptions().dtype(torch::kLong).device(device));
  auto score = torch::zeros({nl * b, n}, logits.options());
  if (!p.empty()) {
    cls = rt::put_at_pairs(cls, p, p.labels);
    score = rt::put_at_pairs(score, p, overlap.iou.detach());
  }
  const auto onehot = F::one_hot(cls, nc + 1).narrow(-1, 0, nc);
  const auto target = score.unsqueeze(-1) * onehot;
  const auto prob = torch::sigmoid(logits).detach();
  const auto weight = w_.vfl_alpha * prob.pow(w_.vfl_gamma) * (1 - onehot) + target;
  const auto bce = F::binary_cross_entropy_with_logits(
      logits, target, F::BinaryCrossEntropyWithLogitsFuncOptions().weight(weight).reduction(torch::kNone));
  // Per level: sums over its images, queries and classes (its pairs).
  const auto vfl = bce.view({nl, -1}).sum(1) / num_boxes;
  torch::Tensor l1, giou;
  if (p.empty()) {
    l1 = boxes.view({nl, -1}).sum(1) * 0;
    giou = l1;
  } else {
    const auto l1_pairs = rt::real_only((src - p.boxes).abs(), p);
    const auto giou_pairs = rt::real_only(1 - overlap.giou, p);
    l1 = l1_pairs.view({nl, -1}).sum(1) / num_boxes;
    giou = giou_pairs.view({nl, -1}).sum(1) / num_boxes;
  }
  return {vfl * w_.vfl, l1 * w_.bbox, giou * w_.giou};
}

RtdetrPlan RtdetrLoss::plan(const rt::CriterionInputs& in, const std::vector<rt::ImageTargets>& gts, int64_t pad) const {
  const int64_t batch = in.last.logits.size(0);
  if (static_cast<int64_t>(gts.size()) != batch)
    throw UsageError("RT-DETR loss: " + std::to_string(gts.size()) + " target lists for a batch of " +
                     std::to_string(batch));
  if (in.last.logits.size(-1) != nc_)
    throw UsageError("RT-DETR loss: logits of " + std::to_string(in.last.logits.size(-1)) + " classes, the loss has " +
                     std::to_string(nc_));
  const auto device = in.last.logits.device();
  RtdetrPlan plan;
  int64_t count = 0;
  for (const auto& g : gts) count += g.size();
  plan.num_boxes = loss_normalizer(torch::tensor(static_cast<float>(count), torch::TensorOptions().device(device)));

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
  plan.matches = rt::hungarian_match_levels(levels, level_gts, w_.matcher);
  const size_t decoder_levels = 1 + in.aux.size();
  // Room for every image's boxes and, per denoising level, its positive copies.
  int64_t room = pad;
  if (pad > 0) {
    for (const auto& g : gts) room = std::max(room, g.size());
  }
  plan.targets.push_back(rt::concatenate_targets(gts, device, room));

  static const char* kinds[3] = {"loss_vfl", "loss_bbox", "loss_giou"};
  size_t next_level = 0;
  // A group of levels with `queries` queries each, `pairs_pad` pair columns per image (padded).
  const auto add_group = [&](size_t levels_in_group, int64_t queries, int64_t pairs_pad, size_t targets,
                             const std::vector<const std::vector<rt::ImageMatch>*>& group_matches,
                             const torch::Tensor& nb, int nc, const std::function<std::string(size_t)>& suffix) {
    RtdetrPlan::Group g;
    for (size_t l = 0; l < levels_in_group; ++l) {
      g.levels.push_back(next_level++);
      for (const char* k : kinds) plan.names.push_back(k + suffix(l));
    }
    g.pairs = rt::stacked_pairs(group_matches, plan.targets[targets], device, queries, pairs_pad);
    g.targets = targets;
    g.num_boxes = nb;
    g.nc = nc;
    plan.groups.push_back(std::move(g));
  };
  {
    std::vector<const std::vector<rt::ImageMatch>*> group_matches;
    for (size_t l = 0; l < decoder_levels; ++l) group_matches.push_back(&plan.matches[l]);
    add_group(decoder_levels, in.last.logits.size(1), room, 0, group_matches, plan.num_boxes, nc_,
              [](size_t l) { return l == 0 ? std::string() : "_aux_" + std::to_string(l - 1); });
  }
  if (!in.dn.empty()) {
    plan.dn_matches = rt::denoising_matches(in.dn_pairs, batch);
    // Padded: room for the positives of half the denoising queries (the most a batch can have
    // at this shape), so that the rows' shape follows the outputs'.
    int64_t dn_room = pad > 0 ? std::max(room, in.dn.front().logits.size(1) / 2) : room;
    if (pad > 0)
      for (const auto& m : plan.dn_matches) dn_room = std::max<int64_t>(dn_room, m.size());
    const auto num_boxes_dn = plan.num_boxes * static_cast<double>(in.dn_groups);
    add_group(in.dn.size(), in.dn.front().logits.size(1), dn_room, 0, std::vector<const std::vector<rt::ImageMatch>*>(in.dn.size(), &plan.dn_matches),
              num_boxes_dn, nc_, [](size_t l) { return "_dn_" + std::to_string(l); });
  }
  for (size_t l = 0; l < in.enc.size(); ++l) {
    plan.targets.push_back(rt::concatenate_targets(enc_gts[l], device, room));
    add_group(1, in.enc[l].logits.size(1), room, plan.targets.size() - 1, {&plan.matches[decoder_levels + l]}, plan.num_boxes,
              static_cast<int>(in.enc[l].logits.size(-1)), [l](size_t) { return "_enc_" + std::to_string(l); });
  }
  int64_t matched = 0;
  for (const auto& m : plan.matches.front()) matched += m.size();
  plan.num_fg = torch::tensor(static_cast<float>(static_cast<double>(matched) / static_cast<double>(batch)),
                              torch::TensorOptions().device(device));
  return plan;
}

RtdetrLossTerms RtdetrLoss::planned_terms(const rt::CriterionInputs& in, const RtdetrPlan& plan) const {
  // The plan's level order: last, auxiliary, denoising, encoder.
  std::vector<const rt::OutputLevel*> order = {&in.last};
  for (const auto& lv : in.aux) order.push_back(&lv);
  for (const auto& lv : in.dn) order.push_back(&lv);
  for (const auto& lv : in.enc) order.push_back(&lv);
  RtdetrLossTerms t;
  t.names = plan.names;
  t.num_boxes = plan.num_boxes;
  t.matches = plan.matches;
  t.dn_matches = plan.dn_matches;
  for (const auto& g : plan.groups) {
    std::vector<rt::OutputLevel> group;
    for (size_t l : g.levels) {
      if (l >= order.size()) throw UsageError("RT-DETR loss: a plan for other outputs");
      group.push_back(*order[l]);
    }
    // Levels of one shape scored together; their terms in order, one level at a time.
    const auto v = stacked_terms(group, plan.targets[g.targets], g.pairs, g.num_boxes, g.nc);
    const auto vfl = v[0].unbind(), l1 = v[1].unbind(), giou = v[2].unbind();
    for (size_t l = 0; l < group.size(); ++l) t.values.insert(t.values.end(), {vfl[l], l1[l], giou[l]});
  }
  if (t.values.size() != t.names.size()) throw UsageError("RT-DETR loss: a plan for other outputs");
  t.total = t.values[0];
  for (size_t i = 1; i < t.values.size(); ++i) t.total = t.total + t.values[i];
  return t;
}

RtdetrLossTerms RtdetrLoss::terms(const rt::CriterionInputs& in, const std::vector<rt::ImageTargets>& gts) const {
  return planned_terms(in, plan(in, gts));
}

std::vector<torch::Tensor> RtdetrPlan::tensors() const {
  std::vector<torch::Tensor> out = {num_boxes, num_fg};
  for (const auto& t : targets) out.insert(out.end(), {t.labels, t.boxes});
  for (const auto& g : groups) {
    out.push_back(g.pairs.index);
    if (!g.num_boxes.is_same(num_boxes)) out.push_back(g.num_boxes);  // most groups share the plan's
    if (g.pairs.keep.defined()) out.insert(out.end(), {g.pairs.scatter, g.pairs.keep});
  }
  return out;
}

std::unique_ptr<LossPlan> RtdetrLoss::plan(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets,
                                           int64_t pad) {
  return std::make_unique<RtdetrPlan>(plan(rt::unpack_train_outputs(raw), rt::split_targets(targets), pad));
}

LossOutput RtdetrLoss::score(const std::vector<torch::Tensor>& raw, const LossPlan& plan) {
  const auto* p = dynamic_cast<const RtdetrPlan*>(&plan);
  if (!p) throw UsageError("RT-DETR loss: a plan of another loss");
  const auto t = planned_terms(rt::unpack_train_outputs(raw), *p);
  std::array<torch::Tensor, 3> sums;
  for (size_t i = 0; i < t.values.size(); ++i) {
    auto& s = sums[i % 3];
    s = s.defined() ? s + t.values[i].detach() : t.values[i].detach();
  }
  LossOutput o;
  o.total = t.total;
  o.terms = torch::stack({sums[0], sums[1], sums[2]});
  o.num_fg = p->num_fg;
  o.names = &term_names();
  return o;
}

LossOutput RtdetrLoss::compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                               int64_t img_w) {
  (void)img_h;
  (void)img_w;
  return score(raw, *plan(raw, targets, 0));
}

}  // namespace libreyolo::loss
