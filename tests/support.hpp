// Shared helpers for the test programs.
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "io/state_dict.hpp"

namespace libreyolo::test {

// Directory with the reference parity fixtures (env LIBREYOLO_FIXTURES), if present.
std::optional<std::string> fixtures_dir();
// A fresh temporary directory, removed at process exit.
std::string temp_dir(const std::string& tag);
// Python with torch (for interop tests), if it works.
std::optional<std::string> python_with_torch();
bool cuda_available();
// Max |a-b| / max(|b|, tiny).
double rel_err(const torch::Tensor& a, const torch::Tensor& b);
// Asserts equal shapes and rel_err(got, want) <= bound, and prints the error under `what`. The
// default bound is that of a float32 network's outputs against the reference's float64 values.
constexpr double kParityBound = 1e-4;
void check_rel(const std::string& what, const torch::Tensor& got, const torch::Tensor& want,
               double bound = kParityBound);

// One detection of a postprocessed result, and a result's rows ([N, 4] boxes, [N] scores, [N] classes).
struct Detection {
  float x1, y1, x2, y2, score;
  int64_t cls;
};
std::vector<Detection> detections(const torch::Tensor& boxes, const torch::Tensor& scores, const torch::Tensor& classes);
// The two lists hold the same detections, in any order: each of `got` pairs with a distinct one of
// `want` of its class, its score within score_tol and its box within box_tol pixels. Returns the
// largest box difference.
double expect_same_detections(const std::vector<Detection>& got, const std::vector<Detection>& want,
                              const std::string& what, double score_tol = 1e-4, double box_tol = 1e-2);

// Runs a shell command, returns exit status; captures combined output.
int run_command(const std::string& cmd, std::string* output = nullptr);

// cuDNN settings for the length of a scope (process-global: restored on exit, also when an
// assertion returns early). Comparisons of two computations want benchmark off (the same
// heuristic algorithms both times), deterministic algorithms, and no TF32.
struct CudnnSettings {
  CudnnSettings(bool benchmark, bool deterministic, bool allow_tf32);
  ~CudnnSettings();
  CudnnSettings(const CudnnSettings&) = delete;
  CudnnSettings& operator=(const CudnnSettings&) = delete;

 private:
  bool benchmark_, deterministic_, tf32_;
};

// A reference state dict's listing in tests/data/<file_name>: lines "key<TAB>[d0, d1, ...]<TAB>dtype",
// '#' starting a comment line.
struct TsvEntry {
  std::string key;
  std::vector<int64_t> shape;
  std::string dtype;
};
std::vector<TsvEntry> read_state_dict_tsv(const std::string& file_name);
// The same as zero tensors of those shapes (int64, bool or float32).
io::StateDict reference_state_dict_tsv(const std::string& file_name);
// The tensor of `key` in `sd` (throws when absent).
const torch::Tensor& state_dict_entry(const io::StateDict& sd, const std::string& key);

// Plain float32 convolutions and matmuls (no TF32 in cuDNN or cuBLAS) for one scope, for
// float32 comparisons against reference values; the old settings come back after.
struct NoTF32 {
  NoTF32();
  ~NoTF32();
  NoTF32(const NoTF32&) = delete;
  NoTF32& operator=(const NoTF32&) = delete;

 private:
  bool cudnn_, cublas_;
};

// Sets an environment variable for one scope (the old value, or its absence, comes back after).
struct ScopedEnv {
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace libreyolo::test

#define LY_REQUIRE_FIXTURES(var)                                                           \
  auto var##_opt = ::libreyolo::test::fixtures_dir();                                      \
  if (!var##_opt) GTEST_SKIP() << "reference fixtures not found (set LIBREYOLO_FIXTURES)"; \
  const std::string var = *var##_opt

// The fixtures folder given in LIBREYOLO_FIXTURES holding `file` (a partial copy of the folder,
// as carried to the GPU machine, serves the tests whose files it holds).
#define LY_REQUIRE_FIXTURE_FILE(var, file)                                                            \
  const char* var##_env = std::getenv("LIBREYOLO_FIXTURES");                                          \
  if (!var##_env || !*var##_env || !std::filesystem::exists(std::filesystem::path(var##_env) / file)) \
    GTEST_SKIP() << "reference fixture " << file << " not found (set LIBREYOLO_FIXTURES)";            \
  const std::string var = var##_env

#define LY_REQUIRE_CUDA() \
  if (!::libreyolo::test::cuda_available()) GTEST_SKIP() << "no CUDA device on this machine"
