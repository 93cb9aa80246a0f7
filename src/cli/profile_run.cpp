// `libreyolo profile run <data>`: a profile-only training run. It trains with the
// profiler on, mosaic closing never (no_aug_epochs=0), and stops when the window closes; with
// --repeat N it runs N trials (prof_0..prof_{N-1}) and writes <project>/profile_repeat.json.
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>
#include <vector>

#include <libreyolo/errors.hpp>
#include <libreyolo/libreyolo.hpp>

#include "cli/cli.hpp"
#include "core/log.hpp"
#include "core/paths.hpp"
#include "models/detector.hpp"
#include "profile/analysis.hpp"

namespace fs = std::filesystem;

namespace libreyolo::cli {

namespace {

// What both profile sub-commands take: the model (--weights, else a fresh one of --size), the
// device, the trial count and the output form.
struct ModelArgs {
  std::string weights, size = "t", device = "auto";
  int repeat = 1;
  bool json = false;

  std::string model() const { return weights.empty() ? models::families().front()->name + size : weights; }
  // Takes the option when it is one of these; false otherwise.
  bool take(const std::string& key, const std::string& value);
};

struct RunArgs : ModelArgs {
  std::string data, project = "runs/profile", amp_dtype;
  int batch = 16, imgsz = 640, workers = 8, steps = 20, warmup = 5;
  bool amp = true, cuda_graph = false;
};

int to_int(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used != v.size() || x < -1 || x > 1000000) throw std::out_of_range(v);
    return static_cast<int>(x);
  } catch (const std::exception&) {
    throw UsageError("Invalid value for --" + flag + ": '" + v + "'", "Pass a whole number.", "config_type_error");
  }
}

// A profile sub-command's words: positionals, and options as (key, value) from --key=value, key=value,
// --key value, a bare switch (--json: ("json", "true"); --no-amp: ("amp", "false")), or a key whose
// value may be left out (a bare --cuda-graph is "true"; a following true, false or auto is its value).
struct Words {
  std::vector<std::string> positional;
  std::vector<std::pair<std::string, std::string>> options;
};

Words split_words(const std::vector<std::string>& args, const std::set<std::string>& switches) {
  Words w;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      // The other commands' key=value form (a word that names no file): model= is --weights,
      // source= / data= the positional, any other key its --key.
      const size_t eq = a.find('=');
      const bool key_value = eq != std::string::npos && eq > 0 &&
                             a.find_first_not_of("abcdefghijklmnopqrstuvwxyz_-") == eq && !fs::exists(a);
      if (!key_value) {
        w.positional.push_back(a);
        continue;
      }
      std::string key = a.substr(0, eq);
      for (char& c : key)
        if (c == '_') c = '-';
      if (key == "source" || key == "data") w.positional.push_back(a.substr(eq + 1));
      else w.options.emplace_back(key == "model" ? "weights" : key, a.substr(eq + 1));
      continue;
    }
    std::string key = a.substr(2), value;
    for (char& c : key)
      if (c == '_') c = '-';
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = a.substr(2 + eq + 1);
      key = key.substr(0, eq);
    } else if (switches.count(key)) {
      value = "true";
    } else if (key.rfind("no-", 0) == 0 && switches.count(key.substr(3))) {
      key = key.substr(3);
      value = "false";
    } else if (key == "cuda-graph") {
      const bool has_value = i + 1 < args.size() && (args[i + 1] == "true" || args[i + 1] == "false" || args[i + 1] == "auto");
      value = has_value ? args[++i] : "true";
    } else {
      if (i + 1 >= args.size()) throw UsageError("--" + key + " requires a value", "", "config_type_error");
      value = args[++i];
    }
    w.options.emplace_back(key, value);
  }
  return w;
}

bool ModelArgs::take(const std::string& key, const std::string& value) {
  if (key == "json") json = value == "true";
  else if (key == "weights") weights = value;
  else if (key == "size") size = value;
  else if (key == "device") device = value;
  else if (key == "repeat") {
    repeat = to_int(key, value);
    if (repeat < 1) throw UsageError("--repeat must be at least 1", "", "config_range_error");
  } else return false;
  return true;
}

RunArgs parse(const std::vector<std::string>& args) {
  RunArgs r;
  const Words w = split_words(args, {"json", "amp"});
  for (const auto& [key, value] : w.options) {
    if (r.take(key, value)) continue;
    if (key == "amp") r.amp = value == "true";
    else if (key == "cuda-graph") r.cuda_graph = value != "false";
    else if (key == "project") r.project = value;
    else if (key == "batch") r.batch = to_int(key, value);
    else if (key == "imgsz") r.imgsz = to_int(key, value);
    else if (key == "workers") r.workers = to_int(key, value);
    else if (key == "steps") r.steps = to_int(key, value);
    else if (key == "warmup") r.warmup = to_int(key, value);
    else if (key == "amp-dtype") r.amp_dtype = value;
    else
      throw UsageError("Unknown option --" + key + " for 'profile run'",
                       "Options: --weights --size --batch --imgsz --workers --amp/--no-amp --amp-dtype --cuda-graph "
                       "--steps --warmup --repeat --device --project --json",
                       "config_unknown_key");
  }
  const auto& positional = w.positional;
  if (positional.size() != 1)
    throw UsageError("profile run takes one dataset: libreyolo profile run <data.yaml|builtin> [options]", "",
                     "config_required_key");
  r.data = positional[0];
  return r;
}

}  // namespace

