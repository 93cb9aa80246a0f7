// Training as the API runs it: a Trainer set up, the built-in hooks and the caller's, the loop.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <libreyolo/hooks.hpp>
#include <libreyolo/libreyolo.hpp>

#include "core/options.hpp"
#include "models/loaded_model.hpp"

namespace libreyolo::engine {

// Runs training on `lm`'s model. `given` are the options exactly as the caller wrote them
// (used on resume: the checkpoint's config is restored, then these override it). Ctrl-C or
// SIGTERM ends the run after the current step (InterruptedError).
TrainResult run_training(models::LoadedModel& lm, const TrainConfig& cfg, const TrainCallbacks& callbacks,
                         const std::vector<std::shared_ptr<TrainHook>>& hooks = {}, const Kwargs& given = {});

// Every check run_training makes before its first step (device, or the spawn checks for several
// GPUs; data, model and freeze, optimizer, resume state, that the run directory can be made),
// without training or writing anything. Returns the configuration the run would use (after a
// resume's restore). Throws what run_training would throw.
TrainConfig check_training(models::LoadedModel& lm, const TrainConfig& cfg, const Kwargs& given = {});

// What device=<several GPUs> requires before workers are spawned: not being
// a spawned worker already, CUDA, a family that can spawn, GPUs that exist. UsageError otherwise.
void check_spawn_allowed(const models::Family& family, const std::string& device, bool in_worker, bool cuda,
                         int visible_gpus);

}  // namespace libreyolo::engine
