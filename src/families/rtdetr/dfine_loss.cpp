#include "families/rtdetr/dfine_loss.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

#include "libreyolo/errors.hpp"
#include "loss/normalizer.hpp"

namespace libreyolo::loss {

namespace rt = models::rtdetr;
namespace F = torch::nn::functional;

namespace {

// cxcywh -> xyxy with negative widths and heights taken as 0 (D-FINE's conversion).
torch::Tensor to_xyxy(const torch::Tensor& b) {
  const auto cx = b.select(-1, 0), cy = b.select(-1, 1);
  const auto hw = 0.5 * b.select(-1, 2).clamp_min(0.0), hh = 0.5 * b.select(-1, 3).clamp_min(0.0);
  return torch::stack({cx - hw, cy - hh, cx + hw, cy + hh}, -1);
}

torch::Tensor area(const torch::Tensor& b) {
  return (b.select(-1, 2) - b.select(-1, 0)) * (b.select(-1, 3) - b.select(-1, 1));
}

// Elementwise IoU and GIoU of xyxy boxes [P, 4], without epsilons.
std::pair<torch::Tensor, torch::Tensor> iou_giou(const torch::Tensor& a, const torch::Tensor& b) {
  const auto lt = torch::max(a.narrow(-1, 0, 2), b.narrow(-1, 0, 2));
  const auto rb = torch::min(a.narrow(-1, 2, 2), b.narrow(-1, 2, 2));
  const auto wh = (rb - lt).clamp_min(0.0);
  const auto inter = wh.select(-1, 0) * wh.select(-1, 1);
  const auto uni = area(a) + area(b) - inter;
  const auto iou = inter / uni;
  const auto hlt = torch::min(a.narrow(-1, 0, 2), b.narrow(-1, 0, 2));
  const auto hrb = torch::max(a.narrow(-1, 2, 2), b.narrow(-1, 2, 2));
  const auto hwh = (hrb - hlt).clamp_min(0.0);
  const auto hull = hwh.select(-1, 0) * hwh.select(-1, 1);
  return {iou, iou - (hull - uni) / hull};
}

// The matched pairs of a level, flattened: image and query indices on `device`, the GTs' labels
// and cxcywh boxes.
struct Pairs {
  torch::Tensor img, qry, labels, boxes;
  int64_t size() const { return img.numel(); }
};

Pairs gather_pairs(const std::vector<rt::ImageMatch>& matches, const std::vector<rt::ImageTargets>& gts,
                   const torch::Device& device) {
  std::vector<torch::Tensor> images, queries, labels, boxes;
  for (size_t i = 0; i < matches.size(); ++i) {
    const auto& m = matches[i];
    images.push_back(torch::full({m.size()}, static_cast<int64_t>(i), torch::kLong));
    queries.push_back(m.query.to(torch::kLong));
    const auto gt = m.gt.to(gts[i].labels.device(), torch::kLong);
    labels.push_back(gts[i].labels.index_select(0, gt));
    boxes.push_back(gts[i].boxes.index_select(0, gt));
  }
  Pairs p;
  p.img = torch::cat(images).to(device);
  p.qry = torch::cat(queries).to(device);
  p.labels = torch::cat(labels).to(device);
  p.boxes = torch::cat(boxes).to(device, torch::kFloat);
  return p;
}

// One level's logits, boxes and (where it has them) corners and references, in float32.
struct Level {
  torch::Tensor logits, boxes, corners, refs;
};

// The soft two-bin targets of each edge: the left neighbour's bin index (clamped to
// [0, reg_max - 0.1]) and the right and left weights.
struct EdgeTargets {
  torch::Tensor index, weight_right, weight_left;
};

EdgeTargets edge_targets(const torch::Tensor& refs, const torch::Tensor& gt_xyxy, int reg_max,
                         const torch::Tensor& reg_scale, const torch::Tensor& up) {
  const auto rs = reg_scale.abs();
  const auto rx = refs.select(-1, 0), ry = refs.select(-1, 1), rw = refs.select(-1, 2), rh = refs.select(-1, 3);
  const auto left = (rx - gt_xyxy.select(-1, 0)) / (rw / rs + 1e-16) - 0.5 * rs;
  const auto top = (ry - gt_xyxy.select(-1, 1)) / (rh / rs + 1e-16) - 0.5 * rs;
  const auto right = (gt_xyxy.select(-1, 2) - rx) / (rw / rs + 1e-16) - 0.5 * rs;
  const auto bottom = (gt_xyxy.select(-1, 3) - ry) / (rh / rs + 1e-16) - 0.5 * rs;
  const auto gt = torch::stack({left, top, right, bottom}, -1).reshape({-1});
  const auto values = rt::weighting_function(reg_max, up, reg_scale);
  const auto below = (values.unsqueeze(0) - gt.unsqueeze(1)) <= 0;
  auto index = (below.sum(1) - 1).to(torch::kFloat);
  auto wr = torch::zeros_like(index), wl = torch::zeros_like(index);
  const auto valid = (index >= 0) & (index < reg_max);
  if (valid.any().item<bool>()) {
    const auto vi = index.index({valid}).to(torch::kLong);
    const auto g = gt.index({valid});
    const auto ld = (g - values.index_select(0, vi)).abs();
    const auto rd = (values.index_select(0, vi + 1) - g).abs();
    const auto r = ld / (ld + rd);
    wr.index_put_({valid}, r);
    wl.index_put_({valid}, 1.0 - r);
  }
  const auto neg = index < 0;
  wr.index_put_({neg}, 0.0);
  wl.index_put_({neg}, 1.0);
  index.index_put_({neg}, 0.0);
  const auto pos = index >= reg_max;
  wr.index_put_({pos}, 1.0);
  wl.index_put_({pos}, 0.0);
  index.index_put_({pos}, static_cast<double>(reg_max) - 0.1);
  return {index.clamp(0.0, static_cast<double>(reg_max) - 0.1).detach(), wr.detach(), wl.detach()};
}

}  // namespace

torch::Tensor DfineLossTerms::value(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return values[i];
  throw std::out_of_range("D-FINE loss has no term '" + name + "'");
}

std::vector<rt::ImageMatch> union_matches(const std::vector<std::vector<rt::ImageMatch>>& levels) {
  if (levels.empty()) return {};
  const size_t batch = levels.front().size();
  std::vector<rt::ImageMatch> out;
  for (size_t b = 0; b < batch; ++b) {
    std::map<std::pair<int64_t, int64_t>, int64_t> count;  // ordered by (query, GT)
    for (const auto& level : levels) {
      const auto q = level[b].query.to(torch::kCPU, torch::kLong).contiguous();
      const auto g = level[b].gt.to(torch::kCPU, torch::kLong).contiguous();
      for (int64_t i = 0; i < q.numel(); ++i) ++count[{q.data_ptr<int64_t>()[i], g.data_ptr<int64_t>()[i]}];
    }
    std::vector<std::pair<std::pair<int64_t, int64_t>, int64_t>> pairs(count.begin(), count.end());
    std::stable_sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& c) { return a.second > c.second; });
    std::vector<int64_t> rows, cols;
    std::map<int64_t, bool> seen;
    for (const auto& [pair, n] : pairs) {
      (void)n;
      if (seen.count(pair.first)) continue;
      seen[pair.first] = true;
      rows.push_back(pair.first);
      cols.push_back(pair.second);
    }
    out.push_back({torch::tensor(rows, torch::kLong), torch::tensor(cols, torch::kLong)});
  }
  return out;
}

