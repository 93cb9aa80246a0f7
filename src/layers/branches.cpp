#include "layers/branches.hpp"

#include "core/env.hpp"

#ifdef LIBREYOLO_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "layers/event_pool.hpp"
#endif

namespace libreyolo::models::common {
namespace {

bool switched_on() {
  static const bool on = env_switch_on("LIBREYOLO_INFER_STREAMS");
  return on;
}

#ifdef LIBREYOLO_CUDA
constexpr int kSideStreams = 4;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("Branches: ") + what + ": " + cudaGetErrorString(e));
}

// This thread's side streams on each device and its spare events.
struct ThreadStreams {
  struct Device {
    int index = -1;
    cudaStream_t streams[kSideStreams] = {};
  };
  std::vector<Device> devices;
  EventPool events{"Branches"};
  ~ThreadStreams() {
    for (auto& d : devices)
      for (auto s : d.streams)
        if (s) cudaStreamDestroy(s);
  }
  cudaStream_t stream(int device, int i) {
    for (auto& d : devices)
      if (d.index == device) return d.streams[i];
    Device d;
    d.index = device;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    for (auto& s : d.streams) check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    devices.push_back(d);
    return devices.back().streams[i];
  }
};

ThreadStreams& mine() {
  thread_local ThreadStreams t;
  return t;
}
#endif

}  // namespace

Branches::Branches(const torch::Tensor& x) {
#ifdef LIBREYOLO_CUDA
  if (switched_on() && x.defined() && x.is_cuda() && !torch::GradMode::is_enabled()) device_ = x.device().index();
#else
  (void)x;
#endif
}

void Branches::side(const std::function<void()>& work) {
#ifdef LIBREYOLO_CUDA
  if (device_ < 0) return work();
  ThreadStreams& t = mine();
  const auto current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_));
  const cudaStream_t s = t.stream(device_, next_);
  next_ = (next_ + 1) % kSideStreams;
  cudaEvent_t fork = t.events.take();
  check(cudaEventRecord(fork, current.stream()), "record");
  check(cudaStreamWaitEvent(s, fork, 0), "wait");
  t.events.give(fork);  // reusable: the wait took the event's state at the call
  {
    c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(s, static_cast<c10::DeviceIndex>(device_)));
    work();
  }
  cudaEvent_t join = t.events.take();
  check(cudaEventRecord(join, s), "record");
  joins_.push_back(join);
#else
  work();
#endif
}

Branches::~Branches() {
#ifdef LIBREYOLO_CUDA
  if (joins_.empty()) return;
  ThreadStreams& t = mine();
  const auto current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_));
  for (void* j : joins_) {
    cudaStreamWaitEvent(current.stream(), static_cast<cudaEvent_t>(j), 0);
    t.events.give(static_cast<cudaEvent_t>(j));
  }
#endif
}

}  // namespace libreyolo::models::common
