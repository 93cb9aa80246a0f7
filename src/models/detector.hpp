// The family interface. The engine (trainer, predict, validation) and the CLI reach a model's
// specifics only through Detector and Family: its sizes, weights rules, loss, recipe defaults,
// per-epoch switches, input convention and postprocess. Adding a family touches its own folder
// plus one registry line (families/registry.cpp).
#pragma once
#include <torch/torch.h>

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "data/recipe.hpp"
#include "io/state_dict.hpp"
#include "ops/image_ops.hpp"
#include "ops/postprocess.hpp"

namespace libreyolo {

class TrainingLoss;

namespace models {

// Where a capture seam cuts a training forward (Detector::train_head): Head after the backbone
// and encoder (the decoder and the loss run eager, as LibreYOLO captures), Network after the
// whole network (only the loss, with its host-side matching, runs eager).
enum class Seam { Head, Network };
inline const char* seam_name(Seam s) { return s == Seam::Head ? "head" : "network"; }

// A seam's per-batch inputs (Detector::seam_inputs).
struct SeamInputs {
  std::vector<torch::Tensor> head;  // read by train_head: device tensors, shapes fixed per input shape
  std::vector<torch::Tensor> tail;  // read by train_tail only (host tensors allowed)
};

// A detector network. named_parameters()/named_buffers() must equal LibreYOLO's state_dict
// keys exactly (persistent buffers only: non-persistent ones such as strides are plain members).
class Detector : public torch::nn::Module {
 public:
  // Raw per-level head outputs (train-time representation), e.g. a DFL head's [B, 4*reg_max+nc, H/s, W/s].
  virtual std::vector<torch::Tensor> forward_raw(const torch::Tensor& x) = 0;
  // Decoded predictions [B, 4+nc, A]: rows 0-3 xyxy in input pixels, then sigmoid class scores.
  virtual torch::Tensor decode(const std::vector<torch::Tensor>& raw) = 0;
  torch::Tensor predict_tensor(const torch::Tensor& x) { return decode(forward_raw(x)); }

  virtual std::string family_name() const = 0;
  virtual std::string size() const = 0;
  virtual int num_classes() const = 0;
  virtual std::vector<int64_t> strides() const = 0;
  // The smallest square input side the network takes (0: any multiple of its largest stride), e.g.
  // a decoder that selects its queries from the encoder's positions needs enough of them.
  virtual int64_t min_input_size() const { return 0; }
  // Changes the class count by replacing only the final class convolutions (hidden widths kept),
  // initialised as a fresh model's would be. No-op when nc is unchanged.
  virtual void reset_num_classes(int nc) = 0;
  // Freeze groups in order (module-name prefixes), for `freeze=N`.
  virtual std::vector<std::string> freeze_groups() const { return {}; }

  // A training-only auxiliary branch (a PGI neck and head): trained with the model, its
  // loss weighted `weight`, saved under the family's aux_prefixes, never run by inference.
  // weight 0 removes it. Returns false when the family has none.
  virtual bool enable_aux(double weight) {
    (void)weight;
    return false;
  }
  virtual double aux_weight() const { return 0.0; }
  // The training forward, what the family's loss reads: forward_raw's maps, followed by the
  // auxiliary head's when the branch is enabled and the model is in training mode. `targets` are
  // the batch's boxes as the loss gets them (TrainingLoss::compute), for a family whose network
  // itself reads them (denoising queries made from the ground truth); undefined when there are
  // none (memory probes), and ignored by the others.
  virtual std::vector<torch::Tensor> forward_train(const torch::Tensor& x, const torch::Tensor& targets) {
    (void)targets;
    return forward_raw(x);
  }

