// RT-DETR's HGNetv2 backbone (sizes l and x) against the reference's: a narrow network of every
// kind of part (tests/data/hgnetv2_reference.pt, made by tests/python/make_hgnetv2_fixture.py)
// in eval and training mode, the BatchNorm statistics one training forward leaves, the stage table
// read back from the weights, the frozen-norm build and the initialisation.
#include <cmath>

#include "families/rtdetr/hgnetv2.hpp"
#include "io/pickle.hpp"
#include "models/detector.hpp"
#include "support.hpp"

namespace io = libreyolo::io;
namespace models = libreyolo::models;
namespace rtdetr = libreyolo::models::rtdetr;
using libreyolo::test::rel_err;

namespace {

io::PyValuePtr fixture() {
  static io::PyValuePtr root =
      io::load_torch_file(std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/hgnetv2_reference.pt");
  return root;
}

torch::Tensor tensor(const std::string& key) {
  auto v = fixture()->get(key);
  if (!v || !v->is_tensor()) throw std::runtime_error("fixture has no tensor " + key);
  return v->tensor;
}

// The fixture's stage table.
rtdetr::HgNetSpec fixture_spec() {
  rtdetr::HgNetSpec spec;
  const auto stem = tensor("stem"), stages = tensor("stages");
  spec.stem_mid = stem[0].item<int64_t>();
  spec.stem_out = stem[1].item<int64_t>();
  for (int i = 0; i < 4; ++i) {
    const auto r = stages[i];
    EXPECT_EQ(r[0].item<int64_t>(), spec.stage_in(i)) << "stage " << i << " input width";
    auto& s = spec.stages[static_cast<size_t>(i)];
    s.mid = r[1].item<int64_t>();
    s.out = r[2].item<int64_t>();
    s.blocks = static_cast<int>(r[3].item<int64_t>());
    s.downsample = r[4].item<int64_t>() != 0;
    s.light = r[5].item<int64_t>() != 0;
    s.kernel = static_cast<int>(r[6].item<int64_t>());
    s.layers = static_cast<int>(r[7].item<int64_t>());
  }
  return spec;
}

// The backbone's tensors (the fixture's "stem.*" and "stages.*"), under `prefix`.
io::StateDict weights(const std::string& prefix = "", bool with_counters = true) {
  io::StateDict sd;
  for (const auto& [k, v] : fixture()->dict) {
    if (!k->is_string() || !(k->s.rfind("stem.", 0) == 0 || k->s.rfind("stages.", 0) == 0)) continue;
    if (!with_counters && k->s.size() >= 19 && k->s.substr(k->s.size() - 19) == "num_batches_tracked") continue;
    sd.emplace_back(prefix + k->s, v->tensor.clone());
  }
  return sd;
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what, double tol = 1e-4) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double e = rel_err(got, want);
  EXPECT_LT(e, tol) << what;
  std::printf("  %s: relative error %.3g\n", what.c_str(), e);
}

}  // namespace

TEST(RtdetrHgnetv2, NarrowTableCoversEveryPart) {
  const auto spec = fixture_spec();
  bool plain = false, light = false, residual_plain = false, residual_light = false, down = false, flat = false;
  for (const auto& s : spec.stages) {
    (s.light ? light : plain) = true;
    if (s.blocks > 1) (s.light ? residual_light : residual_plain) = true;
    (s.downsample ? down : flat) = true;
  }
  EXPECT_TRUE(plain && light && residual_plain && residual_light && down && flat);
}

TEST(RtdetrHgnetv2, StageTableIsReadBackFromTheWeights) {
  const auto spec = rtdetr::hgnet_from_state_dict(weights("backbone."));
  ASSERT_TRUE(spec.has_value());
  EXPECT_TRUE(*spec == fixture_spec());
  // The l and x tables from builds of them.
  for (const auto* want : {&rtdetr::hgnetv2_l(), &rtdetr::hgnetv2_x()}) {
    rtdetr::HGNetv2 net(*want, /*frozen_norm=*/true);
    io::StateDict sd;
    for (const auto& [k, v] : models::state_dict(*net)) sd.emplace_back("backbone." + k, v);
    const auto back = rtdetr::hgnet_from_state_dict(sd);
    ASSERT_TRUE(back.has_value());
    EXPECT_TRUE(*back == *want);
  }
  EXPECT_FALSE(rtdetr::hgnet_from_state_dict(weights()).has_value());  // no "backbone." prefix
}

