// YOLOv7 parity with LibreYOLO 1.6.0 on the CPU (tests/data/yolo7_reference.pt, made by
// tests/python/make_yolo7_fixture.py: the reference network at 1/16 of b's widths, 3 classes, two
// letterboxed 320 x 320 images): the checkpoint loads through the registry into a network built
// from its shapes, and the eval forward's maps, the decode and the postprocess (predict's and
// val's thresholds, boxes mapped to the originals) match the recorded ones; predicting on the
// images through the library's API gives the recorded detections.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "families/yolo7/model.hpp"
#include "io/image.hpp"
#include "io/pickle.hpp"
#include "libreyolo/libreyolo.hpp"
#include "models/loaded_model.hpp"
#include "support.hpp"
#include "yolo7_fixture.hpp"

namespace io = libreyolo::io;
namespace models = libreyolo::models;
namespace yolo7 = libreyolo::models::yolo7;
using libreyolo::test::check_rel;
using libreyolo::test::detections;
using libreyolo::test::expect_same_detections;
using libreyolo::test::rel_err;

namespace {


io::PyValuePtr fixture() { return libreyolo::test::yolo7_fixture(); }

torch::Tensor expected(const std::string& key) { return libreyolo::test::yolo7_expected(key); }

std::unique_ptr<models::LoadedModel> load() {
  auto lm = models::model_from_checkpoint(fixture(), libreyolo::test::yolo7_fixture_path());
  lm->model->eval();
  return lm;
}

torch::Tensor input() { return expected("input_u8").to(torch::kFloat) / 255.0; }

}  // namespace

TEST(Yolo7Parity, CheckpointLoadsIntoANetworkOfItsWidths) {
  auto lm = load();
  EXPECT_EQ(lm->family, models::find_family("yolo7"));
  EXPECT_EQ(lm->imgsz, 320);
  auto& m = dynamic_cast<yolo7::Yolo7Model&>(*lm->model);
  EXPECT_EQ(m.width(), fixture()->get("fixture")->get("width")->as_int());
  EXPECT_EQ(m.width(), 2);
  EXPECT_EQ(m.num_classes(), 3);
  // Same names in the same order, every tensor copied; strict loading takes them.
  const auto weights = io::to_state_dict(*fixture()->get("model"));
  const auto mine = models::state_dict(m);
  ASSERT_EQ(mine.size(), 564u);
  ASSERT_EQ(mine.size(), weights.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].first, weights[i].first);
    EXPECT_TRUE(torch::equal(mine[i].second, weights[i].second)) << mine[i].first;
  }
  yolo7::Yolo7Model fresh(2, 3);
  EXPECT_NO_THROW(models::load_state_dict(fresh, weights, /*strict=*/true));
}

TEST(Yolo7Parity, EvalMapsAndDecode) {
  auto lm = load();
  torch::NoGradGuard no_grad;
  const auto raw = lm->model->forward_raw(input());
  ASSERT_EQ(raw.size(), 3u);
  for (int i = 0; i < 3; ++i) check_rel("raw_" + std::to_string(i), raw[i], expected("raw_" + std::to_string(i)));
  const auto pred = lm->model->decode(raw);
  const auto want = expected("decoded");
  ASSERT_EQ(pred.sizes(), (std::vector<int64_t>{2, 7, 6300}));
  check_rel("decoded boxes", pred.narrow(1, 0, 4), want.narrow(1, 0, 4));
  check_rel("decoded scores", pred.narrow(1, 4, 3), want.narrow(1, 4, 3));
  // The reference's own maps decode to its predictions as closely (the decode alone).
  const auto ref_maps = std::vector<torch::Tensor>{expected("raw_0"), expected("raw_1"), expected("raw_2")};
  check_rel("decode of the reference maps", lm->model->decode(ref_maps), want);
}

TEST(Yolo7Parity, PostprocessedDetections) {
  auto lm = load();
  torch::NoGradGuard no_grad;
  const auto pred = lm->model->decode(lm->model->forward_raw(input()));
  const auto orig = expected("orig_size");
  for (const std::string set : {"predict", "val", "whole"}) {
    std::vector<models::PostprocessArgs> args;
    for (int i = 0; i < 2; ++i) {
      models::PostprocessArgs a;
      a.conf = expected(set + ".conf").item<double>();
      a.iou = expected(set + ".iou").item<double>();
      a.max_det = 300;
      const int w = set == "whole" ? 320 : static_cast<int>(orig[i][0].item<int64_t>());
      const int h = set == "whole" ? 320 : static_cast<int>(orig[i][1].item<int64_t>());
      const auto box = libreyolo::ops::fit_box(h, w, 320, libreyolo::ops::Fit::Letterbox);
      a.geometry = {box.sx, box.sy, h, w};
      args.push_back(a);
    }
    const auto batch = lm->family->postprocess_batch(pred, args);
    for (int i = 0; i < 2; ++i) {
      const std::string p = set + ".img" + std::to_string(i) + ".";
      const auto want = detections(expected(p + "boxes"), expected(p + "scores"), expected(p + "classes"));
      ASSERT_GT(want.size(), 0u) << p;
      const auto one = lm->family->postprocess(pred[i], args[static_cast<size_t>(i)]);
      const double d = expect_same_detections(detections(one.boxes, one.scores, one.classes), want, p + " (one image)");
      expect_same_detections(detections(batch[i].boxes, batch[i].scores, batch[i].classes), want, p + " (batch)");
      std::printf("  %-14s %3zu detections, largest box difference %.3g px\n", p.c_str(), want.size(), d);
    }
  }
}

TEST(Yolo7Parity, PredictThroughTheApi) {
  // The letterboxed inputs as PNG files, predicted at 320: each is its own original, so the
  // detections are the reference's "whole" ones.
  const std::string dir = libreyolo::test::temp_dir("yolo7_predict");
  libreyolo::LibreYOLO model(libreyolo::test::yolo7_fixture_path(), "cpu");
  const auto u8 = expected("input_u8");
  for (int i = 0; i < 2; ++i) {
    const std::string path = dir + "/img" + std::to_string(i) + ".png";
    io::save_image(path, u8[i].permute({1, 2, 0}).contiguous());
    const auto results = model.predict(path, {{"imgsz", "320"}, {"conf", "0.25"}, {"iou", "0.45"}});
    ASSERT_EQ(results.size(), 1u);
    std::vector<libreyolo::test::Detection> got;
    for (const auto& d : results[0].detections)
      got.push_back({d.x1, d.y1, d.x2, d.y2, d.score, d.class_id});
    const std::string p = "whole.img" + std::to_string(i) + ".";
    expect_same_detections(got, detections(expected(p + "boxes"), expected(p + "scores"), expected(p + "classes")), "api " + p);
  }
}
