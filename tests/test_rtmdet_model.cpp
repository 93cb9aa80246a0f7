// RTMDet network structure and its registry entry: state-dict names, shapes and dtypes of every
// size against LibreYOLO 1.6.0's (tests/data/rtmdet_state_dict_<size>_nc80.tsv), the head's
// shared convolutions, the parameter counts, the widths, depths and class count read back from
// weights, recognition of LibreYOLO's and upstream mmdetection's key names, model names, the input
// convention, the initialisation and class-count change, the decode's geometry and order, and the
// per-level multi-label postprocess.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "families/rtmdet/model.hpp"
#include "libreyolo/errors.hpp"
#include "libreyolo/libreyolo.hpp"
#include "loss/loss.hpp"
#include "models/detector.hpp"
#include "models/input.hpp"
#include "models/loaded_model.hpp"
#include "support.hpp"

namespace models = libreyolo::models;
namespace rtmdet = libreyolo::models::rtmdet;
using libreyolo::io::StateDict;

namespace {

StateDict reference_state_dict(const std::string& size) {
  const std::string path = std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/rtmdet_state_dict_" + size + "_nc80.tsv";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  StateDict sd;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string key, shape, dtype;
    std::getline(ls, key, '\t');
    std::getline(ls, shape, '\t');
    std::getline(ls, dtype, '\t');
    for (char& c : shape)
      if (c == '[' || c == ']' || c == ',') c = ' ';
    std::istringstream ss(shape);
    std::vector<int64_t> dims;
    int64_t d;
    while (ss >> d) dims.push_back(d);
    sd.emplace_back(key, torch::zeros(dims, dtype == "int64" ? torch::kLong : torch::kFloat));
  }
  return sd;
}

const torch::Tensor& param(const StateDict& sd, const std::string& key) {
  for (const auto& kv : sd)
    if (kv.first == key) return kv.second;
  throw std::runtime_error("no tensor " + key);
}

const models::Family& rtmdet_family() {
  const models::Family* f = models::find_family("rtmdet");
  if (!f) throw std::runtime_error("rtmdet is not registered");
  return *f;
}

// Parameters counted once per tensor (the head's shared convolutions appear under three names).
std::pair<int64_t, size_t> distinct_parameters(torch::nn::Module& m, const std::string& prefix = "") {
  std::set<const void*> seen;
  int64_t n = 0;
  for (const auto& p : m.named_parameters(true)) {
    if (p.key().rfind(prefix, 0) != 0 || !seen.insert(p.value().data_ptr()).second) continue;
    n += p.value().numel();
  }
  return {n, seen.size()};
}

// A network far narrower than t, with m's kind of head (exp on the distances).
rtmdet::Arch narrow_arch() {
  rtmdet::Arch a;
  a.stem = 2;
  a.stem_out = 4;
  a.stage = {8, 16, 32, 64};
  a.blocks = {1, 2, 2, 1};
  a.neck_blocks = 2;
  a.width = 16;
  a.exp_on_reg = true;
  return a;
}

}  // namespace

TEST(RtmdetModel, StateDictOfEverySizeEqualsTheReference) {
  // size: state-dict entries, parameters (LibreYOLO's deduplicated count at nc 80)
  const std::vector<std::tuple<std::string, size_t, int64_t>> sizes = {
      {"t", 476, 4896168}, {"s", 512, 8886924}, {"m", 692, 24709188}, {"l", 872, 52315804}, {"x", 1052, 94855572}};
  for (const auto& [size, entries, params] : sizes) {
    const auto ref = reference_state_dict(size);
    ASSERT_EQ(ref.size(), entries) << size;
    rtmdet::RTMDetModel m(rtmdet::size_arch(size), 80);
    const auto mine = models::state_dict(m);
    ASSERT_EQ(mine.size(), ref.size()) << size;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(mine[i].first, ref[i].first) << size << " entry " << i;
      EXPECT_EQ(mine[i].second.sizes(), ref[i].second.sizes()) << ref[i].first;
      EXPECT_EQ(mine[i].second.scalar_type(), ref[i].second.scalar_type()) << ref[i].first;
    }
    EXPECT_EQ(distinct_parameters(m).first, params) << size;
    EXPECT_EQ(m.size(), size);
    EXPECT_EQ(m.arch().exp_on_reg, size == "m" || size == "l" || size == "x") << size;
  }
}

