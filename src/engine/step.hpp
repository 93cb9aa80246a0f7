// One training step (forward, loss, backward and, at the end of an accumulation window, the
// optimizer step, loss-scale update, EMA update and learning-rate update). Shared by the trainer
// and the step benchmark; the CUDA-graph and profiler work wraps this class.
//
// The step is a function of static buffers, so that it can be captured in a CUDA graph and
// replayed: each call first *stages* its host-side inputs into tensors that live as long as the
// runner (images and targets copied into persistent device buffers; the loss divisor, learning
// rate and EMA weight written into 0-dim device tensors with in-place fills), then runs the
// device work on those tensors only. The staging calls are the part a graph replay repeats
// eagerly; forward_backward_staged() and apply_update() are the parts it can capture. After the
// first backward has created the gradients, nothing in a step allocates a persistent tensor:
// gradients are zeroed in place, optimizer state exists from construction, the fused kernels'
// scratch is allocated once at its largest size.
//
// CUDA graphs (enable_cuda_graphs()): each input shape (batch, image size, box slots) has its own
// staged buffers; on the shape's third occurrence (or the first after its convolution plans are
// final: layers/cudnn_fusion.hpp, PlanTuning) its micro-step (input conversion, forward, loss,
// backward) is captured, and from then on replayed; the update (gradient unscale + inf check,
// clipping, optimizer, scaler update, zeroing, EMA) is one more graph, shared by every shape.
// Shapes seen fewer times run eager. A capture or replay failure switches the rest of the run to
// eager (one warning, nothing lost: a failed capture executed nothing). invalidate_cuda_graphs()
// drops every graph when what the step computes changes (recaptured once the shape settles).
// With a seam scope (a network whose whole step cannot be captured: Detector::train_head), the
// micro-step runs eager except the part before the seam, which is replayed from a forward and a
// backward graph per shape (engine/graphed_segment.hpp), and the update is one graph as above.
// The Head scope cuts after the backbone and encoder; the Network scope after the whole network,
// so that only the loss runs eager, and of a loss that plans (TrainingLoss::plan: a matcher on
// the host) only the plan: its scoring and backward to the network's outputs are one more graph
// per shape, fed the plan through static buffers padded to the targets' box slots. Every micro-step of a seam scope
// goes through the seam (train_head, then train_tail), replayed or not; a batch whose seam inputs
// do not have the captured shapes runs its head eager.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include <libreyolo/config.hpp>

#include <libreyolo/hooks.hpp>

#include "core/cuda_graph.hpp"
#include "engine/amp.hpp"
#include "engine/ema.hpp"
#include "engine/graphed_segment.hpp"
#include "engine/optimizer.hpp"
#include "engine/schedule.hpp"
#include "loss/loss.hpp"
#include "models/detector.hpp"

namespace libreyolo::engine {

// Receives the phases of each step (to_device, forward, loss, backward, optimizer). StepRunner
// reports them only while an observer is set: nothing is done per phase otherwise.
class PhaseObserver {
 public:
  virtual ~PhaseObserver() = default;
  virtual void phase_begin(Phase p) = 0;
  virtual void phase_end(Phase p) = 0;
};

// Reports one phase to an observer, if there is one, for the lifetime of the scope.
class PhaseScope {
 public:
  PhaseScope(PhaseObserver* obs, Phase p) : obs_(obs), p_(p) {
    if (obs_) obs_->phase_begin(p_);
  }
  ~PhaseScope() {
    if (obs_) obs_->phase_end(p_);
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseObserver* obs_;
  Phase p_;
};

struct StepConfig {
  torch::Device device{torch::kCPU};
  AmpPlan amp;
  bool channels_last = false;
  double clip_max_norm = 0.0;
  models::InputSpec input;  // the family's input convention
};

// Gradient synchronisation of data-parallel training: StepRunner calls after_backward() once per
// optimizer step, after the last backward of the accumulation window (the gradients are then
// complete for this process) and before the loss scaler unscales them and checks for inf/NaN, so
// every process unscales, clips and steps the same (averaged, still scaled) gradients. An
// implementation all-reduces `grads` in place (e.g. bucketed NCCL all-reduce, then divide by the
// world size); it must not replace the tensors. The default does nothing (one process).
class GradSync {
 public:
  virtual ~GradSync() = default;
  virtual void after_backward(std::vector<torch::Tensor>& grads) = 0;
  // True when other processes take part (their collectives must match ours call for call): a
  // captured step then cannot fall back to eager on this process alone.
  virtual bool spans_processes() const { return false; }
};

class NoGradSync final : public GradSync {
 public:
  void after_backward(std::vector<torch::Tensor>&) override {}
};


// What the CUDA graphs of a step runner did (for logs, tests and benchmarks).
struct StepGraphStats {
  bool enabled = false;          // enable_cuda_graphs() succeeded and no failure since
  std::string off_reason;        // why graphs are off (empty while enabled or never asked)
  int captured_shapes = 0;       // micro-step graphs alive (Head scope: head graphs alive)
  bool update_captured = false;  // the update graph is alive
  int64_t replayed_micro_steps = 0, eager_micro_steps = 0;
  int64_t replayed_heads = 0;  // seam scopes: eager micro-steps whose head was replayed
  int64_t replayed_losses = 0;  // network scope: micro-steps whose loss was replayed (a planning loss)
  int64_t replayed_updates = 0, eager_updates = 0;
  int invalidations = 0;
  std::vector<std::string> eager_shapes;  // shapes staged but not (yet) captured, e.g. "4x3x160x160"
};

// What enable_cuda_graphs() captures: the whole micro-step, or the part of the training forward
// before a seam (Detector::train_head): the whole network (Network) or its backbone and encoder
// (Head); the update is captured in each.
enum class GraphScope { Step, Network, Head };

class StepRunner {
 public:
  StepRunner(std::shared_ptr<models::Detector> model, std::unique_ptr<TrainingLoss> loss,
             std::unique_ptr<Optimizer> optimizer, std::unique_ptr<GradScaler> scaler, ModelEMA* ema,
             const LrSchedule& schedule, StepConfig cfg);
  ~StepRunner();

