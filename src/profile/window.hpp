// The training profiler's measuring window.
//
// The train loop calls, per iteration:
//   step_begin(); dataload_begin(); batch = loader.next(); dataload_end();
//   phase_begin(ToDevice) ... phase_end(ToDevice); ... Forward, Loss, Backward, Optimizer ...
//   step_end(); if (win.finished()) { Report r = win.finish(); print r.text; drop the window }
// The first `warmup` steps are discarded. Of the `steps` measured ones, the first half runs
// without extra syncs (real step time, dataloader stall; the Kineto trace of these steps gives the
// device busy time), the second half synchronises the device around each phase (wall time per
// phase; nothing to sync on the CPU). The Kineto profiler (LibTorch's C++ API) records the
// measured steps with user scopes ProfilerStep#N and step/<phase>. finish() writes
// profile_trace.json, profile_summary.json, profile.json and timeline.html into run_dir and returns
// the report. Without a Window nothing of this runs: the cost when off is zero.
// All calls must come from the training thread (the one that owns the profiler).
#pragma once
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace libreyolo::profile {

enum class Phase { ToDevice = 0, Forward, Loss, Backward, Optimizer };
inline constexpr int kPhaseCount = 5;
const char* phase_name(Phase p);

// The environment Kineto reads when a trace is prepared (call before prepareProfiler): CUPTI torn
// down when the trace stops, unless the user chose (left attached, every later kernel launch pays
// for its callbacks: eager v9-t b16 training 16-20% slower after the window on an H200); for a
// host-only trace (device_trace false) Kineto's own device probe kept quiet unless
// KINETO_LOG_LEVEL is set (on a machine without a GPU it logs "gpuGetDeviceCount failed" as an
// error on stderr, about nothing the trace needs).
void set_kineto_environment(bool device_trace);
// Call after a trace stops. Kineto tears CUPTI down from the exit callback of the next CUDA runtime
// call: a process whose last device work was the trace (profile infer) waited for it at exit and
// never ended. With device_trace, that call is made here.
void after_kineto_trace(bool device_trace);

// Copied into every artifact.
struct Meta {
  std::string model;           // the model's display name and size
  std::string device;          // e.g. "cuda:0", "cpu"
  long long batch = 0;         // the resolved global batch
  std::vector<int> imgsz;      // {s} or {h, w}
  bool amp = false;
  std::string amp_dtype = "float16";
  int workers = 0;
};

struct WindowOptions {
  bool trace = true;  // profile_trace: record the Kineto trace (without it only the summary is written)
  bool open = false;  // profile_open: open timeline.html in a browser when a display exists
};

struct Report {
  bool produced = false;  // false: the window never filled (nothing written)
  std::string bound;      // "dataloader" | "host / launch" | "compute" | "memory-pressure"
  std::string bound_why;
  std::string lever;
  double step_ms = 0, dataload_ms = 0, dataload_frac = 0, img_per_s = 0;
  bool analysed = false;  // the trace was analysed (the fields below are set)
  std::string busy_source;  // "gpu_kernels" or "cpu_ops"
  double gpu_util = 0, gpu_busy_ms_per_step = 0, mean_kernel_us = 0, tensorcore_pct = 0;
  double memcpy_ms_per_step = 0, host_overhead_ms_per_step = 0, peak_vram_mb = -1;
  long long kernels_per_step = 0, cuda_mallocs_per_step = 0;
  std::vector<std::pair<std::string, double>> composition_ms;  // synced wall time per phase
  std::string trace_path, summary_path, profile_path, timeline_path;  // "" when not written
  std::string text;  // the printable report
};

class Window {
 public:
  Window(int warmup, int steps, c10::Device device, Meta meta, std::string run_dir, WindowOptions opts = {});
  ~Window();
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  void step_begin();
  void dataload_begin();
  void dataload_end();
  void phase_begin(Phase p);
  void phase_end(Phase p);
  void step_end();

  bool finished() const;  // the window is full (call finish())
  bool measuring() const;  // the current/next step is a measured one
  // A short line for the progress display while the window runs (preliminary: only the
  // dataloader rule can be decided before the trace is analysed), and the verdict afterwards.
  std::string live_verdict() const;
  // Stops the profiler, writes the artifacts and returns the report (idempotent). Before the
  // window is full it stops the profiler and returns a report with produced=false.
  Report finish();

  int warmup() const;
  int steps() const;

  // Under gradient accumulation the window counts micro-batches: warmup and steps are rounded
  // up to multiples of accum. Returns the log line ("" when unchanged).
  static std::string round_to_accumulation(int& warmup, int& steps, int accum);

 private:
  void phase_edge(Phase p, bool begin);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace libreyolo::profile