  // Capture seams in the training forward, for a network whose whole step cannot be captured
  // (data-dependent shapes or host reads past some point). For a seam s, in training mode
  // forward_train(x, targets) equals, up to rounding where the seam pads,
  //   in = seam_inputs(s, targets); train_tail(s, train_head(s, x, in.head), x, targets, in)
  // where train_head is a fixed-shape function of x and in.head without host reads, reading only
  // head_parameters(s) (the step runner may replay it, forward and backward, from CUDA graphs) and
  // train_tail the rest. seam_inputs runs eagerly each step: what it puts in `head` are device
  // tensors whose shapes depend only on the input shape (for most batches; a batch whose shapes
  // differ runs eager), copied into the graph's static buffers; `tail` is read by train_tail only.
  // No seam s: head_parameters(s) is empty (the default) and the others are not called.
  virtual std::vector<torch::Tensor> head_parameters(Seam seam) {
    (void)seam;
    return {};
  }
  virtual SeamInputs seam_inputs(Seam seam, const torch::Tensor& targets) {
    (void)seam, (void)targets;
    return {};
  }
  virtual std::vector<torch::Tensor> train_head(Seam seam, const torch::Tensor& x,
                                                const std::vector<torch::Tensor>& head_inputs) {
    (void)seam, (void)x, (void)head_inputs;
    throw std::logic_error(family_name() + " has no training seam " + seam_name(seam));
  }
  virtual std::vector<torch::Tensor> train_tail(Seam seam, const std::vector<torch::Tensor>& head,
                                                const torch::Tensor& x, const torch::Tensor& targets,
                                                const SeamInputs& inputs) {
    (void)head, (void)x, (void)targets, (void)inputs;
    throw std::logic_error(family_name() + " has no training seam " + seam_name(seam));
  }
};

// How a family wants its input: images arrive as NHWC uint8 RGB; the network gets float NCHW
// `(pixel / divisor - mean[c]) / stddev[c]`, channels reversed when `bgr` (a network taking BGR
// 0-255: bgr, divisor 1). mean and stddev are per network channel (after the reversal); the
// defaults (0 and 1) leave `pixel / divisor` as it is.
struct InputSpec {
  bool bgr = false;
  double divisor = 255.0;
  std::array<double, 3> mean{0.0, 0.0, 0.0};
  std::array<double, 3> stddev{1.0, 1.0, 1.0};
  // Whether mean or stddev is other than the identity.
  bool normalizes() const {
    for (int c = 0; c < 3; ++c)
      if (mean[c] != 0.0 || stddev[c] != 1.0) return true;
    return false;
  }
  // Under autocast the input may arrive in the autocast dtype: everything the network does to it
  // before its first convolution (none, or a space-to-depth stem's strided copies) commutes with
  // that cast, which the convolution would make anyway. A family whose first ops need float32
  // input says false.
  bool autocast_input = true;
  // How an image is made square for the network, in training, validation and predict alike
  // (ops::Fit: top-left letterbox, or stretched to S x S).
  ops::Fit fit = ops::Fit::Letterbox;
};

// One image's decoded predictions [4+nc, A] -> detections in original-image pixels.
struct PostprocessArgs {
  double conf = 0.25, iou = 0.45;
  int max_det = 300;
  ops::ImageGeometry geometry;  // the fit's scales and the original size
};

// How a family's parameters split into optimizer groups, by name: the first rule whose conditions
// hold takes the parameter (frozen ones are left out). A family without rules gets the shared
// grouping: BatchNorm weights and every bias without decay, the other weights with it.
struct ParamRule {
  std::vector<std::string> all_of;  // every one of these is a substring of the parameter's name
  std::vector<std::string> any_of;  // and, when not empty, at least one of these is
  bool decay = true;                // the configured weight decay, or none
  bool backbone_lr = false;         // the lr_backbone learning rate (as a ratio to lr0) instead of lr0
};

struct Family {
  Family() = default;
  Family(std::string family_name, std::vector<std::string> size_names, std::string default_size_name)
      : name(std::move(family_name)), sizes(std::move(size_names)), default_size(std::move(default_size_name)) {}

  std::string name;                // the registry name: model names are name + size
  std::vector<std::string> sizes;  // {"t","s","m","c"}
  std::string default_size;
  // The input side (imgsz) of a size: what a fresh model predicts and validates at and what
  // training uses when no imgsz is given. Unset: 640 for a fresh model, training's own default.
  std::function<int(const std::string& size)> input_size;
  bool default_amp = true;
  // Why default_amp is what it is, where that is worth saying (a departure from LibreYOLO 1.6.0's
  // default): printed by `info` and in the training log. Empty: nothing to say.
  std::string default_amp_reason;
  bool default_sync_bn = false;
  bool supports_spawn = true;
  // The whole training step (forward, loss with its assigner, backward, update) is free of host
  // synchronisation and data-dependent shapes, so it can be captured in a CUDA graph.
  bool capture_train_step = false;
  // When it cannot: the training forward has a capture seam (Detector::train_head) whose part
  // before it the step runner replays from CUDA graphs, forward and backward, with the update:
  // Seam::Head (backbone and encoder), Seam::Network (the whole network, the loss eager).
  bool capture_train_head = false;
  bool capture_train_network = false;
  // The eval forward (input conversion, network, decode) is free of host synchronisation and
  // data-dependent shapes; proven bitwise equal to eager by a capture/replay parity test.
  bool capture_inference = false;
  // The task its models do: "detect" (boxes: the detection engine) or "classify" (the network is
  // a models::Classifier; the engine's classify task trains, validates and predicts it).
  std::string task = "detect";
  // The class count of a fresh model made from a name alone (80 COCO slots; ImageNet's 1000 for
  // the classifiers).
  int default_num_classes = 80;
  // Classification's eval geometry: the shorter side resized (bicubic) to floor(S / crop_pct),
  // then the centre S x S crop. Unset for a detector.
  std::function<double(const std::string& size)> crop_pct;
  // Key prefixes of the training-only auxiliary branch (Detector::enable_aux): inference loading
  // sets these tensors aside, training puts them back when it enables the branch.
  std::vector<std::string> aux_prefixes;
  // The family's own names for the generic learning-rate schedules (engine/schedule.hpp), as
  // {name, generic name}: a `scheduler` value means the same only for models of this family.
  std::vector<std::pair<std::string, std::string>> scheduler_names;

