// RT-DETR (the narrow r18 fixture) on CUDA: the eval predictions, the training criterion with
// denoising queries (every term, the Hungarian matches in the reference's query order, 20 gradients) in float32 with TF32 off
// against the reference's values, and bf16 autocast giving a finite loss near the float32 one
// with finite gradients; for the RT-DETR line's families with the capture seam (RT-DETR, RT-DETRv2,
// D-FINE, DEIM, RT-DETRv4), the training head replayed from CUDA graphs against the eager head, and steps
// with it against eager steps.
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/autocast.hpp"
#include "engine/graphed_segment.hpp"
#include "families/rtdetr/loss.hpp"
#include "families/rtdetr/matcher.hpp"
#include "fold_check.hpp"
#include "rtdetr_fixture.hpp"
#include "step_check.hpp"

namespace rtdetr = libreyolo::models::rtdetr;
using libreyolo::loss::RtdetrLoss;
using libreyolo::test::check_rel;
using libreyolo::test::rel_err;

using libreyolo::test::NoTF32;

namespace {

constexpr double kOutputBound = 1e-3;  // relative, float32 on the GPU against the CPU reference
constexpr double kLossBound = 1e-3;
constexpr double kGradBound = 1e-2;

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
  LY_REQUIRE_FIXTURE_FILE(dir, "rtdetr_r18narrow_nc80_s320.pt");
  NoTF32 fp32;
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  f.model->to(kCuda);
  torch::NoGradGuard no_grad;
  const libreyolo::test::FoldSwitch unfolded(false);  // the reference's op order (top-k scores 6e-6 apart)
  const auto raw = f.model->forward_raw(f.input().to(kCuda));
  ASSERT_EQ(raw.size(), 3u);
  check_rel("pred_logits", raw[0].cpu(), f.expected("eval.pred_logits"), kOutputBound);
  check_rel("pred_boxes", raw[1].cpu(), f.expected("eval.pred_boxes"), kOutputBound);
}

// The conv + norm blocks folded for inference on the GPU (channels_last, the fused epilogues and
// cuDNN's fused plans where they apply): the backbone's and encoder's maps folded against
// unfolded, float32 (TF32 convolutions as in predict) and bf16 autocast.
TEST(RtdetrGpu, FoldedEvalMapsEqualUnfolded) {
  LY_REQUIRE_CUDA();
  torch::manual_seed(0);
  auto model = std::dynamic_pointer_cast<rtdetr::RtdetrModel>(libreyolo::models::find_family("rtdetr")->build("r18", 80));
  ASSERT_TRUE(model);
  model->eval();
  model->to(kCuda);
  {
    torch::NoGradGuard ng;
    for (auto& p : model->parameters())
      if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
  }
  const auto x = torch::rand({1, 3, 320, 320}, torch::TensorOptions().device(kCuda)).contiguous(torch::MemoryFormat::ChannelsLast);
  torch::NoGradGuard no_grad;
  for (const bool bf16 : {false, true}) {
    const libreyolo::AutocastGuard ac(kCuda, bf16, torch::kBFloat16);
    const auto maps = [&](bool fold) {
      const libreyolo::test::FoldSwitch s(fold);
      const auto t = model->forward_trace(x);
      std::vector<torch::Tensor> out;
      for (const auto& m : t.backbone) out.push_back(m.to(torch::kFloat));
      for (const auto& m : t.encoder) out.push_back(m.to(torch::kFloat));
      return out;
    };
    const auto ref = maps(false), got = maps(true);
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, rel_err(got[i], ref[i]));
    std::printf("[ REPORT   ] rtdetr r18 %s folded vs unfolded: backbone and encoder maps rel err %.3g\n",
                bf16 ? "bf16" : "fp32/TF32", worst);
    EXPECT_LE(worst, bf16 ? 3e-2 : 3e-3);  // TF32 (10-bit) and bf16 (8-bit) rounding, other sum orders
  }
}

TEST(RtdetrGpu, Float32CriterionWithDenoising) {
  LY_REQUIRE_CUDA();
  LY_REQUIRE_FIXTURE_FILE(dir, "rtdetr_r18narrow_nc80_s320.pt");
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
  LY_REQUIRE_FIXTURE_FILE(dir, "rtdetr_r18narrow_nc80_s320.pt");
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

// The RT-DETR line's families with the capture seams (RtdetrModel, DfineModel), at a size each,
// with the seam cut after the encoder (head) or after the whole network (network).
struct SeamCase {
  const char* family;
  const char* size;
  libreyolo::models::Seam seam;
};
class RtdetrLineGpu : public ::testing::TestWithParam<SeamCase> {};

// Two images' targets (3 and 1 boxes, normalised xyxy) on the GPU, padded to 4 rows.
static torch::Tensor seam_targets() {
  auto t = torch::full({2, 4, 5}, -1.0f);
  const float rows[4][5] = {{0, 0.1f, 0.1f, 0.3f, 0.4f}, {1, 0.5f, 0.2f, 0.9f, 0.6f}, {0, 0.2f, 0.6f, 0.4f, 0.9f},
                            {1, 0.3f, 0.3f, 0.7f, 0.8f}};
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 5; ++k) t[0][r][k] = rows[r][k];
  for (int k = 0; k < 5; ++k) t[1][0][k] = rows[3][k];
  return t.to(kCuda);
}

