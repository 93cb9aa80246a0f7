// PicoDet parity with LibreYOLO 1.6.0 on the CPU (tests/data/picodet_reference.pt, made by
// tests/python/make_picodet_fixture.py: a reference network far narrower than s - stages 32, 64,
// 128, neck and head 16 wide, three convolutions per head tower - with 3 classes, run at 320 on two
// stretched images, at 416 (a 7 x 7 stride-64 level) and at 400 (the top-down path's resize of a
// doubled 13 x 13 map to 25 x 25)): the checkpoint loads through the registry into a network built
// from its shapes, the input conversion, the eval forward's maps, the decode and the postprocess
// (predict's and val's thresholds, boxes mapped to the originals) match the recorded ones;
// predicting through the library's API gives the recorded detections. The recorded values are the
// reference's float64 computation rounded to float32.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "families/picodet/model.hpp"
#include "io/image.hpp"
#include "io/pickle.hpp"
#include "libreyolo/libreyolo.hpp"
#include "models/input.hpp"
#include "models/loaded_model.hpp"
#include "support.hpp"

namespace io = libreyolo::io;
namespace models = libreyolo::models;
namespace picodet = libreyolo::models::picodet;
using libreyolo::test::check_rel;
using libreyolo::test::detections;
using libreyolo::test::expect_same_detections;
using libreyolo::test::rel_err;

namespace {

const std::string kPath = std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/picodet_reference.pt";
// max |got - want| / max |want| of float32 results against float64 ones rounded to float32: a
// few dozen float32 layers accumulate relative rounding of order 1e-6 per layer (sums of at most a
// few thousand terms per output), which this network amplifies (BatchNorms subtracting running
// means large against their deviations): the reference's own float32 forward is up to 6.4e-5 from
// its float64 one (recorded per input size in the fixture). The bound is 1e-4, or three times the
// reference's own float32 error where that is larger: a float32 forward in any summation order
// lands as far as the reference's does, not three times farther.
constexpr double kBound = 1e-4;
constexpr double kReferenceErrorFactor = 3.0;
constexpr int kClasses = 3;
const std::vector<int> kSizes = {320, 416, 400};

io::PyValuePtr fixture() {
  static io::PyValuePtr root = io::load_torch_file(kPath);
  return root;
}

torch::Tensor expected(const std::string& key) {
  auto v = fixture()->get("expect")->get(key);
  if (!v || !v->is_tensor()) throw std::runtime_error("fixture has no tensor " + key);
  return v->tensor;
}

const models::Family& family() { return *models::find_family("picodet"); }

std::shared_ptr<models::Detector> network() {
  auto m = models::model_from_checkpoint(fixture(), kPath)->model;
  m->eval();
  return m;
}

std::string key(int size, const std::string& what) { return "s" + std::to_string(size) + "." + what; }

// The float32 bound at an input size for the maps ("maps") or the decoded boxes and scores.
double float32_bound(int size, const std::string& what) {
  return std::max(kBound, kReferenceErrorFactor * expected(key(size, "ref_f32_err_" + what)).item<double>());
}

// The network input as the family converts the stretched RGB images.
torch::Tensor input(int size) {
  return models::to_network_input(expected(key(size, "input_u8")).permute({0, 2, 3, 1}).contiguous(), family().input,
                                  torch::kCPU, false);
}

// The decoded values' float32 bound at an input size as detection tolerances: scores (at most 1)
// within it, boxes within it relative to the largest decoded coordinate, times the largest
// stretch-inverse factor of the originals (at most 1.6 here).
struct Tolerance {
  double score, box;
};
Tolerance detection_tolerance(int size) {
  const double bound = float32_bound(size, "decoded");
  const double coordinate = expected(key(size, "decoded")).narrow(2, 0, 4).abs().max().item<double>();
  return {bound, bound * coordinate * 1.6};
}

}  // namespace

TEST(PicodetParity, CheckpointLoadsIntoANetworkOfItsWidths) {
  auto lm = models::model_from_checkpoint(fixture(), kPath);
  EXPECT_EQ(lm->family, &family());
  EXPECT_EQ(lm->imgsz, 320);
  auto& m = dynamic_cast<picodet::PicoDetModel&>(*lm->model);
  EXPECT_EQ(m.num_classes(), kClasses);
  EXPECT_EQ(m.arch().stage, (std::array<int64_t, 3>{32, 64, 128}));
  EXPECT_EQ(m.arch().width, 16);
  EXPECT_EQ(m.arch().stacked_convs, 3);
  const auto weights = io::to_state_dict(*fixture()->get("model"));
  const auto mine = models::state_dict(m);
  ASSERT_EQ(mine.size(), 726u);
  ASSERT_EQ(mine.size(), weights.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].first, weights[i].first);
    EXPECT_TRUE(torch::equal(mine[i].second, weights[i].second)) << mine[i].first;
  }
}

TEST(PicodetParity, InputConversion) {
  // RGB minus the mean over the std: the reference's own preprocessing of the same pixels.
  for (int s : kSizes) {
    const auto x = input(s);
    ASSERT_EQ(x.size(2), s);
    ASSERT_EQ(x.size(3), s);
    check_rel(key(s, "input crop"), x.narrow(2, 0, 40).narrow(3, 180, 40), expected(key(s, "input_crop")), 1e-6);
  }
}

