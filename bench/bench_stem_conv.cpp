// A detector's first convolution (3 input channels, 3x3) one shape at a time, printed as JSON: GPU
// time of the forward with the direct kernel (layers/stem_conv.hpp) and with cuDNN (its autotuned pick, what the training step and
// inference used before).
//
//   bench_stem_conv [--batches 1,32] [--channels 16,32] [--dtypes bf16,fp32] [--imgsz 640]
//                   [--stride 2] [--launches 20] [--reps 5]
//
// Each timing replays a CUDA graph of `launches` back-to-back calls `reps` times and keeps the
// fastest replay (no host launch cost, as in a captured step). CUDA only.
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "layers/stem_conv.hpp"

namespace libreyolo {
namespace {

struct Options {
  std::vector<int64_t> batches = {1, 32};
  std::vector<int64_t> channels = {16, 32};
  std::vector<std::string> dtypes = {"bf16", "fp32"};
  int64_t imgsz = 640, stride = 2;
  int launches = 20;
  int reps = 5;
};

using bench::split;
using bench::split_ints;

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--batches") o.batches = split_ints(val());
    else if (a == "--channels") o.channels = split_ints(val());
    else if (a == "--dtypes") o.dtypes = split(val());
    else if (a == "--imgsz") o.imgsz = std::stoll(val());
    else if (a == "--stride") o.stride = std::stoll(val());
    else if (a == "--launches") o.launches = std::stoi(val());
    else if (a == "--reps") o.reps = std::stoi(val());
    else throw std::invalid_argument("unknown argument " + a);
  }
  for (const auto& d : o.dtypes)
    if (d != "bf16" && d != "fp16" && d != "fp32") throw std::invalid_argument("--dtypes takes bf16, fp16, fp32");
  if (o.launches < 1 || o.reps < 1 || o.imgsz < 3 || o.stride < 1)
    throw std::invalid_argument("--launches, --reps, --stride >= 1 and --imgsz >= 3");
  return o;
}

#ifdef LIBREYOLO_CUDA_KERNELS
// Microseconds per call of `body` (bench::graph_time_us: the fastest replay of a graph of
// `launches` calls).
double time_us(const std::function<void()>& body, const Options& o) {
  return bench::graph_time_us(body, o.launches, o.reps, /*warm=*/2);
}

nlohmann::json bench_shape(const Options& o, const std::string& dtype, int64_t batch, int64_t co) {
  const auto dt = dtype == "bf16" ? torch::kBFloat16 : dtype == "fp16" ? torch::kHalf : torch::kFloat;
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
  const auto cl = at::MemoryFormat::ChannelsLast;
  const int64_t pad = 1, s = o.stride;
  const auto x = torch::randn({batch, 3, o.imgsz, o.imgsz}, opts).contiguous(cl);
  const auto w = torch::randn({co, 3, 3, 3}, opts).contiguous(cl);
  const auto y = at::convolution(x, w, {}, {s, s}, {pad, pad}, {1, 1}, false, {0, 0}, 1);
  nlohmann::json r = {{"dtype", dtype}, {"batch", batch}, {"out_channels", co}, {"imgsz", o.imgsz}, {"stride", s}};
  if (!libreyolo::models::stem_conv_applies(x, w, s, pad, 1)) {
    r["kernels"] = "not applicable (LIBREYOLO_STEM_KERNEL=0?)";
  } else {
    r["forward_us"] = time_us([&] { libreyolo::models::stem_conv_forward(x, w, s, pad); }, o);
  }
  r["cudnn_forward_us"] =
      time_us([&] { at::convolution(x, w, {}, {s, s}, {pad, pad}, {1, 1}, false, {0, 0}, 1); }, o);
  // The bytes the forward must move at least: x read, y written.
  r["min_bytes_mb"] = static_cast<double>((x.numel() + y.numel()) * x.element_size()) / 1e6;
  return r;
}
#endif

}  // namespace
}  // namespace libreyolo

using namespace libreyolo;

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
#ifdef LIBREYOLO_CUDA_KERNELS
    if (!torch::cuda::is_available()) throw std::runtime_error("bench_stem_conv needs a CUDA device");
    at::globalContext().setBenchmarkCuDNN(true);
    nlohmann::json results = nlohmann::json::array();
    for (const auto& d : o.dtypes)
      for (int64_t b : o.batches)
        for (int64_t c : o.channels) {
          results.push_back(bench_shape(o, d, b, c));
          std::fprintf(stderr, "%s\n", results.back().dump().c_str());
        }
    std::cout << nlohmann::json{{"benchmark", "stem_conv"}, {"launches", o.launches}, {"reps", o.reps},
                                {"results", results}}
                     .dump(2)
              << std::endl;
    return 0;
#else
    (void)o;
    throw std::runtime_error("bench_stem_conv: this build has no CUDA kernels");
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_stem_conv: %s\n", e.what());
    return 2;
  }
}
