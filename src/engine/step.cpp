#include "engine/step.hpp"
#include <libreyolo/errors.hpp>

#include <algorithm>
#include <exception>
#include <cmath>

#include "core/device.hpp"
#include "core/log.hpp"
#include "core/lru.hpp"
#include "core/cuda_graph.hpp"
#include "layers/fold.hpp"
#include "layers/conv_bn_act.hpp"
#include "layers/cudnn_fusion.hpp"
#include "models/input.hpp"

namespace libreyolo::engine {

void to_channels_last(torch::nn::Module& m) {
  torch::NoGradGuard ng;
  for (auto& p : m.parameters())
    if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
}

// One input shape's staged buffers and, once captured, its micro-step graph with the graph's
// static outputs.
struct StepRunner::Slot {
  std::vector<int64_t> key;  // image sizes, then target sizes (-1: images only)
  std::string name;          // "16x3x640x640" (batch x channels x height x width)
  torch::Tensor images, input, targets;
  int seen = 0;  // staged for a step (not counting prepare_images)
  std::unique_ptr<CapturedGraph> graph;
  LossOutput out;
  std::unique_ptr<GraphedSegment> head;   // seam scopes
  std::vector<torch::Tensor> head_inputs;  // seam scopes: the seam's static inputs once captured
  // Network scope with a loss that plans (TrainingLoss::plan): the loss and its backward to the
  // network's outputs replayed from a graph that reads static copies of the outputs and of the
  // plan, and writes the loss and the outputs' gradients.
  int criterion_seen = 0;  // steps scored from a padded plan
  std::unique_ptr<CapturedGraph> criterion;
  std::unique_ptr<LossPlan> plan;
  std::vector<torch::Tensor> plan_tensors, raw_static, raw_grads;
  LossOutput criterion_out;
};

namespace {
constexpr size_t kMaxSlots = 8;  // input shapes kept (a graph's memory goes with its slot)
}

StepRunner::StepRunner(std::shared_ptr<models::Detector> model, std::unique_ptr<TrainingLoss> loss,
                       std::unique_ptr<Optimizer> optimizer, std::unique_ptr<GradScaler> scaler, ModelEMA* ema,
                       const LrSchedule& schedule, StepConfig cfg)
    : model_(std::move(model)),
      loss_(std::move(loss)),
      optimizer_(std::move(optimizer)),
      scaler_(std::move(scaler)),
      ema_(ema),
      schedule_(schedule),
      cfg_(cfg),
      grad_sync_(std::make_unique<NoGradSync>()) {
  divisor_ = torch::ones({}, torch::TensorOptions().dtype(torch::kFloat).device(cfg_.device));
  apply_schedule(0);
}

void StepRunner::apply_schedule(int64_t s) {
  optimizer_->set_lr(schedule_.at(s));
  optimizer_->set_momentum(schedule_.momentum_at(s));
}

StepRunner::~StepRunner() {
  // Graphs may still be queued: let them finish before their memory pools go. Not when unwinding
  // from an error: under multi-GPU the queued work may wait for a rank that is gone, and this
  // process is on its way out (an in-flight graph is freed when it completes).
  if (has_graphs() && std::uncaught_exceptions() == 0) {
    try {
      synchronize(cfg_.device);
    } catch (...) {
    }
  }
}

bool StepRunner::has_graphs() const {
  return update_graph_ ||
         std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->graph || s->head || s->criterion; });
}

void StepRunner::set_global_step(int64_t s) {
  global_step_ = s;
  apply_schedule(s);
}

void StepRunner::set_grad_sync(std::unique_ptr<GradSync> sync) {
  // Graphs captured before would not contain the synchronisation.
  if (has_graphs()) invalidate_cuda_graphs("gradient synchronisation changed");
  grad_sync_ = sync ? std::move(sync) : std::make_unique<NoGradSync>();
}

