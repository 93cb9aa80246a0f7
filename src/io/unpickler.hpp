// The pickle VM of the torch.save reader (internal to src/io; pickle.hpp is the API).
#pragma once
#include <c10/core/Storage.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "io/py_value.hpp"

namespace libreyolo::io::detail {

// Reads the raw bytes of the archive's data/<key> record (nbytes of them) into a new CPU storage.
using StorageLoader = std::function<c10::Storage(const std::string& key, uint64_t nbytes)>;

// Runs the pickle program `data` (a data.pkl record) and returns the value it stores. Only the
// opcodes torch.save emits and allow-listed globals are accepted; tensors get their bytes from
// `loader`. Throws ModelError naming `name` on anything else, and on input that would make it
// allocate without bound.
PyValuePtr unpickle(const uint8_t* data, size_t size, const std::string& name, StorageLoader loader);

}  // namespace libreyolo::io::detail
