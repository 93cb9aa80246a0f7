// Loads an RT-DETR(v2) parity fixture made with LibreYOLO 1.6.0 (the narrow RT-DETR one,
// rtdetr_r18narrow_nc80_s320 in LIBREYOLO_FIXTURES, or RT-DETRv2's in tests/data): the
// checkpoint's weights strictly into a network built from their shapes (eval mode, CPU, float32)
// and the dict of expected tensors; and the checks the parity tests of both share (loss terms,
// gradients, the recorded denoising draws).
#pragma once
#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <algorithm>
#include <cmath>
#include <map>

#include "families/rtdetr/boxes.hpp"
#include "families/rtdetr/loss.hpp"
#include "families/rtdetr/model.hpp"
#include "io/pickle.hpp"
#include "models/detector.hpp"
#include "support.hpp"

namespace libreyolo::test {

struct RtdetrFixture {
  io::PyValuePtr checkpoint, expect;
  io::StateDict weights;
  models::rtdetr::Config cfg;
  std::shared_ptr<models::rtdetr::RtdetrModel> model;

  bool has(const std::string& key) const {
    auto v = expect->get(key);
    return v && v->is_tensor();
  }
  torch::Tensor expected(const std::string& key) const {
    auto v = expect->get(key);
    if (!v || !v->is_tensor()) throw std::runtime_error("fixture lacks tensor " + key);
    return v->tensor;
  }
  torch::Tensor input() const { return expected("input_u8").to(torch::kFloat) / 255.0; }
  // The recorded ground truth per image (labels, cxcywh boxes).
  std::vector<models::rtdetr::ImageTargets> targets(int images = 2) const {
    std::vector<models::rtdetr::ImageTargets> t;
    for (int b = 0; b < images; ++b) {
      const std::string p = "targets.img" + std::to_string(b) + ".";
      t.push_back({expected(p + "labels"), expected(p + "boxes")});
    }
    return t;
  }
  // A fresh network with the checkpoint's weights (eval mode).
  std::shared_ptr<models::rtdetr::RtdetrModel> fresh_model() const {
    auto m = std::make_shared<models::rtdetr::RtdetrModel>(cfg);
    models::load_state_dict(*m, weights, /*strict=*/true);
    m->eval();
    return m;
  }
};

// `name`: the path of the checkpoint without ".pt" (the expected tensors are in name + "_expect.pt").
inline RtdetrFixture load_rtdetr_fixture_files(const std::string& name) {
  RtdetrFixture f;
  f.checkpoint = io::load_torch_file(name + ".pt");
  f.expect = io::load_torch_file(name + "_expect.pt");
  f.weights = io::to_state_dict(*f.checkpoint->get("model"));
  const auto cfg = models::rtdetr::config_from_state_dict(f.weights);
  if (!cfg) throw std::runtime_error("the fixture's weights do not describe an RT-DETR network");
  f.cfg = *cfg;
  f.model = f.fresh_model();
  return f;
}

inline RtdetrFixture load_rtdetr_fixture(const std::string& dir) {
  return load_rtdetr_fixture_files(dir + "/rtdetr_r18narrow_nc80_s320");
}

// The denoising draws recorded under `prefix` (".rand_label_u", ...), as the group's random source
// (which throws when asked for draws of another shape).
inline models::rtdetr::DenoisingSource recorded_draws(const RtdetrFixture& f, const std::string& prefix) {
  models::rtdetr::DenoisingDraws d{f.expected(prefix + ".rand_label_u"), f.expected(prefix + ".rand_new_label"),
                                   f.expected(prefix + ".rand_sign_bits"), f.expected(prefix + ".rand_part_u")};
  return [d](int64_t b, int64_t n, int64_t, const torch::Device&) {
    if (d.label_u.size(0) != b || d.label_u.size(1) != n) throw std::runtime_error("recorded draws of another shape");
    return d;
  };
}

// Every recorded term under `prefix` (e.g. loss_dn) against ours, by name, within `bound`
// relative; both sides have exactly the same `count` names (and the total).
inline void expect_loss_terms(const RtdetrFixture& f, const std::string& prefix, const loss::RtdetrLossTerms& t,
                              size_t count, double bound) {
  ASSERT_EQ(t.names.size(), count);
  size_t recorded = 0;
  double worst = 0;
  for (const auto& [key, value] : f.expect->dict) {
    const std::string name = key->as_string();
    if (name.rfind(prefix + ".", 0) != 0) continue;
    const std::string term = name.substr(prefix.size() + 1);
    const auto got = term == "total_loss" ? t.total : t.value(term);
    const double want = value->tensor.item<double>(), have = got.item<double>();
    const double e = std::abs(have - want) / std::max(std::abs(want), 1e-12);
    EXPECT_LE(e, bound) << name << ": " << have << " vs " << want;
    worst = std::max(worst, e);
    if (term != "total_loss") ++recorded;
  }
  EXPECT_EQ(recorded, count);
  std::printf("  %-12s %zu terms + total (%.6f vs %.6f), worst rel err %.3g\n", prefix.c_str(), count,
              t.total.item<double>(), f.expected(prefix + ".total_loss").item<double>(), worst);
}

// The recorded gradients under `prefix` (`count` of them) against the model's, within `bound`
// relative; an empty recorded tensor means the parameter got no gradient.
inline void expect_gradients(const RtdetrFixture& f, const std::string& prefix, torch::nn::Module& model, int count,
                             double bound) {
  std::map<std::string, torch::Tensor> params;
  for (const auto& p : model.named_parameters()) params[p.key()] = p.value();
  int checked = 0;
  double worst = 0;
  for (const auto& [key, value] : f.expect->dict) {
    const std::string name = key->as_string();
    if (name.rfind(prefix + ".", 0) != 0) continue;
    const auto it = params.find(name.substr(prefix.size() + 1));
    ASSERT_NE(it, params.end()) << name;
    const auto g = it->second.grad();
    ++checked;
    if (value->tensor.numel() == 0) {
      EXPECT_TRUE(!g.defined() || g.abs().max().item<double>() == 0.0) << name;
      continue;
    }
    ASSERT_TRUE(g.defined()) << name;
    const double e = rel_err(g, value->tensor);
    EXPECT_LE(e, bound) << name;
    worst = std::max(worst, e);
  }
  EXPECT_EQ(checked, count);
  std::printf("  %-12s %d gradients, worst rel err %.3g\n", prefix.c_str(), checked, worst);
}

// max |got - want| / max |want| within `bound` (printed).
// Training mode selects the 300 queries from batch-statistics features, where some neighbours' scores
// lie closer than another summation order moves them (another thread count): the same queries can
// come out in another order. Returns, per image, the row of the recorded encoder top-k
// (`want_boxes` [B, Q, 4], `want_logits` [B, Q, nc]) each of ours is (nearest in boxes and logits),
// after checking it is a one-to-one map within `bound` relative; the identity where the orders agree.
inline torch::Tensor recorded_query_order(const torch::Tensor& boxes, const torch::Tensor& logits,
                                          const torch::Tensor& want_boxes, const torch::Tensor& want_logits,
                                          double bound) {
  const auto ours = torch::cat({boxes, logits}, 2).detach().to(torch::kDouble);
  const auto want = torch::cat({want_boxes, want_logits}, 2).to(torch::kDouble);
  const auto order = torch::cdist(ours, want).argmin(2);  // [B, Q]
  const auto rows = torch::arange(order.size(1), order.options());
  for (int64_t b = 0; b < order.size(0); ++b)
    EXPECT_TRUE(torch::equal(std::get<0>(order[b].sort()), rows)) << "image " << b << ": not a one-to-one map";
  const auto matched = want.gather(1, order.unsqueeze(2).expand_as(want));
  EXPECT_LE(rel_err(ours, matched), bound) << "the selected queries differ, not only their order";
  const int64_t moved = order.ne(rows.unsqueeze(0)).sum().item<int64_t>();
  if (moved > 0) std::printf("  %lld of %lld queries in another order than recorded\n", static_cast<long long>(moved),
                             static_cast<long long>(order.numel()));
  return order;
}

// The eval selection `ours` [B, Q] against the recorded `want` [B, Q], tolerant of near-ties only:
// `scores` [B, T] are our selection scores (the best class's logit per token) and `want_scores`
// [B, Q] the reference's at its selected tokens. delta, the largest difference between ours and
// the reference's at those tokens, is how far this CPU's rounding moves a score; where the two
// selections differ, the tokens' scores must lie within 2 delta of each other (a swap of near-equal
// scores), and at most a few in a hundred slots may differ.
inline void expect_same_selection(const torch::Tensor& ours, const torch::Tensor& want, const torch::Tensor& scores,
                                  const torch::Tensor& want_scores, const std::string& what) {
  ASSERT_EQ(ours.sizes(), want.sizes()) << what;
  const auto s = scores.detach().to(torch::kDouble);
  const double delta = (s.gather(1, want) - want_scores.to(torch::kDouble)).abs().max().item<double>();
  const auto differ = ours.ne(want);
  const int64_t n = differ.sum().item<int64_t>();
  const double gap = n == 0 ? 0.0 : (s.gather(1, ours) - s.gather(1, want)).abs().masked_select(differ).max().item<double>();
  std::printf("  %s: %lld of %lld selected tokens differ, score gap %.3g against 2 x delta %.3g\n", what.c_str(),
              static_cast<long long>(n), static_cast<long long>(want.numel()), gap, 2 * delta);
  EXPECT_LE(gap, 2 * delta + 1e-12) << what << ": a token selected in place of one whose score is not a near-tie";
  EXPECT_LE(n * 100, want.numel() * 3) << what << ": more than 3% of the selection differs";
}

// `want` [B, Q, ...] rearranged to our query order.
inline torch::Tensor in_order(const torch::Tensor& want, const torch::Tensor& order) {
  auto index = order;
  for (int64_t d = 2; d < want.dim(); ++d) index = index.unsqueeze(d);
  return want.gather(1, index.expand_as(want));
}

}  // namespace libreyolo::test
