// The yolo7 registry entry: building, recognising and sizing YOLOv7 weights (LibreYOLO's and the
// upstream flat ones), its loss and recipe, its input convention and its single-label postprocess.

#include <limits>

#include "core/log.hpp"
#include "core/strings.hpp"
#include "families/yolo7/loss.hpp"
#include "families/yolo7/model.hpp"
#include "libreyolo/errors.hpp"
#include "ops/postprocess.hpp"

namespace libreyolo::models::yolo7 {

namespace {

constexpr const char* kMarker = "implicit_a.implicit";  // the implicit-knowledge head: YOLOv7's alone

std::string canonical_key(const std::string& key) { return io::strip_ddp_prefix(key); }

bool has_marker(const io::StateDict& sd) {
  for (const auto& kv : sd)
    if (kv.first.find(kMarker) != std::string::npos) return true;
  return false;
}

bool can_load(const io::StateDict& sd) { return has_marker(sd); }

// Without DDP's prefix; upstream's flat weights ("0.conv.weight", ...) under the layer list.
void normalize_keys(io::StateDict& sd) {
  bool listed = false;
  for (auto& kv : sd) {
    kv.first = canonical_key(kv.first);
    listed = listed || starts_with(kv.first, "layers.");
  }
  if (listed || !has_marker(sd)) return;
  for (auto& kv : sd) kv.first = "layers." + kv.first;
}

io::StateDict normalized(const io::StateDict& sd) {
  io::StateDict out = sd;
  normalize_keys(out);
  return out;
}

std::optional<std::string> infer_size(const io::StateDict& sd) {
  if (!can_load(sd)) return std::nullopt;
  return "b";
}

std::optional<int> infer_num_classes(const io::StateDict& sd) {
  for (const auto& kv : sd) {
    const std::string suffix = "heads.0.head_conv.weight";
    const std::string& k = kv.first;
    if (k.size() >= suffix.size() && k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        kv.second.dim() >= 1) {
      const int64_t n = kv.second.size(0) / kAnchorsPerCell - 5;
      if (n >= 1) return static_cast<int>(n);
    }
  }
  return std::nullopt;
}

std::shared_ptr<Detector> build(const std::string& size, int nc) {
  return std::make_shared<Yolo7Model>(size_width(size), nc);
}

// The width read from the first layer (every other width is a multiple of it); nc <= 0 takes the
// class count from the weights.
std::shared_ptr<Detector> build_like(const io::StateDict& sd, int nc) {
  const io::StateDict keys = normalized(sd);
  const auto width = io::leading_dim(keys, "layers.0.conv.weight", canonical_key);
  if (!width) throw ModelError("cannot tell the YOLOv7 widths from the weights (layers.0.conv.weight missing)");
  nc = class_count(nc, nc > 0 ? std::nullopt : infer_num_classes(keys), "YOLOv7");
  return std::make_shared<Yolo7Model>(*width, nc);
}

std::unique_ptr<TrainingLoss> make_loss(const Detector& model) {
  return std::make_unique<Yolo7Loss>(model.num_classes());
}

// Keeps, for every anchor, only its best class's score (the others at -inf, never above conf):
// one label per prediction. pred [..., 4 + nc, A].
torch::Tensor best_class_only(const torch::Tensor& pred) {
  const int64_t dim = pred.dim() - 2;
  const auto scores = pred.narrow(dim, 4, pred.size(dim) - 4);
  const auto best = scores.argmax(dim, /*keepdim=*/true);
  auto single = torch::full_like(scores, -std::numeric_limits<double>::infinity());
  single.scatter_(dim, best, scores.gather(dim, best));
  return torch::cat({pred.narrow(dim, 0, 4), single}, dim);
}

// One label per anchor (the best of obj x cls), strict > conf, then the shared tail: boxes to the
// original pixels, clipping, the degenerate filter, class-aware NMS.
ops::Detections postprocess(const torch::Tensor& pred, const PostprocessArgs& a) {
  const torch::Tensor p = pred.dim() == 3 ? pred[0] : pred;
  if (!p.defined() || p.dim() != 2 || p.size(0) <= 4)
    throw UsageError("yolo7 postprocess: pred must be a tensor [4 + nc, A] for one image");
  return ops::postprocess_yolo(best_class_only(p), a.conf, a.iou, a.max_det, a.geometry);
}

std::vector<ops::Detections> postprocess_batch(const torch::Tensor& pred, const std::vector<PostprocessArgs>& args) {
  if (args.empty()) throw UsageError("yolo7 postprocess: no images");
  if (!pred.defined() || pred.dim() != 3 || pred.size(1) <= 4)
    throw UsageError("yolo7 postprocess: pred must be a tensor [B, 4 + nc, A]");
  std::vector<ops::ImageGeometry> geometry;
  for (const auto& a : args) geometry.push_back(a.geometry);
  const auto& a = args.front();  // thresholds are the call's, the same for every image
  return ops::postprocess_yolo_batch(best_class_only(pred), a.conf, a.iou, a.max_det, geometry);
}

}  // namespace

Family make_family() {
  Family f("yolo7", size_names(), "b");
  f.default_sync_bn = true;  // SyncBN; only has an effect under DDP
  // The eval forward's replay equals eager bit for bit (GpuInferenceGraph.ReplayEqualsEagerBitForBit-
  // OnTwoProbes): capture_inference. The loss has fixed shapes and no host reads, and graphed
  // training steps equal eager ones bit for bit (GpuYolo7.GraphedTrainingStepsEqualEagerBitForBit):
  // capture_train_step.
  f.capture_inference = true;
  f.capture_train_step = true;
  f.set_weight_functions(build, build_like, can_load, infer_size, infer_num_classes, normalize_keys);
  f.make_loss = make_loss;
  // LibreYOLO's name for the quadratic warm-up cosine with a flat tail.
  f.scheduler_names = {{"yoloxwarmcos", "cos_flat"}};
  // LibreYOLO's YOLOv7Config where it differs from the defaults of config.hpp: the YOLOX schedule
  // and augmentation with SGD momentum 0.937 (no momentum warm-up), 3 warm-up epochs, EMA 0.9999.
  f.train_defaults = {
      {"warmup_momentum", "0.937"}, {"aux_weight", "0"},       {"scheduler", "yoloxwarmcos"},
      {"warmup_lr_start", "0"},     {"min_lr_ratio", "0.05"},  {"mixup_prob", "1.0"},
      {"degrees", "10"},            {"shear", "2"},            {"mosaic_scale", "0.1,2.0"},
      {"eval_interval", "10"},      {"workers", "4"},          {"name", "yolo7_exp"},
  };
  // The optimizer's groups: BatchNorm weights, biases and the head's implicit tensors without
  // decay, the convolution weights with it.
  f.param_rules = {
      {{}, {"bn.", "bias", "implicit"}, /*decay=*/false, /*backbone_lr=*/false},
      {{}, {}, /*decay=*/true, /*backbone_lr=*/false},
  };
  // After the mosaic: the default recipe (Beta(32, 32) blend with a plain partner, boxes of at
  // most 2 pixels dropped, up to 100 boxes a sample).
  // RGB / 255, letterboxed to the top-left with 114 (as YOLOv9).
  f.input = InputSpec{false, 255.0};
  f.postprocess = postprocess;
  f.postprocess_batch = postprocess_batch;
  f.train_val_thresholds = ops::kTrainValThresholds;  // conf 0.001, iou 0.65, max_det 300
  return f;
}

}  // namespace libreyolo::models::yolo7
