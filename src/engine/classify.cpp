#include "engine/classify.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include <libreyolo/errors.hpp>

#include "core/device.hpp"
#include "core/interrupt.hpp"
#include "core/log.hpp"
#include "core/paths.hpp"
#include "core/strings.hpp"
#include "data/classify_loader.hpp"
#include "data/dataset.hpp"
#include "engine/amp.hpp"
#include "engine/ema.hpp"
#include "engine/inference.hpp"
#include "engine/optimizer.hpp"
#include "data/gpu_batch.hpp"
#include "engine/predictor.hpp"
#include "engine/schedule.hpp"
#include "engine/step.hpp"
#include "engine/train_hooks.hpp"
#include "engine/train_loop.hpp"
#include "engine/trainer.hpp"
#include "eval/confusion.hpp"
#include "io/checkpoint.hpp"
#include "io/image.hpp"
#include "io/sample_image.hpp"
#include "loss/classify.hpp"
#include "models/forward_graphs.hpp"
#include "models/input.hpp"
#include "ops/draw.hpp"
#include "plots/plots.hpp"

namespace fs = std::filesystem;

namespace libreyolo::engine {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

models::Classifier& classifier_of(const models::LoadedModel& lm) {
  auto* c = models::as_classifier(*lm.model);
  if (!c) throw std::logic_error("the classify task got a model that is not a classifier");
  return *c;
}

std::string fmt(double v) { return strfmt("%.6g", v); }

// The run's results.csv, rewritten whole after every epoch.
void write_results_csv(const std::string& path, const std::vector<std::vector<std::pair<std::string, std::string>>>& rows) {
  if (rows.empty()) return;
  std::string out;
  for (size_t i = 0; i < rows.front().size(); ++i) out += (i ? "," : "") + rows.front()[i].first;
  out += "\n";
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) out += (i ? "," : "") + r[i].second;
    out += "\n";
  }
  write_file_atomic(path, out);
}

void plot_confusion(const ClassifyMetrics& m, const std::vector<std::string>& names, const std::string& png) {
  if (static_cast<int>(names.size()) > eval::ConfusionMatrix::kMaxClasses || m.confusion.empty()) return;
  plots::plot_confusion_matrix(m.confusion, names, png);
}

struct ClassifyCheckpointExtras {
  int epoch = 0;
  double best_top1 = 0;
  int best_epoch = 0;
  bool ema = false;
};

void save_classify_checkpoint(const std::string& path, const models::LoadedModel& lm, torch::nn::Module& weights,
                              torch::nn::Module* train_model, const Optimizer* opt, const ClassifyCheckpointExtras& x) {
  auto root = io::make_checkpoint(models::state_dict(weights), lm.meta());
  root->set("epoch", io::PyValue::from_int(x.epoch));
  root->set("best_mAP50_95", io::PyValue::from_float(x.best_top1));
  root->set("best_mAP50", io::PyValue::from_float(x.best_top1));
  root->set("best_metric_key", io::PyValue::from_string("metrics/accuracy_top1"));
  root->set("best_metric_value", io::PyValue::from_float(x.best_top1));
  root->set("best_metric_name", io::PyValue::from_string("metrics/accuracy_top1"));
  root->set("best_metric", io::PyValue::from_float(x.best_top1));
  root->set("best_epoch", io::PyValue::from_int(x.best_epoch));
  root->set("is_ema_weights", io::PyValue::from_bool(x.ema));
  if (train_model) root->set("train_model", io::from_state_dict(models::state_dict(*train_model)));
  if (opt) root->set("optimizer", opt->state_dict());
  io::write_checkpoint(path, *root);
}

}  // namespace

std::vector<std::pair<std::string, double>> ClassifyMetrics::as_list() const {
  return {{"metrics/accuracy_top1", top1}, {"metrics/accuracy_top5", top5}, {"metrics/precision", precision},
          {"metrics/recall", recall},      {"metrics/f1", f1},               {"fitness", top1}};
}

