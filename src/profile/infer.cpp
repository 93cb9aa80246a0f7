#include "profile/infer.hpp"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#ifdef LIBREYOLO_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include "core/device.hpp"
#include "core/log.hpp"
#include "core/paths.hpp"
#include "profile/analysis.hpp"
#include "profile/user_scope.hpp"
#include "profile/window.hpp"

namespace libreyolo::profile {

namespace fs = std::filesystem;
namespace kp = torch::autograd::profiler;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double round_half_even(double x) {
  const double f = std::floor(x), d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return std::fmod(f, 2.0) == 0.0 ? f : f + 1;
}

}  // namespace

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const double n1 = static_cast<double>(sorted.size() - 1);
  const auto i = static_cast<size_t>(std::min(n1, round_half_even(q / 100.0 * n1)));
  return sorted[i];
}

std::pair<std::string, std::string> inference_verdict(double pre, double fwd, double post, bool cuda,
                                                      double traced_util, bool graphed) {
  const double step = pre + fwd + post;
  if (step <= 0) return {"inference", "insufficient timing to classify"};
  char buf[256];
  // A host-side stage that takes at least as long as the forward and over a third of the iteration.
  const struct {
    double ms;
    const char* verdict;
    const char* name;
    const char* remedy;
  } stages[] = {{post, "nms / postprocess", "postprocess", "lower max_det, raise conf, fewer classes, or an NMS-free model"},
                {pre, "preprocess", "preprocess", "a larger batch, faster decode, or GPU preprocessing"}};
  for (const auto& st : stages) {
    if (st.ms >= fwd && st.ms / step >= 0.35) {
      std::snprintf(buf, sizeof buf, "%s takes %.0f%% of the iteration (%.2f ms): %s", st.name, 100 * st.ms / step,
                    st.ms, st.remedy);
      return {st.verdict, buf};
    }
  }
  if (!cuda) {
    std::snprintf(buf, sizeof buf, "forward takes %.0f%% of the iteration on the CPU", 100 * fwd / step);
    return {"compute", buf};
  }
  if (traced_util < 0.8) {
    if (graphed)
      std::snprintf(buf, sizeof buf,
                    "GPU only ~%.0f%% busy during the forward although it is replayed from a CUDA graph: the input "
                    "upload, the synchronisation after it and a small batch's short kernels leave it idle (a larger "
                    "batch)",
                    100 * traced_util);
    else
      std::snprintf(buf, sizeof buf,
                    "GPU only ~%.0f%% busy during the forward: launch overhead dominates (cuda_graph=true, a larger "
                    "batch)",
                    100 * traced_util);
    return {"host / launch", buf};
  }
  std::snprintf(buf, sizeof buf, "the GPU is busy ~%.0f%% of the iteration", 100 * traced_util);
  return {"compute", buf};
}

