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
inline void check_rel(const std::string& what, const torch::Tensor& got, const torch::Tensor& want, double bound) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double e = rel_err(got.detach().to(torch::kFloat), want.to(torch::kFloat));
  EXPECT_LE(e, bound) << what;
  std::printf("  %-44s rel err %.3g\n", what.c_str(), e);
}

}  // namespace libreyolo::test