void throw_task_mismatch(const models::LoadedModel& lm, const std::string& wanted_task) {
  const std::string what = lm.weights.empty() ? lm.family->name + lm.model->size() : lm.weights;
  throw ModelError(what + " is a " + lm.family->task + " model (" + lm.family->name + "), not a " + wanted_task +
                       " model",
                   lm.family->task == "classify"
                       ? "Use `libreyolo classify ...` (or no task word) with a folder of class folders."
                       : "Use a classifier checkpoint for the classify task.",
                   "model_task_mismatch");
}

double classify_crop_pct(const models::LoadedModel& lm) {
  return lm.family->crop_pct ? lm.family->crop_pct(lm.model->size()) : 1.0;
}

ClassifyMetrics evaluate_classifier(models::Classifier& model, const models::Family& family,
                                    const data::ClassifySplit& split, int nc, int imgsz, double crop_pct, int batch,
                                    const torch::Device& device, bool half, int workers) {
  const bool was_training = model.is_training();
  model.eval();
  torch::NoGradGuard no_grad;
  ClassifyMetrics m;
  m.confusion.assign(static_cast<size_t>(nc) * static_cast<size_t>(nc), 0);
  std::vector<int64_t> per_target(static_cast<size_t>(nc), 0), per_pred(static_cast<size_t>(nc), 0),
      hits(static_cast<size_t>(nc), 0);
  const int64_t k = std::min<int64_t>(5, nc);
  int64_t correct1 = 0, correct5 = 0;
  double loss_sum = 0, pre_ms = 0, inf_ms = 0;
  const int64_t n = static_cast<int64_t>(split.samples.size());
  data::ClassifyLoaderOptions lo;
  lo.train = false;
  lo.batch = std::max(1, batch);
  lo.workers = workers;
  lo.imgsz = imgsz;
  lo.crop_pct = crop_pct;
  lo.pin_memory = device.is_cuda();
  std::optional<data::ClassifyLoader> loader;
  if (n > 0) loader.emplace(split, lo);
  for (;;) {
    auto t0 = Clock::now();
    std::optional<data::ClassifyBatch> b = loader ? loader->next() : std::nullopt;
    if (!b) break;
    const int64_t count = b->labels.size(0);
    const int64_t* labels = b->labels.data_ptr<int64_t>();
    auto x = models::to_network_input(b->images, family.input, device, false);
    pre_ms += ms_since(t0);
    t0 = Clock::now();
    torch::Tensor logits;
    {
      AutocastGuard ac(device.type(), half && device.is_cuda(), torch::kHalf);
      logits = model.logits(x);
    }
    logits = logits.to(torch::kFloat).cpu();
    inf_ms += ms_since(t0);
    loss_sum += loss::classification_loss(logits, b->labels).item<double>() * static_cast<double>(count);
    const auto topk = std::get<1>(logits.topk(k, 1)).contiguous();
    const int64_t* ranked = topk.data_ptr<int64_t>();
    for (int64_t i = 0; i < count; ++i) {
      const int64_t t = labels[i], p = ranked[i * k];
      correct1 += p == t;
      correct5 += std::find(ranked + i * k, ranked + (i + 1) * k, t) != ranked + (i + 1) * k;
      ++per_target[static_cast<size_t>(t)];
      ++per_pred[static_cast<size_t>(p)];
      hits[static_cast<size_t>(t)] += p == t;
      ++m.confusion[static_cast<size_t>(p * nc + t)];
    }
  }
  m.samples = n;
  if (n > 0) {
    m.top1 = static_cast<double>(correct1) / static_cast<double>(n);
    m.top5 = static_cast<double>(correct5) / static_cast<double>(n);
    m.loss = loss_sum / static_cast<double>(n);
    m.preprocess_ms = pre_ms / static_cast<double>(n);
    m.inference_ms = inf_ms / static_cast<double>(n);
  }
  // Macro averages over the classes that have validation samples.
  int counted = 0;
  double p_sum = 0, r_sum = 0, f_sum = 0;
  for (int c = 0; c < nc; ++c) {
    if (per_target[static_cast<size_t>(c)] == 0) continue;
    const double h = static_cast<double>(hits[static_cast<size_t>(c)]);
    const double p = per_pred[static_cast<size_t>(c)] ? h / static_cast<double>(per_pred[static_cast<size_t>(c)]) : 0.0;
    const double r = h / static_cast<double>(per_target[static_cast<size_t>(c)]);
    p_sum += p, r_sum += r, f_sum += (p + r) > 0 ? 2 * p * r / (p + r) : 0.0;
    ++counted;
  }
  if (counted) m.precision = p_sum / counted, m.recall = r_sum / counted, m.f1 = f_sum / counted;
  if (was_training) model.train();
  return m;
}

