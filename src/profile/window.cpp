// The measuring window. The only translation unit that includes the Kineto profiler headers.
#include "profile/window.hpp"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#ifdef LIBREYOLO_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <libreyolo/hooks.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/device.hpp"
#include "core/log.hpp"
#include "profile/analysis.hpp"
#include "profile/user_scope.hpp"
#include "profile/timeline.hpp"

namespace libreyolo::profile {

namespace fs = std::filesystem;
namespace kp = torch::autograd::profiler;
using Clock = std::chrono::steady_clock;

// The training loop's names, whose phases are these after its Dataload.
static_assert(static_cast<int>(libreyolo::Phase::Optimizer) == static_cast<int>(Phase::Optimizer) + 1);
void set_kineto_environment(bool device_trace) {
  setenv("TEARDOWN_CUPTI", "1", /*overwrite=*/0);
  if (!device_trace) setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);  // above Kineto's ERROR (4)
}

void after_kineto_trace(bool device_trace) {
#ifdef LIBREYOLO_CUDA
  if (device_trace) c10::cuda::device_synchronize();
#else
  (void)device_trace;
#endif
}

const char* phase_name(Phase p) {
  return libreyolo::phase_name(static_cast<libreyolo::Phase>(static_cast<int>(p) + 1));
}

namespace {

bool write_json(const std::string& path, const json& j, int indent) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return false;
  out << j.dump(indent, ' ', false, json::error_handler_t::replace) << "\n";
  return static_cast<bool>(out);
}

std::string bar(double pct) {
  int n = static_cast<int>(std::lround(std::clamp(pct, 0.0, 100.0) / 5.0));
  return std::string(static_cast<size_t>(n), '#') + std::string(static_cast<size_t>(20 - n), '.');
}

}  // namespace

struct Window::Impl {
  int warmup = 0, active = 2, half = 1;
  c10::Device device;
  Meta meta;
  std::string run_dir;
  WindowOptions opts;

  int step_i = 0, m = 0, synced_n = 0, n_unsynced = 0;
  bool in_step = false, step_measured = false, step_synced = false;
  bool finished = false, done = false;
  bool tracing = false;  // Kineto enabled
  bool trace_failed = false;
  Clock::time_point t_step0, t_dl0;
  double sum_step = 0, sum_dl = 0;
  std::array<double, kPhaseCount> sums{};
  std::array<Clock::time_point, kPhaseCount> t_phase{};
  UserScope step_scope, dl_scope;
  std::array<UserScope, kPhaseCount> phase_scope;
  std::set<torch::profiler::impl::ActivityType> activities;
  Report report;

  Impl(c10::Device d) : device(d) {}

  torch::profiler::impl::ProfilerConfig config() const {
    return torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO, /*report_input_shapes=*/false,
                              /*profile_memory=*/false, /*with_stack=*/false);
  }

  void start_trace() {
    if (!opts.trace || trace_failed || tracing) return;
    try {
      kp::enableProfiler(config(), activities);
      tracing = true;
    } catch (const std::exception& e) {
      trace_failed = true;
      log_warn(std::string("profiler: the Kineto trace could not be started (") + e.what() +
               "); the summary is written without it");
    }
  }

  void sync() {
    if (device.is_cuda()) synchronize(device);
  }

  json summary_json() const {
    json meta_j = {{"model", meta.model},
                   {"device", meta.device},
                   {"batch", meta.batch},
                   {"amp", meta.amp},
                   {"amp_dtype", meta.amp_dtype},
                   {"workers", meta.workers}};
    if (meta.imgsz.size() == 1)
      meta_j["imgsz"] = meta.imgsz[0];
    else
      meta_j["imgsz"] = meta.imgsz;
    // Key order as 1.6.0 writes it.
    json ordered = json::object();
    for (const char* k : {"model", "device", "batch", "imgsz", "amp", "amp_dtype", "workers"}) ordered[k] = meta_j[k];
    const double step_ms = n_unsynced ? sum_step / n_unsynced : 0;
    const double dl_ms = n_unsynced ? sum_dl / n_unsynced : 0;
    json comp = json::object();
    double total = 0;
    for (int i = 0; i < kPhaseCount; ++i) {
      const double v = sums[static_cast<size_t>(i)] / std::max(synced_n, 1);
      comp[phase_name(static_cast<Phase>(i))] = round_to(v, 3);
      total += v;
    }
    if (total == 0) total = 1.0;
    const double frac = step_ms > 0 ? dl_ms / step_ms : 0;
    json s;
    s["meta"] = ordered;
    s["window"] = {{"warmup", warmup}, {"real_steps", n_unsynced}, {"synced_steps", synced_n}};
    s["real"] = {{"step_ms", round_to(step_ms, 3)},
                 {"dataload_ms", round_to(dl_ms, 3)},
                 {"compute_ms", round_to(std::max(step_ms - dl_ms, 0.0), 3)},
                 {"img_per_s", round_to(step_ms > 0 ? static_cast<double>(meta.batch) / (step_ms / 1000.0) : 0, 2)},
                 {"dataload_frac", round_to(frac, 3)}};
    s["composition_ms"] = comp;
    s["composition_total_ms"] = round_to(total, 3);
    s["bound"] = frac >= 0.2 ? "dataloader" : "compute";
    s["bound_why"] = "";
    s["trace"] = nullptr;
    return s;
  }

  double peak_vram_mb() const {
#ifdef LIBREYOLO_CUDA
    if (device.is_cuda()) {
      try {
        const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
        return static_cast<double>(
                   stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak) /
               1e6;
      } catch (...) {
      }
    }
#endif
    return -1;
  }
};

