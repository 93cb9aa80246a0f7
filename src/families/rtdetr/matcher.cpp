#include "families/rtdetr/matcher.hpp"

#include <algorithm>

#include "families/rtdetr/assignment.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::models::rtdetr {

namespace {
// A host tensor on `device`: from pinned memory without waiting on a GPU.
torch::Tensor upload(torch::Tensor host, const torch::Device& device) {
  if (device.is_cuda()) host = host.pin_memory();
  return host.to(device, /*non_blocking=*/true);
}
}  // namespace

int64_t TargetRows::first_row(size_t image) const {
  if (pad > 0) return static_cast<int64_t>(image) * pad;
  int64_t first = 0;
  for (size_t i = 0; i < image; ++i) first += counts[i];
  return first;
}

TargetRows concatenate_targets(const std::vector<ImageTargets>& gts, const torch::Device& device, int64_t pad) {
  TargetRows t;
  t.pad = std::max<int64_t>(pad, 0);
  std::vector<torch::Tensor> labels, boxes;
  for (const auto& g : gts) {
    if (t.pad > 0 && g.size() > t.pad)
      throw UsageError("matcher: an image with " + std::to_string(g.size()) + " boxes in rows padded to " +
                       std::to_string(t.pad));
    labels.push_back(g.labels.to(torch::kLong));
    boxes.push_back(g.boxes.to(torch::kFloat));
    t.counts.push_back(g.size());
    if (t.pad > 0 && g.size() < t.pad) {
      labels.push_back(torch::zeros({t.pad - g.size()}, labels.back().options()));
      boxes.push_back(torch::full({t.pad - g.size(), 4}, 0.5f, boxes.back().options()));
    }
  }
  if (!gts.empty()) {
    t.labels = torch::cat(labels).to(device);
    t.boxes = torch::cat(boxes).to(device);
  }
  return t;
}

StackedPairs stacked_pairs(const std::vector<const std::vector<ImageMatch>*>& matches, const TargetRows& gts,
                           const torch::Device& device, int64_t queries, int64_t pad) {
  const auto nl = static_cast<int64_t>(matches.size());
  const auto b = static_cast<int64_t>(gts.counts.size());
  pad = std::max<int64_t>(pad, 0);
  const bool padded = pad > 0;
  std::vector<int64_t> rows, scatter;
  std::vector<int64_t> keep;
  StackedPairs p;
  p.per_level = -1;
  for (int64_t l = 0; l < nl; ++l) {
    const auto& ms = *matches[static_cast<size_t>(l)];
    if (static_cast<int64_t>(ms.size()) != b) throw UsageError("matcher: matches for another batch size");
    int64_t count = 0;
    for (int64_t i = 0; i < b; ++i) {
      const auto& m = ms[static_cast<size_t>(i)];
      const auto q = m.query.to(torch::kCPU, torch::kLong).contiguous();
      const auto g = m.gt.to(torch::kCPU, torch::kLong).contiguous();
      const int64_t first_gt = gts.first_row(static_cast<size_t>(i));
      if (padded && m.size() > pad)
        throw UsageError("matcher: an image with " + std::to_string(m.size()) + " pairs, padded to " +
                         std::to_string(pad));
      for (int64_t k = 0; k < m.size(); ++k) {
        rows.insert(rows.end(), {l * b + i, q.data_ptr<int64_t>()[k], first_gt + g.data_ptr<int64_t>()[k]});
        scatter.push_back(q.data_ptr<int64_t>()[k]);
        keep.push_back(1);
      }
      for (int64_t k = padded ? m.size() : pad; k < pad; ++k) {
        rows.insert(rows.end(), {l * b + i, 0, first_gt});
        scatter.push_back(queries);
        keep.push_back(0);
      }
      count += padded ? pad : m.size();
    }
    if (p.per_level >= 0 && count != p.per_level)
      throw UsageError("matcher: levels scored together have unequal match counts");
    p.per_level = count;
  }
  p.per_level = std::max<int64_t>(p.per_level, 0);
  const auto n = static_cast<int64_t>(scatter.size());
  // One upload: the three index rows, then (padded) the scatter queries and the keep flags.
  std::vector<int64_t> all(rows.size() + (padded ? 2 * scatter.size() : 0));
  for (int64_t k = 0; k < n; ++k)
    for (int64_t r = 0; r < 3; ++r) all[static_cast<size_t>(r * n + k)] = rows[static_cast<size_t>(3 * k + r)];
  if (padded)
    for (int64_t k = 0; k < n; ++k) {
      all[static_cast<size_t>(3 * n + k)] = scatter[static_cast<size_t>(k)];
      all[static_cast<size_t>(4 * n + k)] = keep[static_cast<size_t>(k)];
    }
  const auto device_all =
      upload(torch::from_blob(all.data(), {padded ? 5 : 3, n}, torch::kLong).clone(), device);
  p.index = device_all.narrow(0, 0, 3);
  if (padded) {
    p.scatter = device_all[3];
    p.keep = device_all[4].to(torch::kBool);
  }
  return p;
}

