// RTMDet parity with LibreYOLO 1.6.0 on the CPU (tests/data/rtmdet_reference.pt, made by
// tests/python/make_rtmdet_fixture.py: two reference networks at 1/6 of t's widths, "t" without
// and "m" with exp on the distances, 3 classes, two letterboxed 320 x 320 images): the checkpoint
// loads through the registry into a network built from its shapes, the input conversion, the eval
// forward's maps, the decode and the postprocess (predict's and val's thresholds, boxes mapped to
// the originals) match the recorded ones; predicting on the images through the library's API
// gives the recorded detections. The recorded values are the reference's float64 computation
// rounded to float32.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "data/synthetic.hpp"
#include "families/rtmdet/model.hpp"
#include "io/image.hpp"
#include "io/pickle.hpp"
#include "libreyolo/libreyolo.hpp"
#include "models/input.hpp"
#include "models/loaded_model.hpp"
#include "support.hpp"

namespace io = libreyolo::io;
namespace models = libreyolo::models;
namespace rtmdet = libreyolo::models::rtmdet;
using libreyolo::test::check_rel;
using libreyolo::test::detections;
using libreyolo::test::expect_same_detections;
using libreyolo::test::rel_err;

namespace {

const std::string kPath = std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/rtmdet_reference.pt";
constexpr int kClasses = 3;

io::PyValuePtr fixture() {
  static io::PyValuePtr root = io::load_torch_file(kPath);
  return root;
}

torch::Tensor expected(const std::string& key) {
  auto v = fixture()->get("expect")->get(key);
  if (!v || !v->is_tensor()) throw std::runtime_error("fixture has no tensor " + key);
  return v->tensor;
}

const models::Family& family() { return *models::find_family("rtmdet"); }

// The "t" network through the registry (the checkpoint), the "m" one from its state dict.
std::shared_ptr<models::Detector> variant(const std::string& name) {
  std::shared_ptr<models::Detector> m;
  if (name == "t") {
    m = models::model_from_checkpoint(fixture(), kPath)->model;
  } else {
    auto sd = io::to_state_dict(*fixture()->get("expect")->get(name + ".model"));
    family().normalize_keys(sd);
    m = family().build_like(sd, 0);
    models::load_state_dict(*m, sd, /*strict=*/true);
  }
  m->eval();
  return m;
}

// The network input as the family converts the RGB images.
torch::Tensor input() {
  return models::to_network_input(expected("input_u8").permute({0, 2, 3, 1}).contiguous(), family().input, torch::kCPU,
                                  false);
}

}  // namespace

TEST(RtmdetParity, CheckpointLoadsIntoANetworkOfItsWidths) {
  auto lm = models::model_from_checkpoint(fixture(), kPath);
  EXPECT_EQ(lm->family, &family());
  EXPECT_EQ(lm->imgsz, 320);
  auto& m = dynamic_cast<rtmdet::RTMDetModel&>(*lm->model);
  EXPECT_EQ(m.num_classes(), kClasses);
  EXPECT_EQ(m.arch().stem, 2);
  EXPECT_EQ(m.arch().stage, (std::array<int64_t, 4>{8, 16, 32, 64}));
  EXPECT_EQ(m.arch().width, 16);
  EXPECT_FALSE(m.arch().exp_on_reg);
  // Same names in the same order (the shared convolutions' copies included), every tensor copied.
  const auto weights = io::to_state_dict(*fixture()->get("model"));
  const auto mine = models::state_dict(m);
  ASSERT_EQ(mine.size(), 476u);
  ASSERT_EQ(mine.size(), weights.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].first, weights[i].first);
    EXPECT_TRUE(torch::equal(mine[i].second, weights[i].second)) << mine[i].first;
  }
  // The "m" network: two neck blocks, exp on the distances, (1, 2, 2, 1) stage blocks.
  auto mm = variant("m");
  const auto& arch = dynamic_cast<rtmdet::RTMDetModel&>(*mm).arch();
  EXPECT_TRUE(arch.exp_on_reg);
  EXPECT_EQ(arch.neck_blocks, 2);
  EXPECT_EQ(arch.blocks, (std::array<int64_t, 4>{1, 2, 2, 1}));
}

TEST(RtmdetParity, InputConversion) {
  // BGR, minus the mean, over the std: the reference's own preprocessing of the same pixels.
  const auto x = input();
  ASSERT_EQ(x.sizes(), (std::vector<int64_t>{2, 3, 320, 320}));
  check_rel("input crop", x.narrow(2, 0, 40).narrow(3, 180, 40), expected("input_crop"));
}

