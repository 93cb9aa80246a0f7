#include "engine/train_loop.hpp"

#include <csignal>

#include "core/interrupt.hpp"
#include "core/log.hpp"

namespace libreyolo {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Dataload: return "dataload";
    case Phase::ToDevice: return "to_device";
    case Phase::Forward: return "forward";
    case Phase::Loss: return "loss";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
  }
  return "?";
}

namespace engine {

void TrainLoop::add_hook(std::shared_ptr<TrainHook> hook) {
  if (!hook) return;
  (in_call_ ? pending_ : hooks_).push_back(std::move(hook));
  refresh();
}

void TrainLoop::refresh() {
  observing_ = false;
  for (const auto* list : {&hooks_, &pending_})
    for (const auto& h : *list) observing_ = observing_ || (h->observes_phases() && runs_here(*h));
}

template <class F>
void TrainLoop::call(F&& fn) {
  in_call_ = true;
  try {
    for (auto& h : hooks_)
      if (runs_here(*h)) fn(*h);
  } catch (...) {
    in_call_ = false;
    throw;
  }
  in_call_ = false;
  const size_t before = hooks_.size();
  hooks_.erase(std::remove_if(hooks_.begin(), hooks_.end(), [](const auto& h) { return h->finished(); }), hooks_.end());
  if (hooks_.size() != before || !pending_.empty()) {
    for (auto& h : pending_) hooks_.push_back(std::move(h));
    pending_.clear();
    refresh();
  }
}

void TrainLoop::phase_begin(Phase p) {
  for (auto& h : hooks_)
    if (h->observes_phases() && runs_here(*h)) h->phase_begin(s_, p);
}

void TrainLoop::phase_end(Phase p) {
  for (auto& h : hooks_)
    if (h->observes_phases() && runs_here(*h)) h->phase_end(s_, p);
}

void TrainLoop::run(EpochSteps& steps, TrainResult& result, std::chrono::steady_clock::time_point started) {
  try {
    call([&](TrainHook& h) { h.before_train(s_); });
    for (int epoch = s_.start_epoch; epoch < s_.epochs && !s_.stop; ++epoch) {
      s_.epoch = epoch;
      call([&](TrainHook& h) { h.before_epoch(s_); });
      steps.begin_epoch(s_);
      while (steps.has_next(s_)) {
        bool more;
        {
          PhaseScope ps(observing_ ? this : nullptr, Phase::Dataload);
          more = steps.next_batch(s_);
        }
        if (!more) break;
        call([&](TrainHook& h) { h.before_step(s_); });
        steps.run_step(s_);
        call([&](TrainHook& h) { h.after_step(s_); });
        if (interrupt_requested()) {
          s_.interrupted = true;
          throw InterruptedError(strfmt("Training interrupted (%s) during epoch %d of %d",
                                        interrupt_signal() == SIGTERM ? "SIGTERM" : "Ctrl-C", epoch + 1, s_.epochs));
        }
        if (s_.stop && s_.world_size == 1) break;
      }
      // A stop in the middle of an epoch abandons it: no summary, validation or checkpoint.
      if (s_.stop && steps.has_next(s_)) break;
      EpochSummary e = steps.end_epoch(s_);
      call([&](TrainHook& h) { h.after_epoch(s_, e); });
      steps.sync_after_epoch(s_);
      result.epochs.push_back(e);
      result.final_loss = e.loss;
    }
    if (s_.stop && !s_.stop_reason.empty()) log_info(s_.stop_reason);
    steps.sync_before_end(s_);
    result.total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    call([&](TrainHook& h) { h.after_train(s_, result); });
  } catch (const std::exception& ex) {
    s_.interrupted = s_.interrupted || interrupt_requested();
    for (auto& h : hooks_) {
      if (!runs_here(*h)) continue;
      try {
        h->on_exception(s_, ex);
      } catch (const std::exception& inner) {
        log_warn("A training hook failed while handling an error: " + std::string(inner.what()));
      }
    }
    clear_interrupt();
    throw;
  }
}

}  // namespace engine
}  // namespace libreyolo
