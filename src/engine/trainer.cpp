#include "engine/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "core/config_schema.hpp"
#include "core/device.hpp"
#include "core/env.hpp"
#include "core/log.hpp"
#include "core/paths.hpp"
#include "core/strings.hpp"
#include "data/dataset_yaml.hpp"
#include "dist/syncs.hpp"
#include "dist/peer_sum.hpp"
#include "engine/autobatch.hpp"
#include "engine/memory_check.hpp"
#include "engine/validator.hpp"
#include "loss/normalizer.hpp"
#include "layers/conv_bn_act.hpp"
#include "layers/cudnn_fusion.hpp"
#include "io/checkpoint.hpp"
#include "models/coco_names.hpp"

namespace fs = std::filesystem;

namespace libreyolo::engine {


namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }


io::PyValuePtr typed_value(OptionType type, const std::string& text) {
  switch (type) {
    case OptionType::Int: return io::PyValue::from_int(std::atoll(text.c_str()));
    case OptionType::Float: return io::PyValue::from_float(std::atof(text.c_str()));
    case OptionType::Bool: return io::PyValue::from_bool(text == "true");
    case OptionType::String: return io::PyValue::from_string(text);
  }
  return io::PyValue::none();
}

// Options that change what a resumed run computes (anything but these: epochs may grow, and the
// rest only affects speed, output or bookkeeping).
bool resume_neutral(const std::string& key) {
  static const std::set<std::string> keys = {"epochs",  "device",    "workers",       "cache",     "resume",    "loader",
                                             "verbose", "project",   "name",          "exist_ok",  "save_period",
                                             "patience", "eval_interval", "val",       "save_plots"};
  return keys.count(key) > 0;
}

std::string saved_option_text(const io::PyValue& v) {
  switch (v.kind) {
    case io::PyValue::Kind::Bool: return v.b ? "true" : "false";
    case io::PyValue::Kind::Int: return std::to_string(v.i);
    case io::PyValue::Kind::Float: return format_option_value(v.f);
    case io::PyValue::Kind::String: return v.s;
    default: return {};
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------

Trainer::Trainer(models::LoadedModel& lm, TrainConfig cfg, Kwargs given)
    : lm_(lm), cfg_(std::move(cfg)), given_(std::move(given)) {
  state_.config = &cfg_;
}

Trainer::~Trainer() {
  if (group_) {
    set_count_sync(nullptr);
    models::set_bn_stats_sync(nullptr);
    // Captured steps hold NCCL's persistent resources: they go before the communicators do, or
    // the backend's shutdown waits for them.
    step_.reset();
    // Unwinding from an error: the other ranks must not wait for this one (see Group::shutdown).
    group_->shutdown(/*finished=*/std::uncaught_exceptions() == 0);
  }
  if (saved_log_level_) set_log_level(*saved_log_level_);
  if (saved_plan_tuning_) models::set_training_plan_tuning(*saved_plan_tuning_);
}

void Trainer::add_hook(std::shared_ptr<TrainHook> hook) {
  loop_.add_hook(std::move(hook));
  if (step_) step_->set_phase_observer(loop_.observing_phases() ? &loop_ : nullptr);
}

io::PyValuePtr Trainer::config_dict() const {
  auto d = io::PyValue::new_dict();
  const auto& schema = train_schema();
  auto values = schema.dump(cfg_);
  for (size_t i = 0; i < schema.fields().size(); ++i)
    d->set(values[i].first, typed_value(schema.fields()[i].type, values[i].second));
  return d;
}

std::vector<std::pair<std::string, double>> Trainer::mean_losses() const {
  auto sums = loss_sums_.to(torch::kCPU);
  const double n = static_cast<double>(std::max<int64_t>(batches_done_, 1));
  std::vector<std::pair<std::string, double>> out;
  out.emplace_back("loss", sums[0].item<double>() / n);
  for (size_t i = 0; i < loss_names_.size(); ++i)
    out.emplace_back(loss_names_[i], sums[static_cast<int64_t>(i + 1)].item<double>() / n);
  return out;
}

// ------------------------------------------------------------------------------------------------ set-up

void Trainer::setup(bool dry_run) {
  started_ = Clock::now();
  setup_resume_config();
  // A scheduler name is the family's to read: checked before anything is loaded.
  lr_shape(cfg_.scheduler, lm_.family->scheduler_names);
  make_paths_absolute(cfg_);
  setup_device();
  setup_data(dry_run);
  setup_model();
  const int local_batch = std::max(1, cfg_.batch / std::max(1, state_.world_size));
  if (device_.is_cpu())
    check_memory_fits(estimate_cpu_training_memory(*model_, local_batch, cfg_.imgsz, workers()), local_batch,
                      cfg_.imgsz);
  else if (device_.is_cuda() && activation_bytes_per_pixel_ > 0)
    check_memory_fits(estimate_cuda_training_memory(activation_bytes_per_pixel_, *model_, local_batch, cfg_.imgsz,
                                                    amp_.enabled, device_),
                      local_batch, cfg_.imgsz);
  if (dry_run) {
    check_dir_creatable(cfg_.project);
    setup_optimization();
    if (resume_ckpt_) resume();
    return;
  }
  // Rank 0 owns every file: it makes the run directory and tells the other ranks its name.
  if (state_.rank == 0) {
    state_.save_dir = make_run_dir(cfg_.project, cfg_.name, cfg_.exist_ok);
    write_train_config(state_.save_dir, cfg_);
  }
  if (group_) state_.save_dir = group_->broadcast_string(state_.save_dir);
  setup_optimization();
  if (resume_ckpt_) resume();
  state_.epochs = cfg_.epochs;
  state_.batches_per_epoch = train_loader_->size();
  result_.save_dir = state_.save_dir;
}

// The run's config keeps its paths absolute (train_config.yaml, the checkpoints): a resume from
// another working directory finds the same dataset and run directory.
void Trainer::make_paths_absolute(TrainConfig& c) {
  if (!c.data.empty() && c.data != "builtin") c.data = fs::absolute(c.data).lexically_normal().string();
  if (!c.project.empty()) c.project = fs::absolute(c.project).lexically_normal().string();
}

void write_train_config(const std::string& save_dir, TrainConfig cfg) {
  Trainer::make_paths_absolute(cfg);
  write_file_atomic((fs::path(save_dir) / "train_config.yaml").string(), to_yaml(train_schema(), cfg));
}

// resume=true / resume=<path>: the checkpoint's config becomes the run's config and the caller's
// explicit options override it; options that change what the run computes are named in a warning.
void Trainer::setup_resume_config() {
  if (cfg_.resume.empty() || cfg_.resume == "false" || cfg_.resume == "False") return;
  if (cfg_.resume == "true" || cfg_.resume == "True") {
    if (!lm_.checkpoint)
      throw UsageError("resume=true requires a checkpoint. Load one first: libreyolo train model=<run>/weights/last.pt resume=true");
    resume_ckpt_ = lm_.checkpoint;
    resume_path_ = lm_.weights;
  } else {
    if (!fs::exists(cfg_.resume)) throw ModelError("Resume checkpoint not found: " + cfg_.resume, "", "checkpoint_not_found");
    resume_ckpt_ = io::load_torch_file(cfg_.resume);
    resume_path_ = cfg_.resume;
    // Its config and state are another family's: said as such, before they are read as this one's.
    const auto fam = resume_ckpt_->get("model_family");
    const models::Family* theirs = fam && fam->is_string() ? models::find_family(fam->s) : nullptr;
    if (theirs && theirs != lm_.family)
      throw ModelError("resume=" + cfg_.resume + " is a " + theirs->name + " checkpoint; the model being trained is " +
                           lm_.family->name,
                       "Resume a run with model=<run>/weights/last.pt resume=true, or give a " + lm_.family->name +
                           " checkpoint.",
                       "model_family_mismatch");
  }
  if (auto saved = resume_ckpt_->get("config"); saved && saved->is_dict()) {
    TrainConfig restored;
    Kwargs kv;
    for (const auto& [k, v] : saved->dict) {
      if (!k->is_string() || !train_schema().find(k->s)) continue;
      std::string text = saved_option_text(*v);
      if (v->kind == io::PyValue::Kind::String || !text.empty()) kv.emplace_back(k->s, text);
    }
    train_schema().apply(restored, kv, "train");
    const TrainConfig saved_cfg = restored;
    train_schema().apply(restored, given_, "train");
    make_paths_absolute(restored);  // a path given again relative to here is not a change
    restored.resume = cfg_.resume;
    // What the caller changed, compared in the schema's own text form.
    const auto before = train_schema().dump(saved_cfg), after = train_schema().dump(restored);
    std::vector<std::string> changed;
    for (size_t i = 0; i < before.size(); ++i)
      if (before[i].second != after[i].second && !resume_neutral(before[i].first))
        changed.push_back(before[i].first + " " + before[i].second + " -> " + after[i].second);
    if (!changed.empty()) {
      std::string list;
      for (const auto& c : changed) list += (list.empty() ? "" : ", ") + c;
      log_warn("Resuming with changed options (" + list +
               "): the run continues with them, but it is no longer an exact continuation of the saved one");
    }
    cfg_ = restored;
    libreyolo::validate(cfg_);
  }
  if (cfg_.data.empty())
    throw UsageError("Cannot resume " + resume_path_ + ": its saved config names no dataset", "Pass data=<dataset.yaml>.",
                     "config_required_key");
  // A finished run is refused before anything is built.
  if (auto epoch = resume_ckpt_->get("epoch"); epoch && epoch->is_int()) {
    const int done = static_cast<int>(epoch->as_int("epoch")) + 1;
    if (done >= cfg_.epochs)
      throw UsageError(strfmt("Nothing to resume: %s finished epoch %d of %d", resume_path_.c_str(), done, cfg_.epochs),
                       strfmt("Pass a larger epochs= (e.g. epochs=%d) to train further.", done + 10));
  }
  // Continue in the run directory the checkpoint came from, if it is one of ours.
  fs::path wdir = fs::path(resume_path_).parent_path();
  if (wdir.filename() == "weights" && fs::exists(wdir.parent_path() / "train_config.yaml")) {
    cfg_.project = wdir.parent_path().parent_path().string();
    cfg_.name = wdir.parent_path().filename().string();
    cfg_.exist_ok = true;
  }
}

void Trainer::setup_device() {
  if (auto env = dist::rank_env_from_environment()) {
    setup_distributed(*env);
  } else {
    if (wants_distributed(cfg_.device))
      throw UsageError(
          "Multi-GPU device " + cfg_.device + " was passed to the trainer directly, without a process group",
          strfmt("Use the model API or the CLI, which start one worker per GPU (model.train({{\"device\", \"%s\"}, "
                 "...}) / libreyolo train device=%s ...), or launch with torchrun: torchrun --nproc_per_node=%zu "
                 "--no-python libreyolo train ...",
                 cfg_.device.c_str(), cfg_.device.c_str(), parse_device_list(cfg_.device).size()),
          "config_unsupported");
    device_ = resolve_device(cfg_.device);
  }
  if (device_ != lm_.device) lm_.to(device_);
  if (cfg_.seed >= 0) torch::manual_seed(static_cast<uint64_t>(cfg_.seed));
  amp_ = plan_amp(cfg_.amp, cfg_.amp_dtype, device_);
  workers_ = cfg_.workers;
  if (device_.is_cpu()) {
    // CPU training: the step and the loader share this run's cores (its share when other CPU
    // trainings run: core/cpu_share.hpp), and torch's OpenMP threads spin while they wait, so
    // oversubscription slows every step several times over. Give the loader a quarter of the
    // cores (none on a small machine: it then runs between steps) and the step the rest.
    // (2 cores, the default model at 160 px: 47 img/s this way, 30 with one core each.)
    const char* share = env_get("LIBREYOLO_CPU_SHARE");
    if (!share || std::string(share) != "0") cpu_share_ = std::make_unique<CpuShare>(available_cores());
    const int cores = cpu_cores();
    workers_ = std::min(cfg_.workers, cores / 4);
    compute_threads_ = std::max(1, cores - workers_);
    at::set_num_threads(compute_threads_);
    const int trainings = cpu_share_ ? cpu_share_->trainings() : 1;
    log_info(strfmt("CPU training on %s%s: %s (of %d asked), %s", count_of(cores, "core").c_str(),
                    trainings > 1 ? strfmt(" (%d available, shared by %d trainings)", available_cores(), trainings).c_str()
                                  : "",
                    count_of(workers_, "loader worker").c_str(), cfg_.workers,
                    count_of(compute_threads_, "compute thread").c_str()));
    warn_spinning_threads();
  }
  channels_last_ = trains_channels_last(cfg_.memory_format, device_);
  // Every training batch has the same shape: let cuDNN time its algorithms once and keep the
  // fastest (measured on an H200: v9-t batch 8 bf16 step 75 -> 67 ms), unless asked for runs that
  // repeat bit for bit.
  if (device_.is_cuda())
    for (const std::string& line : configure_cudnn(true, cfg_.deterministic)) log_info(line);
}

// Under torchrun every rank trains, whatever `device` says (as in LibreYOLO): rank i on
// cuda:LOCAL_RANK, or on the CPU (Gloo) with device=cpu or without CUDA.
void Trainer::setup_distributed(const dist::RankEnv& env) {
  const std::string d = lower(trim(cfg_.device));
  if (d == "cpu" || d == "mps" || !torch::cuda::is_available()) {
    device_ = torch::Device(torch::kCPU);
  } else {
    if (env.local_rank >= static_cast<int>(torch::cuda::device_count()))
      throw UsageError(strfmt("LOCAL_RANK=%d but this process sees %d GPU(s)", env.local_rank,
                              static_cast<int>(torch::cuda::device_count())),
                       "Launch at most one rank per visible GPU (torchrun --nproc_per_node).", "config_invalid");
    device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  }
  if (env.rank != 0 && log_level() < LogLevel::Warning) {
    saved_log_level_ = log_level();
    set_log_level(LogLevel::Warning);
  }
  group_ = dist::Group::create(env, device_);
  state_.rank = env.rank;
  state_.world_size = env.world_size;
  log_info(strfmt("DDP active: rank=%d/%d device=%s backend=%s%s", env.rank, env.world_size, device_.str().c_str(),
                  group_->backend_name().c_str(), env.spawned ? " (spawned workers)" : ""));
  if (cfg_.profile) {
    log_warn("profile=true is not available under multi-GPU training: the profiler is off for this run "
             "(profile on one GPU: the per-GPU step is the same)");
    cfg_.profile = false;
  }
}

void Trainer::install_syncs() {
  step_->set_grad_sync(std::make_unique<dist::AllReduceGradSync>(group_));
  std::string how;
  const auto sum = dist::make_cross_process_sum(group_, &how);
  set_count_sync(sum);
  bool has_bn = false;
  for (const auto& m : model_->modules(false)) has_bn = has_bn || models::is_batchnorm(*m);
  if (cfg_.sync_bn) models::set_bn_stats_sync(sum);
  const int per_rank = cfg_.batch / state_.world_size;
  log_info(strfmt("Multi-GPU: %d ranks x batch %d (global batch %d); gradients averaged; loss normalisers "
                  "averaged over ranks; sync_bn %s; small sums %s",
                  state_.world_size, per_rank, cfg_.batch, cfg_.sync_bn ? "on" : "off", how.c_str()));
  if (has_bn && !cfg_.sync_bn && per_rank < 16)
    log_warn(strfmt("DDP per-rank batch is %d (global batch %d / world_size %d) and sync_bn is disabled; BatchNorm "
                    "running statistics are computed per rank on this small shard, which can reduce accuracy versus "
                    "single-GPU. Consider setting sync_bn=true.",
                    per_rank, cfg_.batch, state_.world_size));
}

void Trainer::sync_after_epoch(TrainState& s) {
  if (!group_) return;
  s.stop = group_->broadcast_flag(s.stop);
}

void Trainer::sync_before_end(TrainState& s) {
  if (!group_) return;
  group_->barrier();
  result_.best_checkpoint = group_->broadcast_string(result_.best_checkpoint);
  result_.last_checkpoint = group_->broadcast_string(result_.last_checkpoint);
}

void Trainer::setup_data(bool dry_run) {
  const std::string yaml = resolve_data_arg(cfg_.data);
  data::DatasetSpec spec = data::load_dataset_yaml(yaml);
  names_ = spec.names;
  if (static_cast<int>(names_.size()) != spec.nc) names_ = models::default_names(spec.nc);
  data::DatasetOptions dopt;
  dopt.imgsz = cfg_.imgsz;
  dopt.fit = lm_.family->input.fit;
  dopt.num_classes = spec.nc;
  dopt.reduced_decode = cfg_.reduced_decode;
  dopt.cache = data::cache_mode(cfg_.cache);
  // A dry run writes nothing and loads no pixels: the images are checked as the run checks them,
  // the cache (memory or files beside the images) is left to the run.
  if (dry_run && dopt.cache != data::CacheMode::None) {
    log_info("dry run: cache=" + cfg_.cache + " is not filled (the run fills it)");
    dopt.cache = data::CacheMode::None;
  }
  train_set_ = std::make_shared<data::YoloDataset>(data::list_split_images(spec, "train"), dopt);
  if (cfg_.val && spec.has_split("val")) {
    data::DatasetOptions vopt = dopt;
    // Validation scores the pixels predict gives the model, full decodes, whatever the training
    // loader does: a model trained with the reduced decode read lower on reduced decodes than on
    // full ones (0.085 against 0.145 mAP50-95 for one detector after 3 epochs on the CPU).
    vopt.reduced_decode = false;
    val_set_ = std::make_shared<data::YoloDataset>(data::list_split_images(spec, "val"), vopt);
  } else if (cfg_.val) {
    log_warn("The dataset has no 'val' split: training without validation");
  }
  const int ws = state_.world_size;
  // batch=-1: AutoBatch probes the model on rank 0's device (before any SyncBN exists, so the
  // probe makes no collective call) and rank 0's answer reaches every rank.
  if (cfg_.batch == -1) {
    if (state_.rank == 0) cfg_.batch = resolve_train_batch(cfg_, *lm_.model, device_, amp_, channels_last_, ws);
    if (group_) cfg_.batch = static_cast<int>(group_->broadcast_int(state_.rank == 0 ? cfg_.batch : 0));
  }
  dist::check_global_batch(cfg_.batch, ws);
  data::LoaderOptions lo;
  lo.mode = data::LoaderMode::Train;
  lo.batch = cfg_.batch / ws;
  lo.rank = state_.rank;
  lo.world = ws;
  lo.workers = workers_;
  lo.pin_memory = device_.is_cuda();
  lo.shuffle = true;
  lo.seed = static_cast<uint64_t>(std::max(cfg_.seed, 0));
  lo.augment.mosaic_prob = cfg_.mosaic_prob;
  lo.augment.mixup_prob = cfg_.mixup_prob;
  lo.augment.hsv_prob = cfg_.hsv_prob;
  lo.augment.flip_prob = cfg_.flip_prob;
  lo.augment.recipe = lm_.family->augment;
  lo.augment.fit = lm_.family->input.fit;
  lo.augment.max_labels = lm_.family->augment.max_labels;
  lo.augment.degrees = cfg_.degrees;
  lo.augment.translate = cfg_.translate;
  lo.augment.shear = cfg_.shear;
  std::tie(lo.augment.mosaic_scale_lo, lo.augment.mosaic_scale_hi) = parse_scale_range("mosaic_scale", cfg_.mosaic_scale);
  std::tie(lo.augment.mixup_scale_lo, lo.augment.mixup_scale_hi) = parse_scale_range("mixup_scale", cfg_.mixup_scale);
  // loader=gpu: decode and augment on this run's GPU where the recipe and build allow it; auto
  // stays on the CPU loader until the GPU one is measured faster end to end.
  std::string loader_note;
  if (cfg_.loader == "gpu") {
    std::string why;
    if (!device_.is_cuda()) {
      log_warn("loader=gpu needs a CUDA device: using the CPU loader");
    } else if (!data::gpu_loader_supports(*train_set_, lo, &why)) {
      log_warn("loader=gpu: " + why + "; using the CPU loader");
    } else {
      lo.gpu = device_.has_index() ? device_.index() : 0;
    }
  }
  train_loader_ = std::make_unique<data::DataLoader>(train_set_, lo);
  if (lo.gpu >= 0)
    loader_note = "; samples decoded (nvJPEG, " + train_loader_->gpu_decoder() + ") and augmented on the GPU";
  if (train_set_->num_boxes() == 0)
    throw DataError(strfmt("the training split's %lld images have no labels (no label file, or only empty ones): "
                           "there is nothing to learn; looked for %s first",
                           static_cast<long long>(train_set_->size()),
                           data::label_path_for(train_set_->image_path(0)).c_str()),
                    "Labels go beside the images: .../images/x.jpg -> .../labels/x.txt, one 'class cx cy w h' row "
                    "per object.",
                    "no_labels");
  if (val_set_ && val_set_->num_boxes() == 0) {
    log_warn("The validation split has no labels (looked for " + data::label_path_for(val_set_->image_path(0)) +
             " first): its mAP is undefined, so training runs without validation (no best.pt; weights/last.pt is the "
             "result)");
    val_set_.reset();
  }
  if (train_loader_->size() == 0)
    throw DataError("The training split has " + std::to_string(train_set_->size()) + " images, fewer than one batch of " +
                        std::to_string(cfg_.batch),
                    "Use a smaller batch.", "data_invalid");
  log_info(strfmt("Train: %s, %s of %d per epoch%s%s", count_of(static_cast<long long>(train_set_->size()), "image").c_str(),
                  count_of(static_cast<long long>(train_loader_->size()), "batch", "batches").c_str(), cfg_.batch / ws,
                  ws > 1 ? strfmt(" on each of %d ranks", ws).c_str() : "",
                  val_set_ ? strfmt("; val: %lld images", static_cast<long long>(val_set_->size())).c_str() : "")
           + loader_note);
}

void Trainer::setup_model() {
  const int nc = static_cast<int>(names_.size());
  model_ = lm_.model;
  // A model that was never loaded from weights is initialised again here, after the seed was
  // set, so that a fresh model's `train ... seed=0` starts from the same weights in every process
  // (LibTorch's default generator is seeded randomly at start-up).
  const bool fresh = lm_.weights.empty() && !lm_.checkpoint;
  if ((!cfg_.pretrained || fresh) && !resume_ckpt_) {
    model_ = lm_.family->build_like(models::state_dict(*model_), model_->num_classes());
    if (!fresh) log_info("pretrained=false: training from freshly initialised weights");
  }
  if (model_->num_classes() != nc) {
    log_info(strfmt("Dataset has %d classes, model has %d: replacing the class outputs", nc, model_->num_classes()));
    model_->reset_num_classes(nc);
  }
  setup_aux(!fresh && cfg_.pretrained);
  // The device's memory estimate is measured here, on the CPU, before the model moves.
  const auto params = model_->parameters();
  if (device_.is_cuda() && !params.empty() && params.front().device().is_cpu())
    activation_bytes_per_pixel_ = cpu_activation_bytes_per_pixel(*model_);
  model_->to(device_);
  if (channels_last_) to_channels_last(*model_);
  lm_.model = model_;
  lm_.names = names_;
  lm_.imgsz = cfg_.imgsz;
  model_->train();
  apply_freeze();
  // Every rank starts from rank 0's weights (they load the same file, but a fresh model's
  // initialisation need not agree).
  if (group_) dist::broadcast_module(*model_, *group_);
  if (cfg_.ema) {
    ema_model_ = lm_.family->build_like(models::state_dict(*model_), nc);
    if (model_->aux_weight() > 0) ema_model_->enable_aux(model_->aux_weight());
    models::load_state_dict(*ema_model_, models::state_dict(*model_), true);
    ema_model_->to(device_);
    if (channels_last_) to_channels_last(*ema_model_);
    ema_ = std::make_unique<ModelEMA>(ema_model_, *model_, cfg_.ema_decay, cfg_.ema_tau);
  }
}

namespace {
bool has_prefix(const std::string& key, const std::vector<std::string>& prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return key.rfind(p, 0) == 0; });
}
}  // namespace

