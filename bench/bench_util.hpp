// Helpers shared by the benchmark programs: comma-separated option lists, and the GPU time of a
// body of work replayed from a CUDA graph (no host launch cost, as in a captured step).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#ifdef LIBREYOLO_CUDA_KERNELS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

namespace libreyolo::bench {

// "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

inline std::vector<int64_t> split_ints(const std::string& s) {
  std::vector<int64_t> out;
  for (const auto& t : split(s)) out.push_back(std::stoll(t));
  return out;
}

#ifdef LIBREYOLO_CUDA_KERNELS
// Microseconds per call of `body`, from the fastest of `reps` replays of a graph of `launches`
// calls; `warm` calls run first outside the capture (first-use work: module loading, cuDNN's
// autotuning).
inline double graph_time_us(const std::function<void()>& body, int launches, int reps, int warm = 1) {
  auto stream = c10::cuda::getStreamFromPool();
  c10::cuda::CUDAStreamGuard guard(stream);
  for (int i = 0; i < warm; ++i) body();
  stream.synchronize();
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  for (int i = 0; i < launches; ++i) body();
  graph.capture_end();
  graph.replay();
  stream.synchronize();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  float best = 1e30f;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a, stream.stream());
    graph.replay();
    cudaEventRecord(b, stream.stream());
    cudaEventSynchronize(b);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, a, b);
    best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1000.0 * best / launches;
}
#endif

}  // namespace libreyolo::bench
