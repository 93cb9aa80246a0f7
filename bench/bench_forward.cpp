// Forward (inference) latency and throughput of the detector families, printed as JSON.
//
//   bench_forward [--family yolo9] [--device cpu|cuda] [--dtype fp32|bf16|fp16] [--channels-last]
//                 [--sizes t,s] [--batches 1,8,32] [--imgsz 640] [--iters 20] [--warmup 5]
//                 [--cuda-graph off,on] [--fold on,off] [--cudnn-benchmark off,on] [--kernels] [--verbose]
//
// --cuda-graph: each configuration through the model's inference path instead (uint8 NHWC images
// on the device -> input conversion, forward, decode; models::ForwardGraphs), once per listed mode:
// off = eager, on = one CUDA graph per shape replayed.
//
// --fold: each configuration once per listed setting of BatchNorm folding (layers/fold.hpp;
// default: the process's setting, LIBREYOLO_FOLD_BN), reported as "fold".
// --cudnn-benchmark: each configuration once per listed setting of cuDNN autotuning
// (core/device.hpp configure_cudnn; default: ATen's, off), reported as "cudnn_benchmark".
// --kernels (CUDA): instead of timing, count the GPU kernels of one forward (eager: one
// predict_tensor or ForwardGraphs call after the warm-up; graph on: one replay) with the Kineto
// profiler, their summed busy time and the kernels that took most of it. A run of its own: the profiler slows later launches.
// --verbose: debug log lines (e.g. each cuDNN fused plan candidate's engine and time).
//
// Each configuration runs the eval-mode forward plus decode (Detector::predict_tensor) under
// inference mode; bf16/fp16 run under autocast, as validation does. Each timed iteration is
// bracketed by a device synchronisation, so min/median are per-call latencies.
#include <ATen/autocast_mode.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#ifdef LIBREYOLO_CUDA
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

#include "bench_util.hpp"
#include "libreyolo/errors.hpp"
#include "core/device.hpp"
#include "core/log.hpp"
#include "layers/fold.hpp"
#include "layers/cudnn_fusion.hpp"
#include "models/detector.hpp"
#include "models/forward_graphs.hpp"

namespace {

using libreyolo::UsageError;

struct Options {
  std::string family = "yolo9";
  std::string device = "cpu";
  std::string dtype = "fp32";
  bool channels_last = false;
  std::vector<std::string> sizes = {"t", "s"};
  std::vector<int64_t> batches = {1, 8, 32};
  int64_t imgsz = 640;
  int iters = 20;
  int warmup = 5;
  std::vector<std::string> graph_modes;  // empty: the plain predict_tensor loop
  std::vector<std::string> folds;        // empty: the process's setting
  std::vector<std::string> autotune;     // empty: ATen's default (no cuDNN autotuning)
  bool kernels = false;
};

using libreyolo::bench::split;

int64_t to_int(const std::string& flag, const std::string& v, int64_t min) {
  try {
    size_t used = 0;
    const long long n = std::stoll(v, &used);
    if (used == v.size() && n >= min) return n;
  } catch (const std::exception&) {
  }
  throw UsageError(flag + " expects an integer >= " + std::to_string(min) + ", got '" + v + "'");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--family") o.family = value();
    else if (a == "--device") o.device = value();
    else if (a == "--dtype") o.dtype = value();
    else if (a == "--channels-last") o.channels_last = true;
    else if (a == "--sizes") o.sizes = split(value());
    else if (a == "--batches") {
      o.batches.clear();
      for (const auto& b : split(value())) o.batches.push_back(to_int(a, b, 1));
    } else if (a == "--imgsz") o.imgsz = to_int(a, value(), 32);
    else if (a == "--iters") o.iters = static_cast<int>(to_int(a, value(), 1));
    else if (a == "--warmup") o.warmup = static_cast<int>(to_int(a, value(), 0));
    else if (a == "--cuda-graph") o.graph_modes = split(value());
    else if (a == "--fold") o.folds = split(value());
    else if (a == "--cudnn-benchmark") o.autotune = split(value());
    else if (a == "--kernels") o.kernels = true;
    else if (a == "--verbose") libreyolo::set_log_level(libreyolo::LogLevel::Debug);
    else throw UsageError("unknown flag " + a);
  }
  if (o.device != "cpu" && o.device.rfind("cuda", 0) != 0) {
    throw UsageError("--device must be cpu or cuda[:N], got " + o.device);
  }
  if (o.dtype != "fp32" && o.dtype != "bf16" && o.dtype != "fp16") {
    throw UsageError("--dtype must be fp32, bf16 or fp16, got " + o.dtype);
  }
  if (o.imgsz % 32 != 0) throw UsageError("--imgsz must be a multiple of 32");
  if (o.sizes.empty() || o.batches.empty()) throw UsageError("--sizes and --batches need values");
  for (const auto& f : o.folds)
    if (f != "on" && f != "off") throw UsageError("--fold takes on and/or off, got " + f);
  for (const auto& f : o.autotune)
    if (f != "on" && f != "off") throw UsageError("--cudnn-benchmark takes on and/or off, got " + f);
  if (o.kernels && o.device == "cpu") throw UsageError("--kernels needs --device cuda");
  return o;
}

