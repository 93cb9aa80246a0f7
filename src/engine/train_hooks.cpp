#include "engine/train_hooks.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#ifdef LIBREYOLO_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "core/log.hpp"
#include "core/strings.hpp"
#include "core/paths.hpp"
#include "engine/trainer.hpp"
#include "engine/validator.hpp"
#include "io/checkpoint.hpp"
#include "plots/plots.hpp"
#include "profile/window.hpp"

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

std::string fmt_value(double v) {
  if (!std::isfinite(v)) return "";
  std::ostringstream os;
  os << std::setprecision(10) << v;
  return os.str();
}

std::string fmt_clock(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  return t >= 3600 ? strfmt("%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60) : strfmt("%02ld:%02ld", t / 60, t % 60);
}

std::string loss_list(const std::vector<std::pair<std::string, double>>& losses) {
  std::string s;
  for (const auto& [k, v] : losses) s += strfmt("%s%s %.4f", s.empty() ? "" : " ", k.c_str(), v);
  return s;
}

// ------------------------------------------------------------------------------------------------
// Mosaic closes for the last no_aug_epochs; the family may switch its loss then (an L1 term).
class EpochActionsHook : public TrainHook {
 public:
  explicit EpochActionsHook(Trainer& t) : t_(t) {}
  std::string name() const override { return "epoch_actions"; }
  bool all_ranks() const override { return true; }
  void before_train(TrainState& s) override {
    const int no_aug_start = s.epochs - s.config->no_aug_epochs;
    // A resumed run whose checkpoint was written after the switch keeps it (the checkpoint's
    // `mosaic_closed`), whatever the epoch count now says; otherwise it follows from the epoch.
    bool closed = false;
    if (const auto& ck = t_.resume_checkpoint())
      if (auto v = ck->get("mosaic_closed"); v && v->kind == io::PyValue::Kind::Bool) closed = v->b;
    if (closed || (s.config->no_aug_epochs > 0 && s.start_epoch > no_aug_start)) close_mosaic(s);
  }
  void after_train(TrainState& s, TrainResult&) override {
    if (!s.config->cuda_graph) return;
    const StepGraphStats g = t_.step_runner().graph_stats();
    std::string line = strfmt("CUDA graphs: %lld of %lld steps replayed, %lld of %lld updates",
                              static_cast<long long>(g.replayed_micro_steps),
                              static_cast<long long>(g.replayed_micro_steps + g.eager_micro_steps),
                              static_cast<long long>(g.replayed_updates),
                              static_cast<long long>(g.replayed_updates + g.eager_updates));
    if (!g.eager_shapes.empty()) {
      line += "; eager only (seen too few times to capture):";
      for (const auto& shape : g.eager_shapes) line += " " + shape;
    }
    if (!g.off_reason.empty()) line += "; off: " + g.off_reason;
    log_info(line);
  }
  void before_epoch(TrainState& s) override {
    const int no_aug_start = s.epochs - s.config->no_aug_epochs;
    if (s.config->no_aug_epochs > 0 && s.epoch == no_aug_start) {
      log_info(strfmt("Disabling mosaic/mixup for final %d epochs", s.config->no_aug_epochs));
      close_mosaic(s);
    }
  }

 private:
  void close_mosaic(TrainState&) {
    t_.train_loader().set_mosaic(false);
    const auto& fam = *t_.loaded().family;
    if (fam.on_close_mosaic && fam.on_close_mosaic(t_.model(), t_.step_runner().loss())) {
      log_info(fam.name + ": the training step changes now that mosaic is closed");
      t_.step_runner().invalidate_cuda_graphs(fam.name + "'s close-mosaic switch changed the step");
    }
  }
  Trainer& t_;
};

// ------------------------------------------------------------------------------------------------
// Validation when due (every eval_interval epochs and always after the last), best and patience.
class EvalHook : public TrainHook {
 public:
  explicit EvalHook(Trainer& t) : t_(t) {}
  std::string name() const override { return "eval"; }
  void after_epoch(TrainState& s, EpochSummary& e) override {
    const TrainConfig& c = *s.config;
    const bool last = s.epoch + 1 >= s.epochs;
    const bool due = last || (c.eval_interval > 0 && (s.epoch + 1) % c.eval_interval == 0);
    if (!t_.val_set() || !due) return;
    try {
      e.metrics = validate(s, last);
    } catch (const std::exception& ex) {
      // A run whose validation fails has no best model and no metrics to report: it ends with the
      // error (its exit code), not with a warning and exit 0. weights/last.pt keeps the last
      // epoch saved.
      log_error(strfmt("Validation failed after epoch %d: %s", s.epoch + 1, ex.what()));
      throw;
    }
    e.validated = true;
    for (const auto& [k, v] : e.metrics) {
      if (k == "metrics/mAP50-95") e.map50_95 = v;
      if (k == "metrics/mAP50") e.map50 = v;
    }
    BestMetric& b = t_.best();
    e.is_best = b.epoch == 0 || e.map50_95 > b.map50_95;
    if (e.is_best) {
      b.map50_95 = e.map50_95;
      b.map50 = e.map50;
      b.epoch = e.epoch;
      b.patience_counter = 0;
    } else {
      ++b.patience_counter;
    }
    if (c.patience > 0 && b.patience_counter >= c.patience) {
      s.stop = true;
      s.stop_reason = strfmt("Early stopping triggered after %d epochs (patience=%d, no improvement for %d validations)",
                             e.epoch, c.patience, b.patience_counter);
    }
  }
  void after_train(TrainState&, TrainResult& r) override {
    r.best_epoch = t_.best().epoch;
    r.best_mAP50 = t_.best().map50;
    r.best_mAP50_95 = t_.best().map50_95;
  }

 private:
  // The last validation prints the per-class table and writes the curves and the confusion
  // matrix into the run directory.
  std::vector<std::pair<std::string, double>> validate(const TrainState& s, bool last) {
    EvalOptions eo;
    eo.names = t_.names();
    eo.log_table = last;
    if (last) eo.plot_dir = s.save_dir;
    eo.thresholds = t_.loaded().family->train_val_thresholds;
    eo.imgsz = s.config->imgsz;
    eo.batch = s.config->batch;
    eo.workers = t_.workers();
    eo.inference.device = t_.device();
    eo.inference.amp = t_.amp().enabled;
    eo.inference.amp_dtype = t_.amp().dtype;
    models::Detector& m = t_.ema_model() ? *t_.ema_model() : t_.model();
    return evaluate_detector(m, *t_.loaded().family, t_.val_set(), eo);
  }
  Trainer& t_;
};

// ------------------------------------------------------------------------------------------------
// weights/last.pt after every epoch (a kill loses at most the epoch in progress), best.pt on a new
// best, epoch_N.pt every save_period epochs; orphaned temporary files of killed writes removed.
class CheckpointHook : public TrainHook {
 public:
  explicit CheckpointHook(Trainer& t) : t_(t) {}
  std::string name() const override { return "checkpoint"; }
  void before_train(TrainState& s) override {
    int removed = 0;
    for (const auto& dir : {s.save_dir, (fs::path(s.save_dir) / "weights").string()})
      removed += remove_orphan_temp_files(dir);
    if (removed > 0) log_info(strfmt("Removed %d unfinished temporary file(s) of an earlier run in %s", removed, s.save_dir.c_str()));
    const fs::path last = fs::path(s.save_dir) / "weights" / "last.pt";
    if (s.start_epoch > 0 && fs::exists(last)) t_.result().last_checkpoint = last.string();
  }
  void after_epoch(TrainState& s, EpochSummary& e) override {
    auto root = make_root(s.epoch, e.loss);
    const fs::path wdir = fs::path(s.save_dir) / "weights";
    fs::create_directories(wdir);
    const std::string last = (wdir / "last.pt").string();
    io::write_checkpoint(last, *root);
    t_.result().last_checkpoint = last;
    last_epoch_ = e.epoch;
    if (e.is_best) {
      const std::string best = (wdir / "best.pt").string();
      io::write_checkpoint(best, *root);
      t_.result().best_checkpoint = best;
      log_info(strfmt("New best model saved - Epoch %d: metrics/mAP50-95=%.4f", e.epoch, e.map50_95));
    }
    const int period = s.config->save_period;
    if (period > 0 && e.epoch % period == 0)
      io::write_checkpoint((wdir / ("epoch_" + std::to_string(e.epoch) + ".pt")).string(), *root);
  }
  void after_train(TrainState& s, TrainResult& r) override {
    const fs::path best = fs::path(s.save_dir) / "weights" / "best.pt";
    if (r.best_checkpoint.empty() && fs::exists(best)) r.best_checkpoint = best.string();
  }
  void on_exception(TrainState& s, const std::exception&) override {
    if (!s.interrupted) return;
    const std::string& last = t_.result().last_checkpoint;
    if (last.empty()) {
      log_warn(strfmt("Interrupted in epoch %d before any epoch finished: nothing was saved", s.epoch + 1));
      return;
    }
    log_warn(strfmt("Interrupted in epoch %d; %s holds epoch %d. Resume with: libreyolo train model=%s resume=true",
                    s.epoch + 1, last.c_str(), last_epoch_ > 0 ? last_epoch_ : s.epoch, last.c_str()));
  }

 private:
  io::PyValuePtr make_root(int epoch, double epoch_loss) {
    const BestMetric& b = t_.best();
    models::Detector* ema = t_.ema_model();
    auto root = io::make_checkpoint(models::state_dict(ema ? *ema : t_.model()), t_.loaded().meta());
    root->set("epoch", io::PyValue::from_int(epoch));
    root->set("optimizer", t_.step_runner().optimizer().state_dict());
    root->set("config", t_.config_dict());
    root->set("loss", io::PyValue::from_float(epoch_loss));
    root->set("best_mAP50_95", io::PyValue::from_float(b.map50_95));
    root->set("best_mAP50", io::PyValue::from_float(b.map50));
    root->set("best_metric_key", io::PyValue::from_string("metrics/mAP50-95"));
    root->set("best_metric_value", b.epoch > 0 ? io::PyValue::from_float(b.map50_95) : io::PyValue::none());
    root->set("best_epoch", io::PyValue::from_int(b.epoch));
    root->set("is_ema_weights", io::PyValue::from_bool(ema != nullptr));
    root->set("best_metric", b.epoch > 0 ? io::PyValue::from_float(b.map50_95) : io::PyValue::none());
    root->set("best_metric_name", io::PyValue::from_string("metrics/mAP50-95"));
    if (ema) {
      root->set("train_model", io::from_state_dict(models::state_dict(t_.model())));
      root->set("ema", io::from_state_dict(models::state_dict(*ema)));
      root->set("ema_updates", io::PyValue::from_int(t_.ema()->updates()));
    }
    root->set("scaler", t_.step_runner().scaler().state_dict());
    // The close-mosaic switch (and with it the family's per-epoch change, e.g. an L1 loss term).
    root->set("mosaic_closed", io::PyValue::from_bool(!t_.train_loader().mosaic()));
    return root;
  }
  Trainer& t_;
  int last_epoch_ = 0;
};

// ------------------------------------------------------------------------------------------------

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


class ResultsCsvHook : public TrainHook {
 public:
  explicit ResultsCsvHook(Trainer& t) : t_(t) {}
  std::string name() const override { return "results_csv"; }
  void before_train(TrainState& s) override {
    const std::string path = (fs::path(s.save_dir) / "results.csv").string();
    csv_ = std::make_unique<ResultsCsv>(path);
    if (s.start_epoch > 0)
      csv_->keep_epochs_before(s.start_epoch + 1);
    else
      std::remove(path.c_str());  // a fresh run in a reused directory starts a fresh file
  }
  void after_epoch(TrainState&, EpochSummary& e) override {
    const BestMetric& b = t_.best();
    std::vector<std::pair<std::string, std::string>> row = {
        {"epoch", std::to_string(e.epoch)},
        {"time", fmt_value(e.seconds)},
        {"train/loss", fmt_value(e.loss)},
        {"validated", e.validated ? "1" : "0"},
        {"is_best", e.is_best ? "1" : "0"},
        {"current_metric", e.validated ? fmt_value(e.map50_95) : ""},
        {"current_metric_name", "metrics/mAP50-95"},
        {"best_metric", b.epoch > 0 ? fmt_value(b.map50_95) : ""},
        {"best_metric_name", "metrics/mAP50-95"},
        {"best_epoch", std::to_string(b.epoch)}};
    for (const auto& [k, v] : e.losses) row.emplace_back(loss_column(k), fmt_value(v));
    for (const auto& [k, v] : e.metrics) row.emplace_back(k, fmt_value(v));
    for (size_t g = 0; g < e.lrs.size(); ++g) row.emplace_back("lr/group" + std::to_string(g), fmt_value(e.lrs[g]));
    csv_->add(row);
  }

 private:
  Trainer& t_;
  std::unique_ptr<ResultsCsv> csv_;
};

// ------------------------------------------------------------------------------------------------
// Pictures users look at: labels.jpg (the training labels) at the start, train_batch0..2.jpg
// (the first augmented batches), results.png redrawn from results.csv after every epoch.
class PlotsHook : public TrainHook {
 public:
  explicit PlotsHook(Trainer& t) : t_(t) {}
  std::string name() const override { return "plots"; }
  void before_train(TrainState& s) override {
    guarded("labels.jpg", [&] { plots::plot_labels(*t_.train_set(), t_.names(), path(s, "labels.jpg")); });
  }
  void after_step(TrainState& s) override {
    if (s.epoch != s.start_epoch || s.batch_index >= 3 || !t_.current_batch()) return;
    const std::string name = "train_batch" + std::to_string(s.batch_index) + ".jpg";
    guarded(name, [&] {
      plots::plot_train_batch(t_.current_batch()->images, t_.current_batch()->targets, t_.names(), path(s, name));
    });
  }
  void after_epoch(TrainState& s, EpochSummary&) override {
    guarded("results.png",
            [&] { plots::plot_results_csv(path(s, "results.csv"), path(s, "results.png")); });
  }

 private:
  static std::string path(const TrainState& s, const std::string& file) {
    return (fs::path(s.save_dir) / file).string();
  }
  // A picture that cannot be drawn is worth a warning, never a failed run.
  template <class F>
  void guarded(const std::string& what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      log_warn("Could not write " + what + ": " + e.what());
    }
  }
  Trainer& t_;
};

// ------------------------------------------------------------------------------------------------
// Progress: on a terminal a bar per epoch redrawn in place; otherwise a plain line every 30 s.
// A summary line per epoch either way.
class ProgressHook : public TrainHook {
 public:
  explicit ProgressHook(Trainer& t) : t_(t), tty_(isatty(fileno(stderr)) != 0) {}
  std::string name() const override { return "progress"; }
  void before_train(TrainState& s) override {
    log_info(strfmt("Starting training for %d epochs%s: %s-%s, batch %d, imgsz %d, lr0 %g, device %s, run dir %s",
                    s.epochs, s.start_epoch > 0 ? strfmt(" (from epoch %d)", s.start_epoch + 1).c_str() : "",
                    t_.loaded().family->name.c_str(), t_.model().size().c_str(), s.config->batch, s.config->imgsz,
                    s.config->lr0, t_.device().str().c_str(), s.save_dir.c_str()));
  }
  void before_epoch(TrainState&) override {
    epoch_start_ = last_print_ = Clock::now();
    images_ = 0;
  }
  void after_step(TrainState& s) override {
    images_ += s.batch_images * s.world_size;  // every rank trains a batch this size: the global count
    if (!s.config->verbose) return;
    const bool last_batch = s.batch_index + 1 >= s.batches_per_epoch;
    const double since = seconds_since(last_print_);
    if (!((tty_ && (since >= 0.25 || last_batch)) || since >= 30.0)) return;
    last_print_ = Clock::now();
    ProgressLine p;
    p.epoch = s.epoch + 1;
    p.epochs = s.epochs;
    p.done = s.batch_index + 1;
    p.total = s.batches_per_epoch;
    p.elapsed_s = seconds_since(epoch_start_);
    p.losses = t_.mean_losses();  // synchronises, at most four times a second
    p.mem_gb = gpu_memory_gb(t_.device());
    p.status = s.status;
    if (tty_) {
      // The finished bar stays on its own line (what follows it, validation and checkpoint
      // messages, starts on the next one); a running bar is redrawn in place.
      p.width = terminal_width();
      std::fprintf(stderr, "\r%s\033[K%s", format_progress(p, true).c_str(), last_batch ? "\n" : "");
      std::fflush(stderr);
      dirty_ = !last_batch;
    } else {
      log_info(format_progress(p, false));
    }
  }
  void after_epoch(TrainState& s, EpochSummary& e) override {
    clear_line();
    if (!s.config->verbose) return;
    const double it_s = static_cast<double>(t_.batches_done()) / std::max(e.seconds, 1e-9);
    std::string line = strfmt("Epoch %d/%d  loss %.4f (%s)  %.2f it/s  %.1f img/s  lr %.6f", e.epoch, s.epochs, e.loss,
                              loss_list(e.losses).c_str(), it_s, images_ / std::max(e.seconds, 1e-9),
                              e.lrs.empty() ? 0.0 : e.lrs[0]);
    const double mem = gpu_memory_gb(t_.device());
    if (mem > 0) line += strfmt("  mem %.2fG", mem);
    line += strfmt("  %.1fs", e.seconds);
    if (e.validated) line += strfmt("  mAP50 %.4f  mAP50-95 %.4f%s", e.map50, e.map50_95, e.is_best ? " *" : "");
    log_info(line);
  }
  void after_train(TrainState&, TrainResult& r) override {
    clear_line();
    log_info("Training complete in " + duration_text(r.total_seconds) + " (" +
             count_of(static_cast<long long>(r.epochs.size()), "epoch") + ")");
  }
  void on_exception(TrainState&, const std::exception&) override { clear_line(); }

