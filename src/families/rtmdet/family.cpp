// The rtmdet registry entry: building, recognising and sizing RTMDet weights (LibreYOLO's and
// upstream mmdetection's "bbox_head." ones), its recipe, its input convention (BGR 0-255 with
// a per-channel mean and standard deviation) and its per-level multi-label postprocess.

#include <algorithm>
#include <map>

#include "core/log.hpp"
#include "core/strings.hpp"
#include "families/rtmdet/loss.hpp"
#include "families/rtmdet/model.hpp"
#include "libreyolo/errors.hpp"
#include "loss/loss.hpp"
#include "ops/nms.hpp"
#include "ops/postprocess.hpp"

namespace libreyolo::models::rtmdet {

namespace {

// Candidates each level keeps before NMS (mmdetection's nms_pre of the detection configs).
constexpr int64_t kNmsPre = 30000;

// Without DDP's prefix, upstream's "bbox_head." as LibreYOLO's "head.".
std::string canonical_key(const std::string& key) {
  std::string k = io::strip_ddp_prefix(key);
  if (starts_with(k, "bbox_head.")) k = "head." + k.substr(10);
  return k;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The RTMDet heads' prediction convolutions are named by no other family.
bool can_load(const io::StateDict& sd) {
  for (const auto& kv : sd)
    if (contains(kv.first, "rtm_cls") || contains(kv.first, "rtm_reg")) return true;
  return false;
}

// LibreYOLO's names; upstream's preprocessing constants ("data_preprocessor.*") dropped; the
// head's per-level copies of the shared convolutions take level 0's value (they are one tensor in
// the model, and level 0's name is the one that counts).
void normalize_keys(io::StateDict& sd) {
  io::StateDict out;
  out.reserve(sd.size());
  for (auto& kv : sd) {
    const std::string k = canonical_key(kv.first);
    if (starts_with(k, "data_preprocessor.")) continue;
    out.emplace_back(k, kv.second);
  }
  std::map<std::string, torch::Tensor> level0;
  for (const auto& kv : out)
    for (const char* tower : {"head.cls_convs.0.", "head.reg_convs.0."})
      if (starts_with(kv.first, tower) && has_suffix(kv.first, ".conv.weight")) level0[kv.first] = kv.second;
  for (auto& kv : out)
    for (const char* tower : {"head.cls_convs.", "head.reg_convs."}) {
      const std::string t = tower;
      if (!starts_with(kv.first, t) || !has_suffix(kv.first, ".conv.weight")) continue;
      const auto dot = kv.first.find('.', t.size());
      if (dot == std::string::npos || kv.first.compare(t.size(), dot - t.size(), "0") == 0) continue;
      auto it = level0.find(t + "0" + kv.first.substr(dot));
      if (it != level0.end()) kv.second = it->second;
    }
  sd = std::move(out);
}

std::optional<int64_t> out_channels(const io::StateDict& sd, const std::string& key) {
  return io::leading_dim(sd, key, canonical_key);
}

std::optional<std::string> infer_size(const io::StateDict& sd) {
  const auto c = out_channels(sd, "backbone.stem.0.conv.weight");
  if (!c) return std::nullopt;
  return size_of_stem(*c);
}

std::optional<int> infer_num_classes(const io::StateDict& sd) {
  if (auto n = out_channels(sd, "head.rtm_cls.0.weight")) return static_cast<int>(*n);
  return std::nullopt;
}

// How many "<prefix><j>.<suffix>" entries there are for j = 0, 1, ... (a block list's length).
int64_t count_blocks(const io::StateDict& sd, const std::string& prefix, const std::string& suffix) {
  int64_t n = 0;
  while (io::find_tensor(sd, prefix + std::to_string(n) + "." + suffix, canonical_key)) ++n;
  return n;
}

// Every width and depth from the tensors' shapes and the block lists' lengths. exp_on_reg is not
// in the weights: LibreYOLO's sizes have it exactly when the neck's CSP layers hold more than one
// block (t, s: 1; m, l, x: 2, 3, 4), and that rule decides it here.
Arch arch_from_weights(const io::StateDict& sd) {
  const auto need = [&](const std::string& key) {
    const auto c = out_channels(sd, key);
    if (!c) throw ModelError("cannot tell the RTMDet widths from the weights (" + key + " missing)");
    return *c;
  };
  Arch a;
  a.stem = need("backbone.stem.0.conv.weight");
  a.stem_out = need("backbone.stem.2.conv.weight");
  for (int i = 0; i < 4; ++i) {
    const std::string stage = "backbone.stage" + std::to_string(i + 1) + ".";
    a.stage[i] = need(stage + "0.conv.weight");
    a.blocks[i] = count_blocks(sd, stage + (i == 3 ? "2" : "1") + ".blocks.", "conv1.conv.weight");
    if (a.blocks[i] < 1) throw ModelError("cannot tell the RTMDet depths from the weights (" + stage + " has no blocks)");
  }
  a.neck_blocks = count_blocks(sd, "neck.top_down_blocks.0.blocks.", "conv1.conv.weight");
  if (a.neck_blocks < 1) throw ModelError("cannot tell the RTMDet neck depth from the weights");
  a.width = need("neck.out_convs.0.conv.weight");
  a.exp_on_reg = a.neck_blocks > 1;
  return a;
}

std::shared_ptr<Detector> build(const std::string& size, int nc) {
  return std::make_shared<RTMDetModel>(size_arch(size), nc);
}

// nc <= 0 takes the class count from the weights. RTMDet-Ins weights (a mask head: "rtm_kernel",
// ".mask_head.") are refused: only the detection network is here.
std::shared_ptr<Detector> build_like(const io::StateDict& sd, int nc) {
  for (const auto& kv : sd)
    if (contains(kv.first, "rtm_kernel") || contains(kv.first, ".mask_head."))
      throw ModelError("these are RTMDet-Ins (instance segmentation) weights: " + kv.first,
                       "only RTMDet detection weights are supported", "model_unsupported_task");
  const Arch a = arch_from_weights(sd);
  nc = class_count(nc, nc > 0 ? std::nullopt : infer_num_classes(sd), "RTMDet");
  return std::make_shared<RTMDetModel>(a, nc);
}

std::unique_ptr<TrainingLoss> make_loss(const Detector& model) {
  return std::make_unique<RtmdetLoss>(model.num_classes());
}

// Level sizes (cells) of A predictions at strides 8, 16, 32 of an input whose sides are multiples
// of 32: H W / 64, H W / 256 and H W / 1024, i.e. 16/21, 4/21 and 1/21 of A.
std::array<int64_t, 3> level_counts(int64_t a) {
  if (a % 21 != 0) throw UsageError(strfmt("rtmdet postprocess: %lld predictions are not three levels of strides 8, 16, 32",
                                           static_cast<long long>(a)));
  return {a / 21 * 16, a / 21 * 4, a / 21};
}

// One image, as LibreYOLO (after mmdetection): per level every (prediction, class) pair with score
// > conf is a candidate (several classes per prediction), the level's best kNmsPre kept; then
// boxes divided by the fit's scales, clipped to the original image, those of width or height
// <= 0 or not finite dropped, class-aware NMS at `iou`, the best max_det by score.
ops::Detections postprocess(const torch::Tensor& pred, const PostprocessArgs& a) {
  const torch::Tensor p = pred.dim() == 3 && pred.size(0) == 1 ? pred[0] : pred;
  if (!p.defined() || p.dim() != 2 || p.size(0) <= 4 || !at::isFloatingType(p.scalar_type()))
    throw UsageError("rtmdet postprocess: pred must be a floating tensor [4 + nc, A] for one image");
  if (a.max_det < 1) throw UsageError("rtmdet postprocess: max_det must be >= 1");
  const auto counts = level_counts(p.size(1));
  const auto boxes_all = p.narrow(0, 0, 4).t();   // [A, 4]
  const auto scores_all = p.narrow(0, 4, p.size(0) - 4).t();  // [A, nc]
  std::vector<torch::Tensor> boxes, scores, classes;
  int64_t start = 0;
  for (int64_t n : counts) {
    const auto s = scores_all.narrow(0, start, n);
    const auto idx = (s > a.conf).nonzero();  // [M, 2] (prediction, class), row-major
    if (idx.size(0) > 0) {
      auto flat = s.index({idx.select(1, 0), idx.select(1, 1)});
      auto order = std::get<1>(flat.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
      if (order.size(0) > kNmsPre) order = order.narrow(0, 0, kNmsPre);
      const auto keep = idx.index_select(0, order);
      scores.push_back(flat.index_select(0, order));
      classes.push_back(keep.select(1, 1));
      boxes.push_back(boxes_all.index_select(0, keep.select(1, 0) + start));
    }
    start += n;
  }
  if (boxes.empty()) return ops::no_detections();
  auto b = torch::cat(boxes).to(torch::kFloat).clone();
  auto sc = torch::cat(scores).to(torch::kFloat);
  auto cl = torch::cat(classes);
  const auto& g = a.geometry;
  // The content starts at the input's top-left corner: x / sx, y / sy, clipped to the original.
  b.select(1, 0).div_(g.sx).clamp_(0, g.orig_w);
  b.select(1, 2).div_(g.sx).clamp_(0, g.orig_w);
  b.select(1, 1).div_(g.sy).clamp_(0, g.orig_h);
  b.select(1, 3).div_(g.sy).clamp_(0, g.orig_h);
  return ops::nms_detections(b, sc, cl, a.iou, a.max_det);
}

}  // namespace

Family make_family() {
  Family f("rtmdet", size_names(), "s");
  f.default_sync_bn = true;  // SyncBN; only has an effect under DDP
  // The eval forward's replay equals eager bit for bit (GpuInferenceGraph.ReplayEqualsEagerBitForBit-
  // OnTwoProbes): capture_inference. Graphed training steps equal eager ones bit for bit
  // (GpuFamilyStepGraph/Dense.GraphedTrainingStepsEqualEagerBitForBit/rtmdet): capture_train_step.
  f.capture_inference = true;
  f.capture_train_step = true;
  f.set_weight_functions(build, build_like, can_load, infer_size, infer_num_classes, normalize_keys);
  f.make_loss = make_loss;
  // LibreYOLO's RTMDetConfig where it differs from the defaults of config.hpp: AdamW at 0.004
  // (decay 0.05), its "cos" schedule (a quadratic warm-up of one epoch from 4e-8, a cosine to 5% of
  // lr0 and a flat tail over the 20 epochs without mosaic: cos_flat here), mosaic and mixup with
  // the scale jitter but no rotation, shear or translation, EMA 0.9998.
  f.train_defaults = {
      {"optimizer", "adamw"},       {"lr0", "0.004"},           {"momentum", "0.9"},
      {"weight_decay", "0.05"},     {"scheduler", "cos_flat"},  {"warmup_epochs", "1"},
      {"warmup_lr_start", "4e-8"},  {"min_lr_ratio", "0.05"},   {"no_aug_epochs", "20"},
      {"mosaic_prob", "1.0"},       {"mixup_prob", "1.0"},      {"degrees", "0"},
      {"translate", "0"},           {"shear", "0"},             {"mosaic_scale", "0.1,2.0"},
      {"mixup_scale", "0.5,1.5"},   {"ema_decay", "0.9998"},    {"eval_interval", "10"},
      {"workers", "4"},             {"name", "rtmdet_exp"},      {"aux_weight", "0"},
  };
  // The shared YOLOX pipeline after the mosaic: the scaled-paste mixup, up to 120 boxes a sample.
  f.augment.mixup = data::Mixup::ScaledPaste;
  f.augment.drop_box_side = 0;
  f.augment.augment_empty = false;
  f.augment.max_labels = 120;
  // BGR 0-255 minus mmdetection's mean, over its standard deviation (per BGR channel), letterboxed
  // to the top-left with 114.
  f.input.bgr = true;
  f.input.divisor = 1.0;
  f.input.mean = {103.53, 116.28, 123.675};
  f.input.stddev = {57.375, 57.12, 58.395};
  f.postprocess = postprocess;
  f.train_val_thresholds = ops::kTrainValThresholds;  // conf 0.001, iou 0.65, max_det 300
  return f;
}

}  // namespace libreyolo::models::rtmdet
