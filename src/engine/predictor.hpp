// predict(): decode, letterbox, batch, forward, decode boxes, class-aware NMS, draw and save.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include <libreyolo/config.hpp>
#include <libreyolo/libreyolo.hpp>

#include "models/loaded_model.hpp"

namespace libreyolo::engine {

// The image files a `source` names: a file, a directory (sorted, non-recursive), or
// SAMPLE_IMAGE. Throws DataError (source_not_found) when there is nothing.
std::vector<std::string> resolve_sources(const std::string& source);

std::vector<PredictResult> run_predict(models::LoadedModel& impl, const PredictConfig& cfg);

}  // namespace libreyolo::engine
