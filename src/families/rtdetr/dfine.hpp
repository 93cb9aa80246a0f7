// D-FINE, a detector of RT-DETR's lineage built from the same parts (HGNetv2, AIFI, deformable
// attention, contrastive denoising, top-k query selection), registered as its own family "dfine":
//   backbone  HGNetv2 B0/B2/B4/B5 (B0 and B2 with a learnable affine after every ReLU);
//   encoder   AIFI on the coarsest level, then an FPN/PAN whose blocks are RepNCSPELAN4 and whose
//             downsampling is SCDown (1x1 then a depthwise 3x3/2); size n works on two levels
//             (strides 16, 32), the others on three (8, 16, 32);
//   decoder   Fine-grained Distribution Refinement: each layer's box head gives 4 x (reg_max + 1)
//             logits per query, whose softmax integrated over a non-uniform weighting of the bins
//             gives the four edge distances from layer 0's box; a sigmoid gate fuses the
//             cross-attention output with the query; a quality term from the top-4 bin
//             probabilities (LQE) is added to every layer's class logits.
// Module and parameter names are LibreYOLO's, so that the recursive names equal its state_dict.
#pragma once
#include <torch/torch.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "families/rtdetr/blocks.hpp"
#include "families/rtdetr/config.hpp"
#include "families/rtdetr/decoder.hpp"
#include "families/rtdetr/denoising.hpp"
#include "families/rtdetr/encoder.hpp"
#include "families/rtdetr/hgnetv2.hpp"
#include "io/state_dict.hpp"
#include "models/detector.hpp"

namespace libreyolo::models::rtdetr {

struct DfineConfig {
  std::string size = "s";  // LibreYOLO's size name, or "" when the widths match none
  HgNetSpec hgnet;
  bool frozen_norm = false;  // backbone BatchNorms frozen (the pretrained builds of l and x)
  int levels = 3;            // 2: strides 16, 32 (backbone stages 2, 3); 3: strides 8, 16, 32
  int64_t hidden = 256;      // encoder width
  int64_t enc_ffn = 1024;    // AIFI feed-forward width
  int64_t elan_hidden = 64;  // RepNCSPELAN4's branch width: round(expansion * hidden // 2)
  int elan_depth = 1;        // RepVGG blocks per CSP layer: round(3 * depth_mult)
  int64_t dec_hidden = 256, dec_ffn = 1024;
  int dec_layers = 3;
  int eval_idx = -1;
  std::vector<int64_t> points{3, 6, 3};  // sampling points per level
  double reg_scale = 4.0;
  int reg_max = 32;
  int heads = 8;
  int queries = 300;
  int denoising = 100;
  int nc = 80;
  int64_t anchor_size = 640;  // > 0: "anchors"/"valid_mask" buffers for a square input of this side
  // SiLU where D-FINE's decoder has ReLU (its feed-forward layers, LQE and MLP heads): DEIM's and
  // RT-DETRv4's network, otherwise D-FINE's. The weights do not tell (the same tensors).
  bool silu = false;

  std::vector<int64_t> strides() const;
  int last_layer() const { return eval_idx >= 0 ? eval_idx : dec_layers + eval_idx; }
  bool operator==(const DfineConfig& o) const;
};

// LibreYOLO's D-FINE sizes n, s, m, l, x, and a size's default (pretrained-shaped) build: frozen
// backbone norms for l and x. Throws UsageError for an unknown size.
const std::vector<std::string>& dfine_size_names();
DfineConfig dfine_size_config(const std::string& size, int nc);
// Every width and count from a state dict's shapes (the size name when they equal a size's);
// nullopt when a needed key is missing.
std::optional<DfineConfig> dfine_config_from_state_dict(const io::StateDict& sd);
// True for D-FINE weights (the decoder's pre_bbox_head).
bool is_dfine_state_dict(const io::StateDict& sd);

// The FDR primitives. weighting_function: the reg_max + 1 bin values W(n) for `up` and
// `reg_scale` (tensors [1]): -2a, then 1 - s^i for i = reg_max/2 - 1 .. 1, 0, s^i - 1 for
// i = 1 .. reg_max/2 - 1, 2a, with a = |up| |reg_scale| and s = (a + 1)^(2 / (reg_max - 2)).
torch::Tensor weighting_function(int reg_max, const torch::Tensor& up, const torch::Tensor& reg_scale);
// softmax over each edge's reg_max + 1 logits, dotted with `project`: [..., 4 (reg_max + 1)] -> [..., 4].
torch::Tensor fdr_integral(const torch::Tensor& corners, const torch::Tensor& project, int reg_max);
// Edge distances (left, top, right, bottom) from reference boxes (cx, cy, w, h) to a cxcywh box:
// x1 = cx - (rs / 2 + d0) w / rs, ..., rs = |reg_scale|.
torch::Tensor distance_to_box(const torch::Tensor& points, const torch::Tensor& distance,
                              const torch::Tensor& reg_scale);

// cv4(cat(a, b, cv3(cv2(b)))) with (a, b) = cv1(x) split in halves; cv2/cv3 are a CSP layer of
// `depth` RepVGG blocks followed by a 3x3 ConvNorm; every ConvNorm with SiLU.
class RepNCSPELAN4Impl : public torch::nn::Module {
 public:
  RepNCSPELAN4Impl(int64_t c1, int64_t c2, int64_t c3, int64_t c4, int depth);
  torch::Tensor forward(const torch::Tensor& x);

