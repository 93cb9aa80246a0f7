#include "cli/cli.hpp"

#include <torch/cuda.h>

#include <chrono>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include <libreyolo/errors.hpp>

#include "core/error_report.hpp"
#include <libreyolo/libreyolo.hpp>

#include "core/config_schema.hpp"
#include "core/device.hpp"
#include "core/log.hpp"
#include "core/strings.hpp"
#include "dist/spawn.hpp"
#include "data/dataset_yaml.hpp"
#include "io/checkpoint.hpp"
#include "models/detector.hpp"
#include "profile/profile_cli.hpp"

namespace libreyolo::cli {

using json = nlohmann::json;

namespace {

std::string norm_key(std::string k) {
  for (auto& c : k)
    if (c == '-') c = '_';
  return k;
}

bool is_bool_text(const std::string& v) {
  std::string l = lower(v);
  return l == "true" || l == "false" || l == "1" || l == "0" || l == "yes" || l == "no";
}

// A command: its options (schema names and booleans) and how to run it.
struct Command {
  std::string name;
  std::string summary;
  std::vector<std::string> keys;       // accepted key names (besides the global flags)
  std::vector<std::string> bool_keys;  // the boolean ones
  std::vector<std::pair<std::string, std::string>> help_rows;  // key, "type  default  help"
};

template <class C>
void add_schema(Command& cmd, const OptionSchema<C>& schema, const C& defaults) {
  auto values = schema.dump(defaults);
  for (size_t i = 0; i < schema.fields().size(); ++i) {
    const auto& f = schema.fields()[i];
    cmd.keys.push_back(f.name);
    if (f.type == OptionType::Bool) cmd.bool_keys.push_back(f.name);
    std::string def = values[i].second.empty() ? "''" : values[i].second;
    cmd.help_rows.emplace_back(f.name, std::string(option_type_name(f.type)) + "  [" + def + "]  " + f.help);
  }
  for (const auto& n : schema.names())
    if (std::find(cmd.keys.begin(), cmd.keys.end(), n) == cmd.keys.end()) cmd.keys.push_back(n);
}

void add_key(Command& cmd, const std::string& key, const std::string& help, bool is_bool = false) {
  cmd.keys.push_back(key);
  if (is_bool) cmd.bool_keys.push_back(key);
  cmd.help_rows.emplace_back(key, help);
}

std::vector<Command> commands() {
  std::vector<Command> out;
  {
    const std::string def = models::default_model_name();
    Command c{"train", "train a model: libreyolo train model=" + def + " data=builtin epochs=10", {}, {}, {}};
    add_key(c, "model", "str  [" + def + "]  checkpoint path or model name (family and size: a fresh model)");
    add_schema(c, train_schema(), TrainConfig{});
    add_key(c, "dry_run", "bool  [false]  print the resolved configuration and exit", true);
    out.push_back(c);
  }
  {
    Command c{"predict", "detect objects or classify images: libreyolo predict model=best.pt source=img.jpg", {}, {}, {}};
    add_key(c, "model", "str  [" + models::default_model_name() + "]  checkpoint path or model name");
    add_schema(c, predict_schema(), PredictConfig{});
    out.push_back(c);
  }
  {
    Command c{"val", "validate: libreyolo val model=best.pt data=my.yaml", {}, {}, {}};
    add_key(c, "model", "str  (required)  checkpoint path or model name");
    add_schema(c, val_schema(), ValConfig{});
    out.push_back(c);
  }
  {
    Command c{"info", "describe a model: libreyolo info model=best.pt", {}, {}, {}};
    add_key(c, "model", "str  (required)  checkpoint path or model name");
    out.push_back(c);
  }
  {
    Command c{"metadata", "raw checkpoint metadata: libreyolo metadata path=best.pt", {}, {}, {}};
    add_key(c, "path", "str  (required)  checkpoint file");
    out.push_back(c);
  }
  out.push_back({"version", "library, LibTorch and CUDA versions", {}, {}, {}});
  out.push_back({"checks", "GPUs and build features", {}, {}, {}});
  out.push_back({"cfg", "default values of train, predict and val", {}, {}, {}});
  return out;
}

void print_usage(std::ostream& os, const std::vector<Command>& cmds) {
  os << "Usage: libreyolo [detect|classify] <command> [key=value ...] [--json] [--quiet] [--verbose]\n\nCommands:\n";
  for (const auto& c : cmds) os << "  " << std::left << std::setw(10) << c.name << c.summary << "\n";
  os << "  " << std::left << std::setw(10) << "profile"
     << "training profiler readers: libreyolo profile summary runs/prof/profile.json\n";
  os << "\nRun 'libreyolo <command> --help' for its options.\n";
}

void print_command_help(std::ostream& os, const Command& c) {
  os << "Usage: libreyolo " << c.name << " [key=value ...]\n  " << c.summary << "\n\nOptions:\n";
  for (const auto& [k, h] : c.help_rows) os << "  " << std::left << std::setw(18) << k << h << "\n";
  os << "  " << std::left << std::setw(18) << "--json" << "machine-readable output on stdout\n";
  os << "  " << std::left << std::setw(18) << "--quiet" << "warnings and errors only\n";
}

std::string kw_get(const Kwargs& kw, const std::string& key, const std::string& fallback = "") {
  std::string v = fallback;
  for (const auto& [k, val] : kw)
    if (k == key) v = val;
  return v;
}

Kwargs kw_without(const Kwargs& kw, std::initializer_list<const char*> drop) {
  Kwargs out;
  for (const auto& p : kw) {
    bool skip = false;
    for (const char* d : drop)
      if (p.first == d) skip = true;
    if (!skip) out.push_back(p);
  }
  return out;
}

// A model of another task than the command's task word: exit 4 (ModelError).
void check_task(const ParsedArgs& a, const LibreYOLO& model, const std::string& model_name) {
  if (a.task.empty()) return;
  const ModelInfo i = model.info();
  if (i.task == a.task) return;
  throw ModelError(model_name + " is a " + i.task + " model (" + i.family + "), not a " + a.task + " model",
                   i.task == "classify" ? "Run it as `libreyolo classify " + a.command + " ...` (or without a task word)."
                                        : "Run it as `libreyolo detect " + a.command + " ...` (or without a task word).",
                   "model_task_mismatch");
}

json detections_json(const PredictResult& r) {
  json dets = json::array();
  for (const auto& d : r.detections)
    dets.push_back({{"box", {d.x1, d.y1, d.x2, d.y2}}, {"score", d.score}, {"class_id", d.class_id},
                    {"class_name", d.class_name}});
  json top = json::array();
  for (const auto& c : r.top) top.push_back({{"class_id", c.class_id}, {"class_name", c.class_name}, {"score", c.score}});
  json j = {{"source", r.source}, {"height", r.height}, {"width", r.width}, {"detections", dets},
            {"speed_ms", {{"preprocess", r.preprocess_ms}, {"inference", r.inference_ms},
                          {"postprocess", r.postprocess_ms}}}};
  if (!r.top.empty()) j["top"] = top;
  if (!r.saved_path.empty()) j["saved_path"] = r.saved_path;
  return j;
}

int cmd_predict(const ParsedArgs& a, std::ostream& out) {
  std::string model_name = kw_get(a.kwargs, "model", models::default_model_name());
  PredictConfig cfg;
  predict_schema().apply(cfg, kw_without(a.kwargs, {"model"}), "predict");
  validate(cfg);
  LibreYOLO model(model_name, cfg.device);
  check_task(a, model, model_name);
  auto results = model.predict(cfg);
  if (a.json) {
    json j = {{"schema_version", 1}, {"model", model_name}, {"results", json::array()}};
    for (const auto& r : results) j["results"].push_back(detections_json(r));
    out << j.dump() << "\n";
    return 0;
  }
  for (const auto& r : results) {
    if (!r.top.empty()) {
      out << r.source << " (" << r.width << "x" << r.height << "):";
      for (const auto& c : r.top) out << " " << c.class_name << " " << std::fixed << std::setprecision(2) << c.score;
      out << ", " << std::setprecision(1) << r.preprocess_ms << "ms preprocess, " << r.inference_ms
          << "ms inference\n";
      if (!r.saved_path.empty()) out << "  saved: " << r.saved_path << "\n";
      continue;
    }
    out << r.source << " (" << r.width << "x" << r.height << "): " << r.detections.size() << " detections, "
        << std::fixed << std::setprecision(1) << r.preprocess_ms << "ms preprocess, " << r.inference_ms
        << "ms inference, " << r.postprocess_ms << "ms postprocess\n";
    for (const auto& d : r.detections)
      out << "  " << d.class_name << " " << std::setprecision(2) << d.score << "  [" << std::setprecision(1)
          << d.x1 << ", " << d.y1 << ", " << d.x2 << ", " << d.y2 << "]\n";
    if (!r.saved_path.empty()) out << "  saved: " << r.saved_path << "\n";
  }
  return 0;
}

int cmd_train(const ParsedArgs& a, std::ostream& out_) {
  // Workers print no summary: the parent that spawned them does (and under torchrun, rank 0).
  std::ostream null_out(nullptr);
  const bool silent = dist::is_spawned_worker() || dist::is_secondary_rank();
  std::ostream& out = silent ? null_out : out_;
  std::string model_name = kw_get(a.kwargs, "model", models::default_model_name());
  const bool dry_run = parse_bool("dry_run", kw_get(a.kwargs, "dry_run", "false"));
  TrainConfig cfg;
  train_schema().apply(cfg, kw_without(a.kwargs, {"model", "dry_run"}), "train");
  // A resumed run takes data and every other option from its checkpoint's saved config.
  const bool resuming = !cfg.resume.empty() && cfg.resume != "false" && cfg.resume != "False";
  if (cfg.data.empty() && !resuming)
    throw UsageError("Missing option 'data'", "Pass data=<dataset.yaml> or data=builtin.", "config_required_key");
  validate(cfg);
  // Multi-GPU training (device=0,1) loads the model on the CPU: each worker moves its copy to its GPU.
  const std::string model_device = wants_distributed(cfg.device) ? "cpu" : cfg.device;
  if (dry_run) {
    // Every check the real run makes before its first step (LibreYOLO::check_train), nothing
    // trained or written; the configuration printed is the one the run would use.
    LibreYOLO checked(model_name, model_device);
    check_task(a, checked, model_name);
    const TrainConfig resolved = checked.check_train(kw_without(a.kwargs, {"model", "dry_run"}));
    json j = {{"valid", true}, {"mode", "train"}, {"model", model_name}, {"resolved_config", json::object()}};
    for (const auto& [k, v] : train_schema().dump(resolved)) j["resolved_config"][k] = v;
    if (a.json)
      out << j.dump() << "\n";
    else
      out << "Dry run — every check passed; resolved config for " << model_name << ":\n"
          << to_yaml(train_schema(), resolved);
    return 0;
  }
  if (!a.json) {
    if (resuming)
      out << "Resuming " << model_name << "...\n";
    else
      out << "Training " << model_name << " on " << cfg.data << " for " << cfg.epochs << " epochs...\n";
  }
  out.flush();
  LibreYOLO model(model_name, model_device);
  check_task(a, model, model_name);
  const bool classify = model.info().task == "classify";
  TrainResult r = model.train(kw_without(a.kwargs, {"model", "dry_run"}));
  const double hours = r.total_seconds / 3600.0;
  if (a.json) {
    json j = {{"schema_version", 1},
              {"status", "complete"},
              {"model", model_name},
              {"model_family", model.info().family},
              {"data", cfg.data},
              {"device", model.info().device},
              {"epochs_completed", static_cast<int>(r.epochs.size())},
              {"best_epoch", r.best_epoch},
              {"best_metrics", r.best_epoch <= 0 ? json(nullptr)
                               : classify      ? json{{"accuracy_top1", r.best_mAP50_95}}
                                               : json{{"mAP50", r.best_mAP50}, {"mAP50_95", r.best_mAP50_95}}},
              {"best_weights", r.best_checkpoint},
              {"last_weights", r.last_checkpoint},
              {"training_time_hours", std::round(hours * 100.0) / 100.0},
              {"save_dir", r.save_dir}};
    out << j.dump() << "\n";
    return 0;
  }
  out << "Training complete: " << count_of(static_cast<long long>(r.epochs.size()), "epoch") << " in "
      << duration_text(r.total_seconds) << "\n" << std::fixed;
  if (r.best_epoch > 0 && classify)
    out << "Best results at epoch " << r.best_epoch << ":\n  top-1 accuracy: " << std::setprecision(4)
        << r.best_mAP50_95 << "\n";
  else if (r.best_epoch > 0)
    out << "Best results at epoch " << r.best_epoch << ":\n  mAP50: " << std::setprecision(4) << r.best_mAP50
        << "  mAP50-95: " << r.best_mAP50_95 << "\n";
  if (!r.best_checkpoint.empty())
    out << "Weights saved to: " << r.best_checkpoint << "\n";
  else
    out << "Artifacts saved to: " << r.save_dir << "\n";
  return 0;
}

int cmd_val(const ParsedArgs& a, std::ostream& out) {
  std::string model_name = kw_get(a.kwargs, "model");
  if (model_name.empty()) throw UsageError("Missing option 'model'", "Pass model=<weights.pt>.", "config_required_key");
  ValConfig cfg;
  val_schema().apply(cfg, kw_without(a.kwargs, {"model"}), "val");
  if (cfg.data.empty()) throw UsageError("Missing option 'data'", "Pass data=<dataset.yaml>.", "config_required_key");
  validate(cfg);
  LibreYOLO model(model_name, cfg.device);
  check_task(a, model, model_name);
  ValResult r = model.val(cfg);
  if (a.json) {
    json j = {{"schema_version", 1}, {"model", model_name}, {"data", cfg.data}, {"metrics", json::object()},
              {"classes", json::array()}, {"save_dir", r.save_dir}};
    for (const auto& [k, v] : r.metrics) j["metrics"][k] = v;
    for (const auto& c : r.classes)
      j["classes"].push_back({{"id", c.id}, {"name", c.name}, {"images", c.images}, {"instances", c.instances},
                              {"precision", c.precision}, {"recall", c.recall}, {"mAP50", c.mAP50},
                              {"mAP50-95", c.mAP50_95}});
    out << j.dump() << "\n";
    return 0;
  }
  out << r.table << "\n";
  for (const auto& [k, v] : r.metrics) out << "  " << k << ": " << std::setprecision(6) << v << "\n";
  out << "Results saved to " << r.save_dir << "\n";
  return 0;
}

int cmd_info(const ParsedArgs& a, std::ostream& out) {
  std::string model_name = kw_get(a.kwargs, "model");
  if (model_name.empty()) throw UsageError("Missing option 'model'", "Pass model=<weights.pt>.", "config_required_key");
  LibreYOLO model(model_name, "cpu");
  ModelInfo i = model.info();
  json j = {{"family", i.family}, {"size", i.size}, {"task", i.task}, {"nc", i.num_classes},
            {"names", i.names}, {"imgsz", i.imgsz}, {"parameters", i.parameters}, {"weights", i.weights},
            {"amp_default", i.amp_default}};
  if (!i.amp_default_reason.empty()) j["amp_default_reason"] = i.amp_default_reason;
  if (a.json) {
    j["schema_version"] = 1;
    out << j.dump() << "\n";
  } else {
    out << "  family: " << i.family << "\n  size: " << i.size << "\n  task: " << i.task << "\n  nc: " << i.num_classes
        << "\n  imgsz: " << i.imgsz << "\n  parameters: " << i.parameters << "\n  weights: "
        << (i.weights.empty() ? "(fresh)" : i.weights) << "\n  amp default: " << (i.amp_default ? "on" : "off")
        << (i.amp_default_reason.empty() ? "" : " (" + i.amp_default_reason + ")") << "\n";
  }
  return 0;
}

json pyvalue_json(const io::PyValue& v, int depth = 0) {
  using K = io::PyValue::Kind;
  switch (v.kind) {
    case K::None: return nullptr;
    case K::Bool: return v.b;
    case K::Int: return v.i;
    case K::Float: return v.f;
    case K::String: return v.s;
    case K::Bytes: return "<bytes " + std::to_string(v.s.size()) + ">";
    case K::Tensor: return "<tensor " + v.repr(80) + ">";
    case K::Tuple:
    case K::List: {
      json a = json::array();
      for (const auto& it : v.items) a.push_back(depth > 6 ? json("...") : pyvalue_json(*it, depth + 1));
      return a;
    }
    case K::Dict: {
      json o = json::object();
      for (const auto& [k, val] : v.dict) {
        std::string key = k->is_string() ? k->s : k->repr(40);
        o[key] = depth > 6 ? json("...") : pyvalue_json(*val, depth + 1);
      }
      return o;
    }
  }
  return nullptr;
}

int cmd_metadata(const ParsedArgs& a, std::ostream& out) {
  std::string path = kw_get(a.kwargs, "path");
  if (path.empty() && !a.positional.empty()) path = a.positional[0];
  if (path.empty()) throw UsageError("Missing option 'path'", "Pass path=<checkpoint.pt>.", "config_required_key");
  io::Checkpoint ck = io::read_checkpoint(path);
  json j = json::object();
  for (const auto& [k, v] : ck.root->dict) {
    std::string key = k->is_string() ? k->s : k->repr(40);
    if (key == "model" || key == "train_model" || key == "ema" || key == "optimizer" || key == "state_dict") {
      j[key] = v->is_dict() ? "<" + std::to_string(v->dict.size()) + " entries>" : v->repr(60);
      continue;
    }
    j[key] = pyvalue_json(*v);
  }
  out << (a.json ? j.dump() : j.dump(2)) << "\n";
  return 0;
}

int cmd_version(const ParsedArgs& a, std::ostream& out) {
  json j = {{"libreyolo", version()},
            {"torch", TORCH_VERSION},
            {"cuda_available", torch::cuda::is_available()},
            {"cuda_devices", static_cast<int>(torch::cuda::device_count())}};
  if (a.json)
    out << j.dump() << "\n";
  else
    out << "libreyolo " << version() << " (LibTorch " << TORCH_VERSION << ", CUDA "
        << (torch::cuda::is_available() ? "available" : "not available") << ")\n";
  return 0;
}

int cmd_checks(const ParsedArgs& a, std::ostream& out);

int cmd_cfg(const ParsedArgs& a, std::ostream& out) {
  json j = {{"train_defaults", json::object()}, {"predict_defaults", json::object()}, {"val_defaults", json::object()}};
  for (const auto& [k, v] : train_schema().dump(TrainConfig{})) j["train_defaults"][k] = v;
  for (const auto& [k, v] : predict_schema().dump(PredictConfig{})) j["predict_defaults"][k] = v;
  for (const auto& [k, v] : val_schema().dump(ValConfig{})) j["val_defaults"][k] = v;
  out << (a.json ? j.dump() : j.dump(2)) << "\n";
  return 0;
}

}  // namespace

namespace {

const char* const kGlobalFlags[] = {"help", "json", "quiet", "verbose"};

// The closest of the command's keys and the global flags, spelled as a flag ("--help"), or "".
std::string closest_flag(const std::string& word, const std::vector<std::string>& known_keys) {
  std::vector<std::string> candidates = known_keys;
  candidates.insert(candidates.end(), std::begin(kGlobalFlags), std::end(kGlobalFlags));
  const std::string near = closest_match(word, candidates);
  return near.empty() ? near : "--" + near;
}

[[noreturn]] void throw_unknown_flag(const std::string& token, const std::string& key,
                                     const std::vector<std::string>& known_keys, const std::string& command) {
  const std::string near = closest_flag(key, known_keys);
  throw UsageError("Unknown flag '" + token + "'" + (command.empty() ? "" : " for '" + command + "'") +
                       (near.empty() ? "" : ". Did you mean '" + near + "'?"),
                   "Run 'libreyolo " + (command.empty() ? std::string("<command>") : command) +
                       " --help' to list the options.",
                   "config_unknown_key");
}

}  // namespace

ParsedArgs parse_args(const std::vector<std::string>& args, const std::vector<std::string>& bool_keys,
                      const std::vector<std::string>& known_keys, const std::string& command) {
  ParsedArgs p;
  auto is_known_key = [&](const std::string& k) {
    return known_keys.empty() || std::find(known_keys.begin(), known_keys.end(), k) != known_keys.end();
  };
  auto is_bool_key = [&](const std::string& k) {
    return std::find(bool_keys.begin(), bool_keys.end(), k) != bool_keys.end();
  };
  static const std::regex kv_re("^([A-Za-z_][A-Za-z0-9_-]*)=(.*)$", std::regex::ECMAScript);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& tok = args[i];
    std::smatch m;
    std::string key, value;
    bool have_value = false;
    if (tok == "-h" || tok == "--help" || tok == "help") {
      p.help = true;
      continue;
    }
    if (tok.rfind("--", 0) == 0) {
      std::string body = tok.substr(2);
      size_t eq = body.find('=');
      if (eq != std::string::npos) {
        key = norm_key(body.substr(0, eq));
        value = body.substr(eq + 1);
        have_value = true;
      } else {
        key = norm_key(body);
      }
    } else if (std::regex_match(tok, m, kv_re)) {
      key = norm_key(m[1].str());
      value = m[2].str();
      have_value = true;
    } else if (is_bool_key(norm_key(tok)) || norm_key(tok) == "json" || norm_key(tok) == "quiet" ||
               norm_key(tok) == "verbose") {
      key = norm_key(tok);
    } else {
      p.positional.push_back(tok);
      continue;
    }
    // Global flags.
    if (key == "json" || key == "quiet" || key == "verbose") {
      bool v = have_value ? parse_bool(key, value) : true;
      (key == "json" ? p.json : key == "quiet" ? p.quiet : p.verbose) = v;
      continue;
    }
    if (key.rfind("no_", 0) == 0 && !have_value && is_bool_key(key.substr(3))) {
      p.kwargs.emplace_back(key.substr(3), "false");
      continue;
    }
    if (!have_value) {
      if (!is_bool_key(key) && !is_known_key(key)) throw_unknown_flag(tok, key, known_keys, command);
      if (is_bool_key(key)) {
        // `--flag true` is accepted as well as a bare `--flag`.
        if (i + 1 < args.size() && is_bool_text(args[i + 1])) value = args[++i];
        else value = "true";
      } else {
        if (i + 1 >= args.size())
          throw UsageError("Option '--" + key + "' requires a value", "", "config_type_error");
        value = args[++i];
      }
    }
    p.kwargs.emplace_back(key, value);
  }
  if (p.quiet && p.verbose)
    throw UsageError("--quiet and --verbose contradict each other", "Give one of them.", "config_conflict");
  return p;
}