DfineLossWeights deim_loss_weights() {
  DfineLossWeights w;
  w.mal = true;
  w.vfl_gamma = 1.5;
  return w;
}

DfineLoss::DfineLoss(int nc, DfineLossWeights weights)
    : nc_(nc), w_(weights), names_({w_.mal ? "mal" : "vfl", "bbox", "giou", "fgl", "ddf"}) {
  if (nc < 1) throw UsageError("DfineLoss: number of classes must be >= 1, got " + std::to_string(nc));
}

DfineLossTerms DfineLoss::terms(const rt::DfineTrainOutputs& out, const std::vector<rt::ImageTargets>& gts) const {
  const auto& m = out.matching;
  const int64_t batch = m.logits.back().size(0);
  if (static_cast<int64_t>(gts.size()) != batch)
    throw UsageError("D-FINE loss: " + std::to_string(gts.size()) + " target lists for a batch of " +
                     std::to_string(batch));
  if (m.logits.back().size(-1) != nc_)
    throw UsageError("D-FINE loss: logits of " + std::to_string(m.logits.back().size(-1)) +
                     " classes, the loss has " + std::to_string(nc_));
  const auto device = m.logits.back().device();
  const int reg_max = static_cast<int>(m.corners.back().size(-1) / 4 - 1);
  const auto up = out.up.detach().to(device, torch::kFloat), reg_scale = out.reg_scale.detach().to(device, torch::kFloat);
  const size_t layers = m.logits.size();
  const auto f32 = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat) : t; };
  const auto level_of = [&](const rt::DfineDecoderOutputs& o, size_t l) {
    return Level{f32(o.logits[l]), f32(o.boxes[l]), f32(o.corners[l]), f32(o.refs[l])};
  };

  DfineLossTerms t;
  int64_t count = 0;
  for (const auto& g : gts) count += g.size();
  const auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
  t.num_boxes = loss_normalizer(torch::tensor(static_cast<float>(count), opts));

  // Matching: the last layer, layers 0..L-2, pre, the encoder.
  std::vector<Level> matched = {level_of(m, layers - 1)};
  for (size_t l = 0; l + 1 < layers; ++l) matched.push_back(level_of(m, l));
  matched.push_back({f32(m.pre_logits), f32(m.pre_boxes), {}, {}});
  matched.push_back({f32(out.enc_topk_logits), f32(out.enc_topk_boxes), {}, {}});
  std::vector<rt::OutputLevel> levels;
  for (const auto& lv : matched) levels.push_back({lv.logits, lv.boxes});
  t.matches = rt::hungarian_match_levels(levels, std::vector<const std::vector<rt::ImageTargets>*>(levels.size(), &gts),
                                         w_.matcher);
  t.go = union_matches(t.matches);
  int64_t go_count = 0;
  for (const auto& g : t.go) go_count += g.size();
  t.num_go = loss_normalizer(torch::tensor(static_cast<float>(go_count), opts));

  // The class term's name: loss_vfl, or loss_mal.
  const std::string cls_name = "loss_" + names_[0];
  auto add = [&](const std::string& name, const torch::Tensor& v) {
    t.names.push_back(name);
    t.values.push_back(torch::nan_to_num(v, 0.0));
  };

  const auto cls_term = [&](const Level& lv, const Pairs& p, const torch::Tensor& nb) {
    const auto& logits = lv.logits;
    const int64_t b = logits.size(0), n = logits.size(1);
    auto cls = torch::full({b, n}, static_cast<int64_t>(nc_), torch::TensorOptions().dtype(torch::kLong).device(device));
    auto score = torch::zeros({b, n}, logits.options());
    if (p.size() > 0) {
      const auto iou = iou_giou(to_xyxy(lv.boxes.index({p.img, p.qry})), to_xyxy(p.boxes)).first.detach();
      cls.index_put_({p.img, p.qry}, p.labels);
      score.index_put_({p.img, p.qry}, iou);
    }
    const auto onehot = F::one_hot(cls, nc_ + 1).narrow(-1, 0, nc_).to(logits.scalar_type());
    const auto prob = torch::sigmoid(logits).detach();
    // Varifocal: the IoU as the target, negatives weighted by alpha p^gamma, positives by the
    // IoU. Matchability-aware: IoU^gamma as the target, negatives by p^gamma, positives by 1.
    const auto target = (w_.mal ? score.pow(w_.vfl_gamma) : score).unsqueeze(-1) * onehot;
    const auto weight = w_.mal ? prob.pow(w_.vfl_gamma) * (1 - onehot) + onehot
                               : w_.vfl_alpha * prob.pow(w_.vfl_gamma) * (1 - onehot) + target;
    const auto bce = F::binary_cross_entropy_with_logits(
        logits, target, F::BinaryCrossEntropyWithLogitsFuncOptions().weight(weight).reduction(torch::kNone));
    return bce.mean(1).sum() * static_cast<double>(n) / nb * w_.vfl;
  };
  const auto boxes = [&](const Level& lv, const Pairs& p, const torch::Tensor& nb) -> std::pair<torch::Tensor, torch::Tensor> {
    if (p.size() == 0) return {lv.boxes.sum() * 0, lv.boxes.sum() * 0};
    const auto src = lv.boxes.index({p.img, p.qry});
    const auto giou = iou_giou(to_xyxy(src), to_xyxy(p.boxes)).second;
    return {(src - p.boxes).abs().sum() / nb * w_.bbox, (1 - giou).sum() / nb * w_.giou};
  };
  const auto fgl = [&](const Level& lv, const Pairs& p, const torch::Tensor& nb) {
    if (p.size() == 0) return lv.corners.sum() * 0;
    const auto refs = lv.refs.index({p.img, p.qry}).detach();
    const auto e = edge_targets(refs, to_xyxy(p.boxes), reg_max, reg_scale, up);
    const auto pred = lv.corners.index({p.img, p.qry}).reshape({-1, reg_max + 1});
    const auto iou = iou_giou(to_xyxy(lv.boxes.index({p.img, p.qry})), to_xyxy(p.boxes)).first;
    const auto weight = iou.unsqueeze(-1).expand({-1, 4}).reshape({-1}).detach();
    const auto left = e.index.to(torch::kLong);
    const auto ce = [&](const torch::Tensor& target) {
      return F::cross_entropy(pred, target, F::CrossEntropyFuncOptions().reduction(torch::kNone));
    };
    const auto loss = (ce(left) * e.weight_left + ce(left + 1) * e.weight_right) * weight;
    return loss.sum() / nb * w_.fgl;
  };
  // The mixing counts of the distillation term, set by the first matching level that computes it.
  torch::Tensor num_pos, num_neg;
  const auto ddf = [&](const Level& lv, const Level& teacher, const Pairs& p, bool is_dn) {
    const auto pred = lv.corners.reshape({-1, reg_max + 1});
    const auto target = teacher.corners.reshape({-1, reg_max + 1});
    if (torch::equal(pred, target)) return pred.sum() * 0;
    auto wloc = std::get<0>(torch::sigmoid(teacher.logits).max(-1));
    auto mask = torch::zeros_like(wloc, torch::kBool);
    if (p.size() > 0) {
      mask.index_put_({p.img, p.qry}, true);
      const auto iou = iou_giou(to_xyxy(lv.boxes.index({p.img, p.qry})), to_xyxy(p.boxes)).first;
      wloc = wloc.index_put({p.img, p.qry}, iou.to(wloc.scalar_type()));
    }
    const auto edges = [](const torch::Tensor& x) { return x.unsqueeze(-1).expand({-1, -1, 4}).reshape({-1}); };
    const auto w = edges(wloc).detach();
    const auto m4 = edges(mask);
    const double temp = w_.ddf_temperature;
    const auto kl = torch::kl_div(torch::log_softmax(pred / temp, 1), torch::softmax(target.detach() / temp, 1),
                                  at::Reduction::None);
    const auto loss = w * (temp * temp) * kl.sum(-1);
    if (!is_dn || !num_pos.defined()) {  // a denoising level reuses the matching levels' counts
      const double scale = 8.0 / static_cast<double>(lv.boxes.size(0));
      num_pos = (m4.sum() * scale).pow(0.5);
      num_neg = ((~m4).sum() * scale).pow(0.5);
    }
    const auto pos = m4.any().item<bool>() ? loss.index({m4}).mean() : torch::zeros({}, loss.options());
    const auto neg = (~m4).any().item<bool>() ? loss.index({~m4}).mean() : torch::zeros({}, loss.options());
    return (pos * num_pos + neg * num_neg) / (num_pos + num_neg) * w_.ddf;
  };

  const auto go = gather_pairs(t.go, gts, device);
  const Level& last = matched[0];
  // The last layer: no distillation (it is the teacher).
  {
    const auto own = gather_pairs(t.matches[0], gts, device);
    add(cls_name, cls_term(last, own, t.num_boxes));
    const auto [l1, gi] = boxes(last, go, t.num_go);
    add("loss_bbox", l1);
    add("loss_giou", gi);
    add("loss_fgl", fgl(last, go, t.num_go));
  }
  for (size_t l = 0; l + 1 < layers; ++l) {
    const Level& lv = matched[1 + l];
    const auto own = gather_pairs(t.matches[1 + l], gts, device);
    const std::string s = "_aux_" + std::to_string(l);
    add(cls_name + s, cls_term(lv, own, t.num_boxes));
    const auto [l1, gi] = boxes(lv, go, t.num_go);
    add("loss_bbox" + s, l1);
    add("loss_giou" + s, gi);
    add("loss_fgl" + s, fgl(lv, go, t.num_go));
    add("loss_ddf" + s, ddf(lv, last, go, false));
  }
  for (const auto& [index, suffix] : {std::pair<size_t, const char*>{layers, "_pre"}, {layers + 1, "_enc_0"}}) {
    const auto own = gather_pairs(t.matches[index], gts, device);
    add(cls_name + suffix, cls_term(matched[index], own, t.num_boxes));
    const auto [l1, gi] = boxes(matched[index], go, t.num_go);
    add(std::string("loss_bbox") + suffix, l1);
    add(std::string("loss_giou") + suffix, gi);
  }

  if (!out.dn.logits.empty()) {
    const auto pairs = out.dn_pairs.to(torch::kCPU, torch::kLong);
    if (pairs.dim() != 2 || pairs.size(1) != 3) throw UsageError("D-FINE loss: denoising pairs must be [P, 3]");
    for (int64_t b = 0; b < batch; ++b) {
      const auto rows = pairs.index({pairs.select(1, 0) == b});
      t.dn_matches.push_back({rows.select(1, 1).contiguous(), rows.select(1, 2).contiguous()});
    }
    const auto nb = out.dn_groups > 0 ? t.num_boxes * static_cast<double>(out.dn_groups) : torch::ones({}, opts);
    const auto dp = gather_pairs(t.dn_matches, gts, device);
    const Level dn_last = level_of(out.dn, layers - 1);
    for (size_t l = 0; l < layers; ++l) {
      const Level lv = level_of(out.dn, l);
      const std::string s = "_dn_" + std::to_string(l);
      add(cls_name + s, cls_term(lv, dp, nb));
      const auto [l1, gi] = boxes(lv, dp, nb);
      add("loss_bbox" + s, l1);
      add("loss_giou" + s, gi);
      add("loss_fgl" + s, fgl(lv, dp, nb));
      add("loss_ddf" + s, ddf(lv, dn_last, dp, true));
    }
    const Level pre{f32(out.dn.pre_logits), f32(out.dn.pre_boxes), {}, {}};
    add(cls_name + "_dn_pre", cls_term(pre, dp, nb));
    const auto [l1, gi] = boxes(pre, dp, nb);
    add("loss_bbox_dn_pre", l1);
    add("loss_giou_dn_pre", gi);
  }
  t.total = t.values[0];
  for (size_t i = 1; i < t.values.size(); ++i) t.total = t.total + t.values[i];
  return t;
}

