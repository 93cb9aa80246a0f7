// Per-iteration learning-rate schedules: linear warm-up then linear or cosine decay, and the
// warm-cos with a quadratic warm-up, a cosine and a flat floor over the no-aug epochs (LibreYOLO
// calls it yoloxwarmcos); and SGD momentum's linear warm-up.
#pragma once
#include <string>

namespace libreyolo::engine {

struct LrSchedule {
  std::string kind = "linear";  // linear, cos (warmcos), yoloxwarmcos
  double lr0 = 0.01;
  double warmup_lr_start = 1e-4;
  double min_lr_ratio = 0.01;
  long long warmup_iters = 0;  // warmup_epochs * iterations per epoch
  long long total_iters = 1;   // epochs * iterations per epoch
  long long plateau_iters = 0; // the flat floor's iterations (no_aug_epochs), yoloxwarmcos only

  double momentum = 0.937;         // after warm-up
  double warmup_momentum = 0.937;  // at step 0, rising linearly to `momentum` over warmup_iters

  // Learning rate after `it` optimizer steps.
  double at(long long it) const;
  // SGD momentum after `it` optimizer steps.
  double momentum_at(long long it) const;
};

}  // namespace libreyolo::engine
