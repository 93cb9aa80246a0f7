// A model as the library holds it between calls: the network, its family, class names, the image
// size it was trained at, the device, and the checkpoint it came from. The API facade owns one; the
// engine (train, predict, val) works on it; the loaders below build it from a name or a file.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "models/detector.hpp"
#include "models/forward_graphs.hpp"

namespace libreyolo::models {

struct LoadedModel {
  const Family* family = nullptr;
  std::shared_ptr<Detector> model;
  std::vector<std::string> names;
  int imgsz = 640;
  torch::Device device{torch::kCPU};
  std::string weights;         // checkpoint it was loaded from ("" = fresh)
  io::PyValuePtr checkpoint;   // that checkpoint's full contents (resume=true reads it)
  // The weights' training-only auxiliary tensors (Family::aux_prefixes), set aside at loading:
  // inference never runs them; training puts them back when it enables the branch.
  io::StateDict aux_state;
  // Captured inference forwards (predict/val cuda_graph); dropped when the model moves or trains.
  std::shared_ptr<ForwardGraphs> graphs = std::make_shared<ForwardGraphs>();

  void to(const torch::Device& d);
  // The checkpoint metadata describing this model (family, size, task, nc, names, imgsz).
  io::CheckpointMeta meta() const;
};

// A checkpoint path or a model name (family and size, as parse rules in loaded_model.cpp). Throws
// ModelError.
std::unique_ptr<LoadedModel> load_model(const std::string& model, const std::string& device);
std::unique_ptr<LoadedModel> fresh_model(const std::string& family, const std::string& size, int nc,
                                         const std::string& device);
// Builds a model from weights: family/size/nc from the metadata or the weights themselves.
std::unique_ptr<LoadedModel> model_from_checkpoint(const io::PyValuePtr& root, const std::string& origin);
// Throws the ModelError load_model would throw for `model` (missing file, a directory, unknown
// name) without reading anything: what a dry run checks.
void check_model_arg(const std::string& model);

}  // namespace libreyolo::models