LossOutput DfineLoss::compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                              int64_t img_w) {
  (void)img_h;
  (void)img_w;
  const auto out = rt::unpack_dfine_outputs(raw);
  const auto gts = rt::split_targets(targets);
  const auto t = terms(out, gts);
  std::vector<std::string> kinds;
  for (const auto& n : names_) kinds.push_back("loss_" + n);
  std::vector<torch::Tensor> sums(kinds.size());
  for (size_t i = 0; i < t.values.size(); ++i)
    for (size_t k = 0; k < kinds.size(); ++k)
      if (t.names[i].rfind(kinds[k], 0) == 0) {
        const auto v = t.values[i].detach();
        sums[k] = sums[k].defined() ? sums[k] + v : v;
      }
  for (auto& s : sums)
    if (!s.defined()) s = torch::zeros({}, t.total.options());
  int64_t matched = 0;
  for (const auto& m : t.matches.front()) matched += m.size();
  LossOutput o;
  o.total = t.total;
  o.terms = torch::stack(sums);
  o.num_fg = torch::tensor(static_cast<double>(matched) / static_cast<double>(gts.size()),
                           torch::TensorOptions().dtype(torch::kFloat).device(t.total.device()));
  o.names = &term_names();
  return o;
}

}  // namespace libreyolo::loss