  // images: [B, S, S, 3] uint8 (host, ideally pinned, or already on the device);
  // targets: [B, T, 5] float. loss_divisor: accumulation window size.
  // Returns the loss terms (device tensors, no synchronisation).
  // Equals stage(images, targets, loss_divisor) then forward_backward_staged().
  LossOutput forward_backward(const torch::Tensor& images, const torch::Tensor& targets, double loss_divisor = 1.0);
  // Optimizer step (skipped on the device when AMP found inf/NaN), scaler update, zero grads,
  // EMA update, lr <- schedule(global_step + 1). Equals the EMA's stage(), apply_update(), then
  // the host bookkeeping (EMA update count, global step, next learning rate).
  void optimizer_step();

  // Copies the batch into the persistent input buffers (reallocated only when a shape changes;
  // targets keep the loader's padding to a fixed box count) and writes the loss divisor.
  void stage(const torch::Tensor& images, const torch::Tensor& targets, double loss_divisor = 1.0);
  // Forward, loss and backward on the staged buffers; gradients are added into .grad.
  LossOutput forward_backward_staged();
  // The device part of optimizer_step(): gradient sync, unscale + inf check, clipping, optimizer
  // step, scaler update, gradients zeroed in place, EMA lerp. No host state changes.
  void apply_update();

  int64_t global_step() const { return global_step_; }
  void set_global_step(int64_t s);  // also sets the lr and the momentum to the schedule's at s
  Optimizer& optimizer() { return *optimizer_; }
  GradScaler& scaler() { return *scaler_; }
  const StepConfig& config() const { return cfg_; }
  void set_phase_observer(PhaseObserver* obs) { phases_ = obs; }
  PhaseObserver* phase_observer() const { return phases_; }
  TrainingLoss& loss() { return *loss_; }
  // Replaces the gradient synchronisation (nullptr: back to NoGradSync).
  void set_grad_sync(std::unique_ptr<GradSync> sync);
  // Stages `images` (NHWC uint8, any device) and returns the network's float NCHW input buffer
  // (the family's input convention) on the training device, in the step's layout. The buffer is overwritten by the next stage().
  torch::Tensor prepare_images(const torch::Tensor& images);

  // The persistent buffers of the last staged shape (for tests and for graph capture): uint8
  // NHWC images on the device, the float network input, the targets, the 0-dim loss divisor.
  const torch::Tensor& staged_images() const;
  const torch::Tensor& staged_input() const;
  const torch::Tensor& staged_targets() const;
  const torch::Tensor& loss_divisor() const { return divisor_; }

  // CUDA graphs of the whole step, or of its head and the update (see the top of this file).
  // Returns "" when on, else why not (the step then stays eager).
  std::string enable_cuda_graphs(int capture_at_occurrence = 3, GraphScope scope = GraphScope::Step);
  // Drops every captured graph (the captured region would now compute something else: a loss
  // switch, reloaded weights); shapes are counted again and recaptured. `why` is logged.
  void invalidate_cuda_graphs(const std::string& why);
  StepGraphStats graph_stats() const;

