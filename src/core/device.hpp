// The `device` argument: "auto", "cpu", "cuda", "cuda:N", "N", "0,1", "[0,1]", "mps".
#pragma once
#include <torch/types.h>

#include <string>
#include <vector>

namespace libreyolo {

// CUDA indices the argument names (../shared/reference/training.md §1.1): "0,1" -> {0,1}, "cuda:1"
// -> {1}, "3" -> {3}; "", auto, cpu, mps and anything else -> {}.
std::vector<int> parse_device_list(const std::string& device);
// True when the argument asks for more than one CUDA device (multi-GPU training).
bool wants_distributed(const std::string& device);
// One device. "auto" -> cuda:0 when CUDA is there, else cpu. A CUDA device that does not exist,
// "mps", or a multi-device list -> UsageError (code device_not_available / config_conflict).
torch::Device resolve_device(const std::string& device);
// Waits for the device's queued work (CUDA); nothing on the CPU. For timings and host reads.
void synchronize(const torch::Device& device);

}  // namespace libreyolo