Window::Window(int warmup, int steps, c10::Device device, Meta meta, std::string run_dir, WindowOptions opts)
    : impl_(std::make_unique<Impl>(device)) {
  auto& s = *impl_;
  s.warmup = std::max(0, warmup);
  s.active = std::max(2, steps);
  s.half = std::max(1, s.active / 2);
  s.meta = std::move(meta);
  if (s.meta.device.empty()) s.meta.device = device.str();
  s.run_dir = std::move(run_dir);
  s.opts = opts;
  s.activities.insert(torch::profiler::impl::ActivityType::CPU);
  if (device.is_cuda()) s.activities.insert(torch::profiler::impl::ActivityType::CUDA);
#ifdef LIBREYOLO_CUDA
  if (device.is_cuda()) {
    try {
      c10::cuda::CUDACachingAllocator::resetPeakStats(device.index() < 0 ? 0 : device.index());
    } catch (...) {
    }
  }
#endif
  if (s.opts.trace) {
    try {
      set_kineto_environment(device.is_cuda());
      kp::prepareProfiler(s.config(), s.activities);  // the Kineto/CUPTI set-up, outside the window
    } catch (const std::exception& e) {
      s.trace_failed = true;
      log_warn(std::string("profiler: Kineto is not available (") + e.what() + "); the summary is written without a trace");
    }
  }
}

Window::~Window() {
  if (impl_ && impl_->tracing) {
    try {
      impl_->step_scope.close();
      impl_->dl_scope.close();
      for (auto& p : impl_->phase_scope) p.close();
      kp::disableProfiler();
    } catch (...) {
    }
  }
}

int Window::warmup() const { return impl_->warmup; }
int Window::steps() const { return impl_->active; }
bool Window::finished() const { return impl_->finished; }
bool Window::measuring() const { return !impl_->finished && impl_->step_i >= impl_->warmup; }

void Window::step_begin() {
  auto& s = *impl_;
  if (s.finished) return;
  s.in_step = true;
  s.step_measured = s.step_i >= s.warmup;
  s.step_synced = s.step_measured && s.m >= s.half;
  if (!s.step_measured) return;
  s.start_trace();
  // The unsynced half is timed as a whole between two device syncs: here before its first step
  // (work queued by the warm-up is not its time) and in step_end after its last (a step that
  // runs ahead of the GPU, such as a graph replay, is charged for the work it queued).
  if (s.m == 0) s.sync();
  s.step_scope.open("ProfilerStep#" + std::to_string(s.step_i));
  s.t_step0 = Clock::now();
}

void Window::dataload_begin() {
  auto& s = *impl_;
  if (!s.step_measured || s.finished) return;
  s.dl_scope.open("step/dataload");
  s.t_dl0 = Clock::now();
}

void Window::dataload_end() {
  auto& s = *impl_;
  if (!s.step_measured || s.finished) return;
  if (!s.step_synced) s.sum_dl += ms_since(s.t_dl0);
  s.dl_scope.close();
}

void Window::phase_begin(Phase p) { phase_edge(p, /*begin=*/true); }

void Window::phase_end(Phase p) { phase_edge(p, /*begin=*/false); }

// In a synchronised step, the phase's time runs from a device sync at its start to one at its end.
void Window::phase_edge(Phase p, bool begin) {
  auto& s = *impl_;
  if (!s.step_measured || s.finished) return;
  const auto i = static_cast<size_t>(p);
  if (s.step_synced) {
    s.sync();
    if (begin)
      s.t_phase[i] = Clock::now();
    else
      s.sums[i] += ms_since(s.t_phase[i]);
  }
  if (begin)
    s.phase_scope[i].open(std::string("step/") + phase_name(p));
  else
    s.phase_scope[i].close();
}

