#include "engine/trainer.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#ifdef LIBREYOLO_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "api/model_impl.hpp"
#include "core/device.hpp"
#include "core/log.hpp"
#include "core/paths.hpp"
#include "data/dataset_yaml.hpp"
#include "engine/config_schema.hpp"
#include "engine/validator.hpp"
#include "io/checkpoint.hpp"
#include "models/coco_names.hpp"

namespace fs = std::filesystem;

namespace libreyolo::engine {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double gpu_memory_gb(const torch::Device& d) {
#ifdef LIBREYOLO_CUDA
  if (d.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
    return static_cast<double>(stats.reserved_bytes[0].current) / 1e9;
  }
#endif
  (void)d;
  return 0.0;
}

// Python's round(): half to even.
long long round_half_even(double x) {
  double r = std::nearbyint(x);  // default rounding mode is to-nearest-even
  return static_cast<long long>(r);
}

std::string fmt_value(double v) {
  if (!std::isfinite(v)) return "";
  std::ostringstream os;
  os << std::setprecision(10) << v;
  return os.str();
}

// results.csv: one row per epoch; the file is rewritten whole (atomically) whenever new columns
// appear, so every row has every column.
class ResultsCsv {
 public:
  explicit ResultsCsv(std::string path) : path_(std::move(path)) {}
  void keep_epochs_before(int epoch_1based) {  // resume: drop rows that will be redone
    std::ifstream f(path_);
    if (!f) return;
    std::string line;
    if (!std::getline(f, line)) return;
    columns_ = split(line);
    while (std::getline(f, line)) {
      auto cells = split(line);
      if (cells.empty()) continue;
      int e = std::atoi(cells[0].c_str());
      if (e <= 0 || e >= epoch_1based) continue;
      std::map<std::string, std::string> row;
      for (size_t i = 0; i < cells.size() && i < columns_.size(); ++i) row[columns_[i]] = cells[i];
      rows_.push_back(row);
    }
  }
  void add(const std::vector<std::pair<std::string, std::string>>& row) {
    std::map<std::string, std::string> r;
    for (const auto& [k, v] : row) {
      if (std::find(columns_.begin(), columns_.end(), k) == columns_.end()) columns_.push_back(k);
      r[k] = v;
    }
    rows_.push_back(std::move(r));
    std::string out;
    for (size_t i = 0; i < columns_.size(); ++i) out += (i ? "," : "") + columns_[i];
    out += "\n";
    for (const auto& row_map : rows_) {
      for (size_t i = 0; i < columns_.size(); ++i) {
        auto it = row_map.find(columns_[i]);
        out += (i ? "," : "") + (it == row_map.end() ? std::string() : it->second);
      }
      out += "\n";
    }
    write_file_atomic(path_, out);
  }

 private:
  static std::vector<std::string> split(const std::string& line) {
    std::vector<std::string> out;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) out.push_back(cell);
    return out;
  }
  std::string path_;
  std::vector<std::string> columns_;
  std::vector<std::map<std::string, std::string>> rows_;
};

