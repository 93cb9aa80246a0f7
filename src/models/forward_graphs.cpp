#include "models/forward_graphs.hpp"

#include <algorithm>
#include <optional>

#include <libreyolo/errors.hpp>

#include "core/autocast.hpp"
#include "core/cuda_graph.hpp"
#include "core/device.hpp"
#include "core/log.hpp"
#include "core/lru.hpp"
#include "core/strings.hpp"
#include "layers/cudnn_fusion.hpp"
#include "models/input.hpp"

namespace libreyolo::models {

GraphMode parse_graph_mode(const std::string& value, const std::string& key) {
  const std::string v = lower(trim(value));
  if (v == "false" || v == "off" || v == "0" || v == "no" || v.empty()) return GraphMode::Off;
  if (v == "true" || v == "on" || v == "1" || v == "yes") return GraphMode::On;
  if (v == "auto") return GraphMode::Auto;
  throw UsageError("Invalid value for '" + key + "': '" + value + "' is not one of: false, true, auto", "",
                   "config_range_error");
}

struct ForwardGraphs::Entry {
  std::vector<int64_t> key;
  std::string name;
  torch::Tensor images, input, output;
  int seen = 0;
  bool failed = false;  // the capture failed once: this shape stays eager
  torch::ScalarType param_dtype = torch::kFloat;
  std::unique_ptr<CapturedGraph> graph;
};

namespace {

const char* dtype_name(bool amp, torch::ScalarType t) {
  if (!amp) return "fp32";
  return t == torch::kBFloat16 ? "bf16" : "fp16";
}

// The first parameter in registration order (the one parameters() lists first), found depth-first
// without collecting them all: called before every forward, where parameters() (hundreds of
// tensors gathered into a vector) cost 0.2-0.3 ms of host time ahead of a graph's launch.
std::optional<torch::ScalarType> first_param_dtype(const torch::nn::Module& m) {
  for (const auto& p : m.named_parameters(/*recurse=*/false)) return p.value().scalar_type();
  for (const auto& child : m.children())
    if (const auto t = first_param_dtype(*child)) return t;
  return std::nullopt;
}

torch::ScalarType param_dtype_of(Detector& model) { return first_param_dtype(model).value_or(torch::kFloat); }

}  // namespace

ForwardGraphs::ForwardGraphs() = default;

ForwardGraphs::~ForwardGraphs() {
  if (std::any_of(entries_.begin(), entries_.end(), [](const auto& e) { return e->graph != nullptr; })) {
    try {
      torch::cuda::synchronize();
    } catch (...) {
    }
  }
}

ForwardGraphs::Entry& ForwardGraphs::entry_for(const torch::Tensor& images, const ForwardSpec& spec,
                                               torch::ScalarType param_dtype) {
  TORCH_CHECK(images.dim() == 4 && images.size(3) == 3 && images.scalar_type() == torch::kUInt8,
              "inference: expected [B, H, W, 3] uint8 images, got ", images.sizes());
  std::vector<int64_t> key(images.sizes().begin(), images.sizes().end());
  key.push_back(spec.amp ? static_cast<int64_t>(spec.amp_dtype) : -1);
  key.push_back(static_cast<int64_t>(param_dtype));
  key.push_back(spec.device.index());
  key.push_back(spec.channels_last ? 1 : 0);
  key.push_back(common::fold_bn() ? 1 : 0);
  if (Entry* hit = lru_touch(entries_, key)) return *hit;
  lru_make_room(entries_, kMaxGraphs, [&](const Entry& old) {
    if (old.graph) synchronize(spec.device);
  });
  auto e = std::make_unique<Entry>();
  e->key = key;
  e->param_dtype = param_dtype;
  e->name = strfmt("%lldx3x%lldx%lld %s", static_cast<long long>(images.size(0)), static_cast<long long>(images.size(1)),
                   static_cast<long long>(images.size(2)), dtype_name(spec.amp, spec.amp_dtype));
  torch::InferenceMode im;
  e->images = torch::empty(images.sizes(), torch::TensorOptions().dtype(torch::kUInt8).device(spec.device));
  // e->input (the network input buffer, in the dtype eager_forward gives it) is made by the
  // shape's first run, which is always eager.
  entries_.push_back(std::move(e));
  return *entries_.back();
}

namespace {

// Says what the first run of a shape cost in cuDNN fused-convolution plans (layers/cudnn_fusion.hpp),
// when it built any: the first process on a machine compiles them (seconds), later ones read them.
class FusionReport {
 public:
  explicit FusionReport(std::string name) : name_(std::move(name)), before_(cudnn_fusion_stats()) {}
  ~FusionReport() {
    const CudnnFusionStats now = cudnn_fusion_stats();
    const int64_t loaded = now.loaded - before_.loaded, built = now.fused - before_.fused - loaded;
    if (built > 0)
      log_info(strfmt("cuDNN fusion for %s: %lld convolution plans compiled in %.1f s, %lld read from disk",
                      name_.c_str(), static_cast<long long>(built), (now.build_ms - before_.build_ms) / 1000.0,
                      static_cast<long long>(loaded)));
  }
  FusionReport(const FusionReport&) = delete;
  FusionReport& operator=(const FusionReport&) = delete;

