// Training loss interface. Implementations must not synchronise with the host (no .item(),
// no boolean-mask indexing with data-dependent shapes): the step may be captured in a CUDA graph.
// A loss that cannot avoid it (a matcher solved on the host) plans that part first (plan/score).
#pragma once
#include <torch/torch.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace libreyolo {

// A loss value: the backpropagated total plus the family's named terms (e.g. box, cls, dfl). Sums, CSV columns (train/<name>_loss) and logs follow the names.
struct LossOutput {
  torch::Tensor total;   // scalar, backpropagated; already the weighted sum of the terms
  torch::Tensor terms;   // [K] weighted, detached, in the order of `names` (the loss dtype)
  torch::Tensor num_fg;  // scalar float: positives / batch size, detached
  const std::vector<std::string>* names = nullptr;  // the loss's term_names(), owned by the loss

  // One term by name, as a scalar tensor. Throws when the loss has no such term.
  torch::Tensor term(const std::string& name) const {
    if (names)
      for (size_t i = 0; i < names->size(); ++i)
        if ((*names)[i] == name) return terms[static_cast<int64_t>(i)];
    throw std::out_of_range("loss has no term '" + name + "'");
  }
};

// The host-side part of a loss resolved into device tensors (TrainingLoss::plan).
class LossPlan {
 public:
  virtual ~LossPlan() = default;
  // Every tensor score() reads of the plan (handles to the plan's own storage): copying another
  // plan's tensors into these, shape for shape, makes this plan that one for score().
  virtual std::vector<torch::Tensor> tensors() const = 0;
};

class TrainingLoss {
 public:
  virtual ~TrainingLoss() = default;
  // raw: the model's forward_raw() output. targets: the task's, as the loader gives them: for
  // detection [B, T, 5] rows (class, x1, y1, x2, y2) normalised to [0,1] by the input width and
  // height, padding rows with class -1; for classification the class ids [B] (int64).
  // img_h/img_w: the input tensor's spatial size.
  virtual LossOutput compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets,
                             int64_t img_h, int64_t img_w) = 0;
  // Names of the terms in LossOutput::terms, fixed for the loss's lifetime.
  virtual const std::vector<std::string>& term_names() const = 0;
  // What compute() reads that the loss keeps between calls (cached anchor grids and the like): a
  // captured step holds these handles, so that they outlive any later cache eviction. A loss whose
  // compute() would change with host-side state (a switch such as an L1 term that starts later) needs the
  // trainer to invalidate captured steps when that state changes (Family::on_close_mosaic).
  virtual std::vector<std::shared_ptr<const void>> capture_keep_alive() const { return {}; }

  // A loss whose compute() must read the host (a matcher solved there) may split it in two:
  // plan() does what needs the host and returns it as device tensors whose shapes depend only on
  // the outputs' shapes and `pad` (room for that many boxes per image; a batch with more gets
  // larger tensors); score() computes the loss from the outputs and a plan without reading the
  // host, so that it can be captured: of `raw` it reads the device tensors, and the host entries
  // only for the layout (which the device entries' number and shapes then tell apart).
  // compute(raw, targets) equals score(raw, *plan(raw, targets, 0)).
  // The default: nullptr (the loss does not plan).
  virtual std::unique_ptr<LossPlan> plan(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets,
                                         int64_t pad) {
    (void)raw;
    (void)targets;
    (void)pad;
    return nullptr;
  }
  // Throws std::logic_error for a loss that does not plan.
  virtual LossOutput score(const std::vector<torch::Tensor>& raw, const LossPlan& plan) {
    (void)raw;
    (void)plan;
    throw std::logic_error("this loss does not plan: score() has no plan to read");
  }
};

}  // namespace libreyolo
