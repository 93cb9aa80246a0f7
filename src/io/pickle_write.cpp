// The torch.save writer: a protocol-2 pickle using only the globals that Python's
// torch.load(weights_only=True) accepts, in a zip written by PyTorchStreamWriter with the same
// records torch.save writes (data.pkl, .format_version, .storage_alignment, byteorder,
// data/<key>, version, .data/serialization_id).
#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "core/log.hpp"
#include "io/io_detail.hpp"
#include "io/pickle.hpp"
#include "libreyolo/errors.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the writer stores tensors as little-endian");

namespace libreyolo::io {
namespace {

constexpr int kMaxDepth = 512;
constexpr size_t kBatch = 1000;  // items per APPENDS / SETITEMS, as Python's pickler does

[[noreturn]] void unsupported(const std::string& what) {
  throw ModelError("cannot save checkpoint: " + what, "", "model_save_failed");
}

// Legacy storage class of a dtype, or nullptr for dtypes torch saves as UntypedStorage + dtype.
const char* storage_class(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Double: return "DoubleStorage";
    case c10::ScalarType::Float: return "FloatStorage";
    case c10::ScalarType::Half: return "HalfStorage";
    case c10::ScalarType::BFloat16: return "BFloat16Storage";
    case c10::ScalarType::Long: return "LongStorage";
    case c10::ScalarType::Int: return "IntStorage";
    case c10::ScalarType::Short: return "ShortStorage";
    case c10::ScalarType::Char: return "CharStorage";
    case c10::ScalarType::Byte: return "ByteStorage";
    case c10::ScalarType::Bool: return "BoolStorage";
    case c10::ScalarType::ComplexFloat: return "ComplexFloatStorage";
    case c10::ScalarType::ComplexDouble: return "ComplexDoubleStorage";
    default: return nullptr;
  }
}

// Python name of the dtypes without a legacy storage class (torch.<name>).
const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::ComplexHalf: return "complex32";
    case c10::ScalarType::UInt16: return "uint16";
    case c10::ScalarType::UInt32: return "uint32";
    case c10::ScalarType::UInt64: return "uint64";
    case c10::ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case c10::ScalarType::Float8_e5m2: return "float8_e5m2";
    case c10::ScalarType::Float8_e4m3fnuz: return "float8_e4m3fnuz";
    case c10::ScalarType::Float8_e5m2fnuz: return "float8_e5m2fnuz";
    default: return nullptr;
  }
}

class Pickler {
 public:
  struct Record {
    std::string name;
    torch::Tensor bytes;  // flat uint8 CPU tensor over the whole storage
  };

  std::string dump(const PyValue& root) {
    out_.assign("\x80\x02", 2);
    write(root, 0);
    out_ += '.';
    return std::move(out_);
  }
  const std::vector<Record>& records() const { return records_; }

 private:
  void op(char c) { out_ += c; }
  void le(uint64_t v, int bytes) {
    for (int k = 0; k < bytes; ++k) out_ += static_cast<char>((v >> (8 * k)) & 0xFF);
  }

