// What a LibreYOLO object holds. Shared by the API, the predictor, the trainer and validation.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include <libreyolo/libreyolo.hpp>

#include "io/pickle.hpp"
#include "models/detector.hpp"

namespace libreyolo {

struct LibreYOLO::Impl {
  const models::Family* family = nullptr;
  std::shared_ptr<models::Detector> model;
  std::vector<std::string> names;
  int imgsz = 640;
  torch::Device device{torch::kCPU};
  std::string weights;            // checkpoint it was loaded from ("" = fresh)
  io::PyValuePtr checkpoint;      // that checkpoint's full contents (resume=true reads it)

  void to(const torch::Device& d);
};

namespace api {
// A checkpoint path or a model name ("yolo9t", "yolo9-s", "LibreYOLO9c"). Throws ModelError.
std::unique_ptr<LibreYOLO::Impl> load_model(const std::string& model, const std::string& device);
std::unique_ptr<LibreYOLO::Impl> fresh_model(const std::string& family, const std::string& size, int nc,
                                             const std::string& device);
// Builds a model from weights: family/size/nc from the metadata or the weights themselves.
std::unique_ptr<LibreYOLO::Impl> model_from_checkpoint(const io::PyValuePtr& root, const std::string& origin);
}  // namespace api

}  // namespace libreyolo
