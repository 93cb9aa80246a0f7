// RT-DETR's hybrid encoder: 1x1 projections of the three backbone levels to the hidden width,
// one transformer encoder layer (AIFI) over the stride-32 level's tokens with a 2-D sin-cos
// position embedding, then CCFM: a top-down pass (lateral 1x1 convs, nearest 2x upsampling,
// CSPRepLayers) and a bottom-up pass (3x3/2 convs, CSPRepLayers).
#pragma once
#include <torch/torch.h>

#include <array>
#include <vector>

#include "families/rtdetr/blocks.hpp"
#include "families/rtdetr/config.hpp"

namespace libreyolo::models::rtdetr {

// silu(conv1(x) + conv2(x)): a 3x3 and a 1x1 ConvNorm, both without activation.
class RepVggBlockImpl : public torch::nn::Module {
 public:
  explicit RepVggBlockImpl(int64_t c);
  torch::Tensor forward(const torch::Tensor& x);

  ConvNorm conv1{nullptr}, conv2{nullptr};
};
TORCH_MODULE(RepVggBlock);

// conv3(bottlenecks(conv1(x)) + conv2(x)); conv1/conv2 1x1 SiLU to the hidden width, three
// RepVggBlocks ("bottlenecks.0..2"), conv3 1x1 SiLU back to cout (absent when hidden == cout).
class CSPRepLayerImpl : public torch::nn::Module {
 public:
  CSPRepLayerImpl(int64_t cin, int64_t cout, int64_t hidden, int n);
  torch::Tensor forward(const torch::Tensor& x);

  ConvNorm conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  std::vector<RepVggBlock> bottlenecks;
};
TORCH_MODULE(CSPRepLayer);

// Post-norm transformer encoder layer: norm1(src + attn(src + pos, src + pos, src)), then
// norm2(src + linear2(gelu(linear1(src)))) (exact GELU, dropout 0).
class EncoderLayerImpl : public torch::nn::Module {
 public:
  EncoderLayerImpl(int64_t c, int64_t heads, int64_t ffn);
  torch::Tensor forward(const torch::Tensor& src, const torch::Tensor& pos);

  MultiheadAttention self_attn{nullptr};
  torch::nn::Linear linear1{nullptr}, linear2{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
};
TORCH_MODULE(EncoderLayer);

// The 2-D sin-cos embedding [1, h*w, c] of an h x w map: pd = c/4, w_k = 1/10000^(k/pd); token t
// gets (u, v) = (t div h, t mod h) and channels [sin(u w), cos(u w), sin(v w), cos(v w)] — the
// reference's grid is (w, h) in "ij" order, the transpose of the tokens' (y, x) for a square map.
torch::Tensor sincos_position_embedding(int64_t h, int64_t w, int64_t c, const torch::Device& device,
                                        double temperature = 10000.0);

class HybridEncoderImpl : public torch::nn::Module {
 public:
  explicit HybridEncoderImpl(const Config& cfg);
  // Backbone levels (strides 8, 16, 32) -> hidden-width maps at the same strides (PAN order).
  std::array<torch::Tensor, 3> forward(const std::array<torch::Tensor, 3>& feats);

  std::vector<torch::nn::Conv2d> proj_conv;         // "input_proj.{i}.0"
  std::vector<torch::nn::BatchNorm2d> proj_norm;    // "input_proj.{i}.1"
  std::vector<EncoderLayer> aifi;                   // "encoder.0.layers.{j}" (on level 2)
  std::vector<ConvNorm> lateral_convs, downsample_convs;
  std::vector<CSPRepLayer> fpn_blocks, pan_blocks;
  int64_t hidden;
};
TORCH_MODULE(HybridEncoder);

}  // namespace libreyolo::models::rtdetr