void Trainer::setup_aux(bool from_weights) {
  double weight = cfg_.aux_weight;
  if (resume_ckpt_ && weight > 0) {
    // The branch continues when the checkpoint has it; a run saved without one goes on without.
    auto w = resume_ckpt_->get("train_model");
    if (!w) w = resume_ckpt_->get("model");
    bool saved = false;
    if (w && w->is_dict())
      for (const auto& [k, v] : w->dict) saved = saved || (k->is_string() && has_prefix(k->s, lm_.family->aux_prefixes));
    if (!saved) {
      log_info("The checkpoint was trained without the auxiliary branch: resuming without it (aux_weight 0)");
      weight = 0;
    }
  }
  if (weight <= 0) {
    model_->enable_aux(0);
    return;
  }
  if (!model_->enable_aux(weight))
    throw UsageError(strfmt("aux_weight=%g: %s has no auxiliary branch", weight, lm_.family->name.c_str()),
                     "Use aux_weight=0.", "config_range_error");
  log_info(strfmt("Auxiliary branch (training only): loss weight %g", weight));
  // Its tensors from the loaded weights, when they carried them (set aside at loading).
  if (from_weights && !resume_ckpt_ && !lm_.aux_state.empty()) {
    const auto report = models::load_state_dict(*model_, lm_.aux_state, /*strict=*/false, /*part=*/true);
    if (!report.shape_mismatch.empty())
      log_warn("The weights' auxiliary branch does not fit (" + report.shape_mismatch.front() +
               "): it starts from fresh values");
    else
      log_info(strfmt("Auxiliary branch: %zu tensors from the loaded weights", lm_.aux_state.size()));
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
  frozen_prefixes_ = prefixes;
  log_info(strfmt("Layer freezing: selectors=%zu, params=%lld, trainable=%lld/%lld", prefixes.size(),
                  static_cast<long long>(frozen), static_cast<long long>(total - frozen), static_cast<long long>(total)));
}

void Trainer::setup_optimization() {
  StepSetup setup = make_step_runner(cfg_, model_, lm_.family->make_loss(*model_), ema_.get(), device_, amp_,
                                     channels_last_, static_cast<int64_t>(train_loader_->size()), lm_.family);
  step_ = std::move(setup.runner);
  accumulate_ = setup.accumulate;
  steps_per_epoch_ = setup.steps_per_epoch;
  std::string groups;
  for (const auto& g : step_->optimizer().groups())
    groups += strfmt("%s%s %zu", groups.empty() ? "" : ", ", g.label.c_str(), g.params.size()) +
              (g.lr_ratio != 1.0 ? strfmt(" (lr x %g)", g.lr_ratio) : "");
  log_info(strfmt("Optimizer: %s lr0=%g momentum=%g, groups: %s", step_->optimizer().name().c_str(), cfg_.lr0,
                  cfg_.momentum, groups.c_str()));
  if (accumulate_ > 1) log_info(strfmt("Accumulating gradients over %d batches (nbs=%d)", accumulate_, cfg_.nbs));
  log_info("Precision: " + amp_.describe() + (channels_last_ ? ", channels_last" : ""));
  if (!lm_.family->default_amp_reason.empty())
    log_info(strfmt("AMP default of %s: %s (%s)", lm_.family->name.c_str(), lm_.family->default_amp ? "on" : "off",
                    lm_.family->default_amp_reason.c_str()));
  if (group_) install_syncs();
  // A single process times its new convolution plans on a worker while its first steps run on
  // the heuristics' plans; ranks of a group time them in the call, so that every rank captures
  // its step at the same occurrence.
  const auto before = models::set_training_plan_tuning(group_ ? models::PlanTuning::InCall : models::PlanTuning::Background);
  if (!saved_plan_tuning_) saved_plan_tuning_ = before;
  if (cfg_.cuda_graph) enable_declared_cuda_graphs(*step_, *lm_.family, cfg_.cuda_graph_scope, group_ != nullptr);
  loss_names_ = step_->loss().term_names();
  loss_sums_ = torch::zeros({1 + static_cast<int64_t>(loss_names_.size())},
                            torch::TensorOptions().dtype(torch::kFloat).device(device_));
}

void Trainer::resume() {
  const io::PyValue& ck = *resume_ckpt_;
  auto weights = ck.get("train_model");
  if (!weights) weights = ck.get("model");
  if (!weights || !weights->is_dict()) throw ModelError("Cannot resume: " + resume_path_ + " has no model weights");
  try {
    io::StateDict sd = io::to_state_dict(*weights, "train_model");
    if (lm_.family->normalize_keys) lm_.family->normalize_keys(sd);
    models::load_state_dict(*model_, sd, true);
  } catch (const Error& e) {
    throw ModelError(std::string("Cannot resume: model architecture mismatch - ") + e.what());
  }
  auto epoch = ck.get("epoch");
  if (!epoch) throw ModelError("Cannot resume: " + resume_path_ + " has no 'epoch' (not a training checkpoint)");
  const int start_epoch = static_cast<int>(epoch->as_int("epoch")) + 1;
  if (auto opt = ck.get("optimizer"); opt && opt->is_dict()) step_->optimizer().load_state_dict(*opt);
  if (ema_) {
    if (auto e = ck.get("ema"); e && e->is_dict()) models::load_state_dict(*ema_model_, io::to_state_dict(*e, "ema"), true);
    if (auto u = ck.get("ema_updates")) ema_->set_updates(u->as_int("ema_updates"));
  }
  if (auto s = ck.get("scaler"); s && s->is_dict()) step_->scaler().load_state_dict(*s);
  if (auto key = ck.get("best_metric_key"); key && key->is_string() && key->s == "metrics/mAP50-95") {
    if (auto v = ck.get("best_mAP50_95"); v && v->is_number()) best_.map50_95 = v->as_float();
    if (auto v = ck.get("best_mAP50"); v && v->is_number()) best_.map50 = v->as_float();
    if (auto v = ck.get("best_epoch"); v && v->is_int()) best_.epoch = static_cast<int>(v->as_int());
  }
  step_->set_global_step(static_cast<int64_t>(start_epoch) * steps_per_epoch_);
  state_.start_epoch = start_epoch;
  log_info(strfmt("Resuming from %s: epoch %d of %d", resume_path_.c_str(), start_epoch + 1, cfg_.epochs));
}

// ------------------------------------------------------------------------------------------------ the loop

int Trainer::cpu_cores() const {
  // At most the threads torch started with (OMP_NUM_THREADS, else its default; a spawned
  // data-parallel rank has 1): what the process was given.
  static const int at_start = std::max(1, at::get_num_threads());
  return std::max(1, std::min(at_start, cpu_share_ ? cpu_share_->cores() : at_start));
}

void Trainer::share_cpu() {
  // Other CPU trainings started or ended: take this run's new share of the cores (looked at no
  // more than once a second: a directory listing).
  if (!cpu_share_) return;
  const auto now = Clock::now();
  if (now - cpu_share_checked_ < std::chrono::seconds(1)) return;
  cpu_share_checked_ = now;
  const int threads = std::max(1, cpu_cores() - workers_);
  if (threads == compute_threads_) return;
  log_info(strfmt("CPU training: %s now (%d trainings share %s)", count_of(threads, "compute thread").c_str(),
                  cpu_share_->trainings(), count_of(available_cores(), "core").c_str()));
  at::set_num_threads(threads);
  compute_threads_ = threads;
  warn_spinning_threads();
}

void Trainer::warn_spinning_threads() {
  // OpenMP reads its wait policy when the library loads, before main(): a process cannot change
  // it for itself, so say what to set. Once a run.
  if (spin_warned_ || !cpu_share_ || cpu_share_->trainings() < 2 || env_get("OMP_WAIT_POLICY")) return;
  spin_warned_ = true;
  log_warn(
      "Other CPU trainings share this machine, and OpenMP's waiting threads spin unless told "
      "otherwise: where trainings side by side run more than one thread each, that slows them "
      "several times over. Start them with OMP_WAIT_POLICY=PASSIVE in the environment to have "
      "waiting threads sleep.");
}

void Trainer::begin_epoch(TrainState& s) {
  model_->train();
  // Frozen layers keep their BatchNorm statistics.
  if (!frozen_prefixes_.empty())
    for (auto& m : model_->named_modules())
      for (const auto& pre : frozen_prefixes_)
        if ((m.key() == pre || m.key().rfind(pre + ".", 0) == 0) && models::is_batchnorm(*m.value())) m.value()->eval();
  train_loader_->set_epoch(s.epoch);
  loss_sums_.zero_();
  batches_done_ = 0;
  s.batch_index = -1;
  epoch_start_ = Clock::now();
}

bool Trainer::next_batch(TrainState& s) {
  share_cpu();
  current_batch_ = nullptr;
  batch_ = train_loader_->next();
  if (!batch_) return false;
  const int64_t bi = ++s.batch_index;
  s.batch_images = batch_->images.size(0);
  window_ = accumulation_window(bi, s.batches_per_epoch, accumulate_);
  s.optimizer_step = window_.optimizer_step;
  s.global_step = step_->global_step();
  current_batch_ = &*batch_;
  // A hook that observes phases may have joined or left since the last step.
  step_->set_phase_observer(loop_.observing_phases() ? &loop_ : nullptr);
  return true;
}

void Trainer::run_step(TrainState& s) {
  LossOutput out = step_->forward_backward(batch_->images, batch_->targets, static_cast<double>(window_.size));
  {
    torch::NoGradGuard ng;
    loss_sums_.narrow(0, 0, 1).add_(out.total.reshape({1}));
    loss_sums_.narrow(0, 1, out.terms.size(0)).add_(out.terms);
  }
  if (s.optimizer_step) step_->optimizer_step();
  ++batches_done_;
}

EpochSummary Trainer::end_epoch(TrainState& s) {
  current_batch_ = nullptr;
  batch_.reset();
  EpochSummary e;
  e.epoch = s.epoch + 1;
  const auto means = mean_losses();
  e.loss = means[0].second;
  e.losses.assign(means.begin() + 1, means.end());
  for (size_t g = 0; g < step_->optimizer().groups().size(); ++g) e.lrs.push_back(step_->optimizer().lr());
  e.seconds = seconds_since(epoch_start_);
  if (!std::isfinite(e.loss))
    throw RuntimeError(strfmt("Training diverged: the loss of epoch %d is %g", e.epoch, e.loss),
                       "Lower lr0, or use amp_dtype=bfloat16.", "training_diverged");
  return e;
}

TrainResult Trainer::run() {
  loop_.run(*this, result_, started_);
  return result_;
}

}  // namespace libreyolo::engine
