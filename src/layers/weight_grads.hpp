// Deferred convolution-weight gradients of the fused training nodes (the DeferredWeightGrads
// scope) and, in captured steps, the side stream they are computed on. The wgrad namespace is
// internal to layers/: conv_bn_act.cpp's backward is its one user.
#pragma once
#include <ATen/ATen.h>

#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "layers/event_pool.hpp"
#endif

#include "core/env.hpp"

namespace libreyolo::models {

// While one of these is alive (on the thread that runs backward and waits for it), the node's
// backward does not hand its convolution-weight gradient to autograd (which would cast it to
// float32 and accumulate it, one operator each per block) but collects it; flush(), called after
// backward returns, adds all of them into the existing .grad tensors with one multi-tensor add
// (the optimizer zeroes gradients in place, so after the first backward they always exist and
// keep their storage); only a gradient that does not exist yet is created. Without flush()
// (backward threw) they are dropped.
class DeferredWeightGrads {
 public:
  DeferredWeightGrads();
  ~DeferredWeightGrads();
  DeferredWeightGrads(const DeferredWeightGrads&) = delete;
  DeferredWeightGrads& operator=(const DeferredWeightGrads&) = delete;
  void flush();

 private:
  bool flushed_ = false;
};

// Deferred weight gradients on CUDA run on a side stream of the backward (default on;
// LIBREYOLO_WGRAD_STREAM=0 turns it off: everything on the backward's stream, the same bits).
// wgrad_side_tasks() counts the weight gradients queued there so far (tests, benchmarks).
void set_wgrad_stream(bool on);
int64_t wgrad_side_tasks();

namespace wgrad {

// While a DeferredWeightGrads scope is open, records `grad` as `param`'s weight gradient, written
// at the scope's flush, and returns true; otherwise returns false (autograd accumulates it).
bool defer(const at::Tensor& param, const at::Tensor& grad);
// Counts one weight gradient queued on the side stream (wgrad_side_tasks()).
void count_task();

#ifdef LIBREYOLO_CUDA_KERNELS
// ---------------------------------------------------------------- weight gradients on a side stream
// A node's convolution-weight gradient is off the backward's critical path: only its input
// gradient feeds the next node, and while weight gradients are deferred nothing reads them
// before the flush. So the lane queues them on a side stream forked off the backward's stream,
// where they overlap the following nodes' BatchNorm and input-gradient kernels (at the batch
// sizes trained here most of those are too small to fill the GPU). Captured in a CUDA graph this
// is a parallel branch. Stream order is kept by events only:
//  - fork(): an event on the backward's stream after the node's dz; the side work waits for it;
//  - what the side work reads (dz, the saved input) was allocated on the backward's stream, so
//    the lane holds it until that stream has waited for the side work (at most lag() nodes later,
//    or at join()), and only then lets it go: its memory is reused after the read in both orders;
//  - what the side work allocates (the gradient, cuDNN's workspace) belongs to the side stream,
//    and every side task starts with a fork, so a later reuse there comes after the backward
//    stream's reads of it;
//  - join() (the flush, before anything reads the gradients) makes the backward's stream wait
//    for all of it.
// The same kernels with the same operands as on one stream: the same bits. Used in captured steps
// (lane_for below). One training per device at a time (as the BatchNorm scratch).
// LIBREYOLO_WGRAD_STREAM=0 keeps everything on the backward's stream.
class Lane {
 public:
  struct Fork {
    cudaEvent_t event = nullptr;
  };

  // Creates the side stream on `device` (and a few events) unless done; not during a capture.
  void open(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (side_ && device == device_) return;
    TORCH_CHECK(pending_.empty(), "weight-gradient stream: device changed with work in flight");
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    side_ = s;  // the previous device's stream, if any, is left to the process's end
    device_ = device;
    events_.reserve(static_cast<size_t>(lag()) + 2);  // what one capture uses at most
  }

  Fork fork(cudaStream_t main) {
    std::lock_guard<std::mutex> lock(mutex_);
    Fork f{events_.take()};
    check(cudaEventRecord(f.event, main), "record");
    return f;
  }

  // Runs `work` on the side stream after the fork; `hold` lives until `main` has waited for it.
  void run(const Fork& f, cudaStream_t main, std::vector<at::Tensor> hold, const std::function<void()>& work) {
    std::lock_guard<std::mutex> lock(mutex_);
    check(cudaStreamWaitEvent(side_, f.event, 0), "wait");
    events_.give(f.event);  // the wait took the event's state: reusable
    {
      c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(side_, static_cast<c10::DeviceIndex>(device_)));
      work();
    }
    count_task();
    Pending p{events_.take(), std::move(hold)};
    check(cudaEventRecord(p.done, side_), "record");
    pending_.push_back(std::move(p));
    while (static_cast<int>(pending_.size()) > lag()) retire(main);
  }

  // The calling thread's current stream of the lane's device waits for everything queued on the
  // side stream; what was held is released.
  void join() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_.empty()) return;
    const cudaStream_t main = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
    while (!pending_.empty()) retire(main);
  }

 private:
  // Side tasks in flight before the backward's stream waits for the oldest: each holds its dz
  // and input a little longer. LIBREYOLO_WGRAD_LAG=n (1..64) sets it, for measurements.
  static int lag() {
    static const int n = env_int("LIBREYOLO_WGRAD_LAG", 1, 64, 4);
    return n;
  }
  struct Pending {
    cudaEvent_t done;
    std::vector<at::Tensor> hold;
  };

  static void check(cudaError_t e, const char* what) {
    TORCH_CHECK(e == cudaSuccess, "weight-gradient stream: ", what, ": ", cudaGetErrorString(e));
  }

  void retire(cudaStream_t main) {
    Pending& p = pending_.front();
    const cudaError_t e = cudaStreamWaitEvent(main, p.done, 0);
    events_.give(p.done);
    pending_.pop_front();  // after the wait: the held tensors' memory is free in stream order
    check(e, "wait");
  }

  std::mutex mutex_;
  int device_ = -1;
  cudaStream_t side_ = nullptr;
  std::deque<Pending> pending_;
  common::EventPool events_{"weight-gradient stream"};
};


// The lane for a node's weight gradient (dz its output gradient, `main` the backward's stream):
// while gradients are deferred, on CUDA, switched on, and only in a step being captured; else
// null (the gradient is computed on the backward's stream).
Lane* lane_for(const at::Tensor& dz, cudaStream_t main);
#endif

}  // namespace wgrad
}  // namespace libreyolo::models