  ConvNorm cv1{nullptr}, cv4{nullptr};
  CSPRepLayer csp2{nullptr}, csp3{nullptr};      // "cv2.0", "cv3.0"
  ConvNorm conv2{nullptr}, conv3{nullptr};       // "cv2.1", "cv3.1"
  int64_t half;
};
TORCH_MODULE(RepNCSPELAN4);

// cv2(cv1(x)): a 1x1 ConvNorm and a depthwise k x k stride-s ConvNorm, no activations.
class SCDownImpl : public torch::nn::Module {
 public:
  SCDownImpl(int64_t c1, int64_t c2, int64_t k, int64_t s);
  torch::Tensor forward(const torch::Tensor& x);

  ConvNorm cv1{nullptr}, cv2{nullptr};
};
TORCH_MODULE(SCDown);

class DfineEncoderImpl : public torch::nn::Module {
 public:
  explicit DfineEncoderImpl(const DfineConfig& cfg);
  // Backbone levels (finest first) -> hidden-width maps at the same strides.
  std::vector<torch::Tensor> forward(const std::vector<torch::Tensor>& feats);

  std::vector<ConvNorm> input_proj;  // "input_proj.{i}.conv/.norm"
  EncoderLayer aifi{nullptr};        // "encoder.0.layers.0" (on the coarsest level)
  std::vector<ConvNorm> lateral_convs;
  std::vector<RepNCSPELAN4> fpn_blocks, pan_blocks;
  std::vector<SCDown> downsample_convs;  // "downsample_convs.{i}.0"
  int64_t hidden;
};
TORCH_MODULE(DfineEncoder);

// Deformable attention without value or output projections (D-FINE reads the memory itself):
// sample p of a head sits at (cx, cy) + offset * num_points_scale[p] * (w, h) * 0.5, bilinear.
class DfineDeformableAttentionImpl : public torch::nn::Module {
 public:
  DfineDeformableAttentionImpl(int64_t embed, int64_t heads, std::vector<int64_t> points);
  // query [B, Q, C], ref [B, Q, 4], value [B, T, C].
  torch::Tensor forward(const torch::Tensor& query, const torch::Tensor& ref, const torch::Tensor& value,
                        const LevelShapes& shapes);
  void reset_parameters();

  torch::Tensor num_points_scale;
  torch::nn::Linear sampling_offsets{nullptr}, attention_weights{nullptr};
  int64_t embed, heads, total_points;
  std::vector<int64_t> points;
};
TORCH_MODULE(DfineDeformableAttention);

// norm(g1 * x1 + g2 * x2), (g1, g2) = sigmoid(gate(cat(x1, x2))) split in halves.
class GateImpl : public torch::nn::Module {
 public:
  explicit GateImpl(int64_t c);
  torch::Tensor forward(const torch::Tensor& x1, const torch::Tensor& x2);

