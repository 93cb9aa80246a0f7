#include "engine/amp.hpp"

#include <ATen/autocast_mode.h>
#ifdef LIBREYOLO_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "core/log.hpp"

namespace libreyolo::engine {

std::string AmpPlan::describe() const {
  if (!enabled) return "fp32 (AMP off)";
  return std::string(dtype == torch::kBFloat16 ? "bfloat16 autocast, no loss scaler"
                                               : "float16 autocast with dynamic loss scaling");
}

AmpPlan plan_amp(bool amp, const std::string& amp_dtype, const torch::Device& device) {
  AmpPlan p;
  if (!amp) return p;
  if (!device.is_cuda()) {
    log_info("AMP requested on " + device.str() + ": mixed precision is CUDA-only, training in fp32");
    return p;
  }
  p.enabled = true;
  const bool want_bf16 = amp_dtype == "bfloat16" || amp_dtype == "bf16";
  if (want_bf16) {
    bool supported = false;
#ifdef LIBREYOLO_CUDA
    supported = at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->major >= 8;
#endif
    if (supported) {
      p.dtype = torch::kBFloat16;
      return p;
    }
    log_warn("amp_dtype=bfloat16 requested but " + device.str() +
             " has no bfloat16 support (compute capability < 8.0); using float16 with dynamic loss scaling");
  }
  p.dtype = torch::kHalf;
  p.scaler = true;
  return p;
}

GradScaler::GradScaler(const torch::Device& device, bool enabled, double init_scale, double growth_factor,
                       double backoff_factor, int64_t growth_interval)
    : enabled_(enabled),
      growth_factor_(growth_factor),
      backoff_factor_(backoff_factor),
      growth_interval_(growth_interval) {
  if (!enabled_) return;
  auto f = torch::TensorOptions().dtype(torch::kFloat).device(device);
  scale_ = torch::full({}, init_scale, f);
  growth_tracker_ = torch::zeros({}, f.dtype(torch::kInt));
  found_inf_ = torch::zeros({}, f);
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  return enabled_ ? loss * scale_.to(loss.scalar_type()) : loss;
}

std::optional<torch::Tensor> GradScaler::unscale(const std::vector<torch::Tensor>& grads) {
  if (!enabled_) return std::nullopt;
  torch::NoGradGuard ng;
  found_inf_.zero_();
  auto inv = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  // The kernel wants grads of one dtype and device per call.
  std::vector<torch::Tensor> f32, other;
  for (const auto& g : grads) (g.scalar_type() == torch::kFloat ? f32 : other).push_back(g);
  if (!f32.empty()) at::_amp_foreach_non_finite_check_and_unscale_(f32, found_inf_, inv);
  for (const auto& g : other) at::_amp_foreach_non_finite_check_and_unscale_({g}, found_inf_, inv);
  return found_inf_;
}

void GradScaler::update() {
  if (!enabled_) return;
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, growth_factor_, backoff_factor_,
                         growth_interval_);
}

double GradScaler::current_scale() const { return enabled_ ? scale_.item<double>() : 1.0; }

io::PyValuePtr GradScaler::state_dict() const {
  auto d = io::PyValue::new_dict();
  if (!enabled_) return d;
  d->set("scale", io::PyValue::from_float(scale_.item<double>()));
  d->set("growth_factor", io::PyValue::from_float(growth_factor_));
  d->set("backoff_factor", io::PyValue::from_float(backoff_factor_));
  d->set("growth_interval", io::PyValue::from_int(growth_interval_));
  d->set("_growth_tracker", io::PyValue::from_int(growth_tracker_.item<int64_t>()));
  return d;
}

void GradScaler::load_state_dict(const io::PyValue& sd) {
  if (!enabled_) return;
  if (auto s = sd.get("scale")) scale_.fill_(s->as_float("scale"));
  if (auto t = sd.get("_growth_tracker")) growth_tracker_.fill_(t->as_int("_growth_tracker"));
}

}  // namespace libreyolo::engine