ValResult run_classify_validation(models::LoadedModel& lm, const ValConfig& cfg) {
  auto& model = classifier_of(lm);
  std::vector<std::string> names;
  data::ClassifySplit split;
  if (cfg.split == "train" || cfg.split == "val" || cfg.split == "test") {
    data::ClassifyDataset ds = data::load_classify_dataset(cfg.data);
    names = ds.names;
    if (cfg.split == "train") {
      split = ds.train;
    } else if (cfg.split == "val") {
      split = ds.val;
    } else {
      const auto dir = fs::path(ds.root) / "test";
      if (!fs::is_directory(dir)) throw DataError(ds.root + " has no test/ split", "", "data_not_found");
      split = data::load_classify_split(dir.string(), names);
    }
  } else {
    throw UsageError("split must be train, val or test, got '" + cfg.split + "'", "", "config_range_error");
  }
  if (static_cast<int>(names.size()) != model.num_classes())
    throw DataError(strfmt("the dataset has %d classes but the model has %d", static_cast<int>(names.size()),
                           model.num_classes()),
                    "Validate on a dataset with the model's classes, or train the model on this one.",
                    "data_class_mismatch");
  const torch::Device dev = lm.device;
  const int imgsz = cfg.imgsz > 0 ? cfg.imgsz : lm.imgsz;
  const auto m = evaluate_classifier(model, *lm.family, split, model.num_classes(), imgsz, classify_crop_pct(lm),
                                     cfg.batch, dev, cfg.half, cfg.workers);
  ValResult r;
  r.metrics = m.as_list();
  r.metrics.emplace_back("loss", m.loss);
  r.metrics.emplace_back("speed/preprocess", m.preprocess_ms);
  r.metrics.emplace_back("speed/inference", m.inference_ms);
  r.table = strfmt("%22s%11s%11s%11s\n%22s%11lld%11.3f%11.3f\n", "Class", "Images", "top1_acc", "top5_acc", "all",
                   static_cast<long long>(m.samples), m.top1, m.top5);
  r.save_dir = make_run_dir(cfg.project, cfg.name, cfg.exist_ok);
  plot_confusion(m, names, (fs::path(r.save_dir) / "confusion_matrix.png").string());
  std::string json = "{";
  for (size_t i = 0; i < r.metrics.size(); ++i)
    json += (i ? ", " : "") + ("\"" + r.metrics[i].first + "\": " + fmt(r.metrics[i].second));
  write_file_atomic((fs::path(r.save_dir) / "metrics.json").string(), json + "}\n");
  return r;
}

std::vector<PredictResult> run_classify_predict(models::LoadedModel& lm, const PredictConfig& cfg) {
  return run_classify_predict(lm, cfg, image_sources(cfg.source));
}

