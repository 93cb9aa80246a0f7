#include "engine/train.hpp"

#include "core/interrupt.hpp"
#include "engine/train_hooks.hpp"
#include "engine/trainer.hpp"

namespace libreyolo::engine {

TrainResult run_training(models::LoadedModel& lm, const TrainConfig& cfg, const TrainCallbacks& callbacks,
                         const std::vector<std::shared_ptr<TrainHook>>& hooks, const Kwargs& given) {
  InterruptGuard interrupts;
  // The trainer turns cuDNN autotuning on for its fixed-shape steps; the caller's setting (e.g.
  // for later predictions) comes back afterwards, also when training throws.
  struct CudnnBenchmarkRestore {
    bool was = at::globalContext().benchmarkCuDNN();
    ~CudnnBenchmarkRestore() { at::globalContext().setBenchmarkCuDNN(was); }
  } cudnn_restore;
  // Training changes the weights (and the mode): captured inference forwards must go.
  if (lm.graphs) lm.graphs->release("training changes the model");
  Trainer t(lm, cfg, given);
  t.setup();
  for (auto& h : build_hooks(t, callbacks, hooks)) t.add_hook(std::move(h));
  return t.run();
}

}  // namespace libreyolo::engine
