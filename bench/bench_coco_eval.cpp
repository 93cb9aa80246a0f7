// COCO bbox evaluation at validation scale: 5000 images x 300 detections x 80 classes
// (a COCO val2017-sized set at max_det 300). Prints JSON with the timings.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "eval/coco_eval.hpp"

using namespace libreyolo::eval;

int main(int argc, char** argv) {
  const int images = argc > 1 ? std::atoi(argv[1]) : 5000;
  const int dets_per_image = argc > 2 ? std::atoi(argv[2]) : 300;
  const int classes = 80;
  std::mt19937 rng(123);
  std::uniform_real_distribution<double> u(0, 1);

  std::vector<GtBox> gts;
  std::vector<DetBox> dets;
  dets.reserve(static_cast<size_t>(images) * dets_per_image);
  for (int i = 0; i < images; ++i) {
    const double W = 640, H = 480;
    const int n_gt = 1 + static_cast<int>(u(rng) * 14);
    const size_t first_gt = gts.size();
    for (int k = 0; k < n_gt; ++k) {
      const double w = std::exp(std::log(4.0) + u(rng) * std::log(100.0)), h = w * (0.5 + u(rng));
      const double x = u(rng) * (W - w), y = u(rng) * std::max(1.0, H - h);
      gts.push_back({i, static_cast<int>(u(rng) * classes), x, y, w, h, w * h});
    }
    // Detector-like output: many boxes around each object (same and other classes), the rest
    // scattered background at low scores.
    for (int k = 0; k < dets_per_image; ++k) {
      if (k < dets_per_image / 2) {
        const GtBox& g = gts[first_gt + k % n_gt];
        const double j = 0.3 * u(rng);
        dets.push_back({i, u(rng) < 0.7 ? g.category : static_cast<int>(u(rng) * classes),
                        g.x + (u(rng) - 0.5) * j * g.w, g.y + (u(rng) - 0.5) * j * g.h,
                        g.w * (1 + (u(rng) - 0.5) * j), g.h * (1 + (u(rng) - 0.5) * j), u(rng)});
      } else {
        const double w = 8 + u(rng) * 200, h = 8 + u(rng) * 200;
        dets.push_back({i, static_cast<int>(u(rng) * classes), u(rng) * (W - w), u(rng) * (H - h),
                        w, h, 0.3 * u(rng)});
      }
    }
  }

  using clock = std::chrono::steady_clock;
  CocoEvaluator ev;
  const auto t0 = clock::now();
  ev.add_ground_truth(gts);
  ev.add_detections(dets);
  const auto t1 = clock::now();
  const CocoStats s = ev.evaluate();
  const auto t2 = clock::now();
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::printf(
      "{\"bench\": \"coco_eval\", \"images\": %d, \"detections\": %zu, \"ground_truth\": %zu, "
      "\"classes\": %d, \"add_s\": %.4f, \"evaluate_s\": %.4f, \"mAP50_95\": %.6f, "
      "\"mAP50\": %.6f, \"AR100\": %.6f}\n",
      images, dets.size(), gts.size(), classes, secs(t0, t1), secs(t1, t2), s.stats[0], s.stats[1],
      s.stats[8]);
  return 0;
}
