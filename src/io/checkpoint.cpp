#include "io/checkpoint.hpp"

#include <set>

#include "core/log.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::io {
namespace {

[[noreturn]] void bad_meta(const std::string& name, const std::string& what) {
  throw ModelError(strfmt("checkpoint '%s': %s", name.c_str(), what.c_str()));
}

bool is_tensor_dict(const PyValue& v) {
  if (!v.is_dict()) return false;
  for (const auto& [key, value] : v.dict) {
    if (!key->is_string() || !value->is_tensor()) return false;
  }
  return true;
}

// A present, non-None entry.
PyValuePtr field(const PyValue& root, const char* key) {
  PyValuePtr v = root.get(key);
  return (v && !v->is_none()) ? v : nullptr;
}

std::optional<std::string> string_field(const PyValue& root, const char* key, const std::string& name) {
  PyValuePtr v = field(root, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad_meta(name, strfmt("'%s' must be a string, got %s", key, v->repr(60).c_str()));
  return v->s;
}

std::optional<int64_t> int_field(const PyValue& root, const char* key, const std::string& name) {
  PyValuePtr v = field(root, key);
  if (!v) return std::nullopt;
  if (v->kind != PyValue::Kind::Int) bad_meta(name, strfmt("'%s' must be an int, got %s", key, v->repr(60).c_str()));
  return v->i;
}

// Class id of a names-dict key: an int, or a string of digits (names that went through JSON).
std::optional<int64_t> class_id(const PyValue& key) {
  if (key.kind == PyValue::Kind::Int) return key.i;
  if (key.kind == PyValue::Kind::String && !key.s.empty() && key.s.size() < 10 &&
      key.s.find_first_not_of("0123456789") == std::string::npos) {
    return std::stoll(key.s);
  }
  return std::nullopt;
}

std::optional<std::vector<std::string>> names_field(const PyValue& root, const std::string& name) {
  PyValuePtr v = field(root, "names");
  if (!v) return std::nullopt;
  std::vector<std::string> names;
  if (v->kind == PyValue::Kind::List || v->kind == PyValue::Kind::Tuple) {
    for (const auto& item : v->items) {
      if (!item->is_string()) bad_meta(name, "'names' holds a non-string " + item->repr(60));
      names.push_back(item->s);
    }
    return names;
  }
  if (!v->is_dict()) bad_meta(name, "'names' must be a dict or a list, got " + v->repr(60));
  names.resize(v->dict.size());
  std::vector<bool> seen(v->dict.size(), false);
  for (const auto& [key, value] : v->dict) {
    const auto id = class_id(*key);
    if (!id || *id < 0 || *id >= static_cast<int64_t>(names.size()) || seen[*id]) {
      bad_meta(name, strfmt("'names' key %s is not a class id 0..%zu (each once)", key->repr(40).c_str(),
                            names.size() - 1));
    }
    if (!value->is_string()) bad_meta(name, "'names' holds a non-string " + value->repr(60));
    seen[*id] = true;
    names[*id] = value->s;
  }
  return names;
}

std::optional<int64_t> imgsz_field(const PyValue& root, const std::string& name) {
  PyValuePtr v = field(root, "imgsz");
  if (!v) return std::nullopt;
  if (v->kind == PyValue::Kind::Int) return v->i;
  if ((v->kind == PyValue::Kind::List || v->kind == PyValue::Kind::Tuple) && !v->items.empty()) {
    for (const auto& item : v->items) {
      if (item->kind != PyValue::Kind::Int) bad_meta(name, "'imgsz' must be an int, got " + v->repr(60));
    }
    if (v->items.size() <= 2 && v->items.front()->i == v->items.back()->i) return v->items.front()->i;
    log_warn(strfmt("checkpoint '%s': imgsz %s is not square; ignored", name.c_str(), v->repr(60).c_str()));
    return std::nullopt;
  }
  bad_meta(name, "'imgsz' must be an int, got " + v->repr(60));
}

StateDict find_state_dict(const PyValue& root, const std::string& name) {
  const PyValue* source = nullptr;
  for (const char* key : {"model", "state_dict"}) {
    PyValuePtr v = field(root, key);
    if (v && v->is_dict()) {
      if (!is_tensor_dict(*v)) {
        // Report the first entry that is not name -> tensor.
        to_state_dict(*v, strfmt("checkpoint '%s': '%s'", name.c_str(), key).c_str());
      }
      source = v.get();
      break;
    }
  }
  if (!source) {
    if (root.dict.empty() || !is_tensor_dict(root)) {
      throw ModelError(strfmt("checkpoint '%s' holds no state dict (no 'model' or 'state_dict' entry, and it is "
                              "not a dict of tensors)",
                              name.c_str()));
    }
    source = &root;
  }
  StateDict sd = to_state_dict(*source);
  // Weights saved from a DataParallel / DDP wrapper carry a `module.` prefix.
  std::set<std::string> seen;
  for (auto& [key, tensor] : sd) {
    if (key.rfind("module.", 0) == 0) key.erase(0, 7);
    if (!seen.insert(key).second) bad_meta(name, "duplicate state dict entry '" + key + "'");
  }
  return sd;
}

}  // namespace

CheckpointMeta read_checkpoint_meta(const PyValue& root, const std::string& name) {
  CheckpointMeta meta;
  if (!root.is_dict()) return meta;
  meta.family = string_field(root, "model_family", name);
  meta.size = string_field(root, "size", name);
  meta.task = string_field(root, "task", name);
  meta.nc = int_field(root, "nc", name);
  meta.names = names_field(root, name);
  meta.imgsz = imgsz_field(root, name);
  return meta;
}

Checkpoint checkpoint_from_value(PyValuePtr root, const std::string& name) {
  if (!root || !root->is_dict()) {
    throw ModelError(strfmt("checkpoint '%s' does not hold a dict (got %s)", name.c_str(),
                            root ? root->repr(60).c_str() : "nothing"));
  }
  Checkpoint ck;
  ck.model = find_state_dict(*root, name);
  ck.meta = read_checkpoint_meta(*root, name);
  ck.root = std::move(root);
  return ck;
}

Checkpoint read_checkpoint(const std::string& path) { return checkpoint_from_value(load_torch_file(path), path); }

void validate_checkpoint(const PyValue& root, const std::string& name) {
  auto fail = [&](const std::string& what) {
    throw ModelError(strfmt("cannot write checkpoint '%s': %s", name.c_str(), what.c_str()), "",
                     "model_save_failed");
  };
  if (!root.is_dict()) fail("the checkpoint must be a dict");
  PyValuePtr model = root.get("model");
  if (!model || !is_tensor_dict(*model) || model->dict.empty()) {
    fail("'model' must be a non-empty dict of name -> tensor");
  }
  auto text = [&](const char* key) -> const std::string& {
    PyValuePtr v = root.get(key);
    if (!v || !v->is_string() || v->s.empty()) fail(strfmt("'%s' must be a non-empty string", key));
    return v->s;
  };
  auto positive = [&](const char* key) {
    PyValuePtr v = root.get(key);
    if (!v || v->kind != PyValue::Kind::Int || v->i <= 0) fail(strfmt("'%s' must be an int > 0", key));
    return v->i;
  };
  if (text("schema_version") != kCheckpointSchemaVersion) {
    fail(strfmt("'schema_version' must be \"%s\"", kCheckpointSchemaVersion));
  }
  text("libreyolo_version");
  text("model_family");
  text("size");
  text("task");
  const int64_t nc = positive("nc");
  positive("imgsz");
  PyValuePtr names = root.get("names");
  if (!names || !names->is_dict()) fail("'names' must be a dict {class id: name}");
  if (static_cast<int64_t>(names->dict.size()) != nc) {
    fail(strfmt("'names' has %zu entries for nc=%lld", names->dict.size(), static_cast<long long>(nc)));
  }
  std::vector<bool> seen(static_cast<size_t>(nc), false);
  for (const auto& [key, value] : names->dict) {
    if (key->kind != PyValue::Kind::Int || key->i < 0 || key->i >= nc || seen[key->i]) {
      fail(strfmt("'names' key %s is not a class id 0..%lld (each once)", key->repr(40).c_str(),
                  static_cast<long long>(nc - 1)));
    }
    if (!value->is_string()) fail("'names' values must be strings");
    seen[key->i] = true;
  }
}

void write_checkpoint(const std::string& path, const PyValue& root) {
  validate_checkpoint(root, path);
  save_torch_file(path, root);
}

PyValuePtr names_to_dict(const std::vector<std::string>& names) {
  PyValuePtr d = PyValue::new_dict();
  d->dict.reserve(names.size());
  for (size_t k = 0; k < names.size(); ++k) {
    d->dict.emplace_back(PyValue::from_int(static_cast<int64_t>(k)), PyValue::from_string(names[k]));
  }
  return d;
}

PyValuePtr make_checkpoint(const StateDict& model, const CheckpointMeta& meta) {
  auto need = [](bool present, const char* what) {
    if (!present) throw ModelError(strfmt("cannot build a checkpoint without '%s'", what), "", "model_save_failed");
  };
  need(meta.family.has_value(), "model_family");
  need(meta.size.has_value(), "size");
  need(meta.task.has_value(), "task");
  need(meta.nc.has_value(), "nc");
  need(meta.names.has_value(), "names");
  need(meta.imgsz.has_value(), "imgsz");
  if (static_cast<int64_t>(meta.names->size()) != *meta.nc) {
    throw ModelError(strfmt("cannot build a checkpoint: %zu names for nc=%lld", meta.names->size(),
                            static_cast<long long>(*meta.nc)),
                     "", "model_save_failed");
  }
  PyValuePtr root = PyValue::new_dict();
  auto add = [&](const char* key, PyValuePtr v) { root->dict.emplace_back(PyValue::from_string(key), std::move(v)); };
  add("model", from_state_dict(model));
  add("schema_version", PyValue::from_string(kCheckpointSchemaVersion));
  add("libreyolo_version", PyValue::from_string(LIBREYOLO_VERSION));
  add("model_family", PyValue::from_string(*meta.family));
  add("size", PyValue::from_string(*meta.size));
  add("task", PyValue::from_string(*meta.task));
  add("nc", PyValue::from_int(*meta.nc));
  add("names", names_to_dict(*meta.names));
  add("imgsz", PyValue::from_int(*meta.imgsz));
  return root;
}

}  // namespace libreyolo::io
