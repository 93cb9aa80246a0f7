// Training hooks: the train loop calls these around each epoch and step; everything around the
// step (validation, checkpoints, results.csv, plots, progress, callbacks, the profiler) is a hook.
//
//   struct MyHook : libreyolo::TrainHook {
//     void after_epoch(libreyolo::TrainState& s, libreyolo::EpochSummary& e) override {
//       std::printf("epoch %d loss %.3f\n", e.epoch, e.loss);
//       if (e.loss < 0.5) s.stop = true;  // ends training after this epoch
//     }
//   };
//   model.train({{"data", "my.yaml"}}, {}, {std::make_shared<MyHook>()});
#pragma once
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <libreyolo/config.hpp>

namespace libreyolo {

struct EpochSummary;
struct TrainResult;

// The parts of one training step, in order. Dataload is the wait for the next batch.
enum class Phase { Dataload, ToDevice, Forward, Loss, Backward, Optimizer };
const char* phase_name(Phase p);  // "dataload", "to_device", "forward", "loss", "backward", "optimizer"

// What hooks see of a running training. Hooks may set `stop`.
struct TrainState {
  const TrainConfig* config = nullptr;  // the resolved configuration (after resume)
  std::string save_dir;                 // run directory
  int epoch = 0;                        // current epoch, 0-based
  int start_epoch = 0;                  // first epoch of this invocation (> 0 after resume)
  int epochs = 0;                       // total epochs of the run
  int64_t batch_index = 0;              // batch within the epoch
  int64_t batches_per_epoch = 0;
  int64_t global_step = 0;              // optimizer steps taken so far
  int64_t batch_images = 0;             // images in the current batch
  bool optimizer_step = false;          // this batch closes an accumulation window
  int rank = 0, world_size = 1;         // data-parallel position (rank 0 owns side effects)
  bool stop = false;                    // set by a hook: training ends after the current step
  std::string stop_reason;              // logged when a hook stops training
  bool interrupted = false;             // set by the loop when SIGINT/SIGTERM arrived
  std::string status;                   // a short note for the progress line (e.g. the profiler's)
};

class TrainHook {
 public:
  virtual ~TrainHook() = default;
  virtual void before_train(TrainState&) {}
  virtual void before_epoch(TrainState&) {}
  virtual void before_step(TrainState&) {}
  virtual void after_step(TrainState&) {}
  // `e` may be amended by hooks that run earlier (validation fills in the metrics).
  virtual void after_epoch(TrainState&, EpochSummary&) {}
  virtual void after_train(TrainState&, TrainResult&) {}
  // Training failed or was interrupted (state.interrupted); the exception is rethrown afterwards.
  virtual void on_exception(TrainState&, const std::exception&) {}

  // Phases of each step, reported only while some hook's observes_phases() is true (zero cost
  // otherwise).
  virtual bool observes_phases() const { return false; }
  virtual void phase_begin(TrainState&, Phase) {}
  virtual void phase_end(TrainState&, Phase) {}

  // Hooks run on rank 0 only unless this says otherwise (files, logs and callbacks belong to rank 0).
  virtual bool all_ranks() const { return false; }
  // A hook whose finished() turns true is removed after the call in which it did.
  virtual bool finished() const { return false; }
  virtual std::string name() const { return "hook"; }
};

}  // namespace libreyolo
