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
#include "models/detector.hpp"
#include "models/loaded_model.hpp"

namespace libreyolo::engine {

struct EvalOptions {
  int imgsz = 640;
  int batch = 16;
  int workers = 4;
  double conf = 0.001;
  double iou = 0.6;
  int max_det = 300;
  torch::Device device{torch::kCPU};
  bool amp = false;                           // autocast during the forward (CUDA only)
  torch::ScalarType amp_dtype = torch::kHalf;
  bool progress = false;
};

// metrics/* keys (the 12 COCO stats and the precision/recall aliases) and speed/* keys.
std::vector<std::pair<std::string, double>> evaluate_detector(models::Detector& model,
                                                              const models::Family& family,
                                                              std::shared_ptr<const data::YoloDataset> dataset,
                                                              const EvalOptions& opt);

// The `val` command / LibreYOLO::val.
ValResult run_validation(models::LoadedModel& impl, const ValConfig& cfg);

// data=builtin -> the generated shapes dataset (made once under the cache directory); any other
// value is returned unchanged.
std::string resolve_data_arg(const std::string& data);

}  // namespace libreyolo::engine
