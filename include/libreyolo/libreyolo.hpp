// LibreYOLO C++ API, shaped like the Python one:
//
//   libreyolo::LibreYOLO model("best.pt");                 // or a model name for a fresh model
//   auto results = model.predict("image.jpg", {{"conf", "0.3"}});
//   auto summary = model.train({{"data", "my.yaml"}, {"epochs", "100"}});
//
// Options are the same key=value pairs the CLI takes (see config.hpp for names and defaults).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <libreyolo/config.hpp>
#include <libreyolo/errors.hpp>
#include <libreyolo/hooks.hpp>

namespace libreyolo {

using Kwargs = std::vector<std::pair<std::string, std::string>>;

struct Detection {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // original-image pixels
  float score = 0;
  int class_id = 0;
  std::string class_name;
};

// One class of a classifier's prediction.
struct ClassScore {
  int class_id = 0;
  std::string class_name;
  float score = 0;  // softmax probability
};

struct PredictResult {
  std::string source;  // file path, or "SAMPLE_IMAGE"
  int height = 0, width = 0;
  std::vector<Detection> detections;  // detect task
  // classify task: the best min(5, nc) classes by probability (top[0] is top-1), and every
  // class's probability (index = class id).
  std::vector<ClassScore> top;
  std::vector<float> probs;
  std::string saved_path;  // annotated image, when save=true
  double preprocess_ms = 0, inference_ms = 0, postprocess_ms = 0;
};

// An image in memory for predict(): `height` rows of `width` pixels of `channels` interleaved
// uint8 values (1: grey, 3: colour, 4: colour and alpha, which is dropped), rows `row_stride`
// bytes apart (0: packed). Colour is RGB unless `bgr` (OpenCV's order). predict() copies the
// pixels before it returns; `name` is the result's source ("" : "image<i>").
struct ImageView {
  const uint8_t* data = nullptr;
  int height = 0, width = 0, channels = 3;
  int64_t row_stride = 0;
  bool bgr = false;
  std::string name;
};

// One row of the validation table: a class with labels in the split.
struct ValClassResult {
  int id = 0;
  std::string name;
  int64_t images = 0, instances = 0;
  double precision = 0, recall = 0, mAP50 = 0, mAP50_95 = 0;
};

struct ValResult {
  // detect: metrics/mAP50-95, ..., speed/...; classify: metrics/accuracy_top1, metrics/accuracy_top5,
  // metrics/precision, metrics/recall, metrics/f1, fitness, speed/...
  std::vector<std::pair<std::string, double>> metrics;
  std::vector<ValClassResult> classes;                  // classes with labels, ascending id
  std::string table;     // "Class Images Instances P R mAP50 mAP50-95", the "all" row, one per class
  std::string save_dir;  // run directory with the plots, metrics.json and per_class.csv
  double get(const std::string& key, double fallback = 0.0) const;
};

struct EpochSummary {
  int epoch = 0;  // 1-based
  double seconds = 0;
  double loss = 0;                                      // mean total loss over the epoch's batches
  std::vector<std::pair<std::string, double>> losses;   // mean of each named term ("box", "cls", ...)
  std::vector<double> lrs;                              // per parameter group, at the epoch's end
  bool validated = false, is_best = false;
  double map50 = 0, map50_95 = 0;  // classify: both hold the top-1 accuracy (the best-model metric)
  std::vector<std::pair<std::string, double>> metrics;  // validation metrics/* (when validated)
  double loss_term(const std::string& name, double fallback = 0.0) const;
};

struct TrainResult {
  double final_loss = 0;
  std::vector<EpochSummary> epochs;
  double best_mAP50 = 0, best_mAP50_95 = 0;
  int best_epoch = 0;  // 1-based, 0 = never validated
  std::string save_dir, best_checkpoint, last_checkpoint;
  double total_seconds = 0;
};

// Callbacks on the usual training events.
struct TrainCallbacks {
  std::function<void(const TrainConfig&, const std::string& save_dir)> on_train_start;
  std::function<void(const EpochSummary&)> on_epoch_end;
  std::function<void(const TrainResult&)> on_train_end;
  std::function<void(const std::exception&)> on_train_exception;
};

// The result of LibreYOLO::profile_inference (the files are in save_dir).
struct InferenceProfile {
  std::string save_dir, profile_path, summary_path, trace_path;  // trace_path "" without a trace
  std::string bound, bound_why;  // preprocess, nms / postprocess, host / launch, compute, memory-pressure
  double img_per_s = 0, p50_ms = 0, p90_ms = 0, p99_ms = 0;
  double preprocess_ms = 0, forward_ms = 0, postprocess_ms = 0;  // synced means
  std::string report;  // the printable report
};

// What the captured inference forwards of a model are (LibreYOLO::graph_info()).
struct GraphInfo {
  std::vector<std::string> captured;  // one per graph alive: "1x3x640x640 fp32"
  long long replays = 0, eager_runs = 0, captures = 0, failures = 0, releases = 0;
};

struct ModelInfo {
  std::string family, size, task;
  int num_classes = 0;
  std::vector<std::string> names;
  int imgsz = 640;
  long long parameters = 0;
  std::string device;
  std::string weights;  // path it was loaded from, or "" for a fresh model
  // Mixed precision when training does not say: the family's default and, where it has one, why.
  bool amp_default = true;
  std::string amp_default_reason;
};

class LibreYOLO {
 public:
  // `model` is a checkpoint path (LibreYOLO .pt), or a model name (a family and a size, as
  // `libreyolo train --help` lists) for a fresh, untrained model of that size (80 COCO class slots).
  explicit LibreYOLO(const std::string& model, const std::string& device = "auto");
  // A fresh model of a family and size with `num_classes` classes.
  static LibreYOLO create(const std::string& family, const std::string& size, int num_classes = 80,
                          const std::string& device = "auto");
  ~LibreYOLO();
  LibreYOLO(LibreYOLO&&) noexcept;
  LibreYOLO& operator=(LibreYOLO&&) noexcept;