  // A fresh model (default init) of a size and class count.
  std::function<std::shared_ptr<Detector>(const std::string& size, int nc)> build;
  // A model shaped like the given state dict (size and hidden widths read from its shapes),
  // with nc classes (nc <= 0: the count the weights have). Weights are NOT loaded.
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
  std::function<std::unique_ptr<TrainingLoss>(const Detector& model)> make_loss;
  // The six weight functions above at once (every family has all of them).
  void set_weight_functions(decltype(build) b, decltype(build_like) like, decltype(can_load) recognise,
                            decltype(infer_size) size, decltype(infer_num_classes) classes,
                            decltype(normalize_keys) normalize) {
    build = std::move(b);
    build_like = std::move(like);
    can_load = std::move(recognise);
    infer_size = std::move(size);
    infer_num_classes = std::move(classes);
    normalize_keys = std::move(normalize);
  }

  // Recipe: option values (TrainConfig keys) that differ from the defaults of config.hpp,
  // applied before the caller's own options.
  std::vector<std::pair<std::string, std::string>> train_defaults;
  // Recipe values of one size, applied after train_defaults (e.g. a backbone learning rate that
  // depends on the size). Unset: none.
  std::function<std::vector<std::pair<std::string, std::string>>(const std::string& size)> size_train_defaults;
  // Per-epoch switch when mosaic closes (no_aug_epochs before the end), e.g. an L1 box term that starts then.
  // Returns true when it changed what the training step computes (captured graphs must go).
  std::function<bool(Detector& model, TrainingLoss& loss)> on_close_mosaic;
  InputSpec input;
  // What the training augmentation does after the shared mosaic (data/recipe.hpp).
  data::AugmentRecipe augment;
  std::function<ops::Detections(const torch::Tensor& pred, const PostprocessArgs& args)> postprocess;
  // Optional: every image of a batch [B, ...] at once, the same detections as `postprocess` image
  // by image (fewer device synchronisations); unset: `postprocess` per image.
  std::function<std::vector<ops::Detections>(const torch::Tensor& pred, const std::vector<PostprocessArgs>& args)>
      postprocess_batch;
  // Optimizer groups by parameter name (empty: the shared grouping).
  std::vector<ParamRule> param_rules;
  // Postprocess thresholds of validation during training.
  ops::PostprocessThresholds train_val_thresholds = ops::kTrainValThresholds;
};

// Registry.
const std::vector<const Family*>& families();
const Family* find_family(const std::string& name);  // nullptr if unknown
// The first registered family with its default size: the model a command uses when given none.
std::string default_model_name();
const Family* detect_family(const io::StateDict& sd);

// Copies `sd` into the model's parameters and buffers (shape-checked). Missing and unexpected
// keys are collected; with strict=true they are an error (ModelError), otherwise a warning.
// part=true: `sd` is meant for a part of the model (a branch's tensors): the model's other entries
// are missing by design and not warned about (still listed in the report).
struct LoadReport {
  std::vector<std::string> missing, unexpected, shape_mismatch;
};
LoadReport load_state_dict(torch::nn::Module& model, const io::StateDict& sd, bool strict, bool part = false);
// A build_like's class count: nc when > 0, else the count read from the weights (ModelError
// naming `weights_of`, the family as the message should call it, when they give none).
int class_count(int nc, const std::optional<int>& from_weights, const std::string& weights_of);
// An image batch [B, 3, H, W] with H and W multiples of 32 (a network of strides 8 to 32), else
// UsageError naming the network (`network`, as messages call it) and the shape.
void check_stride32_input(const torch::Tensor& x, const std::string& network);
// BatchNorm layers (1-, 2- or 3-d): the one test used for the optimizer's groups and for freezing.
bool is_batchnorm(const torch::nn::Module& m);

// parameters + persistent buffers, in registration order, as LibreYOLO names them.
io::StateDict state_dict(const torch::nn::Module& model);
// The parameters (buffers: unique_named_buffers), each tensor once under its first name, in
// registration order. A module registered under several names (a convolution shared across
// levels) lists its tensors under each name in named_parameters(); whatever updates or counts
// tensors (optimizer groups, EMA, memory estimates) must see each once.
std::vector<std::pair<std::string, torch::Tensor>> unique_named_parameters(const torch::nn::Module& model);
std::vector<std::pair<std::string, torch::Tensor>> unique_named_buffers(const torch::nn::Module& model);

}  // namespace models
}  // namespace libreyolo
