// `libreyolo profile infer`: the inference profiler over real images through the one
// inference runner (letterbox, forward, the family's postprocess), eager or graphed.
#pragma once
#include <libreyolo/libreyolo.hpp>

#include "models/loaded_model.hpp"

namespace libreyolo::engine {

InferenceProfile run_profile_infer(models::LoadedModel& impl, const InferProfileConfig& cfg);

}  // namespace libreyolo::engine