std::vector<PredictResult> run_classify_predict(models::LoadedModel& lm, const PredictConfig& cfg,
                                                const std::vector<ImageSource>& sources) {
  auto& model = classifier_of(lm);
  const torch::Device dev = lm.device;
  model.eval();
  torch::NoGradGuard no_grad;
  const int imgsz = cfg.imgsz > 0 ? cfg.imgsz : lm.imgsz;
  const double crop = classify_crop_pct(lm);
  std::string save_dir;
  std::set<std::string> used;
  if (cfg.save) save_dir = make_run_dir(cfg.project, cfg.name, cfg.exist_ok);
  // The eval crop (uint8) goes through the inference forward every family shares: the input
  // conversion, the network and the softmax, eager or replayed from the model's graphs.
  InferenceOptions io_opt;
  io_opt.device = dev;
  io_opt.amp = cfg.half;
  io_opt.amp_dtype = torch::kHalf;
  io_opt.graphs = lm.graphs.get();
  io_opt.graph_mode = models::parse_graph_mode(cfg.cuda_graph);
  InferenceRunner runner(model, *lm.family, io_opt);
  // On a CUDA device, files are decoded (nvJPEG) and resized there (the same resize bytes as the
  // host's; the decoded pixels may differ by the JPEG decoders' rounding).
  // The decoder is asked to start after the first forward, not before (see predict_gpu_decoder).
  // It reads files: not asked for when every source is the built-in image or pixels in memory.
  const bool files = std::any_of(sources.begin(), sources.end(), [](const ImageSource& s) {
    return !s.pixels.defined() && s.name != "SAMPLE_IMAGE";
  });
  data::GpuBatchMaker* gpu = files ? predict_gpu_decoder(dev, imgsz, cfg.save, /*start=*/false) : nullptr;
  std::vector<PredictResult> out;
  for (const auto& src : sources) {
    PredictResult r;
    r.source = src.name;
    auto t0 = Clock::now();
    torch::Tensor img;
    if (gpu && !src.pixels.defined() && src.name != "SAMPLE_IMAGE") {
      std::vector<std::pair<int64_t, std::string>> bad;
      img = gpu->decode({data::read_file_bytes(src.name)}, {src.name}, &bad).at(0);
      if (!bad.empty()) throw DataError(bad.front().second);
    } else {
      img = load_image(src);
    }
    r.height = static_cast<int>(img.size(0));
    r.width = static_cast<int>(img.size(1));
    const auto crop_hwc = data::classify_eval_transform(img, imgsz, crop).unsqueeze(0);
    r.preprocess_ms = ms_since(t0);
    t0 = Clock::now();
    const auto probs = runner.forward(crop_hwc)[0].cpu().contiguous();
    r.inference_ms = ms_since(t0);
    if (files && !gpu) gpu = predict_gpu_decoder(dev, imgsz, cfg.save);
    t0 = Clock::now();
    r.probs.assign(probs.data_ptr<float>(), probs.data_ptr<float>() + probs.numel());
    const int64_t k = std::min<int64_t>(5, probs.numel());
    const auto top = probs.topk(k);
    for (int64_t i = 0; i < k; ++i) {
      ClassScore c;
      c.class_id = static_cast<int>(std::get<1>(top)[i].item<int64_t>());
      c.score = std::get<0>(top)[i].item<float>();
      c.class_name = c.class_id < static_cast<int>(lm.names.size()) ? lm.names[static_cast<size_t>(c.class_id)]
                                                                     : std::to_string(c.class_id);
      r.top.push_back(std::move(c));
    }
    if (cfg.save) {
      auto canvas = img.clone().contiguous();
      const int scale = std::max(1, static_cast<int>(std::min(r.height, r.width) / 240));
      int y = 4 * scale;
      for (const auto& c : r.top) {
        const std::string line = c.class_name + " " + strfmt("%.2f", c.score);
        const int tw = ops::text_width(line, scale), th = ops::text_height(scale);
        ops::fill_rect(canvas, 2 * scale, y - scale, 2 * scale + tw + 2 * scale, y + th + scale, ops::Rgb8{0, 0, 0});
        ops::draw_text(canvas, 3 * scale, y, line, ops::Rgb8{255, 255, 255}, scale);
        y += th + 3 * scale;
      }
      r.saved_path = (fs::path(save_dir) / saved_image_name(src.name, used)).string();
      io::save_image(r.saved_path, canvas);
    }
    r.postprocess_ms = ms_since(t0);
    out.push_back(std::move(r));
  }
  return out;
}

TrainConfig check_classify_training(models::LoadedModel& lm, const TrainConfig& cfg) {
  (void)classifier_of(lm);
  if (cfg.data.empty())
    throw UsageError("Missing option 'data'", "Pass data=<folder with train/<class>/ and val/<class>/>.",
                     "config_required_key");
  (void)data::load_classify_dataset(cfg.data);
  if (cfg.batch < 2)
    throw UsageError(strfmt("batch=%d: classifier training needs a batch of at least 2 (BatchNorm)", cfg.batch), "",
                     "config_range_error");
  (void)resolve_device(cfg.device);
  (void)lr_shape(cfg.scheduler, lm.family->scheduler_names);
  // What the detection trainer has and this loop has not yet: refused by name, never ignored.
  const auto not_yet = [](const std::string& what, const std::string& hint) {
    throw UsageError(what + " is not available for the classify task yet", hint, "config_range_error");
  };
  if (!cfg.resume.empty() && cfg.resume != "false" && cfg.resume != "False")
    not_yet("resume", "Start a new run from the checkpoint instead: model=<run>/weights/last.pt.");
  if (wants_distributed(cfg.device)) not_yet("training on several devices", "Pass one device, e.g. device=0.");
  if (cfg.loader == "gpu") not_yet("loader=gpu", "Use loader=auto (the CPU loader).");
  if (data::cache_mode(cfg.cache) != data::CacheMode::None)
    not_yet("cache=" + cfg.cache, "Leave cache unset: images are decoded every epoch.");
  return cfg;
}

namespace {

// A classify run's set-up and steps, driven by the train loop every task shares
// (engine/train_loop.hpp): the steps of an epoch here; what follows an epoch (validation, best and
// patience, checkpoints, results.csv and plots, the epoch line) in ClassifyEpochHook; the
// profiler, the caller's callbacks and hooks as in detection training.
class ClassifyRun final : public EpochSteps {
 public:
  ClassifyRun(models::LoadedModel& lm, const TrainConfig& cfg) : lm_(lm), cfg_(cfg), ds_(data::load_classify_dataset(cfg.data)) {
    nc_ = static_cast<int>(ds_.names.size());
    torch::manual_seed(static_cast<uint64_t>(cfg.seed));
    if (!cfg.pretrained) lm.model = lm.family->build_like(models::state_dict(*lm.model), lm.model->num_classes());
    if (lm.model->num_classes() != nc_) {
      log_info(strfmt("Classifier head reset: %d -> %d classes (the dataset's)", lm.model->num_classes(), nc_));
      lm.model->reset_num_classes(nc_);
    }
    lm.names = ds_.names;
    lm.imgsz = cfg.imgsz;
    if (lm.graphs) lm.graphs->release("training");
    dev_ = resolve_device(cfg.device);
    lm.to(dev_);
    auto& model = classifier_of(lm);
    n_ = static_cast<int64_t>(ds_.train.samples.size());
    data::ClassifyLoaderOptions lo;
    lo.batch = cfg.batch;
    lo.workers = cfg.workers;
    lo.imgsz = cfg.imgsz;
    lo.flip_prob = cfg.flip_prob;
    lo.seed = static_cast<uint64_t>(cfg.seed);
    lo.pin_memory = dev_.is_cuda();
    loader_ = std::make_unique<data::ClassifyLoader>(ds_.train, lo);
    iters_ = loader_->size();  // the last partial batch dropped when there is a full one
    // The same step as detection training (engine/step.hpp): the family's optimizer groups, the
    // schedule, AMP and its scaler, clipping, accumulation, the EMA and, with cuda_graph=true, the
    // whole step captured where the family declares it.
    amp_ = plan_amp(cfg.amp, cfg.amp_dtype, dev_);
    const bool channels_last = trains_channels_last(cfg.memory_format, dev_);
    if (channels_last) to_channels_last(model);
    if (cfg.ema) {
      ema_net_ = lm.family->build_like(models::state_dict(model), nc_);
      models::load_state_dict(*ema_net_, models::state_dict(model), true);
      ema_net_->to(dev_);
      if (channels_last) to_channels_last(*ema_net_);
      ema_ = std::make_unique<ModelEMA>(ema_net_, model, cfg.ema_decay, cfg.ema_tau);
    }
    StepSetup setup = make_step_runner(cfg, lm.model, lm.family->make_loss(*lm.model), ema_.get(), dev_, amp_,
                                       channels_last, iters_, lm.family);
    runner_ = std::move(setup.runner);
    accumulate_ = setup.accumulate;
    if (cfg.cuda_graph) enable_declared_cuda_graphs(*runner_, *lm.family, cfg.cuda_graph_scope, false);

    result_.save_dir = make_run_dir(cfg.project, cfg.name, cfg.exist_ok);
    write_train_config(result_.save_dir, cfg);
    const fs::path wdir = fs::path(result_.save_dir) / "weights";
    fs::create_directories(wdir);
    result_.last_checkpoint = (wdir / "last.pt").string();
    result_.best_checkpoint = (wdir / "best.pt").string();
    state_.config = &cfg_;
    state_.save_dir = result_.save_dir;
    state_.epochs = cfg.epochs;
    state_.batches_per_epoch = iters_;
    if (cfg.verbose)
      log_info(strfmt("Training %s-%s (classify, %d classes) on %lld images, %lld batches an epoch, %s%s",
                      lm.family->name.c_str(), model.size().c_str(), nc_, static_cast<long long>(n_),
                      static_cast<long long>(iters_), amp_.describe().c_str(), channels_last ? ", channels_last" : ""));
    if (accumulate_ > 1) log_info(strfmt("Accumulating gradients over %d batches (nbs=%d)", accumulate_, cfg.nbs));
  }

  TrainResult run(std::vector<std::shared_ptr<TrainHook>> hooks, Clock::time_point started) {
    for (auto& h : hooks) loop_.add_hook(std::move(h));
    loop_.run(*this, result_, started);
    return result_;
  }

  // For the hooks.
  models::LoadedModel& loaded() { return lm_; }
  models::Classifier& model() { return classifier_of(lm_); }
  models::Classifier& eval_net() { return ema_net_ ? *models::as_classifier(*ema_net_) : model(); }
  models::Detector* ema_net() { return ema_net_.get(); }
  const data::ClassifyDataset& dataset() const { return ds_; }
  int nc() const { return nc_; }
  const torch::Device& device() const { return dev_; }
  const AmpPlan& amp() const { return amp_; }
  int accumulate() const { return accumulate_; }
  Optimizer& optimizer() { return runner_->optimizer(); }
  TrainResult& result() { return result_; }

  // EpochSteps
  void begin_epoch(TrainState& s) override {
    epoch_start_ = Clock::now();
    model().train();
    loader_->set_epoch(s.epoch);
    // Summed on the device: read once at the end of the epoch (no synchronisation per step).
    loss_sum_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(dev_));
    s.batch_index = -1;
  }
  bool has_next(const TrainState& s) const override { return s.batch_index + 1 < iters_; }
  bool next_batch(TrainState& s) override {
    const int64_t it = s.batch_index + 1;
    std::optional<data::ClassifyBatch> b = loader_->next();
    if (!b) throw std::logic_error("the classify loader ended its epoch early");
    images_ = std::move(b->images);
    labels_ = std::move(b->labels);
    s.batch_index = it;
    s.batch_images = labels_.size(0);
    window_ = accumulation_window(it, iters_, accumulate_);
    s.optimizer_step = window_.optimizer_step;
    s.global_step = runner_->global_step();
    // A hook that observes phases (the profiler) may have joined or left since the last step.
    runner_->set_phase_observer(loop_.observing_phases() ? &loop_ : nullptr);
    return true;
  }
  void run_step(TrainState&) override {
    const LossOutput out = runner_->forward_backward(images_, labels_, static_cast<double>(window_.size));
    loss_sum_ += out.total.to(torch::kFloat);
    if (window_.optimizer_step) runner_->optimizer_step();
  }
  EpochSummary end_epoch(TrainState& s) override {
    EpochSummary es;
    es.epoch = s.epoch + 1;
    es.loss = loss_sum_.item<double>() / static_cast<double>(iters_);
    es.losses = {{"ce", es.loss}};
    const Optimizer& opt = runner_->optimizer();
    for (size_t g = 0; g < opt.groups().size(); ++g) es.lrs.push_back(opt.lr() * opt.groups()[g].lr_ratio);
    es.seconds = ms_since(epoch_start_) / 1000.0;
    if (!std::isfinite(es.loss))
      throw RuntimeError(strfmt("Training diverged: the loss of epoch %d is %g", es.epoch, es.loss),
                         "Lower lr0, or use amp_dtype=bfloat16.", "training_diverged");
    return es;
  }

