// Timing-free CUDA events for forking work onto side streams and joining it back, reused: an event
// may be given back once a stream wait has taken its state. Not thread-safe (each user holds its
// own pool, per thread or under its own lock).
// Include only in CUDA builds.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace libreyolo::models::common {

class EventPool {
 public:
  explicit EventPool(const char* owner) : owner_(owner) {}
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    for (auto e : spare_) cudaEventDestroy(e);
  }

  cudaEvent_t take() {
    if (spare_.empty()) return create();
    cudaEvent_t e = spare_.back();
    spare_.pop_back();
    return e;
  }
  void give(cudaEvent_t e) { spare_.push_back(e); }
  // Creates events until n are spare (before a capture, which must not create any).
  void reserve(size_t n) {
    while (spare_.size() < n) spare_.push_back(create());
  }

 private:
  cudaEvent_t create() {
    cudaEvent_t e = nullptr;
    const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err != cudaSuccess) throw std::runtime_error(std::string(owner_) + ": event: " + cudaGetErrorString(err));
    return e;
  }

  const char* owner_;
  std::vector<cudaEvent_t> spare_;
};

}  // namespace libreyolo::models::common
