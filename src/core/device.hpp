// The `device` argument: "auto", "cpu", "cuda", "cuda:N", "N", "0,1", "[0,1]", "mps".
#pragma once
#include <torch/types.h>

#include <string>
#include <vector>

namespace libreyolo {

// CUDA indices the argument names: "0,1" -> {0,1}, "cuda:1"
// -> {1}, "3" -> {3}; "", auto, cpu, mps and anything else -> {}.
std::vector<int> parse_device_list(const std::string& device);
// True when the argument asks for more than one CUDA device (multi-GPU training).
bool wants_distributed(const std::string& device);
// One device. "auto" -> cuda:0 when CUDA is there, else cpu. A CUDA device that does not exist,
// "mps", or a multi-device list -> UsageError (code device_not_available / config_conflict).
torch::Device resolve_device(const std::string& device);
// Waits for the device's queued work (CUDA); nothing on the CPU. For timings and host reads.
void synchronize(const torch::Device& device);

// cuDNN for a run whose shapes repeat (training): autotuning on or off by default (on: over the
// kAutotuneCandidates best candidates of cuDNN's heuristics per convolution), then the
// environment's overrides, for comparisons and start-up experiments:
//   LIBREYOLO_CUDNN_BENCHMARK=0 (heuristics only), 1 (autotune), N > 1 (autotune, N candidates each)
//   LIBREYOLO_TF32=0            full fp32 convolutions and matmuls
//   LIBREYOLO_DETERMINISTIC=1   deterministic algorithms by heuristics (same bits from run to run)
// `deterministic` (the train option) does what LIBREYOLO_DETERMINISTIC=1 does.
// Returns what the option or the environment changed, one line per setting ("" when nothing).
std::vector<std::string> configure_cudnn(bool autotune, bool deterministic = false);
// Candidates timed per convolution when autotuning (ATen's default is 10). H200, v9-t bf16 graphed,
// batch 16: the first step of a fresh process 13.9 s with 10, 7.1 s with 4, 1.6 s without
// autotuning; the steady speed with 4 equals 10's (590 img/s end to end; steps at batch 8/16/32
// within 1%), without autotuning the batch-8 step is 43% slower.
constexpr int kAutotuneCandidates = 4;

// Candidates per convolution when the first run of an inference shape about to be captured in a
// CUDA graph is autotuned (ATen's default). H200, v9-t graphed, channels_last, a fresh process per
// setting: batch 32 bf16 9.11 ms without autotuning, 7.61 with 4 candidates, 7.44 with 10; fp32
// 10.28 / 10.54 / 9.43 ms (4 candidates lost there); batch 1 about the same either way.
constexpr int kInferenceAutotuneCandidates = 10;

// cuDNN autotuning on for one scope, the previous setting back on exit. ATen keeps one algorithm
// per convolution shape and data type, chosen by that shape's first run (autotuned or not, later
// settings do not revisit it), so the scope must cover a shape's first run. `candidates` per
// convolution unless LIBREYOLO_CUDNN_BENCHMARK says otherwise (0: no autotuning, 1: ATen's 10,
// N > 1: N); LIBREYOLO_DETERMINISTIC=1 or deterministic cuDNN in the context: none. A malformed
// variable throws UsageError.
class CudnnAutotuneScope {
 public:
  explicit CudnnAutotuneScope(int candidates);
  ~CudnnAutotuneScope();
  CudnnAutotuneScope(const CudnnAutotuneScope&) = delete;
  CudnnAutotuneScope& operator=(const CudnnAutotuneScope&) = delete;

 private:
  bool was_on_;
  int was_limit_;
};

// The host memory the system has available for new work (MemAvailable), in bytes; -1 when unknown.
int64_t host_available_bytes();
// Free memory of CUDA device `index` (cudaMemGetInfo), in bytes; -1 when unknown (no CUDA).
int64_t device_free_bytes(int index);

}  // namespace libreyolo