const torch::Tensor& StepRunner::staged_images() const {
  TORCH_CHECK(current_, "nothing staged yet");
  return current_->images;
}
const torch::Tensor& StepRunner::staged_input() const {
  TORCH_CHECK(current_, "nothing staged yet");
  return current_->input;
}
const torch::Tensor& StepRunner::staged_targets() const {
  TORCH_CHECK(current_, "nothing staged yet");
  return current_->targets;
}

StepRunner::Slot& StepRunner::slot_for(const torch::Tensor& images, const torch::Tensor* targets) {
  TORCH_CHECK(images.dim() == 4 && images.size(3) == 3, "step: expected [B, H, W, 3] images, got ", images.sizes());
  std::vector<int64_t> key(images.sizes().begin(), images.sizes().end());
  if (targets)
    key.insert(key.end(), targets->sizes().begin(), targets->sizes().end());
  else
    key.push_back(-1);
  if (Slot* hit = lru_touch(slots_, key)) return *hit;
  // The least recently used shape goes, with its graph (after queued work that may use it).
  lru_make_room(slots_, kMaxSlots, [&](const Slot& old) {
    if (old.graph || old.head || old.criterion) synchronize(cfg_.device);
  });
  torch::NoGradGuard ng;
  auto s = std::make_unique<Slot>();
  s->key = key;
  s->name = strfmt("%lldx3x%lldx%lld", static_cast<long long>(images.size(0)), static_cast<long long>(images.size(1)),
                   static_cast<long long>(images.size(2)));
  s->images = torch::empty(images.sizes(), images.options().device(cfg_.device).pinned_memory(false));
  const auto fmt = cfg_.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  s->input = torch::empty({images.size(0), images.size(3), images.size(1), images.size(2)},
                          torch::TensorOptions().dtype(torch::kFloat).device(cfg_.device).memory_format(fmt));
  if (targets)
    s->targets = torch::empty(targets->sizes(), targets->options().device(cfg_.device).pinned_memory(false));
  slots_.push_back(std::move(s));
  return *slots_.back();
}

void StepRunner::stage_images(const torch::Tensor& images, const torch::Tensor* targets) {
  torch::NoGradGuard ng;
  Slot& s = slot_for(images, targets);
  s.images.copy_(images, /*non_blocking=*/true);
  if (targets) s.targets.copy_(*targets, /*non_blocking=*/true);
  current_ = &s;
}

void StepRunner::convert_input(Slot& s) {
  torch::NoGradGuard ng;
  // Into the slot's persistent input buffer, by the family's input convention.
  s.input = models::to_network_input(s.images, cfg_.input, cfg_.device, cfg_.channels_last, s.input);
}

torch::Tensor StepRunner::prepare_images(const torch::Tensor& images) {
  stage_images(images, nullptr);
  convert_input(*current_);
  return current_->input;
}

void StepRunner::stage(const torch::Tensor& images, const torch::Tensor& targets, double loss_divisor) {
  stage_images(images, &targets);
  ++current_->seen;
  divisor_.fill_(loss_divisor);
}

LossOutput StepRunner::forward_backward(const torch::Tensor& images, const torch::Tensor& targets,
                                        double loss_divisor) {
  {
    PhaseScope ps(phases_, Phase::ToDevice);
    stage(images, targets, loss_divisor);
  }
  return forward_backward_staged();
}

