#include "core/env.hpp"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace libreyolo {

const std::vector<EnvVar>& env_vars() {
  static const std::vector<EnvVar> all = {
      // Places and settings.
      {"LIBREYOLO_CACHE", "where the set-up scripts keep the Python environment and data=builtin is generated (~/.cache/libreyolo-cpp)"},
      {"LIBREYOLO_DATASETS_DIR", "where a dataset YAML's relative path is tried first (~/datasets)"},
      {"LIBREYOLO_DETERMINISTIC", "1: deterministic algorithms (same bits from run to run; slower)"},
      {"LIBREYOLO_TF32", "0: full float32 convolutions and matmuls"},
      {"LIBREYOLO_CUDNN_BENCHMARK", "cuDNN autotuning: 0 none, 1 ATen's candidates, N candidates per convolution (training: 4)"},
      {"LIBREYOLO_CUDNN_PLAN_CACHE", "folder of the chosen cuDNN plans, or off"},
      {"LIBREYOLO_CUDNN_PLAN_BUILD", "background (default): eager predict/val run a convolution whose fused plan is missing unfused while worker threads build the plan; wait: the call builds it"},
      {"LIBREYOLO_CUDNN_FUSION_CANDIDATES", "fused inference plans timed per configuration (4; float32 6)"},
      {"LIBREYOLO_LOADER_NICE", "niceness of the loader threads (5; 0 leaves them as they are)"},
      {"LIBREYOLO_CPU_SHARE", "0: a CPU training takes the threads torch starts with, whatever else trains on the CPU"},
      {"LIBREYOLO_NVJPEG", "path of the nvJPEG library to load first"},
      {"LIBREYOLO_FONT", "TrueType font file for the text in pictures (DejaVu Sans, Liberation Sans or FreeSans where found)"},
      // Fast paths: =0 turns one off.
      {"LIBREYOLO_FUSED_CONV", "0: no fused Conv+BatchNorm(+SiLU) training node"},
      {"LIBREYOLO_FUSED_CONV_KERNELS", "0: the fused nodes with ATen's ops inside"},
      {"LIBREYOLO_FUSED_ADDEND", "0: RepConvN's sum and residuals outside the fused node"},
      {"LIBREYOLO_FUSED_REPCONVN", "0: RepConvN not as one training node"},
      {"LIBREYOLO_FUSED_POOL", "0: no 2x2 average pooling kernels"},
      {"LIBREYOLO_CUDNN_TRAIN_CONV", "0: no cached cuDNN plans for the training step's convolutions"},
      {"LIBREYOLO_WGRAD_STREAM", "0: weight gradients on the backward's stream in captured steps"},
      {"LIBREYOLO_EMA_KERNEL", "0: no one-launch EMA update"},
      {"LIBREYOLO_ASSIGN_KERNEL", "0: the assigner's pair metrics as composed ops"},
      {"LIBREYOLO_STEM_KERNEL", "0: no direct kernel for the first (3-channel) convolution"},
      {"LIBREYOLO_FOLD_BN", "0: BatchNorm not folded for inference"},
      {"LIBREYOLO_CUDNN_FUSION", "0: no cuDNN fused convolution + bias + SiLU for inference"},
      {"LIBREYOLO_CONCAT_IN_PLACE", "0: concatenations not assembled in place for inference"},
      {"LIBREYOLO_DECODE_KERNEL", "0: the DFL decode as composed ops"},
      {"LIBREYOLO_INPUT_KERNEL", "0: the network input conversion as composed ops"},
      {"LIBREYOLO_INFER_STREAMS", "0: no side streams for independent inference branches"},
      {"LIBREYOLO_GRAPH_PRIORITY", "0: graphs captured on the default-priority stream"},
      {"LIBREYOLO_NMS_KERNEL", "0: post-processing on the CPU"},
      {"LIBREYOLO_PREDICT_NVJPEG", "0: no nvJPEG decoding in predict()"},
      {"LIBREYOLO_PEER_SUM", "0: small cross-GPU sums through NCCL instead of peer memory"},
      // Measurement knobs.
      {"LIBREYOLO_WGRAD_LAG", "weight gradients in flight on the side stream (4)"},
      {"LIBREYOLO_BN_VEC", "channels per thread of the BatchNorm kernels (4)"},
      {"LIBREYOLO_BN_BLOCK_CHANNELS", "one fixed channel width of the BatchNorm reduction blocks"},
      {"LIBREYOLO_BN_ROWS_PER_THREAD", "one fixed row count per thread of the BatchNorm reductions"},
      // Other libraries' settings the product reads (and cannot change for itself).
      {"OMP_WAIT_POLICY", "OpenMP's waiting threads: PASSIVE sleeps (what CPU trainings side by side want); unset: they spin, and a CPU training beside another says so"},
      // Set by the product for its own worker processes.
      {"LIBREYOLO_DDP_WORKER", "internal: marks a spawned data-parallel worker"},
      {"LIBREYOLO_DDP_WEIGHTS", "internal: the weights a spawned worker starts from"},
      {"LIBREYOLO_DDP_RESULT", "internal: where a spawned worker writes its result"},
  };
  return all;
}

const char* env_get(const char* name) {
  for (const EnvVar& v : env_vars())
    if (std::strcmp(v.name, name) == 0) return std::getenv(name);
  throw std::logic_error(std::string("environment variable ") + name + " is read but not listed in env_vars()");
}

bool env_switch_on(const char* name) {
  const char* v = env_get(name);
  return !(v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "false") == 0 || std::strcmp(v, "off") == 0));
}

int env_int(const char* name, int lo, int hi, int fallback) {
  const char* v = env_get(name);
  const int n = v ? std::atoi(v) : 0;
  return v && n >= lo && n <= hi ? n : fallback;
}

bool EnvFlag::first_load() const {
  int unset = -1;
  state_.compare_exchange_strong(unset, env_switch_on(name_) ? 1 : 0);  // a store() in between wins
  return state_.load() != 0;
}

}  // namespace libreyolo
