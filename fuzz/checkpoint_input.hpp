// How fuzz_checkpoint turns its input into a checkpoint and what it checks. Shared with the
// regression-corpus test (tests/test_io_pickle_corpus.cpp) so both read tests/data/pickle_corpus
// the same way.
//
// Input starting with "PK" is a torch.save archive as is. Any other input is a bare pickle, so
// mutations reach the pickle VM instead of failing the zip checksums: byte 0 gives n = byte % 17
// tensor records, then n little-endian 16-bit sizes, then the data.pkl bytes; the input is wrapped
// in an archive with records data/0 .. data/<n-1> of those sizes.
#pragma once
#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "io/checkpoint.hpp"
#include "io/pickle.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::fuzz {

inline std::string archive_from_input(const uint8_t* data, size_t size) {
  if (size >= 2 && data[0] == 'P' && data[1] == 'K') return std::string(reinterpret_cast<const char*>(data), size);
  size_t pos = 0;
  const size_t n = size > 0 ? data[pos++] % 17 : 0;
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&out](const void* buf, size_t len) -> size_t {
    if (buf) {
      out.append(static_cast<const char*>(buf), len);
    } else {
      out.append(len, '\0');
    }
    return len;
  });
  std::vector<size_t> sizes;
  for (size_t k = 0; k < n && pos + 2 <= size; ++k, pos += 2) sizes.push_back(data[pos] | (data[pos + 1] << 8));
  writer.writeRecord("data.pkl", data + pos, size - pos);
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::string bytes(sizes[k], '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 31 + k * 7 + 1);
    writer.writeRecord("data/" + std::to_string(k), bytes.data(), bytes.size());
  }
  writer.writeEndOfFile();
  return out;
}

// Loads `archive`; true when it loaded. Refused input throws ModelError. A loaded value must
// also survive the checkpoint view, printing, and a save + reload: anything else escaping
// (including a re-saved file that does not load) is a bug.
inline bool exercise_checkpoint(const std::string& archive) {
  io::PyValuePtr v;
  try {
    v = io::load_torch_bytes(archive, "fuzz");
  } catch (const ModelError&) {
    return false;
  }
  (void)v->repr(4000);
  try {
    (void)io::checkpoint_from_value(v, "fuzz");
  } catch (const ModelError&) {
  }
  std::string resaved;
  try {
    resaved = io::save_torch_bytes(*v);
  } catch (const ModelError&) {
    return true;  // e.g. two dtypes viewing one storage: loadable, but not writable
  }
  try {
    (void)io::load_torch_bytes(resaved, "fuzz-resaved");
  } catch (const ModelError& e) {
    throw std::logic_error(std::string("a re-saved checkpoint does not load: ") + e.what());
  }
  return true;
}

}  // namespace libreyolo::fuzz
