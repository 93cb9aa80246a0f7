// Per-iteration learning-rate schedules of the YOLOv9 recipe (yolo9.md §3.4, training.md §5.8).
#pragma once
#include <string>

namespace libreyolo::engine {

struct LrSchedule {
  std::string kind = "linear";  // linear, cos
  double lr0 = 0.01;
  double warmup_lr_start = 1e-4;
  double min_lr_ratio = 0.01;
  long long warmup_iters = 0;  // warmup_epochs * iterations per epoch
  long long total_iters = 1;   // epochs * iterations per epoch

  // Learning rate after `it` optimizer steps.
  double at(long long it) const;
};

}  // namespace libreyolo::engine
