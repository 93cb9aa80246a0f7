// The Conv+BN+SiLU block shared by the Conv+BN families, and the per-forward work done once for
// all such layers of a network instead of layer by layer.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <utility>
#include <vector>

#include "layers/fold.hpp"
#include "layers/conv_bn_act.hpp"

namespace libreyolo::models::common {

// The folded inference forward of `sources` (common/fold.hpp) through conv_bias_act: the weights
// in x's compute dtype and memory format, a grouped one as the equal dense weight where cuDNN's
// fused operation then takes it (fused_dense_groups), the result into o.
struct FoldedCall {
  int64_t stride = 1, padding = 0, groups = 1;
  bool act = true;
};
torch::Tensor run_folded(FoldedConv& fold, c10::ArrayRef<FoldSource> sources, const torch::Tensor& x,
                         const FoldedCall& call, const ConvOutput& o = {});

// Conv2d(bias=false) + BatchNorm2d + optional SiLU, registered as "conv" and "bn" (LibreYOLO's
// names in every family). In training with autograd it is one fused node
// (layers/conv_bn_act.hpp). In eval mode without autograd the BatchNorm is folded into the
// convolution (layers/fold.hpp). bn.num_batches_tracked is NOT advanced here:
// BatchedLayerState advances all of them with one kernel per training forward instead of one per layer.
class ConvBnActImpl : public torch::nn::Module, public Foldable {
 public:
  ConvBnActImpl(int64_t c1, int64_t c2, int64_t k = 1, int64_t s = 1, int64_t groups = 1, bool act = true,
                double eps = 1e-3, double momentum = 0.03);
  torch::Tensor forward(const torch::Tensor& x) { return forward(x, {}); }
  // With the result written into o.into and/or o.residual added after the activation
  // (layers/conv_bn_act.hpp ConvOutput): inside the folded block's fused operation where it can,
  // else as an in-place add and a copy.
  torch::Tensor forward(const torch::Tensor& x, const ConvOutput& o);
  // The unfolded forward (convolution, BatchNorm, SiLU), whatever the fold switch says.
  torch::Tensor forward_unfolded(const torch::Tensor& x) { return forward_unfolded(x, nullptr, false, act_); }
  // silu(bn(conv(x)) + addend): the sum of RepConvN's two branches and its SiLU, with this block
  // (whose own activation must be off) as the second branch. In training one fused node (the sum
  // and SiLU inside the BatchNorm kernels' elementwise pass); otherwise composed, or folded
  // elsewhere (RepConvN folds both branches into one convolution).
  torch::Tensor forward_sum_silu(const torch::Tensor& x, const torch::Tensor& addend);
  // This block's parameters for a fused training node (layers/conv_bn_act.hpp) with activation
  // `act`; marks the fold stale (a training forward changes the running statistics).
  ConvBnActParams training_params(bool act);
  void train(bool on = true) override;  // marks the folds stale
  bool refresh_folds() override { return fold_.refresh({fold_source()}); }
  FoldSource fold_source() const { return {conv.get(), bn.get(), fold_epoch_.get()}; }
  // Whether forward(x) takes the folded path; whether a fold has been built.
  bool takes_fold(const torch::Tensor& x) const { return fold_allowed(x, {fold_source()}); }
  bool has_fold() const { return !fold_.empty(); }
  // A copy of conv.weight in the autocast dtype for the next training forward (or nullptr);
  // set and cleared by BatchedLayerState around each forward.
  void set_weight_cast(const torch::Tensor* w) { weight_cast_ = w; }

  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};

 private:
  // act(bn(conv(x)) [+ addend]) [+ addend]: the addend (when given) before the activation or, with
  // after_act, after it (a residual); the fused node in training where it applies.
  torch::Tensor forward_unfolded(const torch::Tensor& x, const torch::Tensor* addend, bool after_act, bool act);
  bool act_;
  bool pointwise_;
  int64_t stride_, padding_, groups_;
  const torch::Tensor* weight_cast_ = nullptr;  // 1x1, stride 1, one group: a plain matrix product on NHWC memory
  FoldEpoch fold_epoch_;
  FoldedConv fold_;
};
TORCH_MODULE(ConvBnAct);

// Training forwards of a network of ConvBnAct/BatchNorm layers, batched across layers:
//  - every BatchNorm's num_batches_tracked advanced by one fused add (as each BatchNorm2d would
//    do for itself; frozen layers in eval mode are skipped);
//  - under autocast with the fused node, every ConvBnAct weight cast to the autocast dtype by
//    one multi-tensor copy into persistent buffers, each block handed its copy for this forward
//    (each block would otherwise cast with its own kernel and host dispatch, ~220 per step).
class BatchedLayerState {
 public:
  explicit BatchedLayerState(torch::nn::Module& root) : root_(root) {}
  // Clears the blocks' casts when a training forward ends, however it ends.
  class Scope {
   public:
    explicit Scope(BatchedLayerState* s) : s_(s) {}
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    BatchedLayerState* s_;
  };
  // Call at the start of a training forward (root in training mode).
  void advance_bn_counters();
  // Forgets the layer lists (gathered on first use): call when the root gains or loses blocks.
  void reset();
  [[nodiscard]] Scope prepare_weight_casts(const torch::Tensor& x);
  // A forward of the root network on x: `body()` runs it, after the counters are advanced (in
  // training) and with the weight casts prepared for its length (in training under grad).
  template <class Body>
  auto run_forward(const torch::Tensor& x, Body&& body) -> decltype(body()) {
    if (!root_.is_training()) return body();
    advance_bn_counters();
    if (!torch::GradMode::is_enabled()) return body();
    auto casts = prepare_weight_casts(x);  // valid for this forward only
    return body();
  }

 private:
  torch::nn::Module& root_;
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, torch::Tensor>> bn_counters_;
  std::vector<ConvBnActImpl*> convs_;
  std::vector<torch::Tensor> cast_src_, cast_dst_;
};

}  // namespace libreyolo::models::common
