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

// One level's logits, boxes and (where it has them) corners and references, in float32; or
// several levels of one shape stacked, level l's image i at row l B + i.
struct Level {
  torch::Tensor logits, boxes, corners, refs;
};

Level stack(const std::vector<Level>& levels) {
  const auto cat = [&](torch::Tensor Level::*field) {
    std::vector<torch::Tensor> parts;
    for (const auto& lv : levels) {
      if (!(lv.*field).defined()) return torch::Tensor();  // a level without it (pre, encoder)
      parts.push_back(lv.*field);
    }
    return parts.size() == 1 ? parts[0] : torch::cat(parts);
  };
  return {cat(&Level::logits), cat(&Level::boxes), cat(&Level::corners), cat(&Level::refs)};
}

using rt::gather_pairs;
using rt::PairTargets;
using rt::put_at_pairs;
using rt::real_only;

// The soft two-bin targets of each edge: the left neighbour's bin index (clamped to
// [0, reg_max - 0.1]) and the right and left weights. Without host synchronisation: every edge is
// computed and the out-of-range ones replaced.
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
  const auto index = (below.sum(1) - 1).to(torch::kFloat);
  const auto valid = (index >= 0) & (index < reg_max);
  const auto vi = index.clamp(0.0, static_cast<double>(reg_max) - 1.0).to(torch::kLong);
  const auto ld = (gt - values.index_select(0, vi)).abs();
  const auto rd = (values.index_select(0, vi + 1) - gt).abs();
  const auto r = ld / (ld + rd);
  const auto neg = index < 0, pos = index >= reg_max;
  const auto zero = torch::zeros_like(index), one = torch::ones_like(index);
  const auto wr = torch::where(neg, zero, torch::where(pos, one, torch::where(valid, r, zero)));
  const auto wl = torch::where(neg, one, torch::where(pos, zero, torch::where(valid, 1.0 - r, zero)));
  const auto idx = torch::where(neg, zero, torch::where(pos, torch::full_like(index, reg_max - 0.1), index));
  return {idx.clamp(0.0, static_cast<double>(reg_max) - 0.1).detach(), wr.detach(), wl.detach()};
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

namespace {
std::vector<const std::vector<rt::ImageMatch>*> repeated(const std::vector<rt::ImageMatch>& m, size_t n) {
  return std::vector<const std::vector<rt::ImageMatch>*>(n, &m);
}
int64_t most_pairs(const std::vector<rt::ImageMatch>& m) {
  int64_t n = 0;
  for (const auto& i : m) n = std::max(n, i.size());
  return n;
}
}  // namespace

std::vector<torch::Tensor> DfinePlan::tensors() const {
  std::vector<torch::Tensor> out = {rows.labels, rows.boxes, num_boxes, num_go, num_fg};
  if (num_boxes_dn.defined()) out.push_back(num_boxes_dn);
  for (const auto* sp : {&own, &go_all, &go_layers, &go_students, &dn_all, &dn_layers, &dn_students}) {
    if (!sp->index.defined()) continue;
    out.push_back(sp->index);
    if (sp->keep.defined()) out.insert(out.end(), {sp->scatter, sp->keep});
  }
  return out;
}

