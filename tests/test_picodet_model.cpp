// PicoDet network structure and its registry entry: state-dict names, shapes and dtypes of every
// size against LibreYOLO 1.6.0's (tests/data/picodet_state_dict_<size>_nc80.tsv), the parameter
// counts, the widths and class count read back from weights, recognition of LibreYOLO's and the
// upstream port's key names, model names and default input sizes, the input convention, the
// initialisation and class-count change, weights through a checkpoint and back, forward shapes at
// sizes that are not multiples of 32, the decode's geometry and order, and the per-level
// multi-label postprocess.
#include <algorithm>
#include <cmath>
#include <set>

#include "families/picodet/model.hpp"
#include "io/checkpoint.hpp"
#include "libreyolo/errors.hpp"
#include "libreyolo/libreyolo.hpp"
#include "models/detector.hpp"
#include "models/input.hpp"
#include "models/loaded_model.hpp"
#include "support.hpp"

namespace models = libreyolo::models;
namespace picodet = libreyolo::models::picodet;
using libreyolo::io::StateDict;
using libreyolo::test::reference_state_dict_tsv;
using libreyolo::test::state_dict_entry;

namespace {

const models::Family& picodet_family() {
  const models::Family* f = models::find_family("picodet");
  if (!f) throw std::runtime_error("picodet is not registered");
  return *f;
}

int64_t parameter_count(torch::nn::Module& m, const std::string& prefix = "") {
  int64_t n = 0;
  for (const auto& p : m.named_parameters(true))
    if (p.key().rfind(prefix, 0) == 0) n += p.value().numel();
  return n;
}

// A network far narrower than s, with three convolutions per head tower.
picodet::Arch narrow_arch() {
  picodet::Arch a;
  a.stage = {16, 32, 48};
  a.mid = {8, 8, 16, 16, 8, 16, 8, 16, 8, 16, 24, 16, 8};
  a.width = 16;
  a.stacked_convs = 3;
  return a;
}

}  // namespace

TEST(PicodetModel, StateDictOfEverySizeEqualsTheReference) {
  // size: state-dict entries, parameters at nc 80, backbone / neck / head parameters
  struct Row {
    std::string size;
    size_t entries;
    int64_t params, backbone, neck, head;
  };
  const std::vector<Row> sizes = {{"s", 678, 992715, 603659, 249600, 139456},
                                  {"m", 774, 2152554, 1338026, 435200, 379328},
                                  {"l", 774, 3305009, 2077041, 672000, 555968}};
  for (const auto& r : sizes) {
    const auto ref = reference_state_dict_tsv("picodet_state_dict_" + r.size + "_nc80.tsv");
    ASSERT_EQ(ref.size(), r.entries) << r.size;
    picodet::PicoDetModel m(picodet::size_arch(r.size), 80);
    const auto mine = models::state_dict(m);
    ASSERT_EQ(mine.size(), ref.size()) << r.size;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(mine[i].first, ref[i].first) << r.size << " entry " << i;
      EXPECT_EQ(mine[i].second.sizes(), ref[i].second.sizes()) << ref[i].first;
      EXPECT_EQ(mine[i].second.scalar_type(), ref[i].second.scalar_type()) << ref[i].first;
    }
    EXPECT_EQ(parameter_count(m), r.params) << r.size;
    EXPECT_EQ(parameter_count(m, "backbone."), r.backbone) << r.size;
    EXPECT_EQ(parameter_count(m, "neck."), r.neck) << r.size;
    EXPECT_EQ(parameter_count(m, "head."), r.head) << r.size;
    EXPECT_EQ(m.size(), r.size);
    EXPECT_EQ(picodet_family().build(r.size, 80)->size(), r.size);
  }
  // The API counts parameters the same way.
  EXPECT_EQ(libreyolo::LibreYOLO("picodet-s", "cpu").info().parameters, 992715);
}

