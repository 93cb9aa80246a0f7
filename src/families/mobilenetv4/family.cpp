// The mobilenetv4 registry entry: the classify task's MobileNetV4 conv-s/m/l, recognised from
// its key names (conv_stem, universal inverted bottlenecks' pw_exp, conv_head), every block's kind,
// kernels and widths read from the weights' shapes (each stage but the last starts at stride 2),
// the classification recipe and its eval geometry (crop_pct 0.875 for s, 0.95 for m and l; input
// 224, l 256).
#include <optional>

#include "core/strings.hpp"
#include "families/mobilenetv4/model.hpp"
#include "libreyolo/errors.hpp"
#include "families/classify_recipe.hpp"
#include "models/classifier.hpp"

namespace libreyolo::models::mobilenetv4 {

namespace {

std::string canonical_key(const std::string& key) { return io::strip_ddp_prefix(key); }

const torch::Tensor* tensor(const io::StateDict& sd, const std::string& key) {
  return io::find_tensor(sd, key, canonical_key);
}

bool has_prefix(const io::StateDict& sd, const std::string& prefix) {
  for (const auto& kv : sd)
    if (canonical_key(kv.first).rfind(prefix, 0) == 0) return true;
  return false;
}

bool can_load(const io::StateDict& sd) {
  if (!tensor(sd, "conv_stem.weight") || !tensor(sd, "conv_head.weight") || !tensor(sd, "classifier.weight"))
    return false;
  bool uir = false;
  for (const auto& kv : sd) {
    const std::string k = canonical_key(kv.first);
    uir = uir || k.find(".pw_exp.conv.weight") != std::string::npos;
    if (k.find(".attn.") != std::string::npos) return false;
  }
  return uir;
}

void normalize_keys(io::StateDict& sd) {
  for (auto& kv : sd) kv.first = canonical_key(kv.first);
}

int64_t dim_of(const io::StateDict& sd, const std::string& key, int64_t d) {
  const torch::Tensor* t = tensor(sd, key);
  if (!t || t->dim() <= d) throw ModelError("MobileNetV4 weights: " + key + " missing");
  return t->size(d);
}

Arch arch_from_weights(const io::StateDict& sd) {
  Arch a;
  a.stem = dim_of(sd, "conv_stem.weight", 0);
  a.head = dim_of(sd, "conv_head.weight", 0);
  int stages = 0;
  while (has_prefix(sd, "blocks." + std::to_string(stages) + ".")) ++stages;
  if (stages == 0) throw ModelError("MobileNetV4 weights without blocks");
  for (int i = 0; i < stages; ++i) {
    std::vector<BlockSpec> blocks;
    for (int j = 0;; ++j) {
      const std::string p = "blocks." + std::to_string(i) + "." + std::to_string(j) + ".";
      if (!has_prefix(sd, p)) break;
      BlockSpec b;
      b.stride = j == 0 && i + 1 < stages ? 2 : 1;
      if (tensor(sd, p + "conv_exp.weight")) {
        b.kind = BlockSpec::Er;
        b.kernel = dim_of(sd, p + "conv_exp.weight", 2);
        b.mid = dim_of(sd, p + "conv_exp.weight", 0);
        b.out = dim_of(sd, p + "conv_pwl.weight", 0);
      } else if (tensor(sd, p + "pw_exp.conv.weight")) {
        b.kind = BlockSpec::Uir;
        b.mid = dim_of(sd, p + "pw_exp.conv.weight", 0);
        b.out = dim_of(sd, p + "pw_proj.conv.weight", 0);
        b.start_kernel = tensor(sd, p + "dw_start.conv.weight") ? dim_of(sd, p + "dw_start.conv.weight", 2) : 0;
        b.kernel = tensor(sd, p + "dw_mid.conv.weight") ? dim_of(sd, p + "dw_mid.conv.weight", 2) : 0;
      } else {
        b.kind = BlockSpec::Cn;
        b.kernel = dim_of(sd, p + "conv.weight", 2);
        b.out = dim_of(sd, p + "conv.weight", 0);
      }
      blocks.push_back(b);
    }
    a.stages.push_back(blocks);
  }
  return a;
}

std::optional<std::string> infer_size(const io::StateDict& sd) {
  if (!can_load(sd)) return std::nullopt;
  const auto stem = io::leading_dim(sd, "conv_stem.weight", canonical_key);
  if (stem && *stem == 24) return "l";
  if (tensor(sd, "blocks.0.0.conv_exp.weight")) return "m";
  if (tensor(sd, "blocks.0.0.conv.weight")) return "s";
  return std::nullopt;
}

std::optional<int> infer_num_classes(const io::StateDict& sd) {
  if (auto n = io::leading_dim(sd, "classifier.weight", canonical_key)) return static_cast<int>(*n);
  return std::nullopt;
}

std::shared_ptr<Detector> build(const std::string& size, int nc) {
  return std::make_shared<MobileNetV4Model>(size_arch(size), nc, size);
}

std::shared_ptr<Detector> build_like(const io::StateDict& sd, int nc) {
  nc = class_count(nc, nc > 0 ? std::nullopt : infer_num_classes(sd), "MobileNetV4");
  return std::make_shared<MobileNetV4Model>(arch_from_weights(sd), nc, infer_size(sd).value_or("s"));
}

}  // namespace

Family make_family() {
  Family f("mobilenetv4", size_names(), "s");
  f.set_weight_functions(build, build_like, can_load, infer_size, infer_num_classes, normalize_keys);
  f.input_size = size_input;
  f.crop_pct = size_crop_pct;
  apply_classify_recipe(f);
  return f;
}

}  // namespace libreyolo::models::mobilenetv4
