#include "families/rtdetr/model.hpp"

#include <algorithm>

#include "libreyolo/errors.hpp"

namespace libreyolo::models::rtdetr {

RtdetrModel::RtdetrModel(const Config& cfg) : cfg_(cfg) {
  dn_options_.count = cfg_.denoising;
  if (cfg_.hgnet)
    hgnet = register_module("backbone", HGNetv2(*cfg_.hgnet, cfg_.frozen_norm));
  else
    presnet = register_module("backbone", PResNet(cfg_));
  encoder = register_module("encoder", HybridEncoder(cfg_));
  decoder = register_module("decoder", Transformer(cfg_));
}

std::array<torch::Tensor, 3> RtdetrModel::backbone_forward(const torch::Tensor& x) {
  return hgnet ? hgnet->forward(x) : presnet->forward(x);
}

EvalTrace RtdetrModel::forward_trace(const torch::Tensor& x) {
  EvalTrace t;
  t.backbone = backbone_forward(x);
  t.encoder = encoder->forward(t.backbone);
  std::tie(t.pred_logits, t.pred_boxes) = decoder->forward(t.encoder, &t.selection);
  return t;
}

TrainOutputs RtdetrModel::forward_train_outputs(const torch::Tensor& x, const std::vector<ImageTargets>& gts) {
  if (!is_training()) throw UsageError("RT-DETR: the training outputs need the model in training mode");
  const auto backbone = backbone_forward(x);
  TrainOutputs t = decoder_train_outputs(encoder->forward(backbone), gts);
  t.backbone = backbone;
  return t;
}

TrainOutputs RtdetrModel::decoder_train_outputs(const std::array<torch::Tensor, 3>& encoded,
                                                const std::vector<ImageTargets>& gts) {
  TrainOutputs t;
  t.encoder = encoded;
  const auto [memory, shapes] = decoder->encoder_memory(t.encoder);
  const auto s = decoder->select_queries(memory, shapes);
  auto target = s.target, ref_unact = s.ref_unact;
  torch::Tensor mask;
  if (decoder->denoising_class_embed && !gts.empty())
    t.denoising = make_denoising_group(gts, cfg_.nc, cfg_.queries, dn_options_, dn_source_);
  if (t.denoising) {
    const auto& dn = *t.denoising;
    const auto embed = decoder->denoising_class_embed->forward(dn.labels.to(target.device()));
    target = torch::cat({embed.to(target.scalar_type()), target}, 1);
    ref_unact = torch::cat({dn.box_unact.to(ref_unact.device(), ref_unact.scalar_type()), ref_unact}, 1);
    mask = dn.attn_mask.to(target.device());
  }
  auto out = decoder->decode(target, ref_unact, memory, shapes, mask);
  const int64_t n = t.denoising ? t.denoising->queries : 0, q = s.target.size(1);
  for (size_t l = 0; l < out.logits.size(); ++l) {
    t.logits.push_back(out.logits[l].narrow(1, n, q));
    t.boxes.push_back(out.boxes[l].narrow(1, n, q));
    if (n == 0) continue;
    t.dn_logits.push_back(out.logits[l].narrow(1, 0, n));
    t.dn_boxes.push_back(out.boxes[l].narrow(1, 0, n));
  }
  t.enc_topk_logits = s.topk_logits;
  t.enc_topk_boxes = torch::sigmoid(s.ref_unact);
  t.enc_aux_level = cfg_.v2.enc_aux_level;
  if (t.denoising) {
    t.dn_groups = t.denoising->groups;
    t.dn_pairs = denoising_pairs(*t.denoising);
  }
  return t;
}

std::vector<torch::Tensor> RtdetrModel::forward_train(const torch::Tensor& x, const torch::Tensor& targets) {
  if (!is_training()) return forward_raw(x);
  return train_tail(Seam::Head, train_head(Seam::Head, x, {}), x, targets, {});
}

std::vector<torch::Tensor> RtdetrModel::head_parameters(Seam seam) {
  if (seam == Seam::Network) return parameters();
  std::vector<torch::Tensor> p = hgnet ? hgnet->parameters() : presnet->parameters();
  for (const auto& e : encoder->parameters()) p.push_back(e);
  return p;
}

SeamInputs RtdetrModel::seam_inputs(Seam seam, const torch::Tensor& targets) {
  if (seam == Seam::Head) return {};
  if (!targets.defined()) throw UsageError("RT-DETR: the network seam needs the batch's targets");
  const bool denoising = decoder->denoising_class_embed && dn_options_.count > 0;
  const auto group = denoising ? make_denoising_group(split_targets(targets), cfg_.nc, cfg_.queries, dn_options_,
                                                      dn_source_)
                               : std::nullopt;
  return denoising_seam_inputs(group, denoising, targets.size(0), dn_options_.count, cfg_.nc, cfg_.queries,
                               targets.device());
}

std::vector<torch::Tensor> RtdetrModel::train_head(Seam seam, const torch::Tensor& x,
                                                   const std::vector<torch::Tensor>& head_inputs) {
  if (x.dim() != 4 || x.size(1) != 3)
    throw UsageError("RT-DETR expects images [B, 3, H, W], got " + c10::str(x.sizes()));
  const auto e = encoder->forward(backbone_forward(x));
  if (seam == Seam::Head) return {e[0], e[1], e[2]};
  if (!is_training()) throw UsageError("RT-DETR: the training outputs need the model in training mode");
  const auto [memory, shapes] = decoder->encoder_memory(e);
  const auto s = decoder->select_queries(memory, shapes);
  auto target = s.target, ref_unact = s.ref_unact;
  torch::Tensor mask;
  prepend_denoising(decoder->denoising_class_embed, head_inputs, target, ref_unact, mask);
  const auto out = decoder->decode(target, ref_unact, memory, shapes, mask);
  std::vector<torch::Tensor> head = out.logits;
  head.insert(head.end(), out.boxes.begin(), out.boxes.end());
  head.push_back(s.topk_logits);
  head.push_back(torch::sigmoid(s.ref_unact));
  return head;
}

std::vector<torch::Tensor> RtdetrModel::train_tail(Seam seam, const std::vector<torch::Tensor>& head,
                                                   const torch::Tensor& x, const torch::Tensor& targets,
                                                   const SeamInputs& inputs) {
  if (!is_training()) throw UsageError("RT-DETR: the training outputs need the model in training mode");
  if (seam == Seam::Head) {
    if (head.size() != 3) throw UsageError("RT-DETR: the training head gives the encoder's 3 levels");
    const auto gts = targets.defined() ? split_targets(targets) : std::vector<ImageTargets>{};
    return pack_train_outputs(decoder_train_outputs({head[0], head[1], head[2]}, gts), x.size(2), x.size(3));
  }
  const size_t layers = head.size() >= 4 ? (head.size() - 2) / 2 : 0;
  if (layers == 0 || head.size() != 2 * layers + 2)
    throw UsageError("RT-DETR: the network seam gives every decoder layer's logits and boxes and the encoder top-k");
  const auto [n, groups] = denoising_counts(inputs);
  const int64_t q = cfg_.queries;
  const int64_t slots = inputs.head.empty() ? 0 : inputs.head[0].size(1);
  TrainOutputs t;
  for (size_t l = 0; l < layers; ++l) {
    t.logits.push_back(head[l].narrow(1, slots, q));
    t.boxes.push_back(head[layers + l].narrow(1, slots, q));
    if (n == 0) continue;
    t.dn_logits.push_back(head[l].narrow(1, 0, n));
    t.dn_boxes.push_back(head[layers + l].narrow(1, 0, n));
  }
  t.enc_topk_logits = head[2 * layers];
  t.enc_topk_boxes = head[2 * layers + 1];
  t.enc_aux_level = cfg_.v2.enc_aux_level;
  if (n > 0) {
    t.dn_groups = groups;
    t.dn_pairs = inputs.tail[1];
  }
  return pack_train_outputs(t, x.size(2), x.size(3));
}

std::vector<torch::Tensor> pack_train_outputs(const TrainOutputs& t, int64_t input_h, int64_t input_w) {
  const size_t layers = t.logits.size();
  if (layers == 0 || t.boxes.size() != layers) throw UsageError("RT-DETR: training outputs without decoder layers");
  const int64_t dn = static_cast<int64_t>(t.dn_logits.size());
  const int64_t aux = static_cast<int64_t>(layers) - (t.enc_aux_level ? 1 : 0);
  const int64_t groups = dn > 0 ? t.dn_groups : 0;
  const auto counts = t.enc_aux_level ? torch::tensor({aux, dn, groups, int64_t{1}}, torch::kLong)
                                      : torch::tensor({aux, dn, groups}, torch::kLong);
  std::vector<torch::Tensor> raw = {t.logits.back(), t.boxes.back(), torch::tensor({input_h, input_w}, torch::kLong),
                                    counts};
  for (size_t l = 0; l + 1 < layers; ++l) {
    raw.push_back(t.logits[l]);
    raw.push_back(t.boxes[l]);
  }
  raw.push_back(t.enc_topk_logits);
  raw.push_back(t.enc_topk_boxes);
  for (int64_t l = 0; l < dn; ++l) {
    raw.push_back(t.dn_logits[l]);
    raw.push_back(t.dn_boxes[l]);
  }
  if (dn > 0) raw.push_back(t.dn_pairs);
  return raw;
}

CriterionInputs unpack_train_outputs(const std::vector<torch::Tensor>& raw) {
  if (raw.size() < 4 || raw[3].dim() != 1 || (raw[3].numel() != 3 && raw[3].numel() != 4) ||
      raw[3].scalar_type() != torch::kLong)
    throw UsageError("RT-DETR loss: the outputs are not the training layout (forward_train in training mode)");
  const auto counts = raw[3].to(torch::kCPU);
  const int64_t aux = counts[0].item<int64_t>(), dn = counts[1].item<int64_t>();
  const int64_t enc = counts.numel() == 4 ? counts[3].item<int64_t>() : 0;
  const size_t want = static_cast<size_t>(4 + 2 * aux + 2 * enc + 2 * dn + (dn > 0 ? 1 : 0));
  if (aux < 0 || dn < 0 || enc < 0 || raw.size() != want)
    throw UsageError("RT-DETR loss: " + std::to_string(raw.size()) + " training outputs, the layout says " +
                     std::to_string(want));
  CriterionInputs in;
  in.last = {raw[0], raw[1]};
  const auto hw = raw[2].to(torch::kCPU);
  in.input_h = hw[0].item<int64_t>();
  in.input_w = hw[1].item<int64_t>();
  size_t i = 4;
  for (int64_t l = 0; l < aux; ++l, i += 2) in.aux.push_back({raw[i], raw[i + 1]});
  for (int64_t l = 0; l < enc; ++l, i += 2) in.enc.push_back({raw[i], raw[i + 1]});
  for (int64_t l = 0; l < dn; ++l, i += 2) in.dn.push_back({raw[i], raw[i + 1]});
  if (dn > 0) {
    in.dn_groups = counts[2].item<int64_t>();
    in.dn_pairs = raw[i].to(torch::kCPU);
  }
  return in;
}

std::vector<torch::Tensor> RtdetrModel::forward_raw(const torch::Tensor& x) {
  if (x.dim() != 4 || x.size(1) != 3)
    throw UsageError("RT-DETR expects images [B, 3, H, W], got " + c10::str(x.sizes()));
  const auto [logits, boxes] = decoder->forward(encoder->forward(backbone_forward(x)));
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