TEST(PicodetModel, WidthsAndClassesReadBackFromWeights) {
  const models::Family& f = picodet_family();
  for (const std::string size : {"s", "m", "l"}) {
    const auto ref = reference_state_dict_tsv("picodet_state_dict_" + size + "_nc80.tsv");
    EXPECT_EQ(f.infer_size(ref).value_or(""), size);
    EXPECT_EQ(f.infer_num_classes(ref).value_or(-1), 80);
    auto like = f.build_like(ref, 0);
    EXPECT_EQ(like->num_classes(), 80);
    EXPECT_EQ(like->size(), size);
    EXPECT_TRUE(dynamic_cast<picodet::PicoDetModel&>(*like).arch() == picodet::size_arch(size)) << size;
  }
  // A narrow network (7 classes): every shape of a network built from its weights is its own, and
  // the weights load strictly.
  picodet::PicoDetModel narrow(narrow_arch(), 7);
  const auto sd = models::state_dict(narrow);
  EXPECT_EQ(state_dict_entry(sd, "backbone.blocks.10.conv_pw_2.conv.weight").sizes(),
            (std::vector<int64_t>{12, 32, 1, 1}));
  EXPECT_EQ(state_dict_entry(sd, "head.gfl_cls.3.weight").sizes(), (std::vector<int64_t>{39, 16, 1, 1}));
  auto like = f.build_like(sd, 0);
  EXPECT_EQ(like->num_classes(), 7);
  EXPECT_TRUE(dynamic_cast<picodet::PicoDetModel&>(*like).arch() == narrow_arch());
  EXPECT_FALSE(f.infer_size(sd).has_value());  // 16 wide: no size's neck
  EXPECT_EQ(like->size(), "s");
  EXPECT_NO_THROW(models::load_state_dict(*like, sd, /*strict=*/true));
  EXPECT_EQ(f.build_like(sd, 2)->num_classes(), 2);
  StateDict no_trans;
  for (const auto& kv : sd)
    if (kv.first.rfind("neck.trans.", 0) != 0) no_trans.push_back(kv);
  EXPECT_THROW(f.build_like(no_trans, 0), libreyolo::ModelError);
}

TEST(PicodetFamily, RegisteredRecognisedAndNamed) {
  const models::Family& f = picodet_family();
  EXPECT_EQ(f.sizes, (std::vector<std::string>{"s", "m", "l"}));
  picodet::PicoDetModel m(narrow_arch(), 3);
  const StateDict sd = models::state_dict(m);
  EXPECT_EQ(models::detect_family(sd), &f);
  for (const models::Family* other : models::families()) {
    if (other == &f) continue;
    EXPECT_FALSE(other->can_load(sd)) << other->name;
    EXPECT_FALSE(f.can_load(models::state_dict(*other->build(other->default_size, 3)))) << other->name;
  }
  // The upstream port's names and DDP's prefix come back as LibreYOLO's.
  const auto upstream_name = [](const std::string& k) {
    std::string u = k;
    if (u.rfind("head.", 0) == 0) u = "bbox_" + u;
    if (u.rfind("neck.trans.", 0) == 0) u = "neck.trans.trans." + u.substr(11);
    const std::string blocks = "backbone.blocks.";
    if (u.rfind(blocks, 0) == 0) {
      const auto dot = u.find('.', blocks.size());
      const int flat = std::stoi(u.substr(blocks.size(), dot - blocks.size()));
      const int stage = flat < 3 ? 2 : (flat < 10 ? 3 : 4), first = flat < 3 ? 0 : (flat < 10 ? 3 : 10);
      u = "backbone." + std::to_string(stage) + "_" + std::to_string(flat - first + 1) + u.substr(dot);
    }
    for (const std::string c : {"conv1", "conv2"}) {
      const std::string from = ".se." + c + ".";
      const auto at = u.find(from);
      if (at != std::string::npos) u = u.substr(0, at) + ".se." + c + ".conv." + u.substr(at + from.size());
    }
    return u;
  };
  StateDict upstream, ddp;
  for (const auto& [k, v] : sd) {
    upstream.emplace_back(upstream_name(k), v);
    ddp.emplace_back("module." + k, v);
  }
  upstream.emplace_back("bbox_head.integral.project", torch::arange(8));
  EXPECT_EQ(state_dict_entry(upstream, "backbone.4_3.se.conv2.conv.bias").size(0), 8);
  EXPECT_EQ(state_dict_entry(upstream, "backbone.2_1.conv_pw_2.conv.weight").size(0), 4);
  for (StateDict* s : {&upstream, &ddp}) {
    EXPECT_EQ(models::detect_family(*s), &f);
    EXPECT_EQ(f.infer_num_classes(*s).value_or(-1), 3);
    EXPECT_EQ(f.build_like(*s, 0)->num_classes(), 3);
    f.normalize_keys(*s);
    ASSERT_EQ(s->size(), sd.size());
    for (size_t i = 0; i < sd.size(); ++i) EXPECT_EQ((*s)[i].first, sd[i].first);
  }
  // LibreYOLO's model names; each size at its own input size.
  for (const std::string name : {"picodets", "picodet-s", "LibrePICODETs", "picodet_s", "picodet"}) {
    auto lm = models::load_model(name, "cpu");
    EXPECT_EQ(lm->family, &f) << name;
    EXPECT_EQ(lm->model->size(), "s") << name;
    EXPECT_EQ(lm->model->num_classes(), 80) << name;
    EXPECT_EQ(lm->imgsz, 320) << name;
  }
  EXPECT_EQ(models::load_model("picodet-m", "cpu")->imgsz, 416);
  EXPECT_EQ(models::load_model("picodet-l", "cpu")->imgsz, 640);
  EXPECT_EQ(libreyolo::LibreYOLO("picodet-m", "cpu").info().imgsz, 416);
  EXPECT_ANY_THROW(models::load_model("picodetx", "cpu"));
  EXPECT_ANY_THROW(f.build("x", 80));
}

