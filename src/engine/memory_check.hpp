// Before the first training step: does one step fit the memory it will run in? On the CPU the
// step's memory is estimated from two small train-mode forwards of the model itself (the heap's
// growth per input pixel between 64 and 128 px, so fixed costs cancel) scaled to batch x imgsz^2,
// plus the weights, their gradients and optimizer/EMA copies and the loader's batches in flight,
// and compared with the memory the system has available (MemAvailable). A run that cannot fit is
// refused with the numbers instead of meeting the OOM killer; one that comes close is warned about.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "models/detector.hpp"

namespace libreyolo::engine {

struct MemoryEstimate {
  double activations_gib = 0;  // the step's activations and their gradients
  double fixed_gib = 0;        // weights, gradients, optimizer state, EMA, loader batches
  double available_gib = 0;    // what the system has (0: unknown)
  double need_gib() const { return activations_gib + fixed_gib; }
};

// Heap growth per input pixel of one image in a train-mode forward (bytes), measured on the CPU;
// the model is left as it was (modes, BatchNorm statistics). 0 where the heap cannot be measured.
double cpu_activation_bytes_per_pixel(models::Detector& model);

// The estimate for `batch` images of imgsz x imgsz on the CPU with `workers` loader threads.
MemoryEstimate estimate_cpu_training_memory(models::Detector& model, int batch, int imgsz, int workers);

// Throws UsageError (code out_of_memory) when the estimate exceeds the available memory; warns
// above 80 % of it. Logs the estimate.
void check_memory_fits(const MemoryEstimate& e, int batch, int imgsz);

// MemAvailable of /proc/meminfo in GiB, 0 when unknown.
double host_available_gib();

}  // namespace libreyolo::engine
