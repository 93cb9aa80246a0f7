// The built-in training hooks and the one place that builds the hook list. Order matters within
// each event: the evaluation hook fills an epoch's metrics before the checkpoint, results.csv,
// plots, progress and callbacks read them; summary.json is written before the best weights are
// restored into the caller's model.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <libreyolo/hooks.hpp>
#include <libreyolo/libreyolo.hpp>

#include "engine/amp.hpp"

namespace libreyolo::engine {

class Trainer;

// The built-in hooks in order, then the caller's `user` hooks.
std::vector<std::shared_ptr<TrainHook>> build_hooks(Trainer& t, const TrainCallbacks& callbacks,
                                                    const std::vector<std::shared_ptr<TrainHook>>& user);

// The hooks any task's training loop shares (the Trainer's build_hooks uses them too).
// What the profiler reports a run as and where its files go.
struct ProfiledRun {
  std::string family, size;
  torch::Device device;
  AmpPlan amp;  // what the run does (off on the CPU), not what was asked
  int workers = 0, accumulate = 1;
  std::string save_dir;
};
// The training profiler (profile=true): a window of real steps fed with the loop's phases; it
// reports, writes its files and removes itself (profile_then_stop: and stops training).
std::shared_ptr<TrainHook> make_profiler_hook(const TrainConfig& c, const ProfiledRun& run);
// The caller's TrainCallbacks as a hook (start, epoch end, end, exception).
std::shared_ptr<TrainHook> make_callbacks_hook(const TrainCallbacks& callbacks);

// results.csv column of a loss term, by LibreYOLO's rule: "train/x" stays, "x_loss" becomes
// "train/x_loss", anything else "train/x_loss"; spaces become '_'.
std::string loss_column(const std::string& term);

// One progress line: "Epoch 3/40  45%|#####     | 9/20 [00:03<00:04, 2.95it/s] loss 3.21 box 1.2 ...".
struct ProgressLine {
  int epoch = 1, epochs = 1;  // 1-based
  int64_t done = 0, total = 0;
  double elapsed_s = 0;
  std::vector<std::pair<std::string, double>> losses;
  double mem_gb = 0;
  std::string status;
  int width = 100;  // terminal columns
};
// With `bar` a block-character bar sized to the width; without, a plain line for logs.
std::string format_progress(const ProgressLine& p, bool bar);

}  // namespace libreyolo::engine