void Window::step_end() {
  auto& s = *impl_;
  if (s.finished || !s.in_step) return;
  s.in_step = false;
  if (s.step_measured) {
    if (!s.step_synced) {
      if (s.m + 1 == s.half) s.sync();
      s.sum_step += ms_since(s.t_step0);
      ++s.n_unsynced;
    }
    s.dl_scope.close();
    for (auto& p : s.phase_scope) p.close();
    s.step_scope.close();
    if (s.step_synced) ++s.synced_n;
    ++s.m;
  }
  ++s.step_i;
  if (s.m >= s.active) s.finished = true;
}

std::string Window::live_verdict() const {
  const auto& s = *impl_;
  if (s.done) return s.report.produced ? "profile: " + bound_label(s.report.bound) : "profile: no window";
  if (s.step_i < s.warmup) return strfmt("profile warmup %d/%d", s.step_i, s.warmup);
  if (s.finished) return "profile: window done, analysing";
  std::string line = strfmt("profile %d/%d%s", s.m, s.active, s.m >= s.half ? " (synced)" : "");
  if (s.n_unsynced > 0) {
    const double step = s.sum_step / s.n_unsynced, dl = s.sum_dl / s.n_unsynced;
    const double frac = step > 0 ? dl / step : 0;
    line += strfmt(" step %.1fms dataload %.0f%%", step, frac * 100);
    line += frac >= 0.2 ? " -> prelim DATALOADER-BOUND" : " -> prelim not dataloader-bound";
  }
  return line;
}

std::string Window::round_to_accumulation(int& warmup, int& steps, int accum) {
  if (accum <= 1) return "";
  const int w = std::max(0, warmup), st = std::max(2, steps);
  const int w2 = (w + accum - 1) / accum * accum, s2 = (st + accum - 1) / accum * accum;
  warmup = w2;
  steps = s2;
  return strfmt("profile window rounded to accumulation boundaries (warmup=%d, steps=%d, accum=%d)", w2, s2, accum);
}

