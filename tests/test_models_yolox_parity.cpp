// YOLOX-n parity with LibreYOLO 1.6.0 on the CPU (fixtures/README.md, "YOLOX parity fixtures"):
// eval maps and decoded predictions, the train-mode forward, the BatchNorm update, the postprocess,
// the SimOTA assignment, the loss with the L1 branch off and on, and the gradients.
#include <map>
#include <tuple>

#include "fold_check.hpp"
#include "io/pickle.hpp"
#include "families/yolox/loss.hpp"
#include "models/detector.hpp"
#include "families/yolox/model.hpp"
#include "support.hpp"

using libreyolo::test::check_rel;
using libreyolo::test::rel_err;
namespace models = libreyolo::models;
namespace io = libreyolo::io;
using libreyolo::loss::YoloxLoss;

namespace {

struct Fixture {
  io::PyValuePtr checkpoint, expect;
  io::StateDict weights;
  const models::Family* family = nullptr;
  std::shared_ptr<models::Detector> model;

  torch::Tensor expected(const std::string& key) const {
    auto v = expect->get(key);
    if (!v || !v->is_tensor()) throw std::runtime_error("fixture lacks tensor " + key);
    return v->tensor;
  }
};

// Through the library's own reader and registry, as a user's checkpoint would be loaded.
Fixture load_fixture(const std::string& dir) {
  Fixture f;
  f.checkpoint = io::load_torch_file(dir + "/yoloxn_nc80_s320.pt");
  f.expect = io::load_torch_file(dir + "/yoloxn_nc80_s320_expect.pt");
  f.weights = io::to_state_dict(*f.checkpoint->get("model"));
  f.family = models::detect_family(f.weights);
  if (!f.family) throw std::runtime_error("checkpoint not recognised as any family");
  f.family->normalize_keys(f.weights);
  f.model = f.family->build_like(f.weights, static_cast<int>(f.checkpoint->get("nc")->as_int("nc")));
  models::load_state_dict(*f.model, f.weights, /*strict=*/true);
  return f;
}

// The fixture's targets (class, cx, cy, w, h) in pixels, zero padding, as the library's
// TrainingLoss takes them: (class, x1, y1, x2, y2) normalised by the input size, class -1 padding.
torch::Tensor to_library_targets(const torch::Tensor& t, int64_t h, int64_t w) {
  auto cls = t.select(2, 0), cx = t.select(2, 1), cy = t.select(2, 2), bw = t.select(2, 3), bh = t.select(2, 4);
  auto pad = t.sum(2) <= 0;
  auto out = torch::stack({torch::where(pad, torch::full_like(cls, -1), cls), (cx - bw / 2) / w, (cy - bh / 2) / h,
                           (cx + bw / 2) / w, (cy + bh / 2) / h},
                          2);
  return torch::where(pad.unsqueeze(2), torch::tensor({-1.f, 0.f, 0.f, 0.f, 0.f}), out);
}

// Checks a relative error against its bound and prints it (the figures of the parity note).
torch::Tensor to_logit(const torch::Tensor& p) {
  auto d = p.to(torch::kDouble);
  return torch::log(d) - torch::log1p(-d);
}

}  // namespace

TEST(YoloxParity, CheckpointIsRecognisedAndNamesMatch) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  EXPECT_EQ(f.family->name, "yolox");
  EXPECT_EQ(f.checkpoint->get("model_family")->as_string(), "yolox");
  EXPECT_EQ(f.model->size(), "n");
  EXPECT_EQ(f.model->num_classes(), 80);
  const auto mine = models::state_dict(*f.model);
  ASSERT_EQ(mine.size(), f.weights.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].first, f.weights[i].first);
    EXPECT_TRUE(torch::equal(mine[i].second, f.weights[i].second)) << mine[i].first;
  }
}

