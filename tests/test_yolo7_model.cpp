// YOLOv7 network structure and its registry entry: state-dict names, shapes and dtypes against
// LibreYOLO 1.6.0's (tests/data/yolo7_state_dict_b_nc80.tsv), the parameter count, the widths and
// class count read back from weights, recognition of LibreYOLO's and upstream's key names, model
// names, the initialisation and class-count change, the decode's geometry and order, and the
// single-label postprocess.
#include <cmath>

#include "families/yolo7/model.hpp"
#include "models/detector.hpp"
#include "models/loaded_model.hpp"
#include "support.hpp"

namespace models = libreyolo::models;
namespace yolo7 = libreyolo::models::yolo7;
using libreyolo::io::StateDict;

namespace {

StateDict reference_state_dict() { return libreyolo::test::reference_state_dict_tsv("yolo7_state_dict_b_nc80.tsv"); }

const torch::Tensor& param(const StateDict& sd, const std::string& key) { return libreyolo::test::state_dict_entry(sd, key); }

const models::Family& yolo7_family() {
  const models::Family* f = models::find_family("yolo7");
  if (!f) throw std::runtime_error("yolo7 is not registered");
  return *f;
}

}  // namespace

TEST(Yolo7Model, StateDictEqualsTheReference) {
  const auto ref = reference_state_dict();
  ASSERT_EQ(ref.size(), 564u);
  yolo7::Yolo7Model m(32, 80);
  const auto mine = models::state_dict(m);
  ASSERT_EQ(mine.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(mine[i].first, ref[i].first) << "entry " << i;
    EXPECT_EQ(mine[i].second.sizes(), ref[i].second.sizes()) << ref[i].first;
    EXPECT_EQ(mine[i].second.scalar_type(), ref[i].second.scalar_type()) << ref[i].first;
  }
  // LibreYOLO's counts: 37,622,682 parameters in 288 tensors.
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  EXPECT_EQ(n, 37622682);
  EXPECT_EQ(m.parameters().size(), 288u);
  // 106 layers; the ones without tensors (concatenations, pools, upsamplings) keep their index.
  EXPECT_EQ(m.layer_table().size(), 106u);
  EXPECT_EQ(m.layer_table()[10].op, yolo7::Op::Concat);
  EXPECT_EQ(m.layer_table()[10].src, (std::vector<int>{9, 7, 5, 4}));
  EXPECT_EQ(m.layer_table()[93].src, (std::vector<int>{92, 90, 51}));
  EXPECT_EQ(m.layer_table()[105].src, (std::vector<int>{102, 103, 104}));
}

TEST(Yolo7Model, WidthsAndClassesReadBackFromWeights) {
  const models::Family& f = yolo7_family();
  // The reference's b weights (shapes only) build the b network at nc 80.
  const auto ref = reference_state_dict();
  auto b = f.build_like(ref, 0);
  EXPECT_EQ(b->num_classes(), 80);
  EXPECT_EQ(dynamic_cast<yolo7::Yolo7Model&>(*b).width(), 32);
  EXPECT_EQ(f.infer_num_classes(ref).value_or(-1), 80);
  EXPECT_EQ(f.infer_size(ref).value_or(""), "b");
  // A narrow network (first layer 4 channels, 7 classes): every shape of a network built from its
  // weights is its own, and the weights load strictly.
  yolo7::Yolo7Model narrow(4, 7);
  const auto sd = models::state_dict(narrow);
  EXPECT_EQ(param(sd, "layers.51.post_conv.0.conv.weight").sizes(), (std::vector<int64_t>{64, 256, 1, 1}));
  EXPECT_EQ(param(sd, "layers.105.heads.2.head_conv.weight").sizes(), (std::vector<int64_t>{36, 128, 1, 1}));
  auto like = f.build_like(sd, 0);
  EXPECT_EQ(like->num_classes(), 7);
  const auto back = models::state_dict(*like);
  ASSERT_EQ(back.size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) EXPECT_EQ(back[i].second.sizes(), sd[i].second.sizes()) << sd[i].first;
  EXPECT_NO_THROW(models::load_state_dict(*like, sd, /*strict=*/true));
  // A class count asked for replaces the weights'.
  EXPECT_EQ(f.build_like(sd, 2)->num_classes(), 2);
  StateDict no_first;
  for (const auto& kv : sd)
    if (kv.first.rfind("layers.0.", 0) != 0) no_first.push_back(kv);
  EXPECT_ANY_THROW(f.build_like(no_first, 0));
}

