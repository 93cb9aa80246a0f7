// Loss normalisers under data parallelism. A loss divides its terms by a per-batch count (the
// sum of the soft targets, or the positive count). Under data parallelism each process
// sees only its shard, so every process divides by the mean over all processes of those counts
// (the sum of the shards' counts, at least 1, over the world size). With the gradients averaged
// across processes, the update then equals one process training on the global batch.
//
// Without a sync installed (one process, the default) loss_normalizer(c) is c.clamp_min(1):
// exactly what the losses computed before this seam existed.
#pragma once
#include <torch/torch.h>

#include "core/cross_process.hpp"

#include <memory>

namespace libreyolo {

using CountSync = CrossProcessSum;  // core/cross_process.hpp

// Process-wide (one process per device); set before training starts, not during a step.
void set_count_sync(std::shared_ptr<CountSync> sync);
std::shared_ptr<CountSync> count_sync();

// The normaliser of a loss whose local (this shard's) count is `local` (a 0-dim tensor, no grad):
// the global sum at least `min_value` (1 for a count; a loss normalising by a sum of weights may
// ask for less), over the world size.
torch::Tensor loss_normalizer(const torch::Tensor& local, double min_value = 1.0);

}  // namespace libreyolo
