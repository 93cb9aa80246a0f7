// RT-DETR (the narrow r18 fixture) on CUDA: the eval predictions, the training criterion with
// denoising queries (every term, the Hungarian matches in the reference's query order, 20 gradients) in float32 with TF32 off
// against the reference's values, and bf16 autocast giving a finite loss near the float32 one
// with finite gradients.
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include <cmath>
#include <map>

#include "families/rtdetr/loss.hpp"
#include "families/rtdetr/matcher.hpp"
#include "rtdetr_fixture.hpp"

namespace rtdetr = libreyolo::models::rtdetr;
using libreyolo::loss::RtdetrLoss;
using libreyolo::test::check_rel;
using libreyolo::test::rel_err;

namespace {

constexpr double kOutputBound = 1e-3;  // relative, float32 on the GPU against the CPU reference
constexpr double kLossBound = 1e-3;
constexpr double kGradBound = 1e-2;

class NoTF32 {
 public:
  NoTF32() : cudnn_(at::globalContext().allowTF32CuDNN()), cublas_(at::globalContext().allowTF32CuBLAS()) {
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setAllowTF32CuBLAS(false);
  }
  ~NoTF32() {
    at::globalContext().setAllowTF32CuDNN(cudnn_);
    at::globalContext().setAllowTF32CuBLAS(cublas_);
  }
  NoTF32(const NoTF32&) = delete;
  NoTF32& operator=(const NoTF32&) = delete;

 private:
  bool cudnn_, cublas_;
};

const torch::Device kCuda(torch::kCUDA, 0);

std::vector<rtdetr::ImageTargets> cuda_targets(const libreyolo::test::RtdetrFixture& f) {
  auto t = f.targets();
  for (auto& g : t) g = {g.labels.to(kCuda), g.boxes.to(kCuda)};
  return t;
}

void use_recorded_draws(const libreyolo::test::RtdetrFixture& f, rtdetr::RtdetrModel& model) {
  rtdetr::DenoisingDraws d{f.expected("cdn.rand_label_u"), f.expected("cdn.rand_new_label"),
                           f.expected("cdn.rand_sign_bits"), f.expected("cdn.rand_part_u")};
  model.set_denoising_source([d](int64_t, int64_t, int64_t, const torch::Device&) { return d; });
}

}  // namespace

TEST(RtdetrGpu, Float32EvalPredictions) {
  LY_REQUIRE_CUDA();
  LY_REQUIRE_FIXTURES(dir);
  NoTF32 fp32;
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  f.model->to(kCuda);
  torch::NoGradGuard no_grad;
  const auto raw = f.model->forward_raw(f.input().to(kCuda));
  ASSERT_EQ(raw.size(), 3u);
  check_rel("pred_logits", raw[0].cpu(), f.expected("eval.pred_logits"), kOutputBound);
  check_rel("pred_boxes", raw[1].cpu(), f.expected("eval.pred_boxes"), kOutputBound);
}

