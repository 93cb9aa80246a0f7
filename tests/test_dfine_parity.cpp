// D-FINE parity with LibreYOLO 1.6.0 on the CPU, from tests/data/dfine_narrow*_nc20_s320
// (tests/python/make_dfine_fixture.py): a narrow three-level network (learnable affine blocks,
// light HG blocks, encoder width 48 over a decoder width 32, 3/6/3 sampling points) and a narrow
// two-level one (size n's layout). The weights load strictly into networks built from their
// shapes; the eval forward (query selection from the anchor buffers, predictions, postprocessed
// detections of both networks); the FDR primitives; the training-mode forward without and with
// (recorded) denoising queries: every layer's logits, boxes, corner logits and references, layer
// 0's own prediction and the encoder's top-k; every loss term of D-FINE's criterion (VFL, L1, GIoU,
// FGL, DDF on every level, GO-LSD's union matching) and 23 gradients.
//
// Bounds: float32 against the reference's float32 summed in other orders (convolutions, matrix
// products, reductions over up to 2100 tokens), a few float32 epsilons a step that the deformable
// sampling and three decoder layers amplify to about 1e-6 of the largest value: 1e-4 leaves two
// orders of magnitude on any x86-64 CPU, as for RT-DETR's parity; the same for each loss term (sums
// of the same outputs). Gradients pass back through the whole network once more: 1e-3 (1e-2 for a
// one-value parameter, whose gradient is a sum over a whole map with cancellation; 4.7e-4 seen).
// The FDR primitives alone are a softmax and a dot product: 1e-5.
#include <map>

#include "families/rtdetr/dfine.hpp"
#include "families/rtdetr/dfine_loss.hpp"
#include "io/pickle.hpp"
#include "models/detector.hpp"
#include "rtdetr_fixture.hpp"
#include "support.hpp"

using libreyolo::test::check_rel;
namespace models = libreyolo::models;
namespace rtdetr = libreyolo::models::rtdetr;

namespace {

constexpr double kEvalBound = 1e-4;
constexpr double kPrimitiveBound = 1e-5;
constexpr double kLossBound = 1e-4;
constexpr double kGradBound = 1e-3;
constexpr int kClasses = 20;

struct Fixture {
  libreyolo::io::PyValuePtr expect;
  libreyolo::io::StateDict weights, weights2;
  rtdetr::DfineConfig cfg, cfg2;