DfinePlan DfineLoss::plan(const rt::DfineTrainOutputs& out, const std::vector<rt::ImageTargets>& gts, int64_t pad) const {
  const auto& m = out.matching;
  const int64_t batch = m.logits.back().size(0);
  if (static_cast<int64_t>(gts.size()) != batch)
    throw UsageError("D-FINE loss: " + std::to_string(gts.size()) + " target lists for a batch of " +
                     std::to_string(batch));
  if (m.logits.back().size(-1) != nc_)
    throw UsageError("D-FINE loss: logits of " + std::to_string(m.logits.back().size(-1)) +
                     " classes, the loss has " + std::to_string(nc_));
  const auto device = m.logits.back().device();
  const size_t layers = m.logits.size();
  const auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
  DfinePlan p;
  int64_t count = 0;
  for (const auto& g : gts) count += g.size();
  p.num_boxes = loss_normalizer(torch::tensor(static_cast<float>(count), opts));

  // Matching: the last layer, layers 0..L-2, pre, the encoder.
  std::vector<rt::OutputLevel> levels = {{m.logits[layers - 1], m.boxes[layers - 1]}};
  for (size_t l = 0; l + 1 < layers; ++l) levels.push_back({m.logits[l], m.boxes[l]});
  levels.push_back({m.pre_logits, m.pre_boxes});
  levels.push_back({out.enc_topk_logits, out.enc_topk_boxes});
  const size_t nm = levels.size();
  p.matches = rt::hungarian_match_levels(levels, std::vector<const std::vector<rt::ImageTargets>*>(nm, &gts), w_.matcher);
  p.go = union_matches(p.matches);
  int64_t go_count = 0;
  for (const auto& g : p.go) go_count += g.size();
  p.num_go = loss_normalizer(torch::tensor(static_cast<float>(go_count), opts));

  // Padded: room for every image's boxes, its union pairs (at most one per query, and per box
  // one per matched level) and its denoising positives (half the denoising queries at most).
  const int64_t queries = m.logits.back().size(1);
  int64_t room = 0, go_room = 0;
  if (pad > 0) {
    room = pad;
    for (const auto& g : gts) room = std::max(room, g.size());
    go_room = std::max(std::min(queries, static_cast<int64_t>(nm) * room), most_pairs(p.go));
  }
  p.rows = rt::concatenate_targets(gts, device, room);
  std::vector<const std::vector<rt::ImageMatch>*> own;
  for (const auto& mm : p.matches) own.push_back(&mm);
  p.own = rt::stacked_pairs(own, p.rows, device, queries, room);
  p.go_all = rt::stacked_pairs(repeated(p.go, nm), p.rows, device, queries, go_room);
  p.go_layers = rt::stacked_pairs(repeated(p.go, layers), p.rows, device, queries, go_room);
  if (layers > 1) p.go_students = rt::stacked_pairs(repeated(p.go, layers - 1), p.rows, device, queries, go_room);

  if (!out.dn.logits.empty()) {
    p.dn_matches = rt::denoising_matches(out.dn_pairs, batch);
    const int64_t dn_queries = out.dn.logits.front().size(1);
    const int64_t dn_room = pad > 0 ? std::max({room, dn_queries / 2, most_pairs(p.dn_matches)}) : 0;
    p.num_boxes_dn = out.dn_groups > 0 ? p.num_boxes * static_cast<double>(out.dn_groups) : torch::ones({}, opts);
    // [layers 0..L-1, pre]; the last layer is the distillation's teacher.
    p.dn_all = rt::stacked_pairs(repeated(p.dn_matches, layers + 1), p.rows, device, dn_queries, dn_room);
    p.dn_layers = rt::stacked_pairs(repeated(p.dn_matches, layers), p.rows, device, dn_queries, dn_room);
    if (layers > 1)
      p.dn_students = rt::stacked_pairs(repeated(p.dn_matches, layers - 1), p.rows, device, dn_queries, dn_room);
  }
  int64_t matched = 0;
  for (const auto& mm : p.matches.front()) matched += mm.size();
  p.num_fg = torch::tensor(static_cast<float>(static_cast<double>(matched) / static_cast<double>(batch)), opts);
  return p;
}

DfineLossTerms DfineLoss::terms(const rt::DfineTrainOutputs& out, const std::vector<rt::ImageTargets>& gts) const {
  return planned_terms(out, plan(out, gts));
}

