#include "families/rtdetr/model.hpp"

#include <algorithm>

#include "libreyolo/errors.hpp"

namespace libreyolo::models::rtdetr {

RtdetrModel::RtdetrModel(const Config& cfg) : cfg_(cfg) {
  backbone = register_module("backbone", PResNet(cfg_));
  encoder = register_module("encoder", HybridEncoder(cfg_));
  decoder = register_module("decoder", Transformer(cfg_));
}

EvalTrace RtdetrModel::forward_trace(const torch::Tensor& x) {
  EvalTrace t;
  t.backbone = backbone->forward(x);
  t.encoder = encoder->forward(t.backbone);
  std::tie(t.pred_logits, t.pred_boxes) = decoder->forward(t.encoder, &t.selection);
  return t;
}

TrainOutputs RtdetrModel::forward_train_outputs(const torch::Tensor& x) {
  if (!is_training()) throw UsageError("RT-DETR: the training outputs need the model in training mode");
  TrainOutputs t;
  t.backbone = backbone->forward(x);
  t.encoder = encoder->forward(t.backbone);
  const auto [memory, shapes] = decoder->encoder_memory(t.encoder);
  const auto s = decoder->select_queries(memory, shapes);
  auto out = decoder->decode(s.target, s.ref_unact, memory, shapes);
  t.logits = std::move(out.logits);
  t.boxes = std::move(out.boxes);
  t.enc_topk_logits = s.topk_logits;
  t.enc_topk_boxes = torch::sigmoid(s.ref_unact);
  return t;
}

std::vector<torch::Tensor> RtdetrModel::forward_raw(const torch::Tensor& x) {
  if (x.dim() != 4 || x.size(1) != 3)
    throw UsageError("RT-DETR expects images [B, 3, H, W], got " + c10::str(x.sizes()));
  const auto [logits, boxes] = decoder->forward(encoder->forward(backbone->forward(x)));
  return {logits, boxes, torch::tensor({x.size(2), x.size(3)}, torch::kLong)};
}

torch::Tensor RtdetrModel::decode(const std::vector<torch::Tensor>& raw) {
  if (raw.size() != 3) throw UsageError("RT-DETR decode takes {pred_logits, pred_boxes, input size}");
  const auto& boxes = raw[1];
  const double h = static_cast<double>(raw[2][0].item<int64_t>()), w = static_cast<double>(raw[2][1].item<int64_t>());
  const auto cx = boxes.select(2, 0) * w, cy = boxes.select(2, 1) * h;
  const auto bw = boxes.select(2, 2) * w, bh = boxes.select(2, 3) * h;
  const auto xyxy = torch::stack({cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2}, 1);  // [B, 4, Q]
  return torch::cat({xyxy, torch::sigmoid(raw[0]).transpose(1, 2).to(xyxy.scalar_type())}, 1);
}

void RtdetrModel::reset_num_classes(int nc) {
  decoder->reset_num_classes(nc);
  cfg_.nc = nc;
}

ops::Detections postprocess_topk(const torch::Tensor& logits, const torch::Tensor& boxes, double conf, int max_det,
                                 int orig_h, int orig_w) {
  if (logits.dim() != 2 || boxes.dim() != 2 || boxes.size(1) != 4 || boxes.size(0) != logits.size(0))
    throw UsageError("RT-DETR postprocess: logits [Q, nc] and boxes [Q, 4] for one image");
  const int64_t nc = logits.size(1);
  const auto scores = torch::sigmoid(logits.to(torch::kFloat)).flatten();
  const int64_t k = std::min<int64_t>(max_det, scores.numel());
  const auto [top, idx] = torch::topk(scores, k, 0, /*largest=*/true, /*sorted=*/true);
  const auto q = torch::div(idx, nc, "floor");
  const auto b = boxes.to(torch::kFloat).index_select(0, q);
  const double W = orig_w, H = orig_h;
  const auto cx = b.select(1, 0), cy = b.select(1, 1), hw = b.select(1, 2) / 2, hh = b.select(1, 3) / 2;
  const auto xyxy = torch::stack({(cx - hw) * W, (cy - hh) * H, (cx + hw) * W, (cy + hh) * H}, 1);
  const auto keep = top > conf;
  ops::Detections d;
  d.boxes = xyxy.index({keep}).cpu();
  d.scores = top.index({keep}).cpu();
  d.classes = torch::remainder(idx, nc).index({keep}).cpu();
  return d;
}

}  // namespace libreyolo::models::rtdetr
