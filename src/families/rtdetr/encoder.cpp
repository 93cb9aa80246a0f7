#include "families/rtdetr/encoder.hpp"

#include <string>

namespace libreyolo::models::rtdetr {

RepVggBlockImpl::RepVggBlockImpl(int64_t c) {
  conv1 = register_module("conv1", ConvNorm(c, c, 3, 1, Act::None));
  conv2 = register_module("conv2", ConvNorm(c, c, 1, 1, Act::None));
}

torch::Tensor RepVggBlockImpl::forward(const torch::Tensor& x) {
  return torch::silu(conv1->forward(x) + conv2->forward(x));
}

CSPRepLayerImpl::CSPRepLayerImpl(int64_t cin, int64_t cout, int64_t hidden, int n) {
  conv1 = register_module("conv1", ConvNorm(cin, hidden, 1, 1, Act::SiLU));
  conv2 = register_module("conv2", ConvNorm(cin, hidden, 1, 1, Act::SiLU));
  auto seq = container();
  for (int i = 0; i < n; ++i) {
    bottlenecks.push_back(RepVggBlock(hidden));
    seq->register_module(std::to_string(i), bottlenecks.back());
  }
  register_module("bottlenecks", seq);
  if (hidden != cout) conv3 = register_module("conv3", ConvNorm(hidden, cout, 1, 1, Act::SiLU));
}

torch::Tensor CSPRepLayerImpl::forward(const torch::Tensor& x) {
  auto a = conv1->forward(x);
  for (auto& b : bottlenecks) a = b->forward(a);
  auto y = a + conv2->forward(x);
  return conv3 ? conv3->forward(y) : y;
}

EncoderLayerImpl::EncoderLayerImpl(int64_t c, int64_t heads, int64_t ffn) {
  self_attn = register_module("self_attn", MultiheadAttention(c, heads));
  linear1 = register_module("linear1", torch::nn::Linear(c, ffn));
  linear2 = register_module("linear2", torch::nn::Linear(ffn, c));
  norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c}).eps(1e-5)));
  norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c}).eps(1e-5)));
}

torch::Tensor EncoderLayerImpl::forward(const torch::Tensor& src, const torch::Tensor& pos) {
  const auto qk = src + pos;
  auto x = norm1->forward(src + self_attn->forward(qk, qk, src));
  return norm2->forward(x + linear2->forward(torch::gelu(linear1->forward(x))));
}

torch::Tensor sincos_position_embedding(int64_t h, int64_t w, int64_t c, const torch::Device& device,
                                        double temperature) {
  TORCH_CHECK(c % 4 == 0, "the sin-cos position embedding needs a width divisible by 4, got ", c);
  const int64_t pd = c / 4;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  auto omega = torch::arange(pd, f32) / static_cast<double>(pd);
  omega = 1.0 / torch::pow(temperature, omega);
  const auto t = torch::arange(h * w, torch::TensorOptions().dtype(torch::kLong).device(device));
  const auto u = torch::div(t, h, "floor").to(torch::kFloat), v = torch::remainder(t, h).to(torch::kFloat);
  const auto ou = u.unsqueeze(1) * omega.unsqueeze(0), ov = v.unsqueeze(1) * omega.unsqueeze(0);
  return torch::cat({ou.sin(), ou.cos(), ov.sin(), ov.cos()}, 1).unsqueeze(0);
}

HybridEncoderImpl::HybridEncoderImpl(const Config& cfg) : hidden(cfg.hidden) {
  const auto in = cfg.backbone_channels();
  auto input_proj = container();
  for (int i = 0; i < Config::kLevels; ++i) {
    auto seq = container();
    proj_conv.push_back(seq->register_module(
        "0", torch::nn::Conv2d(torch::nn::Conv2dOptions(in[i], hidden, 1).bias(false))));
    proj_norm.push_back(seq->register_module("1", torch::nn::BatchNorm2d(hidden)));
    input_proj->register_module(std::to_string(i), seq);
  }
  register_module("input_proj", input_proj);

  auto encoder = container(), stack = container(), layers = container();
  aifi.push_back(EncoderLayer(hidden, cfg.heads, cfg.enc_ffn));
  layers->register_module("0", aifi.back());
  stack->register_module("layers", layers);
  encoder->register_module("0", stack);
  register_module("encoder", encoder);

  const int n = 3;  // round(3 * depth_mult), depth_mult 1
  auto lateral = container(), fpn = container(), down = container(), pan = container();
  for (int i = 0; i < Config::kLevels - 1; ++i) {
    lateral_convs.push_back(lateral->register_module(std::to_string(i), ConvNorm(hidden, hidden, 1, 1, Act::SiLU)));
    fpn_blocks.push_back(fpn->register_module(std::to_string(i), CSPRepLayer(2 * hidden, hidden, cfg.csp_hidden(), n)));
  }
  for (int i = 0; i < Config::kLevels - 1; ++i) {
    downsample_convs.push_back(down->register_module(std::to_string(i), ConvNorm(hidden, hidden, 3, 2, Act::SiLU)));
    pan_blocks.push_back(pan->register_module(std::to_string(i), CSPRepLayer(2 * hidden, hidden, cfg.csp_hidden(), n)));
  }
  register_module("lateral_convs", lateral);
  register_module("fpn_blocks", fpn);
  register_module("downsample_convs", down);
  register_module("pan_blocks", pan);
}

std::array<torch::Tensor, 3> HybridEncoderImpl::forward(const std::array<torch::Tensor, 3>& feats) {
  std::array<torch::Tensor, 3> proj;
  for (int i = 0; i < 3; ++i) proj[i] = proj_norm[i]->forward(proj_conv[i]->forward(feats[i]));

  // AIFI on the stride-32 level.
  {
    const int64_t b = proj[2].size(0), h = proj[2].size(2), w = proj[2].size(3);
    auto tokens = proj[2].flatten(2).permute({0, 2, 1});  // [B, h*w, C]
    const auto pos = sincos_position_embedding(h, w, hidden, tokens.device()).to(tokens.scalar_type());
    for (auto& layer : aifi) tokens = layer->forward(tokens, pos);
    proj[2] = tokens.permute({0, 2, 1}).reshape({b, hidden, h, w}).contiguous();
  }

  // Top-down: the lateral conv replaces the higher map it is applied to.
  std::array<torch::Tensor, 3> inner;
  inner[2] = proj[2];
  for (int idx = 2; idx >= 1; --idx) {
    const int k = 2 - idx;
    auto high = lateral_convs[k]->forward(inner[idx]);
    inner[idx] = high;
    auto up = torch::upsample_nearest2d(high, {high.size(2) * 2, high.size(3) * 2});
    inner[idx - 1] = fpn_blocks[k]->forward(torch::cat({up, proj[idx - 1]}, 1));
  }

  // Bottom-up.
  std::array<torch::Tensor, 3> outs;
  outs[0] = inner[0];
  for (int idx = 0; idx < 2; ++idx) {
    auto down = downsample_convs[idx]->forward(outs[idx]);
    outs[idx + 1] = pan_blocks[idx]->forward(torch::cat({down, inner[idx + 1]}, 1));
  }
  return outs;
}

}  // namespace libreyolo::models::rtdetr
