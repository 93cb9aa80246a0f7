// Latency of decoding one 640x480 JPEG (the sample scene, quality 90) into what the forward
// needs, on this machine, as predict() of one image pays it:
//   cpu:    libjpeg-turbo (io::decode_image_bytes, predict's decoder) into new host memory;
//   cpu_file_reused_memory: the same from the file, into memory reused between images;
//   nvjpeg: nvJPEG on the GPU (the GPU loader's batch maker: the JPEG engines where the GPU has
//           them), decoded and letterboxed into a 640x640 uint8 image on the device, synchronised.
// Prints one JSON object: min and median ms over --iters runs after --warmup.
//   bench_jpeg_decode [--iters 200] [--warmup 20]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>

#include "data/gpu_batch.hpp"
#include "io/image.hpp"
#include "io/sample_image.hpp"

namespace {

nlohmann::json time_it(int iters, int warmup, const std::function<void()>& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return {{"min_ms", t.front()}, {"median_ms", t[t.size() / 2]}};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace libreyolo;
  int iters = 200, warmup = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--iters") iters = std::stoi(argv[i + 1]);
    else if (a == "--warmup") warmup = std::stoi(argv[i + 1]);
  }
  const std::string jpeg = io::encode_jpeg(io::make_sample_image(480, 640), 90);
  auto bytes = std::make_shared<const std::vector<uint8_t>>(jpeg.begin(), jpeg.end());
  nlohmann::json out = {{"benchmark", "jpeg_decode_one"}, {"image", "640x480 q90"}, {"bytes", jpeg.size()}};
  out["cpu"] = time_it(iters, warmup, [&] { io::decode_image_bytes(bytes->data(), bytes->size(), "sample"); });
  // The same decoder reading the file into, and decoding into, memory reused between images.
  const std::string path = "/tmp/libreyolo_bench_jpeg_decode.jpg";
  io::save_image(path, io::make_sample_image(480, 640), 90);
  io::DecodeScratch scratch;
  out["cpu_file_reused_memory"] = time_it(iters, warmup, [&] { io::decode_image_for_size(path, 0, scratch); });
  std::string why;
  if (data::gpu_loader_available(&why)) {
    data::GpuBatchMaker maker(0, 640);
    data::PlannedSample s;
    s.plan.num_tiles = 1;
    s.plan.content_w = 640;
    s.plan.content_h = 480;
    s.plan.tiles[0] = {0, 640, 480, 0, 0, 0, 0, 640, 480};
    s.files[0] = bytes;
    s.names[0] = "sample";
    std::vector<std::pair<int64_t, std::string>> bad;
    out["nvjpeg"] = time_it(iters, warmup, [&] { maker.make({s}, &bad); });
    out["nvjpeg_backend"] = maker.backend();
  } else {
    out["nvjpeg"] = why;
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}