TEST(RtmdetParity, EvalMapsAndDecode) {
  const auto x = input();
  for (const std::string v : {"t", "m"}) {
    auto m = variant(v);
    torch::NoGradGuard no_grad;
    const auto raw = m->forward_raw(x);
    ASSERT_EQ(raw.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      const std::string l = std::to_string(i);
      check_rel(v + " reg_" + l, raw[i].narrow(1, 0, 4), expected(v + ".raw_reg_" + l));
      check_rel(v + " cls_" + l, raw[i].narrow(1, 4, kClasses), expected(v + ".raw_cls_" + l));
    }
    const auto pred = m->decode(raw);
    ASSERT_EQ(pred.sizes(), (std::vector<int64_t>{2, 4 + kClasses, 2100}));
    const auto want = expected(v + ".decoded").transpose(1, 2);  // [B, A, 4 + nc] -> [B, 4 + nc, A]
    check_rel(v + " decoded boxes", pred.narrow(1, 0, 4), want.narrow(1, 0, 4));
    check_rel(v + " decoded scores", pred.narrow(1, 4, kClasses), want.narrow(1, 4, kClasses));
    // The reference's own maps decode to its predictions as closely (the decode alone).
    std::vector<torch::Tensor> ref_maps;
    for (int i = 0; i < 3; ++i) {
      const std::string l = std::to_string(i);
      ref_maps.push_back(torch::cat({expected(v + ".raw_reg_" + l), expected(v + ".raw_cls_" + l)}, 1));
    }
    check_rel(v + " decode of reference maps", m->decode(ref_maps), want);
    // In float64 the network gives the reference's float64 maps up to the float32 rounding of the
    // recorded values: the float32 differences above are rounding, not a different computation.
    m->to(torch::kDouble);
    const auto raw64 = m->forward_raw(x.to(torch::kDouble));
    for (int i = 0; i < 3; ++i) {
      const std::string l = std::to_string(i);
      check_rel(v + " float64 reg_" + l, raw64[i].narrow(1, 0, 4), expected(v + ".raw_reg_" + l).to(torch::kDouble),
                1e-6);
      check_rel(v + " float64 cls_" + l, raw64[i].narrow(1, 4, kClasses),
                expected(v + ".raw_cls_" + l).to(torch::kDouble), 1e-6);
    }
  }
}

TEST(RtmdetParity, PostprocessedDetections) {
  const auto x = input();
  const auto orig = expected("orig_size");
  for (const std::string v : {"t", "m"}) {
    auto m = variant(v);
    torch::NoGradGuard no_grad;
    const auto pred = m->decode(m->forward_raw(x));
    for (const std::string set : {"predict", "val", "whole"}) {
      for (int i = 0; i < 2; ++i) {
        models::PostprocessArgs a;
        a.conf = expected(set + ".conf").item<double>();
        a.iou = expected(set + ".iou").item<double>();
        a.max_det = 300;
        const int w = set == "whole" ? 320 : static_cast<int>(orig[i][0].item<int64_t>());
        const int h = set == "whole" ? 320 : static_cast<int>(orig[i][1].item<int64_t>());
        const auto box = libreyolo::ops::fit_box(h, w, 320, libreyolo::ops::Fit::Letterbox);
        a.geometry = {box.sx, box.sy, h, w};
        const std::string p = v + "." + set + ".img" + std::to_string(i) + ".";
        const auto want = detections(expected(p + "boxes"), expected(p + "scores"), expected(p + "classes"));
        ASSERT_GT(want.size(), 0u) << p;
        const auto got = family().postprocess(pred[i], a);
        const double d = expect_same_detections(detections(got.boxes, got.scores, got.classes), want, p);
        std::printf("  %-18s %3zu detections, largest box difference %.3g px\n", p.c_str(), want.size(), d);
      }
    }
  }
}

TEST(RtmdetParity, PredictThroughTheApi) {
  // The letterboxed inputs as PNG files, predicted at 320: each is its own original, so the
  // detections are the reference's "whole" ones.
  const std::string dir = libreyolo::test::temp_dir("rtmdet_predict");
  libreyolo::LibreYOLO model(kPath, "cpu");
  const auto u8 = expected("input_u8");
  for (int i = 0; i < 2; ++i) {
    const std::string path = dir + "/img" + std::to_string(i) + ".png";
    io::save_image(path, u8[i].permute({1, 2, 0}).contiguous());
    const auto results = model.predict(path, {{"imgsz", "320"}, {"conf", "0.25"}, {"iou", "0.45"}});
    ASSERT_EQ(results.size(), 1u);
    std::vector<libreyolo::test::Detection> got;
    for (const auto& d : results[0].detections) got.push_back({d.x1, d.y1, d.x2, d.y2, d.score, d.class_id});
    const std::string p = "t.whole.img" + std::to_string(i) + ".";
    expect_same_detections(got, detections(expected(p + "boxes"), expected(p + "scores"), expected(p + "classes")), "api " + p);
  }
}

TEST(RtmdetParity, ValidatesThroughTheApi) {
  // The fixture's network (3 classes) on a small synthetic set of 3 classes: validation runs the
  // family's input conversion, network, decode and postprocess at val's thresholds to metrics.
  libreyolo::data::SyntheticOptions o;
  o.train_images = 2;
  o.val_images = 6;
  o.width = 96;
  o.height = 80;
  o.num_classes = kClasses;
  o.threads = 1;
  const std::string dir = libreyolo::test::temp_dir("rtmdet_val");
  const std::string yaml = libreyolo::data::generate_synthetic_dataset(dir + "/ds", o);
  libreyolo::LibreYOLO model(kPath, "cpu");
  const auto v = model.val({{"data", yaml}, {"imgsz", "96"}, {"batch", "4"}, {"workers", "0"}, {"project", dir},
                            {"name", "val"}});
  EXPECT_GE(v.get("metrics/mAP50-95", -1), 0.0);
  EXPECT_LE(v.get("metrics/mAP50-95", 2), 1.0);
  EXPECT_EQ(v.get("speed/images_seen"), 6.0);
  EXPECT_NE(v.table.find("mAP50-95"), std::string::npos);
}