TEST(PicodetModel, WeightsRoundTripThroughACheckpoint) {
  const std::string path = libreyolo::test::temp_dir("picodet_roundtrip") + "/picodet_s.pt";
  auto src = models::load_model("picodet-s", "cpu");
  {
    // Distinct values everywhere (running statistics included), so that a mix-up would show.
    torch::NoGradGuard no_grad;
    int64_t i = 0;
    for (auto& kv : models::state_dict(*src->model))
      if (kv.second.is_floating_point()) kv.second.copy_(torch::rand_like(kv.second) + static_cast<double>(i++));
  }
  auto root = libreyolo::io::make_checkpoint(models::state_dict(*src->model), src->meta());
  libreyolo::io::write_checkpoint(path, *root);
  auto back = models::load_model(path, "cpu");
  EXPECT_EQ(back->family, &picodet_family());
  EXPECT_EQ(back->imgsz, 320);
  const auto a = models::state_dict(*src->model), b = models::state_dict(*back->model);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  }
}

TEST(PicodetFamily, InputConvention) {
  const models::Family& f = picodet_family();
  EXPECT_FALSE(f.input.bgr);
  EXPECT_EQ(f.input.divisor, 1.0);
  EXPECT_EQ(f.input.fit, libreyolo::ops::Fit::Stretch);
  // One pixel RGB (10, 120, 250): minus the ImageNet mean over its std, in RGB order.
  const auto img = torch::tensor({10, 120, 250}, torch::kUInt8).view({1, 1, 1, 3});
  const auto x = models::to_network_input(img, f.input, torch::kCPU, false);
  EXPECT_NEAR(x[0][0][0][0].item<double>(), (10 - 123.675) / 58.395, 1e-5);
  EXPECT_NEAR(x[0][1][0][0].item<double>(), (120 - 116.28) / 57.12, 1e-5);
  EXPECT_NEAR(x[0][2][0][0].item<double>(), (250 - 103.53) / 57.375, 1e-5);
  for (const std::string size : {"s", "m", "l"})
    EXPECT_EQ(f.input_size(size), size == "s" ? 320 : (size == "m" ? 416 : 640));
}

TEST(PicodetModel, InitialisationAndClassCountChange) {
  picodet::PicoDetModel m(narrow_arch(), 3);
  const double prior = -std::log(0.99 / 0.01);
  for (size_t l = 0; l < 4; ++l) {
    const auto& c = m.gfl_cls()[l];
    EXPECT_TRUE(torch::allclose(c->bias.narrow(0, 0, 3), torch::full({3}, prior)));
    EXPECT_EQ(c->bias.narrow(0, 3, 32).abs().max().item<double>(), 0.0);
    EXPECT_LT(c->weight.abs().max().item<double>(), 0.06);
    EXPECT_GT(c->weight.abs().max().item<double>(), 0.0);
  }
  // Backbone convolutions are Kaiming-normal with fan-out: std sqrt(2 / (24 * 9)) for the stem.
  const auto sd0 = models::state_dict(m);
  const auto stem = state_dict_entry(sd0, "backbone.conv1.conv.weight");
  EXPECT_GT(stem.std().item<double>(), 0.5 * std::sqrt(2.0 / 216));
  EXPECT_LT(stem.std().item<double>(), 1.5 * std::sqrt(2.0 / 216));
  torch::NoGradGuard no_grad;
  const auto before = models::state_dict(m);
  m.reset_num_classes(5);
  EXPECT_EQ(m.num_classes(), 5);
  const auto after = models::state_dict(m);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].first, before[i].first);
    if (after[i].first.find("gfl_cls") != std::string::npos)
      EXPECT_EQ(after[i].second.size(0), 5 + 32) << after[i].first;
    else
      EXPECT_TRUE(torch::equal(after[i].second, before[i].second)) << after[i].first;
  }
  EXPECT_THROW(m.reset_num_classes(0), libreyolo::UsageError);
}

