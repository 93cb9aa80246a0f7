// D-FINE and DEIM parity with LibreYOLO 1.6.0 on the CPU, from tests/data/dfine_narrow*_nc20_s320
// and tests/data/deim_narrow_nc20_s320 (tests/python/make_dfine_fixture.py, --family deim: the
// same network from the reference's DEIM modules, SiLU in the decoder, its criterion's
// matchability-aware class term in place of VFL): a narrow three-level network (learnable affine blocks,
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
// of the same outputs). Gradients pass back through the whole network once more: 1e-3, or twice
// the sum of both sides' measured float32 errors where that is larger (see
// expect_loss_and_gradients).
// The FDR primitives alone are a softmax and a dot product: 1e-5.
#include <map>

#include "families/rtdetr/dfine.hpp"
#include "families/rtdetr/dfine_loss.hpp"
#include "io/pickle.hpp"
#include "models/detector.hpp"
#include "rtdetr_fixture.hpp"
#include "fold_check.hpp"
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
  std::string family;  // dfine or deim
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
  // Built as the family builds a network for these weights (DEIM's decoder activations included).
  std::shared_ptr<rtdetr::DfineModel> model(bool second = false) const {
    auto built = models::find_family(family)->build_like(second ? weights2 : weights, 0);
    auto m = std::dynamic_pointer_cast<rtdetr::DfineModel>(built);
    if (!m) throw std::runtime_error(family + " does not build a D-FINE-line network");
    models::load_state_dict(*m, second ? weights2 : weights, /*strict=*/true);
    m->eval();
    return m;
  }
};

libreyolo::io::StateDict checkpoint_weights(const std::string& path) {
  const auto ckpt = libreyolo::io::load_torch_file(path);
  return libreyolo::io::to_state_dict(*ckpt->get("model"));
}

Fixture load_fixture(const std::string& family) {
  const std::string dir = std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/" + family;
  Fixture x;
  x.family = family;
  x.expect = libreyolo::io::load_torch_file(dir + "_narrow_nc20_s320_expect.pt");
  x.weights = checkpoint_weights(dir + "_narrow_nc20_s320.pt");
  const auto c = rtdetr::dfine_config_from_state_dict(x.weights);
  if (!c) throw std::runtime_error("the fixture's weights do not describe a D-FINE network");
  x.cfg = *c;
  if (family == "dfine") {  // the two-level layout: D-FINE's fixture only
    x.weights2 = checkpoint_weights(dir + "_narrow2_nc20_s320.pt");
    const auto c2 = rtdetr::dfine_config_from_state_dict(x.weights2);
    if (!c2) throw std::runtime_error("the fixture's weights do not describe a D-FINE network");
    x.cfg2 = *c2;
  }
  return x;
}

const Fixture& fixture(const std::string& family = "dfine") {
  static const Fixture dfine = load_fixture("dfine");
  static const Fixture deim = load_fixture("deim");
  return family == "deim" ? deim : dfine;
}

// The family's criterion: D-FINE's, or DEIM's (the mal class term).
libreyolo::loss::DfineLoss criterion_of(const std::string& family) {
  return libreyolo::loss::DfineLoss(kClasses, family == "deim" ? libreyolo::loss::deim_loss_weights()
                                                                : libreyolo::loss::DfineLossWeights{});
}

void expect_eval(const Fixture& f, const std::string& tag, bool second) {
  auto m = f.model(second);
  torch::NoGradGuard no_grad;
  const libreyolo::test::FoldSwitch unfolded(false);  // the reference's op order (top-k scores 6e-6 apart)
  // The selection, up to swaps of near-equal scores; then everything after it on the reference's.
  const auto want_ind = f.expected(tag + ".topk_ind");
  const auto own = m->forward_trace(f.input()).selection;
  libreyolo::test::expect_same_selection(own.topk_ind, want_ind, std::get<0>(own.enc_logits.max(-1)),
                                         std::get<0>(f.expected(tag + ".topk_logits").max(-1)), tag + " topk_ind");
  m->decoder->forced_topk_ind = want_ind;
  const auto t = m->forward_trace(f.input());
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
  const auto* fam = models::find_family(f.family);
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

void expect_train(const Fixture& f, const std::string& tag, const rtdetr::DfineTrainOutputs& t) {
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

using Gradients = std::map<std::string, torch::Tensor>;

// Our network's gradients in float64 for the same inputs (and, with `draws`, the same denoising
// queries): the measure of our own float32 rounding on this machine. The queries are the ones our
// float32 forward selects (near-equal encoder scores may be ordered otherwise in float64).
Gradients float64_gradients(const Fixture& f, const std::optional<rtdetr::DenoisingDraws>& draws) {
  torch::Tensor selected;
  {
    auto m = f.model();
    m->train();
    torch::NoGradGuard no_grad;
    selected = m->forward_trace(f.input()).selection.topk_ind;
  }
  auto m = f.model();
  m->to(torch::kDouble);
  m->train();
  m->decoder->forced_topk_ind = selected;
  auto targets = f.targets();
  for (auto& t : targets) t.boxes = t.boxes.to(torch::kDouble);
  if (draws) m->set_denoising_source([d = *draws](int64_t, int64_t, int64_t, const torch::Device&) { return d; });
  const auto out = m->forward_train_outputs(f.input().to(torch::kDouble), draws ? targets : std::vector<rtdetr::ImageTargets>{});
  criterion_of(f.family).terms(out, targets).total.backward();
  Gradients g;
  for (const auto& p : m->named_parameters())
    if (p.value().grad().defined()) g[p.key()] = p.value().grad();
  return g;
}

// Every recorded term under loss_<tag> against ours by name (the same names on both sides), then
// the recorded gradients under grad_<tag> after the total's backward.
void expect_loss_and_gradients(const Fixture& f, const std::string& tag, rtdetr::DfineModel& model,
                               const libreyolo::loss::DfineLossTerms& t, const Gradients& own64) {
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
      // Ours and the fixture each carry their own float32 rounding, large where a gradient sums a
      // whole map with cancellation (a learnable affine block's one-value scale: up to 5e-2 in the
      // fixture) or passes back through every layer (the stem): ours is measured against our
      // float64 run, the fixture's against the reference's float64 run (ref_f32_err_grad_*,
      // recorded by the maker). The bound is twice their sum, and not below 1e-3.
      ASSERT_TRUE(own64.count(param)) << param << " has no float64 gradient";
      const double own = libreyolo::test::rel_err(g, own64.at(param));
      const double ref = f.expected("ref_f32_err_grad_" + tag + "." + param).item<double>();
      check_rel("grad " + param, g, value->tensor, std::max(kGradBound, 2 * (own + ref)));
      std::printf("    float32 errors: ours %.3g, the fixture's %.3g\n", own, ref);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 23);
}

}  // namespace

