// The one inference path: images in, decoded predictions and detections out. Predict and
// validation both run through it; the CUDA-graph inference work replaces run() for captured shapes.
#pragma once
#include <torch/torch.h>

#include "models/detector.hpp"
#include "models/forward_graphs.hpp"
#include "ops/postprocess.hpp"

namespace libreyolo::engine {

struct InferenceOptions {
  torch::Device device{torch::kCPU};
  bool amp = false;                         // autocast around the forward (CUDA only)
  torch::ScalarType amp_dtype = torch::kHalf;
  // NHWC images viewed as NCHW are channels_last already: keeping that layout costs no copy (and
  // is what predict and validation have always fed the network).
  bool channels_last = true;
  // Captured forwards (the model's cache) and when to use them; null or Off: eager.
  models::ForwardGraphs* graphs = nullptr;
  models::GraphMode graph_mode = models::GraphMode::Off;
};

class InferenceRunner {
 public:
  InferenceRunner(models::Detector& model, const models::Family& family, InferenceOptions opt);

  // [B, S, S, 3] uint8 letterboxed images (host or device) -> [B, 4+nc, A] float32 predictions on
  // the device (not synchronised). The network input lives in a buffer reused while the shape holds.
  torch::Tensor forward(const torch::Tensor& images);
  // One image's predictions -> detections in original-image pixels, by the family's postprocess.
  ops::Detections postprocess(const torch::Tensor& pred, const models::PostprocessArgs& args) const;
  // Every image of a batch of predictions (the first args.size() rows of pred), the same thresholds
  // for all: the family's batched postprocess when it has one, else image by image.
  std::vector<ops::Detections> postprocess_batch(const torch::Tensor& pred,
                                                 const std::vector<models::PostprocessArgs>& args) const;

  const InferenceOptions& options() const { return opt_; }

 private:
  models::Detector& model_;
  const models::Family& family_;
  InferenceOptions opt_;
  torch::Tensor input_;
};

}  // namespace libreyolo::engine