 private:
  void clear_line() {
    if (!dirty_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    dirty_ = false;
  }
  static int terminal_width() {
    winsize w{};
    if (ioctl(fileno(stderr), TIOCGWINSZ, &w) == 0 && w.ws_col > 20) return w.ws_col;
    return 100;
  }
  Trainer& t_;
  bool tty_;
  bool dirty_ = false;
  Clock::time_point epoch_start_, last_print_;
  int64_t images_ = 0;
};

// ------------------------------------------------------------------------------------------------
// The caller's TrainCallbacks.
class CallbacksHook : public TrainHook {
 public:
  explicit CallbacksHook(TrainCallbacks cb) : cb_(std::move(cb)) {}
  std::string name() const override { return "callbacks"; }
  void before_train(TrainState& s) override {
    if (cb_.on_train_start) cb_.on_train_start(*s.config, s.save_dir);
  }
  void after_epoch(TrainState&, EpochSummary& e) override {
    if (cb_.on_epoch_end) cb_.on_epoch_end(e);
  }
  void after_train(TrainState&, TrainResult& r) override {
    if (cb_.on_train_end) cb_.on_train_end(r);
  }
  void on_exception(TrainState&, const std::exception& ex) override {
    if (cb_.on_train_exception) cb_.on_train_exception(ex);
  }

 private:
  TrainCallbacks cb_;
};

// ------------------------------------------------------------------------------------------------
// summary.json at the end of a run.
class SummaryHook : public TrainHook {
 public:
  explicit SummaryHook(Trainer& t) : t_(t) {}
  std::string name() const override { return "summary"; }
  void after_train(TrainState& s, TrainResult& r) override {
    using json = nlohmann::json;
    json results = json::array();
    for (const auto& e : r.epochs) {
      json row = {{"epoch", e.epoch}, {"loss", e.loss}, {"validated", e.validated}};
      for (const auto& [k, v] : e.losses) row[loss_column(k)] = v;
      for (const auto& [k, v] : e.metrics) row[k] = v;
      results.push_back(row);
    }
    const int done = s.start_epoch + static_cast<int>(r.epochs.size());
    json j = {{"total_epochs", s.epochs},
              {"completed_epochs", done},
              {"invocation_completed_epochs", static_cast<int>(r.epochs.size())},
              {"logged_epochs", static_cast<int>(r.epochs.size())},
              {"model_family", t_.loaded().family->name},
              {"model_size", t_.model().size()},
              {"task", t_.loaded().family->task},
              {"save_dir", s.save_dir},
              {"final_loss", std::isfinite(r.final_loss) ? json(r.final_loss) : json(nullptr)},
              {"best_metric", r.best_epoch > 0 ? json(r.best_mAP50_95) : json(nullptr)},
              {"best_epoch", r.best_epoch > 0 ? json(r.best_epoch) : json(nullptr)},
              {"total_seconds", r.total_seconds},
              {"checkpoints",
               {{"best", r.best_checkpoint.empty() ? json(nullptr) : json(r.best_checkpoint)},
                {"last", r.last_checkpoint.empty() ? json(nullptr) : json(r.last_checkpoint)}}},
              {"results_scope", "current_invocation"},
              {"results", results}};
    write_file_atomic((fs::path(s.save_dir) / "summary.json").string(), j.dump(2) + "\n");
  }

 private:
  Trainer& t_;
};

// ------------------------------------------------------------------------------------------------
// The caller's model ends with the best weights (else the last), EMA ones when EMA is on.
class RestoreBestHook : public TrainHook {
 public:
  explicit RestoreBestHook(Trainer& t) : t_(t) {}
  std::string name() const override { return "restore_best"; }
  bool all_ranks() const override { return true; }
  void after_train(TrainState&, TrainResult& r) override {
    const std::string restore = !r.best_checkpoint.empty() ? r.best_checkpoint : r.last_checkpoint;
    if (!restore.empty()) {
      auto ck = io::load_torch_file(restore);
      io::StateDict sd = io::to_state_dict(*ck->get("model"), "model");
      models::load_state_dict(t_.model(), sd, true);
      t_.loaded().weights = restore;
      t_.loaded().checkpoint = ck;
    }
    t_.model().eval();
  }

 private:
  Trainer& t_;
};

// ------------------------------------------------------------------------------------------------
// The profiler: a window of real steps (profile/window.hpp) fed with the loop's phases; prints its
// report, writes its files and removes itself, then training goes on (or stops: profile_then_stop).
class ProfilerHook : public TrainHook {
 public:
  ProfilerHook(const TrainConfig& c, const ProfiledRun& run) {
    int warmup = c.profile_warmup, steps = c.profile_steps;
    const std::string rounded = profile::Window::round_to_accumulation(warmup, steps, run.accumulate);
    if (!rounded.empty()) log_info(rounded);
    profile::Meta meta;
    std::string family = run.family;
    if (family.rfind("yolo", 0) == 0) family = "YOLO" + family.substr(4);
    meta.model = family + "-" + run.size;
    meta.device = run.device.str();
    meta.batch = c.batch;
    meta.imgsz = {c.imgsz};
    // What the run does, not what was asked (AMP is off on the CPU).
    meta.amp = run.amp.enabled;
    meta.amp_dtype = !meta.amp ? "float32" : run.amp.dtype == torch::kBFloat16 ? "bfloat16" : "float16";
    meta.workers = run.workers;
    profile::WindowOptions wo;
    wo.trace = c.profile_trace;
    wo.open = c.profile_open;
    win_ = std::make_unique<profile::Window>(warmup, steps, run.device, meta, run.save_dir, wo);
    log_info(strfmt("Profiler: %d warm-up step(s), then %d measured (first half unsynced, second half synced per phase)",
                    warmup, steps));
  }
  std::string name() const override { return "profiler"; }
  bool observes_phases() const override { return !done_; }
  bool finished() const override { return done_; }
  void phase_begin(TrainState&, Phase p) override {
    if (p == Phase::Dataload) {
      win_->step_begin();
      win_->dataload_begin();
    } else {
      win_->phase_begin(map(p));
    }
  }
  void phase_end(TrainState&, Phase p) override {
    if (p == Phase::Dataload)
      win_->dataload_end();
    else
      win_->phase_end(map(p));
  }
  void after_step(TrainState& s) override {
    win_->step_end();
    s.status = win_->live_verdict();
    if (!win_->finished()) return;
    profile::Report r = win_->finish();
    done_ = true;
    s.status.clear();
    for (const auto& line : split_lines(r.text)) log_info(line);
    if (s.config->profile_then_stop) {
      s.stop = true;
      s.stop_reason = "Profile-only run (profile_then_stop=true): training stopped after the profile window; the "
                      "partial epoch was not validated or checkpointed";
    } else {
      log_info("Profile window complete; training continues (profile_then_stop=true stops here instead)");
    }
  }
  void after_train(TrainState& s, TrainResult&) override { abandon(s); }
  void on_exception(TrainState& s, const std::exception&) override { abandon(s); }

 private:
  static profile::Phase map(Phase p) {
    switch (p) {
      case Phase::ToDevice: return profile::Phase::ToDevice;
      case Phase::Forward: return profile::Phase::Forward;
      case Phase::Loss: return profile::Phase::Loss;
      case Phase::Backward: return profile::Phase::Backward;
      default: return profile::Phase::Optimizer;
    }
  }
  static std::vector<std::string> split_lines(const std::string& text) {
    std::vector<std::string> out;
    std::stringstream ss(text);
    std::string line;
    while (std::getline(ss, line)) out.push_back(line);
    return out;
  }
  // Training ended before the window filled: stop the profiler, say so.
  void abandon(TrainState& s) {
    if (done_) return;
    win_->finish();
    done_ = true;
    s.status.clear();
    log_warn(strfmt("The profile window did not fill (%d warm-up + %d measured steps needed): no profile written",
                    win_->warmup(), win_->steps()));
  }
  std::unique_ptr<profile::Window> win_;
  bool done_ = false;
};

}  // namespace

std::shared_ptr<TrainHook> make_profiler_hook(const TrainConfig& c, const ProfiledRun& run) {
  return std::make_shared<ProfilerHook>(c, run);
}

std::shared_ptr<TrainHook> make_callbacks_hook(const TrainCallbacks& callbacks) {
  return std::make_shared<CallbacksHook>(callbacks);
}

