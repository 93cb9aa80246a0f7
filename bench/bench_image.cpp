// Image pipeline timings: JPEG decode (full and DCT-scaled), resize, letterbox, NMS and YOLO
// post-processing. Prints one JSON object; each figure is the fastest of the repeats, in ms (the
// least disturbed by other work on a shared machine).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "io/image.hpp"
#include "io/sample_image.hpp"
#include "ops/image_ops.hpp"
#include "ops/nms.hpp"
#include "ops/postprocess.hpp"

namespace {

double best_ms(int repeats, const std::function<void()>& f) {
  f();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return *std::min_element(t.begin(), t.end());
}

}  // namespace

int main() {
  using namespace libreyolo;
  torch::set_num_threads(1);  // the loader runs one image per thread
  const auto scene = io::make_sample_image(810, 1080);
  const std::string jpeg = io::encode_jpeg(scene, 90);
  const auto* bytes = reinterpret_cast<const uint8_t*>(jpeg.data());
  const std::string path = "/tmp/libreyolo_bench_image.jpg";
  io::save_image(path, scene, 90);
  const auto big = io::make_sample_image(1280, 1280);

  std::vector<std::pair<std::string, double>> r;
  r.emplace_back("jpeg_bytes", static_cast<double>(jpeg.size()));
  r.emplace_back("decode_jpeg_1080x810", best_ms(40, [&] { io::decode_image_bytes(bytes, jpeg.size(), "b"); }));
  r.emplace_back("decode_for_size_640", best_ms(40, [&] { io::decode_image_for_size(path, 640); }));
  r.emplace_back("decode_for_size_320", best_ms(40, [&] { io::decode_image_for_size(path, 320); }));
  r.emplace_back("encode_jpeg_q90_1080x810", best_ms(10, [&] { io::encode_jpeg(scene, 90); }));
  r.emplace_back("resize_1080x810_to_640x480", best_ms(40, [&] { ops::resize_bilinear(scene, 480, 640); }));
  r.emplace_back("resize_1280x1280_to_640x640", best_ms(40, [&] { ops::resize_bilinear(big, 640, 640); }));
  r.emplace_back("resize_640x480_to_1280x960", best_ms(20, [&] { ops::resize_bilinear(ops::resize_bilinear(scene, 480, 640), 960, 1280); }));
  r.emplace_back("letterbox_1080x810_to_640", best_ms(40, [&] { ops::letterbox_topleft(scene, 640); }));

  torch::manual_seed(0);
  for (int64_t n : {1000, 10000, 30000}) {
    auto xy = torch::rand({n, 2}) * 600;
    auto boxes = torch::cat({xy, xy + torch::rand({n, 2}) * 80 + 4}, 1);
    auto scores = torch::rand({n});
    auto classes = torch::randint(0, 80, {n}, torch::kInt64);
    r.emplace_back("nms_" + std::to_string(n), best_ms(5, [&] { ops::nms(boxes, scores, 0.6); }));
    r.emplace_back("batched_nms_80cls_" + std::to_string(n),
                   best_ms(5, [&] { ops::batched_nms(boxes, scores, classes, 0.6); }));
  }
  // A YOLO head output at 640 (8400 anchors, 80 classes) with mostly low scores.
  auto pred = torch::empty({84, 8400});
  auto xy = torch::rand({2, 8400}) * 600;
  pred.slice(0, 0, 2).copy_(xy);
  pred.slice(0, 2, 4).copy_(xy + torch::rand({2, 8400}) * 100 + 4);
  pred.slice(0, 4).copy_(torch::sigmoid(torch::randn({80, 8400}) * 2 - 6));
  const auto val = ops::kValThresholds, pr = ops::kPredictThresholds;
  r.emplace_back("postprocess_val_8400x80", best_ms(10, [&] {
                   ops::postprocess_yolo(pred, val.conf, val.iou, val.max_det, {1.0, 1.0, 640, 640});
                 }));
  r.emplace_back("postprocess_predict_8400x80", best_ms(20, [&] {
                   ops::postprocess_yolo(pred, pr.conf, pr.iou, pr.max_det, {1.0, 1.0, 640, 640});
                 }));
  r.emplace_back("val_candidates", static_cast<double>((pred.slice(0, 4) > val.conf).sum().item<int64_t>()));
  std::remove(path.c_str());

  std::printf("{");
  for (size_t i = 0; i < r.size(); ++i)
    std::printf("%s\"%s\": %.4g", i ? ", " : "", r[i].first.c_str(), r[i].second);
  std::printf("}\n");
}
