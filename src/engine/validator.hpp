// Validation: run a detector over a split, post-process each image and score it with the
// COCO evaluator (mAP50-95, mAP50, ... exactly as pycocotools would).
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <libreyolo/libreyolo.hpp>

#include "data/dataset.hpp"
#include "engine/inference.hpp"
#include "eval/coco_eval.hpp"
#include "models/detector.hpp"
#include "models/loaded_model.hpp"
#include "ops/postprocess.hpp"

namespace libreyolo::engine {

struct EvalOptions {
  int imgsz = 640;
  int batch = 16;
  int workers = 4;
  ops::PostprocessThresholds thresholds = ops::kValThresholds;
  // Device, autocast, and the captured forwards (the loaded model's cache) with when to use them
  // (val cuda_graph=...).
  InferenceOptions inference;
  bool progress = false;
  // Class names (index = class id) for the table and the plots; ids without a name print as
  // numbers.
  std::vector<std::string> names;
  // When set, confusion_matrix.png, PR_curve.png, F1_curve.png, P_curve.png and R_curve.png are
  // written into this directory (created). A plot that cannot be written is a warning.
  std::string plot_dir;
  // Log the per-class table (info level) after the evaluation, as Ultralytics prints it.
  bool log_table = false;
};

struct EvalReport {
  // metrics/* keys (the 12 COCO stats, metrics/precision and metrics/recall at the best-F1
  // confidence) and speed/* keys.
  std::vector<std::pair<std::string, double>> metrics;
  eval::CocoStats stats;           // per-class rows and curves included
  std::vector<std::string> plots;  // files written into plot_dir
};

EvalReport evaluate_detector_report(models::Detector& model, const models::Family& family,
                                    std::shared_ptr<const data::YoloDataset> dataset, const EvalOptions& opt);
// The metrics of evaluate_detector_report.
std::vector<std::pair<std::string, double>> evaluate_detector(models::Detector& model,
                                                              const models::Family& family,
                                                              std::shared_ptr<const data::YoloDataset> dataset,
                                                              const EvalOptions& opt);

// The validation table as LibreYOLO and Ultralytics print it: a header (Class, Images,
// Instances, P, R, mAP50, mAP50-95), the "all" row, then one row per class with labels.
// Newline-terminated lines.
std::string format_val_table(const eval::CocoStats& stats, const std::vector<std::string>& names);

// The `val` command / LibreYOLO::val.
ValResult run_validation(models::LoadedModel& impl, const ValConfig& cfg);
// Validation's check of a model against a dataset's names: DataError (class_mismatch, naming both
// lists) when the counts differ, a warning naming each id whose names differ.
void check_classes_match(const std::vector<std::string>& model_names, int model_nc,
                         const std::vector<std::string>& data_names, const std::string& data);

// data=builtin -> the generated shapes dataset (made once under the cache directory); any other
// value is returned unchanged.
std::string resolve_data_arg(const std::string& data);

}  // namespace libreyolo::engine