  std::vector<PredictResult> predict(const std::string& source, const Kwargs& options = {});
  std::vector<PredictResult> predict(const PredictConfig& config);
  // Images in memory, with predict's options but `source`. UsageError (source_invalid) for an
  // empty list, or a view without data, without pixels, with another channel count or rows
  // closer than their length.
  std::vector<PredictResult> predict(const std::vector<ImageView>& images, const Kwargs& options = {});

  // Every check train(options) makes before its first step (options, device, dataset, model,
  // freeze, optimizer, resume state, where the run directory goes), without training or writing
  // anything: the configuration the run would use, or the error it would stop with.
  TrainConfig check_train(const Kwargs& options);
  // `hooks` run after the built-in ones (see hooks.hpp).
  TrainResult train(const Kwargs& options, const TrainCallbacks& callbacks = {},
                    const std::vector<std::shared_ptr<TrainHook>>& hooks = {});
  TrainResult train(const TrainConfig& config, const TrainCallbacks& callbacks = {},
                    const std::vector<std::shared_ptr<TrainHook>>& hooks = {});

  ValResult val(const Kwargs& options);
  ValResult val(const ValConfig& config);

  // Writes lean inference weights (LibreYOLO v1.0 schema), loadable by Python torch.load.
  void save(const std::string& path) const;
  ModelInfo info() const;

  // CUDA graphs of the inference forward (predict/val cuda_graph=true|auto use the same cache).
  // capture_graph captures [batch, 3, imgsz, imgsz] now; dtype "float32", "float16" or "bfloat16"
  // (autocast). Throws UsageError on the CPU or for a family that does not declare it.
  void capture_graph(int imgsz = 640, int batch = 1, const std::string& dtype = "float32");
  GraphInfo graph_info() const;
  void release_graphs();

  // The inference profiler: latency percentiles, the stage split, a verdict and the profile files.
  InferenceProfile profile_inference(const InferProfileConfig& config);

  struct Impl;

 private:
  explicit LibreYOLO(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

const char* version();

}  // namespace libreyolo
