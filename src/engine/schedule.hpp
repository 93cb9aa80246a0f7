// Per-iteration learning-rate schedules: the YOLOv9 recipe's linear and cos, and YOLOX's
// warm-cos (quadratic warm-up, cosine, a flat floor over the no-aug epochs); and SGD momentum's
// linear warm-up.
#pragma once
#include <string>

namespace libreyolo::engine {

struct LrSchedule {
  std::string kind = "linear";  // linear, cos, yoloxwarmcos
  double lr0 = 0.01;
  double warmup_lr_start = 1e-4;
  double min_lr_ratio = 0.01;
  long long warmup_iters = 0;  // warmup_epochs * iterations per epoch
  long long total_iters = 1;   // epochs * iterations per epoch
  long long plateau_iters = 0; // yoloxwarmcos: final iterations held at the floor (no_aug_epochs)

  double momentum = 0.937;         // after warm-up
  double warmup_momentum = 0.937;  // at step 0, rising linearly to `momentum` over warmup_iters

  // Learning rate after `it` optimizer steps.
  double at(long long it) const;
  // SGD momentum after `it` optimizer steps.
  double momentum_at(long long it) const;
};

}  // namespace libreyolo::engine