TEST(RtmdetModel, HeadConvolutionsAreSharedAcrossLevels) {
  rtmdet::RTMDetModel m(rtmdet::size_arch("t"), 80);
  const auto sd = models::state_dict(m);
  // 476 names, 468 tensors: levels 1 and 2 of both towers name level 0's two convolutions.
  std::set<const void*> distinct;
  for (const auto& kv : sd) distinct.insert(kv.second.data_ptr());
  EXPECT_EQ(distinct.size(), 468u);
  for (const std::string tower : {"cls_convs", "reg_convs"})
    for (const std::string pos : {"0", "1"}) {
      const auto& w0 = param(sd, "head." + tower + ".0." + pos + ".conv.weight");
      for (const std::string level : {"1", "2"}) {
        const std::string name = "head." + tower + "." + level + "." + pos;
        EXPECT_EQ(param(sd, name + ".conv.weight").data_ptr(), w0.data_ptr()) << name;
        // The BatchNorms are the level's own.
        EXPECT_NE(param(sd, name + ".bn.weight").data_ptr(),
                  param(sd, "head." + tower + ".0." + pos + ".bn.weight").data_ptr())
            << name;
      }
    }
  // LibreYOLO's split: 240 parameter tensors; backbone / neck / head 2,348,700 / 2,188,944 / 358,524.
  EXPECT_EQ(distinct_parameters(m).second, 240u);
  EXPECT_EQ(distinct_parameters(m, "backbone.").first, 2348700);
  EXPECT_EQ(distinct_parameters(m, "neck.").first, 2188944);
  EXPECT_EQ(distinct_parameters(m, "head.").first, 358524);
}

TEST(RtmdetModel, WidthsDepthsAndClassesReadBackFromWeights) {
  const models::Family& f = rtmdet_family();
  for (const std::string size : {"t", "s", "m", "l", "x"}) {
    const auto ref = reference_state_dict(size);
    EXPECT_EQ(f.infer_size(ref).value_or(""), size);
    EXPECT_EQ(f.infer_num_classes(ref).value_or(-1), 80);
    auto like = f.build_like(ref, 0);
    EXPECT_EQ(like->num_classes(), 80);
    EXPECT_EQ(like->size(), size);
    EXPECT_TRUE(dynamic_cast<rtmdet::RTMDetModel&>(*like).arch() == rtmdet::size_arch(size)) << size;
  }
  // A narrow network (7 classes): every shape of a network built from its weights is its own, and
  // the weights load strictly.
  rtmdet::RTMDetModel narrow(narrow_arch(), 7);
  const auto sd = models::state_dict(narrow);
  EXPECT_EQ(param(sd, "backbone.stage3.1.blocks.1.conv2.depthwise_conv.conv.weight").sizes(),
            (std::vector<int64_t>{16, 1, 5, 5}));
  EXPECT_EQ(param(sd, "head.rtm_cls.2.weight").sizes(), (std::vector<int64_t>{7, 16, 1, 1}));
  auto like = f.build_like(sd, 0);
  EXPECT_EQ(like->num_classes(), 7);
  const auto& arch = dynamic_cast<rtmdet::RTMDetModel&>(*like).arch();
  EXPECT_TRUE(arch == narrow_arch());
  // Its stem matches no size: named after its kind of head.
  EXPECT_FALSE(f.infer_size(sd).has_value());
  EXPECT_EQ(like->size(), "m");
  const auto back = models::state_dict(*like);
  ASSERT_EQ(back.size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) EXPECT_EQ(back[i].second.sizes(), sd[i].second.sizes()) << sd[i].first;
  EXPECT_NO_THROW(models::load_state_dict(*like, sd, /*strict=*/true));
  // One neck block per CSP layer: no exp on the distances, as t and s.
  rtmdet::Arch shallow = narrow_arch();
  shallow.neck_blocks = 1;
  shallow.exp_on_reg = false;
  const auto shallow_sd = models::state_dict(rtmdet::RTMDetModel(shallow, 2));
  EXPECT_TRUE(dynamic_cast<rtmdet::RTMDetModel&>(*f.build_like(shallow_sd, 0)).arch() == shallow);
  // A class count asked for replaces the weights'.
  EXPECT_EQ(f.build_like(sd, 2)->num_classes(), 2);
  StateDict no_stem;
  for (const auto& kv : sd)
    if (kv.first.rfind("backbone.stem.", 0) != 0) no_stem.push_back(kv);
  EXPECT_THROW(f.build_like(no_stem, 0), libreyolo::ModelError);
  // RTMDet-Ins weights (a mask head) are refused rather than loaded as a detector.
  StateDict ins = sd;
  ins.emplace_back("head.rtm_kernel.0.weight", torch::zeros({169, 16, 1, 1}));
  EXPECT_THROW(f.build_like(ins, 0), libreyolo::ModelError);
}