DfineLossTerms DfineLoss::planned_terms(const rt::DfineTrainOutputs& out, const DfinePlan& plan) const {
  const auto& m = out.matching;
  const auto device = m.logits.back().device();
  const int reg_max = static_cast<int>(m.corners.back().size(-1) / 4 - 1);
  const auto up = out.up.detach().to(device, torch::kFloat), reg_scale = out.reg_scale.detach().to(device, torch::kFloat);
  const size_t layers = m.logits.size();
  const auto f32 = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat) : t; };
  const auto level_of = [&](const rt::DfineDecoderOutputs& o, size_t l) {
    return Level{f32(o.logits[l]), f32(o.boxes[l]), f32(o.corners[l]), f32(o.refs[l])};
  };

  DfineLossTerms t;
  t.num_boxes = plan.num_boxes;
  t.num_go = plan.num_go;
  t.matches = plan.matches;
  t.go = plan.go;
  t.dn_matches = plan.dn_matches;
  std::vector<Level> matched = {level_of(m, layers - 1)};
  for (size_t l = 0; l + 1 < layers; ++l) matched.push_back(level_of(m, l));
  matched.push_back({f32(m.pre_logits), f32(m.pre_boxes), {}, {}});
  matched.push_back({f32(out.enc_topk_logits), f32(out.enc_topk_boxes), {}, {}});
  if (plan.matches.size() != matched.size()) throw UsageError("D-FINE loss: a plan for other outputs");

  // The class term's name: loss_vfl, or loss_mal.
  const std::string cls_name = "loss_" + names_[0];
  auto add = [&](const std::string& name, const torch::Tensor& v) {
    t.names.push_back(name);
    t.values.push_back(v);
  };
  const rt::TargetRows& rows = plan.rows;
  // Every term below is computed for L stacked levels at once ([L] values, NaN taken as 0).
  const auto per_level = [](const torch::Tensor& v, int64_t nl) { return v.reshape({nl, -1}); };
  const auto finish = [](const torch::Tensor& v) { return torch::nan_to_num(v, 0.0).unbind(); };

  const auto cls_term = [&](const Level& lv, const PairTargets& p, const torch::Tensor& nb) {
    const auto& logits = lv.logits;
    const int64_t rows_n = logits.size(0), n = logits.size(1);
    auto cls = torch::full({rows_n, n}, static_cast<int64_t>(nc_), torch::TensorOptions().dtype(torch::kLong).device(device));
    auto score = torch::zeros({rows_n, n}, logits.options());
    if (!p.empty()) {
      const auto iou = iou_giou(to_xyxy(lv.boxes.index({p.row, p.qry})), to_xyxy(p.boxes)).first.detach();
      cls = put_at_pairs(cls, p, p.labels);
      score = put_at_pairs(score, p, iou);
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
    return finish(per_level(bce, p.levels).sum(1) / nb * w_.vfl);
  };
  const auto boxes = [&](const Level& lv, const PairTargets& p, const torch::Tensor& nb) {
    if (p.empty()) {
      const auto zero = per_level(lv.boxes, p.levels).sum(1) * 0;
      return std::make_pair(finish(zero), finish(zero));
    }
    const auto src = lv.boxes.index({p.row, p.qry});
    const auto giou = iou_giou(to_xyxy(src), to_xyxy(p.boxes)).second;
    return std::make_pair(finish(per_level(real_only((src - p.boxes).abs(), p), p.levels).sum(1) / nb * w_.bbox),
                          finish(per_level(real_only(1 - giou, p), p.levels).sum(1) / nb * w_.giou));
  };
  const auto fgl = [&](const Level& lv, const PairTargets& p, const torch::Tensor& nb) {
    if (p.empty()) return finish(per_level(lv.corners, p.levels).sum(1) * 0);
    const auto refs = lv.refs.index({p.row, p.qry}).detach();
    const auto e = edge_targets(refs, to_xyxy(p.boxes), reg_max, reg_scale, up);
    const auto pred = lv.corners.index({p.row, p.qry}).reshape({-1, reg_max + 1});
    const auto iou = iou_giou(to_xyxy(lv.boxes.index({p.row, p.qry})), to_xyxy(p.boxes)).first;
    const auto weight = iou.unsqueeze(-1).expand({-1, 4}).reshape({-1}).detach();
    const auto left = e.index.to(torch::kLong);
    const auto ce = [&](const torch::Tensor& target) {
      return F::cross_entropy(pred, target, F::CrossEntropyFuncOptions().reduction(torch::kNone));
    };
    const auto loss = real_only((ce(left) * e.weight_left + ce(left + 1) * e.weight_right) * weight, p, 4);
    return finish(per_level(loss, p.levels).sum(1) / nb * w_.fgl);
  };
  // The mixing counts of the distillation term, set by the matching levels (a denoising level
  // reuses theirs).
  torch::Tensor num_pos, num_neg;
  // lv: the stacked students, teacher one level; none of the students is the teacher.
  const auto ddf = [&](const Level& lv, const Level& teacher, const PairTargets& p, bool is_dn) {
    const int64_t nl = p.levels, b = teacher.logits.size(0);
    const auto pred = lv.corners.reshape({-1, reg_max + 1});
    const auto target = teacher.corners.unsqueeze(0).expand({nl, -1, -1, -1}).reshape({-1, reg_max + 1});
    auto wloc = std::get<0>(torch::sigmoid(teacher.logits).max(-1)).repeat({nl, 1});  // [L B, n]
    auto mask = torch::zeros_like(wloc, torch::kBool);
    if (!p.empty()) {
      mask = put_at_pairs(mask, p, torch::ones({}, mask.options()));
      const auto iou = iou_giou(to_xyxy(lv.boxes.index({p.row, p.qry})), to_xyxy(p.boxes)).first;
      wloc = put_at_pairs(wloc, p, iou.to(wloc.scalar_type()));
    }
    const auto edges = [](const torch::Tensor& x) { return x.unsqueeze(-1).expand({-1, -1, 4}).reshape({-1}); };
    const auto w = edges(wloc).detach();
    const auto m4 = per_level(edges(mask), nl).to(torch::kFloat);
    const double temp = w_.ddf_temperature;
    const auto kl = torch::kl_div(torch::log_softmax(pred / temp, 1), torch::softmax(target.detach() / temp, 1),
                                  at::Reduction::None);
    const auto loss = per_level(w * (temp * temp) * kl.sum(-1), nl);
    if (!is_dn || !num_pos.defined()) {
      const double scale = 8.0 / static_cast<double>(b);
      const auto first = m4[0];
      num_pos = (first.sum() * scale).pow(0.5);
      num_neg = ((1 - first).sum() * scale).pow(0.5);
    }
    // The means over the matched and the other edges (0 where there are none).
    const auto pos = (loss * m4).sum(1) / m4.sum(1).clamp_min(1.0);
    const auto neg = (loss * (1 - m4)).sum(1) / (1 - m4).sum(1).clamp_min(1.0);
    return finish((pos * num_pos + neg * num_neg) / (num_pos + num_neg) * w_.ddf);
  };

  // The matching levels: [last, layers 0..L-2, pre, encoder], the first L with corners.
  const auto nm = static_cast<int64_t>(matched.size());
  const auto nl = static_cast<int64_t>(layers);
  const Level all = stack(matched);
  const Level decoder = stack(std::vector<Level>(matched.begin(), matched.begin() + static_cast<std::ptrdiff_t>(layers)));
  const auto cls_v = cls_term(all, gather_pairs(plan.own, nm, rows), plan.num_boxes);
  const auto [l1_v, giou_v] = boxes(all, gather_pairs(plan.go_all, nm, rows), plan.num_go);
  const auto fgl_v = fgl(decoder, gather_pairs(plan.go_layers, nl, rows), plan.num_go);
  std::vector<torch::Tensor> ddf_v;
  if (layers > 1)
    ddf_v = ddf(stack(std::vector<Level>(matched.begin() + 1, matched.begin() + static_cast<std::ptrdiff_t>(layers))),
                matched[0], gather_pairs(plan.go_students, nl - 1, rows), false);
  // The last layer: no distillation (it is the teacher).
  add(cls_name, cls_v[0]);
  add("loss_bbox", l1_v[0]);
  add("loss_giou", giou_v[0]);
  add("loss_fgl", fgl_v[0]);
  for (size_t l = 0; l + 1 < layers; ++l) {
    const std::string s = "_aux_" + std::to_string(l);
    add(cls_name + s, cls_v[1 + l]);
    add("loss_bbox" + s, l1_v[1 + l]);
    add("loss_giou" + s, giou_v[1 + l]);
    add("loss_fgl" + s, fgl_v[1 + l]);
    add("loss_ddf" + s, ddf_v[l]);
  }
  for (const auto& [index, suffix] : {std::pair<size_t, const char*>{layers, "_pre"}, {layers + 1, "_enc_0"}}) {
    add(cls_name + suffix, cls_v[index]);
    add(std::string("loss_bbox") + suffix, l1_v[index]);
    add(std::string("loss_giou") + suffix, giou_v[index]);
  }

  if (!out.dn.logits.empty()) {
    if (!plan.dn_all.index.defined()) throw UsageError("D-FINE loss: a plan for other outputs");
    const auto& nb = plan.num_boxes_dn;
    // [layers 0..L-1, pre]; the last layer is the distillation's teacher.
    std::vector<Level> dn;
    for (size_t l = 0; l < layers; ++l) dn.push_back(level_of(out.dn, l));
    dn.push_back({f32(out.dn.pre_logits), f32(out.dn.pre_boxes), {}, {}});
    const Level dn_all = stack(dn);
    const auto dp_all = gather_pairs(plan.dn_all, nl + 1, rows);
    const auto dcls = cls_term(dn_all, dp_all, nb);
    const auto [dl1, dgiou] = boxes(dn_all, dp_all, nb);
    const auto dfgl = fgl(stack(std::vector<Level>(dn.begin(), dn.begin() + static_cast<std::ptrdiff_t>(layers))),
                          gather_pairs(plan.dn_layers, nl, rows), nb);
    std::vector<torch::Tensor> dddf;
    if (layers > 1)
      dddf = ddf(stack(std::vector<Level>(dn.begin(), dn.begin() + static_cast<std::ptrdiff_t>(layers - 1))),
                 dn[layers - 1], gather_pairs(plan.dn_students, nl - 1, rows), true);
    for (size_t l = 0; l < layers; ++l) {
      const std::string s = "_dn_" + std::to_string(l);
      add(cls_name + s, dcls[l]);
      add("loss_bbox" + s, dl1[l]);
      add("loss_giou" + s, dgiou[l]);
      add("loss_fgl" + s, dfgl[l]);
      add("loss_ddf" + s, l + 1 < layers ? dddf[l] : torch::nan_to_num(dn[l].corners.sum() * 0, 0.0));  // the teacher: 0
    }
    add(cls_name + "_dn_pre", dcls[layers]);
    add("loss_bbox_dn_pre", dl1[layers]);
    add("loss_giou_dn_pre", dgiou[layers]);
  }
  t.total = t.values[0];
  for (size_t i = 1; i < t.values.size(); ++i) t.total = t.total + t.values[i];
  return t;
}

std::unique_ptr<LossPlan> DfineLoss::plan(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets,
                                          int64_t pad) {
  return std::make_unique<DfinePlan>(plan(rt::unpack_dfine_outputs(raw), rt::split_targets(targets), pad));
}

LossOutput DfineLoss::score(const std::vector<torch::Tensor>& raw, const LossPlan& plan) {
  const auto* p = dynamic_cast<const DfinePlan*>(&plan);
  if (!p) throw UsageError("D-FINE loss: a plan of another loss");
  const auto t = planned_terms(rt::unpack_dfine_outputs(raw), *p);
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
  LossOutput o;
  o.total = t.total;
  o.terms = torch::stack(sums);
  o.num_fg = p->num_fg;
  o.names = &term_names();
  return o;
}

LossOutput DfineLoss::compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                              int64_t img_w) {
  (void)img_h;
  (void)img_w;
  return score(raw, *plan(raw, targets, 0));
}

}  // namespace libreyolo::loss
