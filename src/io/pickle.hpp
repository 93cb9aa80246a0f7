// Reading and writing torch.save files (zip container + pickle protocol 2) without Python.
//
// The reader is a security boundary: checkpoints and fixtures are untrusted input. It runs a
// small pickle VM that understands only the opcodes torch.save emits and builds only
// allow-listed globals (collections.OrderedDict, torch._utils._rebuild_tensor_v2,
// torch._utils._rebuild_parameter, torch.<Dtype>Storage, torch.device, ...). Anything else is
// refused with an error naming the global. Malformed or truncated input throws
// libreyolo::ModelError; it never crashes, hangs or allocates without bound.
#pragma once
#include <string>

#include "io/py_value.hpp"
#include "io/state_dict.hpp"

namespace libreyolo::io {

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