// The eval tests run the unfolded forward (BatchNorm as its own op), the Python reference's
// float32 operations: this untrained model on 0-255 inputs amplifies float32 rounding to ~3e-4 of
// its predictions (against its own float64 forward). With the fixture maker's summation order
// (its thread count and vector width) our float32 forward meets 1e-4; with another one, ours and
// the fixture each carry their own float32 error. So each quantity's bound is 1e-4, or, where
// float32 rounding on this machine is larger, the sum of both errors: ours measured against our
// float64 forward (e), the fixture's taken as at most twice that, 3e. The folded forward (the
// default) is checked against the float64 forward: FoldBn.YoloxParityFixtureAgainstFloat64.
TEST(YoloxParity, EvalMapsAndDecodedPredictions) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  f.model->eval();
  libreyolo::test::FoldSwitch unfolded(false);
  torch::NoGradGuard no_grad;
  const auto input = f.expected("input");
  const auto raw = f.model->forward_raw(input);
  const auto got = f.model->decode(raw);
  f.model->to(torch::kDouble);
  const auto raw64 = f.model->forward_raw(input.to(torch::kDouble));
  const auto got64 = f.model->decode(raw64);
  f.model->to(torch::kFloat);
  auto check = [](const std::string& what, const torch::Tensor& g, const torch::Tensor& g64, const torch::Tensor& want) {
    check_rel(what, g, want, std::max(1e-4, 3.0 * rel_err(g, g64)));
  };
  ASSERT_EQ(raw.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const auto want = f.expected("eval_out_" + std::to_string(i));
    ASSERT_EQ(raw[i].sizes(), want.sizes());
    check("eval reg, level " + std::to_string(i), raw[i].narrow(1, 0, 4), raw64[i].narrow(1, 0, 4),
          want.narrow(1, 0, 4));
    // obj/cls as probabilities, and as logits where float32 keeps 1 - p resolvable.
    const auto got_p = torch::sigmoid(raw[i].narrow(1, 4, 81)), want_p = want.narrow(1, 4, 81);
    check("eval obj/cls prob, level " + std::to_string(i), got_p, torch::sigmoid(raw64[i].narrow(1, 4, 81)), want_p);
    const auto ok = want_p < 0.999;
    check("eval obj/cls logit (p<0.999), level " + std::to_string(i), raw[i].narrow(1, 4, 81).masked_select(ok),
          raw64[i].narrow(1, 4, 81).masked_select(ok), to_logit(want_p).masked_select(ok));
  }
  // Decoded: [B, 4 + nc, A] xyxy + obj x cls against the fixture's cxcywh + obj + cls.
  const auto want = f.expected("eval_predictions");  // [2, 2100, 85]
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 84, 2100}));
  const auto cx = want.select(2, 0), cy = want.select(2, 1), w = want.select(2, 2), h = want.select(2, 3);
  const auto want_xyxy = torch::stack({cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2}, 1);
  check("eval_predictions boxes", got.narrow(1, 0, 4), got64.narrow(1, 0, 4), want_xyxy);
  const auto want_scores = (want.narrow(2, 5, 80) * want.narrow(2, 4, 1)).transpose(1, 2);
  check("eval_predictions obj*cls", got.narrow(1, 4, 80), got64.narrow(1, 4, 80), want_scores);
}

TEST(YoloxParity, TrainForwardAndBatchNormUpdate) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  f.model->train();
  const auto raw = f.model->forward_raw(f.expected("input"));
  for (int i = 0; i < 3; ++i) {
    const auto want = f.expected("train_raw_" + std::to_string(i));
    ASSERT_EQ(raw[i].sizes(), want.sizes());
    check_rel("train_raw_" + std::to_string(i), raw[i], want, 1e-4);
  }
  YoloxLoss loss(80);
  const auto [cells, strides] = loss.grid(raw);
  const auto out = loss.decode(loss.flatten(raw), cells, strides);
  const auto want = f.expected("train_output");
  ASSERT_EQ(out.sizes(), want.sizes());
  check_rel("train_output boxes", out.narrow(2, 0, 4), want.narrow(2, 0, 4), 1e-4);
  check_rel("train_output obj/cls logits", out.narrow(2, 4, 81), want.narrow(2, 4, 81), 1e-4);

  const std::string key = "backbone.backbone.stem.conv.bn.running_mean";
  torch::Tensor mean, before;
  for (const auto& [k, v] : models::state_dict(*f.model))
    if (k == key) mean = v;
  for (const auto& [k, v] : f.weights)
    if (k == key) before = v;
  check_rel("BN running mean after train forward", mean,
            f.expected("bn_running_mean_after_train_forward.backbone.backbone.stem.conv.bn"), 1e-4);
  EXPECT_GT((mean - before).abs().max().item<double>(), 1e-3);  // it really moved
}

