#include "core/device.hpp"

#include <fstream>
#include "core/env.hpp"

#include <ATen/Context.h>
#include <torch/cuda.h>
#ifdef LIBREYOLO_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#endif

#include <cstdlib>

#include <cctype>

#include <libreyolo/errors.hpp>

#include "core/strings.hpp"

namespace libreyolo {

namespace {
bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 6) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}
}  // namespace

std::vector<int> parse_device_list(const std::string& device) {
  std::string s = lower(trim(device));
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') s = s.substr(1, s.size() - 2);
  if (s.empty() || s == "auto" || s == "cpu" || s == "mps") return {};
  std::vector<int> out;
  if (s.find(',') != std::string::npos) {
    size_t start = 0;
    while (start <= s.size()) {
      size_t end = s.find(',', start);
      std::string part = trim(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
      if (all_digits(part)) out.push_back(std::stoi(part));
      if (end == std::string::npos) break;
      start = end + 1;
    }
    return out;
  }
  if (s.rfind("cuda:", 0) == 0 && all_digits(s.substr(5))) return {std::stoi(s.substr(5))};
  if (all_digits(s)) return {std::stoi(s)};
  return {};
}

bool wants_distributed(const std::string& device) { return parse_device_list(device).size() > 1; }

torch::Device resolve_device(const std::string& device) {
  const std::string s = lower(trim(device));
  if (s.empty() || s == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (s == "cpu") return torch::Device(torch::kCPU);
  if (s == "mps")
    throw UsageError("device=mps is not supported by the C++ library", "Use device=cpu or a CUDA device.",
                     "device_not_available");
  auto list = parse_device_list(s);
  if (list.size() > 1)
    throw UsageError("device=" + device + " names several GPUs; only training can use more than one",
                     "Use a single device here.", "config_conflict");
  int index = 0;
  if (list.size() == 1) {
    index = list[0];
  } else if (s != "cuda") {
    throw UsageError("Invalid device string: '" + device + "'",
                     "Use auto, cpu, cuda, cuda:N or a GPU index.", "config_type_error");
  }
  if (!torch::cuda::is_available())
    throw UsageError("device=" + device + " asks for CUDA, but no CUDA device is available",
                     "Use device=cpu.", "device_not_available");
  if (index >= static_cast<int>(torch::cuda::device_count()))
    throw UsageError("CUDA device " + std::to_string(index) + " does not exist (" +
                         std::to_string(torch::cuda::device_count()) + " available)",
                     "", "device_not_available");
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

void synchronize(const torch::Device& device) {
#ifdef LIBREYOLO_CUDA
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
#else
  (void)device;
#endif
}

namespace {

std::string env_setting(const char* name) {
  const char* v = env_get(name);
  return v ? trim(v) : "";
}

// cuDNN autotuning as the environment overrides it: {on, candidates} and the line saying so ("" when
// LIBREYOLO_CUDNN_BENCHMARK is unset).
struct AutotuneSetting {
  bool on;
  int candidates;
  std::string said;
};

AutotuneSetting autotune_setting(bool on, int candidates) {
  AutotuneSetting a{on, candidates, ""};
  if (const std::string b = env_setting("LIBREYOLO_CUDNN_BENCHMARK"); !b.empty()) {
    if (!all_digits(b))
      throw UsageError("LIBREYOLO_CUDNN_BENCHMARK=" + b + " is not a number",
                       "Use 0 (no autotuning), 1 (autotune) or N > 1 (autotune, N candidates per convolution).",
                       "config_invalid");
    const int n = std::stoi(b);
    a.on = n > 0;
    a.candidates = n > 1 ? n : 10;
    a.said = n == 0   ? "LIBREYOLO_CUDNN_BENCHMARK=0: cuDNN algorithms by heuristics, no autotuning"
             : n == 1 ? "LIBREYOLO_CUDNN_BENCHMARK=1: cuDNN autotuning over ATen's default 10 candidates"
                      : "LIBREYOLO_CUDNN_BENCHMARK=" + b + ": cuDNN autotuning over at most " + b +
                            " candidates per convolution";
  }
  if (env_setting("LIBREYOLO_DETERMINISTIC") == "1") a.on = false;
  return a;
}

}  // namespace

CudnnAutotuneScope::CudnnAutotuneScope(int candidates) {
  auto& ctx = at::globalContext();
  was_on_ = ctx.benchmarkCuDNN();
  was_limit_ = ctx.benchmarkLimitCuDNN();
  const AutotuneSetting a = autotune_setting(true, candidates);
  // Deterministic cuDNN (the context's flag, however set) promises the same bits run to run; an
  // algorithm chosen by a race would not keep it.
  ctx.setBenchmarkCuDNN(a.on && !ctx.deterministicCuDNN());
  ctx.setBenchmarkLimitCuDNN(a.candidates);
}

CudnnAutotuneScope::~CudnnAutotuneScope() {
  auto& ctx = at::globalContext();
  ctx.setBenchmarkCuDNN(was_on_);
  ctx.setBenchmarkLimitCuDNN(was_limit_);
}

std::vector<std::string> configure_cudnn(bool autotune, bool deterministic) {
  auto& ctx = at::globalContext();
  std::vector<std::string> said;
  const auto env = env_setting;
  const AutotuneSetting a = autotune_setting(autotune, kAutotuneCandidates);
  ctx.setBenchmarkCuDNN(a.on);
  ctx.setBenchmarkLimitCuDNN(a.candidates);
  if (!a.said.empty()) said.push_back(a.said);
  if (env("LIBREYOLO_TF32") == "0") {
    ctx.setAllowTF32CuDNN(false);
    ctx.setAllowTF32CuBLAS(false);
    said.push_back("LIBREYOLO_TF32=0: convolutions and matmuls in full fp32 (no TF32)");
  }
  // Autotuning picks by a race, so two processes can take different algorithms, whose rounding
  // differs (two autotuned fp32 runs of 8 steps on an H200: 0.012 relative over the weights).
  const bool by_env = env("LIBREYOLO_DETERMINISTIC") == "1";
  ctx.setDeterministicCuDNN(by_env || deterministic);  // the run's setting, not an earlier run's
  if (by_env || deterministic) {
    ctx.setBenchmarkCuDNN(false);
    said.push_back(std::string(by_env ? "LIBREYOLO_DETERMINISTIC=1" : "deterministic=true") +
                   ": cuDNN deterministic algorithms by heuristics, no autotuning");
  }
  return said;
}

int64_t device_free_bytes(int index) {
#ifdef LIBREYOLO_CUDA
  if (index < 0 || index >= static_cast<int>(torch::cuda::device_count())) return -1;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return static_cast<int64_t>(free);
#else
  (void)index;
  return -1;
#endif
}

int64_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return -1;
}

}  // namespace libreyolo