InferReport profile_inference(const InferOptions& opt_in, const InferStages& st, c10::Device device, json meta,
                              const std::string& run_dir) {
  InferOptions opt = opt_in;
  opt.runs = std::max(2, opt.runs);
  opt.batch = std::max(1, opt.batch);
  opt.warmup = std::max(0, opt.warmup);
  const int half = std::max(1, opt.runs / 2);
  const bool cuda = device.is_cuda();
  auto sync = [&] { synchronize(device); };

  for (int i = 0; i < opt.warmup; ++i) {
    st.preprocess(i);
    st.forward();
    st.postprocess();
  }
  sync();
#ifdef LIBREYOLO_CUDA
  if (cuda) {
    try {
      c10::cuda::CUDACachingAllocator::resetPeakStats(device.index() < 0 ? 0 : device.index());
    } catch (...) {
    }
  }
#endif

  std::set<torch::profiler::impl::ActivityType> acts{torch::profiler::impl::ActivityType::CPU};
  if (cuda) acts.insert(torch::profiler::impl::ActivityType::CUDA);
  const torch::profiler::impl::ProfilerConfig cfg(torch::profiler::impl::ProfilerState::KINETO, false, false, false);
  bool tracing = false;
  if (opt.trace) {
    try {
      set_kineto_environment(cuda);
      kp::prepareProfiler(cfg, acts);
      kp::enableProfiler(cfg, acts);
      tracing = true;
    } catch (const std::exception& e) {
      log_warn(std::string("profiler: the Kineto trace could not be started (") + e.what() +
               "); the summary is written without it");
    }
  }
  std::vector<double> latency;
  double sum_pre = 0, sum_fwd = 0, sum_post = 0;
  int synced = 0;
  for (int m = 0; m < opt.runs; ++m) {
    const int i = opt.warmup + m;
    UserScope step("ProfilerStep#" + std::to_string(m));
    if (m < half) {
      const auto t0 = Clock::now();
      {
        UserScope s("step/preprocess");
        st.preprocess(i);
      }
      {
        UserScope s("step/forward");
        st.forward();
      }
      {
        UserScope s("step/postprocess");
        st.postprocess();
      }
      sync();
      latency.push_back(ms_since(t0));
    } else {
      auto t = Clock::now();
      {
        UserScope s("step/preprocess");
        st.preprocess(i);
        sync();
      }
      sum_pre += ms_since(t);
      t = Clock::now();
      {
        UserScope s("step/forward");
        st.forward();
        sync();
      }
      sum_fwd += ms_since(t);
      t = Clock::now();
      {
        UserScope s("step/postprocess");
        st.postprocess();
        sync();
      }
      sum_post += ms_since(t);
      ++synced;
    }
  }
  std::unique_ptr<kp::ProfilerResult> result;
  if (tracing) {
    try {
      result = kp::disableProfiler();
    } catch (const std::exception& e) {
      log_warn(std::string("profiler: stopping Kineto failed: ") + e.what());
    }
    after_kineto_trace(cuda);
  }

  InferReport r;
  std::vector<double> sorted = latency;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double v : latency) mean += v / static_cast<double>(latency.size());
  r.latency = {{"p50_ms", round_to(percentile(sorted, 50), 3)}, {"p90_ms", round_to(percentile(sorted, 90), 3)},
               {"p99_ms", round_to(percentile(sorted, 99), 3)}, {"mean_ms", round_to(mean, 3)},
               {"min_ms", round_to(sorted.front(), 3)},       {"max_ms", round_to(sorted.back(), 3)},
               {"n", static_cast<int>(sorted.size())}};
  const double pre = synced ? sum_pre / synced : 0, fwd = synced ? sum_fwd / synced : 0,
               post = synced ? sum_post / synced : 0;
  r.stages_ms = {{"preprocess", round_to(pre, 3)}, {"forward", round_to(fwd, 3)}, {"postprocess", round_to(post, 3)}};
  r.img_per_s = mean > 0 ? opt.batch / (mean / 1000.0) : 0;
  double peak_mb = -1;
#ifdef LIBREYOLO_CUDA
  if (cuda) {
    try {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
      peak_mb = static_cast<double>(
                    stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak) /
                1e6;
    } catch (...) {
    }
  }
