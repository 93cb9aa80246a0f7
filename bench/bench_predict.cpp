// Whole predict() of one 640x480 JPEG (decode, letterbox, forward, NMS), as the reference's
// 25.5 ms figure (LibreYOLO 1.6.0 on the H200 machine) was measured; with --folder N, a folder of
// N such JPEGs (different scenes) predicted at --batch B, reported as images per second end to
// end (one untimed pass first), plus the first image's detections count at batch B and at batch 1.
//   bench_predict --device cuda [--model yolo9t] [--iters 100] [--warmup 10] [--imgsz 640] [--half]
//                 [--cuda-graph off|on|auto] [--folder N --batch B]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include <libreyolo/libreyolo.hpp>

#include "io/image.hpp"
#include "io/sample_image.hpp"

int main(int argc, char** argv) {
  std::string device = "cpu", model = "yolo9t";
  int iters = 100, warmup = 10, imgsz = 640;
  bool half = false;
  std::string graph = "off";
  int folder = 0, batch = 1;
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
  libreyolo::LibreYOLO m(model, device);
  libreyolo::Kwargs kw = {{"imgsz", std::to_string(imgsz)}, {"device", device}, {"half", half ? "true" : "false"}};
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
                        {"preprocess", stat(pre)}, {"inference", stat(inf)}, {"postprocess", stat(post)}};
  std::cout << out.dump(2) << "\n";
  return 0;
}