// Every test of the D-FINE line's parity, for D-FINE and for DEIM.
class DfineLineParity : public ::testing::TestWithParam<std::string> {
 protected:
  const Fixture& f() const { return fixture(GetParam()); }
};

TEST_P(DfineLineParity, LossAndGradientsWithoutDenoising) {
  auto m = f().model();
  m->train();
  const auto out = m->forward_train_outputs(f().input());
  const auto criterion = criterion_of(GetParam());
  const auto t = criterion.terms(out, f().targets());
  EXPECT_EQ(t.names.size(), 20u);
  EXPECT_EQ(t.names.front(), GetParam() == "deim" ? "loss_mal" : "loss_vfl");
  expect_loss_and_gradients(f(), "nodn", *m, t, float64_gradients(f(), std::nullopt));
}

TEST_P(DfineLineParity, LossAndGradientsWithRecordedDenoising) {
  auto m = f().model();
  m->train();
  rtdetr::DenoisingDraws d{f().expected("cdn.rand_label_u"), f().expected("cdn.rand_new_label"),
                           f().expected("cdn.rand_sign_bits"), f().expected("cdn.rand_part_u")};
  m->set_denoising_source([d](int64_t, int64_t, int64_t, const torch::Device&) { return d; });
  const auto out = m->forward_train_outputs(f().input(), f().targets());
  // Through the flat layout the trainer uses.
  const auto back = rtdetr::unpack_dfine_outputs(rtdetr::pack_dfine_outputs(out, 320, 320));
  const auto criterion = criterion_of(GetParam());
  const auto t = criterion.terms(back, f().targets());
  EXPECT_EQ(t.names.size(), 20u + 3 * 5 + 3);
  expect_loss_and_gradients(f(), "dn", *m, t, float64_gradients(f(), d));
}

TEST_P(DfineLineParity, WeightsLoadIntoNetworksBuiltFromTheirShapes) {
  const auto& x = f();
  EXPECT_EQ(x.cfg.levels, 3);
  EXPECT_EQ(x.cfg.hidden, 48);
  EXPECT_EQ(x.cfg.dec_hidden, 32);
  EXPECT_EQ(x.cfg.points, (std::vector<int64_t>{3, 6, 3}));
  EXPECT_EQ(x.cfg.nc, kClasses);
  EXPECT_EQ(x.cfg.anchor_size, 320);
  EXPECT_TRUE(x.cfg.hgnet.lab);
  EXPECT_EQ(x.cfg.size, "");
  // Strict loading: every key and shape agrees; the family builds its decoder's activation.
  EXPECT_EQ(x.model()->config().silu, GetParam() == "deim");
  // The weights alone are D-FINE's (the checkpoint's model_family tells DEIM's apart).
  EXPECT_EQ(models::detect_family(x.weights), models::find_family("dfine"));
}

TEST(DfineParity, TwoLevelNetworkLoadsAndEvaluates) {
  const auto& f = fixture();
  EXPECT_EQ(f.cfg2.levels, 2);
  EXPECT_EQ(f.cfg2.points, (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(f.cfg2.anchor_size, 320);
  EXPECT_NO_THROW(f.model(true));
  expect_eval(f, "eval2", true);
}

TEST_P(DfineLineParity, EvalForwardThreeLevels) { expect_eval(f(), "eval", false); }

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

TEST_P(DfineLineParity, TrainingOutputsWithoutDenoising) {
  auto m = f().model();
  m->train();
  torch::NoGradGuard no_grad;
  const auto t = m->forward_train_outputs(f().input());
  EXPECT_FALSE(t.denoising.has_value());
  expect_train(f(), "nodn", t);
}

TEST_P(DfineLineParity, TrainingOutputsWithRecordedDenoising) {
  auto m = f().model();
  m->train();
  rtdetr::DenoisingDraws d{f().expected("cdn.rand_label_u"), f().expected("cdn.rand_new_label"),
                           f().expected("cdn.rand_sign_bits"), f().expected("cdn.rand_part_u")};
  m->set_denoising_source([d](int64_t b, int64_t n, int64_t, const torch::Device&) {
    if (d.label_u.size(0) != b || d.label_u.size(1) != n) throw std::runtime_error("recorded draws of another shape");
    return d;
  });
  torch::NoGradGuard no_grad;
  const auto t = m->forward_train_outputs(f().input(), f().targets());
  ASSERT_TRUE(t.denoising.has_value());
  EXPECT_EQ(t.denoising->groups, f().expected("cdn.num_group").item<int64_t>());
  expect_train(f(), "dn", t);
}

INSTANTIATE_TEST_SUITE_P(Families, DfineLineParity, ::testing::Values("dfine", "deim"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });
