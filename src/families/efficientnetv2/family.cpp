// The efficientnetv2 registry entry: the classify task's EfficientNetV2-b0..b3, recognised from
// its key names (conv_stem, conv_head, the MBConvs' conv_dw and squeeze-excite), every block's
// kind, kernel and widths read from the weights' shapes (the stages' first strides are the
// architecture's: 1, 2, 2, 2, 1, 2), the classification recipe and its eval geometry (inputs 224,
// 240, 260, 300; crop_pct 0.875, 0.882, 0.890, 0.904).
#include <optional>

#include "families/efficientnetv2/model.hpp"
#include "libreyolo/errors.hpp"
#include "families/classify_recipe.hpp"
#include "models/classifier.hpp"

namespace libreyolo::models::efficientnetv2 {

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
  if (!tensor(sd, "conv_stem.weight") || !tensor(sd, "conv_head.weight") || !tensor(sd, "classifier.weight") ||
      !tensor(sd, "bn2.weight"))
    return false;
  bool dw = false;
  for (const auto& kv : sd) {
    const std::string k = canonical_key(kv.first);
    if (k.find(".pw_exp.") != std::string::npos) return false;
    dw = dw || k.find(".conv_dw.weight") != std::string::npos;
  }
  return dw;
}

void normalize_keys(io::StateDict& sd) {
  for (auto& kv : sd) kv.first = canonical_key(kv.first);
}

int64_t dim_of(const io::StateDict& sd, const std::string& key, int64_t d) {
  const torch::Tensor* t = tensor(sd, key);
  if (!t || t->dim() <= d) throw ModelError("EfficientNetV2 weights: " + key + " missing");
  return t->size(d);
}

Arch arch_from_weights(const io::StateDict& sd) {
  Arch a;
  a.stem = dim_of(sd, "conv_stem.weight", 0);
  a.head = dim_of(sd, "conv_head.weight", 0);
  for (size_t i = 0; has_prefix(sd, "blocks." + std::to_string(i) + "."); ++i) {
    std::vector<BlockSpec> blocks;
    for (int j = 0;; ++j) {
      const std::string p = "blocks." + std::to_string(i) + "." + std::to_string(j) + ".";
      if (!has_prefix(sd, p)) break;
      BlockSpec b;
      b.stride = j == 0 ? stage_stride(i) : 1;
      b.skip = true;
      if (tensor(sd, p + "conv_exp.weight")) {
        b.kind = BlockSpec::Er;
        b.kernel = dim_of(sd, p + "conv_exp.weight", 2);
        b.mid = dim_of(sd, p + "conv_exp.weight", 0);
        b.out = dim_of(sd, p + "conv_pwl.weight", 0);
      } else if (tensor(sd, p + "conv_dw.weight")) {
        b.kind = BlockSpec::Ir;
        b.kernel = dim_of(sd, p + "conv_dw.weight", 2);
        b.mid = dim_of(sd, p + "conv_pw.weight", 0);
        b.out = dim_of(sd, p + "conv_pwl.weight", 0);
        b.se = tensor(sd, p + "se.conv_reduce.weight") ? dim_of(sd, p + "se.conv_reduce.weight", 0) : 0;
      } else {
        b.kind = BlockSpec::Cn;
        b.kernel = dim_of(sd, p + "conv.weight", 2);
        b.out = dim_of(sd, p + "conv.weight", 0);
      }
      blocks.push_back(b);
    }
    a.stages.push_back(blocks);
  }
  if (a.stages.empty()) throw ModelError("EfficientNetV2 weights without blocks");
  return a;
}

std::optional<std::string> infer_size(const io::StateDict& sd) {
  if (!can_load(sd)) return std::nullopt;
  const Arch a = arch_from_weights(sd);
  for (const auto& s : size_names()) {
    const Arch ref = size_arch(s);
    if (ref.stem != a.stem || ref.head != a.head || ref.stages.size() != a.stages.size()) continue;
    bool same = true;
    for (size_t i = 0; i < ref.stages.size() && same; ++i)
      same = ref.stages[i].size() == a.stages[i].size() && ref.stages[i].back().out == a.stages[i].back().out;
    if (same) return s;
  }
  return std::nullopt;
}

std::optional<int> infer_num_classes(const io::StateDict& sd) {
  if (auto n = io::leading_dim(sd, "classifier.weight", canonical_key)) return static_cast<int>(*n);
  return std::nullopt;
}

std::shared_ptr<Detector> build(const std::string& size, int nc) {
  return std::make_shared<EfficientNetV2Model>(size_arch(size), nc, size);
}

std::shared_ptr<Detector> build_like(const io::StateDict& sd, int nc) {
  nc = class_count(nc, nc > 0 ? std::nullopt : infer_num_classes(sd), "EfficientNetV2");
  return std::make_shared<EfficientNetV2Model>(arch_from_weights(sd), nc, infer_size(sd).value_or("b0"));
}

}  // namespace

Family make_family() {
  Family f("efficientnetv2", size_names(), "b0");
  f.set_weight_functions(build, build_like, can_load, infer_size, infer_num_classes, normalize_keys);
  f.input_size = size_input;
  f.crop_pct = size_crop_pct;
  apply_classify_recipe(f);
  return f;
}

}  // namespace libreyolo::models::efficientnetv2
