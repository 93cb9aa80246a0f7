#include "models/loaded_model.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>

#include <libreyolo/errors.hpp>

#include "core/device.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "models/coco_names.hpp"

namespace fs = std::filesystem;

namespace libreyolo::models {

void LoadedModel::to(const torch::Device& d) {
  if (d != device && graphs) graphs->release("the model moved to " + d.str());
  device = d;
  model->to(d);
}


namespace {

struct ModelName {
  std::string family, size;
};

// <family><size>, <family>-<size> or <family>_<size>, "LibreYOLO" standing for "yolo" and a
// "Libre" prefix dropped otherwise (LibreYOLO's file names), optionally with ".pt".
std::optional<ModelName> parse_model_name(const std::string& text) {
  std::string s = fs::path(text).filename().string();
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s.size() > 3 && s.substr(s.size() - 3) == ".pt") s.resize(s.size() - 3);
  // LibreYOLO names a classifier's weights with the task's suffix: Libre<Family><size>-cls.
  if (s.size() > 4 && s.substr(s.size() - 4) == "-cls") s.resize(s.size() - 4);
  if (s.rfind("libreyolo", 0) == 0)
    s = "yolo" + s.substr(9);
  else if (s.rfind("libre", 0) == 0)  // Libre<Family><size>
    s = s.substr(5);
  for (const Family* f : families()) {
    if (s.rfind(f->name, 0) != 0) continue;
    std::string rest = s.substr(f->name.size());
    if (!rest.empty() && (rest[0] == '-' || rest[0] == '_')) rest.erase(0, 1);
    if (rest.empty()) return ModelName{f->name, f->default_size};
    for (const auto& size : f->sizes)
      if (rest == size) return ModelName{f->name, size};
  }
  return std::nullopt;
}

std::vector<std::string> known_model_names() {
  std::vector<std::string> out;
  for (const Family* f : families())
    for (const auto& size : f->sizes) out.push_back(f->name + size);
  return out;
}

}  // namespace

std::unique_ptr<LoadedModel> fresh_model(const std::string& family, const std::string& size, int nc,
                                             const std::string& device) {
  const Family* fam = find_family(family);
  if (!fam) throw ModelError("Unknown model family '" + family + "'", "", "model_not_found");
  if (std::find(fam->sizes.begin(), fam->sizes.end(), size) == fam->sizes.end())
    throw ModelError("Unknown size '" + size + "' for " + family, "", "model_not_found");
  if (nc < 1) throw UsageError("num_classes must be at least 1");
  auto impl = std::make_unique<LoadedModel>();
  impl->family = fam;
  impl->model = fam->build(size, nc);
  impl->names = default_names(nc);
  if (fam->input_size) impl->imgsz = fam->input_size(size);
  impl->to(resolve_device(device));
  return impl;
}

std::unique_ptr<LoadedModel> model_from_checkpoint(const io::PyValuePtr& root, const std::string& origin) {
  io::Checkpoint ck = io::checkpoint_from_value(root, origin);
  io::StateDict sd = ck.model;
  const Family* fam = nullptr;
  if (ck.meta.family) {
    fam = find_family(*ck.meta.family);
    if (!fam)
      throw ModelError(origin + ": model_family '" + *ck.meta.family + "' is not supported by this build", "",
                       "model_family_mismatch");
    // The metadata names a family whose weights these are not (a renamed or hand-made file).
    if (fam->can_load && !fam->can_load(sd)) {
      const Family* theirs = detect_family(sd);
      throw ModelError(origin + ": model_family is '" + fam->name + "' but the weights are " +
                           (theirs ? theirs->name + "'s" : "not " + fam->name + "'s"),
                       theirs ? "set model_family to '" + theirs->name + "' or use the checkpoint the weights came from"
                              : "",
                       "model_family_mismatch");
    }
  } else {
    fam = detect_family(sd);
    if (!fam)
      throw ModelError(origin + ": cannot tell which model family these weights belong to", "",
                       "model_load_failed");
  }
  if (fam->normalize_keys) fam->normalize_keys(sd);
  std::optional<int> nc;
  if (ck.meta.nc) nc = static_cast<int>(*ck.meta.nc);
  if (!nc && ck.meta.names) nc = static_cast<int>(ck.meta.names->size());
  if (!nc && fam->infer_num_classes) nc = fam->infer_num_classes(sd);
  if (!nc || *nc < 1)
    throw ModelError(origin + ": cannot determine the number of classes of these " + fam->name + " weights", "",
                     "model_load_failed");
  auto impl = std::make_unique<LoadedModel>();
  impl->family = fam;
  if (!fam->aux_prefixes.empty()) {
    io::StateDict kept;
    for (auto& kv : sd) {
      const bool aux = std::any_of(fam->aux_prefixes.begin(), fam->aux_prefixes.end(),
                                   [&](const std::string& p) { return kv.first.rfind(p, 0) == 0; });
      (aux ? impl->aux_state : kept).push_back(std::move(kv));
    }
    sd = std::move(kept);
  }
  impl->model = fam->build_like(sd, *nc);
  auto report = load_state_dict(*impl->model, sd, /*strict=*/false);
  if (!report.shape_mismatch.empty())
    throw ModelError(origin + ": weights do not fit the model: " + report.shape_mismatch.front() +
                         (report.shape_mismatch.size() > 1
                              ? " (and " + std::to_string(report.shape_mismatch.size() - 1) + " more)"
                              : ""),
                     "", "model_load_failed");
  if (!report.missing.empty())
    log_warn(origin + ": " + std::to_string(report.missing.size()) + " model entries missing from the weights (first: " +
             report.missing.front() + "); they keep their initial values");
  if (!report.unexpected.empty())
    log_warn(origin + ": " + std::to_string(report.unexpected.size()) +
             " entries in the weights were not used (first: " + report.unexpected.front() + ")");
  impl->names = ck.meta.names ? *ck.meta.names : default_names(*nc);
  if (static_cast<int>(impl->names.size()) != *nc) impl->names = default_names(*nc);
  // The image size predict and val default to, held to the range of the imgsz option (a damaged or
  // hand-edited value would otherwise reach the allocator).
  const bool imgsz_usable = ck.meta.imgsz && *ck.meta.imgsz >= 1 && *ck.meta.imgsz <= 8192;
  if (ck.meta.imgsz && !imgsz_usable)
    log_warn(origin + ": its imgsz " + std::to_string(*ck.meta.imgsz) +
             " is outside 1..8192 (a damaged or edited checkpoint): ignored, the family's default is used");
  if (imgsz_usable)
    impl->imgsz = static_cast<int>(*ck.meta.imgsz);
  else if (fam->input_size)
    impl->imgsz = fam->input_size(impl->model->size());
  impl->checkpoint = ck.root;
  return impl;
}

namespace {
bool ends_with_pt(const std::string& s) { return s.size() > 3 && s.compare(s.size() - 3, 3, ".pt") == 0; }
}  // namespace

void check_model_arg(const std::string& model) {
  std::error_code ec;
  if (fs::is_regular_file(model, ec)) return;
  if (fs::is_directory(model, ec)) {
    std::string hint = "Pass the checkpoint file itself (a .pt file).";
    for (const char* inside : {"weights/best.pt", "weights/last.pt", "best.pt", "last.pt"})
      if (fs::is_regular_file(fs::path(model) / inside, ec)) {
        hint = "Pass the checkpoint file, e.g. model=" + (fs::path(model) / inside).string() + ".";
        break;
      }
    throw ModelError("Model path is a directory, not a checkpoint file: " + model, hint, "checkpoint_not_found");
  }
  if (parse_model_name(model) && !ends_with_pt(model)) return;
  if (ends_with_pt(model)) {
    std::string hint = "Check the path.";
    if (auto n = parse_model_name(model))
      hint += " For a fresh, untrained model use model=" + n->family + n->size + " (no downloads are made).";
    throw ModelError("Model file not found: " + model, hint, "checkpoint_not_found");
  }
  auto names = known_model_names();
  std::string near = closest_match(model, names);
  std::string all;
  for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
  throw ModelError("Unknown model '" + model + "'" + (near.empty() ? "" : ". Did you mean '" + near + "'?"),
                   "Available: " + all + ", or a .pt checkpoint path.", "model_not_found");
}

std::unique_ptr<LoadedModel> load_model(const std::string& model, const std::string& device) {
  check_model_arg(model);
  const torch::Device dev = resolve_device(device);
  std::unique_ptr<LoadedModel> impl;
  std::error_code ec;
  if (fs::is_regular_file(model, ec)) {
    impl = model_from_checkpoint(io::load_torch_file(model), model);
    impl->weights = model;
  } else {
    auto name = parse_model_name(model);
    const int nc = find_family(name->family)->default_num_classes;
    impl = fresh_model(name->family, name->size, nc, "cpu");
    log_info("Model " + model + ": fresh " + name->family + "-" + name->size + " (untrained weights, " +
             std::to_string(nc) + " classes)");
  }
  impl->to(dev);
  return impl;
}

io::CheckpointMeta LoadedModel::meta() const {
  io::CheckpointMeta m;
  m.family = family->name;
  m.size = model->size();
  m.task = family->task;
  m.nc = model->num_classes();
  m.names = names;
  m.imgsz = imgsz;
  return m;
}

}  // namespace libreyolo::models