namespace {

// Opens the page with the desktop's opener, in the background, only when a display exists.
void open_in_browser(const std::string& path) {
  const char* display = std::getenv("DISPLAY");
  const char* wayland = std::getenv("WAYLAND_DISPLAY");
  if (!(display && *display) && !(wayland && *wayland)) return;
  std::string quoted = "'";
  for (char c : fs::absolute(path).string()) {
    if (c == '\'')
      quoted += "'\\''";
    else
      quoted += c;
  }
  quoted += "'";
  const std::string cmd = "(xdg-open " + quoted + " >/dev/null 2>&1 &)";
  if (std::system(cmd.c_str()) != 0) log_debug("profiler: could not open the timeline in a browser");
}

std::string fmt_report(const json& summary, const json* prof, const Report& r) {
  std::ostringstream os;
  const std::string rule(64, '=');
  const json& meta = summary["meta"];
  os << rule << "\n";
  os << "LibreYOLO training profile \u2014 " << meta.value("model", std::string("model")) << " \u00b7 batch "
     << meta.value("batch", 0LL) << " \u00b7 imgsz " << meta["imgsz"].dump() << " \u00b7 "
     << meta.value("device", std::string("")) << " \u00b7 "
     << (meta.value("amp", false) ? "amp " + meta.value("amp_dtype", std::string("")) : std::string("fp32")) << "\n";
  os << "window: warmup " << summary["window"]["warmup"] << ", " << summary["window"]["real_steps"]
     << " unsynced + " << summary["window"]["synced_steps"] << " synced steps\n";
  os << strfmt("REAL step %.1f ms = dataload %.1f ms + compute %.1f ms -> %.2f img/s\n", r.step_ms, r.dataload_ms,
               std::max(r.step_ms - r.dataload_ms, 0.0), r.img_per_s);
  const bool cpu = r.busy_source == "cpu_ops";
  if (r.analysed) {
    if (cpu) {
      os << strfmt("CPU ops busy %.0f%% (%.2f ms/step in ops, union) \u00b7 host overhead %.2f ms/step\n",
                   r.gpu_util * 100, r.gpu_busy_ms_per_step, r.host_overhead_ms_per_step);
    } else {
      os << strfmt("GPU util %.0f%% (%.2f ms busy/step, union of kernels) \u00b7 %lld kernels/step @ ~%.0f us\n",
                   r.gpu_util * 100, r.gpu_busy_ms_per_step, r.kernels_per_step, r.mean_kernel_us);
      os << strfmt("peak VRAM %.1f MB \u00b7 Tensor Cores %.1f%% of GPU time \u00b7 memcpy %.3f ms/step \u00b7 host %.2f "
                   "ms/step\n",
                   r.peak_vram_mb, r.tensorcore_pct, r.memcpy_ms_per_step, r.host_overhead_ms_per_step);
      if (r.cuda_mallocs_per_step > 0) os << "cudaMalloc/Free per step: " << r.cuda_mallocs_per_step << "\n";
    }
  } else {
    os << "(no trace analysed: the verdict below is preliminary, from the dataloader stall only)\n";
  }
  os << ">> VERDICT: " << bound_label(r.bound) << " \u2014 " << (r.bound_why.empty() ? "(preliminary)" : r.bound_why)
     << ".\n";
  if (!r.lever.empty()) os << "   levers: " << r.lever << "\n";
  if (r.analysed && !cpu && !meta.value("amp", false))
    os << strfmt("   note: this run is fp32; AMP/bf16 would move gemm/conv onto Tensor Cores (now %.1f%%)\n",
                 r.tensorcore_pct);
  if (prof && (*prof)["categories"].is_array() && !(*prof)["categories"].empty()) {
    os << "kernel mix:\n";
    for (const auto& c : (*prof)["categories"])
      os << strfmt("  %-18s %s %5.1f%%  %.3f ms\n", c.value("name", std::string("")).c_str(),
                   bar(c.value("pct", 0.0)).c_str(), c.value("pct", 0.0), c.value("ms_per_step", 0.0));
    os << "top kernels / step:\n";
    int n = 0;
    for (const auto& k : (*prof)["top_kernels"]) {
      if (++n > 6) break;
      os << strfmt("  %-42s %8.3f ms %5.1f%% x%lld%s\n", k.value("kernel", std::string("")).c_str(),
                   k.value("ms_per_step", 0.0), k.value("pct_of_gpu", 0.0), k.value("count_per_step", 0LL),
                   k.value("tensorcore", false) ? " [TC]" : "");
    }
  }
  os << "per-phase wall (synced):";
  for (const auto& [p, v] : r.composition_ms) os << strfmt(" %s %.2f ms", p.c_str(), v);
  os << "\n";
  if (!r.timeline_path.empty()) os << "timeline:  " << r.timeline_path << "\n";
  if (!r.trace_path.empty()) os << "raw trace: " << r.trace_path << "\n";
  if (!r.profile_path.empty()) os << "profile:   " << r.profile_path << "  (libreyolo profile summary <file>)\n";
  os << rule << "\n";
  return os.str();
}

}  // namespace