#endif

  meta["mode"] = "inference";
  if (!meta.contains("device")) meta["device"] = device.str();
  json summary = {{"meta", meta},
                  {"window", {{"warmup", opt.warmup}, {"real_steps", half}, {"synced_steps", synced}}},
                  {"real",
                   {{"step_ms", round_to(mean, 3)},
                    {"img_per_s", round_to(r.img_per_s, 2)},
                    {"dataload_ms", 0.0},
                    {"dataload_frac", 0.0}}},
                  {"latency", r.latency},
                  {"stages_ms", r.stages_ms}};
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  const fs::path dir(run_dir);
  json prof;
  double util = 1.0;
  bool analysed = false;
  if (result) {
    const std::string trace_path = (dir / "profile_trace.json").string();
    try {
      result->save(trace_path);
      r.trace_path = trace_path;
      summary["trace"] = trace_path;
      std::ifstream in(trace_path, std::ios::binary);
      const json trace = json::parse(in);
      prof = analyze_trace(trace, &summary, trace_path);
      util = prof.value("gpu_util", 1.0);
      analysed = true;
    } catch (const std::exception& e) {
      log_warn(std::string("profiler: the trace could not be written or analysed: ") + e.what());
    }
  }
  const std::string graph_mode = meta.value("cuda_graph", std::string("false"));
  auto [bound, why] = inference_verdict(pre, fwd, post, cuda, util, graph_mode != "false" && graph_mode != "off");
  if (analysed && prof.value("bound", std::string()) == "memory-pressure") {
    bound = "memory-pressure";
    why = prof.value("bound_why", why);
  }
  r.bound = bound;
  r.bound_why = why;
  summary["bound"] = bound;
  summary["bound_why"] = why;
  if (peak_mb >= 0) summary["analysis"] = {{"peak_vram_mb", round_to(peak_mb, 1)}};
  if (!analysed) {
    // Without a trace: the same schema, device fields empty, one phase row per stage.
    prof = {{"schema", kSchema},       {"trace", nullptr},    {"step_ms", round_to(mean, 3)},
            {"gpu_util", nullptr},     {"kernels_per_step", 0}, {"gpu_busy_ms_per_step", 0.0},
            {"top_kernels", json::array()}, {"categories", json::array()},
            {"window", {{"wall_ms", 0.0}, {"real_steps", half}}}};
    json phases = json::array();
    for (const char* k : {"preprocess", "forward", "postprocess"})
      phases.push_back({{"phase", k}, {"wall_ms_per_step", r.stages_ms[k]}, {"gpu_ms_per_step", 0.0}});
    prof["phases"] = phases;
    prof["metrics"] = json::object();
  }
  prof["mode"] = "inference";
  prof["config"] = meta;
  prof["img_per_s"] = round_to(r.img_per_s, 2);
  prof["latency"] = r.latency;
  prof["stages_ms"] = r.stages_ms;
  prof["bound"] = bound;
  prof["bound_why"] = why;
  if (!prof.contains("metrics") || !prof["metrics"].is_object()) prof["metrics"] = json::object();
  auto& mx = prof["metrics"];
  mx["latency_p50_ms"] = r.latency["p50_ms"];
  mx["latency_p90_ms"] = r.latency["p90_ms"];
  mx["latency_p99_ms"] = r.latency["p99_ms"];
  mx["throughput_img_s"] = round_to(r.img_per_s, 2);
  mx["preprocess_ms"] = r.stages_ms["preprocess"];
  mx["forward_ms"] = r.stages_ms["forward"];
  mx["nms_ms"] = r.stages_ms["postprocess"];
  mx["bound"] = bound;
  r.profile_path = (dir / "profile.json").string();
  r.summary_path = (dir / "profile_summary.json").string();
  write_file_atomic(r.profile_path, prof.dump() + "\n");
  write_file_atomic(r.summary_path, summary.dump(2) + "\n");

  char buf[512];
  std::snprintf(buf, sizeof buf,
                "================ inference profile ================\n"
                "%s | batch %d | %s\n"
                "latency p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  (n=%d)  -> %.1f img/s\n"
                "stages (synced): preprocess %.2f ms  forward %.2f ms  postprocess %.2f ms\n",
                meta.value("model", std::string("?")).c_str(), opt.batch, device.str().c_str(),
                r.latency["p50_ms"].get<double>(), r.latency["p90_ms"].get<double>(), r.latency["p99_ms"].get<double>(),
                r.latency["n"].get<int>(), r.img_per_s, pre, fwd, post);
  r.text = buf;
  if (analysed && cuda)
    r.text += strfmt("GPU busy %.0f%% of the iteration, %lld kernels per iteration\n", 100 * util,
                     static_cast<long long>(prof.value("kernels_per_step", 0LL)));
  r.text += "verdict: " + bound_label(bound) + "  (" + why + ")\n";
  r.text += "profile: " + r.profile_path + "\n";
  r.text += "===================================================\n";
  return r;
}

}  // namespace libreyolo::profile