TEST(RtdetrHgnetv2, OutputsMatchTheReferenceInBothModes) {
  rtdetr::HGNetv2 net(fixture_spec(), /*frozen_norm=*/false);
  models::load_state_dict(*net, weights(), /*strict=*/true);
  const auto x = tensor("input");
  torch::NoGradGuard ng;
  net->eval();
  const auto eval = net->forward(x);
  for (int i = 0; i < 3; ++i)
    expect_close(eval[i], tensor("eval_" + std::to_string(i)), "eval stage " + std::to_string(i + 1));
  // Training mode: batch statistics, and the running statistics updated as the reference's.
  net->train();
  const auto train = net->forward(x);
  for (int i = 0; i < 3; ++i)
    expect_close(train[i], tensor("train_" + std::to_string(i)), "train stage " + std::to_string(i + 1));
  EXPECT_GT(rel_err(train[2], eval[2]), 1e-2);  // the modes differ, so both are tested
  int buffers = 0;
  double worst = 0;
  for (const auto& [k, v] : models::state_dict(*net)) {
    const bool stat = k.find("running_") != std::string::npos || k.find("num_batches_tracked") != std::string::npos;
    if (!stat) continue;
    const auto want = tensor("after_train." + k);
    ASSERT_EQ(v.sizes(), want.sizes()) << k;
    if (v.scalar_type() == torch::kLong) {
      EXPECT_TRUE(torch::equal(v, want)) << k;
    } else {
      const double e = rel_err(v, want);
      EXPECT_LT(e, 1e-4) << k;
      worst = std::max(worst, e);
    }
    ++buffers;
  }
  std::printf("  BatchNorm buffers after the training forward: %d, worst relative error %.3g\n", buffers, worst);
  int recorded = 0;
  for (const auto& kv : fixture()->dict)
    if (kv.first->is_string() && kv.first->s.rfind("after_train.", 0) == 0) ++recorded;
  EXPECT_EQ(buffers, recorded);
  EXPECT_EQ(buffers, 3 * 44);  // running mean, variance and count of each of the 44 norms
}

TEST(RtdetrHgnetv2, FrozenNormsGiveTheEvalOutputs) {
  rtdetr::HGNetv2 net(fixture_spec(), /*frozen_norm=*/true);
  // No num_batches_tracked; the rest loads strictly, the BatchNorm affine and statistics as buffers.
  models::load_state_dict(*net, weights("", /*with_counters=*/false), /*strict=*/true);
  for (const auto& p : net->named_parameters()) EXPECT_EQ(p.key().find(".bn."), std::string::npos) << p.key();
  torch::NoGradGuard ng;
  net->train();  // frozen norms ignore the mode
  const auto y = net->forward(tensor("input"));
  for (int i = 0; i < 3; ++i)
    expect_close(y[i], tensor("eval_" + std::to_string(i)), "frozen stage " + std::to_string(i + 1));
}

TEST(RtdetrHgnetv2, Initialisation) {
  torch::manual_seed(0);
  rtdetr::HGNetv2 net(rtdetr::hgnetv2_l(), /*frozen_norm=*/false);
  // Kaiming-normal, fan in, ReLU gain: std sqrt(2 / fan_in), mean 0.
  const auto& w = net->stages[3]->blocks[0]->squeeze->conv->weight;  // 1x1, fan in 1024 + 6 * 384
  const double fan_in = static_cast<double>(w.size(1));
  EXPECT_NEAR(w.std().item<double>(), std::sqrt(2.0 / fan_in), 0.02 * std::sqrt(2.0 / fan_in));
  EXPECT_NEAR(w.mean().item<double>(), 0.0, 0.05 * std::sqrt(2.0 / fan_in));
  const auto& dw = net->stages[2]->blocks[0]->light[0]->conv2->conv->weight;  // depthwise 5x5: fan in 25
  EXPECT_EQ(dw.sizes(), (std::vector<int64_t>{192, 1, 5, 5}));
  EXPECT_NEAR(dw.std().item<double>(), std::sqrt(2.0 / 25.0), 0.05 * std::sqrt(2.0 / 25.0));
  for (const auto& p : net->named_parameters()) {
    const bool weight = p.key().find(".bn.weight") != std::string::npos;
    const bool bias = p.key().find(".bn.bias") != std::string::npos;
    if (weight) EXPECT_TRUE(torch::all(p.value() == 1).item<bool>()) << p.key();
    if (bias) EXPECT_TRUE(torch::all(p.value() == 0).item<bool>()) << p.key();
  }
}