 private:
  struct Slot;
  Slot& slot_for(const torch::Tensor& images, const torch::Tensor* targets);
  void stage_images(const torch::Tensor& images, const torch::Tensor* targets);
  void convert_input(Slot& s);
  LossOutput micro_step(Slot& s, bool capturing);
  LossOutput seam_scope_step(Slot& s);
  std::vector<torch::Tensor> seam_forward(Slot& s);  // the training forward through the seam
  // Network scope: the loss of `raw` from a plan (TrainingLoss::plan), replayed from a graph once
  // captured (true: `out` is the graph's, and the outputs' gradients are the slot's raw_grads);
  // false: `out` computed eagerly (or left undefined for compute()).
  bool planned_loss(Slot& s, const std::vector<torch::Tensor>& raw, LossOutput& out);
  models::Seam seam() const { return scope_ == GraphScope::Network ? models::Seam::Network : models::Seam::Head; }
  void graphs_failed(const std::string& what, const std::string& why);
  bool has_graphs() const;  // any micro-step or update graph alive
  void run_update();
  void apply_schedule(int64_t s);  // the optimizer's lr and momentum for step s

  std::shared_ptr<models::Detector> model_;
  std::unique_ptr<TrainingLoss> loss_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<GradScaler> scaler_;
  ModelEMA* ema_;
  LrSchedule schedule_;
  StepConfig cfg_;
  std::unique_ptr<GradSync> grad_sync_;
  int64_t global_step_ = 0;
  PhaseObserver* phases_ = nullptr;
  torch::Tensor divisor_;
  std::vector<std::unique_ptr<Slot>> slots_;  // most recently staged last
  Slot* current_ = nullptr;
  // CUDA graphs.
  bool graphs_on_ = false;
  int capture_at_ = 3;
  GraphScope scope_ = GraphScope::Step;
  std::string graphs_off_reason_;
  std::unique_ptr<CapturedGraph> update_graph_;
  int update_seen_ = 0;
  StepGraphStats counts_;
};

// The one mapping from TrainConfig to a ready step (used by the trainer, the step benchmark and
// the tests): the optimizer over the model's parameter groups (optimizer, lr0, momentum,
// weight_decay, nesterov), the accumulation window round(nbs / batch) (1 when nbs is 0), the
// learning-rate schedule (scheduler, lr0, warmup_epochs, warmup_lr_start, min_lr_ratio, epochs,
// counted in optimizer steps), the loss scaler (from `amp`) and clip_max_norm.
// batches_per_epoch: loader batches per epoch. family: the model's family (its input spec and its
// names for schedules; nullptr: the default input spec, generic schedule names only). The model
// must already be on `device` (and in channels_last when `channels_last`).
struct StepSetup {
  std::unique_ptr<StepRunner> runner;
  int accumulate = 1;           // micro-batches per optimizer step
  int64_t steps_per_epoch = 1;  // optimizer steps per epoch: ceil(batches_per_epoch / accumulate)
  LrSchedule schedule;
};
StepSetup make_step_runner(const TrainConfig& cfg, std::shared_ptr<models::Detector> model,
                           std::unique_ptr<TrainingLoss> loss, ModelEMA* ema, const torch::Device& device,
                           const AmpPlan& amp, bool channels_last, int64_t batches_per_epoch,
                           const models::Family* family = nullptr);

// Micro-batch `index` of an epoch of `batches` with gradients accumulated over `accumulate`
// batches: its window's size (the loss divisor; the epoch's last window may be shorter) and
// whether the optimizer steps after it.
struct AccumulationWindow {
  int64_t size;
  bool optimizer_step;
};
AccumulationWindow accumulation_window(int64_t index, int64_t batches, int accumulate);

// memory_format=channels_last, or auto on a CUDA device: the training step's layout.
bool trains_channels_last(const std::string& memory_format, const torch::Device& device);

// cuda_graph=true: turns on the CUDA graphs `family` declares for training, the deepest first
// within scope_option ("step": the whole step with capture_train_step, else the network seam with
// capture_train_network, else the head seam with capture_train_head; "network": from the network
// seam down; "head": the head seam), and logs what is captured or why training stays eager. collectives: the step's
// gradients are all-reduced across processes (said in the log).
void enable_declared_cuda_graphs(StepRunner& runner, const models::Family& family, const std::string& scope_option,
                                 bool collectives);

// Converts every 4-d parameter to channels_last in place (grads will follow that layout).
void to_channels_last(torch::nn::Module& m);

}  // namespace libreyolo::engine
