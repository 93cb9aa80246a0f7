// Loads the narrow RT-DETR parity fixture (rtdetr_r18narrow_nc80_s320 in LIBREYOLO_FIXTURES,
// made with LibreYOLO 1.6.0): the checkpoint's weights strictly into a network built from their
// shapes (eval mode, CPU, float32) and the dict of expected tensors.
#pragma once
#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "families/rtdetr/boxes.hpp"
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

inline RtdetrFixture load_rtdetr_fixture(const std::string& dir) {
  const std::string name = dir + "/rtdetr_r18narrow_nc80_s320";
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

// `want` [B, Q, ...] rearranged to our query order.
inline torch::Tensor in_order(const torch::Tensor& want, const torch::Tensor& order) {
  auto index = order;
  for (int64_t d = 2; d < want.dim(); ++d) index = index.unsqueeze(d);
  return want.gather(1, index.expand_as(want));
}

}  // namespace libreyolo::test