Report Window::finish() {
  auto& s = *impl_;
  if (s.done) return s.report;
  s.done = true;
  s.step_scope.close();
  s.dl_scope.close();
  for (auto& p : s.phase_scope) p.close();
  std::unique_ptr<kp::ProfilerResult> result;
  if (s.tracing) {
    try {
      result = kp::disableProfiler();
    } catch (const std::exception& e) {
      log_warn(std::string("profiler: stopping Kineto failed: ") + e.what());
    }
    after_kineto_trace(s.activities.count(torch::profiler::impl::ActivityType::CUDA) > 0);
    s.tracing = false;
  }
  Report& r = s.report;
  if (!s.finished) {
    r.produced = false;
    r.text = strfmt(
        "no profile produced: the window (warmup %d + steps %d) never filled (%d steps seen). Use a larger dataset, "
        "fewer steps, or a smaller batch.\n",
        s.warmup, s.active, s.step_i);
    return r;
  }
  r.produced = true;
  std::error_code ec;
  fs::create_directories(s.run_dir, ec);
  const fs::path dir(s.run_dir);
  json summary = s.summary_json();
  r.step_ms = summary["real"]["step_ms"].get<double>();
  r.dataload_ms = summary["real"]["dataload_ms"].get<double>();
  r.dataload_frac = summary["real"]["dataload_frac"].get<double>();
  r.img_per_s = summary["real"]["img_per_s"].get<double>();
  for (int i = 0; i < kPhaseCount; ++i) {
    const char* n = phase_name(static_cast<Phase>(i));
    r.composition_ms.emplace_back(n, summary["composition_ms"][n].get<double>());
  }
  r.bound = summary["bound"].get<std::string>();
  r.lever = bound_lever(r.bound, !s.device.is_cuda());
  const double peak = s.peak_vram_mb();
  r.peak_vram_mb = peak;

  // The trace.
  const std::string trace_path = (dir / "profile_trace.json").string();
  if (result) {
    try {
      result->save(trace_path);
      if (fs::exists(trace_path, ec)) r.trace_path = trace_path;
    } catch (const std::exception& e) {
      log_warn(std::string("profiler: writing the trace failed: ") + e.what());
    }
  }
  json prof;
  bool have_prof = false;
  if (!r.trace_path.empty()) {
    summary["trace"] = r.trace_path;
    try {
      std::ifstream in(r.trace_path, std::ios::binary);
      json trace = json::parse(in);
      json for_analysis = summary;
      if (peak >= 0) for_analysis["peak_vram_mb"] = round_to(peak, 1);
      prof = analyze_trace(trace, &for_analysis, r.trace_path);
      have_prof = true;
      // Refine the summary with the analysis's verdict.
      summary["bound"] = prof["bound"];
      summary["bound_why"] = prof["bound_why"];
      json a;
      for (const char* k : {"gpu_util", "gpu_busy_ms_per_step", "mean_kernel_us", "kernels_per_step",
                            "memcpy_ms_per_step", "tensorcore_pct", "cuda_mallocs_per_step", "gpu_util_raw",
                            "memory_pressure", "busy_source"})
        a[k] = prof[k];
      a["window_real_steps"] = prof["window"]["real_steps"];
      json top = json::array();
      for (const auto& k : prof["top_kernels"]) {
        if (top.size() >= 6) break;
        top.push_back({{"name", k["kernel"]},
                       {"pct", round_to(k["pct_of_gpu"].get<double>(), 1)},
                       {"ms", round_to(k["ms_per_step"].get<double>(), 3)},
                       {"count", k["count_per_step"]}});
      }
      a["top_kernels"] = top;
      json cats = json::array();
      for (const auto& c : prof["categories"])
        cats.push_back({{"name", c["name"]}, {"pct", c["pct"]}, {"ms", c["ms_per_step"]}});
      a["categories"] = cats;
      if (peak >= 0) a["peak_vram_mb"] = round_to(peak, 1);
      summary["analysis"] = a;

      r.analysed = true;
      r.bound = prof["bound"].get<std::string>();
      r.bound_why = prof["bound_why"].get<std::string>();
      r.lever = prof.value("lever", std::string(""));
      r.busy_source = prof.value("busy_source", std::string(""));
      r.gpu_util = prof["gpu_util"].get<double>();
      r.gpu_busy_ms_per_step = prof["gpu_busy_ms_per_step"].get<double>();
      r.mean_kernel_us = prof["mean_kernel_us"].get<double>();
      r.tensorcore_pct = prof["tensorcore_pct"].get<double>();
      r.memcpy_ms_per_step = prof["memcpy_ms_per_step"].get<double>();
      r.host_overhead_ms_per_step = prof["host_overhead_ms_per_step"].get<double>();
      r.kernels_per_step = prof["kernels_per_step"].get<long long>();
      r.cuda_mallocs_per_step = prof["cuda_mallocs_per_step"].get<long long>();

      const std::string profile_path = (dir / "profile.json").string();
      if (write_json(profile_path, prof, -1)) r.profile_path = profile_path;

      json payload = timeline_events(trace, &summary);
      json ta = a;
      for (const char* k : {"bound", "bound_why"}) ta[k] = summary[k];
      ta["step_ms"] = summary["real"]["step_ms"];
      ta["img_per_s"] = summary["real"]["img_per_s"];
      ta["dataload_ms"] = summary["real"]["dataload_ms"];
      ta["bound_label"] = bound_label(r.bound);
      ta["lever"] = r.lever;
      ta["host_overhead_ms_per_step"] = prof["host_overhead_ms_per_step"];
      ta["ops_per_step"] = prof["metrics"]["ops_per_step"];
      ta["phases"] = prof["phases"];
      if (!ta.contains("peak_vram_mb")) ta["peak_vram_mb"] = nullptr;
      payload["meta"] = summary["meta"];
      payload["analysis"] = ta;
      const std::string timeline_path = (dir / "timeline.html").string();
      if (write_timeline(timeline_path, payload)) r.timeline_path = timeline_path;
    } catch (const std::exception& e) {
      log_warn(std::string("profiler: analysing the trace failed: ") + e.what());
    }
  }
  if (s.opts.open && !r.timeline_path.empty()) open_in_browser(r.timeline_path);
  const std::string summary_path = (dir / "profile_summary.json").string();
  if (write_json(summary_path, summary, 2)) r.summary_path = summary_path;
  r.text = fmt_report(summary, have_prof ? &prof : nullptr, r);
  return r;
}

}  // namespace libreyolo::profile
