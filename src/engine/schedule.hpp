// Per-iteration learning-rate schedules, in four shapes: linear warm-up then linear or cosine
// decay, or then constant; and a quadratic warm-up, a cosine and a flat floor over the no-aug
// epochs; and SGD
// momentum's linear warm-up. Scheduler names select a shape: the generic ones here, and the names
// a model's family gives them (models::Family::scheduler_names).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace libreyolo::engine {

enum class LrShape {
  Linear,      // linear warm-up, linear decay to lr0 * min_lr_ratio
  Cosine,      // linear warm-up, cosine decay to lr0 * min_lr_ratio
  CosineFlat,  // quadratic warm-up, cosine to lr0 * min_lr_ratio, flat over the last plateau_iters
  Constant,    // linear warm-up (when any), then lr0 to the end
  FlatCosine,  // linear warm-up, lr0, then a cosine to lr0 * min_lr_ratio over the last plateau_iters
              // (at most the iterations after warm-up)
};

// The shape `name` selects: a generic name (linear; cos or warmcos; cos_flat; constant; flat_cosine) or one of
// `family_names` ({name, generic name}). Throws UsageError listing the accepted names.
LrShape lr_shape(const std::string& name, const std::vector<std::pair<std::string, std::string>>& family_names = {});

struct LrSchedule {
  LrShape shape = LrShape::Linear;
  double lr0 = 0.01;
  double warmup_lr_start = 1e-4;
  double min_lr_ratio = 0.01;
  long long warmup_iters = 0;  // warmup_epochs * iterations per epoch
  long long total_iters = 1;   // epochs * iterations per epoch
  long long plateau_iters = 0; // the flat floor's iterations (no_aug_epochs), CosineFlat only

  double momentum = 0.937;         // after warm-up
  double warmup_momentum = 0.937;  // at step 0, rising linearly to `momentum` over warmup_iters

  // Learning rate after `it` optimizer steps.
  double at(long long it) const;
  // SGD momentum after `it` optimizer steps.
  double momentum_at(long long it) const;
};

}  // namespace libreyolo::engine
