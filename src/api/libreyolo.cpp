#include <libreyolo/libreyolo.hpp>

#include <filesystem>
#include <regex>

#include "api/model_impl.hpp"
#include "core/device.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "engine/config_schema.hpp"
#include "engine/predictor.hpp"
#include "engine/trainer.hpp"
#include "engine/validator.hpp"
#include "io/checkpoint.hpp"
#include "models/coco_names.hpp"

namespace fs = std::filesystem;

namespace libreyolo {

const char* version() { return LIBREYOLO_VERSION; }

double ValResult::get(const std::string& key, double fallback) const {
  for (const auto& [k, v] : metrics)
    if (k == key) return v;
  return fallback;
}

void LibreYOLO::Impl::to(const torch::Device& d) {
  device = d;
  model->to(d);
}

namespace api {

namespace {

struct ModelName {
  std::string family, size;
};

// "yolo9t", "yolo9-s", "yolo9_m", "LibreYOLO9c", optionally with ".pt".
std::optional<ModelName> parse_model_name(const std::string& text) {
  std::string s = fs::path(text).filename().string();
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s.size() > 3 && s.substr(s.size() - 3) == ".pt") s.resize(s.size() - 3);
  if (s.rfind("libreyolo", 0) == 0) s = "yolo" + s.substr(9);
  for (const models::Family* f : models::families()) {
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
  for (const models::Family* f : models::families())
    for (const auto& size : f->sizes) out.push_back(f->name + size);
  return out;
}

}  // namespace

std::unique_ptr<LibreYOLO::Impl> fresh_model(const std::string& family, const std::string& size, int nc,
                                             const std::string& device) {
  const models::Family* fam = models::find_family(family);
  if (!fam) throw ModelError("Unknown model family '" + family + "'", "", "model_not_found");
  if (std::find(fam->sizes.begin(), fam->sizes.end(), size) == fam->sizes.end())
    throw ModelError("Unknown size '" + size + "' for " + family, "", "model_not_found");
  if (nc < 1) throw UsageError("num_classes must be at least 1");
  auto impl = std::make_unique<LibreYOLO::Impl>();
  impl->family = fam;
  impl->model = fam->build(size, nc);
  impl->names = models::default_names(nc);
  impl->to(resolve_device(device));
  return impl;
}

std::unique_ptr<LibreYOLO::Impl> model_from_checkpoint(const io::PyValuePtr& root, const std::string& origin) {
  io::Checkpoint ck = io::checkpoint_from_value(root, origin);
  io::StateDict sd = ck.model;
  const models::Family* fam = nullptr;
  if (ck.meta.family) {
    fam = models::find_family(*ck.meta.family);
    if (!fam)
      throw ModelError(origin + ": model_family '" + *ck.meta.family + "' is not supported by this build", "",
                       "model_family_mismatch");
  } else {
    fam = models::detect_family(sd);
    if (!fam)
      throw ModelError(origin + ": cannot tell which model family these weights belong to", "",
                       "model_load_failed");
  }
  if (fam->normalize_keys) fam->normalize_keys(sd);
  std::optional<int> nc;
  if (ck.meta.nc) nc = static_cast<int>(*ck.meta.nc);
  if (!nc && ck.meta.names) nc = static_cast<int>(ck.meta.names->size());
  if (!nc && fam->infer_num_classes) nc = fam->infer_num_classes(sd);
  if (!nc || *nc < 1) throw ModelError(origin + ": cannot determine the number of classes", "", "model_load_failed");
  auto impl = std::make_unique<LibreYOLO::Impl>();
  impl->family = fam;
  impl->model = fam->build_like(sd, *nc);
  auto report = models::load_state_dict(*impl->model, sd, /*strict=*/false);
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
  impl->names = ck.meta.names ? *ck.meta.names : models::default_names(*nc);
  if (static_cast<int>(impl->names.size()) != *nc) impl->names = models::default_names(*nc);
  if (ck.meta.imgsz && *ck.meta.imgsz > 0) impl->imgsz = static_cast<int>(*ck.meta.imgsz);
  impl->checkpoint = ck.root;
  return impl;
}

std::unique_ptr<LibreYOLO::Impl> load_model(const std::string& model, const std::string& device) {
  std::unique_ptr<LibreYOLO::Impl> impl;
  std::error_code ec;
  if (fs::is_regular_file(model, ec)) {
    auto root = io::load_torch_file(model);
    impl = model_from_checkpoint(root, model);
    impl->weights = model;
  } else if (auto name = parse_model_name(model);
             name && (model.size() < 3 || model.substr(model.size() - 3) != ".pt")) {
    impl = fresh_model(name->family, name->size, 80, "cpu");
    log_info("Model " + model + ": fresh " + name->family + "-" + name->size + " (untrained weights, 80 classes)");
  } else if (fs::is_directory(model, ec)) {
    std::string hint = "Pass the checkpoint file itself (a .pt file).";
    for (const char* inside : {"weights/best.pt", "weights/last.pt", "best.pt", "last.pt"})
      if (fs::is_regular_file(fs::path(model) / inside, ec)) {
        hint = "Pass the checkpoint file, e.g. model=" + (fs::path(model) / inside).string() + ".";
        break;
      }
    throw ModelError("Model path is a directory, not a checkpoint file: " + model, hint, "checkpoint_not_found");
  } else if (model.size() > 3 && model.substr(model.size() - 3) == ".pt") {
    std::string hint = "Check the path.";
    if (auto n = parse_model_name(model))
      hint += " For a fresh, untrained model use model=" + n->family + n->size + " (no downloads are made).";
    throw ModelError("Model file not found: " + model, hint, "checkpoint_not_found");
  } else {
    auto names = known_model_names();
    std::string near = closest_match(model, names);
    std::string all;
    for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
    throw ModelError("Unknown model '" + model + "'" + (near.empty() ? "" : ". Did you mean '" + near + "'?"),
                     "Available: " + all + ", or a .pt checkpoint path.", "model_not_found");
  }
  impl->to(resolve_device(device));
  return impl;
}

}  // namespace api

LibreYOLO::LibreYOLO(const std::string& model, const std::string& device)
    : impl_(api::load_model(model, device)) {}

LibreYOLO::LibreYOLO(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LibreYOLO::~LibreYOLO() = default;
LibreYOLO::LibreYOLO(LibreYOLO&&) noexcept = default;
LibreYOLO& LibreYOLO::operator=(LibreYOLO&&) noexcept = default;

LibreYOLO LibreYOLO::create(const std::string& family, const std::string& size, int num_classes,
                            const std::string& device) {
  return LibreYOLO(api::fresh_model(family, size, num_classes, device));
}

std::vector<PredictResult> LibreYOLO::predict(const std::string& source, const Kwargs& options) {
  PredictConfig cfg;
  cfg.source = source;
  predict_schema().apply(cfg, options, "predict");
  return predict(cfg);
}

std::vector<PredictResult> LibreYOLO::predict(const PredictConfig& config) {
  validate(config);
  return engine::run_predict(*impl_, config);
}

TrainResult LibreYOLO::train(const Kwargs& options, const TrainCallbacks& callbacks) {
  TrainConfig cfg;
  train_schema().apply(cfg, options, "train");
  validate(cfg);
  return engine::run_training(*impl_, cfg, callbacks, options);
}

TrainResult LibreYOLO::train(const TrainConfig& config, const TrainCallbacks& callbacks) {
  validate(config);
  return engine::run_training(*impl_, config, callbacks);
}

ValResult LibreYOLO::val(const Kwargs& options) {
  ValConfig cfg;
  val_schema().apply(cfg, options, "val");
  return val(cfg);
}

ValResult LibreYOLO::val(const ValConfig& config) {
  validate(config);
  return engine::run_validation(*impl_, config);
}

void LibreYOLO::save(const std::string& path) const {
  io::CheckpointMeta meta;
  meta.family = impl_->family->name;
  meta.size = impl_->model->size();
  meta.task = impl_->family->task;
  meta.nc = impl_->model->num_classes();
  meta.names = impl_->names;
  meta.imgsz = impl_->imgsz;
  auto root = io::make_checkpoint(models::state_dict(*impl_->model), meta);
  io::write_checkpoint(path, *root);
}

ModelInfo LibreYOLO::info() const {
  ModelInfo i;
  i.family = impl_->family->name;
  i.size = impl_->model->size();
  i.task = impl_->family->task;
  i.num_classes = impl_->model->num_classes();
  i.names = impl_->names;
  i.imgsz = impl_->imgsz;
  for (const auto& p : impl_->model->parameters()) i.parameters += p.numel();
  i.device = impl_->device.str();
  i.weights = impl_->weights;
  return i;
}

}  // namespace libreyolo