PairTargets gather_pairs(const StackedPairs& pairs, int64_t levels, const TargetRows& gts) {
  PairTargets p;
  p.levels = levels;
  p.per_level = pairs.per_level;
  p.row = pairs.index[0];
  p.qry = pairs.index[1];
  p.labels = gts.labels.index_select(0, pairs.index[2]);
  p.boxes = gts.boxes.index_select(0, pairs.index[2]);
  p.scatter = pairs.scatter;
  p.keep = pairs.keep;
  return p;
}

torch::Tensor real_only(const torch::Tensor& v, const PairTargets& p, int64_t per) {
  if (!p.padded()) return v;
  const auto keep = per == 1 ? p.keep : p.keep.unsqueeze(-1).expand({-1, per}).reshape({-1});
  return torch::where(v.dim() > keep.dim() ? keep.unsqueeze(-1) : keep, v, torch::zeros_like(v));
}

torch::Tensor put_at_pairs(const torch::Tensor& values, const PairTargets& p, const torch::Tensor& v) {
  if (!p.padded()) return values.index_put({p.row, p.qry}, v);
  const auto wide = torch::cat({values, torch::zeros({values.size(0), 1}, values.options())}, 1);
  return wide.index_put({p.row, p.scatter}, v).narrow(1, 0, values.size(1));
}

std::vector<ImageMatch> denoising_matches(const torch::Tensor& pairs_in, int64_t batch) {
  const auto pairs = pairs_in.to(torch::kCPU, torch::kLong).contiguous();
  if (pairs.dim() != 2 || pairs.size(1) != 3) throw UsageError("denoising pairs must be [P, 3]");
  std::vector<std::vector<int64_t>> query(static_cast<size_t>(batch)), gt(static_cast<size_t>(batch));
  const auto* row = pairs.data_ptr<int64_t>();
  for (int64_t k = 0; k < pairs.size(0); ++k, row += 3) {
    if (row[0] < 0 || row[0] >= batch) throw UsageError("a denoising pair of an image outside the batch");
    query[static_cast<size_t>(row[0])].push_back(row[1]);
    gt[static_cast<size_t>(row[0])].push_back(row[2]);
  }
  std::vector<ImageMatch> out;
  for (int64_t b = 0; b < batch; ++b)
    out.push_back({torch::tensor(query[static_cast<size_t>(b)], torch::kLong),
                   torch::tensor(gt[static_cast<size_t>(b)], torch::kLong)});
  return out;
}

torch::Tensor matching_costs(const torch::Tensor& logits, const torch::Tensor& boxes,
                             const std::vector<ImageTargets>& gts, const MatcherWeights& w) {
  if (logits.dim() != 4 || boxes.dim() != 4 || boxes.size(3) != 4 || logits.sizes().slice(0, 3) != boxes.sizes().slice(0, 3))
    throw UsageError("matcher: logits [L, B, Q, nc] and boxes [L, B, Q, 4] of levels of one shape");
  if (static_cast<int64_t>(gts.size()) != logits.size(1))
    throw UsageError("matcher: " + std::to_string(gts.size()) + " target lists for a batch of " +
                     std::to_string(logits.size(1)));
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> labels, gt_boxes;
  for (const auto& g : gts) {
    labels.push_back(g.labels);
    gt_boxes.push_back(g.boxes);
  }
  const auto device = logits.device();
  const auto ids = torch::cat(labels).to(device);
  if (ids.numel() == 0) return {};
  const auto tgt = torch::cat(gt_boxes).to(device, torch::kFloat);
  const auto p = torch::sigmoid(logits.detach().to(torch::kFloat).flatten(0, 2)).index_select(1, ids);  // [LBQ, S]
  const auto out = boxes.detach().to(torch::kFloat).flatten(0, 2);                                      // [LBQ, 4]
  const auto neg = (1 - w.alpha) * p.pow(w.gamma) * (-(1 - p + 1e-8).log());
  const auto pos = w.alpha * (1 - p).pow(w.gamma) * (-(p + 1e-8).log());
  const auto cost_class = pos - neg;
  const auto cost_bbox = (out.unsqueeze(1) - tgt.unsqueeze(0)).abs().sum(-1);
  const auto cost_giou = -box_overlap(cxcywh_to_xyxy(out).unsqueeze(1), cxcywh_to_xyxy(tgt).unsqueeze(0)).giou;
  const auto c = w.bbox * cost_bbox + w.cls * cost_class + w.giou * cost_giou;
  return c.view({logits.size(0), logits.size(1), logits.size(2), -1});
}

