#include "families/rtdetr/backbone.hpp"

#include <string>

namespace libreyolo::models::rtdetr {

ResBlockImpl::ResBlockImpl(int64_t cin, int64_t cout, int64_t stride, bool project, bool bottleneck, bool frozen) {
  const int64_t out = bottleneck ? 4 * cout : cout;
  // The reference registers the BasicBlock's shortcut first, the BottleNeck's last.
  auto add_short = [&] {
    if (!project) return;
    if (stride == 2) {
      auto seq = container();
      short_conv = seq->register_module("conv", ConvNorm(cin, out, 1, 1, Act::None, frozen));
      register_module("short", seq);
      pool_short = true;
    } else {
      short_conv = register_module("short", ConvNorm(cin, out, 1, stride, Act::None, frozen));
    }
  };
  if (bottleneck) {
    branch2a = register_module("branch2a", ConvNorm(cin, cout, 1, 1, Act::ReLU, frozen));
    branch2b = register_module("branch2b", ConvNorm(cout, cout, 3, stride, Act::ReLU, frozen));
    branch2c = register_module("branch2c", ConvNorm(cout, out, 1, 1, Act::None, frozen));
    add_short();
  } else {
    add_short();
    branch2a = register_module("branch2a", ConvNorm(cin, cout, 3, stride, Act::ReLU, frozen));
    branch2b = register_module("branch2b", ConvNorm(cout, cout, 3, 1, Act::None, frozen));
  }
}

torch::Tensor ResBlockImpl::forward(const torch::Tensor& x) {
  auto y = branch2b->forward(branch2a->forward(x));
  if (branch2c) y = branch2c->forward(y);
  torch::Tensor s = x;
  if (short_conv) {
    s = pool_short ? torch::avg_pool2d(x, {2, 2}, {2, 2}, {0, 0}, /*ceil_mode=*/true, /*count_include_pad=*/true) : x;
    s = short_conv->forward(s);
  }
  return torch::relu(y + s);
}

PResNetImpl::PResNetImpl(const Config& cfg) {
  const bool frozen = cfg.frozen_norm;
  auto conv1 = container();
  const int64_t half = cfg.stem / 2;
  const int64_t widths[3][3] = {{3, half, 2}, {half, half, 1}, {half, cfg.stem, 1}};
  for (int i = 0; i < 3; ++i) {
    stem.push_back(ConvNorm(widths[i][0], widths[i][1], 3, widths[i][2], Act::ReLU, frozen));
    conv1->register_module("conv1_" + std::to_string(i + 1), stem.back());
  }
  register_module("conv1", conv1);

  auto res_layers = container();
  const auto counts = cfg.blocks();
  int64_t cin = cfg.stem;
  for (int i = 0; i < 4; ++i) {
    auto stage = container();
    auto blocks = container();
    stages.emplace_back();
    for (int j = 0; j < counts[i]; ++j) {
      const int64_t stride = (j == 0 && i != 0) ? 2 : 1;
      stages.back().push_back(ResBlock(cin, cfg.stages[i], stride, /*project=*/j == 0, cfg.bottleneck(), frozen));
      blocks->register_module(std::to_string(j), stages.back().back());
      cin = cfg.stages[i] * cfg.block_expansion();
    }
    stage->register_module("blocks", blocks);
    res_layers->register_module(std::to_string(i), stage);
  }
  register_module("res_layers", res_layers);
}

std::array<torch::Tensor, 3> PResNetImpl::forward(const torch::Tensor& x) {
  auto y = x;
  for (auto& c : stem) y = c->forward(y);
  y = torch::max_pool2d(y, {3, 3}, {2, 2}, {1, 1});
  std::array<torch::Tensor, 3> outs;
  for (size_t i = 0; i < stages.size(); ++i) {
    for (auto& b : stages[i]) y = b->forward(y);
    if (i >= 1) outs[i - 1] = y;
  }
  return outs;
}

}  // namespace libreyolo::models::rtdetr