  torch::Tensor expected(const std::string& key) const {
    auto v = expect->get(key);
    if (!v || !v->is_tensor()) throw std::runtime_error("fixture lacks tensor " + key);
    return v->tensor;
  }
  torch::Tensor input() const { return expected("input_u8").to(torch::kFloat) / 255.0; }
  std::vector<rtdetr::ImageTargets> targets() const {
    std::vector<rtdetr::ImageTargets> t;
    for (int b = 0; b < 2; ++b) {
      const std::string p = "targets.img" + std::to_string(b) + ".";
      t.push_back({expected(p + "labels"), expected(p + "boxes")});
    }
    return t;
  }
  std::shared_ptr<rtdetr::DfineModel> model(bool second = false) const {
    auto m = std::make_shared<rtdetr::DfineModel>(second ? cfg2 : cfg);
    models::load_state_dict(*m, second ? weights2 : weights, /*strict=*/true);
    m->eval();
    return m;
  }
};

libreyolo::io::StateDict checkpoint_weights(const std::string& path) {
  const auto ckpt = libreyolo::io::load_torch_file(path);
  return libreyolo::io::to_state_dict(*ckpt->get("model"));
}

const Fixture& fixture() {
  static const Fixture f = [] {
    const std::string dir = std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/";
    Fixture x;
    x.expect = libreyolo::io::load_torch_file(dir + "dfine_narrow_nc20_s320_expect.pt");
    x.weights = checkpoint_weights(dir + "dfine_narrow_nc20_s320.pt");
    x.weights2 = checkpoint_weights(dir + "dfine_narrow2_nc20_s320.pt");
    const auto c = rtdetr::dfine_config_from_state_dict(x.weights);
    const auto c2 = rtdetr::dfine_config_from_state_dict(x.weights2);
    if (!c || !c2) throw std::runtime_error("the fixture's weights do not describe a D-FINE network");
    x.cfg = *c;
    x.cfg2 = *c2;
    return x;
  }();
  return f;
}

void expect_eval(const std::string& tag, bool second) {
  const auto& f = fixture();
  auto m = f.model(second);
  torch::NoGradGuard no_grad;
  const auto t = m->forward_trace(f.input());
  EXPECT_TRUE(torch::equal(t.selection.topk_ind, f.expected(tag + ".topk_ind"))) << tag;
  check_rel(tag + " anchors", m->decoder->anchors, f.expected(tag + ".anchors"), 1e-6);
  EXPECT_TRUE(torch::equal(m->decoder->valid_mask, f.expected(tag + ".valid_mask")));
  check_rel(tag + " topk_logits", t.selection.topk_logits, f.expected(tag + ".topk_logits"), kEvalBound);
  check_rel(tag + " pred_logits", t.pred_logits, f.expected(tag + ".pred_logits"), kEvalBound);
  check_rel(tag + " pred_boxes", t.pred_boxes, f.expected(tag + ".pred_boxes"), kEvalBound);
  // Image 0's detections through the family's decode and postprocess, at an original size of
  // 400 x 300 (the stretch's scales 320/400 and 320/300).
  const auto raw = m->forward_raw(f.input());
  const auto pred = m->decode(raw)[0];
  models::PostprocessArgs args;
  args.conf = 0.05;
  args.max_det = 30;
  args.geometry = {320.0 / 400.0, 320.0 / 300.0, 300, 400};
  const auto* fam = models::find_family("dfine");
  ASSERT_NE(fam, nullptr);
  const auto d = fam->postprocess(pred, args);
  const auto want = libreyolo::test::detections(f.expected(tag + ".det.boxes"), f.expected(tag + ".det.scores"),
                                                f.expected(tag + ".det.classes"));
  ASSERT_FALSE(want.empty());
  libreyolo::test::expect_same_detections(libreyolo::test::detections(d.boxes, d.scores, d.classes), want, tag,
                                          1e-4, 1e-2);
}

// One recorded level (logits, boxes and, where recorded, corners and references) against ours,
// with the matching queries in the reference's order when `order` is given.
void expect_level(const Fixture& f, const std::string& key, const torch::Tensor& logits, const torch::Tensor& boxes,
                  const torch::Tensor& corners, const torch::Tensor& refs, const torch::Tensor& order) {
  const auto want = [&](const std::string& k) {
    const auto w = f.expected(key + "." + k);
    return order.defined() ? libreyolo::test::in_order(w, order) : w;
  };
  check_rel(key + " logits", logits, want("pred_logits"), kEvalBound);
  check_rel(key + " boxes", boxes, want("pred_boxes"), kEvalBound);
  if (corners.defined()) check_rel(key + " corners", corners, want("pred_corners"), kEvalBound);
  if (refs.defined()) check_rel(key + " refs", refs, want("ref_points"), kEvalBound);
}

void expect_train(const std::string& tag, const rtdetr::DfineTrainOutputs& t) {
  const auto& f = fixture();
  const std::string r = "train_" + tag;
  const auto order = libreyolo::test::recorded_query_order(t.enc_topk_boxes, t.enc_topk_logits,
                                                           f.expected(r + ".enc_aux_outputs.0.pred_boxes"),
                                                           f.expected(r + ".enc_aux_outputs.0.pred_logits"), kEvalBound);
  const auto& mo = t.matching;
  ASSERT_EQ(mo.logits.size(), 3u);
  expect_level(f, r, mo.logits[2], mo.boxes[2], mo.corners[2], mo.refs[2], order);
  for (size_t l = 0; l < 2; ++l)
    expect_level(f, r + ".aux_outputs." + std::to_string(l), mo.logits[l], mo.boxes[l], mo.corners[l], mo.refs[l],
                 order);
  expect_level(f, r + ".pre_outputs", mo.pre_logits, mo.pre_boxes, {}, {}, order);
  if (!t.denoising) return;
  ASSERT_EQ(t.dn.logits.size(), 3u);
  for (size_t l = 0; l < 3; ++l)
    expect_level(f, r + ".dn_outputs." + std::to_string(l), t.dn.logits[l], t.dn.boxes[l], t.dn.corners[l],
                 t.dn.refs[l], {});
  expect_level(f, r + ".dn_pre_outputs", t.dn.pre_logits, t.dn.pre_boxes, {}, {}, {});
}

// Every recorded term under loss_<tag> against ours by name (the same names on both sides), then
// the recorded gradients under grad_<tag> after the total's backward.
void expect_loss_and_gradients(const std::string& tag, rtdetr::DfineModel& model,
                               const libreyolo::loss::DfineLossTerms& t) {
  const auto& f = fixture();
  size_t recorded = 0;
  double worst = 0;
  std::vector<std::string> ours = t.names;
  for (const auto& [key, value] : f.expect->dict) {
    const std::string name = key->as_string();
    const std::string prefix = "loss_" + tag + ".";
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string term = name.substr(prefix.size());
    ++recorded;
    const auto it = std::find(ours.begin(), ours.end(), term);
    if (it == ours.end()) {
      ADD_FAILURE() << "no term " << term;
      continue;
    }
    ours.erase(it);
    const double want = value->tensor.item<double>(), have = t.value(term).item<double>();
    const double e = std::abs(have - want) / std::max(std::abs(want), 1e-6);
    EXPECT_LE(e, kLossBound) << term << ": " << have << " vs " << want;
    worst = std::max(worst, e);
  }
  EXPECT_TRUE(ours.empty()) << ours.size() << " terms the reference does not have, first " << ours.front();
  EXPECT_EQ(recorded, t.names.size());
  std::printf("  loss_%-6s %zu terms, total %.6f, worst rel err %.3g\n", tag.c_str(), recorded,
              t.total.item<double>(), worst);
  t.total.backward();
  std::map<std::string, torch::Tensor> params;
  for (const auto& p : model.named_parameters()) params[p.key()] = p.value();
  int checked = 0;
  for (const auto& [key, value] : f.expect->dict) {
    const std::string name = key->as_string();
    const std::string prefix = "grad_" + tag + ".";
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string param = name.substr(prefix.size());
    ASSERT_TRUE(params.count(param)) << param;
    const auto& g = params[param].grad();
    if (value->tensor.numel() == 0) {
      EXPECT_TRUE(!g.defined() || g.abs().max().item<double>() == 0) << param;
    } else {
      ASSERT_TRUE(g.defined()) << param;
      // A one-value parameter (a learnable affine block's scale) sums its gradient over a whole
      // activation map, with cancellation: ten times the bound.
      check_rel("grad " + param, g, value->tensor, value->tensor.numel() == 1 ? 10 * kGradBound : kGradBound);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 23);
}

}  // namespace

TEST(DfineParity, LossAndGradientsWithoutDenoising) {
  auto m = fixture().model();
  m->train();
  const auto out = m->forward_train_outputs(fixture().input());
  const libreyolo::loss::DfineLoss criterion(kClasses);
  const auto t = criterion.terms(out, fixture().targets());
  EXPECT_EQ(t.names.size(), 20u);
  expect_loss_and_gradients("nodn", *m, t);
}

TEST(DfineParity, LossAndGradientsWithRecordedDenoising) {
  const auto& f = fixture();
  auto m = f.model();
  m->train();
  rtdetr::DenoisingDraws d{f.expected("cdn.rand_label_u"), f.expected("cdn.rand_new_label"),
                           f.expected("cdn.rand_sign_bits"), f.expected("cdn.rand_part_u")};
  m->set_denoising_source([d](int64_t, int64_t, int64_t, const torch::Device&) { return d; });
  const auto out = m->forward_train_outputs(f.input(), f.targets());
  // Through the flat layout the trainer uses.
  const auto back = rtdetr::unpack_dfine_outputs(rtdetr::pack_dfine_outputs(out, 320, 320));
  const libreyolo::loss::DfineLoss criterion(kClasses);
  const auto t = criterion.terms(back, f.targets());
  EXPECT_EQ(t.names.size(), 20u + 3 * 5 + 3);
  expect_loss_and_gradients("dn", *m, t);
}

TEST(DfineParity, WeightsLoadIntoNetworksBuiltFromTheirShapes) {
  const auto& f = fixture();
  EXPECT_EQ(f.cfg.levels, 3);
  EXPECT_EQ(f.cfg.hidden, 48);
  EXPECT_EQ(f.cfg.dec_hidden, 32);
  EXPECT_EQ(f.cfg.points, (std::vector<int64_t>{3, 6, 3}));
  EXPECT_EQ(f.cfg.nc, kClasses);
  EXPECT_EQ(f.cfg.anchor_size, 320);
  EXPECT_TRUE(f.cfg.hgnet.lab);
  EXPECT_EQ(f.cfg.size, "");
  EXPECT_EQ(f.cfg2.levels, 2);
  EXPECT_EQ(f.cfg2.points, (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(f.cfg2.anchor_size, 320);
  // Strict loading: every key and shape agrees.
  EXPECT_NO_THROW(f.model());
  EXPECT_NO_THROW(f.model(true));
  EXPECT_EQ(models::detect_family(f.weights), models::find_family("dfine"));
}

TEST(DfineParity, EvalForwardThreeLevels) { expect_eval("eval", false); }

TEST(DfineParity, EvalForwardTwoLevels) { expect_eval("eval2", true); }

TEST(DfineParity, FdrPrimitives) {
  const auto& f = fixture();
  const auto up = torch::full({1}, 0.5f);
  check_rel("W(n) reg_scale 4", rtdetr::weighting_function(32, up, torch::full({1}, 4.0f)),
            f.expected("fdr.project_4"), kPrimitiveBound);
  check_rel("W(n) reg_scale 8", rtdetr::weighting_function(32, up, torch::full({1}, 8.0f)),
            f.expected("fdr.project_8"), kPrimitiveBound);
  const auto rs = torch::full({1}, 4.0f);
  const auto dist = rtdetr::fdr_integral(f.expected("fdr.corners"), rtdetr::weighting_function(32, up, rs), 32);
  check_rel("integral", dist, f.expected("fdr.integral"), kPrimitiveBound);
  check_rel("edge decoding", rtdetr::distance_to_box(f.expected("fdr.refs"), f.expected("fdr.integral"), rs),
            f.expected("fdr.boxes"), kPrimitiveBound);
}

TEST(DfineParity, TrainingOutputsWithoutDenoising) {
  auto m = fixture().model();
  m->train();
  torch::NoGradGuard no_grad;
  const auto t = m->forward_train_outputs(fixture().input());
  EXPECT_FALSE(t.denoising.has_value());
  expect_train("nodn", t);
}

TEST(DfineParity, TrainingOutputsWithRecordedDenoising) {
  const auto& f = fixture();
  auto m = f.model();
  m->train();
  rtdetr::DenoisingDraws d{f.expected("cdn.rand_label_u"), f.expected("cdn.rand_new_label"),
                           f.expected("cdn.rand_sign_bits"), f.expected("cdn.rand_part_u")};
  m->set_denoising_source([d](int64_t b, int64_t n, int64_t, const torch::Device&) {
    if (d.label_u.size(0) != b || d.label_u.size(1) != n) throw std::runtime_error("recorded draws of another shape");
    return d;
  });
  torch::NoGradGuard no_grad;
  const auto t = m->forward_train_outputs(f.input(), f.targets());
  ASSERT_TRUE(t.denoising.has_value());
  EXPECT_EQ(t.denoising->groups, f.expected("cdn.num_group").item<int64_t>());
  expect_train("dn", t);
}