// Conv weights in NHWC too, so that cuDNN/oneDNN need no layout conversions.
void to_channels_last(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
  }
}

// Enables autocast for one device type and restores the previous state on exit.
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType type, std::optional<c10::ScalarType> dtype) : type_(type) {
    was_enabled_ = at::autocast::is_autocast_enabled(type);
    old_dtype_ = at::autocast::get_autocast_dtype(type);
    if (dtype) {
      at::autocast::set_autocast_dtype(type, *dtype);
      at::autocast::set_autocast_enabled(type, true);
    }
  }
  ~AutocastScope() {
    at::autocast::set_autocast_enabled(type_, was_enabled_);
    at::autocast::set_autocast_dtype(type_, old_dtype_);
    at::autocast::clear_cache();
  }

 private:
  c10::DeviceType type_;
  bool was_enabled_;
  c10::ScalarType old_dtype_;
};


// GPU kernels of fn() (run once) and their summed busy time, from a Kineto trace.
nlohmann::json count_kernels(const std::function<void()>& fn) {
#ifdef LIBREYOLO_CUDA
  torch::profiler::impl::ProfilerConfig cfg(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<torch::profiler::impl::ActivityType> acts{torch::profiler::impl::ActivityType::CPU,
                                                           torch::profiler::impl::ActivityType::CUDA};
  torch::autograd::profiler::prepareProfiler(cfg, acts);
  torch::autograd::profiler::enableProfiler(cfg, acts);
  fn();
  torch::cuda::synchronize();
  auto result = torch::autograd::profiler::disableProfiler();
  int64_t kernels = 0;
  double us = 0;
  std::map<std::string, std::pair<int64_t, double>> by_name;  // count, us
  for (const auto& e : result->events()) {
    if (e.deviceType() == c10::DeviceType::CUDA && e.activityType() == 5) {  // a kernel
      ++kernels;
      us += e.durationNs() / 1000.0;
      auto& slot = by_name[e.name().substr(0, 90)];
      ++slot.first;
      slot.second += e.durationNs() / 1000.0;
    }
  }
  std::vector<std::pair<std::string, std::pair<int64_t, double>>> top(by_name.begin(), by_name.end());
  std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  nlohmann::json heaviest = nlohmann::json::array();
  for (size_t i = 0; i < top.size() && i < 25; ++i)
    heaviest.push_back({{"kernel", top[i].first}, {"count", top[i].second.first}, {"ms", top[i].second.second / 1000.0}});
  return {{"kernels_per_forward", kernels}, {"kernel_busy_ms", us / 1000.0}, {"heaviest", heaviest}};
#else
  (void)fn;
  throw UsageError("--kernels: this build has no CUDA");
#endif
}

// Through models::ForwardGraphs (eager or graphed), from uint8 images on the device.
nlohmann::json run_graph_mode(const libreyolo::models::Family& family, const std::string& size, int64_t batch,
                              const Options& o, const torch::Device& device, const std::string& mode) {
  namespace m = libreyolo::models;
  auto model = family.build(size, 80);
  model->eval();
  model->to(device);
  if (o.channels_last) to_channels_last(*model);
  m::ForwardGraphs graphs;
  m::ForwardSpec spec;
  spec.device = device;
  spec.amp = o.dtype != "fp32";
  spec.amp_dtype = o.dtype == "bf16" ? torch::kBFloat16 : torch::kHalf;
  spec.channels_last = o.channels_last;
  const m::GraphMode gm = mode == "on" ? m::GraphMode::On : m::GraphMode::Off;
  auto images = torch::randint(0, 256, {batch, o.imgsz, o.imgsz, 3}, torch::TensorOptions().dtype(torch::kUInt8)).to(device);
  // The first call of a shape: cuDNN's choice of algorithms (autotuned when graphed) and the capture.
  const auto first0 = std::chrono::steady_clock::now();
  graphs.forward(*model, family, images, spec, gm);
  libreyolo::synchronize(device);
  const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - first0).count();
  for (int i = 0; i < o.warmup; ++i) graphs.forward(*model, family, images, spec, gm);
  libreyolo::synchronize(device);
  const std::string fold = m::common::fold_bn() ? "on" : "off";
  const bool tuned = at::globalContext().benchmarkCuDNN();
  if (o.kernels) {
    nlohmann::json r = count_kernels([&] { graphs.forward(*model, family, images, spec, gm); });
    r.update({{"family", family.name}, {"size", size}, {"batch", batch}, {"imgsz", o.imgsz}, {"dtype", o.dtype},
              {"channels_last", o.channels_last}, {"cuda_graph", mode}, {"fold", fold}, {"cudnn_benchmark", tuned}});
    return r;
  }
  std::vector<double> ms;
  for (int i = 0; i < o.iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto y = graphs.forward(*model, family, images, spec, gm);
    libreyolo::synchronize(device);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const auto info = graphs.info();
  const auto fusion = libreyolo::models::cudnn_fusion_stats();
  return {{"family", family.name}, {"size", size}, {"batch", batch}, {"imgsz", o.imgsz}, {"device", device.str()},
          {"dtype", o.dtype}, {"channels_last", o.channels_last}, {"cuda_graph", mode}, {"fold", fold},
          {"cudnn_benchmark", tuned}, {"first_call_ms", first_ms}, {"iters", o.iters},
          {"min_ms", ms.front()}, {"median_ms", ms[ms.size() / 2]},
          {"img_per_s", 1000.0 * static_cast<double>(batch) / ms[ms.size() / 2]},
          {"graph_replays", info.replays}, {"graphs", info.captured},
          {"cudnn_fusion", {{"enabled", libreyolo::models::cudnn_fusion_enabled()}, {"fused_plans", fusion.fused},
                            {"declined", fusion.declined}, {"loaded", fusion.loaded}, {"build_ms", fusion.build_ms}}}};
}

nlohmann::json run_one(const libreyolo::models::Family& family, const std::string& size,
                       int64_t batch, const Options& o, const torch::Device& device) {
  auto model = family.build(size, 80);
  model->eval();
  model->to(device);
  if (o.channels_last) to_channels_last(*model);

  torch::InferenceMode inference;
  auto x = torch::rand({batch, 3, o.imgsz, o.imgsz}, torch::TensorOptions().device(device));
  if (o.channels_last) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
  std::optional<c10::ScalarType> amp;
  if (o.dtype == "bf16") amp = torch::kBFloat16;
  if (o.dtype == "fp16") amp = torch::kHalf;
  AutocastScope autocast(device.type(), amp);

  for (int i = 0; i < o.warmup; ++i) model->predict_tensor(x);
  libreyolo::synchronize(device);
  const std::string fold = libreyolo::models::common::fold_bn() ? "on" : "off";
  const bool tuned = at::globalContext().benchmarkCuDNN();
  if (o.kernels) {
    nlohmann::json r = count_kernels([&] { model->predict_tensor(x); });
    r.update({{"family", family.name}, {"size", size}, {"batch", batch}, {"imgsz", o.imgsz}, {"dtype", o.dtype},
              {"channels_last", o.channels_last}, {"fold", fold}, {"cudnn_benchmark", tuned}});
    return r;
  }
  std::vector<double> ms;
  ms.reserve(o.iters);
  for (int i = 0; i < o.iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto y = model->predict_tensor(x);
    libreyolo::synchronize(device);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  double mean = 0;
  for (double v : ms) mean += v / static_cast<double>(n);
  return {{"family", family.name}, {"size", size},          {"batch", batch},
          {"imgsz", o.imgsz},      {"device", device.str()}, {"dtype", o.dtype},
          {"channels_last", o.channels_last},                {"fold", fold}, {"cudnn_benchmark", tuned},
          {"iters", o.iters},
          {"warmup", o.warmup},    {"min_ms", sorted.front()}, {"median_ms", median},
          {"mean_ms", mean},       {"img_per_s", 1000.0 * static_cast<double>(batch) / median}};
}

}  // namespace

int main(int argc, char** argv) {
  // Steady-state figures: fused convolution plans built by the call that first needs them, not in the
  // background (the first timed runs would be unfused); the environment may still say otherwise.
  setenv("LIBREYOLO_CUDNN_PLAN_BUILD", "wait", /*overwrite=*/0);
  try {
    const Options o = parse(argc, argv);
    const auto* family = libreyolo::models::find_family(o.family);
    if (!family) throw UsageError("unknown family " + o.family);
    for (const auto& s : o.sizes) {
      if (std::find(family->sizes.begin(), family->sizes.end(), s) == family->sizes.end()) {
        throw UsageError("unknown size '" + s + "' for family " + o.family);
      }
    }
    const torch::Device device(o.device);
    if (device.is_cuda() && !torch::cuda::is_available()) {
      throw UsageError("--device " + o.device + " but CUDA is not available");
    }
    nlohmann::json results = nlohmann::json::array();
    std::vector<std::string> folds = o.folds;
    if (folds.empty()) folds.push_back(libreyolo::models::common::fold_bn() ? "on" : "off");
    std::vector<std::string> tunes = o.autotune;
    if (tunes.empty()) tunes.push_back("default");
    for (const auto& s : o.sizes) {
      for (int64_t b : o.batches) {
        for (const auto& f : folds) for (const auto& t : tunes) {
          libreyolo::models::common::set_fold_bn(f == "on");
          if (t != "default")
            for (const std::string& line : libreyolo::configure_cudnn(t == "on")) std::fprintf(stderr, "%s\n", line.c_str());
          if (o.graph_modes.empty()) {
            results.push_back(run_one(*family, s, b, o, device));
          } else {
            for (const auto& gm : o.graph_modes) {
              results.push_back(run_graph_mode(*family, s, b, o, device, gm));
              std::fprintf(stderr, "%s\n", results.back().dump().c_str());
            }
          }
        }
      }
    }
    nlohmann::json out = {{"bench", "forward"},
                          {"torch", TORCH_VERSION},
                          {"threads", at::get_num_threads()},
                          {"results", results}};
    std::cout << out.dump(2) << std::endl;
    return 0;
  } catch (const libreyolo::Error& e) {
    std::fprintf(stderr, "bench_forward: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_forward: %s\n", e.what());
    return 1;
  }
}