LossOutput StepRunner::micro_step(Slot& s, bool capturing) {
  // No phase reports while capturing: an observer may synchronise, which a capture forbids.
  PhaseObserver* obs = capturing ? nullptr : phases_;
  LossOutput out;
  std::vector<torch::Tensor> raw;
  bool graphed_loss = false;
  {
    // The autocast cache would keep casts made inside the capture beyond it.
    AutocastGuard ac(cfg_.device, cfg_.amp.enabled, cfg_.amp.dtype, /*cache=*/!capturing);
    {
      PhaseScope ps(obs, Phase::Forward);
      convert_input(s);
      raw = graphs_on_ && scope_ != GraphScope::Step ? seam_forward(s) : model_->forward_train(s.input, s.targets);
    }
    PhaseScope ps(obs, Phase::Loss);
    // With the whole network replayed, a loss that plans is scored from a graph too.
    if (graphs_on_ && scope_ == GraphScope::Network && s.head && !capturing)
      graphed_loss = planned_loss(s, raw, out);
    if (!graphed_loss && !out.total.defined()) out = loss_->compute(raw, s.targets, s.input.size(2), s.input.size(3));
  }
  PhaseScope ps(obs, Phase::Backward);
  if (graphed_loss) {
    // The outputs' gradients the graph computed, into the network's replayed backward.
    std::vector<torch::Tensor> outs, grads;
    for (size_t i = 0; i < raw.size(); ++i)
      if (s.raw_grads[i].defined() && raw[i].requires_grad()) {
        outs.push_back(raw[i]);
        grads.push_back(s.raw_grads[i]);
      }
    models::DeferredWeightGrads weight_grads;
    if (!outs.empty()) torch::autograd::backward(outs, grads);
    weight_grads.flush();
    return out;
  }
  // Always divided (by 1 outside accumulation: the same values), so that the last, shorter
  // accumulation window is the same computation with another divisor.
  torch::Tensor loss = out.total / divisor_;
  models::DeferredWeightGrads weight_grads;
  scaler_->scale(loss).backward();
  weight_grads.flush();
  // Detached: a captured step must not keep its autograd graph (and its AccumulateGrad nodes,
  // made on the capture stream) alive.
  out.total = out.total.detach();
  if (out.terms.defined()) out.terms = out.terms.detach();
  if (out.num_fg.defined()) out.num_fg = out.num_fg.detach();
  return out;
}

namespace {
bool same_shapes(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].sizes() != b[i].sizes() || a[i].scalar_type() != b[i].scalar_type() || a[i].device() != b[i].device())
      return false;
  return true;
}
// The same entries, and the same shapes where they are device tensors (a loss's score() reads
// its outputs' host entries for their layout only: TrainingLoss::plan).
bool same_device_shapes(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].is_cuda() != b[i].is_cuda() || (a[i].is_cuda() && !same_shapes({a[i]}, {b[i]}))) return false;
  return true;
}

// Whether the convolutions' plans are final, so that a capture now keeps them: no timing left on
// a worker, and none handed over but not yet run (adopted now, they run eager in this occurrence).
bool plans_in_place() {
  return models::cudnn_training_plans_settled() && models::cudnn_adopt_timed_plans() == 0;
}

}  // namespace

bool StepRunner::planned_loss(Slot& s, const std::vector<torch::Tensor>& raw, LossOutput& out) {
  // Room for the loader's box slots per image: the plan's shapes then stay those of the slot.
  auto plan = loss_->plan(raw, s.targets, s.targets.size(1));
  if (!plan) return false;
  const auto fresh = plan->tensors();
  if (!s.criterion && s.criterion_seen++ >= 1) {  // scored eagerly from a padded plan once first
    try {
      s.raw_static.clear();
      for (const auto& r : raw) {
        if (!r.is_cuda()) {
          s.raw_static.push_back(r);  // host entries (sizes, counts) are read as they are
          continue;
        }
        auto leaf = r.detach().clone();
        if (r.requires_grad()) leaf.requires_grad_(true);
        s.raw_static.push_back(leaf);
      }
      s.plan = std::move(plan);
      s.plan_tensors = s.plan->tensors();
      std::vector<torch::Tensor> leaves;
      std::vector<size_t> at;
      for (size_t i = 0; i < s.raw_static.size(); ++i)
        if (s.raw_static[i].requires_grad()) {
          leaves.push_back(s.raw_static[i]);
          at.push_back(i);
        }
      release_cached_blocks(cfg_.device);
      LossOutput o;
      std::vector<torch::Tensor> g;
      s.criterion = CapturedGraph::capture(cfg_.device, [&] {
        torch::AutoGradMode grad_on(true);
        o = loss_->score(s.raw_static, *s.plan);
        g = torch::autograd::grad({scaler_->scale(o.total / divisor_)}, leaves, {}, /*retain_graph=*/false,
                                  /*create_graph=*/false, /*allow_unused=*/true);
      });
      s.raw_grads.assign(s.raw_static.size(), torch::Tensor());
      for (size_t k = 0; k < at.size(); ++k) s.raw_grads[at[k]] = g[k];
      s.criterion_out = o;
      s.criterion_out.total = o.total.detach();
      if (o.terms.defined()) s.criterion_out.terms = o.terms.detach();
      if (o.num_fg.defined()) s.criterion_out.num_fg = o.num_fg.detach();
      log_info(strfmt("CUDA graphs: training loss captured for input %s (scored from its matching, and its backward)",
                      s.name.c_str()));
    } catch (const CaptureError& e) {
      graphs_failed("capturing the training loss for input " + s.name, e.what());
      return false;
    }
  }
  if (plan && (!s.criterion || !same_shapes(fresh, s.plan_tensors) || !same_device_shapes(raw, s.raw_static))) {
    // Not captured yet, or a batch of other shapes (more boxes than the slots, no denoising):
    // scored eagerly from this plan, backward as usual.
    out = loss_->score(raw, *plan);
    return false;
  }
  {
    torch::NoGradGuard ng;
    for (size_t i = 0; i < raw.size(); ++i)
      if (raw[i].is_cuda()) s.raw_static[i].copy_(raw[i], /*non_blocking=*/true);
    if (plan)  // (else the plan the graph was just captured with)
      for (size_t k = 0; k < fresh.size(); ++k) s.plan_tensors[k].copy_(fresh[k], /*non_blocking=*/true);
  }
  try {
    s.criterion->replay();
  } catch (const CaptureError& e) {
    graphs_failed("replaying the training loss for input " + s.name, e.what());
    return false;  // computed eagerly by the caller
  }
  ++counts_.replayed_losses;
  out = s.criterion_out;
  return true;
}

std::vector<torch::Tensor> StepRunner::seam_forward(Slot& s) {
  const models::Seam cut = seam();
  const models::SeamInputs in = model_->seam_inputs(cut, s.targets);
  // Before the capture the slot keeps the latest inputs (the capture reads their shapes); after
  // it, inputs of the captured shapes are copied into those buffers, and others run eager.
  bool replay = false;
  if (!s.head) {
    s.head_inputs = in.head;
  } else if (same_shapes(in.head, s.head_inputs)) {
    torch::NoGradGuard ng;
    for (size_t i = 0; i < in.head.size(); ++i) s.head_inputs[i].copy_(in.head[i], /*non_blocking=*/true);
    replay = true;
  }
  std::vector<torch::Tensor> head;
  if (replay) {
    head = s.head->run();
    ++counts_.replayed_heads;
  } else {
    head = model_->train_head(cut, s.input, in.head);
  }
  return model_->train_tail(cut, head, s.input, s.targets, in);
}

LossOutput StepRunner::seam_scope_step(Slot& s) {
  if (!s.head && s.seen >= capture_at_ && plans_in_place()) {
    try {
      release_cached_blocks(cfg_.device);
      AutocastGuard ac(cfg_.device, cfg_.amp.enabled, cfg_.amp.dtype, /*cache=*/false);
      const models::Seam cut = seam();
      s.head = GraphedSegment::capture(
          cfg_.device, [&](const torch::Tensor& x) { return model_->train_head(cut, x, s.head_inputs); }, s.input,
          model_->head_parameters(cut));
      log_info(strfmt("CUDA graphs: training %s captured for input %s (its forward and backward)",
                      cut == models::Seam::Network ? "network" : "head", s.name.c_str()));
    } catch (const CaptureError& e) {
      graphs_failed(std::string("capturing the training ") + models::seam_name(seam()) + " for input " + s.name,
                    e.what());
    }
  }
  ++counts_.eager_micro_steps;
  if (s.head) {
    try {
      return micro_step(s, /*capturing=*/false);
    } catch (const CaptureError& e) {  // a replay failed before the step's other work began
      graphs_failed(std::string("replaying the training ") + models::seam_name(seam()) + " for input " + s.name,
                    e.what());
    }
  }
  return micro_step(s, /*capturing=*/false);
}

LossOutput StepRunner::forward_backward_staged() {
  TORCH_CHECK(current_ && current_->targets.defined(), "forward_backward_staged: no batch staged");
  Slot& s = *current_;
  if (graphs_on_ && scope_ != GraphScope::Step) return seam_scope_step(s);
  if (graphs_on_ && !s.graph && s.seen >= capture_at_ && plans_in_place()) {
    try {
      LossOutput out;
      release_cached_blocks(cfg_.device);
      s.graph = CapturedGraph::capture(cfg_.device, [&] { out = micro_step(s, /*capturing=*/true); },
                                       loss_->capture_keep_alive());
      s.out = out;
      log_info(strfmt("CUDA graphs: training step captured for input %s (forward, loss, backward)", s.name.c_str()));
    } catch (const CaptureError& e) {
      graphs_failed("capturing the step for input " + s.name, e.what());
    }
  }
  if (graphs_on_ && s.graph) {
    try {
      PhaseScope ps(phases_, Phase::Forward);  // one replay: forward, loss and backward
      s.graph->replay();
      ++counts_.replayed_micro_steps;
      return s.out;
    } catch (const CaptureError& e) {
      graphs_failed("replaying the step for input " + s.name, e.what());
    }
  }
  ++counts_.eager_micro_steps;
  return micro_step(s, /*capturing=*/false);
}

std::string StepRunner::enable_cuda_graphs(int capture_at_occurrence, GraphScope scope) {
  std::string why;
  if (!cuda_graphs_supported(cfg_.device, &why)) {
  }
  if (why.empty() && scope != GraphScope::Step) {
    const models::Seam cut = scope == GraphScope::Network ? models::Seam::Network : models::Seam::Head;
    if (model_->head_parameters(cut).empty())
      why = model_->family_name() + " has no training " + models::seam_name(cut) + " seam";
  }
  if (!why.empty()) {
    graphs_on_ = false;
    graphs_off_reason_ = why;
    return why;
  }
  // The first occurrence of a shape must run eager (it creates the gradients, lets cuDNN pick
  // its algorithms and sizes the kernels' scratch): capture on the second at the earliest.
  capture_at_ = std::max(2, capture_at_occurrence);
  scope_ = scope;
  graphs_on_ = true;
  graphs_off_reason_.clear();
  return "";
}

void StepRunner::invalidate_cuda_graphs(const std::string& why) {
  const bool had = has_graphs();
  if (had) synchronize(cfg_.device);  // queued replays finish before the graphs go
  for (auto& s : slots_) {
    s->graph.reset();
    s->head.reset();
    s->head_inputs.clear();
    s->criterion.reset();
    s->plan.reset();
    s->plan_tensors.clear();
    s->raw_static.clear();
    s->raw_grads.clear();
    s->criterion_out = {};
    s->criterion_seen = 0;
    s->out = {};
    s->seen = 0;
  }
  update_graph_.reset();
  update_seen_ = 0;
  ++counts_.invalidations;
  if (graphs_on_ && had) log_info("CUDA graphs: " + why + ": captured steps dropped, captured again once the shape settles");
}

