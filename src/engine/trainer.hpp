// The training engine: the YOLOv9 recipe (yolo9.md §3) around a small step loop. Everything
// that is not the step itself (progress display, results.csv, user callbacks, later the
// profiler) hangs off a hook list, so it can be added and removed without touching the loop.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <libreyolo/libreyolo.hpp>

#include "core/options.hpp"
#include "data/loader.hpp"
#include "engine/step.hpp"
#include "io/py_value.hpp"

namespace libreyolo::engine {

class Trainer;

// Per-step facts the hooks may read (device tensors are not synchronised).
struct StepInfo {
  int epoch = 0;              // 0-based
  int64_t batch_index = 0;    // within the epoch
  int64_t global_step = 0;    // optimizer steps taken so far
  int64_t batch_images = 0;
  bool optimizer_step = false;
};

class TrainHook {
 public:
  virtual ~TrainHook() = default;
  virtual void before_train(Trainer&) {}
  virtual void before_epoch(Trainer&, int /*epoch*/) {}
  virtual void before_step(Trainer&, const StepInfo&) {}
  virtual void after_step(Trainer&, const StepInfo&) {}
  virtual void after_epoch(Trainer&, const EpochSummary&) {}
  virtual void after_train(Trainer&, const TrainResult&) {}
  // A hook that returns true here is removed after the current call.
  virtual bool finished() const { return false; }
};

class Trainer {
 public:
  Trainer(LibreYOLO::Impl& impl, TrainConfig cfg, TrainCallbacks callbacks, const Kwargs& given);
  ~Trainer();
  TrainResult run();

  void add_hook(std::shared_ptr<TrainHook> hook) { hooks_.push_back(std::move(hook)); }

  // For hooks.
  const TrainConfig& config() const { return cfg_; }
  const std::string& save_dir() const { return save_dir_; }
  models::Detector& model() { return *model_; }
  const torch::Device& device() const { return device_; }
  const AmpPlan& amp() const { return amp_; }
  Optimizer& optimizer() { return step_->optimizer(); }
  StepRunner& step_runner() { return *step_; }
  data::DataLoader& train_loader() { return *train_loader_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int epochs() const { return cfg_.epochs; }
  // Sums of (total, box, dfl, cls) over this epoch's batches so far, on the device, and the count.
  const torch::Tensor& loss_sums() const { return loss_sums_; }
  int64_t batches_done() const { return batches_done_; }

 private:
  void setup();
  void setup_data();
  void setup_model();
  void setup_optimization();
  void resume();
  void apply_freeze();
  EpochSummary train_epoch(int epoch);
  std::vector<std::pair<std::string, double>> validate();
  void save_checkpoint(int epoch, bool is_best, double epoch_loss);
  io::PyValuePtr config_dict() const;
  void run_hooks(const std::function<void(TrainHook&)>& fn);

  LibreYOLO::Impl& impl_;
  TrainConfig cfg_;
  TrainCallbacks callbacks_;
  Kwargs given_;
  std::vector<std::shared_ptr<TrainHook>> hooks_;

  torch::Device device_{torch::kCPU};
  std::shared_ptr<models::Detector> model_;
  std::shared_ptr<models::Detector> ema_model_;
  std::unique_ptr<ModelEMA> ema_;
  std::unique_ptr<StepRunner> step_;
  AmpPlan amp_;
  bool channels_last_ = false;

  std::shared_ptr<const data::YoloDataset> train_set_, val_set_;
  std::unique_ptr<data::DataLoader> train_loader_;
  std::vector<std::string> names_;

  std::string save_dir_;
  std::string resume_path_;
  io::PyValuePtr resume_ckpt_;
  int workers_ = 0;  // loader threads actually used (cfg_.workers, capped on CPU)
  int start_epoch_ = 0;
  int accumulate_ = 1;
  int64_t steps_per_epoch_ = 1;
  int64_t batches_done_ = 0;
  torch::Tensor loss_sums_;
  std::vector<std::string> frozen_bn_prefixes_;

  double best_map_ = 0.0, best_map50_ = 0.0;
  int best_epoch_ = 0;
  int patience_counter_ = 0;
  TrainResult result_;
};

// Runs training on `impl`'s model. `given` are the options exactly as the caller wrote them
// (used on resume: the checkpoint's config is restored, then these override it).
TrainResult run_training(LibreYOLO::Impl& impl, const TrainConfig& cfg, const TrainCallbacks& callbacks,
                         const Kwargs& given = {});

}  // namespace libreyolo::engine