// Progress: an in-place line on a terminal, a line every 30 s otherwise, and a line per epoch.
class ProgressHook : public TrainHook {
 public:
  void before_epoch(Trainer& t, int epoch) override {
    epoch_start_ = last_print_ = Clock::now();
    images_ = 0;
    epoch_ = epoch;
  }
  void after_step(Trainer& t, const StepInfo& s) override {
    images_ += s.batch_images;
    if (!t.config().verbose) return;
    const double since = seconds_since(last_print_);
    if ((tty_ && since >= 0.5) || since >= 30.0) {
      last_print_ = Clock::now();
      auto sums = t.loss_sums().to(torch::kCPU);  // synchronises: at most twice a second
      const double n = std::max<int64_t>(t.batches_done(), 1);
      const double el = seconds_since(epoch_start_);
      std::string line = strfmt("Epoch %d/%d %5lld/%lld  loss %.4f (box %.4f dfl %.4f cls %.4f)  %.1f it/s  %.0f img/s",
                                epoch_ + 1, t.epochs(), static_cast<long long>(s.batch_index + 1),
                                static_cast<long long>(t.train_loader().size()), sums[0].item<double>() / n,
                                sums[1].item<double>() / n, sums[2].item<double>() / n, sums[3].item<double>() / n,
                                t.batches_done() / std::max(el, 1e-9), images_ / std::max(el, 1e-9));
      if (tty_) {
        std::fprintf(stderr, "\r%s\033[K", line.c_str());
        std::fflush(stderr);
        dirty_ = true;
      } else {
        log_info(line);
      }
    }
  }
  void after_epoch(Trainer& t, const EpochSummary& e) override {
    if (dirty_) {
      std::fprintf(stderr, "\r\033[K");
      dirty_ = false;
    }
    if (!t.config().verbose) return;
    const double it_s = t.batches_done() / std::max(e.seconds, 1e-9);
    std::string line = strfmt(
        "Epoch %d/%d  loss %.4f (box %.4f dfl %.4f cls %.4f)  %.2f it/s  %.1f img/s  lr %.6f", e.epoch, t.epochs(),
        e.loss, e.box_loss, e.dfl_loss, e.cls_loss, it_s, images_ / std::max(e.seconds, 1e-9),
        e.lrs.empty() ? 0.0 : e.lrs[0]);
    const double mem = gpu_memory_gb(t.device());
    if (mem > 0) line += strfmt("  mem %.2fG", mem);
    line += strfmt("  %.1fs", e.seconds);
    if (e.validated) line += strfmt("  mAP50 %.4f  mAP50-95 %.4f%s", e.map50, e.map50_95, e.is_best ? " *" : "");
    log_info(line);
  }

 private:
  bool tty_ = isatty(fileno(stderr));
  bool dirty_ = false;
  Clock::time_point epoch_start_, last_print_;
  int64_t images_ = 0;
  int epoch_ = 0;
};

io::PyValuePtr typed_value(OptionType type, const std::string& text) {
  switch (type) {
    case OptionType::Int: return io::PyValue::from_int(std::atoll(text.c_str()));
    case OptionType::Float: return io::PyValue::from_float(std::atof(text.c_str()));
    case OptionType::Bool: return io::PyValue::from_bool(text == "true");
    case OptionType::String: return io::PyValue::from_string(text);
  }
  return io::PyValue::none();
}

}  // namespace

// ------------------------------------------------------------------------------------------------

Trainer::Trainer(LibreYOLO::Impl& impl, TrainConfig cfg, TrainCallbacks callbacks, const Kwargs& given)
    : impl_(impl), cfg_(std::move(cfg)), callbacks_(std::move(callbacks)), given_(given) {}

Trainer::~Trainer() = default;

void Trainer::run_hooks(const std::function<void(TrainHook&)>& fn) {
  for (auto& h : hooks_) fn(*h);
  hooks_.erase(std::remove_if(hooks_.begin(), hooks_.end(), [](const auto& h) { return h->finished(); }),
               hooks_.end());
}

io::PyValuePtr Trainer::config_dict() const {
  auto d = io::PyValue::new_dict();
  const auto& schema = train_schema();
  auto values = schema.dump(cfg_);
  for (size_t i = 0; i < schema.fields().size(); ++i)
    d->set(values[i].first, typed_value(schema.fields()[i].type, values[i].second));
  return d;
}