TEST(PicodetModel, ForwardShapesAtAnyInputSize) {
  picodet::PicoDetModel m(narrow_arch(), 3);
  m.eval();
  torch::NoGradGuard no_grad;
  // 416: a 7 x 7 stride-64 level. 400: stride 32 gives 13, doubled 26 against stride 16's 25 (the
  // resize). 96 x 160: not square.
  const std::vector<std::tuple<int64_t, int64_t, std::vector<int64_t>>> cases = {
      {320, 320, {40, 20, 10, 5}}, {416, 416, {52, 26, 13, 7}}, {400, 400, {50, 25, 13, 7}}};
  for (const auto& [h, w, sides] : cases) {
    const auto raw = m.forward_raw(torch::rand({1, 3, h, w}));
    ASSERT_EQ(raw.size(), 4u);
    int64_t a = 0;
    for (size_t l = 0; l < 4; ++l) {
      EXPECT_EQ(raw[l].sizes(), (std::vector<int64_t>{1, 35, sides[l], sides[l]})) << h << " level " << l;
      a += sides[l] * sides[l];
    }
    EXPECT_EQ(m.decode(raw).sizes(), (std::vector<int64_t>{1, 7, a}));
  }
  const auto raw = m.forward_raw(torch::rand({2, 3, 96, 160}));
  EXPECT_EQ(raw[0].sizes(), (std::vector<int64_t>{2, 35, 12, 20}));
  EXPECT_EQ(raw[3].sizes(), (std::vector<int64_t>{2, 35, 2, 3}));
  EXPECT_ANY_THROW(m.forward_raw(torch::rand({1, 1, 96, 96})));
  EXPECT_ANY_THROW(m.decode({raw[0], raw[1], raw[2]}));
}

TEST(PicodetModel, DecodeGeometryAndOrder) {
  // Two classes, a 64 x 64 input: levels of 8 x 8, 4 x 4, 2 x 2 and 1 x 1 cells.
  picodet::PicoDetModel m(narrow_arch(), 2);
  std::vector<torch::Tensor> raw;
  for (int64_t s : {8, 4, 2, 1}) raw.push_back(torch::zeros({1, 34, s, s}));
  // Level 1 (stride 16), cell (x 3, y 1): centre (56, 24). Side l all on bin 2, t split evenly
  // between bins 1 and 3 (expectation 2), r and b uniform (expectation 3.5).
  raw[1][0][2 + 0 * 8 + 2][1][3] = 100.0;
  raw[1][0][2 + 1 * 8 + 1][1][3] = 100.0;
  raw[1][0][2 + 1 * 8 + 3][1][3] = 100.0;
  raw[1][0][1][1][3] = 2.0;  // class 1's logit
  const auto pred = m.decode(raw);
  ASSERT_EQ(pred.sizes(), (std::vector<int64_t>{1, 6, 64 + 16 + 4 + 1}));
  const int64_t a = 64 + 1 * 4 + 3;
  const auto got = pred[0].select(1, a);
  EXPECT_TRUE(torch::allclose(got, torch::tensor({56.f - 32, 24.f - 32, 56.f + 56, 24.f + 56, 0.5f,
                                                  static_cast<float>(1 / (1 + std::exp(-2.0)))}),
                              1e-5, 1e-4));
  // The last prediction: level 3's only cell, centre (32, 32), stride 64, distances 3.5 strides.
  const auto last = pred[0].select(1, pred.size(2) - 1);
  EXPECT_TRUE(torch::allclose(last, torch::tensor({32.f - 224, 32.f - 224, 32.f + 224, 32.f + 224, 0.5f, 0.5f})));
  std::vector<torch::Tensor> dbl;
  for (const auto& r : raw) dbl.push_back(r.to(torch::kDouble));
  EXPECT_EQ(m.decode(dbl).scalar_type(), torch::kDouble);
}

