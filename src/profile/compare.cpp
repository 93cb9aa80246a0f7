// Working with finished profiles: two compared side by side (what changed and by how much),
// repeated trials aggregated (min and median per figure), a profile.json read back.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <libreyolo/errors.hpp>

#include "core/strings.hpp"
#include "profile/analysis.hpp"

namespace libreyolo::profile {

namespace fs = std::filesystem;

// ------------------------------------------------------------------ compare / what-if
namespace {
std::optional<double> num_field(const json& j, const char* k) {
  if (j.is_object() && j.contains(k) && j[k].is_number()) return j[k].get<double>();
  if (j.is_object() && j.contains("metrics") && j["metrics"].is_object() && j["metrics"].contains(k) &&
      j["metrics"][k].is_number())
    return j["metrics"][k].get<double>();
  return std::nullopt;
}
json field_or_null(const json& j, const char* k) {
  if (j.is_object() && j.contains(k)) return j[k];
  return nullptr;
}
}  // namespace

json compare_profiles(const json& a, const json& b, const std::string& an, const std::string& bn) {
  const auto ma = num_field(a, "img_per_s"), mb = num_field(b, "img_per_s");
  const auto sa = num_field(a, "img_per_s_std"), sb = num_field(b, "img_per_s_std");
  const auto na = num_field(a, "img_per_s_n"), nb = num_field(b, "img_per_s_n");
  json sig = nullptr;
  std::string reason;
  if (!ma || !mb) {
    reason = "img/s unavailable";
  } else if (sa && sb && na && nb && *na >= 2 && *nb >= 2) {
    const double se = std::sqrt((*sa) * (*sa) / *na + (*sb) * (*sb) / *nb);
    const double d = *mb - *ma;
    sig = std::fabs(d) > 2 * se;
    char buf[128];
    std::snprintf(buf, sizeof buf, "|d|=%.2f vs 2*SE=%.2f", std::fabs(d), 2 * se);
    reason = buf;
  } else {
    reason = "single run, use 'run --repeat N' for a significance call";
  }
  auto ms_per_image = [](const json& p) -> json {
    const auto s = num_field(p, "step_ms");
    json bs = p.contains("config") && p["config"].is_object() && p["config"].contains("batch") ? p["config"]["batch"]
                                                                                                 : json(nullptr);
    if (!s || !bs.is_number() || bs.get<double>() <= 0) return nullptr;
    return round_to(*s / bs.get<double>(), 3);
  };
  auto pair = [&](const char* k) { return json{{"before", field_or_null(a, k)}, {"after", field_or_null(b, k)}}; };
  auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  json out;
  out["before"] = an;
  out["after"] = bn;
  out["img_per_s"] = {{"before", opt(ma)},
                      {"after", opt(mb)},
                      {"std", json::array({opt(sa), opt(sb)})},
                      {"n", json::array({opt(na), opt(nb)})},
                      {"significant", sig},
                      {"significance", reason}};
  out["ms_per_image"] = {{"before", ms_per_image(a)}, {"after", ms_per_image(b)}};
  out["gpu_util"] = pair("gpu_util");
  out["host_overhead_ms_per_step"] = pair("host_overhead_ms_per_step");
  out["launches_per_step"] = pair("launches_per_step");
  out["bound"] = pair("bound");
  return out;
}

json what_if(const json& p, const std::optional<std::string>& remove_category,
             const std::optional<long long>& remove_launches) {
  if (!remove_category && !remove_launches) throw UsageError("specify --remove-category or --remove-launches");
  const double step = num_field(p, "step_ms").value_or(0);
  double bs = 0;
  if (p.contains("config") && p["config"].is_object() && p["config"].contains("batch") &&
      p["config"]["batch"].is_number())
    bs = p["config"]["batch"].get<double>();
  const double host = num_field(p, "host_overhead_ms_per_step").value_or(0);
  double launches = num_field(p, "launches_per_step").value_or(0);
  if (launches <= 0) launches = 1;
  const double gpu = num_field(p, "gpu_busy_ms_per_step").value_or(0);
  const double util = num_field(p, "gpu_util").value_or(0);
  const double dataload = num_field(p, "dataload_ms").value_or(0);
  const double per_launch = host / launches;
  double removed_gpu = 0;
  long long removed_launches = remove_launches.value_or(0);
  if (remove_category) {
    const std::string want = lower(*remove_category);
    const json* hit = nullptr;
    std::string have;
    if (p.contains("categories") && p["categories"].is_array())
      for (const auto& c : p["categories"]) {
        const std::string name = c.value("name", "");
        have += (have.empty() ? "" : ", ") + name;
        if (!hit && lower(name).find(want) != std::string::npos) hit = &c;
      }
    if (!hit) throw UsageError("no category matching '" + *remove_category + "'. have: " + have);
    removed_gpu = hit->contains("ms_per_step") && (*hit)["ms_per_step"].is_number()
                      ? (*hit)["ms_per_step"].get<double>()
                      : (hit->contains("ms") && (*hit)["ms"].is_number() ? (*hit)["ms"].get<double>() : 0.0);
    if (gpu > 0) removed_launches += static_cast<long long>(launches * removed_gpu / gpu);
  }
  double projected;
  std::string mechanism;
  char buf[256];
  if (util < 0.8) {
    // Host-bound: every launch saved saves its host cost; the GPU work left (and the input
    // stall) is the floor.
    projected = std::max(step - removed_launches * per_launch, std::max(gpu - removed_gpu, 0.0) + dataload);
    std::snprintf(buf, sizeof buf, "host/launch-bound: ~%lld fewer launches x ~%.1fus host cost", removed_launches,
                  per_launch * 1000);
  } else {
    projected = std::max(step - removed_gpu, host);
    std::snprintf(buf, sizeof buf, "compute-bound: ~%.2f ms less GPU work", removed_gpu);
  }
  mechanism = buf;
  projected = std::max(projected, 0.0);
  auto ips = [&](double ms) -> json {
    if (bs <= 0 || ms <= 0) return nullptr;
    return round_to(bs / (ms / 1000.0), 2);
  };
  json out;
  out["trace"] = field_or_null(p, "trace");
  out["bound"] = field_or_null(p, "bound");
  out["mechanism"] = mechanism;
  out["removed"] = {{"gpu_ms", round_to(removed_gpu, 3)}, {"launches", removed_launches}};
  out["step_ms"] = {{"now", round_to(step, 2)}, {"projected", round_to(projected, 2)}};
  out["img_per_s"] = {{"now", ips(step)}, {"projected", ips(projected)}};
  out["caveat"] =
      "first-order estimate from per-step averages: it assumes the removed work's host cost scales with its "
      "launches and nothing else changes; measure the change to confirm";
  return out;
}

// ------------------------------------------------------------------ repeat
json aggregate_repeat(const std::vector<json>& profiles, const std::vector<std::string>& paths) {
  if (profiles.empty()) throw UsageError("no trials to aggregate");
  json out = profiles.back();
  if (!out.contains("metrics") || !out["metrics"].is_object()) out["metrics"] = json::object();
  std::vector<double> ips;
  for (const auto& p : profiles)
    if (auto v = num_field(p, "img_per_s")) ips.push_back(*v);
  if (!ips.empty()) {
    double mean = 0;
    for (double v : ips) mean += v;
    mean /= static_cast<double>(ips.size());
    double var = 0;
    for (double v : ips) var += (v - mean) * (v - mean);
    var /= static_cast<double>(ips.size());  // population std, as 1.6.0
    out["img_per_s"] = round_to(mean, 2);
    out["img_per_s_std"] = round_to(std::sqrt(var), 2);
  } else {
    out["img_per_s"] = nullptr;
    out["img_per_s_std"] = nullptr;
  }
  out["img_per_s_n"] = ips.size();
  out["img_per_s_trials"] = ips;
  for (const char* k : {"img_per_s", "img_per_s_std", "img_per_s_n", "img_per_s_trials"}) out["metrics"][k] = out[k];
  out["aggregation"] = {{"n", profiles.size()},
                        {"profiles", paths},
                        {"representative_profile", paths.empty() ? json(nullptr) : json(paths.back())},
                        {"note", "scalar metrics are averaged; kernel lists and trace view use the final trial."}};
  static const std::map<std::string, std::string> alias = {{"gpu_busy_ms_per_step", "gpu_busy_ms"},
                                                           {"memcpy_ms_per_step", "memcpy_ms"},
                                                           {"host_overhead_ms_per_step", "host_overhead_ms"}};
  for (const char* k : {"step_ms", "gpu_util", "gpu_util_raw", "gpu_busy_ms_per_step", "mean_kernel_us",
                        "kernels_per_step", "memcpy_ms_per_step", "host_overhead_ms_per_step", "launches_per_step",
                        "dataload_ms", "dataload_frac", "tensorcore_pct", "cuda_mallocs_per_step"}) {
    double sum = 0;
    size_t n = 0;
    bool all_int = true;
    for (const auto& p : profiles)
      if (p.contains(k) && p[k].is_number()) {
        sum += p[k].get<double>();
        all_int = all_int && p[k].is_number_integer();
        ++n;
      }
    if (n == 0) continue;
    const double mean = sum / static_cast<double>(n);
    json v = all_int && std::fabs(mean - std::round(mean)) < 1e-9 ? json(static_cast<long long>(std::llround(mean)))
                                                                   : json(round_to(mean, 3));
    out[k] = v;
    auto a = alias.find(k);
    const std::string mk = a != alias.end() ? a->second : std::string(k);
    if (out["metrics"].contains(mk) || a != alias.end()) out["metrics"][mk] = v;
  }
  std::set<std::string> bounds;
  for (const auto& p : profiles)
    if (p.contains("bound") && p["bound"].is_string()) bounds.insert(p["bound"].get<std::string>());
  if (bounds.size() > 1) {
    out["bound"] = "mixed";
    out["bound_why"] = "repeat trials produced mixed bottleneck verdicts";
    out["metrics"]["bound"] = "mixed";
  }
  return out;
}

// ------------------------------------------------------------------ loading
namespace {
// The JSON library's reason without its "[json.exception.kind.N] " prefix.
std::string json_reason(const std::exception& e) {
  std::string w = e.what();
  if (w.rfind("[json.exception.", 0) == 0) {
    const auto end = w.find("] ");
    if (end != std::string::npos) w = w.substr(end + 2);
  }
  return w;
}
}  // namespace

json load_profile(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec) || fs::is_directory(path, ec)) throw UsageError("not found: " + path);
  json j;
  try {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open the file");
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw UsageError(path + " is not a profile: it is not valid JSON (it stops parsing at byte " +
                         std::to_string(e.byte) + "; a truncated file, or another kind)",
                     "Profiles are written by `libreyolo profile run|infer` or train profile=true.", "profile_invalid");
  } catch (const std::exception& e) {
    throw RuntimeError("failed to analyse " + path + ": " + e.what(), "", "profile_analysis_failed");
  }
  if (j.is_object() && j.contains("schema") && j["schema"].is_string() &&
      j["schema"].get<std::string>().rfind("libreyolo.profile.analysis", 0) == 0)
    return j;
  try {
    json summary;
    const json* sp = nullptr;
    const fs::path sib = fs::path(path).parent_path() / "profile_summary.json";
    if (fs::exists(sib, ec)) {
      std::ifstream in(sib, std::ios::binary);
      summary = json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (summary.is_object()) sp = &summary;
    }
    return analyze_trace(j, sp, path);
  } catch (const Error&) {
    throw;
  } catch (const json::type_error& e) {
    throw UsageError(path + " is not a profile this build reads: " + json_reason(e),
                     "Profiles are written by `libreyolo profile run|infer` or train profile=true.", "profile_invalid");
  } catch (const std::exception& e) {
    throw RuntimeError("failed to analyse " + path + ": " + e.what(), "", "profile_analysis_failed");
  }
}

}  // namespace libreyolo::profile