torch::Tensor matching_cost(const torch::Tensor& logits, const torch::Tensor& boxes,
                            const std::vector<ImageTargets>& gts, const MatcherWeights& w) {
  if (logits.dim() != 3 || boxes.dim() != 3 || boxes.size(2) != 4 || logits.size(0) != boxes.size(0) ||
      logits.size(1) != boxes.size(1))
    throw UsageError("matcher: logits [B, Q, nc] and boxes [B, Q, 4] of one level");
  const auto c = matching_costs(logits.unsqueeze(0), boxes.unsqueeze(0), gts, w);
  return c.defined() ? c[0] : c;
}

std::vector<ImageMatch> solve_matches(const torch::Tensor& cost, const std::vector<ImageTargets>& gts) {
  std::vector<ImageMatch> out;
  const auto none = torch::zeros({0}, torch::kLong);
  if (!cost.defined()) {
    for (size_t i = 0; i < gts.size(); ++i) out.push_back({none, none});
    return out;
  }
  const auto host = cost.detach().to(torch::kCPU);
  int64_t start = 0;
  for (size_t i = 0; i < gts.size(); ++i) {
    const int64_t n = gts[i].size();
    const auto a = linear_sum_assignment(host[static_cast<int64_t>(i)].narrow(1, start, n));
    start += n;
    out.push_back({torch::tensor(a.rows, torch::kLong), torch::tensor(a.cols, torch::kLong)});
  }
  if (start != host.size(2)) throw UsageError("matcher: the cost's columns do not match the targets");
  return out;
}

std::vector<ImageMatch> hungarian_match(const torch::Tensor& logits, const torch::Tensor& boxes,
                                        const std::vector<ImageTargets>& gts, const MatcherWeights& w) {
  return solve_matches(matching_cost(logits, boxes, gts, w), gts);
}

std::vector<std::vector<ImageMatch>> hungarian_match_levels(const std::vector<OutputLevel>& levels,
                                                            const std::vector<const std::vector<ImageTargets>*>& gts,
                                                            const MatcherWeights& w) {
  if (gts.size() != levels.size())
    throw UsageError("matcher: " + std::to_string(gts.size()) + " target sets for " + std::to_string(levels.size()) +
                     " levels");
  // Consecutive levels of one shape matched against one target set: their costs in one computation.
  std::vector<torch::Tensor> costs, flat;
  for (size_t l = 0; l < levels.size();) {
    size_t e = l + 1;
    while (e < levels.size() && gts[e] == gts[l] && levels[e].logits.sizes() == levels[l].logits.sizes() &&
           levels[e].boxes.sizes() == levels[l].boxes.sizes())
      ++e;
    std::vector<torch::Tensor> lg, bx;
    for (size_t k = l; k < e; ++k) {
      lg.push_back(levels[k].logits.detach());
      bx.push_back(levels[k].boxes.detach());
    }
    const auto c = matching_costs(torch::stack(lg), torch::stack(bx), *gts[l], w);
    for (size_t k = l; k < e; ++k) {
      costs.push_back(c.defined() ? c[static_cast<int64_t>(k - l)] : c);
      if (c.defined()) flat.push_back(costs.back().reshape({-1}));
    }
    l = e;
  }
  // One copy of every level's cost, then each level's block as a view of it.
  torch::Tensor host;
  if (!flat.empty()) host = (flat.size() == 1 ? flat[0] : torch::cat(flat)).to(torch::kCPU);
  std::vector<std::vector<ImageMatch>> out;
  int64_t at = 0;
  for (size_t l = 0; l < levels.size(); ++l) {
    torch::Tensor cost;
    if (costs[l].defined()) {
      cost = host.narrow(0, at, costs[l].numel()).view(costs[l].sizes());
      at += costs[l].numel();
    }
    out.push_back(solve_matches(cost, *gts[l]));
  }
  return out;
}

}  // namespace libreyolo::models::rtdetr
