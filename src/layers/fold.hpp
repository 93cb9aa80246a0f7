// BatchNorm folded into the convolution for inference: in eval mode a Conv2d(bias=false)
// + BatchNorm2d pair is one convolution with weight w * s and bias beta - mean * s, where
// s = gamma / sqrt(running_var + eps) per output channel; a sum of such pairs with one input
// (a RepConvN: 3x3 + 1x1) is one convolution too, the smaller kernels zero-padded to the
// largest. The eval forward is then the convolution and one bias(+SiLU) epilogue
// (layers/conv_bn_act.hpp: conv_bias_act) instead of convolution, BatchNorm and SiLU.
//
// The folded tensors are computed in float64 from the live parameters, cached per (compute dtype,
// memory format) on the module, and recomputed when their sources may have changed:
//  - a source tensor's version counter moved (in-place writes: load_state_dict, optimizer steps,
//    EMA updates, an edit under NoGradGuard), or its TensorImpl or data pointer changed (set_data:
//    moving device or dtype, channels_last conversion);
//  - the module's mode was switched by train() or it ran a training forward (running statistics are written
//    by the fused training kernels through raw pointers, which bump no version);
//  - note_weights_changed() was called: writes no version counter sees (a replayed CUDA graph of a
//    training step or EMA update) must call it; the training step runner does once per update.
// A recomputation writes into the existing tensors (same storage), so a CUDA graph that captured
// the folded forward stays valid; FoldedLayers::refresh() does it for a whole network before a
// replay. Only when the shapes or the device changed are the tensors reallocated.
//
// Applies when the block's BatchNorm is in eval mode and no autograd graph would be recorded (grad
// mode off, or nothing involved requires grad); otherwise the unfolded ops run.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace libreyolo::models::common {

// Process-wide switch (default on; LIBREYOLO_FOLD_BN=0 in the environment turns it off).
void set_fold_bn(bool on);
bool fold_bn();
// Marks every fold stale (see above).
void note_weights_changed();
// Folds computed so far in this process (each one a float64 pass over a layer's sources): for
// tests and diagnostics.
uint64_t fold_computations();

// A batch norm that is not a BatchNorm2d module (e.g. a frozen one whose statistics and affine
// parameters are buffers), seen as its tensors: scale = weight / sqrt(running_var + eps).
struct NormTensors {
  const torch::Tensor* weight = nullptr;  // undefined or null: 1
  const torch::Tensor* bias = nullptr;    // undefined or null: 0
  const torch::Tensor* running_mean = nullptr;
  const torch::Tensor* running_var = nullptr;
  double eps = 1e-5;
};

// What a FoldSource's `epoch` points at for a block whose fold follows its BatchNorm's running
// statistics: it moves when the block's mode switches and when a training forward writes the
// statistics. Not on eval() of a block already in eval mode: every predict() calls eval(), and
// refolding each call cost a float64 pass over every layer (v9-t about 20 ms per predict() on an
// H200; RT-DETR r18 graphed predict 9.4 ms against 4.7 ms unfolded on an H100).
class FoldEpoch {
 public:
  void note_mode(bool was, bool on) {
    if (was != on) ++value_;
  }
  void note_statistics_written() { ++value_; }
  const uint64_t* get() const { return &value_; }

 private:
  uint64_t value_ = 0;
};

// One Conv2d(bias=false) + BatchNorm2d pair (or + the norm `norm` describes), and its owner's
// epoch (its FoldEpoch's value). Neither bn nor norm: a plain convolution (with
// or without its own bias), alone: its weight and bias in the compute dtype, kept the same way.
struct FoldSource {
  const torch::nn::Conv2dImpl* conv = nullptr;
  const torch::nn::BatchNorm2dImpl* bn = nullptr;
  const uint64_t* epoch = nullptr;
  const NormTensors* norm = nullptr;  // used when bn is null
};

// The compute dtype of an inference forward of x (autocast's where it is on for x's device and x
// is a float type it casts) and the memory format the convolution would produce (channels_last
// when x or the weight is).
at::ScalarType fold_compute_dtype(const torch::Tensor& x);
at::MemoryFormat fold_memory_format(const torch::Tensor& x, const torch::Tensor& weight);
// Whether a block may fold for input x: the switch on, and nothing would be recorded for autograd.
bool fold_allowed(const torch::Tensor& x, c10::ArrayRef<FoldSource> sources);

class FoldedConv {
 public:
  struct Weights {
    torch::Tensor weight, bias;  // the compute dtype; weight in the memory format asked for
    torch::Tensor bias32;        // float32
  };
  // The folded tensors of the sum of `sources` (same output channels, stride and groups) for this
  // compute dtype and memory format; built, or brought up to date, first. dense_groups = g > 1:
  // the weight of a g-group convolution as the equal dense (block-diagonal) one, for a
  // convolution path that takes one group only (layers/conv_bn_act.hpp fused_dense_groups).
  const Weights& get(c10::ArrayRef<FoldSource> sources, at::ScalarType dtype, at::MemoryFormat fmt,
                     int64_t dense_groups = 0);
  // Brings the existing tensors up to date in place when stale. False when some had to be dropped
  // (shapes or device changed): anything that captured them is invalid.
  bool refresh(c10::ArrayRef<FoldSource> sources);
  bool empty() const { return entries_.empty(); }
  void clear();

 private:
  struct Entry {
    at::ScalarType dtype;
    at::MemoryFormat fmt;
    int64_t dense_groups;
    Weights t;
  };
  // The sources' state (see the top of this file) into `out`.
  static void stamp_of(c10::ArrayRef<FoldSource> sources, std::vector<uint64_t>& out);
  std::vector<Entry> entries_;
  std::vector<uint64_t> stamp_, scratch_;
};

// A module that holds folds: refreshed in place before a captured forward replays.
class Foldable {
 public:
  virtual ~Foldable() = default;
  // FoldedConv::refresh() of every fold it holds.
  virtual bool refresh_folds() = 0;
};

// The Foldable modules of one network, found once.
class FoldedLayers {
 public:
  // Refreshes every fold of `root` (see FoldedConv::refresh); false when one was reallocated.
  bool refresh(torch::nn::Module& root);

 private:
  const torch::nn::Module* root_ = nullptr;
  std::vector<std::shared_ptr<torch::nn::Module>> modules_;
  std::vector<Foldable*> layers_;
};

}  // namespace libreyolo::models::common