TEST(RtmdetFamily, RegisteredRecognisedAndNamed) {
  const models::Family& f = rtmdet_family();
  EXPECT_EQ(f.sizes, (std::vector<std::string>{"t", "s", "m", "l", "x"}));
  rtmdet::RTMDetModel m(narrow_arch(), 3);
  const StateDict sd = models::state_dict(m);
  EXPECT_EQ(models::detect_family(sd), &f);
  // No other family takes RTMDet weights, nor RTMDet theirs.
  for (const models::Family* other : models::families()) {
    if (other == &f) continue;
    EXPECT_FALSE(other->can_load(sd)) << other->name;
    EXPECT_FALSE(f.can_load(models::state_dict(*other->build(other->default_size, 3)))) << other->name;
  }
  // Upstream mmdetection's names ("bbox_head.", its preprocessing constants) and DDP's prefix
  // come back as LibreYOLO's.
  StateDict upstream{{"data_preprocessor.mean", torch::zeros({3, 1, 1})}}, ddp;
  for (const auto& [k, v] : sd) {
    upstream.emplace_back(k.rfind("head.", 0) == 0 ? "bbox_" + k : k, v);
    ddp.emplace_back("module." + k, v);
  }
  EXPECT_EQ(param(upstream, "bbox_head.rtm_cls.0.weight").size(0), 3);
  for (StateDict* s : {&upstream, &ddp}) {
    EXPECT_EQ(models::detect_family(*s), &f);
    EXPECT_EQ(f.infer_num_classes(*s).value_or(-1), 3);
    EXPECT_EQ(f.build_like(*s, 0)->num_classes(), 3);
    f.normalize_keys(*s);
    ASSERT_EQ(s->size(), sd.size());
    for (size_t i = 0; i < sd.size(); ++i) EXPECT_EQ((*s)[i].first, sd[i].first);
  }
  // LibreYOLO's model names.
  for (const std::string name : {"rtmdett", "rtmdet-t", "LibreRTMDett", "rtmdet_t"}) {
    auto lm = models::load_model(name, "cpu");
    EXPECT_EQ(lm->family, &f) << name;
    EXPECT_EQ(lm->model->size(), "t") << name;
    EXPECT_EQ(lm->model->num_classes(), 80) << name;
  }
  EXPECT_EQ(models::load_model("rtmdet", "cpu")->model->size(), "s");  // the default size
  // The API counts each tensor once, as LibreYOLO does (the shared convolutions have three names).
  EXPECT_EQ(libreyolo::LibreYOLO("rtmdet-t", "cpu").info().parameters, 4896168);
  EXPECT_ANY_THROW(models::load_model("rtmdetb", "cpu"));
  EXPECT_ANY_THROW(f.build("b", 80));
}

TEST(RtmdetFamily, LevelZeroWinsOverTheSharedConvolutionsCopies) {
  const models::Family& f = rtmdet_family();
  rtmdet::RTMDetModel src(narrow_arch(), 3);
  StateDict sd;
  for (const auto& [k, v] : models::state_dict(src)) sd.emplace_back(k, v.clone());
  // A checkpoint whose level-1 and level-2 copies disagree with level 0 (upstream stores three).
  for (auto& [k, v] : sd)
    if (k == "head.cls_convs.1.0.conv.weight" || k == "head.reg_convs.2.1.conv.weight") v.fill_(7.0);
  f.normalize_keys(sd);
  rtmdet::RTMDetModel dst(narrow_arch(), 3);
  models::load_state_dict(dst, sd, /*strict=*/true);
  EXPECT_TRUE(torch::equal(dst.head().cls_convs[1][0]->conv->weight, src.head().cls_convs[0][0]->conv->weight));
  EXPECT_TRUE(torch::equal(dst.head().reg_convs[2][1]->conv->weight, src.head().reg_convs[0][1]->conv->weight));
}

