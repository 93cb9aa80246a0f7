// A generic view of LibreYOLO checkpoints (torch.save dicts):
// the state dict and the metadata, with no model-family rules (key renames, size inference and the
// like belong to each family).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/pickle.hpp"

namespace libreyolo::io {

// The schema LibreYOLO checkpoints declare in `schema_version`.
inline constexpr const char* kCheckpointSchemaVersion = "1.0";

// Metadata as found in a checkpoint; each field is empty when the checkpoint lacks it.
struct CheckpointMeta {
  std::optional<std::string> family;  // `model_family`: a registry name
  std::optional<std::string> size;    // "t" / "s" / "m" / "c" ...
  std::optional<std::string> task;    // "detect" ...
  std::optional<int64_t> nc;
  std::optional<std::vector<std::string>> names;  // index = class id
  std::optional<int64_t> imgsz;
};

struct Checkpoint {
  PyValuePtr root;  // the whole file, for training extras (epoch, optimizer, ema ...)
  StateDict model;  // from `model`, else `state_dict`, else the file itself; `module.` stripped
  CheckpointMeta meta;
};

// Reads a checkpoint file. Throws ModelError when it cannot be read or holds no state dict.
Checkpoint read_checkpoint(const std::string& path);
// The same for a value already loaded; `name` names it in error messages.
Checkpoint checkpoint_from_value(PyValuePtr root, const std::string& name);
// Only the metadata of a loaded checkpoint (absent fields stay empty; wrong types throw).
CheckpointMeta read_checkpoint_meta(const PyValue& root, const std::string& name);

// Throws ModelError naming the first missing or invalid piece of LibreYOLO's required v1.0
// metadata: model (a state dict), schema_version "1.0", libreyolo_version, model_family, size,
// task, nc > 0, names {0..nc-1: str}, imgsz > 0.
void validate_checkpoint(const PyValue& root, const std::string& name);
// Validates, then writes atomically (see save_torch_file).
void write_checkpoint(const std::string& path, const PyValue& root);

// {0: names[0], 1: names[1], ...} as LibreYOLO stores class names.
PyValuePtr names_to_dict(const std::vector<std::string>& names);
// A lean checkpoint: model, schema_version, libreyolo_version, model_family, size, task, nc,
// names, imgsz, in that order. Every field of `meta` is required (ModelError otherwise);
// callers add training extras (epoch, optimizer ...) to the returned dict.
PyValuePtr make_checkpoint(const StateDict& model, const CheckpointMeta& meta);

}  // namespace libreyolo::io