void Trainer::setup() {
  // Resume first: the checkpoint's config is the run's config, the caller's explicit options win.
  if (!cfg_.resume.empty() && cfg_.resume != "false" && cfg_.resume != "False") {
    if (cfg_.resume == "true" || cfg_.resume == "True") {
      if (!impl_.checkpoint)
        throw UsageError("resume=true requires a checkpoint. Load one first: libreyolo train model=<run>/weights/last.pt resume=true");
      resume_ckpt_ = impl_.checkpoint;
      resume_path_ = impl_.weights;
    } else {
      if (!fs::exists(cfg_.resume)) throw ModelError("Resume checkpoint not found: " + cfg_.resume, "", "checkpoint_not_found");
      resume_ckpt_ = io::load_torch_file(cfg_.resume);
      resume_path_ = cfg_.resume;
    }
    if (auto saved = resume_ckpt_->get("config"); saved && saved->is_dict()) {
      TrainConfig restored;
      Kwargs kv;
      for (const auto& [k, v] : saved->dict) {
        if (!k->is_string() || !train_schema().find(k->s)) continue;
        std::string text;
        switch (v->kind) {
          case io::PyValue::Kind::Bool: text = v->b ? "true" : "false"; break;
          case io::PyValue::Kind::Int: text = std::to_string(v->i); break;
          case io::PyValue::Kind::Float: text = format_option_value(v->f); break;
          case io::PyValue::Kind::String: text = v->s; break;
          default: continue;
        }
        kv.emplace_back(k->s, text);
      }
      train_schema().apply(restored, kv, "train");
      train_schema().apply(restored, given_, "train");
      restored.resume = cfg_.resume;
      cfg_ = restored;
      libreyolo::validate(cfg_);
    }
    // Continue in the run directory the checkpoint came from, if it is one of ours.
    fs::path wdir = fs::path(resume_path_).parent_path();
    if (wdir.filename() == "weights" && fs::exists(wdir.parent_path() / "train_config.yaml")) {
      cfg_.project = wdir.parent_path().parent_path().string();
      cfg_.name = wdir.parent_path().filename().string();
      cfg_.exist_ok = true;
    }
  }

  if (wants_distributed(cfg_.device))
    throw UsageError("Multi-GPU training (device=" + cfg_.device + ") is not available in this build yet",
                     "Train on one device: device=0.", "config_unsupported");
  device_ = resolve_device(cfg_.device);
  if (device_ != impl_.device) impl_.to(device_);
  if (cfg_.seed >= 0) torch::manual_seed(static_cast<uint64_t>(cfg_.seed));
  amp_ = plan_amp(cfg_.amp, cfg_.amp_dtype, device_);
  workers_ = cfg_.workers;
  if (device_.is_cpu() && cfg_.workers > 0) {
    // CPU training: the step and the loader share the cores, and torch's OpenMP threads spin
    // while they wait, so oversubscription slows every step several times over. Give the loader
    // a quarter of the cores (none on a small machine: it then runs between steps) and the
    // step the rest. (2 cores, YOLOv9-t at 160 px: 47 img/s this way, 30 with one core each.)
    const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    const int loader = std::min(cfg_.workers, cores / 4);
    const int threads = std::max(1, cores - loader);
    at::set_num_threads(threads);
    if (loader != cfg_.workers)
      log_info(strfmt("CPU training on %d cores: %d loader worker(s) instead of %d, %d compute threads", cores, loader,
                      cfg_.workers, threads));
    workers_ = loader;
  }
  channels_last_ = cfg_.memory_format == "channels_last" || (cfg_.memory_format == "auto" && device_.is_cuda());
  // Every training batch has the same shape: let cuDNN time its algorithms once and keep the
  // fastest (measured on an H200: v9-t batch 8 bf16 step 75 -> 67 ms).
  if (device_.is_cuda()) at::globalContext().setBenchmarkCuDNN(true);

  setup_data();
  setup_model();
  save_dir_ = make_run_dir(cfg_.project, cfg_.name, cfg_.exist_ok);
  write_file_atomic((fs::path(save_dir_) / "train_config.yaml").string(), to_yaml(train_schema(), cfg_));
  setup_optimization();
  if (resume_ckpt_) resume();
  hooks_.insert(hooks_.begin(), std::make_shared<ProgressHook>());
}

