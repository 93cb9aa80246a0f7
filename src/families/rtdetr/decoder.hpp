// RT-DETR's transformer decoder head ("decoder" in the state dict): input projections of the
// encoder maps into one token memory, anchors and the top-k query selection over the encoder
// proposals, and the decoder layers (self-attention, multi-scale deformable cross-attention,
// FFN) with iterative box refinement and a score/box head per layer.
#pragma once
#include <torch/torch.h>

#include <array>
#include <limits>
#include <utility>
#include <vector>

#include "families/rtdetr/blocks.hpp"
#include "families/rtdetr/config.hpp"

namespace libreyolo::models::rtdetr {

using LevelShapes = std::vector<std::array<int64_t, 2>>;  // (h, w) per level

// Multi-scale deformable attention with points[l] samples per head on level l. The reference is
// a box (cx, cy, w, h) in [0, 1]: sample p of a head sits at (cx, cy) + offset / n * (w, h) * 0.5
// on its level, n the level's point count (v1 divides by n; with `scale_buffer`, RT-DETRv2's
// layout, the offset is multiplied by the buffer "num_points_scale" holding 1/n per point), read
// from that level's value map (`sampling`: bilinear with zeros outside, or the cell it falls in),
// weighted by a softmax over the head's points of all levels. Points are laid out level-major.
class MSDeformableAttentionImpl : public torch::nn::Module {
 public:
  MSDeformableAttentionImpl(int64_t embed, int64_t heads, std::vector<int64_t> points,
                            Sampling sampling = Sampling::Bilinear, bool scale_buffer = false);
  // query [B, Q, C], ref [B, Q, 4], value (memory) [B, T, C] with T = sum h*w over `shapes`.
  torch::Tensor forward(const torch::Tensor& query, const torch::Tensor& ref, const torch::Tensor& value,
                        const LevelShapes& shapes);
  // The reference initialisation: zero offset/attention weights, offset biases on a ring of
  // head directions scaled by the point's index within its level, xavier value/output projections.
  void reset_parameters();

  torch::nn::Linear sampling_offsets{nullptr}, attention_weights{nullptr}, value_proj{nullptr}, output_proj{nullptr};
  torch::Tensor num_points_scale;  // [sum points] 1/n per point (defined with scale_buffer)
  int64_t embed, heads, levels, total_points;
  std::vector<int64_t> points;
  Sampling sampling;
};
TORCH_MODULE(MSDeformableAttention);

// value [B, T, heads, d], locations [B, Q, heads, levels, points, 2] in [0, 1], weights
// [B, Q, heads, levels, points] -> [B, Q, heads * d] (heads concatenated).
torch::Tensor deformable_attention_core(const torch::Tensor& value, const LevelShapes& shapes,
                                        const torch::Tensor& locations, const torch::Tensor& weights);
// The same with the points of all levels flat: locations [B, Q, heads, P, 2], weights
// [B, Q, heads, P], P = sum of `points` (level-major). Discrete sampling reads the value at
// (int(x * w + 0.5), int(y * h + 0.5)) of each level, both clamped to [0, h - 1] as the
// reference does (its maps are square or wider than tall).
torch::Tensor deformable_attention_core(const torch::Tensor& value, const LevelShapes& shapes,
                                        const torch::Tensor& locations, const torch::Tensor& weights,
                                        const std::vector<int64_t>& points, Sampling sampling);

// tgt = norm1(tgt + self_attn(tgt + pos, tgt + pos, tgt, mask)); tgt = norm2(tgt + cross_attn(
// tgt + pos, ref, memory)); tgt = norm3(clamp(tgt + linear2(relu(linear1(tgt))), +-65504)), the
// clamp only with cfg.v2.ffn_clamp (v1).
class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const Config& cfg);
  torch::Tensor forward(const torch::Tensor& tgt, const torch::Tensor& ref, const torch::Tensor& memory,
                        const LevelShapes& shapes, const torch::Tensor& pos, const torch::Tensor& attn_mask = {});

  MultiheadAttention self_attn{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr}, norm3{nullptr};
  MSDeformableAttention cross_attn{nullptr};
  torch::nn::Linear linear1{nullptr}, linear2{nullptr};
  bool clamp = true;
};
TORCH_MODULE(DecoderLayer);