std::string loss_column(const std::string& term) {
  std::string n = term;
  for (auto& c : n)
    if (c == ' ') c = '_';
  if (n.rfind("train/", 0) == 0) return n;
  if (n.size() > 5 && n.compare(n.size() - 5, 5, "_loss") == 0) return "train/" + n;
  return "train/" + n + "_loss";
}

std::string format_progress(const ProgressLine& p, bool bar) {
  const double frac = p.total > 0 ? std::min(1.0, static_cast<double>(p.done) / static_cast<double>(p.total)) : 0.0;
  const double rate = p.elapsed_s > 0 ? static_cast<double>(p.done) / p.elapsed_s : 0.0;
  const double eta = rate > 0 ? static_cast<double>(p.total - p.done) / rate : NAN;
  std::string tail = strfmt(" %lld/%lld [%s<%s, %.2fit/s]", static_cast<long long>(p.done),
                            static_cast<long long>(p.total), fmt_clock(p.elapsed_s).c_str(), fmt_clock(eta).c_str(), rate);
  std::string losses;
  for (const auto& [k, v] : p.losses) losses += strfmt(" %s %.4g", k.c_str(), v);
  if (p.mem_gb > 0) losses += strfmt(" mem %.2fG", p.mem_gb);
  if (!p.status.empty()) losses += "  " + p.status;
  const std::string head = strfmt("Epoch %d/%d %3d%%", p.epoch, p.epochs, static_cast<int>(std::floor(frac * 100)));
  if (!bar) return head + tail + losses;
  // The bar takes what the line leaves, between 10 and 40 cells.
  const int room = p.width - static_cast<int>(head.size() + tail.size() + losses.size()) - 2;
  const int cells = std::max(10, std::min(40, room));
  const int eighths = static_cast<int>(std::floor(frac * cells * 8));
  static const char* partial[] = {"", "\u258f", "\u258e", "\u258d", "\u258c", "\u258b", "\u258a", "\u2589"};
  std::string b;
  for (int i = 0; i < eighths / 8; ++i) b += "\u2588";
  int used = eighths / 8;
  if (used < cells && eighths % 8) {
    b += partial[eighths % 8];
    ++used;
  }
  b += std::string(static_cast<size_t>(cells - used), ' ');
  std::string line = head + "|" + b + "|" + tail + losses;
  return line;
}

std::vector<std::shared_ptr<TrainHook>> build_hooks(Trainer& t, const TrainCallbacks& callbacks,
                                                    const std::vector<std::shared_ptr<TrainHook>>& user) {
  std::vector<std::shared_ptr<TrainHook>> hooks = {
      std::make_shared<EpochActionsHook>(t), std::make_shared<EvalHook>(t),      std::make_shared<CheckpointHook>(t),
      std::make_shared<ResultsCsvHook>(t),   std::make_shared<PlotsHook>(t),     std::make_shared<ProgressHook>(t),
      std::make_shared<SummaryHook>(t),
      std::make_shared<RestoreBestHook>(t),  make_callbacks_hook(callbacks)};
  if (t.config().profile) {
    if (t.state().world_size > 1)
      log_warn("profile=true is ignored under distributed training.");
    else
      hooks.push_back(make_profiler_hook(t.config(), ProfiledRun{t.loaded().family->name, t.model().size(), t.device(),
                                                                 t.amp(), t.workers(), t.accumulate(), t.save_dir()}));
  }
  for (const auto& h : user)
    if (h) hooks.push_back(h);
  return hooks;
}

}  // namespace libreyolo::engine
