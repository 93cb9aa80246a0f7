#include "engine/inference.hpp"

#include "engine/amp.hpp"
#include "models/input.hpp"

namespace libreyolo::engine {

InferenceRunner::InferenceRunner(models::Detector& model, const models::Family& family, InferenceOptions opt)
    : model_(model), family_(family), opt_(opt) {
  if (!opt_.device.is_cuda()) opt_.amp = false;
}

torch::Tensor InferenceRunner::forward(const torch::Tensor& images) {
  torch::InferenceMode guard;
  input_ = models::to_network_input(images, family_.input, opt_.device, opt_.channels_last, input_);
  AutocastGuard ac(opt_.device, opt_.amp, opt_.amp_dtype);
  return model_.predict_tensor(input_).to(torch::kFloat);
}

ops::Detections InferenceRunner::postprocess(const torch::Tensor& pred, const models::PostprocessArgs& args) const {
  return family_.postprocess(pred, args);
}

}  // namespace libreyolo::engine