TEST(Yolo7Family, RegisteredRecognisedAndNamed) {
  const models::Family& f = yolo7_family();
  EXPECT_EQ(f.sizes, (std::vector<std::string>{"b"}));
  EXPECT_EQ(f.default_size, "b");
  EXPECT_FALSE(f.input.bgr);
  EXPECT_EQ(f.input.divisor, 255.0);
  EXPECT_EQ(f.input.fit, libreyolo::ops::Fit::Letterbox);
  yolo7::Yolo7Model m(2, 3);
  const StateDict sd = models::state_dict(m);
  EXPECT_EQ(models::detect_family(sd), &f);
  // No other family takes YOLOv7 weights, nor YOLOv7 theirs.
  for (const models::Family* other : models::families()) {
    if (other == &f) continue;
    EXPECT_FALSE(other->can_load(sd)) << other->name;
    EXPECT_FALSE(f.can_load(models::state_dict(*other->build(other->default_size, 3)))) << other->name;
  }
  // Upstream's flat keys ("0.conv.weight", ...) and DDP's prefix come back as LibreYOLO's.
  StateDict flat, ddp;
  for (const auto& [k, v] : sd) {
    flat.emplace_back(k.substr(7), v);
    ddp.emplace_back("module." + k, v);
  }
  EXPECT_EQ(flat.front().first, "0.conv.weight");
  for (StateDict* s : {&flat, &ddp}) {
    EXPECT_EQ(models::detect_family(*s), &f);
    f.normalize_keys(*s);
    ASSERT_EQ(s->size(), sd.size());
    for (size_t i = 0; i < sd.size(); ++i) EXPECT_EQ((*s)[i].first, sd[i].first);
  }
  EXPECT_EQ(f.build_like(flat, 0)->num_classes(), 3);
  // LibreYOLO's model names.
  for (const std::string name : {"yolo7b", "yolo7", "LibreYOLO7b", "yolo7-b"}) {
    auto lm = models::load_model(name, "cpu");
    EXPECT_EQ(lm->family, &f) << name;
    EXPECT_EQ(lm->model->size(), "b") << name;
    EXPECT_EQ(lm->model->num_classes(), 80) << name;
  }
  EXPECT_ANY_THROW(models::load_model("yolo7s", "cpu"));
  EXPECT_ANY_THROW(f.build("s", 80));
}

TEST(Yolo7Model, InitialisationAndClassCountChange) {
  yolo7::Yolo7Model m(2, 3);
  const double prior = -std::log(0.99 / 0.01);
  auto& head = *m.heads().heads[1];
  {
    const auto bias = head.head_conv->bias.view({3, 8});
    // Objectness and classes at the prior, box offsets at PyTorch's default (|b| <= 1/sqrt(fan_in)).
    EXPECT_TRUE(torch::allclose(bias.narrow(1, 4, 4), torch::full({3, 4}, prior)));
    EXPECT_LE(bias.narrow(1, 0, 4).abs().max().item<double>(), 1.0 / std::sqrt(32.0) + 1e-6);
  }
  EXPECT_EQ(head.implicit_a->implicit.abs().max().item<double>(), 0.0);
  EXPECT_EQ(head.implicit_m->implicit.sizes(), (std::vector<int64_t>{1, 24, 1, 1}));
  EXPECT_TRUE(torch::equal(head.implicit_m->implicit, torch::ones({1, 24, 1, 1})));
  // A new class count: new head convolutions and implicit_m, implicit_a and the rest kept.
  torch::NoGradGuard no_grad;
  head.implicit_a->implicit.fill_(0.5);
  const auto before = models::state_dict(m);
  m.reset_num_classes(5);
  EXPECT_EQ(m.num_classes(), 5);
  const auto after = models::state_dict(m);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].first, before[i].first);  // same names, same order
    if (after[i].first.find("implicit_m") != std::string::npos) {
      EXPECT_EQ(after[i].second.sizes(), (std::vector<int64_t>{1, 30, 1, 1}));
      EXPECT_TRUE(torch::equal(after[i].second, torch::ones({1, 30, 1, 1})));
    } else if (after[i].first.find("head_conv") != std::string::npos) {
      EXPECT_EQ(after[i].second.size(0), 30) << after[i].first;  // 3 anchors x (5 + 5)
    } else {
      EXPECT_TRUE(torch::equal(after[i].second, before[i].second)) << after[i].first;
    }
  }
  EXPECT_TRUE(torch::allclose(head.head_conv->bias.view({3, 10}).narrow(1, 4, 6), torch::full({3, 6}, prior)));
  EXPECT_EQ(head.implicit_a->implicit.min().item<double>(), 0.5);
}

TEST(Yolo7Model, ForwardShapesAndInputChecks) {
  yolo7::Yolo7Model m(2, 3);
  m.eval();
  torch::NoGradGuard no_grad;
  const auto raw = m.forward_raw(torch::rand({1, 3, 96, 128}));
  ASSERT_EQ(raw.size(), 3u);
  EXPECT_EQ(raw[0].sizes(), (std::vector<int64_t>{1, 24, 12, 16}));
  EXPECT_EQ(raw[1].sizes(), (std::vector<int64_t>{1, 24, 6, 8}));
  EXPECT_EQ(raw[2].sizes(), (std::vector<int64_t>{1, 24, 3, 4}));
  EXPECT_EQ(m.decode(raw).sizes(), (std::vector<int64_t>{1, 7, 3 * (192 + 48 + 12)}));
  EXPECT_ANY_THROW(m.forward_raw(torch::rand({1, 3, 96, 100})));
  EXPECT_ANY_THROW(m.forward_raw(torch::rand({1, 1, 96, 96})));
  EXPECT_ANY_THROW(m.decode({raw[0], raw[1]}));
}