TEST(PicodetFamily, PostprocessIsMultiLabelClassAwareAndStretched) {
  // A 32 x 32 input: 16 + 4 + 1 + 1 = 22 predictions [4 + 3, 22].
  const models::Family& f = picodet_family();
  auto pred = torch::zeros({7, 22});
  const auto put = [&](int64_t a, std::vector<float> box, std::vector<float> scores) {
    for (int i = 0; i < 4; ++i) pred[i][a] = box[static_cast<size_t>(i)];
    for (int c = 0; c < 3; ++c) pred[4 + c][a] = scores[static_cast<size_t>(c)];
  };
  put(0, {2, 2, 12, 12}, {0.1f, 0.9f, 0.6f});     // two classes above conf: both kept
  put(5, {3, 3, 12, 12}, {0.0f, 0.7f, 0.0f});     // class 1, overlaps the first: suppressed
  put(20, {16, 16, 40, 30}, {0.3f, 0.0f, 0.0f});  // level 2, past the canvas: clipped to 32
  put(21, {-9, 4, 8, 8}, {0.0f, 0.0f, 0.5f});     // level 3, left of the canvas: clipped to 0
  models::PostprocessArgs a;
  a.conf = 0.25;
  a.iou = 0.45;
  a.geometry = {0.5, 0.25, 128, 64};  // the original 64 wide, 128 high, stretched to 32 x 32
  const auto d = f.postprocess(pred, a);
  ASSERT_EQ(d.scores.size(0), 4);
  EXPECT_TRUE(torch::equal(d.classes, torch::tensor({1, 2, 2, 0}, torch::kLong)));
  EXPECT_TRUE(torch::allclose(d.scores, torch::tensor({0.9f, 0.6f, 0.5f, 0.3f})));
  EXPECT_TRUE(torch::allclose(d.boxes, torch::tensor({{4.f, 8.f, 24.f, 48.f},
                                                      {4.f, 8.f, 24.f, 48.f},
                                                      {0.f, 16.f, 16.f, 32.f},
                                                      {32.f, 64.f, 64.f, 120.f}})));
  a.max_det = 1;
  EXPECT_EQ(f.postprocess(pred, a).scores.size(0), 1);
  a.max_det = 300;
  a.conf = 0.9;
  EXPECT_EQ(f.postprocess(pred, a).scores.size(0), 0);
  EXPECT_THROW(f.postprocess(torch::zeros({7, 21}), a), libreyolo::UsageError);
}

TEST(PicodetFamily, PostprocessKeepsEachLevelsBest1000) {
  // A 320 input: levels of 1600, 400, 100 and 25 cells, one class. Level 0 has 1500 candidates,
  // far apart from each other (no NMS suppression): only its best 1000 survive.
  const models::Family& f = picodet_family();
  const int64_t n = 1600 + 400 + 100 + 25;
  auto pred = torch::zeros({5, n});
  for (int64_t i = 0; i < 1500; ++i) {
    const float x = static_cast<float>((i % 40) * 8), y = static_cast<float>((i / 40) * 8);
    pred[0][i] = x, pred[1][i] = y, pred[2][i] = x + 4, pred[3][i] = y + 4;
    pred[4][i] = 0.3f + 0.0004f * static_cast<float>(i);
  }
  pred[0][1700] = 0, pred[1][1700] = 0, pred[2][1700] = 300, pred[3][1700] = 1;
  pred[4][1700] = 0.26f;  // level 1: kept
  models::PostprocessArgs a;
  a.conf = 0.25;
  a.iou = 0.6;
  a.max_det = 5000;
  a.geometry = {1.0, 1.0, 320, 320};
  const auto d = f.postprocess(pred, a);
  ASSERT_EQ(d.scores.size(0), 1001);
  EXPECT_NEAR(d.scores[999].item<double>(), 0.3 + 0.0004 * 500, 1e-5);
  EXPECT_NEAR(d.scores[1000].item<double>(), 0.26, 1e-6);
}