// The part before the seam replayed from its forward and backward graphs gives the eager part's
// outputs bit for bit (deterministic cuDNN), in float32 and under bf16 autocast. Its parameter
// gradients: bit for bit at the head seam (no atomics there); at the network seam (the decoder's
// deformable attention and query gathers accumulate their gradients with atomics) within four
// times the largest difference among three eager backward passes, and at least a floor for the
// dtype: 1e-5 of the gradients' norm in float32; 5e-2 under bf16, whose atomic sums round at 8
// bits (two eager passes of D-FINE-n differed by 2.0% of the norm on an H100, and two others of
// the same model agreed exactly, so one pair's difference is no measure of the spread).
TEST_P(RtdetrLineGpu, GraphedHeadEqualsEagerHead) {
  LY_REQUIRE_CUDA();
  const libreyolo::test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true,
                                           at::globalContext().allowTF32CuDNN());
  const SeamCase c = GetParam();
  const bool exact_grads = c.seam == libreyolo::models::Seam::Head;
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(std::string(c.family) + " " + libreyolo::models::seam_name(c.seam) + (bf16 ? " bf16" : " fp32"));
    torch::manual_seed(0);
    auto model = libreyolo::models::find_family(c.family)->build(c.size, 2);
    model->to(kCuda);
    model->train();
    const auto params = model->head_parameters(c.seam);
    ASSERT_FALSE(params.empty());
    const torch::Tensor x = torch::rand({2, 3, 320, 320}, torch::TensorOptions().device(kCuda));
    const auto in = model->seam_inputs(c.seam, seam_targets());
    std::vector<torch::Tensor> weights;  // a fixed cotangent per output level
    const auto grads_of = [&](const std::vector<torch::Tensor>& outs) {
      for (auto& p : params) p.mutable_grad() = torch::Tensor();
      torch::Tensor loss = torch::zeros({}, torch::TensorOptions().device(kCuda));
      for (size_t i = 0; i < outs.size(); ++i) {
        if (weights.size() <= i) weights.push_back(torch::randn(outs[i].sizes(), torch::TensorOptions().device(kCuda)));
        if (outs[i].requires_grad()) loss = loss + (outs[i].to(torch::kFloat) * weights[i]).sum();
      }
      loss.backward();
      std::vector<torch::Tensor> g;
      for (auto& p : params) g.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
      return g;
    };
    std::vector<torch::Tensor> eager_out, graph_out, eager_grad, graph_grad;
    std::vector<std::vector<torch::Tensor>> more_eager;  // two more eager passes
    std::unique_ptr<libreyolo::engine::GraphedSegment> seg;
    {
      libreyolo::AutocastGuard ac(kCuda, bf16, torch::kBFloat16, /*cache=*/false);
      for (const auto& o : model->train_head(c.seam, x, in.head)) eager_out.push_back(o.detach().clone());
      eager_grad = grads_of(model->train_head(c.seam, x, in.head));
      for (int k = 0; k < 2; ++k) more_eager.push_back(grads_of(model->train_head(c.seam, x, in.head)));
      seg = libreyolo::engine::GraphedSegment::capture(
          kCuda, [&](const torch::Tensor& input) { return model->train_head(c.seam, input, in.head); }, x, params);
      const auto outs = seg->run();
      for (const auto& o : outs) graph_out.push_back(o.detach().clone());
      graph_grad = grads_of(seg->run());
    }
    ASSERT_GE(eager_out.size(), 2u);
    ASSERT_EQ(graph_out.size(), eager_out.size());
    for (size_t i = 0; i < eager_out.size(); ++i) EXPECT_TRUE(torch::equal(eager_out[i], graph_out[i])) << "output " << i;
    int compared = 0;
    // Norm-wise distances between two sets of gradients.
    const auto distance = [&](const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
      double d = 0;
      for (size_t i = 0; i < params.size(); ++i)
        if (a[i].defined() && b[i].defined()) d += (a[i] - b[i]).pow(2).sum().item<double>();
      return std::sqrt(d);
    };
    const double spread = std::max({distance(eager_grad, more_eager[0]), distance(eager_grad, more_eager[1]),
                                    distance(more_eager[0], more_eager[1])});
    const double graphed = distance(graph_grad, eager_grad);
    double norm = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_EQ(eager_grad[i].defined(), graph_grad[i].defined()) << i;
      if (!eager_grad[i].defined()) continue;
      ++compared;
      norm += eager_grad[i].pow(2).sum().item<double>();
      if (exact_grads)
        EXPECT_TRUE(torch::equal(eager_grad[i], graph_grad[i]))
            << "parameter " << i << " max diff " << (eager_grad[i] - graph_grad[i]).abs().max().item<float>();
    }
    norm = std::sqrt(norm);
    if (!exact_grads)
      EXPECT_LE(graphed, std::max(4 * spread, (bf16 ? 5e-2 : 1e-5) * norm)) << graphed << " vs spread " << spread;
    EXPECT_GT(compared, 50);
    std::printf("[ REPORT   ] %s-%s %s seam %s: %zu outputs equal, %d parameter gradients: graphed vs eager %.3g, "
                "eager vs eager %.3g (of norm %.3g)\n",
                c.family, c.size, libreyolo::models::seam_name(c.seam), bf16 ? "bf16" : "fp32", eager_out.size(),
                compared, graphed, spread, norm);
  }
}

