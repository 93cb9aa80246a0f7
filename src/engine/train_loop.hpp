// The train loop on its own: hooks around epochs and steps, nothing else. The Trainer supplies
// the steps (data, model, optimizer); everything around them is a hook. Detectron2's TrainerBase
// is the model.
//
//   before_train
//   for each epoch: before_epoch
//                   for each batch: [dataload] before_step run_step after_step
//                   after_epoch
//   after_train            (on an error or interrupt: on_exception, then rethrow)
#pragma once
#include <chrono>
#include <memory>
#include <vector>

#include <libreyolo/hooks.hpp>
#include <libreyolo/libreyolo.hpp>

#include "engine/step.hpp"

namespace libreyolo::engine {

// What the loop drives.
class EpochSteps {
 public:
  virtual ~EpochSteps() = default;
  virtual void begin_epoch(TrainState& s) = 0;
  // False once the epoch's batches are all done (asked before each fetch, so that a phase
  // observer never sees a fetch that yields nothing).
  virtual bool has_next(const TrainState& s) const = 0;
  // Fetches the next batch and fills s.batch_index / batch_images / optimizer_step / global_step;
  // false when the data ran out early after all.
  virtual bool next_batch(TrainState& s) = 0;
  virtual void run_step(TrainState& s) = 0;
  virtual EpochSummary end_epoch(TrainState& s) = 0;
  // After the epoch's after_epoch hooks: under data parallelism every rank takes rank 0's
  // s.stop (rank 0's hooks decide: validation, patience). Nothing to do in one process.
  virtual void sync_after_epoch(TrainState& s) {}
  // Before after_train: under data parallelism every rank waits until rank 0 has written its
  // last files, and learns where they are.
  virtual void sync_before_end(TrainState& s) {}
};

class TrainLoop : public PhaseObserver {
 public:
  explicit TrainLoop(TrainState& state) : s_(state) {}

  // During a call into the hooks a new hook joins after that call (the profiler installs itself so).
  void add_hook(std::shared_ptr<TrainHook> hook);
  const std::vector<std::shared_ptr<TrainHook>>& hooks() const { return hooks_; }
  // True while some hook observes phases (the step should report them to this loop then).
  bool observing_phases() const { return observing_; }

  // Epochs s.start_epoch .. s.epochs-1, until a hook sets s.stop (in the middle of an epoch: that
  // epoch is abandoned, without after_epoch; under data parallelism, where ranks must run the
  // same steps, a stop takes effect at the end of the epoch). Checks for Ctrl-C/SIGTERM after each step
  // (InterruptedError). Fills result.epochs/final_loss and hands `result` to after_train.
  // result.total_seconds counts from `started`.
  void run(EpochSteps& steps, TrainResult& result, std::chrono::steady_clock::time_point started);

  void phase_begin(Phase p) override;
  void phase_end(Phase p) override;

 private:
  template <class F>
  void call(F&& fn);
  bool runs_here(const TrainHook& h) const { return s_.rank == 0 || h.all_ranks(); }
  void refresh();

  TrainState& s_;
  std::vector<std::shared_ptr<TrainHook>> hooks_, pending_;
  bool in_call_ = false;
  bool observing_ = false;
};

}  // namespace libreyolo::engine
