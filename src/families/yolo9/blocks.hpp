// YOLOv9 building blocks. Every submodule is registered under
// the name LibreYOLO gives it, so that the recursive parameter/buffer names equal its state_dict
// keys. Sequential/ModuleList containers of the Python model are modules whose children are
// registered as "0", "1", ...; the typed holders are kept alongside so that forward() calls
// them directly instead of going through a type-erased Sequential.
#pragma once
#include <torch/torch.h>

#include <array>
#include <vector>

#include "layers/conv.hpp"

namespace libreyolo::models::yolo9 {

// Conv2d(bias=false) + BatchNorm2d(eps 1e-3, momentum 0.03) + optional SiLU: the shared block.
using ConvImpl = common::ConvBnActImpl;
using Conv = common::ConvBnAct;

// SiLU(Conv3x3(x) + Conv1x1(x)); both branches without activation, no identity branch. Folded
// for inference (common/fold.hpp) into one 3x3 convolution: the 1x1 kernel is its centre tap.
class RepConvNImpl : public torch::nn::Module, public common::Foldable {
 public:
  RepConvNImpl(int64_t c1, int64_t c2);
  torch::Tensor forward(const torch::Tensor& x);
  bool refresh_folds() override { return fold_.refresh(fold_sources()); }
  bool has_fold() const { return !fold_.empty(); }

  Conv conv1{nullptr}, conv2{nullptr};

 private:
  std::array<common::FoldSource, 2> fold_sources() const { return {conv1->fold_source(), conv2->fold_source()}; }
  common::FoldedConv fold_;
};
TORCH_MODULE(RepConvN);

// x + cv2(cv1(x)), always residual (used with equal in/out widths only); the residual is
// cv2's epilogue, the result written into `into` when given (common/concat.hpp).
class RepNBottleneckImpl : public torch::nn::Module {
 public:
  explicit RepNBottleneckImpl(int64_t c);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor* into = nullptr);

  RepConvN cv1{nullptr};
  Conv cv2{nullptr};
};
TORCH_MODULE(RepNBottleneck);

// cv3(cat[m(cv1(x)), cv2(x)]) with n bottlenecks of width c2/2; o: cv3's ConvOutput.
class RepNCSPImpl : public torch::nn::Module {
 public:
  RepNCSPImpl(int64_t c1, int64_t c2, int64_t n);
  torch::Tensor forward(const torch::Tensor& x, const ConvOutput& o = {});

  Conv cv1{nullptr}, cv2{nullptr}, cv3{nullptr};
  std::vector<RepNBottleneck> m;  // registered as the ModuleList "m"
};
TORCH_MODULE(RepNCSP);

// Sequential(RepNCSP(c1, c2, n), Conv(c2, c2, 3)): children "0" and "1".
class CSPStageImpl : public torch::nn::Module {
 public:
  CSPStageImpl(int64_t c1, int64_t c2, int64_t n);
  torch::Tensor forward(const torch::Tensor& x, const ConvOutput& o = {});  // o: conv's

  RepNCSP csp{nullptr};
  Conv conv{nullptr};
};
TORCH_MODULE(CSPStage);

// ELAN(c1, c2=part, c3=part/2, c4=out): the plain first block of t/s.
class ELANImpl : public torch::nn::Module {
 public:
  ELANImpl(int64_t c1, int64_t c2, int64_t c3, int64_t c4);
  torch::Tensor forward(const torch::Tensor& x, const ConvOutput& o = {});  // o: where the result goes

  Conv cv1{nullptr}, cv2{nullptr}, cv3{nullptr}, cv4{nullptr};
};
TORCH_MODULE(ELAN);

// RepNCSPELAN(c1, c2=part, c3=part/2, c4=out, n).
class RepNCSPELANImpl : public torch::nn::Module {
 public:
  RepNCSPELANImpl(int64_t c1, int64_t c2, int64_t c3, int64_t c4, int64_t n);
  torch::Tensor forward(const torch::Tensor& x, const ConvOutput& o = {});  // o: where the result goes

  Conv cv1{nullptr};
  CSPStage cv2{nullptr}, cv3{nullptr};
  Conv cv4{nullptr};
};
TORCH_MODULE(RepNCSPELAN);

// avg_pool(2, s1) then Conv 3x3 s2 (t/s/m downsampling).
class AConvImpl : public torch::nn::Module {
 public:
  AConvImpl(int64_t c1, int64_t c2);
  torch::Tensor forward(const torch::Tensor& x, const ConvOutput& o = {});  // o: where the result goes

  Conv cv{nullptr};
};
TORCH_MODULE(AConv);

// avg_pool(2, s1), split channels: Conv 3x3 s2 on the first half, max_pool(3, s2) + Conv 1x1
// on the second (c downsampling).
class ADownImpl : public torch::nn::Module {
 public:
  ADownImpl(int64_t c1, int64_t c2);
  torch::Tensor forward(const torch::Tensor& x, const ConvOutput& o = {});  // o: where the result goes

  Conv cv1{nullptr}, cv2{nullptr};
};
TORCH_MODULE(ADown);

// cv1, three chained max_pool(5, s1, p2), cv5 over the concatenation of all four.
class SPPELANImpl : public torch::nn::Module {
 public:
  SPPELANImpl(int64_t c1, int64_t c2, int64_t c3);
  torch::Tensor forward(const torch::Tensor& x, const ConvOutput& o = {});  // o: where the result goes

  Conv cv1{nullptr}, cv5{nullptr};
};
TORCH_MODULE(SPPELAN);

}  // namespace libreyolo::models::yolo9
