// The resnet registry entry: the classify task's ResNet-18/34/50/101, recognised from its key
// names (conv1, layer1..4, fc), its widths and block counts read from the weights' shapes, the
// classification recipe (AdamW 1e-3, one warm-up epoch, cosine to 1 %) and its eval geometry
// (crop_pct 0.95, ImageNet normalisation of RGB / 255).
#include <optional>
#include <regex>

#include "core/strings.hpp"
#include "families/resnet/model.hpp"
#include "families/classify_recipe.hpp"
#include "models/classifier.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::models::resnet {

namespace {

std::string canonical_key(const std::string& key) { return io::strip_ddp_prefix(key); }

const torch::Tensor* tensor(const io::StateDict& sd, const std::string& key) {
  return io::find_tensor(sd, key, canonical_key);
}

bool can_load(const io::StateDict& sd) {
  return tensor(sd, "conv1.weight") && tensor(sd, "fc.weight") && tensor(sd, "layer1.0.conv1.weight");
}

void normalize_keys(io::StateDict& sd) {
  for (auto& kv : sd) kv.first = canonical_key(kv.first);
}

Arch arch_from_weights(const io::StateDict& sd) {
  const torch::Tensor* stem = tensor(sd, "conv1.weight");
  if (!stem || stem->dim() != 4) throw ModelError("cannot tell the ResNet widths from the weights (conv1.weight missing)");
  Arch a;
  a.width = stem->size(0);
  a.bottleneck = tensor(sd, "layer1.0.conv3.weight") != nullptr;
  for (int k = 0; k < 4; ++k) {
    int n = 0;
    while (tensor(sd, "layer" + std::to_string(k + 1) + "." + std::to_string(n) + ".conv1.weight")) ++n;
    if (n == 0) throw ModelError("ResNet weights without layer" + std::to_string(k + 1));
    a.blocks[static_cast<size_t>(k)] = n;
  }
  return a;
}

std::optional<std::string> infer_size(const io::StateDict& sd) {
  if (!can_load(sd)) return std::nullopt;
  Arch a = arch_from_weights(sd);
  a.width = 64;
  const std::string s = size_of(a);
  if (s.empty()) return std::nullopt;
  return s;
}

std::optional<int> infer_num_classes(const io::StateDict& sd) {
  if (auto n = io::leading_dim(sd, "fc.weight", canonical_key)) return static_cast<int>(*n);
  return std::nullopt;
}

std::shared_ptr<Detector> build(const std::string& size, int nc) {
  return std::make_shared<ResNetModel>(size_arch(size), nc, size);
}

std::shared_ptr<Detector> build_like(const io::StateDict& sd, int nc) {
  const Arch a = arch_from_weights(sd);
  nc = class_count(nc, nc > 0 ? std::nullopt : infer_num_classes(sd), "ResNet");
  Arch standard = a;
  standard.width = 64;
  return std::make_shared<ResNetModel>(a, nc, size_of(standard));
}

}  // namespace

Family make_family() {
  Family f("resnet", size_names(), "50");
  f.set_weight_functions(build, build_like, can_load, infer_size, infer_num_classes, normalize_keys);
  f.input_size = [](const std::string&) { return 224; };
  f.crop_pct = [](const std::string&) { return 0.95; };
  apply_classify_recipe(f);
  return f;
}

}  // namespace libreyolo::models::resnet