TEST(RtdetrGpu, Float32CriterionWithDenoising) {
  LY_REQUIRE_CUDA();
  LY_REQUIRE_FIXTURES(dir);
  NoTF32 fp32;
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  f.model->to(kCuda);
  f.model->train();
  use_recorded_draws(f, *f.model);
  const auto raw = f.model->forward_train(f.input().to(kCuda), f.expected("targets_padded").to(kCuda));
  RtdetrLoss loss(80);
  const auto t = loss.terms(rtdetr::unpack_train_outputs(raw), cuda_targets(f));
  ASSERT_EQ(t.names.size(), 21u);
  double worst = 0;
  for (const auto& name : t.names) {
    const double want = f.expected("loss_dn." + name).item<double>();
    const double have = t.value(name).item<double>();
    const double e = std::abs(have - want) / std::max(std::abs(want), 1e-12);
    EXPECT_LE(e, kLossBound) << name << ": " << have << " vs " << want;
    worst = std::max(worst, e);
  }
  std::printf("  21 terms, worst rel err %.3g (total %.6f vs %.6f)\n", worst, t.total.item<double>(),
              f.expected("loss_dn.total_loss").item<double>());
  // The matches, per level, in the reference's query order: training mode selects the queries
  // from batch statistics, where two neighbours' scores can lie closer than the GPU's rounding
  // moves them, so the same queries may come out in another order (test::recorded_query_order).
  // Then our cost matrix equals the recorded one and every matched (query, GT) pair is the
  // reference's.
  const auto in = rtdetr::unpack_train_outputs(raw);
  const auto order = libreyolo::test::recorded_query_order(
      in.aux.back().boxes.cpu(), in.aux.back().logits.cpu(), f.expected("train_dn.aux_outputs.2.pred_boxes"),
      f.expected("train_dn.aux_outputs.2.pred_logits"), kOutputBound);
  std::vector<const rtdetr::OutputLevel*> levels = {&in.last};
  for (const auto& a : in.aux) levels.push_back(&a);
  ASSERT_EQ(t.matches.size(), levels.size());
  ASSERT_EQ(levels.size(), 4u);
  const auto gts = cuda_targets(f);
  for (size_t l = 0; l < levels.size(); ++l) {
    const std::string lp = "match_dn.level" + std::to_string(l) + ".";
    const auto cost = rtdetr::matching_cost(levels[l]->logits.detach(), levels[l]->boxes.detach(), gts);
    check_rel(lp + "cost", cost.cpu(), libreyolo::test::in_order(f.expected(lp + "cost"), order), kOutputBound);
    for (int b = 0; b < 2; ++b) {
      const std::string p = lp + "img" + std::to_string(b) + ".";
      const auto& m = t.matches[l][b];
      // (recorded query, GT) of each of our pairs, sorted by query as recorded.
      const auto query = order[b].index_select(0, m.query.cpu());
      const auto [sorted, by] = query.sort();
      EXPECT_TRUE(torch::equal(sorted, f.expected(p + "pred"))) << p;
      EXPECT_TRUE(torch::equal(m.gt.cpu().index_select(0, by), f.expected(p + "gt"))) << p;
    }
  }
  t.total.backward();
  std::map<std::string, torch::Tensor> params;
  for (const auto& p : f.model->named_parameters()) params[p.key()] = p.value();
  int checked = 0;
  double worst_grad = 0;
  for (const auto& [key, value] : f.expect->dict) {
    const std::string name = key->as_string();
    if (name.rfind("grad_dn.", 0) != 0 || value->tensor.numel() == 0) continue;
    const auto it = params.find(name.substr(8));
    ASSERT_NE(it, params.end()) << name;
    ASSERT_TRUE(it->second.grad().defined()) << name;
    const double e = rel_err(it->second.grad().cpu(), value->tensor);
    EXPECT_LE(e, kGradBound) << name;
    worst_grad = std::max(worst_grad, e);
    ++checked;
  }
  EXPECT_GT(checked, 10);
  std::printf("  %d gradients, worst rel err %.3g\n", checked, worst_grad);
}

TEST(RtdetrGpu, Bf16AutocastLossIsFiniteAndNearFloat32) {
  LY_REQUIRE_CUDA();
  LY_REQUIRE_FIXTURES(dir);
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  f.model->to(kCuda);
  f.model->train();
  use_recorded_draws(f, *f.model);
  const auto x = f.input().to(kCuda);
  const auto targets = f.expected("targets_padded").to(kCuda);
  RtdetrLoss loss(80);
  torch::Tensor total;
  {
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    const auto raw = f.model->forward_train(x, targets);
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
    total = loss.terms(rtdetr::unpack_train_outputs(raw), cuda_targets(f)).total;
  }
  ASSERT_EQ(total.scalar_type(), torch::kFloat);
  const double have = total.item<double>(), want = f.expected("loss_dn.total_loss").item<double>();
  EXPECT_TRUE(std::isfinite(have));
  // bf16 moves the matching and the box terms a little; the loss stays near the float32 one.
  EXPECT_LE(std::abs(have - want) / want, 0.1) << have << " vs " << want;
  total.backward();
  int with_grad = 0;
  for (const auto& p : f.model->parameters()) {
    if (!p.grad().defined()) continue;
    ++with_grad;
    EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>());
  }
  EXPECT_GT(with_grad, 100);
  std::printf("  bf16 total %.6f vs float32 reference %.6f\n", have, want);
}
