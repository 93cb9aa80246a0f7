// RT-DETR (v1) detect model with LibreYOLO's parameter names: "backbone" (PResNet-vd or HGNetv2),
// "encoder" (hybrid encoder), "decoder" (query selection and the deformable decoder), so that
// the recursive parameter/buffer names equal its state_dict keys. The input is RGB / 255
// stretched to a square (no letterbox); detections are a flat top-k over queries x classes
// (no NMS).
#pragma once
#include <torch/torch.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "families/rtdetr/backbone.hpp"
#include "families/rtdetr/config.hpp"
#include "families/rtdetr/decoder.hpp"
#include "families/rtdetr/denoising.hpp"
#include "families/rtdetr/encoder.hpp"
#include "families/rtdetr/hgnetv2.hpp"
#include "families/rtdetr/matcher.hpp"
#include "models/detector.hpp"
#include "ops/postprocess.hpp"

namespace libreyolo::models::rtdetr {

// The eval forward with what it computed on the way (for inspection and parity checks).
struct EvalTrace {
  std::array<torch::Tensor, 3> backbone, encoder;
  QuerySelection selection;
  torch::Tensor pred_logits, pred_boxes;  // [B, Q, nc], [B, Q, 4] sigmoid cxcywh in [0, 1]
};

// The training-mode forward (what the criterion reads): every decoder layer's logits and boxes
// of the matching queries, the encoder's top-k proposals (scored by the same matcher as one more
// auxiliary level) and, with denoising, every layer's outputs of the denoising queries.
struct TrainOutputs {
  std::array<torch::Tensor, 3> backbone, encoder;
  std::vector<torch::Tensor> logits, boxes;        // per decoder layer: [B, Q, nc], [B, Q, 4]
  torch::Tensor enc_topk_logits, enc_topk_boxes;   // [B, Q, nc], sigmoid of the selected proposals
  std::optional<DenoisingGroup> denoising;         // the group decoded in front of the Q queries
  std::vector<torch::Tensor> dn_logits, dn_boxes;  // per decoder layer: [B, N, nc], [B, N, 4]
  // With denoising: the group count G and the positive pairs (denoising_pairs).
  int64_t dn_groups = 0;
  torch::Tensor dn_pairs;
  // The encoder top-k is its own level for the criterion (RT-DETRv2), not the last auxiliary one.
  bool enc_aux_level = false;
};

// forward_train's flat vector, read back: the last decoder layer, the auxiliary levels (decoder
// layers 0..L-2, then the encoder top-k unless it is a level of its own: `enc`), and with
// denoising every decoder layer's denoising outputs, the group count G and the positive pairs.
struct CriterionInputs {
  OutputLevel last;
  std::vector<OutputLevel> aux, dn;
  std::vector<OutputLevel> enc;  // the encoder top-k when supervised on its own (RT-DETRv2)
  int64_t dn_groups = 0;
  torch::Tensor dn_pairs;  // int64 [P, 3] on the CPU: (image, denoising query, GT index)
  int64_t input_h = 0, input_w = 0;
};

// The flat layout of Detector::forward_train in training mode (forward_raw's three entries first,
// at the same places):
//   [0] pred_logits [B, Q, nc], [1] pred_boxes [B, Q, 4]: the last decoder layer
//   [2] input size int64 [2] (h, w) on the CPU
//   [3] counts int64 [3] on the CPU: A auxiliary levels, D denoising levels (0: no denoising), G;
//       or [4] with E encoder levels after G, when the encoder top-k is a level of its own
//   [4, 4 + 2A): logits, boxes of each auxiliary level (decoder layers 0..L-2, then the encoder
//   top-k when E is absent)
//   [4 + 2A, 4 + 2A + 2E): logits, boxes of the encoder top-k (E = 1) when it is its own level
//   then 2D: logits [B, N, nc], boxes [B, N, 4] of each decoder layer's denoising
//   queries, then (when D > 0) the positive pairs int64 [P, 3] (image, query, GT index) on the CPU
std::vector<torch::Tensor> pack_train_outputs(const TrainOutputs& t, int64_t input_h, int64_t input_w);
// The reverse; throws UsageError when `raw` is not such a vector.
CriterionInputs unpack_train_outputs(const std::vector<torch::Tensor>& raw);

class RtdetrModel : public Detector {
 public:
  explicit RtdetrModel(const Config& cfg);

