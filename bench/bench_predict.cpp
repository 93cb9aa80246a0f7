// Whole predict() of one 640x480 JPEG (decode, letterbox, forward, NMS), as the reference's
// 25.5 ms figure (LibreYOLO 1.6.0 on the H200 machine) was measured; with --folder N, a folder of
// N such JPEGs (different scenes) predicted at --batch B, reported as images per second end to
// end (one untimed pass first), plus the first image's detections count at batch B and at batch 1.
// Also the process's first predict (load_ms: the model built and moved to the device; first_ms: the
// first call), which is a cold start when the cuDNN plan cache (LIBREYOLO_CUDNN_PLAN_CACHE) is empty;
// --plans background (the library's default) or wait (this program's: every plan in place before the
// steady-state figures) says how fused convolution plans missing from the cache are built.
// --imgsz: default the model's own input size (640 for the detectors).
//   bench_predict --device cuda [--model yolo9t] [--iters 100] [--warmup 10] [--imgsz N] [--half]
//                 [--cuda-graph off|on|auto] [--plans wait|background] [--folder N --batch B]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include <libreyolo/libreyolo.hpp>

#include "data/gpu_batch.hpp"
#include "engine/predictor.hpp"
#include "io/image.hpp"
#include "io/sample_image.hpp"
#include "layers/cudnn_fusion.hpp"

namespace {

int run(int argc, char** argv) {
  std::string device = "cpu", model = "yolo9t";
  int iters = 100, warmup = 10, imgsz = 0;  // 0: the model's
  bool half = false;
  std::string graph = "off";
  int folder = 0, batch = 1;
  std::string plans = "wait";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--device") device = val();
    else if (a == "--model") model = val();
    else if (a == "--iters") iters = std::stoi(val());
    else if (a == "--warmup") warmup = std::stoi(val());
    else if (a == "--imgsz") imgsz = std::stoi(val());
    else if (a == "--half") half = true;
    else if (a == "--cuda-graph") {
      const std::string v = val();
      graph = v == "on" ? "true" : v;
    }
    else if (a == "--plans") plans = val();
    else if (a == "--folder") folder = std::stoi(val());
    else if (a == "--batch") batch = std::stoi(val());
    else if (a == "--sizes" || a == "--batches" || a == "--dtypes") val();  // accepted, unused
    else {
      std::cerr << "unknown argument " << a << "\n";
      return 2;
    }
  }
  const std::string path = (std::filesystem::temp_directory_path() / "libreyolo_bench_640x480.jpg").string();
  libreyolo::io::save_image(path, libreyolo::io::make_sample_image(480, 640), 90);
  if (plans != "wait" && plans != "background") {
    std::cerr << "--plans takes wait or background, not " << plans << "\n";
    return 2;
  }
  setenv("LIBREYOLO_CUDNN_PLAN_BUILD", plans.c_str(), 1);
  using Clock = std::chrono::steady_clock;
  const auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  const auto t_load = Clock::now();
  libreyolo::LibreYOLO m(model, device);
  const double load_ms = ms_since(t_load);
  libreyolo::Kwargs kw = {{"device", device}, {"half", half ? "true" : "false"}};
  if (imgsz > 0) kw.push_back({"imgsz", std::to_string(imgsz)});
  if (graph != "off") kw.push_back({"cuda_graph", graph});
  if (folder > 0) {
    const auto dir = std::filesystem::temp_directory_path() / ("libreyolo_bench_folder_" + std::to_string(folder));
    std::filesystem::create_directories(dir);
    for (int i = 0; i < folder; ++i) {
      const auto p = dir / ("img" + std::to_string(100000 + i) + ".jpg");
      if (std::filesystem::exists(p)) continue;
      // Different pictures of the scene: shifted sideways, every other one mirrored.
      torch::Tensor img = libreyolo::io::make_sample_image(480, 640).roll({(i * 37) % 640}, {1});
      if (i % 2) img = img.flip({1});
      libreyolo::io::save_image(p.string(), img.contiguous(), 90);
    }
    auto kb = kw;
    kb.push_back({"batch", std::to_string(batch)});
    m.predict(dir.string(), kb);  // untimed: graphs captured, files in the page cache
    libreyolo::engine::wait_for_predict_gpu_decoders();  // the timed call decodes on the device
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = m.predict(dir.string(), kb);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto one = m.predict((dir / "img100000.jpg").string(), kw);
    nlohmann::json out = {{"benchmark", "predict_folder"}, {"model", model}, {"device", device}, {"imgsz", imgsz},
                          {"images", r.size()}, {"batch", batch}, {"half", half}, {"cuda_graph", graph},
                          {"seconds", s}, {"img_per_s", static_cast<double>(r.size()) / s},
                          {"first_image_detections", r.at(0).detections.size()},
                          {"first_image_detections_batch1", one.at(0).detections.size()}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  const auto t_first = Clock::now();
  const auto first = m.predict(path, kw);
  const double first_ms = ms_since(t_first);
  const auto st = libreyolo::models::cudnn_fusion_stats();
  nlohmann::json cold = {{"load_ms", load_ms}, {"first_ms", first_ms}, {"first_preprocess_ms", first[0].preprocess_ms},
                         {"first_inference_ms", first[0].inference_ms}, {"first_postprocess_ms", first[0].postprocess_ms},
                         {"plans_fused", st.fused}, {"plans_loaded", st.loaded}, {"plans_pending", st.pending},
                         {"plan_build_ms", st.build_ms}, {"plans", plans}};
  const auto t_ready = Clock::now();
  libreyolo::models::cudnn_fusion_wait_background();  // the steady state has every plan
  cold["plans_ready_after_ms"] = first_ms + ms_since(t_ready);
  // ... and the device JPEG decoder, which the first call started on a thread of its own (the
  // host decoded meanwhile): its handles' creation times, off the first call's path.
  libreyolo::engine::wait_for_predict_gpu_decoders();
  cold["decoder_ready_after_ms"] = first_ms + ms_since(t_ready);
  const auto jpeg = libreyolo::data::gpu_batch_maker_start_totals();
  cold["jpeg_decoder_start_ms"] = {{"hardware", jpeg.hardware_ms}, {"hybrid", jpeg.hybrid_ms}};
  for (int i = 0; i < warmup; ++i) m.predict(path, kw);
  std::vector<double> total, pre, inf, post;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = m.predict(path, kw);
    total.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    pre.push_back(r[0].preprocess_ms);
    inf.push_back(r[0].inference_ms);
    post.push_back(r[0].postprocess_ms);
  }
  auto stat = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return nlohmann::json{{"min_ms", v.front()}, {"median_ms", v[v.size() / 2]}};
  };
  nlohmann::json out = {{"benchmark", "predict_one_jpeg"}, {"model", model}, {"device", device}, {"imgsz", imgsz},
                        {"image", "640x480 JPEG"}, {"half", half}, {"cuda_graph", graph}, {"iters", iters}, {"total", stat(total)},
                        {"preprocess", stat(pre)}, {"inference", stat(inf)}, {"postprocess", stat(post)},
                        {"first_predict", cold}};
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace

// A refused configuration (a family without a declared inference graph, a model that does not
// load, ...) ends with its message and a JSON line saying so, not with an uncaught exception.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_predict: %s\n", e.what());
    nlohmann::json err;
    err["benchmark"] = "predict_one_jpeg";
    err["error"] = e.what();
    std::printf("%s\n", err.dump().c_str());
    return 1;
  }
}
