#include "engine/schedule.hpp"

#include <algorithm>
#include <cmath>

namespace libreyolo::engine {

double LrSchedule::at(long long it) const {
  const double start = std::min(warmup_lr_start, lr0);
  const double min_lr = lr0 * min_lr_ratio;
  const double w = static_cast<double>(warmup_iters);
  if (kind == "yoloxwarmcos") {
    if (warmup_iters > 0 && it <= warmup_iters) {
      const double f = static_cast<double>(it) / w;
      return (lr0 - start) * f * f + start;
    }
    if (it >= total_iters - plateau_iters) return min_lr;
    const double span = static_cast<double>(std::max<long long>(1, total_iters - warmup_iters - plateau_iters));
    return min_lr + 0.5 * (lr0 - min_lr) * (1.0 + std::cos(M_PI * static_cast<double>(it - warmup_iters) / span));
  }
  if (warmup_iters > 0 && it <= warmup_iters) return (lr0 - start) * static_cast<double>(it) / w + start;
  const double span = static_cast<double>(std::max<long long>(1, total_iters - warmup_iters));
  const double progress = static_cast<double>(it - warmup_iters) / span;
  if (kind == "cos" || kind == "warmcos")
    return min_lr + 0.5 * (lr0 - min_lr) * (1.0 + std::cos(M_PI * progress));
  return lr0 - (lr0 - min_lr) * progress;
}

double LrSchedule::momentum_at(long long it) const {
  if (warmup_iters <= 0 || it >= warmup_iters) return momentum;
  return warmup_momentum + (momentum - warmup_momentum) * static_cast<double>(it) / static_cast<double>(warmup_iters);
}

}  // namespace libreyolo::engine