// Whole training steps with the seam's part graphed (cuda_graph=true on the family): the losses
// stay within the eager run's own run-to-run spread (the decoder's deformable attention
// accumulates its gradient with atomics, so two eager runs differ too), every step is finite, and
// the graphs are the seam's and the update's.
TEST_P(RtdetrLineGpu, GraphedStepsStayWithinTheEagerSpread) {
  LY_REQUIRE_CUDA();
  const libreyolo::test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true,
                                           at::globalContext().allowTF32CuDNN());
  const SeamCase c = GetParam();
  const auto* fam = libreyolo::models::find_family(c.family);
  const bool network = c.seam == libreyolo::models::Seam::Network;
  std::printf("[ REPORT   ] %s declares capture_train_%s: %s\n", c.family, network ? "network" : "head",
              (network ? fam->capture_train_network : fam->capture_train_head) ? "yes" : "not yet");
  libreyolo::TrainConfig cfg;
  cfg.batch = 4;
  cfg.epochs = 10;
  cfg.optimizer = "adamw";
  cfg.lr0 = 1e-4;
  cfg.weight_decay = 1e-4;
  cfg.scheduler = "constant";
  cfg.warmup_epochs = 0;
  cfg.clip_max_norm = 0.1;
  const auto batches = libreyolo::test::pinned_step_batches(16, 4000, 4, 320);
  const auto build = [&] { return fam->build(c.size, 2); };
  using libreyolo::engine::GraphScope;
  const auto a = libreyolo::test::run_family_steps(*fam, build, cfg, batches, kCuda, false);
  const auto b = libreyolo::test::run_family_steps(*fam, build, cfg, batches, kCuda, false);
  const auto g = libreyolo::test::run_family_steps(*fam, build, cfg, batches, kCuda, true, -1,
                                                   network ? GraphScope::Network : GraphScope::Head);
  double spread = 0, graphed = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    const double la = a.losses[i][0].item<double>(), lb = b.losses[i][0].item<double>(), lg = g.losses[i][0].item<double>();
    EXPECT_TRUE(std::isfinite(lg)) << "step " << i;
    spread = std::max(spread, std::abs(lb - la) / std::abs(la));
    graphed = std::max(graphed, std::abs(lg - la) / std::abs(la));
  }
  std::printf("[ REPORT   ] %s-%s %s seam, 16 steps: eager vs eager worst loss difference %.3g relative, graphed vs "
              "eager %.3g; %lld steps with the seam's part replayed, %lld with the loss replayed\n",
              c.family, c.size, libreyolo::models::seam_name(c.seam), spread, graphed,
              static_cast<long long>(g.stats.replayed_heads), static_cast<long long>(g.stats.replayed_losses));
  EXPECT_LE(graphed, std::max(4 * spread, 1e-3));
  EXPECT_EQ(g.stats.captured_shapes, 1);
  EXPECT_TRUE(g.stats.update_captured);
  EXPECT_GE(g.stats.replayed_heads, 12);
  EXPECT_EQ(a.stats.replayed_heads, 0);
  // The line's criteria plan their matching (RtdetrLoss, DfineLoss: TrainingLoss::plan): under the
  // network seam their scoring is replayed too, from the step after the network's capture and one
  // eager padded scoring on.
  if (network) EXPECT_GE(g.stats.replayed_losses, 10);
  if (!network) EXPECT_EQ(g.stats.replayed_losses, 0);
}

static std::vector<SeamCase> seam_cases() {
  std::vector<SeamCase> out;
  const std::pair<const char*, const char*> families[] = {
      {"rtdetr", "r18"}, {"rtdetrv2", "r18"}, {"dfine", "n"}, {"deim", "n"}, {"rtdetrv4", "s"}};
  for (const auto seam : {libreyolo::models::Seam::Head, libreyolo::models::Seam::Network})
    for (const auto& [f, s] : families) out.push_back({f, s, seam});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Seam, RtdetrLineGpu, ::testing::ValuesIn(seam_cases()),
                         [](const ::testing::TestParamInfo<SeamCase>& i) {
                           return std::string(i.param.family) + "_" + libreyolo::models::seam_name(i.param.seam);
                         });
