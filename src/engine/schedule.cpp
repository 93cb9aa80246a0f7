#include "engine/schedule.hpp"

#include <algorithm>
#include <cmath>

#include <libreyolo/errors.hpp>
#include <stdexcept>

namespace libreyolo::engine {

LrShape lr_shape(const std::string& name, const std::vector<std::pair<std::string, std::string>>& family_names) {
  const std::pair<const char*, LrShape> generic[] = {
      {"linear", LrShape::Linear}, {"cos", LrShape::Cosine}, {"warmcos", LrShape::Cosine}, {"cos_flat", LrShape::CosineFlat},
      {"constant", LrShape::Constant}, {"flat_cosine", LrShape::FlatCosine}};
  auto find_generic = [&](const std::string& n) -> const std::pair<const char*, LrShape>* {
    for (const auto& g : generic)
      if (n == g.first) return &g;
    return nullptr;
  };
  if (auto g = find_generic(name)) return g->second;
  for (const auto& [alias, target] : family_names)
    if (name == alias) {
      if (auto g = find_generic(target)) return g->second;
      throw std::logic_error("scheduler name " + alias + " stands for an unknown schedule " + target);
    }
  std::string all;
  for (const auto& g : generic) all += (all.empty() ? "" : ", ") + std::string(g.first);
  for (const auto& f : family_names) all += ", " + f.first;
  throw UsageError("Invalid value for 'scheduler': '" + name + "' is not one of: " + all,
                   "cos_flat is a quadratic warm-up, a cosine and a flat tail over no_aug_epochs.",
                   "config_range_error");
}

double LrSchedule::at(long long it) const {
  const double start = std::min(warmup_lr_start, lr0);
  const double min_lr = lr0 * min_lr_ratio;
  const double w = static_cast<double>(warmup_iters);
  if (shape == LrShape::CosineFlat) {
    if (warmup_iters > 0 && it <= warmup_iters) {
      const double f = static_cast<double>(it) / w;
      return (lr0 - start) * f * f + start;
    }
    if (it >= total_iters - plateau_iters) return min_lr;
    const double span = static_cast<double>(std::max<long long>(1, total_iters - warmup_iters - plateau_iters));
    return min_lr + 0.5 * (lr0 - min_lr) * (1.0 + std::cos(M_PI * static_cast<double>(it - warmup_iters) / span));
  }
  if (warmup_iters > 0 && it <= warmup_iters) return (lr0 - start) * static_cast<double>(it) / w + start;
  if (shape == LrShape::Constant) return lr0;
  if (shape == LrShape::FlatCosine) {
    const long long tail = std::min(plateau_iters, std::max(0LL, total_iters - warmup_iters));
    const long long start = total_iters - tail;
    if (it < start) return lr0;
    const double progress =
        std::min(1.0, static_cast<double>(it - start) / static_cast<double>(std::max<long long>(1, tail)));
    return min_lr + 0.5 * (lr0 - min_lr) * (1.0 + std::cos(M_PI * progress));
  }
  const double span = static_cast<double>(std::max<long long>(1, total_iters - warmup_iters));
  const double progress = static_cast<double>(it - warmup_iters) / span;
  if (shape == LrShape::Cosine)
    return min_lr + 0.5 * (lr0 - min_lr) * (1.0 + std::cos(M_PI * progress));
  return lr0 - (lr0 - min_lr) * progress;
}

double LrSchedule::momentum_at(long long it) const {
  if (warmup_iters <= 0 || it >= warmup_iters) return momentum;
  return warmup_momentum + (momentum - warmup_momentum) * static_cast<double>(it) / static_cast<double>(warmup_iters);
}

}  // namespace libreyolo::engine
