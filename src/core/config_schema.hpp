// Option schemas of the public config structs (names, types, help).
#pragma once
#include <libreyolo/config.hpp>
#include <string>
#include <utility>

#include "core/options.hpp"

namespace libreyolo {

const OptionSchema<TrainConfig>& train_schema();
const OptionSchema<PredictConfig>& predict_schema();
const OptionSchema<ValConfig>& val_schema();

// Checks ranges and enumerations; throws UsageError (config_range_error) with the key named.
void validate(const TrainConfig& c);
void validate(const PredictConfig& c);
void validate(const ValConfig& c);

// A scale range option ("lo,hi", "(lo, hi)" or "[lo, hi]"; a single x means 1-x, 1+x) as
// (lo, hi) with 0 < lo <= hi; UsageError (config_range_error) naming `key` otherwise.
std::pair<double, double> parse_scale_range(const std::string& key, const std::string& value);

// YAML text of a config (key: value per line, schema order), as written to train_config.yaml.
template <class C>
std::string to_yaml(const OptionSchema<C>& schema, const C& c);

}  // namespace libreyolo
