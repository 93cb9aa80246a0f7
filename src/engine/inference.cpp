#include "engine/inference.hpp"

#include "engine/amp.hpp"
#include "models/input.hpp"

namespace libreyolo::engine {

InferenceRunner::InferenceRunner(models::Detector& model, const models::Family& family, InferenceOptions opt)
    : model_(model), family_(family), opt_(opt) {
  if (!opt_.device.is_cuda()) opt_.amp = false;
}

torch::Tensor InferenceRunner::forward(const torch::Tensor& images) {
  if (opt_.graphs && opt_.graph_mode != models::GraphMode::Off) {
    models::ForwardSpec spec;
    spec.device = opt_.device;
    spec.amp = opt_.amp;
    spec.amp_dtype = opt_.amp_dtype;
    spec.channels_last = opt_.channels_last;
    return opt_.graphs->forward(model_, family_, images, spec, opt_.graph_mode);
  }
  torch::InferenceMode guard;
  input_ = models::to_network_input(images, family_.input, opt_.device, opt_.channels_last, input_);
  AutocastGuard ac(opt_.device, opt_.amp, opt_.amp_dtype);
  return model_.predict_tensor(input_).to(torch::kFloat);
}

ops::Detections InferenceRunner::postprocess(const torch::Tensor& pred, const models::PostprocessArgs& args) const {
  return family_.postprocess(pred, args);
}

}  // namespace libreyolo::engine
