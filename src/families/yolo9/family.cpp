// The yolo9 registry entry: building, recognising and sizing YOLOv9 weights.

#include "core/log.hpp"
#include "core/strings.hpp"
#include "libreyolo/errors.hpp"
#include "families/yolo9/loss.hpp"
#include "families/yolo9/model.hpp"
#include "ops/postprocess.hpp"

namespace libreyolo::models::yolo9 {

namespace {

// The key as LibreYOLO names it today: without DDP's "module." prefix, with the legacy
// "detect." head prefix renamed to "head.".
std::string canonical_key(const std::string& name) {
  std::string key = io::strip_ddp_prefix(name);
  if (starts_with(key, "detect.")) key.replace(0, 7, "head.");
  return key;
}

// Leading dimension of a weight, if present and at least 1-D.
std::optional<int64_t> out_channels(const io::StateDict& sd, const std::string& key) {
  return io::leading_dim(sd, key, canonical_key);
}

bool can_load(const io::StateDict& sd) {
  bool yolo9 = false;
  for (const auto& kv : sd) {
    const std::string k = lower(canonical_key(kv.first));
    // The end-to-end variant shares the backbone but is a different family.
    if (k.find("one2one_cv2") != std::string::npos || k.find("one2one_cv3") != std::string::npos) {
      return false;
    }
    if (k.find("repncspelan") != std::string::npos || k.find("adown") != std::string::npos ||
        k.find("sppelan") != std::string::npos || starts_with(k, "backbone.elan") ||
        starts_with(k, "neck.elan")) {
      yolo9 = true;
    }
  }
  return yolo9;
}

std::optional<std::string> infer_size(const io::StateDict& sd) {
  const auto c0 = out_channels(sd, "backbone.conv0.conv.weight");
  if (!c0) return std::nullopt;
  if (*c0 == 16) return "t";
  if (*c0 == 64) return "c";
  if (*c0 == 32) {
    const auto e1 = out_channels(sd, "backbone.elan1.cv1.conv.weight");
    if (e1 == 64) return "s";
    if (e1 == 128) return "m";
  }
  return std::nullopt;
}

std::optional<int> infer_num_classes(const io::StateDict& sd) {
  for (int i = 0; i < 3; ++i) {
    if (auto n = out_channels(sd, strfmt("head.cv3.%d.2.weight", i))) return static_cast<int>(*n);
  }
  return std::nullopt;
}

void normalize_keys(io::StateDict& sd) {
  io::StateDict out;
  out.reserve(sd.size());
  for (auto& kv : sd) {
    std::string key = canonical_key(kv.first);
    // The DFL projection was once stored as a conv weight; it is a constant now.
    if (key == "head.dfl.conv.weight") continue;
    out.emplace_back(std::move(key), std::move(kv.second));
  }
  sd = std::move(out);
}

std::shared_ptr<Detector> build(const std::string& size, int nc) {
  return std::make_shared<Yolo9Model>(size, nc);
}

// nc <= 0 takes the class count from the weights.
std::shared_ptr<Detector> build_like(const io::StateDict& sd, int nc) {
  const auto size = infer_size(sd);
  if (!size) {
    throw ModelError("cannot tell the YOLOv9 size from the weights (backbone.conv0 / backbone.elan1 "
                     "missing or of an unknown width)");
  }
  const auto hc = out_channels(sd, "head.cv3.0.0.conv.weight");
  if (!hc) throw ModelError("YOLOv9 weights lack head.cv3.0.0.conv.weight");
  nc = class_count(nc, nc > 0 ? std::nullopt : infer_num_classes(sd), "YOLOv9");
  return std::make_shared<Yolo9Model>(*size, nc, *hc);
}

std::unique_ptr<TrainingLoss> make_loss(const Detector& model) {
  return std::make_unique<loss::Yolo9Loss>(model.num_classes(), model.strides(), static_cast<int>(kRegMax),
                                           model.aux_weight());
}

}  // namespace

Family make_family() {
  Family f("yolo9", size_names(), "t");
  f.default_sync_bn = true;
  f.capture_train_step = true;
  f.capture_inference = true;
  f.aux_prefixes = {"aux.", "aux_head."};
  f.set_weight_functions(build, build_like, can_load, infer_size, infer_num_classes, normalize_keys);
  f.make_loss = make_loss;
  // The defaults of config.hpp are this family's recipe; mosaic closing changes nothing in the step.
  f.train_defaults = {{"name", "yolo9_exp"}};
  f.input = InputSpec{false, 255.0};
  f.postprocess = [](const torch::Tensor& pred, const PostprocessArgs& a) {
    return ops::postprocess_yolo(pred, a.conf, a.iou, a.max_det, a.geometry);
  };
  f.postprocess_batch = [](const torch::Tensor& pred, const std::vector<PostprocessArgs>& args) {
    TORCH_CHECK(!args.empty(), "postprocess_batch: no images");
    std::vector<ops::ImageGeometry> geometry;
    for (const auto& a : args) geometry.push_back(a.geometry);
    const auto& a = args.front();  // thresholds are the call's, the same for every image
    return ops::postprocess_yolo_batch(pred, a.conf, a.iou, a.max_det, geometry);
  };
  return f;
}

}  // namespace libreyolo::models::yolo9