// Scores are compared to 1e-4 relative, or, where this machine's float32 rounding is larger, to
// three times the largest relative error of ours against our float64 forward among the anchors
// that pass the threshold (the bound of the eval test above, taken score by score: a small
// probability's relative error is its logit's absolute error).
TEST(YoloxParity, PostprocessOfImageZero) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  f.model->eval();
  libreyolo::test::FoldSwitch unfolded(false);
  torch::NoGradGuard no_grad;
  const auto pred = f.model->predict_tensor(f.expected("input"))[0];
  f.model->to(torch::kDouble);
  const auto pred64 = f.model->predict_tensor(f.expected("input").to(torch::kDouble))[0];
  f.model->to(torch::kFloat);
  models::PostprocessArgs a;
  a.conf = f.expected("post_conf").item<double>();
  a.iou = 0.45;
  a.max_det = 300;
  a.geometry.sx = a.geometry.sy = f.expected("post_ratio").item<double>();
  const auto wh = f.expected("post_original_wh");
  a.geometry.orig_w = static_cast<int>(wh[0].item<double>());
  a.geometry.orig_h = static_cast<int>(wh[1].item<double>());
  const auto det = f.family->postprocess(pred, a);
  const auto wb = f.expected("post_boxes"), ws = f.expected("post_scores"), wc = f.expected("post_classes");
  ASSERT_GT(wb.size(0), 5);
  ASSERT_EQ(det.boxes.size(0), wb.size(0));
  const auto s32 = pred.narrow(0, 4, 80).to(torch::kDouble), s64 = pred64.narrow(0, 4, 80);
  const auto kept = s64 > a.conf;
  const double score_bound =
      std::max(1e-4, 3.0 * ((s32 - s64).abs() / s64).masked_select(kept).max().item<double>());
  std::printf("  score bound %.3g\n", score_bound);
  // As sets: every expected detection has its own match (class, box, score).
  const auto gb = det.boxes.accessor<float, 2>(), eb = wb.accessor<float, 2>();
  const auto gs = det.scores.accessor<float, 1>(), es = ws.accessor<float, 1>();
  const auto gc = det.classes.accessor<int64_t, 1>(), ec = wc.accessor<int64_t, 1>();
  std::vector<bool> used(det.boxes.size(0), false);
  int matched = 0;
  for (int64_t i = 0; i < wb.size(0); ++i) {
    for (int64_t j = 0; j < det.boxes.size(0); ++j) {
      if (used[j] || gc[j] != ec[i]) continue;
      bool same = std::abs(gs[j] - es[i]) <= score_bound * es[i];
      for (int k = 0; k < 4 && same; ++k) same = std::abs(gb[j][k] - eb[i][k]) <= 1e-3 * std::max(1.0f, std::abs(eb[i][k]));
      if (!same) continue;
      used[j] = true;
      ++matched;
      break;
    }
  }
  EXPECT_EQ(matched, wb.size(0));
  // Sorted by score, one label per anchor.
  EXPECT_TRUE(torch::equal(det.scores, std::get<0>(det.scores.sort(0, true))));
}

namespace {

struct LossRun {
  libreyolo::LossOutput out;
  libreyolo::loss::SimOtaAssignment assignment;
};

// The fixture's targets as the reference's assignment takes them: class -1 on padding rows.
torch::Tensor reference_gt(const Fixture& f, const std::string& targets_key, torch::Dtype dtype = torch::kFloat) {
  auto gt = f.expected(targets_key).to(dtype, /*non_blocking=*/false, /*copy=*/true);
  gt.select(2, 0).masked_fill_(gt.sum(2) <= 0, -1);
  return gt;
}

// `dtype` kDouble runs a float64 copy of the model (the measure of our own float32 rounding).
LossRun run_loss(Fixture& f, bool l1, const std::string& targets_key, torch::Dtype dtype = torch::kFloat) {
  f.model->train();
  f.model->to(dtype);
  YoloxLoss loss(80);
  loss.set_use_l1(l1);
  const auto x = f.expected("input").to(dtype);
  const auto raw = f.model->forward_raw(x);
  const auto t = to_library_targets(f.expected(targets_key), x.size(2), x.size(3)).to(dtype);
  LossRun r;
  r.out = loss.compute(raw, t, x.size(2), x.size(3));
  // The assignment of the same forward, with the fixture's targets as the reference takes them.
  const auto [cells, strides] = loss.grid(raw);
  r.assignment = loss.assign(loss.decode(loss.flatten(raw), cells, strides), reference_gt(f, targets_key, dtype), cells,
                             strides);
  return r;
}

void expect_loss(const LossRun& r, const Fixture& f, const std::string& prefix) {
  for (const char* t : {"total", "iou", "obj", "cls", "l1"}) {
    const auto want = f.expected(prefix + t + "_loss").reshape({1});
    const auto got = std::string(t) == "total" ? r.out.total.reshape({1}) : r.out.term(t).reshape({1});
    if (want.item<double>() == 0) {
      EXPECT_EQ(got.item<double>(), 0.0) << prefix << t;
    } else {
      check_rel(prefix + t + "_loss", got, want, 1e-4);
    }
  }
}

int check_grads(const Fixture& f, const std::string& prefix) {
  const auto params = f.model->named_parameters();
  int checked = 0;
  for (const auto& [key, value] : f.expect->dict) {
    const std::string name = key->as_string();
    if (name.rfind(prefix, 0) != 0) continue;
    const auto* p = params.find(name.substr(prefix.size()));
    EXPECT_NE(p, nullptr) << name;
    if (!p) continue;
    EXPECT_TRUE(p->grad().defined()) << name;
    if (!p->grad().defined()) continue;
    const double e = rel_err(p->grad(), value->tensor);
    EXPECT_LE(e, 1e-3) << name;
    std::printf("  %s rel err %.3g\n", name.c_str(), e);
    ++checked;
  }
  return checked;
}

}  // namespace

