// The one collective the model and loss code needs under data parallelism: an element-wise sum
// across the processes. The seams that take it (SyncBN statistics in layers/conv_bn_act.hpp,
// loss normalisers in loss/normalizer.hpp) only see this interface; dist/ implements it on the
// process group. Nothing is installed in one process.
#pragma once
#include <torch/torch.h>

namespace libreyolo {

class CrossProcessSum {
 public:
  virtual ~CrossProcessSum() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Replaces `t` (any floating dtype, on this process's device) in place by its element-wise
  // sum over all processes.
  virtual void all_reduce_sum(torch::Tensor& t) = 0;
};

}  // namespace libreyolo