void Trainer::setup_data() {
  const std::string yaml = resolve_data_arg(cfg_.data);
  data::DatasetSpec spec = data::load_dataset_yaml(yaml);
  names_ = spec.names;
  if (static_cast<int>(names_.size()) != spec.nc) names_ = models::default_names(spec.nc);
  data::DatasetOptions dopt;
  dopt.imgsz = cfg_.imgsz;
  dopt.num_classes = spec.nc;
  dopt.cache = (cfg_.cache == "ram" || cfg_.cache == "true" || cfg_.cache == "1" || cfg_.cache == "yes")
                   ? data::CacheMode::Ram
                   : data::CacheMode::None;
  train_set_ = std::make_shared<data::YoloDataset>(data::list_split_images(spec, "train"), dopt);
  if (cfg_.val && spec.has_split("val")) {
    data::DatasetOptions vopt = dopt;
    val_set_ = std::make_shared<data::YoloDataset>(data::list_split_images(spec, "val"), vopt);
  } else if (cfg_.val) {
    log_warn("The dataset has no 'val' split: training without validation");
  }
  if (cfg_.batch == -1) {
    log_warn("batch=-1 (autobatch) is not available in this build; using batch=16");
    cfg_.batch = 16;
  }
  data::LoaderOptions lo;
  lo.mode = data::LoaderMode::Train;
  lo.batch = cfg_.batch;
  lo.workers = workers_;
  lo.pin_memory = device_.is_cuda();
  lo.shuffle = true;
  lo.seed = static_cast<uint64_t>(std::max(cfg_.seed, 0));
  lo.augment.mosaic_prob = cfg_.mosaic_prob;
  lo.augment.mixup_prob = cfg_.mixup_prob;
  lo.augment.hsv_prob = cfg_.hsv_prob;
  lo.augment.flip_prob = cfg_.flip_prob;
  train_loader_ = std::make_unique<data::DataLoader>(train_set_, lo);
  if (train_loader_->size() == 0)
    throw DataError("The training split has " + std::to_string(train_set_->size()) + " images, fewer than one batch of " +
                        std::to_string(cfg_.batch),
                    "Use a smaller batch.", "data_invalid");
  log_info(strfmt("Train: %lld images, %lld batches of %d per epoch%s", static_cast<long long>(train_set_->size()),
                  static_cast<long long>(train_loader_->size()), cfg_.batch,
                  val_set_ ? strfmt("; val: %lld images", static_cast<long long>(val_set_->size())).c_str() : ""));
}

void Trainer::setup_model() {
  const int nc = static_cast<int>(names_.size());
  model_ = impl_.model;
  // A model that was never loaded from weights is initialised again here, after the seed was
  // set, so that `train model=yolo9t seed=0` starts from the same weights in every process
  // (LibTorch's default generator is seeded randomly at start-up).
  const bool fresh = impl_.weights.empty() && !impl_.checkpoint;
  if ((!cfg_.pretrained || fresh) && !resume_ckpt_) {
    model_ = impl_.family->build_like(models::state_dict(*model_), model_->num_classes());
    if (!fresh) log_info("pretrained=false: training from freshly initialised weights");
  }
  if (model_->num_classes() != nc) {
    log_info(strfmt("Dataset has %d classes, model has %d: replacing the class outputs", nc, model_->num_classes()));
    model_->reset_num_classes(nc);
  }
  model_->to(device_);
  if (channels_last_) to_channels_last(*model_);
  impl_.model = model_;
  impl_.names = names_;
  impl_.imgsz = cfg_.imgsz;
  model_->train();
  apply_freeze();
  if (cfg_.ema) {
    ema_model_ = impl_.family->build_like(models::state_dict(*model_), nc);
    models::load_state_dict(*ema_model_, models::state_dict(*model_), true);
    ema_model_->to(device_);
    if (channels_last_) to_channels_last(*ema_model_);
    ema_ = std::make_unique<ModelEMA>(ema_model_, *model_, cfg_.ema_decay, cfg_.ema_tau);
  }
}