int cmd_profile_run(const std::vector<std::string>& raw, std::ostream& out) {
  const RunArgs a = parse(raw);
  // Without --weights: a fresh model of the size (this build downloads nothing).
  const std::string model_arg = a.model();
  std::vector<nlohmann::json> profiles;
  std::vector<std::string> paths;
  // Each invocation has a run directory of its own (prof, prof2, ...); repeated trials are its
  // subdirectories trial_0, trial_1, ... beside the aggregate profile_repeat.json.
  const std::string run_dir = a.repeat > 1 ? make_run_dir(a.project, "prof", /*exist_ok=*/false) : "";
  for (int i = 0; i < a.repeat; ++i) {
    const std::string name = a.repeat > 1 ? "trial_" + std::to_string(i) : "prof";
    LibreYOLO model(model_arg, a.device);
    Kwargs kw = {{"data", a.data},
                 {"batch", std::to_string(a.batch)},
                 {"imgsz", std::to_string(a.imgsz)},
                 {"workers", std::to_string(a.workers)},
                 {"amp", a.amp ? "true" : "false"},
                 {"device", a.device},
                 {"epochs", std::to_string(a.warmup + a.steps + 5)},
                 {"profile", "true"},
                 {"profile_then_stop", "true"},
                 {"profile_steps", std::to_string(a.steps)},
                 {"profile_warmup", std::to_string(a.warmup)},
                 {"profile_open", "false"},
                 {"no_aug_epochs", "0"},
                 // A window that spans epochs must not measure validation between its steps
                 // (its allocations read as allocator thrash, its time as idle GPU).
                 {"val", "false"},
                 {"project", a.repeat > 1 ? run_dir : a.project},
                 {"name", name},
                 {"exist_ok", "false"}};
    if (!a.amp_dtype.empty()) kw.emplace_back("amp_dtype", a.amp_dtype);
    if (a.cuda_graph) kw.emplace_back("cuda_graph", "true");
    TrainResult r = model.train(kw);
    const std::string path = (fs::path(r.save_dir) / "profile.json").string();
    if (!fs::exists(path))
      throw DataError(strfmt("no profile produced for run %d: the window (warmup %d + steps %d) never filled", i,
                             a.warmup, a.steps),
                      "Use a larger dataset, fewer --steps, or a smaller --batch.", "profile_not_produced");
    profiles.push_back(profile::load_profile(path));
    paths.push_back(path);
  }
  nlohmann::json result = profiles.back();
  std::string shown = paths.back();
  if (a.repeat > 1) {
    result = profile::aggregate_repeat(profiles, paths);
    shown = (fs::path(run_dir) / "profile_repeat.json").string();
    write_file_atomic(shown, result.dump() + "\n");
  }
  const auto num = [&](const char* k) { return result.contains(k) ? result[k] : nlohmann::json(nullptr); };
  const std::string trace = (fs::path(paths.back()).parent_path() / "profile_trace.json").string();
  if (a.json) {
    out << nlohmann::json{{"profile", shown},
                          {"trace", fs::exists(trace) ? nlohmann::json(trace) : nlohmann::json(nullptr)},
                          {"img_per_s", num("img_per_s")},
                          {"img_per_s_std", num("img_per_s_std")},
                          {"img_per_s_n", a.repeat > 1 ? num("img_per_s_n") : nlohmann::json(1)},
                          {"bound", num("bound")},
                          {"gpu_util", num("gpu_util")}}
               .dump()
        << "\n";
    return 0;
  }
  out << "img/s: " << (result["img_per_s"].is_number() ? strfmt("%.2f", result["img_per_s"].get<double>()) : "?");
  if (a.repeat > 1 && result.contains("img_per_s_std") && result["img_per_s_std"].is_number())
    out << strfmt(" +/- %.2f (n=%d)", result["img_per_s_std"].get<double>(), a.repeat);
  out << "  |  " << (result.contains("bound") && result["bound"].is_string() ? result["bound"].get<std::string>() : "?")
      << "\nprofile: " << shown << "\nnext:    libreyolo profile summary " << shown << "\n";
  return 0;
}

