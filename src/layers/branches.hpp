// Independent parts of an inference forward run concurrently. At batch 1 a YOLO network's
// kernels are far too small to fill the GPU, and queued one after another on one stream each
// waits for the previous: a Branches scope hands parts that do not depend on each other to side
// streams forked off the current one (each waits for everything queued on it so far) and joins
// them back when it ends (the current stream waits for each). A CUDA graph captured over it has
// parallel branches; run eagerly, the streams overlap the same way.
//
// Side work must write its results into tensors allocated before it (e.g. ConvOutput::into a
// slice of a concatenation assembled in place): a tensor it allocates itself belongs to its side
// stream's memory and must not outlive it. The results are the same bits as serial (each branch
// writes its own outputs). Inference only: with autograd recording, on the CPU, or with
// LIBREYOLO_INFER_STREAMS=0, side() runs its work inline. Side streams are per thread and device
// (created on first use), so that another thread's work never lands in this thread's capture.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <vector>

namespace libreyolo::models::common {

class Branches {
 public:
  // Forks off the current stream of x's device when x is a CUDA tensor and nothing records autograd.
  explicit Branches(const torch::Tensor& x);
  ~Branches();  // joins
  Branches(const Branches&) = delete;
  Branches& operator=(const Branches&) = delete;

  // Runs `work` on the next side stream (it first waits for what the current stream has queued
  // by now), or inline when this scope is not concurrent.
  void side(const std::function<void()>& work);

 private:
  int device_ = -1;  // -1: not concurrent
  int next_ = 0;
  std::vector<void*> joins_;  // cudaEvent_t recorded on side streams, waited for at the end
};

}  // namespace libreyolo::models::common