// Logit-space anchors [1, T, 4] (`invalid` where invalid: +inf for RT-DETR, 1e4 for D-FINE) and
// their valid mask [1, T, 1] bool for levels of these sizes: centre ((x + 0.5) / w, (y + 0.5) / h),
// size 0.05 * 2^level, valid when all four lie strictly inside (0.01, 0.99); level-major,
// row-major, float32.
std::pair<torch::Tensor, torch::Tensor> make_anchors(const LevelShapes& shapes, const torch::Device& device,
                                                     double invalid = std::numeric_limits<double>::infinity());

// The encoder proposals and the queries chosen from them.
struct QuerySelection {
  torch::Tensor anchors, valid;          // [1, T, 4] logit space, [1, T, 1] bool
  torch::Tensor enc_logits, enc_delta;   // [B, T, nc], [B, T, 4] (before the anchors are added)
  torch::Tensor topk_ind;                // [B, Q] token indices, by descending selection score
  torch::Tensor ref_unact, topk_logits;  // [B, Q, 4] logit-space boxes, [B, Q, nc]
  torch::Tensor target;                  // [B, Q, C] content queries (detached)
};

// Per decoder layer that ran: class logits [B, Q, nc] and sigmoid cxcywh boxes [B, Q, 4].
struct DecoderOutputs {
  std::vector<torch::Tensor> logits, boxes;
};

class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const Config& cfg);

  // The encoder maps projected and flattened: memory [B, T, C] and the level sizes.
  std::pair<torch::Tensor, LevelShapes> encoder_memory(const std::array<torch::Tensor, 3>& feats);
  QuerySelection select_queries(const torch::Tensor& memory, const LevelShapes& shapes);
  // When defined: [B, Q] token indices taken instead of the scores' top-k. Parity tests give the
  // reference's selection, so that what follows it is compared on the same queries whatever the
  // order of near-equal scores in this CPU's float32 rounding.
  torch::Tensor forced_topk_ind;
  // The decoder layers from content queries `target` and logit-space references. Eval mode runs
  // layers 0..last_layer and returns that layer only; training mode returns every layer, the
  // boxes of layer i >= 1 refined from layer i-1's undetached box.
  DecoderOutputs decode(const torch::Tensor& target, const torch::Tensor& ref_unact, const torch::Tensor& memory,
                        const LevelShapes& shapes, const torch::Tensor& attn_mask = {});
  // Eval forward: {pred_logits [B, Q, nc], pred_boxes [B, Q, 4]}; `selection`, when given,
  // receives the query selection.
  std::pair<torch::Tensor, torch::Tensor> forward(const std::array<torch::Tensor, 3>& feats,
                                                  QuerySelection* selection = nullptr);
  // Fresh class heads (encoder, every layer, the denoising embedding) for nc classes.
  void reset_num_classes(int nc);
  // The reference initialisation of the heads (prior score biases, zero last box layers, xavier).
  void reset_parameters();

  std::vector<ConvNorm> input_proj;  // "input_proj.{i}.conv/.norm"
  std::vector<DecoderLayer> layers;  // "decoder.layers.{l}"
  torch::nn::Embedding denoising_class_embed{nullptr};
  Mlp query_pos_head{nullptr};
  torch::nn::Linear enc_linear{nullptr};   // "enc_output.0" ("enc_output.proj" in v2)
  torch::nn::LayerNorm enc_norm{nullptr};  // "enc_output.1" ("enc_output.norm" in v2)
  torch::Tensor anchors, valid_mask;       // buffers with cfg.v2.anchor_size > 0
  torch::nn::Linear enc_score_head{nullptr};
  Mlp enc_bbox_head{nullptr};
  std::vector<torch::nn::Linear> dec_score_head;
  std::vector<Mlp> dec_bbox_head;
  Config cfg;

 private:
  int64_t enc_classes(int nc) const;  // the encoder score head's outputs (1 with agnostic selection)
  std::shared_ptr<torch::nn::Module> score_heads_;  // "dec_score_head"
};
TORCH_MODULE(Transformer);

}  // namespace libreyolo::models::rtdetr