TEST(RtmdetFamily, InputRecipeAndTraining) {
  const models::Family& f = rtmdet_family();
  EXPECT_TRUE(f.input.bgr);
  EXPECT_EQ(f.input.divisor, 1.0);
  EXPECT_EQ(f.input.fit, libreyolo::ops::Fit::Letterbox);
  EXPECT_TRUE(f.input.normalizes());
  // One pixel RGB (10, 120, 250): BGR minus mmdetection's mean over its std.
  const auto img = torch::tensor({10, 120, 250}, torch::kUInt8).view({1, 1, 1, 3});
  const auto x = models::to_network_input(img, f.input, torch::kCPU, false);
  ASSERT_EQ(x.sizes(), (std::vector<int64_t>{1, 3, 1, 1}));
  EXPECT_NEAR(x[0][0][0][0].item<double>(), (250 - 103.53) / 57.375, 1e-5);
  EXPECT_NEAR(x[0][1][0][0].item<double>(), (120 - 116.28) / 57.12, 1e-5);
  EXPECT_NEAR(x[0][2][0][0].item<double>(), (10 - 123.675) / 58.395, 1e-5);
  // Families without a mean and std keep pixel / divisor.
  models::InputSpec plain;
  EXPECT_FALSE(plain.normalizes());
  EXPECT_NEAR(models::to_network_input(img, plain, torch::kCPU, false)[0][2][0][0].item<double>(), 250 / 255.0, 1e-6);
  // LibreYOLO's RTMDetConfig.
  const std::vector<std::pair<std::string, std::string>> want = {
      {"optimizer", "adamw"}, {"lr0", "0.004"}, {"weight_decay", "0.05"}, {"warmup_lr_start", "4e-8"},
      {"no_aug_epochs", "20"}, {"ema_decay", "0.9998"}, {"name", "rtmdet_exp"}};
  for (const auto& kv : want)
    EXPECT_NE(std::find(f.train_defaults.begin(), f.train_defaults.end(), kv), f.train_defaults.end()) << kv.first;
  EXPECT_EQ(f.train_val_thresholds.iou, 0.65);
  // Its loss: quality focal and GIoU over the dynamic soft label assignment (test_rtmdet_loss.cpp).
  rtmdet::RTMDetModel m(narrow_arch(), 3);
  const auto loss = f.make_loss(m);
  EXPECT_EQ(loss->term_names(), (std::vector<std::string>{"cls", "bbox"}));
}

TEST(RtmdetModel, InitialisationAndClassCountChange) {
  rtmdet::RTMDetModel m(narrow_arch(), 3);
  const double prior = -std::log(0.99 / 0.01);
  auto& head = m.head();
  for (size_t l = 0; l < 3; ++l) {
    EXPECT_TRUE(torch::allclose(head.rtm_cls[l]->bias, torch::full({3}, prior)));
    EXPECT_EQ(head.rtm_reg[l]->bias.abs().max().item<double>(), 0.0);
    EXPECT_TRUE(torch::equal(head.cls_convs[l][1]->bn->weight, torch::ones({16})));
    // N(0, 0.01) weights.
    EXPECT_LT(head.rtm_cls[l]->weight.abs().max().item<double>(), 0.06);
    EXPECT_GT(head.rtm_cls[l]->weight.abs().max().item<double>(), 0.0);
  }
  torch::NoGradGuard no_grad;
  const auto before = models::state_dict(m);
  m.reset_num_classes(5);
  EXPECT_EQ(m.num_classes(), 5);
  const auto after = models::state_dict(m);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].first, before[i].first);  // same names, same order
    if (after[i].first.find("rtm_cls") != std::string::npos)
      EXPECT_EQ(after[i].second.size(0), 5) << after[i].first;
    else
      EXPECT_TRUE(torch::equal(after[i].second, before[i].second)) << after[i].first;
  }
  EXPECT_TRUE(torch::allclose(head.rtm_cls[2]->bias, torch::full({5}, prior)));
  EXPECT_THROW(m.reset_num_classes(0), libreyolo::UsageError);
}

TEST(RtmdetModel, ForwardShapesAndInputChecks) {
  rtmdet::RTMDetModel m(narrow_arch(), 3);
  m.eval();
  torch::NoGradGuard no_grad;
  const auto raw = m.forward_raw(torch::rand({1, 3, 96, 128}));
  ASSERT_EQ(raw.size(), 3u);
  EXPECT_EQ(raw[0].sizes(), (std::vector<int64_t>{1, 7, 12, 16}));
  EXPECT_EQ(raw[1].sizes(), (std::vector<int64_t>{1, 7, 6, 8}));
  EXPECT_EQ(raw[2].sizes(), (std::vector<int64_t>{1, 7, 3, 4}));
  // exp on the distances: every one positive.
  for (const auto& r : raw) EXPECT_GT(r.narrow(1, 0, 4).min().item<double>(), 0.0);
  EXPECT_EQ(m.decode(raw).sizes(), (std::vector<int64_t>{1, 7, 192 + 48 + 12}));
  EXPECT_ANY_THROW(m.forward_raw(torch::rand({1, 3, 96, 100})));
  EXPECT_ANY_THROW(m.forward_raw(torch::rand({1, 1, 96, 96})));
  EXPECT_ANY_THROW(m.decode({raw[0], raw[1]}));
}

