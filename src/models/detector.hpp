// The family interface: everything generic (trainer, predict, graphs, profiler, dist, CLI)
// talks to a model only through Detector and Family. Adding a family touches its own folder
// plus one registry line (models/registry.cpp).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/state_dict.hpp"

namespace libreyolo {

class DetectionLoss;

namespace models {

// A detector network. named_parameters()/named_buffers() must equal LibreYOLO's state_dict
// keys exactly (persistent buffers only: non-persistent ones such as strides are plain members).
class Detector : public torch::nn::Module {
 public:
  // Raw per-level head outputs (train-time representation), e.g. YOLOv9: [B, 4*reg_max+nc, H/s, W/s].
  virtual std::vector<torch::Tensor> forward_raw(const torch::Tensor& x) = 0;
  // Decoded predictions [B, 4+nc, A]: rows 0-3 xyxy in input pixels, then sigmoid class scores.
  virtual torch::Tensor decode(const std::vector<torch::Tensor>& raw) = 0;
  torch::Tensor predict_tensor(const torch::Tensor& x) { return decode(forward_raw(x)); }

  virtual std::string family_name() const = 0;
  virtual std::string size() const = 0;
  virtual int num_classes() const = 0;
  virtual std::vector<int64_t> strides() const = 0;
  // Changes the class count by replacing only the final class convolutions (hidden widths kept),
  // initialised as a fresh model's would be. No-op when nc is unchanged.
  virtual void reset_num_classes(int nc) = 0;
  // Freeze groups in order (module-name prefixes), for `freeze=N`.
  virtual std::vector<std::string> freeze_groups() const { return {}; }
};

struct Family {
  std::string name;                // "yolo9"
  std::vector<std::string> sizes;  // {"t","s","m","c"}
  std::string default_size;
  bool default_amp = true;
  bool default_sync_bn = false;
  bool supports_spawn = true;
  std::string task = "detect";

  // A fresh model (default init) of a size and class count.
  std::function<std::shared_ptr<Detector>(const std::string& size, int nc)> build;
  // A model shaped like the given state dict (size and hidden widths read from its shapes),
  // with nc classes. Weights are NOT loaded.
  std::function<std::shared_ptr<Detector>(const io::StateDict& sd, int nc)> build_like;
  // True when the keys look like this family.
  std::function<bool(const io::StateDict& sd)> can_load;
  // Size from the weights, if it can be told.
  std::function<std::optional<std::string>(const io::StateDict& sd)> infer_size;
  // Class count from the weights.
  std::function<std::optional<int>(const io::StateDict& sd)> infer_num_classes;
  // Legacy key renames, DDP prefix stripping etc., applied before loading.
  std::function<void(io::StateDict& sd)> normalize_keys;
  // The training loss for a model of this family.
  std::function<std::unique_ptr<DetectionLoss>(const Detector& model)> make_loss;
};

// Registry.
const std::vector<const Family*>& families();
const Family* find_family(const std::string& name);  // nullptr if unknown
const Family* detect_family(const io::StateDict& sd);

// Copies `sd` into the model's parameters and buffers (shape-checked). Missing and unexpected
// keys are collected; with strict=true they are an error (ModelError), otherwise a warning.
struct LoadReport {
  std::vector<std::string> missing, unexpected, shape_mismatch;
};
LoadReport load_state_dict(torch::nn::Module& model, const io::StateDict& sd, bool strict);
// parameters + persistent buffers, in registration order, as LibreYOLO names them.
io::StateDict state_dict(const torch::nn::Module& model);

}  // namespace models
}  // namespace libreyolo
