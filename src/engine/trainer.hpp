// The Trainer: set-up (resume, device, data, model, optimizer, step) and the steps of each epoch,
// driven by the train loop (engine/train_loop.hpp). Everything around the steps (validation and
// best/patience, checkpoints, results.csv, summary.json, plots, progress, user callbacks, the
// profiler) is a hook (engine/train_hooks.hpp); engine/train.hpp puts the pieces together.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <libreyolo/hooks.hpp>
#include <libreyolo/libreyolo.hpp>

#include "core/cpu_share.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "dist/group.hpp"
#include "data/loader.hpp"
#include "engine/step.hpp"
#include "engine/train_loop.hpp"
#include "io/py_value.hpp"
#include "layers/cudnn_fusion.hpp"
#include "models/loaded_model.hpp"

namespace libreyolo::engine {

// The best validation result so far (restored on resume, kept by the evaluation hook).
struct BestMetric {
  double map50_95 = 0.0, map50 = 0.0;
  int epoch = 0;  // 1-based; 0 = never validated
  int patience_counter = 0;
};

class Trainer : private EpochSteps {
 public:
  // `given` are the options exactly as the caller wrote them (on resume the checkpoint's config
  // is restored, then these override it).
  Trainer(models::LoadedModel& lm, TrainConfig cfg, Kwargs given = {});
  ~Trainer() override;
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  // Resolves the configuration (resume), device, data, model, run directory, optimizer and step.
  // dry_run: every check the run makes before its first step (configuration, device, data,
  // model and freeze, optimizer, resume state, that the run directory can be made), without
  // making the run directory; run() must not follow.
  void setup(bool dry_run = false);
  // The loop (setup() first). Hooks are added between the two.
  TrainResult run();

  // Adds a hook; during the run it joins after the current hook call (the profiler could
  // install itself so).
  void add_hook(std::shared_ptr<TrainHook> hook);

  // For hooks.
  TrainState& state() { return state_; }
  const TrainConfig& config() const { return cfg_; }
  const std::string& save_dir() const { return state_.save_dir; }
  models::LoadedModel& loaded() { return lm_; }
  models::Detector& model() { return *model_; }
  models::Detector* ema_model() { return ema_model_.get(); }
  ModelEMA* ema() { return ema_.get(); }
  const torch::Device& device() const { return device_; }
  // The data-parallel process group (nullptr when training in one process).
  dist::Group* group() const { return group_.get(); }
  const AmpPlan& amp() const { return amp_; }
  StepRunner& step_runner() { return *step_; }
  data::DataLoader& train_loader() { return *train_loader_; }
  std::shared_ptr<const data::YoloDataset> train_set() const { return train_set_; }
  std::shared_ptr<const data::YoloDataset> val_set() const { return val_set_; }
  const std::vector<std::string>& names() const { return names_; }
  int workers() const { return workers_; }
  int accumulate() const { return accumulate_; }
  BestMetric& best() { return best_; }
  TrainResult& result() { return result_; }
  const io::PyValuePtr& resume_checkpoint() const { return resume_ckpt_; }
  io::PyValuePtr config_dict() const;
  // The batch of the current step (between before_step and after_step), else nullptr.
  const data::Batch* current_batch() const { return current_batch_; }
  // Per-term loss sums of this epoch so far (device tensor [1 + K]: total, then the named terms),
  // the number of batches they cover, and the term names.
  const torch::Tensor& loss_sums() const { return loss_sums_; }
  int64_t batches_done() const { return batches_done_; }
  const std::vector<std::string>& loss_names() const { return loss_names_; }
  // Mean loss terms of this epoch so far (synchronises): ("loss", total), then each named term.
  std::vector<std::pair<std::string, double>> mean_losses() const;

 // The config's dataset and project as absolute paths.
  static void make_paths_absolute(TrainConfig& c);

 private:
  void setup_resume_config();
  void setup_device();
  void setup_data(bool dry_run);
  void setup_model();
  void setup_optimization();
  void resume();
  // The training-only auxiliary branch (aux_weight): enabled, with the loaded weights' tensors for
  // it when `from_weights`; on resume only when the checkpoint has it.
  void setup_aux(bool from_weights);
  void apply_freeze();
  // CPU training: this run's compute threads follow its share of the cores (core/cpu_share).
  void share_cpu();
  // When other CPU trainings run beside this one and OMP_WAIT_POLICY is unset: a warning saying
  // to set it (once a run).
  void warn_spinning_threads();
  // The cores of this CPU training: its share, at most the threads torch started with.
  int cpu_cores() const;
  // EpochSteps
  void begin_epoch(TrainState& s) override;
  bool has_next(const TrainState& s) const override { return s.batch_index + 1 < s.batches_per_epoch; }
  bool next_batch(TrainState& s) override;
  void run_step(TrainState& s) override;
  EpochSummary end_epoch(TrainState& s) override;
  void sync_after_epoch(TrainState& s) override;
  void sync_before_end(TrainState& s) override;
  // Data parallelism (torchrun's environment, or a spawned worker): the process group, the
  // device cuda:LOCAL_RANK (or the CPU), the syncs of dist/syncs.hpp.
  void setup_distributed(const dist::RankEnv& env);
  void install_syncs();

  models::LoadedModel& lm_;
  TrainConfig cfg_;
  Kwargs given_;
  TrainState state_;
  TrainLoop loop_{state_};

  torch::Device device_{torch::kCPU};
  std::shared_ptr<models::Detector> model_;
  std::shared_ptr<models::Detector> ema_model_;
  std::unique_ptr<ModelEMA> ema_;
  std::unique_ptr<StepRunner> step_;
  AmpPlan amp_;
  bool channels_last_ = false;
  double activation_bytes_per_pixel_ = 0;  // measured on the CPU for the device memory estimate (CUDA)

  std::shared_ptr<const data::YoloDataset> train_set_, val_set_;
  std::unique_ptr<data::DataLoader> train_loader_;
  std::vector<std::string> names_;

  std::string resume_path_;
  io::PyValuePtr resume_ckpt_;
  int workers_ = 0;  // loader threads actually used (cfg_.workers, capped on CPU)
  std::unique_ptr<CpuShare> cpu_share_;  // CPU training: this run's share of the cores
  int compute_threads_ = 0;               // CPU training: intra-op threads now
  std::chrono::steady_clock::time_point cpu_share_checked_;
  bool spin_warned_ = false;
  int accumulate_ = 1;
  AccumulationWindow window_{1, true};  // the current batch's (next_batch)
  int64_t steps_per_epoch_ = 1;  // optimizer steps
  int64_t batches_done_ = 0;
  std::optional<data::Batch> batch_;  // the current step's batch
  const data::Batch* current_batch_ = nullptr;
  std::chrono::steady_clock::time_point started_, epoch_start_;
  torch::Tensor loss_sums_;
  std::vector<std::string> loss_names_;
  std::vector<std::string> frozen_prefixes_;
  BestMetric best_;
  TrainResult result_;
  std::shared_ptr<dist::Group> group_;  // null in one process
  std::optional<LogLevel> saved_log_level_;  // ranks other than 0 log warnings and errors only
  std::optional<models::PlanTuning> saved_plan_tuning_;  // put back when the trainer ends
};


// The run's options as <save_dir>/train_config.yaml (atomically), their paths made absolute: a
// resume from another working directory finds the same dataset and run directory.
void write_train_config(const std::string& save_dir, TrainConfig cfg);

}  // namespace libreyolo::engine