namespace {

struct InferArgs : ModelArgs {
  InferProfileConfig cfg;
};

double to_double(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw UsageError("Invalid value for --" + flag + ": '" + v + "'", "Pass a number.", "config_type_error");
}

InferArgs parse_infer(const std::vector<std::string>& args) {
  InferArgs r;
  const Words w = split_words(args, {"json", "half", "trace"});
  for (const auto& [key, value] : w.options) {
    if (r.take(key, value)) continue;
    if (key == "half") r.cfg.half = value == "true";
    else if (key == "trace") r.cfg.trace = value == "true";
    else if (key == "project") r.cfg.project = value;
    else if (key == "batch") r.cfg.batch = to_int(key, value);
    else if (key == "imgsz") r.cfg.imgsz = to_int(key, value);
    else if (key == "warmup") r.cfg.warmup = to_int(key, value);
    else if (key == "runs") r.cfg.runs = to_int(key, value);
    else if (key == "max-det") r.cfg.max_det = to_int(key, value);
    else if (key == "conf") r.cfg.conf = to_double(key, value);
    else if (key == "iou") r.cfg.iou = to_double(key, value);
    else if (key == "amp-dtype") r.cfg.amp_dtype = value;
    else if (key == "cuda-graph") r.cfg.cuda_graph = value;
    else
      throw UsageError("Unknown option --" + key + " for 'profile infer'",
                       "Options: --weights --size --batch --imgsz --half/--no-half --amp-dtype --warmup --runs --repeat "
                       "--conf --iou --max-det --device --trace/--no-trace --cuda-graph --project --json",
                       "config_unknown_key");
  }
  const auto& positional = w.positional;
  if (positional.size() > 1)
    throw UsageError("profile infer takes at most one source: libreyolo profile infer [image|folder] [options]", "",
                     "config_type_error");
  if (!positional.empty()) r.cfg.source = positional[0];
  if (r.cfg.amp_dtype != "float16" && r.cfg.amp_dtype != "bfloat16" && r.cfg.amp_dtype != "fp16" &&
      r.cfg.amp_dtype != "bf16")
    throw UsageError("Invalid value for --amp-dtype: '" + r.cfg.amp_dtype + "' is not one of: float16, bfloat16", "",
                     "config_range_error");
  return r;
}

}  // namespace

int cmd_profile_infer(const std::vector<std::string>& raw, std::ostream& out) {
  const InferArgs a = parse_infer(raw);
  // Without --weights: a fresh model of the size (this build downloads nothing).
  LibreYOLO model(a.model(), a.device);
  std::vector<InferenceProfile> runs;
  // As profile run: infer, infer2, ...; repeated trials inside as trial_0, trial_1, ...
  const std::string run_dir = a.repeat > 1 ? make_run_dir(a.cfg.project, "infer", /*exist_ok=*/false) : "";
  for (int i = 0; i < a.repeat; ++i) {
    InferProfileConfig cfg = a.cfg;
    if (a.repeat > 1) cfg.project = run_dir;
    cfg.name = a.repeat > 1 ? "trial_" + std::to_string(i) : "infer";
    runs.push_back(model.profile_inference(cfg));
    std::cerr << runs.back().report;
  }
  const InferenceProfile& last = runs.back();
  std::string shown = last.profile_path;
  double mean = 0, var = 0;
  for (const auto& r : runs) mean += r.img_per_s / static_cast<double>(runs.size());
  for (const auto& r : runs) var += (r.img_per_s - mean) * (r.img_per_s - mean) / static_cast<double>(runs.size());
  const double stdev = std::sqrt(var);
  if (a.repeat > 1) {
    nlohmann::json trials = nlohmann::json::array();
    for (const auto& r : runs) trials.push_back({{"profile", r.profile_path}, {"img_per_s", profile::round_to(r.img_per_s, 2)}});
    nlohmann::json rep = profile::load_profile(last.profile_path);
    rep["img_per_s"] = profile::round_to(mean, 2);
    rep["img_per_s_std"] = profile::round_to(stdev, 2);
    rep["img_per_s_n"] = a.repeat;
    rep["trials"] = trials;
    if (!rep.contains("metrics") || !rep["metrics"].is_object()) rep["metrics"] = nlohmann::json::object();
    rep["metrics"]["throughput_img_s"] = profile::round_to(mean, 2);
    shown = (fs::path(run_dir) / "infer_repeat.json").string();
    write_file_atomic(shown, rep.dump() + "\n");
  }
  if (a.json) {
    out << nlohmann::json{{"profile", shown},
                          {"mode", "inference"},
                          {"img_per_s", profile::round_to(a.repeat > 1 ? mean : last.img_per_s, 2)},
                          {"img_per_s_std", a.repeat > 1 ? nlohmann::json(profile::round_to(stdev, 2)) : nlohmann::json(nullptr)},
                          {"img_per_s_n", a.repeat},
                          {"latency_p50_ms", last.p50_ms},
                          {"latency_p90_ms", last.p90_ms},
                          {"latency_p99_ms", last.p99_ms},
                          {"bound", last.bound},
                          {"stages_ms",
                           {{"preprocess", last.preprocess_ms}, {"forward", last.forward_ms}, {"postprocess", last.postprocess_ms}}}}
               .dump()
        << "\n";
    return 0;
  }
  out << strfmt("img/s: %.2f  |  p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  |  %s\nprofile: %s\nnext:    libreyolo profile summary %s\n",
                a.repeat > 1 ? mean : last.img_per_s, last.p50_ms, last.p90_ms, last.p99_ms, last.bound.c_str(),
                shown.c_str(), shown.c_str());
  return 0;
}

}  // namespace libreyolo::cli