TEST(Yolo7Model, DecodeGeometryAndOrder) {
  // One class, a 64 x 64 input: levels of 8 x 8, 4 x 4 and 2 x 2 cells, 3 anchors each.
  yolo7::Yolo7Model m(2, 1);
  std::vector<torch::Tensor> raw;
  for (int64_t s : {8, 4, 2}) raw.push_back(torch::zeros({1, 18, s, s}));
  // Level 1 (stride 16), anchor 2 (72 x 146), cell (x 3, y 1): tx = ty = 0 puts the centre at
  // (2 * 0.5 - 0.5 + g) s; tw = th = logit(0.75) scales the anchor by (2 * 0.75)^2 = 2.25.
  const double l75 = std::log(3.0);
  raw[1][0][2 * 6 + 2][1][3] = l75;
  raw[1][0][2 * 6 + 3][1][3] = l75;
  raw[1][0][2 * 6 + 4][1][3] = 10.0;  // objectness
  raw[1][0][2 * 6 + 5][1][3] = -10.0;
  const auto pred = m.decode(raw);
  ASSERT_EQ(pred.sizes(), (std::vector<int64_t>{1, 5, 3 * (64 + 16 + 4)}));
  const int64_t a = 3 * 64 + 2 * 16 + 1 * 4 + 3;  // level-major, anchor-major, row, column
  const double cx = (0.5 + 3) * 16, cy = (0.5 + 1) * 16, w = 2.25 * 72, h = 2.25 * 146;
  const auto got = pred[0].select(1, a);
  EXPECT_NEAR(got[0].item<double>(), cx - w / 2, 1e-4);
  EXPECT_NEAR(got[1].item<double>(), cy - h / 2, 1e-4);
  EXPECT_NEAR(got[2].item<double>(), cx + w / 2, 1e-4);
  EXPECT_NEAR(got[3].item<double>(), cy + h / 2, 1e-4);
  EXPECT_NEAR(got[4].item<double>(), 1.0 / (1 + std::exp(-10.0)) / (1 + std::exp(10.0)), 1e-7);
  // Every other prediction: sigmoid(0) everywhere: score 1/4, the anchor's own size.
  const auto first = pred[0].select(1, 0);  // level 0, anchor 0 (12 x 16), cell (0, 0)
  EXPECT_TRUE(torch::allclose(first, torch::tensor({4.f - 6.f, 4.f - 8.f, 4.f + 6.f, 4.f + 8.f, 0.25f})));
  const auto last = pred[0].select(1, pred.size(2) - 1);  // level 2, anchor 2 (459 x 401), cell (1, 1)
  EXPECT_TRUE(
      torch::allclose(last, torch::tensor({48.f - 229.5f, 48.f - 200.5f, 48.f + 229.5f, 48.f + 200.5f, 0.25f})));
  // Double maps decode in double.
  std::vector<torch::Tensor> dbl;
  for (const auto& r : raw) dbl.push_back(r.to(torch::kDouble));
  EXPECT_EQ(m.decode(dbl).scalar_type(), torch::kDouble);
}

TEST(Yolo7Family, PostprocessKeepsOneLabelPerPrediction) {
  // Two predictions [4 + 3, 2]: the first scores 0.6 for class 1 and 0.5 for class 2 (only class 1
  // is kept, so no second box on the same spot), the second 0.3 for class 0 only.
  const models::Family& f = yolo7_family();
  const auto pred = torch::tensor({{10.f, 50.f},
                                   {10.f, 50.f},
                                   {30.f, 90.f},
                                   {30.f, 90.f},
                                   {0.1f, 0.3f},
                                   {0.6f, 0.1f},
                                   {0.5f, 0.2f}});
  models::PostprocessArgs a;
  a.conf = 0.25;
  a.iou = 0.45;
  a.geometry = {0.5, 0.5, 200, 200};  // the input is the original at half scale
  const auto d = f.postprocess(pred, a);
  ASSERT_EQ(d.scores.size(0), 2);
  EXPECT_TRUE(torch::equal(d.classes, torch::tensor({1, 0}, torch::kLong)));
  EXPECT_TRUE(torch::allclose(d.scores, torch::tensor({0.6f, 0.3f})));
  EXPECT_TRUE(torch::allclose(d.boxes, torch::tensor({{20.f, 20.f, 60.f, 60.f}, {100.f, 100.f, 180.f, 180.f}})));
  // The batch path gives the same.
  const auto batch = f.postprocess_batch(pred.unsqueeze(0), {a});
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_TRUE(torch::equal(batch[0].classes, d.classes));
  EXPECT_TRUE(torch::allclose(batch[0].boxes, d.boxes));
  // The threshold is strict.
  a.conf = 0.6;
  EXPECT_EQ(f.postprocess(pred, a).scores.size(0), 0);
}
