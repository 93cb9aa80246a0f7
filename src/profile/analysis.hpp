// Analysis of a Kineto / Chrome trace of the training profiler's window into the content of
// profile.json (schema libreyolo.profile.analysis/v1, the keys and meanings of LibreYOLO 1.6.0),
// plus the pieces the readers use: verdict rules, kernel categories, compare and what-if.
//
// Where this differs from 1.6.0 on purpose:
//   - device busy time is the UNION of kernel intervals (1.6.0 sums them, so overlapping
//     streams could read above 100% and trip a false memory-pressure verdict);
//   - Hopper kernel names (sm90_xmma*, nvjet*, cutlass*, cuDNN runtime-fusion kernels) are
//     gemm / conv and count as tensor-core work;
//   - `loss` is a phase of its own;
//   - only CPU-side ProfilerStep markers delimit steps (1.6.0 also counted the GPU copies of the
//     markers, which halved its analysis window), and the window is the unsynced half;
//   - a kernel is attributed to the phase whose CPU span holds its launch (correlation id), not
//     its GPU start time;
//   - on a CPU-only trace the busy time is the union of the training thread's CPU ops, so the
//     verdict comes from CPU time (busy_source "cpu_ops").
// Nothing here depends on LibTorch.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace libreyolo::profile {

using json = nlohmann::json;

inline constexpr const char* kSchema = "libreyolo.profile.analysis/v1";

// Kernel categoriser (first matching rule wins, on the lower-cased raw name):
// "reduction / norm", "layout / copy", "gemm / conv", "elementwise" or "other".
std::string kernel_category(const std::string& raw_name);
// True for kernels that run on tensor cores (Ampere markers and Hopper xmma/nvjet/cutlass/gmma,
// except plain fp32 ones).
bool is_tensorcore(const std::string& raw_name);
// Short friendly label (1.6.0's table), else the first 40 characters.
std::string kernel_label(const std::string& raw_name);

// Total length of the union of [start, end) intervals.
double union_length(std::vector<std::pair<double, double>> intervals);

// The verdict: first match wins.
struct VerdictInputs {
  double util = 0;                  // busy / real step (unclamped)
  double cuda_mallocs_per_step = 0;
  std::optional<double> dataload_frac;  // unknown on a raw trace
  double kernels_per_step = 0;
  double mean_kernel_us = 0;
  double ops_per_step = 0;
  bool cpu = false;                 // busy time from CPU ops (no GPU in the trace)
};
struct Verdict {
  std::string bound;  // "memory-pressure" | "dataloader" | "compute" | "host / launch"
  std::string why;
};
Verdict decide(const VerdictInputs& in);
// "DATALOADER-BOUND" ... for a bound; the bound itself upper-cased otherwise.
std::string bound_label(const std::string& bound);
// The lever to pull for a bound ("" for unknown bounds).
std::string bound_lever(const std::string& bound, bool cpu = false);

// Analyses a parsed trace (a JSON object with traceEvents) with the window's summary (the content
// of profile_summary.json) when there is one. Returns the profile.json object. Throws
// std::runtime_error when the JSON is not a trace (not an object).
json analyze_trace(const json& trace, const json* summary, const std::string& trace_path);

// Events of the analysis window for timeline.html: {events, flows, lane_rows, total_ms}.
json timeline_events(const json& trace, const json* summary);

// `profile compare`: the comparison object.
json compare_profiles(const json& before, const json& after, const std::string& before_name,
                      const std::string& after_name);
// `profile what-if`: the projection. Throws UsageError when neither option
// is given or no category matches.
json what_if(const json& profile, const std::optional<std::string>& remove_category,
             const std::optional<long long>& remove_launches);

// `profile run --repeat N`: profile_repeat.json from the trials' profiles: the
// last trial's profile with img/s as the mean of the trials (plus std, n, trials), the scalar
// figures averaged, and bound "mixed" when the trials disagree. `paths` name the trials' files.
json aggregate_repeat(const std::vector<json>& profiles, const std::vector<std::string>& paths);

// Loads what a reader is pointed at: a profile.json-like file is used as it is; anything else is
// analysed as a raw trace (with a sibling profile_summary.json when present).
// Missing file -> UsageError "not found: <path>" (exit 2); anything unreadable or not analysable
// -> RuntimeError "failed to analyse <path>: ..." (exit 1).
json load_profile(const std::string& path);

// Rounds to `digits` decimals (for the JSON files).
double round_to(double v, int digits);

}  // namespace libreyolo::profile
