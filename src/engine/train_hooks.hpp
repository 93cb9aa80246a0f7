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

#include <libreyolo/hooks.hpp>
#include <libreyolo/libreyolo.hpp>

namespace libreyolo::engine {

class Trainer;

// The built-in hooks in order, then the caller's `user` hooks.
std::vector<std::shared_ptr<TrainHook>> build_hooks(Trainer& t, const TrainCallbacks& callbacks,
                                                    const std::vector<std::shared_ptr<TrainHook>>& user);

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
