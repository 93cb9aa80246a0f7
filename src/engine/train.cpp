#include "engine/train.hpp"
#include "core/env.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/device.hpp"
#include "core/interrupt.hpp"
#include "core/log.hpp"
#include "dist/group.hpp"
#include "dist/spawn.hpp"
#include "engine/train_hooks.hpp"
#include "engine/trainer.hpp"
#include "io/checkpoint.hpp"
#include "io/pickle.hpp"

namespace libreyolo::engine {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

TrainResult train_here(models::LoadedModel& lm, const TrainConfig& cfg, const TrainCallbacks& callbacks,
                       const std::vector<std::shared_ptr<TrainHook>>& hooks, const Kwargs& given) {
  Trainer t(lm, cfg, given);
  t.setup();
  for (auto& h : build_hooks(t, callbacks, hooks)) t.add_hook(std::move(h));
  return t.run();
}

// ---- the result a spawned rank 0 hands to the parent (JSON: it crosses a process boundary)

json pairs_to_json(const std::vector<std::pair<std::string, double>>& v) {
  json a = json::array();
  for (const auto& [k, x] : v) a.push_back({k, x});
  return a;
}

std::vector<std::pair<std::string, double>> pairs_from_json(const json& a) {
  std::vector<std::pair<std::string, double>> v;
  for (const auto& p : a) v.emplace_back(p.at(0).get<std::string>(), p.at(1).get<double>());
  return v;
}

void write_result(const std::string& path, const TrainResult& r) {
  json j;
  j["final_loss"] = r.final_loss;
  j["best_mAP50"] = r.best_mAP50;
  j["best_mAP50_95"] = r.best_mAP50_95;
  j["best_epoch"] = r.best_epoch;
  j["save_dir"] = r.save_dir;
  j["best_checkpoint"] = r.best_checkpoint;
  j["last_checkpoint"] = r.last_checkpoint;
  j["total_seconds"] = r.total_seconds;
  j["epochs"] = json::array();
  for (const auto& e : r.epochs)
    j["epochs"].push_back({{"epoch", e.epoch},
                           {"seconds", e.seconds},
                           {"loss", e.loss},
                           {"losses", pairs_to_json(e.losses)},
                           {"lrs", e.lrs},
                           {"validated", e.validated},
                           {"is_best", e.is_best},
                           {"map50", e.map50},
                           {"map50_95", e.map50_95},
                           {"metrics", pairs_to_json(e.metrics)}});
  std::ofstream f(path, std::ios::trunc);
  f << j.dump();
  if (!f) throw RuntimeError("Cannot write the multi-GPU result file " + path);
}

TrainResult read_result(const std::string& path) {
  std::ifstream f(path);
  json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    throw RuntimeError("Multi-GPU training ended without rank 0's result (" + path + "): " + e.what());
  }
  TrainResult r;
  r.final_loss = j.value("final_loss", 0.0);
  r.best_mAP50 = j.value("best_mAP50", 0.0);
  r.best_mAP50_95 = j.value("best_mAP50_95", 0.0);
  r.best_epoch = j.value("best_epoch", 0);
  r.save_dir = j.value("save_dir", "");
  r.best_checkpoint = j.value("best_checkpoint", "");
  r.last_checkpoint = j.value("last_checkpoint", "");
  r.total_seconds = j.value("total_seconds", 0.0);
  for (const auto& e : j.value("epochs", json::array())) {
    EpochSummary s;
    s.epoch = e.value("epoch", 0);
    s.seconds = e.value("seconds", 0.0);
    s.loss = e.value("loss", 0.0);
    s.losses = pairs_from_json(e.value("losses", json::array()));
    s.lrs = e.value("lrs", std::vector<double>{});
    s.validated = e.value("validated", false);
    s.is_best = e.value("is_best", false);
    s.map50 = e.value("map50", 0.0);
    s.map50_95 = e.value("map50_95", 0.0);
    s.metrics = pairs_from_json(e.value("metrics", json::array()));
    r.epochs.push_back(std::move(s));
  }
  return r;
}

std::string temp_path(const char* suffix) {
  std::string tmpl = (fs::temp_directory_path() / "libreyolo-ddp-XXXXXX").string() + suffix;
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const int fd = ::mkstemps(buf.data(), static_cast<int>(std::strlen(suffix)));
  if (fd < 0) throw RuntimeError("Cannot create a temporary file in " + fs::temp_directory_path().string());
  ::close(fd);
  return std::string(buf.data());
}

struct RemoveFiles {
  std::vector<std::string> paths;
  ~RemoveFiles() {
    std::error_code ec;
    for (const auto& p : paths) fs::remove(p, ec);
  }
};

}  // namespace

void check_spawn_allowed(const models::Family& family, const std::string& device, bool in_worker, bool cuda,
                         int visible_gpus) {
  const std::vector<int> devices = parse_device_list(device);
  if (in_worker)
    throw UsageError("A multi-GPU worker tried to start multi-GPU workers of its own (device=" + device +
                         "): workers must not spawn again",
                     "Train once per program run; a worker's train() ends its process.", "ddp_recursive_spawn");
  if (!cuda)
    throw UsageError("Multi-GPU training requires CUDA. Got device=" + device +
                         " but CUDA is not available on this machine.",
                     "Train on one device (device=cpu), or launch several CPU processes with torchrun.",
                     "config_unsupported");
  if (!family.supports_spawn)
    throw UsageError(family.name + " cannot start its own multi-GPU workers (device=" + device + ")",
                     strfmt("Launch one process per GPU with torchrun instead: torchrun --nproc_per_node=%zu "
                            "--no-python libreyolo train ...  (or call LibreYOLO::train from a program that torchrun "
                            "starts).",
                            devices.size()),
                     "config_unsupported");
  for (int d : devices)
    if (d >= visible_gpus)
      throw UsageError(strfmt("device=%s names GPU %d, but this machine has %d", device.c_str(), d, visible_gpus), "",
                       "config_invalid");
}