// The positives' IoUs are compared to 1e-5 relative, or, where this machine's float32 rounding of
// the forward is larger, to three times ours against our float64 run (the eval tests' bound). The
// IoU arithmetic alone is checked on the reference's own decoded forward, to float32 rounding.
TEST(YoloxParity, SimOtaAssignmentIsExact) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  const auto r64 = run_loss(f, false, "targets", torch::kDouble);
  const auto r = run_loss(f, false, "targets");
  EXPECT_TRUE(torch::equal(r.assignment.fg, f.expected("simota_fg_mask")));
  EXPECT_TRUE(torch::equal(r.assignment.matched_gt, f.expected("simota_matched_gt")));
  EXPECT_TRUE(torch::equal(r.assignment.dynamic_k, f.expected("simota_dynamic_k")));
  ASSERT_TRUE(torch::equal(r64.assignment.fg, r.assignment.fg));
  check_rel("simota_pred_iou", r.assignment.pred_iou, f.expected("simota_pred_iou"),
            std::max(1e-5, 3.0 * rel_err(r.assignment.pred_iou, r64.assignment.pred_iou)));
  {
    YoloxLoss loss(80);
    f.model->eval();
    torch::NoGradGuard no_grad;
    const auto raw = f.model->forward_raw(f.expected("input"));  // only the grid is taken from it
    const auto [cells, strides] = loss.grid(raw);
    const auto on_ref = loss.assign(f.expected("train_output"), reference_gt(f, "targets"), cells, strides);
    EXPECT_TRUE(torch::equal(on_ref.fg, f.expected("simota_fg_mask")));
    EXPECT_TRUE(torch::equal(on_ref.matched_gt, f.expected("simota_matched_gt")));
    check_rel("simota_pred_iou on the reference's forward", on_ref.pred_iou, f.expected("simota_pred_iou"), 1e-6);
  }
  EXPECT_EQ(r.assignment.fg.sum().item<int64_t>(), 10);
  EXPECT_NEAR(r.out.num_fg.item<double>(), 10.0 / 2, 1e-9);  // positives per image
}

TEST(YoloxParity, LossL1OffAndGradients) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  const auto r = run_loss(f, false, "targets");
  expect_loss(r, f, "loss_");
  // The assignment inside compute() (library targets) equals the fixture's one.
  EXPECT_NEAR(r.out.total.item<double>(), 16.126787, 16.126787 * 1e-4);
  r.out.total.backward();
  EXPECT_EQ(check_grads(f, "grad."), 5);
}

TEST(YoloxParity, LossL1OnAndGradients) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  const auto r = run_loss(f, true, "targets");
  expect_loss(r, f, "loss_l1on_");
  EXPECT_GT(r.out.term("l1").item<double>(), 1.0);
  r.out.total.backward();
  EXPECT_EQ(check_grads(f, "grad_l1on."), 5);
}

TEST(YoloxParity, LossWithABackgroundImage) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  const auto r = run_loss(f, false, "targets_bg");
  expect_loss(r, f, "loss_bg_");
  // Image 1 has no GT: no positives there.
  EXPECT_EQ(r.assignment.fg[1].sum().item<int64_t>(), 0);
}
