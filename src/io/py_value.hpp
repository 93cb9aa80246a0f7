// The Python value model of torch.save files: what the pickle reader builds and the writer
// writes. Plain data (no Python objects are ever created): None, bool, int, float, str, bytes,
// tuple, list, dict (insertion order kept) and tensors.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace libreyolo::io {

struct PyValue;
using PyValuePtr = std::shared_ptr<PyValue>;

// A Python object as found in a torch.save pickle.
struct PyValue {
  enum class Kind { None, Bool, Int, Float, String, Bytes, Tuple, List, Dict, Tensor };
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;                                        // String / Bytes
  std::vector<PyValuePtr> items;                        // Tuple / List
  std::vector<std::pair<PyValuePtr, PyValuePtr>> dict;  // Dict, insertion order kept
  bool ordered = false;  // Dict came from (or is written as) collections.OrderedDict
  torch::Tensor tensor;  // Tensor (always on the CPU after reading)

  // Constructors.
  static PyValuePtr none();
  static PyValuePtr from_bool(bool v);
  static PyValuePtr from_int(int64_t v);
  static PyValuePtr from_float(double v);
  static PyValuePtr from_string(std::string v);
  static PyValuePtr from_tensor(torch::Tensor t);
  static PyValuePtr new_list(std::vector<PyValuePtr> v = {});
  static PyValuePtr new_tuple(std::vector<PyValuePtr> v = {});
  static PyValuePtr new_dict(bool ordered = false);

  bool is_none() const { return kind == Kind::None; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_tensor() const { return kind == Kind::Tensor; }
  bool is_string() const { return kind == Kind::String; }
  bool is_int() const { return kind == Kind::Int || kind == Kind::Bool; }
  bool is_number() const { return is_int() || kind == Kind::Float; }

  // Dict helpers (string keys). get() returns nullptr when absent or not a dict.
  PyValuePtr get(const std::string& key) const;
  bool has(const std::string& key) const { return get(key) != nullptr; }
  void set(const std::string& key, PyValuePtr v);  // replaces an existing key
  void set(PyValuePtr key, PyValuePtr v);

  // Conversions; throw ModelError with `what` in the message on a type mismatch.
  int64_t as_int(const char* what = "value") const;
  double as_float(const char* what = "value") const;  // accepts ints
  const std::string& as_string(const char* what = "value") const;
  bool as_bool(const char* what = "value") const;
  // Human-readable one-line description (for errors and `libreyolo metadata`).
  std::string repr(int max_len = 200) const;
};

namespace detail {

// Python's name of a kind ("None", "int", "dict", ...), for error messages.
const char* kind_name(PyValue::Kind k);
// Appends a canonical identity of a hashable value (None, bool, int, float, str, bytes, tuple
// of those) to `out`, with Python's equalities (True == 1 == 1.0). False when unhashable or when
// the identity would exceed max_len bytes.
bool append_key_id(const PyValue& v, std::string& out, size_t max_len = SIZE_MAX, int depth = 0);

}  // namespace detail
}  // namespace libreyolo::io