  // {pred_logits [B, Q, nc], pred_boxes [B, Q, 4] (normalised cxcywh), input size int64 [2]
  // (h, w) on the CPU}: in eval mode the layer eval_idx's, in training mode the last layer's
  // (every layer and the encoder top-k: forward_train_outputs).
  std::vector<torch::Tensor> forward_raw(const torch::Tensor& x) override;
  // [B, 4 + nc, Q]: xyxy in input pixels (cxcywh scaled by the input's width and height), then
  // sigmoid class scores.
  torch::Tensor decode(const std::vector<torch::Tensor>& raw) override;
  EvalTrace forward_trace(const torch::Tensor& x);
  // In training mode (batch statistics, running statistics updated): TrainOutputs. The boxes of
  // layer i >= 1 are refined from layer i-1's undetached box; the references each layer samples
  // with and the content queries taken from the encoder are detached. With ground truth (and a
  // denoising embedding) a denoising group is drawn from the denoising source and decoded in
  // front of the matching queries under its attention mask; none when `gts` is empty or holds
  // no box.
  TrainOutputs forward_train_outputs(const torch::Tensor& x, const std::vector<ImageTargets>& gts = {});
  // The same from the encoder's outputs on (TrainOutputs::backbone left empty).
  TrainOutputs decoder_train_outputs(const std::array<torch::Tensor, 3>& encoded,
                                     const std::vector<ImageTargets>& gts = {});
  // Training mode: pack_train_outputs of forward_train_outputs (targets as TrainingLoss reads
  // them, undefined = no denoising), through the head seam. Eval mode: forward_raw.
  std::vector<torch::Tensor> forward_train(const torch::Tensor& x, const torch::Tensor& targets) override;
  // The capture seams (Detector::train_head). Head: the backbone and the hybrid encoder (fixed
  // shapes, no host reads); the tail the query selection, denoising group and decoder. Network:
  // the whole network, with the denoising group (drawn by seam_inputs, as forward_train draws it)
  // laid out in denoising_slots() slots (pad_denoising); the tail unpads. The head's outputs are
  // every decoder layer's logits and boxes over slots + Q queries, then the encoder top-k's.
  std::vector<torch::Tensor> head_parameters(Seam seam) override;
  SeamInputs seam_inputs(Seam seam, const torch::Tensor& targets) override;
  std::vector<torch::Tensor> train_head(Seam seam, const torch::Tensor& x,
                                        const std::vector<torch::Tensor>& head_inputs) override;
  std::vector<torch::Tensor> train_tail(Seam seam, const std::vector<torch::Tensor>& head, const torch::Tensor& x,
                                        const torch::Tensor& targets, const SeamInputs& inputs) override;

  // Where the denoising group's random numbers come from (default: torch's global generator).
  void set_denoising_source(DenoisingSource source) { dn_source_ = std::move(source); }
  DenoisingOptions& denoising_options() { return dn_options_; }

  std::string family_name() const override { return cfg_.family; }
  std::string size() const override { return cfg_.size; }
  int num_classes() const override { return cfg_.nc; }
  std::vector<int64_t> strides() const override { return {8, 16, 32}; }
  void reset_num_classes(int nc) override;
  std::vector<std::string> freeze_groups() const override { return {"backbone", "encoder", "decoder"}; }
  const Config& config() const { return cfg_; }

  // The backbone's stage 1-3 outputs.
  std::array<torch::Tensor, 3> backbone_forward(const torch::Tensor& x);

  // The backbone, registered as "backbone": one of the two, the other nullptr.
  PResNet presnet{nullptr};
  HGNetv2 hgnet{nullptr};
  HybridEncoder encoder{nullptr};
  Transformer decoder{nullptr};

 private:
  Config cfg_;
  DenoisingOptions dn_options_;
  DenoisingSource dn_source_ = global_generator_draws;
};

// Detections of one image from its pred_logits [Q, nc] and pred_boxes [Q, 4] (normalised
// cxcywh): sigmoid scores flattened query-major (index q * nc + c), the top min(max_det, Q * nc)
// in descending order, then those with score > conf; boxes xyxy scaled to the original image's
// width and height (the stretch undone), not clipped.
// The registry entries (src/families/registry.cpp lists them): RT-DETR and RT-DETRv2.
Family make_family();
Family make_v2_family();
Family make_dfine_family();  // families/rtdetr/dfine.hpp has the network
// DEIM (n, s, m, l, x) and RT-DETRv4 (s, m, l, x): D-FINE's network with SiLU in the decoder and
// DEIM's matchability-aware class loss; their weights are D-FINE-shaped (a checkpoint's
// model_family tells them apart; a raw RT-DETRv4 file by its distillation projector).
Family make_deim_family();
Family make_rtdetrv4_family();

ops::Detections postprocess_topk(const torch::Tensor& logits, const torch::Tensor& boxes, double conf, int max_det,
                                 int orig_h, int orig_w);

}  // namespace libreyolo::models::rtdetr
