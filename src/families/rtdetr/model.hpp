// RT-DETR (v1) detect model with LibreYOLO's parameter names: "backbone" (PResNet-vd),
// "encoder" (hybrid encoder), "decoder" (query selection and the deformable decoder), so that
// the recursive parameter/buffer names equal its state_dict keys. The input is RGB / 255
// stretched to a square (no letterbox); detections are a flat top-k over queries x classes
// (no NMS).
#pragma once
#include <torch/torch.h>

#include <array>
#include <string>
#include <vector>

#include "families/rtdetr/backbone.hpp"
#include "families/rtdetr/config.hpp"
#include "families/rtdetr/decoder.hpp"
#include "families/rtdetr/encoder.hpp"
#include "models/detector.hpp"
#include "ops/postprocess.hpp"

namespace libreyolo::models::rtdetr {

// The eval forward with what it computed on the way (for inspection and parity checks).
struct EvalTrace {
  std::array<torch::Tensor, 3> backbone, encoder;
  QuerySelection selection;
  torch::Tensor pred_logits, pred_boxes;  // [B, Q, nc], [B, Q, 4] sigmoid cxcywh in [0, 1]
};

// The training-mode forward without denoising queries (what the criterion reads): every decoder
// layer's logits and boxes, then the encoder's top-k proposals (scored by the same matcher as one
// more auxiliary level).
struct TrainOutputs {
  std::array<torch::Tensor, 3> backbone, encoder;
  std::vector<torch::Tensor> logits, boxes;        // per decoder layer: [B, Q, nc], [B, Q, 4]
  torch::Tensor enc_topk_logits, enc_topk_boxes;  // [B, Q, nc], sigmoid of the selected proposals
};

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
  // with and the content queries taken from the encoder are detached.
  TrainOutputs forward_train_outputs(const torch::Tensor& x);

  std::string family_name() const override { return "rtdetr"; }
  std::string size() const override { return cfg_.size; }
  int num_classes() const override { return cfg_.nc; }
  std::vector<int64_t> strides() const override { return {8, 16, 32}; }
  void reset_num_classes(int nc) override;
  std::vector<std::string> freeze_groups() const override { return {"backbone", "encoder", "decoder"}; }
  const Config& config() const { return cfg_; }

  PResNet backbone{nullptr};
  HybridEncoder encoder{nullptr};
  Transformer decoder{nullptr};

 private:
  Config cfg_;
};

// Detections of one image from its pred_logits [Q, nc] and pred_boxes [Q, 4] (normalised
// cxcywh): sigmoid scores flattened query-major (index q * nc + c), the top min(max_det, Q * nc)
// in descending order, then those with score > conf; boxes xyxy scaled to the original image's
// width and height (the stretch undone), not clipped.
ops::Detections postprocess_topk(const torch::Tensor& logits, const torch::Tensor& boxes, double conf, int max_det,
                                 int orig_h, int orig_w);

}  // namespace libreyolo::models::rtdetr