 private:
  std::string name_;
  CudnnFusionStats before_;
};

}  // namespace

torch::Tensor eager_forward(Detector& model, const Family& family, const torch::Tensor& images, const ForwardSpec& spec,
                            torch::Tensor* input, bool autocast_cache) {
  torch::InferenceMode guard;
  // Under autocast the input in its dtype: one conversion instead of two (see InputSpec).
  const torch::ScalarType dtype = spec.amp && family.input.autocast_input ? spec.amp_dtype : torch::kFloat;
  torch::Tensor x = to_network_input(images, family.input, spec.device, spec.channels_last,
                                     input ? *input : torch::Tensor(), dtype);
  if (input) *input = x;
  AutocastGuard ac(spec.device, spec.amp, spec.amp_dtype, autocast_cache);
  return model.predict_tensor(x).to(torch::kFloat);
}

torch::Tensor ForwardGraphs::eager(Detector& model, const Family& family, Entry& e, const ForwardSpec& spec,
                                   bool capturing) {
  // (The autocast cache would keep casts made inside a capture beyond it.)
  return eager_forward(model, family, e.images, spec, &e.input, /*autocast_cache=*/!capturing);
}

bool ForwardGraphs::try_capture(Detector& model, const Family& family, Entry& e, const ForwardSpec& spec) {
  try {
    torch::Tensor out;
    e.graph = CapturedGraph::capture(spec.device, [&] { out = eager(model, family, e, spec, /*capturing=*/true); });
    e.output = out;
    ++counts_.captures;
    log_info("CUDA graphs: inference forward captured for " + e.name);
    return true;
  } catch (const CaptureError& err) {
    e.failed = true;
    e.graph.reset();
    ++counts_.failures;
    log_warn("CUDA graphs: capturing the inference forward for " + e.name + " failed (" + err.what() +
             "); this shape runs eager");
    return false;
  }
}

torch::Tensor ForwardGraphs::forward(Detector& model, const Family& family, const torch::Tensor& images,
                                     const ForwardSpec& spec, GraphMode mode) {
  std::string why;
  bool graphable = mode != GraphMode::Off && cuda_graphs_supported(spec.device, &why);
  if (mode == GraphMode::On && !graphable && !said_off_) {
    log_info("CUDA graphs off for inference (" + why + "): running eager");
    said_off_ = true;  // once per model, not once per batch
  }
  if (graphable && !family.capture_inference) {
    if (mode == GraphMode::On)
      throw UsageError("cuda_graph=true: the " + family.name + " family does not declare a capturable inference forward",
                       "Use cuda_graph=false (or auto, which stays eager for it).", "config_unsupported");
    graphable = false;
  }
  if (model.is_training()) {
    release("the model is in training mode");
    graphable = false;
  }
  const torch::ScalarType pdt = param_dtype_of(model);
  if (std::any_of(entries_.begin(), entries_.end(), [&](const auto& e) { return e->param_dtype != pdt; }))
    release("the parameters' dtype changed");
  if (graphable && !entries_.empty() && !folds_.refresh(model)) release("BatchNorm folds reallocated");
  if (!graphable) {
    ++counts_.eager_runs;
    return eager_forward(model, family, images, spec);  // the plain path: no static buffers
  }
  Entry& e = entry_for(images, spec, pdt);
  ++e.seen;
  // The first run of a shape to be captured picks cuDNN's algorithms for good: autotuned (see
  // core/device.hpp; v9-t batch 32 bf16 graphed 9.1 -> 7.4 ms on an H200).
  std::optional<CudnnAutotuneScope> autotune;
  if (e.seen == 1) autotune.emplace(kInferenceAutotuneCandidates);
  {
    torch::InferenceMode guard;
    e.images.copy_(images, /*non_blocking=*/true);
  }
  if (!e.graph && !e.failed) {
    const int at = mode == GraphMode::On ? 1 : 3;
    if (e.seen >= at) {
      // One eager run first on a shape never run (cuDNN picks its algorithms outside the capture).
      if (e.seen == 1) {
        const FusionReport report(e.name);
        (void)eager(model, family, e, spec, false);
      }
      try_capture(model, family, e, spec);
    }
  }
  if (e.graph) {
    try {
      e.graph->replay();
      ++counts_.replays;
      return e.output;
    } catch (const CaptureError& err) {
      log_warn("CUDA graphs: replaying the inference forward for " + e.name + " failed (" + err.what() +
               "); this shape runs eager");
      e.graph.reset();
      e.failed = true;
      ++counts_.failures;
    }
  }
  ++counts_.eager_runs;
  return eager(model, family, e, spec, false);
}

void ForwardGraphs::capture(Detector& model, const Family& family, int64_t batch, int64_t imgsz,
                            const ForwardSpec& spec) {
  std::string why;
  if (!cuda_graphs_supported(spec.device, &why)) throw UsageError("capture_graph: " + why, "", "config_unsupported");
  if (!family.capture_inference)
    throw UsageError("capture_graph: the " + family.name + " family does not declare a capturable inference forward",
                     "", "config_unsupported");
  if (batch < 1 || imgsz < 32 || imgsz % 32 != 0)
    throw UsageError(strfmt("capture_graph: batch %lld and imgsz %lld: batch must be >= 1 and imgsz a positive multiple "
                            "of 32",
                            static_cast<long long>(batch), static_cast<long long>(imgsz)),
                     "", "config_range_error");
  if (model.is_training()) model.eval();
  const torch::Tensor zeros = torch::zeros({batch, imgsz, imgsz, 3}, torch::kUInt8);
  Entry& e = entry_for(zeros, spec, param_dtype_of(model));
  if (e.graph) return;
  e.failed = false;
  {
    torch::InferenceMode guard;
    e.images.copy_(zeros);
  }
  {
    CudnnAutotuneScope autotune(kInferenceAutotuneCandidates);  // as forward() on a new shape
    const FusionReport report(e.name);
    (void)eager(model, family, e, spec, false);  // warm-up
  }
  if (!try_capture(model, family, e, spec))
    throw RuntimeError("capture_graph: the capture failed for " + e.name + " (see the warning above)");
}

void ForwardGraphs::release(const std::string& why) {
  const bool had = std::any_of(entries_.begin(), entries_.end(), [](const auto& e) { return e->graph != nullptr; });
  if (had) {
    try {
      torch::cuda::synchronize();
    } catch (...) {
    }
    log_info("CUDA graphs: inference graphs released (" + why + ")");
    ++counts_.releases;
  }
  entries_.clear();
}

ForwardGraphInfo ForwardGraphs::info() const {
  ForwardGraphInfo i = counts_;
  for (const auto& e : entries_)
    if (e->graph) i.captured.push_back(e->name);
  return i;
}

}  // namespace libreyolo::models