void StepRunner::graphs_failed(const std::string& what, const std::string& why) {
  // With other processes in the step (NCCL all-reduces inside the graphs), this process alone
  // going eager would desynchronise the collectives: end the run instead (the other ranks stop
  // when this one stops beating).
  if (grad_sync_->spans_processes())
    throw RuntimeError("CUDA graphs: " + what + " failed under multi-GPU training (" + why +
                           "); a rank cannot fall back to eager on its own",
                       "train again with cuda_graph=false");
  log_warn("CUDA graphs: " + what + " failed (" + why + "); the rest of the run trains eager");
  invalidate_cuda_graphs(what + " failed");
  graphs_on_ = false;
  graphs_off_reason_ = what + " failed: " + why;
}

StepGraphStats StepRunner::graph_stats() const {
  StepGraphStats st = counts_;
  st.enabled = graphs_on_;
  st.off_reason = graphs_off_reason_;
  st.update_captured = update_graph_ != nullptr;
  st.captured_shapes = 0;
  for (const auto& s : slots_) {
    if (s->graph || s->head) ++st.captured_shapes;
    else if (s->seen > 0) st.eager_shapes.push_back(s->name);
  }
  return st;
}

void StepRunner::apply_update() {
  std::vector<torch::Tensor> grads = optimizer_->grads();
  grad_sync_->after_backward(grads);
  std::optional<torch::Tensor> found_inf = scaler_->unscale(grads);
  if (cfg_.clip_max_norm > 0 && !grads.empty()) {
    torch::NoGradGuard ng;
    auto total = torch::stack(at::_foreach_norm(grads, 2)).norm();
    auto coef = (cfg_.clip_max_norm / (total + 1e-6)).clamp_max(1.0);
    at::_foreach_mul_(grads, coef);
  }
  optimizer_->step(found_inf);
  scaler_->update();
  optimizer_->zero_grad();
  if (ema_) ema_->apply(*model_);
}

void StepRunner::run_update() {
  // The update reads only tensors that live as long as the runner (gradients, parameters,
  // optimizer, scaler and EMA state, the learning rate and EMA weight staged into 0-dim tensors).
  if (graphs_on_ && !update_graph_ && ++update_seen_ >= capture_at_) {
    try {
      release_cached_blocks(cfg_.device);
      update_graph_ = CapturedGraph::capture(cfg_.device, [&] { apply_update(); });
      log_info("CUDA graphs: update captured (unscale and inf check, clipping, optimizer, scaler, EMA)");
    } catch (const CaptureError& e) {
      graphs_failed("capturing the optimizer update", e.what());
    }
  }
  if (graphs_on_ && update_graph_) {
    try {
      update_graph_->replay();
      ++counts_.replayed_updates;
      return;
    } catch (const CaptureError& e) {
      graphs_failed("replaying the optimizer update", e.what());
    }
  }
  ++counts_.eager_updates;
  apply_update();
}

void StepRunner::optimizer_step() {
  PhaseScope ps(phases_, Phase::Optimizer);
  if (ema_) ema_->stage();
  run_update();
  // The update may be a replayed graph (no version counter moves): inference folds are rebuilt.
  models::common::note_weights_changed();
  if (ema_) ema_->set_updates(ema_->updates() + 1);
  ++global_step_;
  apply_schedule(global_step_);
}

AccumulationWindow accumulation_window(int64_t index, int64_t batches, int accumulate) {
  const int64_t start = (index / accumulate) * accumulate;
  return {std::min<int64_t>(accumulate, batches - start), (index + 1) % accumulate == 0 || index == batches - 1};
}

bool trains_channels_last(const std::string& memory_format, const torch::Device& device) {
  return memory_format == "channels_last" || (memory_format == "auto" && device.is_cuda());
}