void Trainer::apply_freeze() {
  std::string spec = cfg_.freeze;
  if (spec.empty() || spec == "none" || spec == "null" || spec == "false" || spec == "0") return;
  std::vector<std::string> prefixes;
  const auto groups = model_->freeze_groups();
  bool numeric = std::all_of(spec.begin(), spec.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  if (numeric) {
    int n = std::atoi(spec.c_str());
    if (n > static_cast<int>(groups.size()))
      throw UsageError(strfmt("freeze index %d is out of range for %zu available freeze groups.", n, groups.size()));
    prefixes.assign(groups.begin(), groups.begin() + n);
  } else {
    std::stringstream ss(spec);
    std::string part;
    while (std::getline(ss, part, ',')) {
      if (part.empty()) continue;
      if (part == "all") {
        prefixes = groups;
        break;
      }
      prefixes.push_back(part);
    }
  }
  int64_t frozen = 0, total = 0;
  std::vector<bool> used(prefixes.size(), false);
  for (auto& p : model_->named_parameters(true)) {
    total += p.value().numel();
    for (size_t i = 0; i < prefixes.size(); ++i) {
      const auto& pre = prefixes[i];
      if (p.key() == pre || p.key().rfind(pre + ".", 0) == 0) {
        p.value().set_requires_grad(false);
        frozen += p.value().numel();
        used[i] = true;
      }
    }
  }
  for (size_t i = 0; i < prefixes.size(); ++i)
    if (!used[i]) throw UsageError("freeze selector(s) matched no parameters: " + prefixes[i]);
  if (frozen == total)
    throw UsageError("freeze would leave no trainable parameters. Use a smaller freeze value or target a narrower module.");
  frozen_bn_prefixes_ = prefixes;
  log_info(strfmt("Layer freezing: selectors=%zu, params=%lld, trainable=%lld/%lld", prefixes.size(),
                  static_cast<long long>(frozen), static_cast<long long>(total - frozen), static_cast<long long>(total)));
}

void Trainer::setup_optimization() {
  StepSetup setup = make_step_runner(cfg_, model_, impl_.family->make_loss(*model_), ema_.get(), device_, amp_,
                                     channels_last_, static_cast<int64_t>(train_loader_->size()));
  step_ = std::move(setup.runner);
  accumulate_ = setup.accumulate;
  steps_per_epoch_ = setup.steps_per_epoch;
  const auto& g = step_->optimizer().groups();
  log_info(strfmt("Optimizer: %s lr0=%g momentum=%g, groups %zu/%zu/%zu (BN weights / decayed weights / biases)",
                  step_->optimizer().name().c_str(), cfg_.lr0, cfg_.momentum, g.size() > 0 ? g[0].params.size() : 0,
                  g.size() > 1 ? g[1].params.size() : 0, g.size() > 2 ? g[2].params.size() : 0));
  if (accumulate_ > 1) log_info(strfmt("Accumulating gradients over %d batches (nbs=%d)", accumulate_, cfg_.nbs));
  log_info("Precision: " + amp_.describe() + (channels_last_ ? ", channels_last" : ""));
  loss_sums_ = torch::zeros({4}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
}

void Trainer::resume() {
  const io::PyValue& ck = *resume_ckpt_;
  auto weights = ck.get("train_model");
  if (!weights) weights = ck.get("model");
  if (!weights || !weights->is_dict()) throw ModelError("Cannot resume: " + resume_path_ + " has no model weights");
  try {
    io::StateDict sd = io::to_state_dict(*weights, "train_model");
    if (impl_.family->normalize_keys) impl_.family->normalize_keys(sd);
    models::load_state_dict(*model_, sd, true);
  } catch (const Error& e) {
    throw ModelError(std::string("Cannot resume: model architecture mismatch - ") + e.what());
  }
  auto epoch = ck.get("epoch");
  if (!epoch) throw ModelError("Cannot resume: " + resume_path_ + " has no 'epoch' (not a training checkpoint)");
  start_epoch_ = static_cast<int>(epoch->as_int("epoch")) + 1;
  if (auto opt = ck.get("optimizer"); opt && opt->is_dict()) step_->optimizer().load_state_dict(*opt);
  if (ema_) {
    if (auto e = ck.get("ema"); e && e->is_dict()) models::load_state_dict(*ema_model_, io::to_state_dict(*e, "ema"), true);
    if (auto u = ck.get("ema_updates")) ema_->set_updates(u->as_int("ema_updates"));
  }
  if (auto s = ck.get("scaler"); s && s->is_dict()) step_->scaler().load_state_dict(*s);
  if (auto key = ck.get("best_metric_key"); key && key->is_string() && key->s == "metrics/mAP50-95") {
    if (auto v = ck.get("best_mAP50_95"); v && v->is_number()) best_map_ = v->as_float();
    if (auto v = ck.get("best_mAP50"); v && v->is_number()) best_map50_ = v->as_float();
    if (auto v = ck.get("best_epoch"); v && v->is_int()) best_epoch_ = static_cast<int>(v->as_int());
  }
  step_->set_global_step(static_cast<int64_t>(start_epoch_) * steps_per_epoch_);
  log_info(strfmt("Resuming from %s: epoch %d of %d", resume_path_.c_str(), start_epoch_ + 1, cfg_.epochs));
  if (start_epoch_ >= cfg_.epochs)
    throw UsageError(strfmt("Nothing to resume: %s finished epoch %d of %d", resume_path_.c_str(), start_epoch_, cfg_.epochs),
                     "Pass a larger epochs= to train further.");
}

EpochSummary Trainer::train_epoch(int epoch) {
  model_->train();
  if (!frozen_bn_prefixes_.empty())
    for (auto& m : model_->named_modules())
      for (const auto& pre : frozen_bn_prefixes_)
        if ((m.key() == pre || m.key().rfind(pre + ".", 0) == 0) && m.value()->name().find("BatchNorm") != std::string::npos)
          m.value()->eval();
  train_loader_->set_epoch(epoch);
  loss_sums_.zero_();
  batches_done_ = 0;
  const int64_t nb = train_loader_->size();
  auto t0 = Clock::now();
  int64_t bi = 0;
  while (auto batch = train_loader_->next()) {
    StepInfo info;
    info.epoch = epoch;
    info.batch_index = bi;
    info.batch_images = batch->images.size(0);
    const int64_t window_start = (bi / accumulate_) * accumulate_;
    const int64_t window = std::min<int64_t>(accumulate_, nb - window_start);
    info.optimizer_step = (bi + 1) % accumulate_ == 0 || bi == nb - 1;
    info.global_step = step_->global_step();
    run_hooks([&](TrainHook& h) { h.before_step(*this, info); });
    LossOutput out = step_->forward_backward(batch->images, batch->targets, static_cast<double>(window));
    {
      torch::NoGradGuard ng;
      loss_sums_.add_(torch::stack({out.total.to(torch::kFloat), out.box.to(torch::kFloat), out.dfl.to(torch::kFloat),
                                    out.cls.to(torch::kFloat)}));
    }
    if (info.optimizer_step) step_->optimizer_step();
    ++batches_done_;
    run_hooks([&](TrainHook& h) { h.after_step(*this, info); });
    ++bi;
  }
  auto sums = loss_sums_.to(torch::kCPU);
  const double n = std::max<int64_t>(batches_done_, 1);
  EpochSummary e;
  e.epoch = epoch + 1;
  e.loss = sums[0].item<double>() / n;
  e.box_loss = sums[1].item<double>() / n;
  e.dfl_loss = sums[2].item<double>() / n;
  e.cls_loss = sums[3].item<double>() / n;
  for (size_t g = 0; g < step_->optimizer().groups().size(); ++g) e.lrs.push_back(step_->optimizer().lr());
  e.seconds = seconds_since(t0);
  if (!std::isfinite(e.loss))
    throw RuntimeError(strfmt("Training diverged: the loss of epoch %d is %g", epoch + 1, e.loss),
                       "Lower lr0, or use amp_dtype=bfloat16.", "training_diverged");
  return e;
}

std::vector<std::pair<std::string, double>> Trainer::validate() {
  EvalOptions eo;
  eo.imgsz = cfg_.imgsz;
  eo.batch = cfg_.batch;
  eo.workers = workers_;
  eo.conf = 0.001;
  eo.iou = 0.65;
  eo.max_det = 300;
  eo.device = device_;
  eo.amp = amp_.enabled;
  eo.amp_dtype = amp_.dtype;
  models::Detector& m = ema_model_ ? *ema_model_ : *model_;
  return evaluate_detector(m, val_set_, eo);
}

void Trainer::save_checkpoint(int epoch, bool is_best, double epoch_loss) {
  io::CheckpointMeta meta;
  meta.family = impl_.family->name;
  meta.size = model_->size();
  meta.task = impl_.family->task;
  meta.nc = model_->num_classes();
  meta.names = names_;
  meta.imgsz = cfg_.imgsz;
  const bool use_ema = static_cast<bool>(ema_model_);
  auto root = io::make_checkpoint(models::state_dict(use_ema ? *ema_model_ : *model_), meta);
  root->set("epoch", io::PyValue::from_int(epoch));
  root->set("optimizer", step_->optimizer().state_dict());
  root->set("config", config_dict());
  root->set("loss", io::PyValue::from_float(epoch_loss));
  root->set("best_mAP50_95", io::PyValue::from_float(best_map_));
  root->set("best_mAP50", io::PyValue::from_float(best_map50_));
  root->set("best_metric_key", io::PyValue::from_string("metrics/mAP50-95"));
  root->set("best_metric_value", best_epoch_ > 0 ? io::PyValue::from_float(best_map_) : io::PyValue::none());
  root->set("best_epoch", io::PyValue::from_int(best_epoch_));
  root->set("is_ema_weights", io::PyValue::from_bool(use_ema));
  root->set("best_metric", best_epoch_ > 0 ? io::PyValue::from_float(best_map_) : io::PyValue::none());
  root->set("best_metric_name", io::PyValue::from_string("metrics/mAP50-95"));
  if (use_ema) {
    root->set("train_model", io::from_state_dict(models::state_dict(*model_)));
    root->set("ema", io::from_state_dict(models::state_dict(*ema_model_)));
    root->set("ema_updates", io::PyValue::from_int(ema_->updates()));
  }
  root->set("scaler", step_->scaler().state_dict());
  const fs::path wdir = fs::path(save_dir_) / "weights";
  fs::create_directories(wdir);
  const std::string last = (wdir / "last.pt").string();
  io::write_checkpoint(last, *root);
  result_.last_checkpoint = last;
  if (is_best) {
    const std::string best = (wdir / "best.pt").string();
    io::write_checkpoint(best, *root);
    result_.best_checkpoint = best;
    log_info(strfmt("New best model saved - Epoch %d: metrics/mAP50-95=%.4f", epoch + 1, best_map_));
  }
  if (cfg_.save_period > 0 && (epoch + 1) % cfg_.save_period == 0)
    io::write_checkpoint((wdir / ("epoch_" + std::to_string(epoch + 1) + ".pt")).string(), *root);
}

TrainResult Trainer::run() {
  auto t_start = Clock::now();
  setup();
  result_.save_dir = save_dir_;
  ResultsCsv csv((fs::path(save_dir_) / "results.csv").string());
  if (start_epoch_ > 0) csv.keep_epochs_before(start_epoch_ + 1);
  log_info(strfmt("Starting training for %d epochs: %s-%s, batch %d, imgsz %d, lr0 %g, device %s, run dir %s",
                  cfg_.epochs, impl_.family->name.c_str(), model_->size().c_str(), cfg_.batch, cfg_.imgsz, cfg_.lr0,
                  device_.str().c_str(), save_dir_.c_str()));
  if (callbacks_.on_train_start) callbacks_.on_train_start(cfg_, save_dir_);
  run_hooks([&](TrainHook& h) { h.before_train(*this); });

  const int no_aug_start = cfg_.epochs - cfg_.no_aug_epochs;
  if (cfg_.no_aug_epochs > 0 && start_epoch_ > no_aug_start) train_loader_->set_mosaic(false);
  try {
    for (int epoch = start_epoch_; epoch < cfg_.epochs; ++epoch) {
      if (cfg_.no_aug_epochs > 0 && epoch == no_aug_start) {
        log_info(strfmt("Disabling mosaic/mixup for final %d epochs", cfg_.no_aug_epochs));
        train_loader_->set_mosaic(false);
      }
      run_hooks([&](TrainHook& h) { h.before_epoch(*this, epoch); });
      EpochSummary e = train_epoch(epoch);

      std::vector<std::pair<std::string, double>> metrics;
      const bool due = (cfg_.eval_interval > 0 && (epoch + 1) % cfg_.eval_interval == 0) ||
                       (cfg_.save_plots && epoch + 1 >= cfg_.epochs);
      if (val_set_ && due) {
        try {
          metrics = validate();
        } catch (const std::exception& ex) {
          log_warn(std::string("Validation failed: ") + ex.what());
        }
      }
      if (!metrics.empty()) {
        e.validated = true;
        for (const auto& [k, v] : metrics) {
          if (k == "metrics/mAP50-95") e.map50_95 = v;
          if (k == "metrics/mAP50") e.map50 = v;
        }
        e.is_best = best_epoch_ == 0 || e.map50_95 > best_map_;
        if (e.is_best) {
          best_map_ = e.map50_95;
          best_map50_ = e.map50;
          best_epoch_ = epoch + 1;
          patience_counter_ = 0;
        } else {
          ++patience_counter_;
        }
      }
      if ((cfg_.save_period > 0 && (epoch + 1) % cfg_.save_period == 0) || epoch == cfg_.epochs - 1 || e.is_best)
        save_checkpoint(epoch, e.is_best, e.loss);

      std::vector<std::pair<std::string, std::string>> row = {
          {"epoch", std::to_string(e.epoch)},
          {"time", fmt_value(e.seconds)},
          {"train/loss", fmt_value(e.loss)},
          {"validated", e.validated ? "1" : "0"},
          {"is_best", e.is_best ? "1" : "0"},
          {"current_metric", e.validated ? fmt_value(e.map50_95) : ""},
          {"current_metric_name", "metrics/mAP50-95"},
          {"best_metric", best_epoch_ > 0 ? fmt_value(best_map_) : ""},
          {"best_metric_name", "metrics/mAP50-95"},
          {"best_epoch", std::to_string(best_epoch_)},
          {"train/box_loss", fmt_value(e.box_loss)},
          {"train/cls_loss", fmt_value(e.cls_loss)},
          {"train/dfl_loss", fmt_value(e.dfl_loss)}};
      for (const auto& [k, v] : metrics) row.emplace_back(k, fmt_value(v));
      for (size_t g = 0; g < e.lrs.size(); ++g) row.emplace_back("lr/group" + std::to_string(g), fmt_value(e.lrs[g]));
      csv.add(row);

      result_.epochs.push_back(e);
      result_.final_loss = e.loss;
      run_hooks([&](TrainHook& h) { h.after_epoch(*this, e); });
      if (callbacks_.on_epoch_end) callbacks_.on_epoch_end(e);
      if (cfg_.patience > 0 && patience_counter_ >= cfg_.patience) {
        log_info(strfmt("Early stopping triggered after %d epochs (patience=%d, no improvement for %d validations)",
                        epoch + 1, cfg_.patience, patience_counter_));
        break;
      }
    }
  } catch (const std::exception& ex) {
    if (callbacks_.on_train_exception) {
      try {
        callbacks_.on_train_exception(ex);
      } catch (const std::exception& cb) {
        log_warn(std::string("Training exception callback failed: ") + cb.what());
      }
    }
    throw;
  }
  result_.best_epoch = best_epoch_;
  result_.best_mAP50 = best_map50_;
  result_.best_mAP50_95 = best_map_;
  result_.total_seconds = seconds_since(t_start);
  if (result_.best_checkpoint.empty() && fs::exists(fs::path(save_dir_) / "weights" / "best.pt"))
    result_.best_checkpoint = (fs::path(save_dir_) / "weights" / "best.pt").string();

  // summary.json
  nlohmann::json s = {{"total_epochs", cfg_.epochs},
                      {"completed_epochs", start_epoch_ + static_cast<int>(result_.epochs.size())},
                      {"invocation_completed_epochs", static_cast<int>(result_.epochs.size())},
                      {"model_family", impl_.family->name},
                      {"model_size", model_->size()},
                      {"task", impl_.family->task},
                      {"save_dir", save_dir_},
                      {"final_loss", result_.final_loss},
                      {"best_metric", best_epoch_ > 0 ? nlohmann::json(best_map_) : nlohmann::json(nullptr)},
                      {"best_epoch", best_epoch_ > 0 ? nlohmann::json(best_epoch_) : nlohmann::json(nullptr)},
                      {"total_seconds", result_.total_seconds},
                      {"checkpoints", {{"best", result_.best_checkpoint.empty() ? nlohmann::json(nullptr) : nlohmann::json(result_.best_checkpoint)},
                                       {"last", result_.last_checkpoint}}},
                      {"results_scope", "current_invocation"}};
  write_file_atomic((fs::path(save_dir_) / "summary.json").string(), s.dump(2) + "\n");

  // The caller's model ends with the best weights (else the last), EMA ones when EMA is on.
  const std::string restore = !result_.best_checkpoint.empty() ? result_.best_checkpoint : result_.last_checkpoint;
  if (!restore.empty()) {
    auto ck = io::load_torch_file(restore);
    io::StateDict sd = io::to_state_dict(*ck->get("model"), "model");
    models::load_state_dict(*model_, sd, true);
    impl_.weights = restore;
    impl_.checkpoint = ck;
  }
  model_->eval();
  log_info(strfmt("Training complete in %.2f hours", result_.total_seconds / 3600.0));
  run_hooks([&](TrainHook& h) { h.after_train(*this, result_); });
  if (callbacks_.on_train_end) callbacks_.on_train_end(result_);
  return result_;
}

TrainResult run_training(LibreYOLO::Impl& impl, const TrainConfig& cfg, const TrainCallbacks& callbacks,
                         const Kwargs& given) {
  Trainer t(impl, cfg, callbacks, given);
  return t.run();
}

}  // namespace libreyolo::engine
