// Reading and writing torch.save files (zip container + pickle protocol 2) without Python.
//
// The reader is a security boundary: checkpoints and fixtures are untrusted input. It runs a
// small pickle VM that understands only the opcodes torch.save emits and builds only
// allow-listed globals (collections.OrderedDict, torch._utils._rebuild_tensor_v2,
// torch._utils._rebuild_parameter, torch.<Dtype>Storage, torch.device, ...). Anything else is
// refused with an error naming the global. Malformed or truncated input throws
// libreyolo::ModelError; it never crashes, hangs or allocates without bound.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <map>
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

// A state_dict: parameter/buffer name -> tensor, in the file's order.
using StateDict = std::vector<std::pair<std::string, torch::Tensor>>;

// Reads a torch.save zip file. Throws ModelError (message names the file) on any problem.
// Python values without a kind of their own come out as the nearest one: set -> List,
// bytearray -> Bytes, torch.Size -> Tuple, torch.device -> String ("cuda:0"), nn.Parameter ->
// Tensor. Tensors are plain CPU data (requires_grad and hooks are not restored); tensors that
// shared a storage in the file share memory. Shared Python objects stay shared (one PyValue).
PyValuePtr load_torch_file(const std::string& path);
// The same from bytes in memory (the fuzz target calls this).
PyValuePtr load_torch_bytes(const std::string& bytes, const std::string& name = "<memory>");

// Writes a torch.save-compatible zip that Python's torch.load(weights_only=True) accepts.
// Dicts with ordered=true are written as collections.OrderedDict. Tensors may live on any
// device; they are copied to the CPU. The file is written to a temporary name and renamed,
// so a crash never leaves a half-written file at `path`.
void save_torch_file(const std::string& path, const PyValue& root);
std::string save_torch_bytes(const PyValue& root);

// Converts a Dict of name -> Tensor into a StateDict (non-tensor entries are an error).
StateDict to_state_dict(const PyValue& dict, const char* what = "state_dict");
// Builds an OrderedDict PyValue from a StateDict.
PyValuePtr from_state_dict(const StateDict& sd);

}  // namespace libreyolo::io
