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

class RtdetrModel : public Detector {
 public:
  explicit RtdetrModel(const Config& cfg);

  // {pred_logits [B, Q, nc], pred_boxes [B, Q, 4] (normalised cxcywh), input size int64 [2]
  // (h, w) on the CPU}: the eval outputs (the layer eval_idx). Training outputs (every layer,
  // the encoder top-k, denoising) are not part of this forward.
  std::vector<torch::Tensor> forward_raw(const torch::Tensor& x) override;
  // [B, 4 + nc, Q]: xyxy in input pixels (cxcywh scaled by the input's width and height), then
  // sigmoid class scores.
  torch::Tensor decode(const std::vector<torch::Tensor>& raw) override;
  EvalTrace forward_trace(const torch::Tensor& x);

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
