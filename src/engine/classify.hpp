// The classify task: training, validation and predict for a models::Classifier. The facade
// (src/api) sends a model here instead of to the detection entry points (run_training,
// check_training, run_validation, run_predict) when its family's task is "classify". Data: data/classify.hpp's class-folder layout and
// transforms; loss: loss/classify.hpp's cross-entropy; the optimizer, schedule, AMP and EMA are
// the detection engine's.
#pragma once
#include <libreyolo/libreyolo.hpp>

#include <string>
#include <utility>
#include <vector>

#include "data/classify.hpp"
#include "engine/predictor.hpp"
#include "models/classifier.hpp"
#include "models/loaded_model.hpp"

namespace libreyolo::engine {

inline bool is_classify(const models::LoadedModel& lm) { return lm.family && lm.family->task == "classify"; }

// Sums of one validation pass.
struct ClassifyMetrics {
  int64_t samples = 0;
  double top1 = 0, top5 = 0;               // fractions; top5 is top-min(5, nc)
  double precision = 0, recall = 0, f1 = 0;  // macro over classes with validation samples
  double loss = 0;                          // mean cross-entropy
  std::vector<int64_t> confusion;           // nc x nc counts at (predicted, true), row-major
  double preprocess_ms = 0, inference_ms = 0;  // per image
  // metrics/accuracy_top1, metrics/accuracy_top5, metrics/precision, metrics/recall, metrics/f1, fitness.
  std::vector<std::pair<std::string, double>> as_list() const;
};

// The crop_pct of a model (the family's value for its size; 1.0 when the family has none).
double classify_crop_pct(const models::LoadedModel& lm);

// One pass over a split in eval mode (eval transform, batches of `batch`, AMP when `half` on CUDA).
ClassifyMetrics evaluate_classifier(models::Classifier& model, const models::Family& family,
                                    const data::ClassifySplit& split, int nc, int imgsz, double crop_pct, int batch,
                                    const torch::Device& device, bool half, int workers);

TrainResult run_classify_training(models::LoadedModel& lm, const TrainConfig& cfg, const TrainCallbacks& callbacks,
                                  const std::vector<std::shared_ptr<TrainHook>>& hooks);
TrainConfig check_classify_training(models::LoadedModel& lm, const TrainConfig& cfg);
ValResult run_classify_validation(models::LoadedModel& lm, const ValConfig& cfg);
std::vector<PredictResult> run_classify_predict(models::LoadedModel& lm, const PredictConfig& cfg);
std::vector<PredictResult> run_classify_predict(models::LoadedModel& lm, const PredictConfig& cfg,
                                                const std::vector<ImageSource>& sources);

// A detection command given a classifier, or the reverse: ModelError naming both tasks.
[[noreturn]] void throw_task_mismatch(const models::LoadedModel& lm, const std::string& wanted_task);

}  // namespace libreyolo::engine
