// AutoBatch (`batch=-1`): the largest power-of-two batch whose training step fits a fraction of
// the GPU's total memory, measured with real train-mode forward+backward passes of the model.
//
// probe_auto_batch() runs zero images of batch 1, 2, 4, ... up to max_probe through the model
// (autocast when AMP is on), records the allocator's peak after each backward, fits a line
// memory = slope * batch + intercept by least squares and returns the largest power of two
// strictly below the batch the line gives for `fraction` of total memory (fit_auto_batch()).
// resolve_auto_batch() turns that per-GPU batch into the global batch (world size, nbs cap).
// Only the probe needs a GPU; the arithmetic is separate so that it can be tested anywhere.
#pragma once
#include <torch/torch.h>

#include <vector>

#include <libreyolo/config.hpp>

#include "engine/amp.hpp"
#include "models/detector.hpp"

namespace libreyolo::engine {

// The largest power of two strictly below x; 1 for x <= 2 (and for NaN).
// 33 -> 32, 32 -> 16, 65 -> 64, 17.5 -> 16, 5 -> 4, 4 -> 2, 2 -> 1, 0.5 -> 1.
int floor_pow2_strict(double x);

// Least-squares line through (sizes[i], gib[i]) and the batch for `target_gib`:
// floor_pow2_strict((target - intercept) / slope) clamped to [1, 1024], logged. Returns
// `fallback` with a warning naming why when there are fewer than two distinct probe sizes or
// the slope is not positive.
int fit_auto_batch(const std::vector<int>& sizes, const std::vector<double>& gib, double target_gib, int fallback);

// Per-GPU batch -> global batch: per_gpu * world_size, capped at nbs when nbs > 0 and rounded
// down to a multiple of the world size (at least one image per GPU, with a warning when that
// exceeds nbs). Logs the result.
int resolve_auto_batch(int per_gpu, int world_size, int nbs);

struct AutoBatchOptions {
  int imgsz = 640;
  AmpPlan amp;              // autocast of the probe forward (as the training step's)
  double fraction = 0.60;   // of the device's *total* memory
  int fallback = 16;        // returned when there is nothing to measure or fit
  int max_probe = 64;       // largest probed batch (nbs when nbs > 0)
  bool channels_last = false;  // probe input in channels_last (activations follow it)
};

// Measures the model's training memory on `device` (CUDA only: elsewhere logs and returns
// opt.fallback) and returns the per-GPU batch of fit_auto_batch(). The model must be on
// `device`. Leaves the model as it found it: every module's train/eval mode and every
// BatchNorm's running_mean, running_var and num_batches_tracked are restored; gradients are
// left unset (None), as after zero_grad(set_to_none). Probing stops at the first out-of-memory
// error or when a probe used more than 90 % of the memory; other errors propagate (after the
// model has been restored).
int probe_auto_batch(models::Detector& model, const torch::Device& device, const AutoBatchOptions& opt);

// The trainer's batch: cfg.batch unless it is -1; for -1, probe_auto_batch() on `device`
// (imgsz, amp, max_probe = nbs or 64; a probe that throws logs a warning and counts as the
// fallback 16) and then resolve_auto_batch(per_gpu, world_size, cfg.nbs).
int resolve_train_batch(const TrainConfig& cfg, models::Detector& model, const torch::Device& device,
                        const AmpPlan& amp, bool channels_last, int world_size = 1);

}  // namespace libreyolo::engine