  torch::nn::Linear gate{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(Gate);

// x = norm1(x + self_attn(x + pos, x + pos, x, mask)); x = gateway(x, cross_attn(x + pos, ref,
// memory)); x = norm3(clamp(x + linear2(act(linear1(x))), +-65504)), act ReLU (SiLU with cfg.silu).
class DfineDecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DfineDecoderLayerImpl(const DfineConfig& cfg);
  torch::Tensor forward(const torch::Tensor& tgt, const torch::Tensor& ref, const torch::Tensor& memory,
                        const LevelShapes& shapes, const torch::Tensor& pos, const torch::Tensor& attn_mask = {});

  MultiheadAttention self_attn{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm3{nullptr};
  DfineDeformableAttention cross_attn{nullptr};
  Gate gateway{nullptr};
  torch::nn::Linear linear1{nullptr}, linear2{nullptr};
  bool silu = false;
};
TORCH_MODULE(DfineDecoderLayer);

// scores + reg_conf([top-4 bin probabilities of each edge, their mean]) (an MLP 20 -> 64 -> 1,
// ReLU or SiLU between).
class LqeImpl : public torch::nn::Module {
 public:
  LqeImpl(int reg_max, bool silu);
  torch::Tensor forward(const torch::Tensor& scores, const torch::Tensor& corners);

  Mlp reg_conf{nullptr};
  int reg_max;
};
TORCH_MODULE(Lqe);

// What the decoder layers give: per recorded layer (every layer in training, the eval layer in
// eval mode) logits [B, N, nc], sigmoid cxcywh boxes, corner logits [B, N, 4 (reg_max + 1)] and
// the layer-0 reference boxes they are measured from; and layer 0's own box and logits ("pre").
struct DfineDecoderOutputs {
  std::vector<torch::Tensor> logits, boxes, corners, refs;
  torch::Tensor pre_logits, pre_boxes;
};

class DfineTransformerImpl : public torch::nn::Module {
 public:
  explicit DfineTransformerImpl(const DfineConfig& cfg);

  std::pair<torch::Tensor, LevelShapes> encoder_memory(const std::vector<torch::Tensor>& feats);
  // The proposals and the top-k queries (QuerySelection's fields; enc_delta is the box head's
  // output on the selected tokens only).
  QuerySelection select_queries(const torch::Tensor& memory, const LevelShapes& shapes);
  // When defined: [B, Q] token indices taken instead of the scores' top-k. Parity tests give the
  // reference's selection, so that what follows it is compared on the same queries whatever the
  // order of near-equal scores in this CPU's float32 rounding.
  torch::Tensor forced_topk_ind;
  DfineDecoderOutputs decode(const torch::Tensor& target, const torch::Tensor& ref_unact, const torch::Tensor& memory,
                             const LevelShapes& shapes, const torch::Tensor& attn_mask = {});
  // Eval forward: {pred_logits, pred_boxes} of layer eval_idx.
  std::pair<torch::Tensor, torch::Tensor> forward(const std::vector<torch::Tensor>& feats,
                                                  QuerySelection* selection = nullptr);
  void reset_num_classes(int nc);
  void reset_parameters();

  torch::Tensor up, reg_scale;       // [1] parameters without gradient (also under "decoder.")
  torch::Tensor anchors, valid_mask;  // buffers with anchor_size > 0
  std::vector<ConvNorm> input_proj;   // nullptr where the widths agree (an identity)
  std::vector<DfineDecoderLayer> layers;
  std::vector<Lqe> lqe_layers;
  torch::nn::Embedding denoising_class_embed{nullptr};
  Mlp query_pos_head{nullptr};
  torch::nn::Linear enc_proj{nullptr};   // "enc_output.proj"
  torch::nn::LayerNorm enc_norm{nullptr};  // "enc_output.norm"
  torch::nn::Linear enc_score_head{nullptr};
  Mlp enc_bbox_head{nullptr}, pre_bbox_head{nullptr};
  std::vector<torch::nn::Linear> dec_score_head;
  std::vector<Mlp> dec_bbox_head;
  DfineConfig cfg;

 private:
  std::shared_ptr<torch::nn::Module> score_heads_;
};
TORCH_MODULE(DfineTransformer);

// The eval forward with what it computed on the way.
struct DfineEvalTrace {
  std::vector<torch::Tensor> backbone, encoder;
  QuerySelection selection;
  torch::Tensor pred_logits, pred_boxes;
};

// The training-mode forward: every decoder layer's outputs of the matching queries, layer 0's own
// prediction ("pre"), the encoder's top-k proposals and, with denoising, the same of the
// denoising queries.
struct DfineTrainOutputs {
  DfineDecoderOutputs matching, dn;
  torch::Tensor enc_topk_logits, enc_topk_boxes;
  torch::Tensor up, reg_scale;  // the weighting function's parameters
  std::optional<DenoisingGroup> denoising;
  // With denoising: the group count G and the positive pairs int64 [P, 3] (image, denoising
  // query, GT index) on the CPU.
  int64_t dn_groups = 0;
  torch::Tensor dn_pairs;
};

// Detector::forward_train's flat layout in training mode (forward_raw's three entries first):
//   [0] pred_logits, [1] pred_boxes of the last layer, [2] input size int64 [2] (h, w),
//   [3] counts int64 [3]: L decoder layers, 1 with denoising (else 0), G; [4] up, [5] reg_scale;
//   then logits, boxes, corners, refs of each of the L layers; pre logits, pre boxes, encoder
//   top-k logits and boxes; with denoising the same 4 L + 2 of the denoising queries and the
//   positive pairs [P, 3].
std::vector<torch::Tensor> pack_dfine_outputs(const DfineTrainOutputs& t, int64_t input_h, int64_t input_w);
// The reverse (denoising: dn_groups and dn_pairs, no group); throws UsageError for another layout.
DfineTrainOutputs unpack_dfine_outputs(const std::vector<torch::Tensor>& raw);

class DfineModel : public Detector {
 public:
  explicit DfineModel(const DfineConfig& cfg);

  // {pred_logits [B, Q, nc], pred_boxes [B, Q, 4] (normalised cxcywh), input size int64 [2]}.
  std::vector<torch::Tensor> forward_raw(const torch::Tensor& x) override;
  // [B, 4 + nc, Q]: xyxy in input pixels (widths and heights clamped at 0), sigmoid scores.
  torch::Tensor decode(const std::vector<torch::Tensor>& raw) override;
  DfineEvalTrace forward_trace(const torch::Tensor& x);
  DfineTrainOutputs forward_train_outputs(const torch::Tensor& x, const std::vector<ImageTargets>& gts = {});
  // The same from the encoder's levels on.
  DfineTrainOutputs decoder_train_outputs(const std::vector<torch::Tensor>& encoded,
                                          const std::vector<ImageTargets>& gts = {});
  // Training mode: pack_dfine_outputs of forward_train_outputs (targets as TrainingLoss reads
  // them; undefined: no denoising), through the head seam. Eval mode: forward_raw.
  std::vector<torch::Tensor> forward_train(const torch::Tensor& x, const torch::Tensor& targets) override;
  // The capture seams, as RT-DETR's (RtdetrModel::train_head): Head the backbone and the hybrid
  // encoder (its levels); Network the whole network with the denoising group padded. The network
  // head's outputs: per decoder layer logits, boxes, corners, refs over slots + Q queries, then
  // pre logits, pre boxes, the encoder top-k logits and boxes.
  std::vector<torch::Tensor> head_parameters(Seam seam) override;
  SeamInputs seam_inputs(Seam seam, const torch::Tensor& targets) override;
  std::vector<torch::Tensor> train_head(Seam seam, const torch::Tensor& x,
                                        const std::vector<torch::Tensor>& head_inputs) override;
  std::vector<torch::Tensor> train_tail(Seam seam, const std::vector<torch::Tensor>& head, const torch::Tensor& x,
                                        const torch::Tensor& targets, const SeamInputs& inputs) override;
  // The batch's denoising group as D-FINE decodes it (nullopt: none).
  std::optional<DenoisingGroup> denoising_group(const std::vector<ImageTargets>& gts);

  void set_denoising_source(DenoisingSource source) { dn_source_ = std::move(source); }
  DenoisingOptions& denoising_options() { return dn_options_; }

  std::string family_name() const override { return "dfine"; }
  std::string size() const override { return cfg_.size; }
  int num_classes() const override { return cfg_.nc; }
  std::vector<int64_t> strides() const override { return cfg_.strides(); }
  // The smallest multiple of 32 whose encoder positions hold the queries (128; 256 on two levels).
  int64_t min_input_size() const override;
  void reset_num_classes(int nc) override;
  std::vector<std::string> freeze_groups() const override { return {"backbone", "encoder", "decoder"}; }
  const DfineConfig& config() const { return cfg_; }
  std::vector<torch::Tensor> backbone_forward(const torch::Tensor& x);

  HGNetv2 backbone{nullptr};
  DfineEncoder encoder{nullptr};
  DfineTransformer decoder{nullptr};

 private:
  DfineConfig cfg_;
  DenoisingOptions dn_options_;
  DenoisingSource dn_source_ = global_generator_draws;
};

Family make_dfine_family();

}  // namespace libreyolo::models::rtdetr