 private:
  models::LoadedModel& lm_;
  const TrainConfig& cfg_;
  const data::ClassifyDataset ds_;
  int nc_ = 0;
  torch::Device dev_{torch::kCPU};
  int64_t n_ = 0, iters_ = 1;
  AmpPlan amp_;
  std::shared_ptr<models::Detector> ema_net_;
  std::unique_ptr<ModelEMA> ema_;
  std::unique_ptr<StepRunner> runner_;
  int accumulate_ = 1;
  TrainState state_;
  TrainLoop loop_{state_};
  TrainResult result_;
  std::unique_ptr<data::ClassifyLoader> loader_;
  torch::Tensor images_, labels_, loss_sum_;
  AccumulationWindow window_{1, true};  // of the batch next_batch took
  Clock::time_point epoch_start_;
};

// After each epoch of a classify run: validation (the EMA's weights), best and patience, last.pt /
// best.pt / epoch_N.pt, results.csv and results.png, the epoch line; at the end the confusion
// matrix of the best validation and the evaluated weights into the caller's model.
class ClassifyEpochHook final : public TrainHook {
 public:
  explicit ClassifyEpochHook(ClassifyRun& run) : r_(run) {}
  std::string name() const override { return "classify_epoch"; }

  void after_epoch(TrainState& s, EpochSummary& es) override {
    const TrainConfig& cfg = *s.config;
    auto& lm = r_.loaded();
    TrainResult& result = r_.result();
    const bool last = es.epoch == cfg.epochs;
    if (cfg.val && (es.epoch % std::max(1, cfg.eval_interval) == 0 || last)) {
      const auto m = evaluate_classifier(r_.eval_net(), *lm.family, r_.dataset().val, r_.nc(), cfg.imgsz,
                                         classify_crop_pct(lm), cfg.batch, r_.device(), r_.amp().enabled, cfg.workers);
      es.validated = true;
      es.metrics = m.as_list();
      es.map50 = es.map50_95 = m.top1;
      if (m.top1 > best_) {
        best_ = m.top1;
        best_metrics_ = m;
        es.is_best = true;
        result.best_epoch = es.epoch;
        result.best_mAP50 = result.best_mAP50_95 = m.top1;
        since_best_ = 0;
      } else {
        ++since_best_;
      }
    }
    ClassifyCheckpointExtras x{es.epoch, std::max(best_, 0.0), result.best_epoch, r_.ema_net() != nullptr};
    torch::nn::Module& saved = r_.ema_net() ? static_cast<torch::nn::Module&>(*r_.ema_net()) : r_.model();
    // The checkpoints hold the evaluated weights (the EMA's) under "model", in the model's metadata.
    save_classify_checkpoint(result.last_checkpoint, lm, saved, r_.ema_net() ? &r_.model() : nullptr, &r_.optimizer(), x);
    if (es.is_best) fs::copy_file(result.last_checkpoint, result.best_checkpoint, fs::copy_options::overwrite_existing);
    if (cfg.save_period > 0 && es.epoch % cfg.save_period == 0)
      fs::copy_file(result.last_checkpoint,
                    fs::path(result.last_checkpoint).parent_path() / ("epoch_" + std::to_string(es.epoch) + ".pt"),
                    fs::copy_options::overwrite_existing);
    const auto metric = [&](const std::string& key) {
      for (const auto& [k, v] : es.metrics)
        if (k == key) return fmt(v);
      return std::string();
    };
    std::vector<std::pair<std::string, std::string>> row = {
        {"epoch", std::to_string(es.epoch)}, {"time", fmt(es.seconds)}, {"train/loss", fmt(es.loss)}};
    for (const auto& [term, v] : es.losses) row.emplace_back(loss_column(term), fmt(v));
    for (const char* key : {"metrics/accuracy_top1", "metrics/accuracy_top5", "metrics/precision", "metrics/recall",
                            "metrics/f1"})
      row.emplace_back(key, metric(key));
    for (size_t g = 0; g < es.lrs.size(); ++g) row.emplace_back("lr/group" + std::to_string(g), fmt(es.lrs[g]));
    rows_.push_back(row);
    const std::string csv = (fs::path(s.save_dir) / "results.csv").string();
    write_results_csv(csv, rows_);
    try {
      plots::plot_results_csv(csv, (fs::path(s.save_dir) / "results.png").string());
    } catch (const std::exception& ex) {
      log_warn(std::string("results.png not drawn: ") + ex.what());
    }
    if (cfg.verbose)
      log_info(strfmt("epoch %d/%d  ce %.4f  top1 %s  top5 %s  %.1fs", es.epoch, cfg.epochs, es.loss,
                      metric("metrics/accuracy_top1").c_str(), metric("metrics/accuracy_top5").c_str(), es.seconds));
    if (cfg.patience > 0 && since_best_ >= cfg.patience) {
      s.stop = true;
      s.stop_reason = strfmt("Stopping early: no better top-1 accuracy for %d validations", since_best_);
    }
  }

