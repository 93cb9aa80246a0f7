// The yolox registry entry: building, recognising and sizing YOLOX weights, its recipe, the L1
// switch at mosaic close, its input convention and its postprocess.

#include <limits>

#include "core/log.hpp"
#include "core/strings.hpp"
#include "libreyolo/errors.hpp"
#include "families/yolox/loss.hpp"
#include "families/yolox/model.hpp"
#include "ops/postprocess.hpp"

namespace libreyolo::models::yolox {

namespace {

// Without DDP's "module." prefix.
std::string canonical_key(const std::string& key) { return io::strip_ddp_prefix(key); }

std::optional<int64_t> out_channels(const io::StateDict& sd, const std::string& key) {
  return io::leading_dim(sd, key, canonical_key);
}

// YOLOX weights: a key containing "backbone.backbone" or "head.stems", unless another family's
// marker key is present.
bool can_load(const io::StateDict& sd) {
  bool yolox = false;
  for (const auto& kv : sd) {
    const std::string k = canonical_key(kv.first);
    if (k == "backbone.backbone._model.blocks.0.attn.gk_proj.0.weight") return false;
    if (k.find("backbone.backbone") != std::string::npos || k.find("head.stems") != std::string::npos) yolox = true;
  }
  return yolox;
}

std::optional<std::string> infer_size(const io::StateDict& sd) {
  const auto c = out_channels(sd, "backbone.backbone.stem.conv.conv.weight");
  if (!c) return std::nullopt;
  for (const auto& s : size_names())
    if (size_config(s).base_channels() == *c) return s;
  return std::nullopt;
}

std::optional<int> infer_num_classes(const io::StateDict& sd) {
  for (int i = 0; i < 3; ++i)
    if (auto n = out_channels(sd, strfmt("head.cls_preds.%d.weight", i))) return static_cast<int>(*n);
  return std::nullopt;
}

void normalize_keys(io::StateDict& sd) {
  for (auto& kv : sd) kv.first = canonical_key(kv.first);
}

std::shared_ptr<Detector> build(const std::string& size, int nc) { return std::make_shared<YoloxModel>(size, nc); }

// nc <= 0 takes the class count from the weights.
std::shared_ptr<Detector> build_like(const io::StateDict& sd, int nc) {
  const auto size = infer_size(sd);
  if (!size)
    throw ModelError("cannot tell the YOLOX size from the weights (backbone.backbone.stem.conv.conv.weight missing "
                     "or of an unknown width)");
  nc = class_count(nc, nc > 0 ? std::nullopt : infer_num_classes(sd), "YOLOX");
  return std::make_shared<YoloxModel>(*size, nc);
}

std::unique_ptr<TrainingLoss> make_loss(const Detector& model) {
  return std::make_unique<loss::YoloxLoss>(model.num_classes(), model.strides());
}

// Mosaic closes: the L1 term joins the loss.
bool on_close_mosaic(Detector&, TrainingLoss& l) {
  auto* yl = dynamic_cast<loss::YoloxLoss*>(&l);
  if (!yl || yl->use_l1()) return false;
  yl->set_use_l1(true);
  return true;
}

// One label per anchor (the best of obj x cls), strict > conf, then the shared tail: boxes to
// original pixels, clipping, degenerate filter, class-aware NMS.
ops::Detections postprocess(const torch::Tensor& pred, const PostprocessArgs& a) {
  torch::Tensor p = pred.dim() == 3 ? pred[0] : pred;
  if (!p.defined() || p.dim() != 2 || p.size(0) <= 4)
    throw UsageError("yolox postprocess: pred must be a tensor [4 + nc, A] for one image");
  const auto scores = p.slice(0, 4);  // [nc, A]
  const auto best = scores.argmax(0, /*keepdim=*/true);
  // Every class but the best one of each anchor can never pass the threshold.
  auto single = torch::full_like(scores, -std::numeric_limits<double>::infinity());
  single.scatter_(0, best, scores.gather(0, best));
  return ops::postprocess_yolo(torch::cat({p.slice(0, 0, 4), single}, 0), a.conf, a.iou, a.max_det,
                               a.geometry);
}

}  // namespace

Family make_family() {
  Family f("yolox", size_names(), "s");
  f.default_sync_bn = true;  // SyncBN; only has an effect under DDP
  // Forward, SimOTA (dense, fixed shapes, no host reads), loss and backward: capturable. The L1
  // switch invalidates captured steps through on_close_mosaic's return value.
  f.capture_train_step = true;
  f.capture_inference = true;
  f.set_weight_functions(build, build_like, can_load, infer_size, infer_num_classes, normalize_keys);
  f.make_loss = make_loss;
  // LibreYOLO's name for the quadratic warm-up cosine with a flat tail.
  f.scheduler_names = {{"yoloxwarmcos", "cos_flat"}};
  // LibreYOLO's YOLOXConfig where it differs from the defaults of config.hpp.
  f.train_defaults = {
      {"momentum", "0.9"},       {"warmup_momentum", "0.9"}, {"aux_weight", "0"},
      {"nesterov", "true"},      {"scheduler", "yoloxwarmcos"},
      {"warmup_epochs", "5"},    {"warmup_lr_start", "0"},  {"min_lr_ratio", "0.05"},
      {"no_aug_epochs", "15"},   {"mosaic_prob", "1.0"},    {"mixup_prob", "1.0"},
      {"degrees", "10"},         {"translate", "0.1"},      {"shear", "2"},
      {"mosaic_scale", "0.1,2.0"}, {"mixup_scale", "0.5,1.5"},
      {"ema_decay", "0.9998"},   {"eval_interval", "10"},   {"workers", "4"},
      {"name", "yolox_exp"},
  };
  // After the mosaic: the scaled-paste mixup, every box kept, images without boxes only letterboxed.
  f.augment.mixup = data::Mixup::ScaledPaste;
  f.augment.drop_box_side = 0;
  f.augment.augment_empty = false;
  f.on_close_mosaic = on_close_mosaic;
  f.input = InputSpec{/*bgr=*/true, /*divisor=*/1.0};
  f.postprocess = postprocess;
  f.train_val_thresholds = ops::kTrainValThresholds;  // conf 0.001, iou 0.65, max_det 300
  return f;
}

}  // namespace libreyolo::models::yolox
