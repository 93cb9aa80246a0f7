#include "layers/weight_grads.hpp"

#include <atomic>
#include <unordered_map>

namespace libreyolo::models {
namespace wgrad {
namespace {

EnvFlag wgrad_stream_flag{"LIBREYOLO_WGRAD_STREAM"};

std::atomic<int64_t> wgrad_task_count{0};  // side tasks run, for tests

struct Deferred {
  std::mutex mutex;
  int depth = 0;
  std::vector<at::Tensor> params, grads;
#ifdef LIBREYOLO_CUDA_KERNELS
  Lane lane;
#endif
};

Deferred& deferred() {
  static Deferred* d = new Deferred();  // never destroyed: holds CUDA tensors
  return *d;
}

bool deferring() {
  Deferred& d = deferred();
  std::lock_guard<std::mutex> lock(d.mutex);
  return d.depth > 0;
}

}  // namespace

void count_task() { ++wgrad_task_count; }

#ifdef LIBREYOLO_CUDA_KERNELS
// Only in a step being captured: an eager step is host-bound at the batch sizes trained here, so
// the overlap would buy nothing there, and the side stream's own memory pool would add to the
// reserved memory (H200, v9-t batch 32: +0.44 GB; inside a graph's private pool +0.08 GB). Eager
// steps open the lane (its stream and events), so that a capture creates nothing.
Lane* lane_for(const at::Tensor& dz, cudaStream_t main) {
  if (!wgrad_stream_flag.load() || !dz.is_cuda() || !deferring()) return nullptr;
  Lane& lane = deferred().lane;
  lane.open(dz.device().index());
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(main, &status) != cudaSuccess) return nullptr;
  return status == cudaStreamCaptureStatusActive ? &lane : nullptr;
}
#endif

bool defer(const at::Tensor& param, const at::Tensor& grad) {
  Deferred& d = deferred();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (d.depth == 0) return false;
  d.params.push_back(param);
  // Same strides as the parameter, so that the multi-tensor copy takes its fast path (a 1x1
  // GEMM gradient differs from a channels_last weight only in the strides of size-1 dims).
  d.grads.push_back(grad.strides() == param.strides() || grad.sizes() != param.sizes()
                        ? grad
                        : grad.as_strided(param.sizes(), param.strides()));
  return true;
}

}  // namespace wgrad

using wgrad::Deferred;
using wgrad::deferred;

DeferredWeightGrads::DeferredWeightGrads() {
  Deferred& d = deferred();
  std::lock_guard<std::mutex> lock(d.mutex);
  ++d.depth;
}

DeferredWeightGrads::~DeferredWeightGrads() {
  if (!flushed_) {  // backward failed: drop what was collected
    Deferred& d = deferred();
    bool last = false;
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      if (--d.depth == 0) d.params.clear(), d.grads.clear(), last = true;
    }
#ifdef LIBREYOLO_CUDA_KERNELS
    if (last) {
      try {
        d.lane.join();  // nothing may stay queued against memory that is about to be reused
      } catch (const std::exception&) {  // a failed CUDA context: nothing is queued any more
      }
    }
#else
    (void)last;
#endif
  }
}

namespace {

// Adds grads[i] into params[i].grad for i in `which` (each parameter at most once).
// Existing gradients (every step after the first: the optimizer zeroes them in place; and
// accumulation over micro-batches): one multi-tensor add into them. Fresh gradients (the first
// backward): take the tensor itself when it already has the parameter's dtype and strides (as
// AccumulateGrad would), else convert all of them with one multi-tensor copy.
void accumulate(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, const std::vector<size_t>& which) {
  std::vector<at::Tensor> copy_dst, copy_src, add_dst, add_src;
  for (size_t i : which) {
    at::Tensor& g = params[i].mutable_grad();
    if (g.defined()) {
      add_dst.push_back(g);
      add_src.push_back(grads[i]);
    } else if (grads[i].scalar_type() == params[i].scalar_type() && grads[i].strides() == params[i].strides()) {
      g = grads[i];
    } else {
      g = at::empty_like(params[i]);
      copy_dst.push_back(g);
      copy_src.push_back(grads[i]);
    }
  }
  if (!copy_dst.empty()) at::_foreach_copy_(copy_dst, copy_src);
  if (!add_dst.empty()) {
    // Sources in the autocast dtype: converted with one multi-tensor copy, then one add.
    std::vector<at::Tensor> cast_dst, cast_src;
    for (size_t i = 0; i < add_src.size(); ++i) {
      if (add_src[i].scalar_type() == add_dst[i].scalar_type()) continue;
      cast_dst.push_back(at::empty_like(add_dst[i]));
      cast_src.push_back(add_src[i]);
      add_src[i] = cast_dst.back();
    }
    if (!cast_dst.empty()) at::_foreach_copy_(cast_dst, cast_src);
    at::_foreach_add_(add_dst, add_src);
  }
}

}  // namespace

void DeferredWeightGrads::flush() {
  if (flushed_) return;
  flushed_ = true;
  std::vector<at::Tensor> params, grads;
  {
    Deferred& d = deferred();
    std::lock_guard<std::mutex> lock(d.mutex);
    if (--d.depth > 0) return;  // an outer scope flushes
    params.swap(d.params);
    grads.swap(d.grads);
  }
#ifdef LIBREYOLO_CUDA_KERNELS
  deferred().lane.join();  // the gradients computed on the side stream, before anything reads them
#endif
  torch::NoGradGuard ng;
  // A parameter used more than once in the forward (a convolution shared by several levels) has a
  // gradient from each use. A multi-tensor op must not write one tensor twice (its blocks would
  // race: on CUDA some of the contributions would be lost), so the gradients go in rounds, the
  // k-th round taking each parameter's k-th gradient, in the order the backward produced them.
  std::vector<std::vector<size_t>> rounds;
  {
    std::unordered_map<const c10::TensorImpl*, size_t> uses;
    for (size_t i = 0; i < params.size(); ++i) {
      const size_t k = uses[params[i].unsafeGetTensorImpl()]++;
      if (rounds.size() <= k) rounds.emplace_back();
      rounds[k].push_back(i);
    }
  }
  for (const auto& round : rounds) accumulate(params, grads, round);
}

void set_wgrad_stream(bool on) { wgrad::wgrad_stream_flag.store(on); }
int64_t wgrad_side_tasks() { return wgrad::wgrad_task_count.load(); }

}  // namespace libreyolo::models