namespace {

// The parent of spawned workers (device=0,1): hands the weights over in a temporary
// checkpoint, runs one worker per GPU, then loads rank 0's best (else last) weights.
TrainResult spawn_training(models::LoadedModel& lm, TrainConfig cfg) {
  const std::vector<int> devices = parse_device_list(cfg.device);
  check_spawn_allowed(*lm.family, cfg.device, dist::is_spawned_worker(), torch::cuda::is_available(),
                      static_cast<int>(torch::cuda::device_count()));
  const int ws = static_cast<int>(devices.size());
  if (cfg.batch > 0) dist::check_global_batch(cfg.batch, ws);
  RemoveFiles tmp;
  std::vector<std::pair<std::string, std::string>> env;
  const std::string weights = temp_path(".pt");
  tmp.paths.push_back(weights);
  io::write_checkpoint(weights, *io::make_checkpoint(models::state_dict(*lm.model), lm.meta()));
  const std::string result_path = temp_path(".json");
  tmp.paths.push_back(result_path);
  env.emplace_back("LIBREYOLO_DDP_WEIGHTS", weights);
  env.emplace_back("LIBREYOLO_DDP_RESULT", result_path);
  const dist::SpawnOutcome out = dist::spawn_workers(devices, env);
  if (out.interrupted) throw InterruptedError("Training interrupted: the multi-GPU workers were stopped");
  TrainResult r = read_result(result_path);
  const std::string restore = !r.best_checkpoint.empty() ? r.best_checkpoint : r.last_checkpoint;
  if (!restore.empty()) {
    auto ck = io::load_torch_file(restore);
    auto loaded = models::model_from_checkpoint(ck, restore);
    loaded->weights = restore;
    loaded->checkpoint = ck;
    lm = std::move(*loaded);
    lm.to(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(devices[0])));
    lm.model->eval();
  }
  return r;
}

// A spawned worker: trains as its rank, rank 0 writes the result for the parent, and the process
// ends here (the program that spawned it continues in the parent only).
[[noreturn]] void worker_training(models::LoadedModel& lm, const TrainConfig& cfg, const TrainCallbacks& callbacks,
                                  const std::vector<std::shared_ptr<TrainHook>>& hooks, const Kwargs& given) {
  int code = 0;
  try {
    if (const char* w = env_get("LIBREYOLO_DDP_WEIGHTS")) {
      auto ck = io::load_torch_file(w);
      auto loaded = models::model_from_checkpoint(ck, w);
      loaded->weights = lm.weights;
      loaded->checkpoint = lm.checkpoint;
      lm = std::move(*loaded);
    }
    TrainResult r = train_here(lm, cfg, callbacks, hooks, given);
    const char* rp = env_get("LIBREYOLO_DDP_RESULT");
    const char* rank = std::getenv("RANK");
    if (rp && rank && std::string(rank) == "0") write_result(rp, r);
  } catch (const InterruptedError& e) {
    log_warn(e.what());
    code = 130;
  } catch (const std::exception& e) {
    log_error(std::string("rank ") + (std::getenv("RANK") ? std::getenv("RANK") : "?") + ": " + e.what());
    code = 1;
  }
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace

TrainConfig check_training(models::LoadedModel& lm, const TrainConfig& cfg, const Kwargs& given) {
  TrainConfig local = cfg;
  const bool rank_env = std::getenv("LOCAL_RANK") != nullptr;
  if (!rank_env && wants_distributed(cfg.device)) {
    // What the parent checks before spawning; each worker's own checks are the ones below, here
    // on the CPU (their data, model and options are the same).
    const int ws = static_cast<int>(parse_device_list(cfg.device).size());
    check_spawn_allowed(*lm.family, cfg.device, dist::is_spawned_worker(), torch::cuda::is_available(),
                        static_cast<int>(torch::cuda::device_count()));
    if (cfg.batch > 0) dist::check_global_batch(cfg.batch, ws);
    local.device = "cpu";
  }
  Trainer t(lm, local, given);
  t.setup(/*dry_run=*/true);
  TrainConfig resolved = t.config();
  resolved.device = cfg.device;
  return resolved;
}

TrainResult run_training(models::LoadedModel& lm, const TrainConfig& cfg, const TrainCallbacks& callbacks,
                         const std::vector<std::shared_ptr<TrainHook>>& hooks, const Kwargs& given) {
  InterruptGuard interrupts;
  // The trainer turns cuDNN autotuning on for its fixed-shape steps; the caller's setting (e.g.
  // for later predictions) comes back afterwards, also when training throws.
  struct CudnnBenchmarkRestore {
    bool was = at::globalContext().benchmarkCuDNN();
    ~CudnnBenchmarkRestore() { at::globalContext().setBenchmarkCuDNN(was); }
  } cudnn_restore;
  // Training changes the weights (and the mode): captured inference forwards must go.
  if (lm.graphs) lm.graphs->release("training changes the model");
  const bool rank_env = std::getenv("LOCAL_RANK") != nullptr;
  if (!rank_env && wants_distributed(cfg.device)) return spawn_training(lm, cfg);
  if (rank_env && dist::is_spawned_worker()) worker_training(lm, cfg, callbacks, hooks, given);
  return train_here(lm, cfg, callbacks, hooks, given);
}

}  // namespace libreyolo::engine