TEST(PicodetParity, EvalMapsAndDecode) {
  auto m = network();
  torch::NoGradGuard no_grad;
  for (int s : kSizes) {
    const auto x = input(s);
    const auto raw = m->forward_raw(x);
    ASSERT_EQ(raw.size(), 4u);
    std::vector<torch::Tensor> ref_maps;
    for (int l = 0; l < 4; ++l) {
      const auto want = expected(key(s, "raw_" + std::to_string(l)));
      const double bound = float32_bound(s, "maps");
      check_rel(key(s, "cls_" + std::to_string(l)), raw[l].narrow(1, 0, kClasses), want.narrow(1, 0, kClasses),
                bound);
      check_rel(key(s, "box_" + std::to_string(l)), raw[l].narrow(1, kClasses, 32), want.narrow(1, kClasses, 32),
                bound);
      ref_maps.push_back(want);
    }
    if (s == 416) {
      EXPECT_EQ(raw[3].size(2), 7);
    }
    if (s == 400) {
      EXPECT_EQ(raw[1].size(2), 25);
    }
    const auto pred = m->decode(raw);
    const auto want = expected(key(s, "decoded")).transpose(1, 2);  // [B, A, 4 + nc] -> [B, 4 + nc, A]
    check_rel(key(s, "decoded boxes"), pred.narrow(1, 0, 4), want.narrow(1, 0, 4), float32_bound(s, "decoded"));
    check_rel(key(s, "decoded scores"), pred.narrow(1, 4, kClasses), want.narrow(1, 4, kClasses),
              float32_bound(s, "decoded"));
    // The reference's own maps decode to its predictions as closely (the decode alone).
    check_rel(key(s, "decode of reference maps"), m->decode(ref_maps), want);
  }
  // In float64 the network gives the reference's float64 maps up to the float32 rounding of the
  // recorded values: the float32 differences above are rounding, not a different computation.
  m->to(torch::kDouble);
  for (int s : kSizes) {
    const auto raw64 = m->forward_raw(input(s).to(torch::kDouble));
    for (int l = 0; l < 4; ++l)
      check_rel(key(s, "float64 map " + std::to_string(l)), raw64[l],
                expected(key(s, "raw_" + std::to_string(l))).to(torch::kDouble), 1e-6);
  }
}

TEST(PicodetParity, PostprocessedDetections) {
  auto m = network();
  torch::NoGradGuard no_grad;
  const auto orig = expected("orig_size");
  const std::map<int, std::vector<int>> images = {{320, {0, 1}}, {416, {0}}, {400, {1}}};
  for (int s : kSizes) {
    const auto pred = m->decode(m->forward_raw(input(s)));
    for (const std::string set : {"predict", "val", "whole"}) {
      if (set == "val" && s != 320) continue;
      for (size_t i = 0; i < images.at(s).size(); ++i) {
        const int o = images.at(s)[i];
        models::PostprocessArgs a;
        a.conf = expected(set + ".conf").item<double>();
        a.iou = expected(set + ".iou").item<double>();
        a.max_det = 300;
        const int w = set == "whole" ? s : static_cast<int>(orig[o][0].item<int64_t>());
        const int h = set == "whole" ? s : static_cast<int>(orig[o][1].item<int64_t>());
        const auto box = libreyolo::ops::fit_box(h, w, s, libreyolo::ops::Fit::Stretch);
        a.geometry = {box.sx, box.sy, h, w};
        const std::string p = key(s, set + ".img" + std::to_string(i) + ".");
        const auto want = detections(expected(p + "boxes"), expected(p + "scores"), expected(p + "classes"));
        ASSERT_GT(want.size(), 0u) << p;
        const auto got = family().postprocess(pred[static_cast<int64_t>(i)], a);
        const auto tol = detection_tolerance(s);
        const double d = expect_same_detections(detections(got.boxes, got.scores, got.classes), want, p, tol.score, tol.box);
        std::printf("  %-24s %3zu detections, largest box difference %.3g px (bound %.3g)\n", p.c_str(), want.size(), d,
                    tol.box);
      }
    }
  }
}

TEST(PicodetParity, PredictThroughTheApi) {
  // The stretched 320 inputs as PNG files, predicted at 320: each is its own original, so the
  // detections are the reference's "whole" ones.
  const std::string dir = libreyolo::test::temp_dir("picodet_predict");
  libreyolo::LibreYOLO model(kPath, "cpu");
  const auto u8 = expected("s320.input_u8");
  for (int i = 0; i < 2; ++i) {
    const std::string path = dir + "/img" + std::to_string(i) + ".png";
    io::save_image(path, u8[i].permute({1, 2, 0}).contiguous());
    const auto results = model.predict(path, {{"imgsz", "320"}, {"conf", "0.25"}, {"iou", "0.45"}});
    ASSERT_EQ(results.size(), 1u);
    std::vector<libreyolo::test::Detection> got;
    for (const auto& d : results[0].detections) got.push_back({d.x1, d.y1, d.x2, d.y2, d.score, d.class_id});
    const std::string p = "s320.whole.img" + std::to_string(i) + ".";
    const auto tol = detection_tolerance(320);
    expect_same_detections(got, detections(expected(p + "boxes"), expected(p + "scores"), expected(p + "classes")), "api " + p,
                    tol.score, tol.box);
  }
}