TEST(RtmdetModel, DecodeGeometryAndOrder) {
  // Two classes, a 64 x 64 input: levels of 8 x 8, 4 x 4 and 2 x 2 cells.
  rtmdet::RTMDetModel m(narrow_arch(), 2);
  std::vector<torch::Tensor> raw;
  for (int64_t s : {8, 4, 2}) raw.push_back(torch::zeros({1, 6, s, s}));
  // Level 1 (stride 16), cell (x 3, y 1): the prior is the cell's corner (48, 16).
  raw[1][0][0][1][3] = 5.0;   // l
  raw[1][0][1][1][3] = 6.0;   // t
  raw[1][0][2][1][3] = 7.0;   // r
  raw[1][0][3][1][3] = 8.0;   // b
  raw[1][0][5][1][3] = 2.0;   // class 1's logit
  const auto pred = m.decode(raw);
  ASSERT_EQ(pred.sizes(), (std::vector<int64_t>{1, 6, 64 + 16 + 4}));
  const int64_t a = 64 + 1 * 4 + 3;  // level-major, then row, then column
  const auto got = pred[0].select(1, a);
  EXPECT_TRUE(torch::allclose(got, torch::tensor({48.f - 5, 16.f - 6, 48.f + 7, 16.f + 8, 0.5f,
                                                  static_cast<float>(1 / (1 + std::exp(-2.0)))})));
  // Zero distances: a point at the prior; the last prediction's is level 2's cell (1, 1) at (32, 32).
  const auto last = pred[0].select(1, pred.size(2) - 1);
  EXPECT_TRUE(torch::allclose(last, torch::tensor({32.f, 32.f, 32.f, 32.f, 0.5f, 0.5f})));
  EXPECT_TRUE(torch::allclose(pred[0].select(1, 9), torch::tensor({8.f, 8.f, 8.f, 8.f, 0.5f, 0.5f})));
  // Double maps decode in double.
  std::vector<torch::Tensor> dbl;
  for (const auto& r : raw) dbl.push_back(r.to(torch::kDouble));
  EXPECT_EQ(m.decode(dbl).scalar_type(), torch::kDouble);
}

TEST(RtmdetFamily, PostprocessIsMultiLabelAndClassAware) {
  // A 32 x 32 input: 16 + 4 + 1 = 21 predictions [4 + 3, 21], all at 0 but three.
  const models::Family& f = rtmdet_family();
  auto pred = torch::zeros({7, 21});
  const auto put = [&](int64_t a, std::vector<float> box, std::vector<float> scores) {
    for (int i = 0; i < 4; ++i) pred[i][a] = box[static_cast<size_t>(i)];
    for (int c = 0; c < 3; ++c) pred[4 + c][a] = scores[static_cast<size_t>(c)];
  };
  put(0, {2, 2, 12, 12}, {0.1f, 0.9f, 0.6f});    // two classes above conf: both kept
  put(5, {3, 3, 12, 12}, {0.0f, 0.7f, 0.0f});    // class 1, overlaps the first: suppressed
  put(20, {16, 16, 30, 30}, {0.3f, 0.0f, 0.0f});  // level 2
  models::PostprocessArgs a;
  a.conf = 0.25;
  a.iou = 0.45;
  a.geometry = {0.5, 0.5, 60, 64};  // the original at half scale, 64 wide and 60 high
  const auto d = f.postprocess(pred, a);
  ASSERT_EQ(d.scores.size(0), 3);
  EXPECT_TRUE(torch::equal(d.classes, torch::tensor({1, 2, 0}, torch::kLong)));
  EXPECT_TRUE(torch::allclose(d.scores, torch::tensor({0.9f, 0.6f, 0.3f})));
  EXPECT_TRUE(torch::allclose(
      d.boxes, torch::tensor({{4.f, 4.f, 24.f, 24.f}, {4.f, 4.f, 24.f, 24.f}, {32.f, 32.f, 60.f, 60.f}})));
  // max_det keeps the best; the threshold is strict.
  a.max_det = 1;
  EXPECT_EQ(f.postprocess(pred, a).scores.size(0), 1);
  a.max_det = 300;
  a.conf = 0.9;
  EXPECT_EQ(f.postprocess(pred, a).scores.size(0), 0);
  // Not three levels of a stride-32 input.
  EXPECT_THROW(f.postprocess(torch::zeros({7, 20}), a), libreyolo::UsageError);
}