namespace {

int cmd_checks(const ParsedArgs& a, std::ostream& out) {
  json gpus = json::array();
  const int n = static_cast<int>(torch::cuda::device_count());
  for (int i = 0; i < n; ++i) gpus.push_back({{"index", i}});
  json j = {{"cuda_available", torch::cuda::is_available()},
            {"gpus", gpus},
            {"cudnn", torch::cuda::cudnn_is_available()},
#ifdef LIBREYOLO_CUDA
            {"built_with_cuda", true},
#else
            {"built_with_cuda", false},
#endif
#ifdef LIBREYOLO_NCCL
            {"nccl", true}
#else
            {"nccl", false}
#endif
  };
  out << (a.json ? j.dump() : j.dump(2)) << "\n";
  return 0;
}


}  // namespace

int run(const std::vector<std::string>& raw_args, std::ostream& out, std::ostream& err) {
  std::vector<std::string> args = raw_args;
  // `libreyolo detect predict ...` / `libreyolo classify train ...`: the model must be of that task.
  std::string task;
  if (!args.empty() && (args[0] == "detect" || args[0] == "classify")) {
    task = args[0];
    args.erase(args.begin());
  }
  const auto cmds = commands();
  bool json_out = std::find(args.begin(), args.end(), "--json") != args.end();
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_usage(args.empty() ? err : out, cmds);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") args[0] = "version";
  // `profile` has its own sub-app grammar (--name value, positional files): the readers are in
  // src/profile/, `profile run` trains through the API (cli/profile_run.cpp).
  const bool help_asked = std::find(args.begin(), args.end(), "--help") != args.end();
  const bool profiles = args.size() > 1 && (args[1] == "run" || args[1] == "infer");
  if (args[0] == "profile" && !(profiles && !help_asked))
    return profile::run_profile_command(std::vector<std::string>(args.begin() + 1, args.end()), out, err);
  const Command* cmd = nullptr;
  for (const auto& c : cmds)
    if (c.name == args[0]) cmd = &c;
  try {
    if (args[0] == "profile" && args[1] == "infer")
      return cmd_profile_infer(std::vector<std::string>(args.begin() + 2, args.end()), out);
    if (args[0] == "profile") return cmd_profile_run(std::vector<std::string>(args.begin() + 2, args.end()), out);
    if (!cmd) {
      std::vector<std::string> names;
      for (const auto& c : cmds) names.push_back(c.name);
      std::string near = closest_match(args[0], names);
      throw UsageError("No such command '" + args[0] + "'" + (near.empty() ? "" : ". Did you mean '" + near + "'?"),
                       "Run 'libreyolo --help' for the list of commands.", "config_unknown_key");
    }
    ParsedArgs p =
        parse_args(std::vector<std::string>(args.begin() + 1, args.end()), cmd->bool_keys, cmd->keys, cmd->name);
    p.command = cmd->name;
    p.task = task;
    json_out = p.json;
    if (p.help) {
      print_command_help(out, *cmd);
      return 0;
    }
    set_log_level(p.quiet ? LogLevel::Warning : p.verbose ? LogLevel::Debug : LogLevel::Info);
    // A data-parallel rank other than 0 (torchrun, or a spawned worker) says only warnings and
    // errors: rank 0 (or the parent that spawned the workers) speaks for the run.
    if (dist::is_secondary_rank()) set_log_level(LogLevel::Warning);
    for (const auto& [k, v] : p.kwargs)
      if (std::find(cmd->keys.begin(), cmd->keys.end(), k) == cmd->keys.end())
        throw_unknown_key(k, cmd->keys, cmd->name);
    if (!p.positional.empty() && cmd->name != "metadata") {
      const std::string near = closest_flag(norm_key(p.positional[0]), cmd->keys);
      throw UsageError("Unexpected argument '" + p.positional[0] + "'" +
                           (near.empty() ? "" : ". Did you mean '" + near + "'?"),
                       "Options are written key=value.", "config_unknown_key");
    }
    if (cmd->name == "predict") return cmd_predict(p, out);
    if (cmd->name == "train") return cmd_train(p, out);
    if (cmd->name == "val") return cmd_val(p, out);
    if (cmd->name == "info") return cmd_info(p, out);
    if (cmd->name == "metadata") return cmd_metadata(p, out);
    if (cmd->name == "version") return cmd_version(p, out);
    if (cmd->name == "checks") return cmd_checks(p, out);
    if (cmd->name == "cfg") return cmd_cfg(p, out);
    throw UsageError("Command '" + cmd->name + "' is not available");
  } catch (const Error& e) {
    report_error(e, json_out, out, err);
    return e.exit_code();
  } catch (...) {
    const RuntimeError re = error_for_exception(std::current_exception());
    report_error(re, json_out, out, err);
    return re.exit_code();
  }
}

RuntimeError error_for_exception(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::OutOfMemoryError& x) {
    // The GPU's memory (LibTorch's CUDA caching allocator).
    return RuntimeError(std::string("out of GPU memory: ") + x.what_without_backtrace(), "Reduce batch or imgsz.",
                        "cuda_oom");
  } catch (const c10::Error& x) {
    return RuntimeError(std::string("LibTorch error: ") + x.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    // The host's memory: std::bad_alloc never comes from the GPU's allocator.
    return RuntimeError("out of host memory", "Reduce batch, imgsz or workers (or the number of classes).",
                        "out_of_memory");
  } catch (const std::exception& x) {
    return RuntimeError(x.what());
  } catch (...) {
    return RuntimeError("unknown error");
  }
}

}  // namespace libreyolo::cli
