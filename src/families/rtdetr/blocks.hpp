// RT-DETR building blocks shared by its backbone, encoder and decoder. Every submodule is
// registered under the name LibreYOLO gives it, so that the recursive parameter/buffer names
// equal its state_dict keys. The Python model's Sequential/ModuleList containers are plain
// modules whose children are registered as "0", "1", ...; typed holders are kept alongside.
#pragma once
#include <torch/torch.h>

#include "layers/fold.hpp"

#include <memory>
#include <string>
#include <vector>

namespace libreyolo::models::rtdetr {

enum class Act { None, ReLU, SiLU };
torch::Tensor activate(const torch::Tensor& x, Act act);

// A module with no parameters of its own: the Python model's ModuleList / Sequential.
std::shared_ptr<torch::nn::Module> container();

// BatchNorm2d whose statistics and affine parameters are buffers (never trained):
// y = x * w / sqrt(rv + eps) + (b - rm * w / sqrt(rv + eps)). No num_batches_tracked.
class FrozenBatchNorm2dImpl : public torch::nn::Module {
 public:
  explicit FrozenBatchNorm2dImpl(int64_t c, double eps = 1e-5);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight, bias, running_mean, running_var;
  double eps;
};
TORCH_MODULE(FrozenBatchNorm2d);

// A convolution (bias=false) and its norm (a BatchNorm2d, or a FrozenBatchNorm2d) folded into one
// convolution for inference (layers/fold.hpp): in eval mode with nothing recorded for autograd,
// act(conv(x, w * s) + (b - mean * s)) through layers/conv_bn_act.hpp's conv_bias_act (on CUDA the
// bias and a SiLU as the convolution's epilogue, cuDNN's fused plans where they apply) instead of
// the convolution, the norm's pass and the activation's. The owner calls note_mode() from train(),
// refresh() from refresh_folds().
class NormFold {
 public:
  // act(norm(conv(x))) of the owner's layers: folded where folding applies, else the convolution,
  // the norm (`bn`, or `frozen` when bn is empty) and the activation one after the other.
  // `training`: the owner's mode; a frozen block (frozen norm, nothing recorded for autograd)
  // folds in training too, other training forwards write the running statistics, which retires
  // the fold.
  torch::Tensor forward(const torch::Tensor& x, const torch::nn::Conv2d& conv, const torch::nn::BatchNorm2d& bn,
                        const FrozenBatchNorm2d& frozen, Act act, bool training);
  bool refresh(const torch::nn::Conv2d& conv, const torch::nn::BatchNorm2d& bn, const FrozenBatchNorm2d& frozen);
  // The owner's train(on) while it was in mode `was` (common::FoldEpoch: only a switch retires the fold).
  void note_mode(bool was, bool on) { epoch_.note_mode(was, on); }
  // A training forward ran unfolded and wrote the running statistics.
  void note_statistics_written() { epoch_.note_statistics_written(); }
  bool has_fold() const { return !fold_.empty(); }  // a folded forward ran

 private:
  torch::Tensor folded(const torch::Tensor& x, const torch::nn::Conv2d& conv, const torch::nn::BatchNorm2d& bn,
                       const FrozenBatchNorm2d& frozen, Act act);
  common::FoldSource source(const torch::nn::Conv2d& conv, const torch::nn::BatchNorm2d& bn,
                            const FrozenBatchNorm2d& frozen);
  common::FoldedConv fold_;
  common::NormTensors frozen_;
  common::FoldEpoch epoch_;
};

// Conv2d(bias=false, padding (k-1)/2, `groups`) + BatchNorm2d (eps 1e-5, momentum 0.1) +
// activation: children "conv" and "norm" (a FrozenBatchNorm2d when `frozen`). Folded for
// inference (NormFold).
class ConvNormImpl : public torch::nn::Module, public common::Foldable {
 public:
  ConvNormImpl(int64_t cin, int64_t cout, int64_t k, int64_t s, Act act, bool frozen = false, int64_t groups = 1);
  torch::Tensor forward(const torch::Tensor& x);
  void train(bool on = true) override;
  bool refresh_folds() override { return fold_.refresh(conv, norm, frozen_norm); }
  bool has_fold() const { return fold_.has_fold(); }

  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d norm{nullptr};
  FrozenBatchNorm2d frozen_norm{nullptr};
  Act act;

 private:
  NormFold fold_;
};
TORCH_MODULE(ConvNorm);

// Linear layers "layers.0" .. "layers.{n-1}" with ReLU between them (none after the last).
class MlpImpl : public torch::nn::Module {
 public:
  // Between the layers ReLU, or SiLU with `silu`.
  MlpImpl(int64_t in, int64_t hidden, int64_t out, int layers, bool silu = false);
  torch::Tensor forward(const torch::Tensor& x);

  std::vector<torch::nn::Linear> layers;
  bool silu = false;
};
TORCH_MODULE(Mlp);

// nn.MultiheadAttention(batch_first=True, bias=True, dropout 0) with PyTorch's parameter names:
// in_proj_weight [3C, C] (query, key, value rows), in_proj_bias [3C], out_proj.{weight,bias}.
// Inputs [B, L, C]; `mask` (optional) is bool [Lq, Lk] with true = blocked.
class MultiheadAttentionImpl : public torch::nn::Module {
 public:
  MultiheadAttentionImpl(int64_t embed, int64_t heads);
  torch::Tensor forward(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                        const torch::Tensor& mask = {});
  // PyTorch's initialisation: xavier-uniform in_proj_weight, zero biases.
  void reset_parameters();

  torch::Tensor in_proj_weight, in_proj_bias;
  torch::nn::Linear out_proj{nullptr};
  int64_t embed, heads;
};
TORCH_MODULE(MultiheadAttention);

// x clipped to [0, 1], then log(max(x, eps) / max(1 - x, eps)).
torch::Tensor inverse_sigmoid(const torch::Tensor& x, double eps = 1e-5);

// The prior-probability bias -log((1 - p) / p).
double bias_with_prior(double p);

}  // namespace libreyolo::models::rtdetr