  void after_train(TrainState& s, TrainResult& result) override {
    auto& lm = r_.loaded();
    if (best_metrics_.samples > 0)
      plot_confusion(best_metrics_, r_.dataset().names, (fs::path(s.save_dir) / "confusion_matrix.png").string());
    // The facade's model becomes the evaluated weights (the EMA's), as after LibreYOLO's training.
    if (r_.ema_net()) models::load_state_dict(r_.model(), models::state_dict(*r_.ema_net()), true);
    r_.model().eval();
    lm.weights = fs::exists(result.best_checkpoint) ? result.best_checkpoint : result.last_checkpoint;
  }

 private:
  ClassifyRun& r_;
  std::vector<std::vector<std::pair<std::string, std::string>>> rows_;
  double best_ = -1;
  ClassifyMetrics best_metrics_;
  int since_best_ = 0;
};

}  // namespace

TrainResult run_classify_training(models::LoadedModel& lm, const TrainConfig& cfg, const TrainCallbacks& callbacks,
                                  const std::vector<std::shared_ptr<TrainHook>>& hooks) {
  InterruptGuard interrupts;
  check_classify_training(lm, cfg);
  const auto started = Clock::now();
  ClassifyRun run(lm, cfg);
  // The task's epoch work, then what every task's training has, then the caller's hooks.
  std::vector<std::shared_ptr<TrainHook>> all = {std::make_shared<ClassifyEpochHook>(run), make_callbacks_hook(callbacks)};
  if (cfg.profile)
    all.push_back(make_profiler_hook(cfg, ProfiledRun{lm.family->name, run.model().size(), run.device(), run.amp(),
                                                      cfg.workers, run.accumulate(), run.result().save_dir}));
  for (const auto& h : hooks)
    if (h) all.push_back(h);
  return run.run(std::move(all), started);
}

}  // namespace libreyolo::engine
