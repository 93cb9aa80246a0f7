#include <libreyolo/libreyolo.hpp>

#include <filesystem>
#include <unordered_set>

#include "core/background.hpp"
#include "core/device.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "core/strings.hpp"
#include "core/config_schema.hpp"
#include "engine/classify.hpp"
#include "engine/predictor.hpp"
#include "engine/profile_infer.hpp"
#include "engine/train.hpp"
#include "engine/validator.hpp"
#include "io/checkpoint.hpp"
#include "models/loaded_model.hpp"

namespace fs = std::filesystem;

namespace libreyolo {

const char* version() { return LIBREYOLO_VERSION; }

double ValResult::get(const std::string& key, double fallback) const {
  for (const auto& [k, v] : metrics)
    if (k == key) return v;
  return fallback;
}

double EpochSummary::loss_term(const std::string& name, double fallback) const {
  for (const auto& [k, v] : losses)
    if (k == name) return v;
  return fallback;
}

// The facade's state is the engine's loaded model; nothing below src/api knows this type.
// While any is alive the library's background work goes on; the last one stops it (core/background.hpp).
struct LibreYOLO::Impl : models::LoadedModel {
  explicit Impl(models::LoadedModel&& m) : models::LoadedModel(std::move(m)) {}
  BackgroundWorkHold background;
};

namespace {
std::unique_ptr<LibreYOLO::Impl> wrap(std::unique_ptr<models::LoadedModel> m) {
  return std::make_unique<LibreYOLO::Impl>(std::move(*m));
}

// A copy of an ImageView's pixels as [H, W, 3] uint8 RGB.
torch::Tensor image_pixels(const ImageView& v) {
  const std::string what = v.name.empty() ? "an image" : "image '" + v.name + "'";
  if (!v.data) throw UsageError("predict: " + what + " has no data", "", "source_invalid");
  if (v.height < 1 || v.width < 1)
    throw UsageError(strfmt("predict: %s is %dx%d pixels", what.c_str(), v.width, v.height), "", "source_invalid");
  if (v.channels != 1 && v.channels != 3 && v.channels != 4)
    throw UsageError(strfmt("predict: %s has %d channels; 1 (grey), 3 or 4 (with alpha) are read", what.c_str(), v.channels),
                     "", "source_invalid");
  const int64_t packed = static_cast<int64_t>(v.width) * v.channels;
  const int64_t stride = v.row_stride ? v.row_stride : packed;
  if (stride < packed)
    throw UsageError(strfmt("predict: %s has rows of %lld bytes, %lld apart", what.c_str(), static_cast<long long>(packed),
                            static_cast<long long>(stride)),
                     "", "source_invalid");
  const torch::Tensor view = torch::from_blob(const_cast<uint8_t*>(v.data), {v.height, v.width, v.channels},
                                              {stride, v.channels, 1}, torch::kUInt8);
  torch::Tensor rgb;
  if (v.channels == 1)
    rgb = view.expand({v.height, v.width, 3});
  else if (v.bgr)
    rgb = view.narrow(2, 0, 3).flip(2);
  else
    rgb = view.narrow(2, 0, 3);
  return rgb.clone(at::MemoryFormat::Contiguous);
}
}  // namespace

LibreYOLO::LibreYOLO(const std::string& model, const std::string& device)
    : impl_(wrap(models::load_model(model, device))) {}

LibreYOLO::LibreYOLO(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LibreYOLO::~LibreYOLO() = default;
LibreYOLO::LibreYOLO(LibreYOLO&&) noexcept = default;
LibreYOLO& LibreYOLO::operator=(LibreYOLO&&) noexcept = default;

LibreYOLO LibreYOLO::create(const std::string& family, const std::string& size, int num_classes,
                            const std::string& device) {
  return LibreYOLO(wrap(models::fresh_model(family, size, num_classes, device)));
}

std::vector<PredictResult> LibreYOLO::predict(const std::string& source, const Kwargs& options) {
  PredictConfig cfg;
  cfg.source = source;
  predict_schema().apply(cfg, options, "predict");
  return predict(cfg);
}

std::vector<PredictResult> LibreYOLO::predict(const PredictConfig& config) {
  validate(config);
  if (engine::is_classify(*impl_)) return engine::run_classify_predict(*impl_, config);
  return engine::run_predict(*impl_, config);
}

std::vector<PredictResult> LibreYOLO::predict(const std::vector<ImageView>& images, const Kwargs& options) {
  PredictConfig config;
  predict_schema().apply(config, options, "predict");
  validate(config);
  std::vector<engine::ImageSource> sources;
  for (size_t i = 0; i < images.size(); ++i)
    sources.push_back({images[i].name.empty() ? "image" + std::to_string(i) : images[i].name, image_pixels(images[i])});
  if (sources.empty()) throw UsageError("predict: the list of images is empty", "", "source_invalid");
  if (engine::is_classify(*impl_)) return engine::run_classify_predict(*impl_, config, sources);
  return engine::run_predict(*impl_, config, sources);
}

namespace {

// The family's recipe first (its defaults and amp/sync_bn habits), then the caller's options.
TrainConfig train_config_for(const models::LoadedModel& impl, const Kwargs& options) {
  TrainConfig cfg;
  cfg.amp = impl.family->default_amp;
  cfg.sync_bn = impl.family->default_sync_bn;
  if (impl.family->input_size) cfg.imgsz = impl.family->input_size(impl.model->size());
  train_schema().apply(cfg, impl.family->train_defaults, "train");
  if (impl.family->size_train_defaults)
    train_schema().apply(cfg, impl.family->size_train_defaults(impl.model->size()), "train");
  train_schema().apply(cfg, options, "train");
  validate(cfg);
  return cfg;
}

}  // namespace

TrainConfig LibreYOLO::check_train(const Kwargs& options) {
  if (engine::is_classify(*impl_)) return engine::check_classify_training(*impl_, train_config_for(*impl_, options));
  return engine::check_training(*impl_, train_config_for(*impl_, options), options);
}

TrainResult LibreYOLO::train(const Kwargs& options, const TrainCallbacks& callbacks,
                             const std::vector<std::shared_ptr<TrainHook>>& hooks) {
  if (engine::is_classify(*impl_))
    return engine::run_classify_training(*impl_, train_config_for(*impl_, options), callbacks, hooks);
  return engine::run_training(*impl_, train_config_for(*impl_, options), callbacks, hooks, options);
}

TrainResult LibreYOLO::train(const TrainConfig& config, const TrainCallbacks& callbacks,
                             const std::vector<std::shared_ptr<TrainHook>>& hooks) {
  validate(config);
  if (engine::is_classify(*impl_)) return engine::run_classify_training(*impl_, config, callbacks, hooks);
  return engine::run_training(*impl_, config, callbacks, hooks);
}

ValResult LibreYOLO::val(const Kwargs& options) {
  ValConfig cfg;
  val_schema().apply(cfg, options, "val");
  return val(cfg);
}

ValResult LibreYOLO::val(const ValConfig& config) {
  validate(config);
  if (engine::is_classify(*impl_)) return engine::run_classify_validation(*impl_, config);
  return engine::run_validation(*impl_, config);
}

void LibreYOLO::save(const std::string& path) const {
  auto root = io::make_checkpoint(models::state_dict(*impl_->model), impl_->meta());
  io::write_checkpoint(path, *root);
}

void LibreYOLO::capture_graph(int imgsz, int batch, const std::string& dtype) {
  if (engine::is_classify(*impl_))
    throw UsageError("capture_graph: CUDA graphs are not available for the classify task", "", "config_range_error");
  models::ForwardSpec spec;
  spec.device = impl_->device;
  if (dtype == "float16" || dtype == "fp16" || dtype == "half") {
    spec.amp = true;
    spec.amp_dtype = torch::kHalf;
  } else if (dtype == "bfloat16" || dtype == "bf16") {
    spec.amp = true;
    spec.amp_dtype = torch::kBFloat16;
  } else if (dtype != "float32" && dtype != "fp32") {
    throw UsageError("capture_graph: dtype '" + dtype + "' is not one of: float32, float16, bfloat16", "",
                     "config_range_error");
  }
  impl_->model->eval();
  impl_->graphs->capture(*impl_->model, *impl_->family, batch, imgsz, spec);
}

GraphInfo LibreYOLO::graph_info() const {
  return impl_->graphs->info();
}

void LibreYOLO::release_graphs() { impl_->graphs->release("release_graphs()"); }

InferenceProfile LibreYOLO::profile_inference(const InferProfileConfig& config) {
  if (engine::is_classify(*impl_))
    throw UsageError("profile_inference is not available for the classify task yet", "", "config_range_error");
  return engine::run_profile_infer(*impl_, config);
}

ModelInfo LibreYOLO::info() const {
  ModelInfo i;
  i.family = impl_->family->name;
  i.size = impl_->model->size();
  i.task = impl_->family->task;
  i.num_classes = impl_->model->num_classes();
  i.names = impl_->names;
  i.imgsz = impl_->imgsz;
  // Each tensor once, as PyTorch counts them: a module registered under several names (a head
  // convolution shared across levels) lists its parameters under each.
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : impl_->model->parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) i.parameters += p.numel();
  i.device = impl_->device.str();
  i.weights = impl_->weights;
  i.amp_default = impl_->family->default_amp;
  i.amp_default_reason = impl_->family->default_amp_reason;
  return i;
}

}  // namespace libreyolo
