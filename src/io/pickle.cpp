// The torch.save reader's zip side: opens the archive with PyTorchStreamReader (after ZipIndex's
// checks), hands data.pkl to the pickle VM (unpickler.hpp) and feeds it the data/<key> records.
#include "io/pickle.hpp"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <c10/core/CPUAllocator.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

#include "core/log.hpp"
#include "io/io_detail.hpp"
#include "io/torch_zip.hpp"
#include "io/unpickler.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::io {

namespace {

using detail::printable;
using detail::throw_corrupt;

// The largest data.pkl accepted (real LibreYOLO checkpoints: about 100 kB).
constexpr size_t kMaxPickleBytes = size_t(256) << 20;
// A stored zip record is never larger than the archive; deflate compresses at most ~1032:1.
constexpr uint64_t kMaxInflateRatio = 1040;

// Size of a record, refused when larger than the archive could hold.
uint64_t record_size(caffe2::serialize::PyTorchStreamReader& reader, const detail::ZipIndex& index,
                     const std::string& record, uint64_t archive_size, const std::string& name) {
  index.check_readable(record);
  const uint64_t size = reader.getRecordSize(record);
  if (size > std::max<uint64_t>(archive_size, 1) * kMaxInflateRatio) {
    throw_corrupt(name, strfmt("record '%s' declares %llu bytes, more than the file can hold",
                               printable(record, 300).c_str(), (unsigned long long)size));
  }
  return size;
}

PyValuePtr read_archive(caffe2::serialize::PyTorchStreamReader& reader, const detail::ZipIndex& index,
                        uint64_t archive_size, const std::string& name) {
  if (reader.hasRecord("byteorder")) {
    const uint64_t n = record_size(reader, index, "byteorder", archive_size, name);
    if (n > 16) throw_corrupt(name, "bad byteorder record");
    auto [ptr, size] = reader.getRecord("byteorder");
    const std::string order(static_cast<const char*>(ptr.get()), size);
    if (order == "big") {
      throw ModelError(strfmt("checkpoint '%s' was saved on a big-endian machine, which is not supported",
                              name.c_str()));
    }
    if (order != "little") throw_corrupt(name, "unknown byteorder '" + printable(order, 16) + "'");
  }
  const uint64_t pkl_size = record_size(reader, index, "data.pkl", archive_size, name);
  if (pkl_size > kMaxPickleBytes) throw_corrupt(name, "data.pkl is unreasonably large");
  auto [pkl, pkl_n] = reader.getRecord("data.pkl");
  index.check_crc("data.pkl", pkl.get(), pkl_n);

  auto loader = [&](const std::string& key, uint64_t nbytes) {
    const std::string record = "data/" + key;
    const uint64_t size = record_size(reader, index, record, archive_size, name);
    if (size != nbytes) {
      throw_corrupt(name, strfmt("record '%s' holds %llu bytes, its tensor needs %llu",
                                 printable(record, 300).c_str(), (unsigned long long)size,
                                 (unsigned long long)nbytes));
    }
    c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(nbytes),
                         c10::GetCPUAllocator(), /*resizable=*/false);
    if (nbytes > 0) reader.getRecord(record, storage.mutable_data(), static_cast<size_t>(nbytes));
    index.check_crc(record, storage.data(), static_cast<size_t>(nbytes));
    return storage;
  };
  return detail::unpickle(static_cast<const uint8_t*>(pkl.get()), pkl_n, name, loader);
}

// Runs `f`, turning every failure other than our own errors into "corrupt".
template <class F>
PyValuePtr guarded(const std::string& name, F&& f) {
  try {
    return f();
  } catch (const libreyolo::Error&) {
    throw;
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    // miniz errors carry a long generic advice paragraph; keep the first sentence.
    if (auto cut = msg.find(". This is an internal miniz error"); cut != std::string::npos) msg.resize(cut);
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    throw_corrupt(name, msg);
  } catch (const std::bad_alloc&) {
    throw_corrupt(name, "out of memory while reading it");
  } catch (const std::exception& e) {
    throw_corrupt(name, e.what());
  }
}

PyValuePtr load_archive(const std::shared_ptr<caffe2::serialize::ReadAdapterInterface>& in, const std::string& name) {
  // The legacy (torch < 1.6) format is a bare pickle stream starting with a pickled magic number.
  unsigned char head[2] = {0, 0};
  if (in->size() >= 2 && in->read(0, head, 2) == 2 && head[0] == 0x80 && head[1] <= 5) {
    throw ModelError(strfmt("checkpoint '%s' uses the legacy (pre-zip) torch.save format, which is not supported",
                            name.c_str()),
                     "Re-save it with torch >= 1.6 (without _use_new_zipfile_serialization=False).");
  }
  return guarded(name, [&] {
    const detail::ZipIndex index = detail::ZipIndex::check(*in, name);
    caffe2::serialize::PyTorchStreamReader reader(in);
    return read_archive(reader, index, in->size(), name);
  });
}

}  // namespace

PyValuePtr load_torch_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) {
    throw ModelError(strfmt("checkpoint '%s' not found", path.c_str()), "Check the path.", "checkpoint_not_found");
  }
  return load_archive(detail::file_adapter(path), path);
}

PyValuePtr load_torch_bytes(const std::string& bytes, const std::string& name) {
  return load_archive(detail::memory_adapter(bytes), name);
}

StateDict to_state_dict(const PyValue& dict, const char* what) {
  if (dict.kind != PyValue::Kind::Dict) {
    throw ModelError(strfmt("%s must be a dict of tensors, got %s", what, dict.repr(60).c_str()));
  }
  StateDict sd;
  sd.reserve(dict.dict.size());
  for (const auto& [key, value] : dict.dict) {
    if (key->kind != PyValue::Kind::String) {
      throw ModelError(strfmt("%s has a non-string key %s", what, key->repr(60).c_str()));
    }
    if (value->kind != PyValue::Kind::Tensor || !value->tensor.defined()) {
      throw ModelError(strfmt("%s['%s'] is not a tensor (got %s)", what, key->s.c_str(),
                              value->repr(60).c_str()));
    }
    sd.emplace_back(key->s, value->tensor);
  }
  return sd;
}

PyValuePtr from_state_dict(const StateDict& sd) {
  PyValuePtr d = PyValue::new_dict(true);
  d->dict.reserve(sd.size());
  for (const auto& [name, tensor] : sd) {
    d->dict.emplace_back(PyValue::from_string(name), PyValue::from_tensor(tensor));
  }
  return d;
}

}  // namespace libreyolo::io
