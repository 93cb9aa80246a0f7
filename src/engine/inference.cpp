#include "engine/inference.hpp"


namespace libreyolo::engine {

InferenceRunner::InferenceRunner(models::Detector& model, const models::Family& family, InferenceOptions opt)
    : model_(model), family_(family), opt_(opt) {
  if (!opt_.device.is_cuda()) opt_.amp = false;
}

torch::Tensor InferenceRunner::forward(const torch::Tensor& images) {
  models::ForwardSpec spec;
  spec.device = opt_.device;
  spec.amp = opt_.amp;
  spec.amp_dtype = opt_.amp_dtype;
  spec.channels_last = opt_.channels_last;
  if (opt_.graphs && opt_.graph_mode != models::GraphMode::Off)
    return opt_.graphs->forward(model_, family_, images, spec, opt_.graph_mode);
  return models::eager_forward(model_, family_, images, spec, &input_);
}

ops::Detections InferenceRunner::postprocess(const torch::Tensor& pred, const models::PostprocessArgs& args) const {
  return family_.postprocess(pred, args);
}

std::vector<ops::Detections> InferenceRunner::postprocess_batch(
    const torch::Tensor& pred, const std::vector<models::PostprocessArgs>& args) const {
  const torch::Tensor rows = pred.narrow(0, 0, static_cast<int64_t>(args.size()));
  if (family_.postprocess_batch && !args.empty()) return family_.postprocess_batch(rows, args);
  std::vector<ops::Detections> out;
  for (size_t i = 0; i < args.size(); ++i) out.push_back(family_.postprocess(rows[static_cast<int64_t>(i)], args[i]));
  return out;
}

}  // namespace libreyolo::engine