void enable_declared_cuda_graphs(StepRunner& runner, const models::Family& fam, const std::string& scope_option,
                                 bool collectives) {
  // The deepest capture the family declares within the option: step > network > head.
  GraphScope scope = GraphScope::Head;
  bool any = fam.capture_train_head;
  if (fam.capture_train_step && scope_option == "step") {
    scope = GraphScope::Step;
    any = true;
  } else if (fam.capture_train_network && scope_option != "head") {
    scope = GraphScope::Network;
    any = true;
  }
  const std::string why = any ? runner.enable_cuda_graphs(3, scope)
                              : fam.name + " declares no training capture within cuda_graph_scope=" + scope_option;
  const std::string rest = fam.capture_train_step ? "cuda_graph_scope=" + scope_option
                                                  : "the rest of " + fam.name + "'s step is not capturable";
  if (!why.empty())
    log_info("CUDA graphs off (" + why + "): training eager");
  else if (scope == GraphScope::Step)
    log_info(std::string("CUDA graphs: the whole step (forward, loss, backward; then the update") +
             (collectives ? ", with their all-reduces" : "") +
             ") is captured per input shape on its 3rd occurrence and replayed; other shapes run eager");
  else if (scope == GraphScope::Network)
    log_info("CUDA graphs: the training network (" + rest +
             ": its forward and backward per input shape on its 3rd occurrence) and the update" +
             (collectives ? " with its all-reduces" : "") + " are replayed; the loss and its matching run eager");
  else
    log_info("CUDA graphs: the training head (" + rest +
             ": its forward and backward per input shape on its 3rd occurrence) and the update" +
             (collectives ? " with its all-reduces" : "") + " are replayed; the rest of the step runs eager");
}

StepSetup make_step_runner(const TrainConfig& cfg, std::shared_ptr<models::Detector> model,
                           std::unique_ptr<TrainingLoss> loss, ModelEMA* ema, const torch::Device& device,
                           const AmpPlan& amp, bool channels_last, int64_t batches_per_epoch,
                           const models::Family* family) {
  const OptimizerOptions oo{cfg.optimizer,       cfg.lr0,          cfg.momentum,
                            cfg.warmup_momentum, cfg.weight_decay, cfg.nesterov,
                            family ? family->param_rules : std::vector<models::ParamRule>{}, cfg.lr_backbone,
                            cfg.backbone_lr_mult};
  auto optimizer = make_optimizer(*model, oo);
  StepSetup s;
  // Python's round() (half to even) of nbs / batch: nearbyint in the default rounding mode.
  if (cfg.nbs > 0 && cfg.batch > 0)
    s.accumulate = static_cast<int>(
        std::max(1LL, static_cast<long long>(std::nearbyint(static_cast<double>(cfg.nbs) / cfg.batch))));
  s.steps_per_epoch = std::max<int64_t>(1, (batches_per_epoch + s.accumulate - 1) / s.accumulate);
  s.schedule.shape = family ? lr_shape(cfg.scheduler, family->scheduler_names) : lr_shape(cfg.scheduler);
  s.schedule.lr0 = cfg.lr0;
  s.schedule.warmup_lr_start = cfg.warmup_lr_start;
  s.schedule.min_lr_ratio = cfg.min_lr_ratio;
  s.schedule.warmup_iters = static_cast<long long>(std::llround(cfg.warmup_epochs * s.steps_per_epoch));
  s.schedule.total_iters = static_cast<long long>(s.steps_per_epoch) * cfg.epochs;
  s.schedule.plateau_iters = static_cast<long long>(s.steps_per_epoch) * std::max(cfg.no_aug_epochs, 0);
  s.schedule.momentum = cfg.momentum;
  s.schedule.warmup_momentum = cfg.warmup_momentum;
  StepConfig sc;
  sc.device = device;
  sc.amp = amp;
  sc.channels_last = channels_last;
  sc.clip_max_norm = cfg.clip_max_norm;
  sc.input = family ? family->input : models::InputSpec{};
  s.runner = std::make_unique<StepRunner>(std::move(model), std::move(loss), std::move(optimizer),
                                          std::make_unique<GradScaler>(device, amp.scaler), ema, s.schedule, sc);
  return s;
}

}  // namespace libreyolo::engine