  void write_int(int64_t v) {
    if (v >= 0 && v <= 0xFF) {
      op('K');
      le(v, 1);
    } else if (v >= 0 && v <= 0xFFFF) {
      op('M');
      le(v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      le(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {
      // LONG1: shortest little-endian two's complement.
      int n = 8;
      while (n > 1) {
        const int64_t top = v >> (8 * (n - 1) - 1);  // the dropped byte plus the new sign bit
        if (top != 0 && top != -1) break;
        --n;
      }
      op('\x8a');
      le(n, 1);
      le(static_cast<uint64_t>(v), n);
    }
  }
  void write_float(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    op('G');
    for (int k = 7; k >= 0; --k) out_ += static_cast<char>((bits >> (8 * k)) & 0xFF);
  }
  void write_str(const std::string& s) {
    if (!detail::valid_utf8(s)) unsupported("string '" + detail::printable(s, 40) + "' is not valid UTF-8");
    op('X');
    le(s.size(), 4);
    out_ += s;
  }
  // Python 3 bytes at protocol 2: _codecs.encode(<latin-1 text>, 'latin1').
  void write_bytes(const std::string& b) {
    write_global("_codecs", "encode");
    std::string text;
    text.reserve(b.size() * 2);
    for (unsigned char c : b) {
      if (c < 0x80) {
        text += static_cast<char>(c);
      } else {
        text += static_cast<char>(0xC0 | (c >> 6));
        text += static_cast<char>(0x80 | (c & 0x3F));
      }
    }
    write_str(text);
    write_str("latin1");
    op('\x86');
    op('R');
  }
  // GLOBAL once, then BINGET from the memo.
  void write_global(const std::string& module, const std::string& name) {
    const std::string full = module + "\n" + name + "\n";
    auto it = memo_.find(full);
    if (it != memo_.end()) {
      if (it->second <= 0xFF) {
        op('h');
        le(it->second, 1);
      } else {
        op('j');
        le(it->second, 4);
      }
      return;
    }
    op('c');
    out_ += full;
    const uint32_t index = static_cast<uint32_t>(memo_.size());
    memo_.emplace(full, index);
    if (index <= 0xFF) {
      op('q');
      le(index, 1);
    } else {
      op('r');
      le(index, 4);
    }
  }
  void write_int_tuple(c10::IntArrayRef v) {
    if (v.empty()) {
      op(')');
      return;
    }
    if (v.size() > 3) op('(');
    for (int64_t x : v) write_int(x);
    op(v.size() == 1 ? '\x85' : v.size() == 2 ? '\x86' : v.size() == 3 ? '\x87' : 't');
  }
  void write_tuple(const std::vector<PyValuePtr>& items, int depth) {
    if (items.empty()) {
      op(')');
      return;
    }
    if (items.size() > 3) op('(');
    for (const auto& item : items) write(*item, depth + 1);
    op(items.size() == 1 ? '\x85' : items.size() == 2 ? '\x86' : items.size() == 3 ? '\x87' : 't');
  }
  void write_list(const std::vector<PyValuePtr>& items, int depth) {
    op(']');
    for (size_t start = 0; start < items.size(); start += kBatch) {
      const size_t end = std::min(items.size(), start + kBatch);
      op('(');
      for (size_t k = start; k < end; ++k) write(*items[k], depth + 1);
      op('e');
    }
  }
  void write_dict(const PyValue& d, int depth) {
    if (d.ordered) {
      write_global("collections", "OrderedDict");
      op(')');
      op('R');
    } else {
      op('}');
    }
    for (size_t start = 0; start < d.dict.size(); start += kBatch) {
      const size_t end = std::min(d.dict.size(), start + kBatch);
      op('(');
      for (size_t k = start; k < end; ++k) {
        std::string id;
        if (!detail::append_key_id(*d.dict[k].first, id)) {
          unsupported("unhashable dict key " + d.dict[k].first->repr(60));
        }
        write(*d.dict[k].first, depth + 1);
        write(*d.dict[k].second, depth + 1);
      }
      op('u');
    }
  }

  void write_tensor(torch::Tensor t) {
    if (!t.defined()) unsupported("undefined tensor");
    if (t.layout() != c10::kStrided) unsupported("only dense (strided) tensors can be saved");
    if (t.is_quantized()) unsupported("quantized tensors cannot be saved");
    if (t.is_meta()) unsupported("meta tensors have no data to save");
    if (t.is_conj()) t = t.resolve_conj();
    if (t.is_neg()) t = t.resolve_neg();
    const c10::ScalarType dtype = t.scalar_type();
    const char* legacy = storage_class(dtype);
    const char* v3_name = legacy ? nullptr : dtype_name(dtype);
    if (!legacy && !v3_name) unsupported(std::string("tensors of dtype ") + c10::toString(dtype));

    const c10::Storage& storage = t.storage();
    const size_t nbytes = storage.nbytes();
    const size_t item = c10::elementSize(dtype);
    auto [it, inserted] = storages_.try_emplace(storage.unsafeGetStorageImpl(),
                                                StorageInfo{records_.size(), dtype, storage});
    if (inserted) {
      auto flat = at::empty({0}, t.options().dtype(c10::kByte))
                      .set_(storage, 0, {static_cast<int64_t>(nbytes)}, {1});
      records_.push_back({std::to_string(records_.size()), flat.cpu()});
    } else if (it->second.dtype != dtype) {
      unsupported("two tensors view the same storage as different dtypes");
    }
    if (legacy && nbytes % item) unsupported("storage size is not a multiple of the element size");
    const std::string& key = records_[it->second.index].name;

    write_global("torch._utils", legacy ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
    op('(');
    op('(');
    write_str("storage");
    if (legacy) {
      write_global("torch", legacy);
    } else {
      write_global("torch.storage", "UntypedStorage");
    }
    write_str(key);
    write_str("cpu");
    write_int(static_cast<int64_t>(legacy ? nbytes / item : nbytes));
    op('t');
    op('Q');
    write_int(t.storage_offset());
    write_int_tuple(t.sizes());
    write_int_tuple(t.strides());
    op('\x89');  // requires_grad
    write_global("collections", "OrderedDict");  // backward hooks
    op(')');
    op('R');
    if (!legacy) write_global("torch", v3_name);
    op('t');
    op('R');
  }

  void write(const PyValue& v, int depth) {
    if (depth > kMaxDepth) unsupported("value nested deeper than 512 levels (or recursive)");
    switch (v.kind) {
      case PyValue::Kind::None: op('N'); break;
      case PyValue::Kind::Bool: op(v.b ? '\x88' : '\x89'); break;
      case PyValue::Kind::Int: write_int(v.i); break;
      case PyValue::Kind::Float: write_float(v.f); break;
      case PyValue::Kind::String: write_str(v.s); break;
      case PyValue::Kind::Bytes: write_bytes(v.s); break;
      case PyValue::Kind::Tuple: write_tuple(v.items, depth); break;
      case PyValue::Kind::List: write_list(v.items, depth); break;
      case PyValue::Kind::Dict: write_dict(v, depth); break;
      case PyValue::Kind::Tensor: write_tensor(v.tensor); break;
    }
  }

  struct StorageInfo {
    size_t index;
    c10::ScalarType dtype;
    c10::Storage keep;  // holds the storage so its address is not reused while pickling
  };
  std::string out_;
  std::unordered_map<std::string, uint32_t> memo_;
  std::unordered_map<const c10::StorageImpl*, StorageInfo> storages_;
  std::vector<Record> records_;
};

// Writes the archive through `sink`, which must not throw (PyTorchStreamWriter finalizes in its
// destructor) and returns the byte count it was given.
void write_archive(const PyValue& root, const std::function<size_t(const void*, size_t)>& sink) {
  Pickler pickler;
  const std::string pkl = pickler.dump(root);
  caffe2::serialize::PyTorchStreamWriter writer(sink);
  writer.writeRecord("data.pkl", pkl.data(), pkl.size());
  writer.writeRecord(".format_version", "1", 1);
  writer.writeRecord(".storage_alignment", "64", 2);
  writer.writeRecord("byteorder", "little", 6);
  for (const auto& rec : pickler.records()) {
    writer.writeRecord("data/" + rec.name, rec.bytes.data_ptr(), static_cast<size_t>(rec.bytes.numel()));
  }
  writer.writeEndOfFile();
}

template <class F>
void rethrow_as_model_error(F&& f) {
  try {
    f();
  } catch (const libreyolo::Error&) {
    throw;
  } catch (const c10::Error& e) {
    unsupported(e.what_without_backtrace());
  }
}

}  // namespace

std::string save_torch_bytes(const PyValue& root) {
  std::string out;
  rethrow_as_model_error([&] {
    write_archive(root, [&out](const void* buf, size_t n) -> size_t {
      if (buf) {
        out.append(static_cast<const char*>(buf), n);
      } else {
        out.append(n, '\0');
      }
      return n;
    });
  });
  return out;
}

void save_torch_file(const std::string& path, const PyValue& root) {
  auto io_error = [&](const std::string& what) {
    return RuntimeError(strfmt("cannot write checkpoint '%s': %s", path.c_str(), what.c_str()), "", "io_error");
  };
  // POSIX calls rather than std::filesystem: libtorch exports its own copy of std::filesystem,
  // which takes over our calls and is not reliable (remove_all crashes).
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const std::string file = slash == std::string::npos ? path : path.substr(slash + 1);
  if (file.empty()) throw io_error("not a file name");
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) throw io_error("directory '" + dir + "' does not exist");

  // A temporary name in the same directory, renamed over `path` once complete.
  static std::atomic<unsigned> counter{0};
  const std::string tmp =
      dir + "/" + strfmt(".%s.tmp.%d.%u", file.c_str(), static_cast<int>(getpid()), counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) throw io_error(std::strerror(errno));
  int write_errno = 0;
  auto sink = [&](const void* buf, size_t n) -> size_t {
    static const char zeros[4096] = {};
    size_t done = 0;
    while (write_errno == 0 && done < n) {
      const char* src = buf ? static_cast<const char*>(buf) + done : zeros;
      const size_t chunk = buf ? n - done : std::min(n - done, sizeof zeros);
      const ssize_t w = ::write(fd, src, chunk);
      if (w < 0) {
        if (errno == EINTR) continue;
        write_errno = errno;
      } else {
        done += static_cast<size_t>(w);
      }
    }
    return n;  // failures are reported after the writer is done
  };
  try {
    rethrow_as_model_error([&] { write_archive(root, sink); });
    if (write_errno == 0 && ::fsync(fd) != 0) write_errno = errno;
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0 && write_errno == 0) write_errno = errno;
  if (write_errno == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) write_errno = errno;
  if (write_errno != 0) {
    ::unlink(tmp.c_str());
    throw io_error(std::strerror(write_errno));
  }
  // Make the rename itself durable.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace libreyolo::io
