// Shared by the CPU and GPU tests of the fused Conv+BN+SiLU node: runs one Conv block in training
// mode with the fused node and with the composed ops (the switch off), from identical weights and
// inputs, and returns every result that must agree.
#pragma once
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "layers/conv_bn_act.hpp"
#include "engine/step.hpp"
#include "families/yolo9/blocks.hpp"
#include "families/yolo9/model.hpp"
#include "support.hpp"

namespace libreyolo::test {

struct ConvRun {
  torch::Tensor y, dx, dw, dgamma, dbeta, running_mean, running_var;
  std::string node;  // name of the output's autograd node (first pass)
};

struct ConvCase {
  int64_t c1 = 8, c2 = 16, k = 3, s = 1;
  int64_t groups = 1;
  bool act = true;
  std::vector<int64_t> input{2, 8, 12, 10};
  bool channels_last = false;
  bool x_requires_grad = true;
  bool freeze_weight = false;
  int backward_passes = 1;  // >1: gradients accumulate over passes (nbs accumulation)
  bool deferred = false;    // backward inside a DeferredWeightGrads scope, as StepRunner does
};

// `wrap` runs the forward (e.g. under autocast); identity when empty.
inline ConvRun run_conv_case(const ConvCase& cc, bool fused, const torch::Device& device,
                             const std::function<torch::Tensor(const std::function<torch::Tensor()>&)>& wrap = {}) {
  const bool was = models::fused_conv_training();
  models::set_fused_conv_training(fused);
  torch::manual_seed(7);
  models::yolo9::Conv conv(cc.c1, cc.c2, cc.k, cc.s, cc.groups, cc.act);
  {
    torch::NoGradGuard ng;  // non-trivial BatchNorm affine parameters and running statistics
    conv->bn->weight.uniform_(0.5, 1.5);
    conv->bn->bias.uniform_(-0.5, 0.5);
    conv->bn->running_mean.uniform_(-0.1, 0.1);
    conv->bn->running_var.uniform_(0.9, 1.1);
  }
  conv->to(device);
  if (cc.channels_last) {
    auto& w = conv->conv->weight;
    w.set_data(w.contiguous(at::MemoryFormat::ChannelsLast));
  }
  conv->train();
  if (cc.freeze_weight) conv->conv->weight.set_requires_grad(false);
  ConvRun r;
  torch::Tensor x;
  for (int pass = 0; pass < cc.backward_passes; ++pass) {
    torch::manual_seed(11 + pass);
    x = (torch::randn(cc.input) * 2 + 0.5).to(device);
    if (cc.channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    x.set_requires_grad(cc.x_requires_grad);
    auto fwd = [&] { return conv->forward(x); };
    auto y = wrap ? wrap(fwd) : fwd();
    // A loss that weights every output differently, so that no gradient term cancels.
    torch::manual_seed(13 + pass);
    auto weights = torch::randn(y.sizes()).to(device);
    {
      std::optional<models::DeferredWeightGrads> scope;
      if (cc.deferred) scope.emplace();
      (y.to(torch::kFloat) * weights).sum().backward();
      if (scope) scope->flush();
    }
    if (pass == 0 && y.grad_fn()) r.node = y.grad_fn()->name();
    if (pass == 0 && cc.x_requires_grad) r.dx = x.grad().clone();
    r.y = y.detach().to(torch::kFloat);
  }
  if (conv->conv->weight.grad().defined()) r.dw = conv->conv->weight.grad().clone();
  r.dgamma = conv->bn->weight.grad().clone();
  r.dbeta = conv->bn->bias.grad().clone();
  r.running_mean = conv->bn->running_mean.clone();
  r.running_var = conv->bn->running_var.clone();
  models::set_fused_conv_training(was);
  return r;
}

// Runs one training forward+backward of a module built by `make` (seeded) with the fused node on
// and off; returns the worst relative error over the output, the input gradient and every
// parameter gradient, and the name of the worst entry.
template <typename MakeFn>
std::pair<double, std::string> compare_module(MakeFn make, std::vector<int64_t> input, const torch::Device& device,
                                              bool channels_last) {
  std::map<std::string, torch::Tensor> got[2];
  const bool was = models::fused_conv_training();
  for (int fused = 0; fused < 2; ++fused) {
    models::set_fused_conv_training(fused == 1);
    torch::manual_seed(21);
    auto m = make();
    m->to(device);
    if (channels_last) engine::to_channels_last(*m);
    m->train();
    torch::manual_seed(22);
    auto x = torch::randn(input).to(device);
    if (channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    x.set_requires_grad(true);
    auto y = m->forward(x);
    torch::manual_seed(23);
    (y * torch::randn(y.sizes()).to(device)).sum().backward();
    got[fused]["output"] = y.detach().cpu();
    got[fused]["input.grad"] = x.grad().cpu();
    for (const auto& p : m->named_parameters()) {
      if (p.value().grad().defined()) got[fused][p.key()] = p.value().grad().cpu();
    }
    for (const auto& b : m->named_buffers()) {
      if (b.value().is_floating_point()) got[fused][b.key()] = b.value().cpu();
    }
  }
  models::set_fused_conv_training(was);
  std::pair<double, std::string> worst{0.0, ""};
  for (const auto& [name, t] : got[0]) {
    auto it = got[1].find(name);
    if (it == got[1].end()) return {1e9, "missing " + name};
    const double e = rel_err(it->second, t);
    if (e > worst.first) worst = {e, name};
  }
  if (got[0].size() != got[1].size()) return {1e9, "different entry counts"};
  return worst;
}

// A block with an addend (ConvBnActParams::addend): `after_act` false: silu(bn(conv(x)) + a) through
// forward_sum_silu (RepConvN's sum); true: act(bn(conv(x))) + a through a residual output. Runs
// the fused node and the composed ops (the switch off) from the same weights and inputs, and
// returns the worst relative error over the output, the gradients of x, a, the convolution weight
// and BatchNorm's affine parameters, and the running statistics, with the worst entry's name.
inline std::pair<double, std::string> compare_addend(const torch::Device& device, bool after_act, bool act,
                                                     std::vector<int64_t> input, int64_t c2,
                                                     c10::optional<c10::ScalarType> autocast = c10::nullopt) {
  std::map<std::string, torch::Tensor> got[2];
  std::string node[2];
  const bool was = models::fused_conv_training();
  for (int fused = 0; fused < 2; ++fused) {
    models::set_fused_conv_training(fused == 1);
    torch::manual_seed(31);
    models::yolo9::Conv conv(input[1], c2, 3, 1, 1, after_act ? act : false);
    {
      torch::NoGradGuard ng;
      conv->bn->weight.uniform_(0.5, 1.5);
      conv->bn->bias.uniform_(-0.5, 0.5);
    }
    conv->to(device);
    engine::to_channels_last(*conv);
    conv->train();
    torch::manual_seed(32);
    auto x = torch::randn(input).to(device).contiguous(at::MemoryFormat::ChannelsLast).set_requires_grad(true);
    auto a = torch::randn({input[0], c2, input[2], input[3]})
                 .to(device, autocast ? *autocast : torch::kFloat)
                 .contiguous(at::MemoryFormat::ChannelsLast)
                 .set_requires_grad(true);
    if (autocast) {
      at::autocast::set_autocast_dtype(device.type(), *autocast);
      at::autocast::set_autocast_enabled(device.type(), true);
    }
    auto y = after_act ? conv->forward(x, models::ConvOutput{nullptr, &a}) : conv->forward_sum_silu(x, a);
    if (autocast) {
      at::autocast::set_autocast_enabled(device.type(), false);
      at::autocast::clear_cache();
    }
    node[fused] = y.grad_fn() ? y.grad_fn()->name() : "";
    torch::manual_seed(33);
    (y.to(torch::kFloat) * torch::randn(y.sizes()).to(device)).sum().backward();
    got[fused]["output"] = y.detach().to(torch::kCPU, torch::kFloat);
    got[fused]["x.grad"] = x.grad().to(torch::kCPU, torch::kFloat);
    got[fused]["addend.grad"] = a.grad().to(torch::kCPU, torch::kFloat);
    got[fused]["conv.weight.grad"] = conv->conv->weight.grad().to(torch::kCPU, torch::kFloat);
    got[fused]["bn.weight.grad"] = conv->bn->weight.grad().to(torch::kCPU);
    got[fused]["bn.bias.grad"] = conv->bn->bias.grad().to(torch::kCPU);
    got[fused]["bn.running_mean"] = conv->bn->running_mean.to(torch::kCPU);
    got[fused]["bn.running_var"] = conv->bn->running_var.to(torch::kCPU);
  }
  models::set_fused_conv_training(was);
  if (node[1].find("ConvBnActFn") == std::string::npos) return {1e9, "fused run's node: " + node[1]};
  if (node[0].find("ConvBnActFn") != std::string::npos) return {1e9, "composed run's node: " + node[0]};
  std::pair<double, std::string> worst{0.0, ""};
  for (const auto& [name, t] : got[0]) {
    const double e = rel_err(got[1][name], t);
    if (e > worst.first) worst = {e, name};
  }
  return worst;
}

// Each YOLOv9 block type in training: output, input gradient, every parameter gradient and
// running statistic equal with the fused node and with the composed ops.
inline void check_blocks(const torch::Device& device, bool channels_last, double tol) {
  using namespace libreyolo::models::yolo9;
  // Both sides in true fp32 with cuDNN's heuristic choice: TF32 convolutions (PyTorch's default)
  // and autotuned algorithms would add their own ~1e-3 differences to what is compared here.
  const CudnnSettings fp32(/*benchmark=*/false, at::globalContext().deterministicCuDNN(), /*allow_tf32=*/false);
  const std::vector<int64_t> in{2, 16, 12, 12};
  auto check = [&](const char* name, auto make, std::vector<int64_t> shape) {
    auto [err, where] = compare_module(make, shape, device, channels_last);
    std::cout << "[ REPORT   ] " << (device.is_cuda() ? "cuda " : "cpu ") << (channels_last ? "channels_last " : "")
              << name << ": worst " << err << " (" << where << ")\n";
    EXPECT_LE(err, tol) << name << " " << where;
  };
  check("Conv", [] { return Conv(16, 24, 3, 1); }, in);
  check("RepConvN", [] { return RepConvN(16, 16); }, in);
  check("RepNBottleneck", [] { return RepNBottleneck(16); }, in);
  check("RepNCSP", [] { return RepNCSP(16, 32, 1); }, in);
  check("RepNCSPELAN", [] { return RepNCSPELAN(16, 32, 16, 24, 1); }, in);
  check("ELAN", [] { return ELAN(16, 32, 16, 24); }, in);
  check("AConv", [] { return AConv(16, 32); }, in);
  check("ADown", [] { return ADown(16, 32); }, in);
  check("SPPELAN", [] { return SPPELAN(16, 8, 24); }, in);
}

// One training forward+backward of a fresh YOLOv9-t (fixed seeds) in `dtype`: raw maps and
// every parameter's gradient, as float64 on the CPU.
struct Yolo9Run {
  std::vector<torch::Tensor> raw;
  std::map<std::string, torch::Tensor> grads;
};

inline Yolo9Run run_yolo9_step(const torch::Device& device, c10::ScalarType dtype, bool fused,
                               const std::vector<int64_t>& input, bool channels_last,
                               c10::optional<c10::ScalarType> autocast = c10::nullopt) {
  const bool was = models::fused_conv_training();
  models::set_fused_conv_training(fused);
  torch::manual_seed(3);
  models::yolo9::Yolo9Model model("t", 3);
  model.to(device, dtype);
  if (channels_last) engine::to_channels_last(model);
  model.train();
  torch::manual_seed(5);
  auto x = torch::rand(input).to(device, dtype);
  if (channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
  std::vector<torch::Tensor> raw;
  if (autocast) {
    at::autocast::set_autocast_dtype(device.type(), *autocast);
    at::autocast::set_autocast_enabled(device.type(), true);
    raw = model.forward_raw(x);
    at::autocast::set_autocast_enabled(device.type(), false);
    at::autocast::clear_cache();
  } else {
    raw = model.forward_raw(x);
  }
  Yolo9Run r;
  torch::Tensor loss = torch::zeros({}, x.options());
  for (size_t i = 0; i < raw.size(); ++i) {
    r.raw.push_back(raw[i].detach().to(torch::kCPU, torch::kDouble));
    torch::manual_seed(100 + static_cast<int>(i));
    loss = loss + (raw[i] * torch::randn(raw[i].sizes()).to(device, dtype)).mean();
  }
  loss.backward();
  for (const auto& p : model.named_parameters()) {
    EXPECT_TRUE(p.value().grad().defined()) << p.key();
    if (p.value().grad().defined()) r.grads[p.key()] = p.value().grad().detach().to(torch::kCPU, torch::kDouble);
  }
  models::set_fused_conv_training(was);
  return r;
}

// Error of `a` against `ref`: the worst raw map (relative to its largest value), and the mean
// and worst over parameters of each gradient's relative error.
struct RunError {
  double raw = 0, grad_mean = 0, grad_worst = 0;
  std::string worst_name;
  size_t count = 0;
};

inline RunError run_error(const Yolo9Run& a, const Yolo9Run& ref) {
  RunError e;
  for (size_t i = 0; i < ref.raw.size(); ++i) e.raw = std::max(e.raw, rel_err(a.raw.at(i), ref.raw[i]));
  for (const auto& [name, g] : ref.grads) {
    auto it = a.grads.find(name);
    const double v = it == a.grads.end() ? 1e9 : rel_err(it->second, g);
    e.grad_mean += v;
    if (v > e.grad_worst) e.grad_worst = v, e.worst_name = name;
    ++e.count;
  }
  if (e.count) e.grad_mean /= static_cast<double>(e.count);
  return e;
}

// A convolution weight shared by three fused Conv+BN+SiLU nodes (each with its own BatchNorm, as
// RTMDet's head shares its convolutions across levels), `passes` forward+backward passes with the
// weight gradients collected in a DeferredWeightGrads scope or accumulated by autograd: the shared
// weight's gradient (the sum of three contributions per pass).
inline torch::Tensor shared_weight_grad(const torch::Device& device, bool deferred, int passes = 2) {
  const bool was = models::fused_conv_training();
  models::set_fused_conv_training(true);
  torch::manual_seed(11);
  std::vector<models::yolo9::Conv> convs;
  for (int l = 0; l < 3; ++l) {
    convs.emplace_back(8, 8, 3);
    if (l > 0) convs[l]->conv = convs[l]->replace_module("conv", convs[0]->conv);
    convs[l]->to(device);
    convs[l]->train();
  }
  for (int pass = 0; pass < passes; ++pass) {
    torch::Tensor loss = torch::zeros({}, torch::TensorOptions().device(device));
    for (int l = 0; l < 3; ++l) {
      torch::manual_seed(100 * pass + l);
      const auto x = torch::randn({2, 8, 12 - 2 * l, 12 - 2 * l}).to(device);
      loss = loss + (convs[l]->forward(x) * (l + 1)).sum();
    }
    std::optional<models::DeferredWeightGrads> scope;
    if (deferred) scope.emplace();
    loss.backward();
    if (scope) scope->flush();
  }
  models::set_fused_conv_training(was);
  return convs[0]->conv->weight.grad().clone().cpu();
}

}  // namespace libreyolo::test
