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
  std::string where;           // "" for the host's memory, else the device ("cuda:0")
  double need_gib() const { return activations_gib + fixed_gib; }
};

// Heap growth per input pixel of one image in a train-mode forward (bytes), measured on the CPU;
// the model is left as it was (modes, BatchNorm statistics). 0 where the heap cannot be measured.
double cpu_activation_bytes_per_pixel(models::Detector& model);

// The estimate for `batch` images of imgsz x imgsz on the CPU with `workers` loader threads.
MemoryEstimate estimate_cpu_training_memory(models::Detector& model, int batch, int imgsz, int workers);

// The estimate on a CUDA device, from the per-pixel growth measured on the CPU (the model still
// there): activations at half their float32 size under autocast (`amp`), the float32 weights, their
// gradients, the optimizer's moments and the EMA, against the device's free memory. Coarser than
// the host's (the GPU's kernels save other tensors than the CPU's), so check_memory_fits only warns.
MemoryEstimate estimate_cuda_training_memory(double activation_bytes_per_pixel, models::Detector& model, int batch,
                                             int imgsz, bool amp, const torch::Device& device);

// Host memory: throws UsageError (code out_of_memory) when the estimate exceeds the available
// memory; warns above 80 % of it. Device memory: warns when the estimate exceeds 80 % of the free
// memory (a step that does not fit then ends in a cuda_oom error). Logs the estimate.
void check_memory_fits(const MemoryEstimate& e, int batch, int imgsz);

// Free memory of a CUDA device in GiB (0 when unknown or not CUDA).
double device_free_gib(const torch::Device& device);

// MemAvailable of /proc/meminfo in GiB, 0 when unknown.
double host_available_gib();

}  // namespace libreyolo::engine
