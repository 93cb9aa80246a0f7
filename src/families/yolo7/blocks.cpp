#include "families/yolo7/blocks.hpp"

#include <cmath>
#include <string>

#include "core/log.hpp"
#include "layers/conv_bn_act.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::models::yolo7 {

namespace {

// A plain container module (a Sequential or ModuleList of the reference): children "0", "1", ...
std::shared_ptr<torch::nn::Module> container() { return std::make_shared<torch::nn::Module>(); }

torch::nn::Conv2d head_conv_for(int64_t cin, int nc) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(cin, kAnchorsPerCell * (5 + nc), 1).bias(true));
}

}  // namespace

// ------------------------------------------------------------------------------------- SPPCSP

SPPCSPConvImpl::SPPCSPConvImpl(int64_t cin, int64_t cout) {
  const int64_t hidden = cout;  // int(2 * cout * 0.5)
  auto pre_c = container();
  pre[0] = pre_c->register_module("0", Conv(cin, hidden, 1));
  pre[1] = pre_c->register_module("1", Conv(hidden, hidden, 3));
  pre[2] = pre_c->register_module("2", Conv(hidden, hidden, 1));
  register_module("pre_conv", pre_c);
  short_conv = register_module("short_conv", Conv(cin, hidden, 1));
  auto post_c = container();
  post[0] = post_c->register_module("0", Conv(4 * hidden, hidden, 1));
  post[1] = post_c->register_module("1", Conv(hidden, hidden, 3));
  register_module("post_conv", post_c);
  merge_conv = register_module("merge_conv", Conv(2 * hidden, cout, 1));
}

torch::Tensor SPPCSPConvImpl::forward(const torch::Tensor& x) {
  auto y = pre[2]->forward(pre[1]->forward(pre[0]->forward(x)));
  std::vector<torch::Tensor> parts{y};
  for (int64_t k : {5, 9, 13}) parts.push_back(torch::max_pool2d(parts.back(), {k, k}, {1, 1}, {k / 2, k / 2}));
  auto post_out = post[1]->forward(post[0]->forward(torch::cat(parts, 1)));
  return merge_conv->forward(torch::cat({post_out, short_conv->forward(x)}, 1));
}

// ------------------------------------------------------------------------------------ RepConv

RepConvImpl::RepConvImpl(int64_t cin, int64_t cout) {
  conv1 = register_module("conv1", Conv(cin, cout, 3, 1, 1, /*act=*/false));
  conv2 = register_module("conv2", Conv(cin, cout, 1, 1, 1, /*act=*/false));
}

// silu(conv1(x) + conv2(x)): folded into one convolution for inference; in training one node for
// both branches where the CUDA kernels take it, else the sum and SiLU inside conv2's node.
torch::Tensor RepConvImpl::forward(const torch::Tensor& x) {
  const auto sources = fold_sources();
  if (common::fold_allowed(x, sources)) return common::run_folded(fold_, sources, x, {1, 1, 1, true});
  if (conv1->bn->is_training() && conv2->bn->is_training()) {
    const ConvBnActParams p1 = conv1->training_params(false), p2 = conv2->training_params(false);
    if (repconvn_train_applicable(x, p1, p2)) return repconvn_train(x, p1, p2);
  }
  return conv2->forward_sum_silu(x, conv1->forward(x));
}

// ----------------------------------------------------------------------------------- the head

ImplicitImpl::ImplicitImpl(int64_t channels, double init) {
  implicit = register_parameter("implicit", torch::full({1, channels, 1, 1}, init));
}

IDetectionImpl::IDetectionImpl(int64_t cin_, int nc_) : cin(cin_), nc(nc_) {
  head_conv = register_module("head_conv", head_conv_for(cin, nc));
  implicit_a = register_module("implicit_a", Implicit(cin, 0.0));
  implicit_m = register_module("implicit_m", Implicit(kAnchorsPerCell * (5 + nc), 1.0));
}

torch::Tensor IDetectionImpl::forward(const torch::Tensor& x) {
  return implicit_m->implicit * head_conv->forward(implicit_a->implicit + x);
}

void IDetectionImpl::init_biases(double prior) {
  const double b = -std::log((1.0 - prior) / prior);
  torch::NoGradGuard no_grad;
  head_conv->bias.view({kAnchorsPerCell, 5 + nc}).narrow(1, 4, 1 + nc).fill_(b);
}

void IDetectionImpl::reset_num_classes(int new_nc) {
  if (new_nc < 1) throw UsageError(strfmt("number of classes must be >= 1, got %d", new_nc));
  if (new_nc == nc) return;
  const auto device = head_conv->weight.device();
  const auto dtype = head_conv->weight.scalar_type();
  nc = new_nc;
  auto conv = head_conv_for(cin, nc);
  conv->to(device, dtype);
  head_conv = replace_module("head_conv", conv);
  auto m = Implicit(kAnchorsPerCell * (5 + nc), 1.0);
  m->to(device, dtype);
  implicit_m = replace_module("implicit_m", m);
  init_biases(0.01);
}

MultiheadDetectionImpl::MultiheadDetectionImpl(const std::array<int64_t, 3>& cin, int nc) {
  auto list = container();
  for (int i = 0; i < 3; ++i) heads.push_back(list->register_module(std::to_string(i), IDetection(cin[i], nc)));
  register_module("heads", list);
}

}  // namespace libreyolo::models::yolo7
