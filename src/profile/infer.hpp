// The inference profiler: a window of real predict iterations,
// each preprocess -> forward -> postprocess. The first `warmup` iterations are discarded; of the
// `runs` measured ones, the first half runs without extra syncs (the latency samples: one sync
// at the end of each iteration; the Kineto trace of these gives the device busy time), the second
// half synchronises after each stage (the stage times that decide the verdict). Writes
// profile_trace.json, profile_summary.json and profile.json (mode "inference") into run_dir.
// The stages are callbacks, so this file knows nothing of models or images.
#pragma once
#include <c10/core/Device.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace libreyolo::profile {

struct InferOptions {
  int warmup = 20;
  int runs = 100;     // at least 2
  int batch = 1;      // images per iteration (for img/s)
  bool trace = true;  // record the Kineto trace
};

struct InferStages {
  std::function<void(int iteration)> preprocess;  // host-side: decode is done, letterbox + stack
  std::function<void()> forward;                  // device work, not synchronised
  std::function<void()> postprocess;              // decode boxes + NMS to host detections
};

struct InferReport {
  std::string bound, bound_why;
  double img_per_s = 0;
  nlohmann::json latency;    // {p50_ms, p90_ms, p99_ms, mean_ms, min_ms, max_ms, n}
  nlohmann::json stages_ms;  // {preprocess, forward, postprocess}: synced means
  std::string trace_path, summary_path, profile_path;
  std::string text;  // the printable report
};

// pct(q) over sorted samples: sorted[min(n-1, round_half_even(q/100 * (n-1)))].
double percentile(const std::vector<double>& sorted, double q);
// The inference verdict rules (first match wins): {bound, why}. `graphed`: the forward
// is already replayed from a CUDA graph, so cuda_graph=true is not the lever to name.
std::pair<std::string, std::string> inference_verdict(double pre_ms, double fwd_ms, double post_ms, bool cuda,
                                                      double traced_util, bool graphed = false);

// `meta`: model, batch, imgsz, half, amp_dtype, device, conf, iou, max_det (mode is added).
InferReport profile_inference(const InferOptions& opt, const InferStages& stages, c10::Device device,
                              nlohmann::json meta, const std::string& run_dir);

}  // namespace libreyolo::profile
