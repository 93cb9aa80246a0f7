// Inputs for PyTorchStreamReader, and ZipIndex (see torch_zip.hpp for why it exists; both of
// its checks came from fuzzing).
#include "io/torch_zip.hpp"

#include <caffe2/serialize/versions.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "core/log.hpp"
#include "core/strings.hpp"
#include "io/io_detail.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::io::detail {
namespace {

class MemoryAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit MemoryAdapter(const std::string& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = static_cast<size_t>(std::min<uint64_t>(n, bytes_.size() - pos));
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::string& bytes_;
};

class FileAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  FileAdapter(int fd, uint64_t size) : fd_(fd), size_(size) {}
  ~FileAdapter() override { ::close(fd_); }
  size_t size() const override { return static_cast<size_t>(size_); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, static_cast<char*>(buf) + done, n - done, static_cast<off_t>(pos + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

 private:
  int fd_;
  uint64_t size_;
};

uint64_t le(const std::string& b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int k = bytes - 1; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(b[at + k]);
  return v;
}

// The archive's bytes as ZipIndex reads them: bounded reads, and every failure is "not a
// torch.save zip archive".
class ArchiveBytes {
 public:
  ArchiveBytes(const caffe2::serialize::ReadAdapterInterface& in, const std::string& name)
      : in_(in), size_(in.size()), name_(name) {}
  uint64_t size() const { return size_; }
  [[noreturn]] void bad(const std::string& what) const {
    throw_corrupt(name_, "not a torch.save zip archive: " + what);
  }
  std::string read(uint64_t pos, uint64_t n) const {
    if (pos > size_ || n > size_ - pos) bad("a zip structure points past the end of the file");
    std::string b(static_cast<size_t>(n), '\0');
    if (n > 0 && in_.read(pos, b.data(), b.size()) != b.size()) bad("read error");
    return b;
  }

 private:
  const caffe2::serialize::ReadAdapterInterface& in_;
  uint64_t size_;
  const std::string& name_;
};

// Where the central directory lies and how many entries it holds.
struct CentralDirectory {
  uint64_t entries, size, offset;
};

// From the end of central directory record (the last signature with room for its 22 bytes, as
// miniz finds it) or, when a zip64 locator sits right before it, from the zip64 record.
CentralDirectory locate_central_directory(const ArchiveBytes& in) {
  constexpr uint64_t kEocd = 22;
  const uint64_t size = in.size();
  if (size < kEocd) in.bad("too small");
  const uint64_t tail_at = size - std::min<uint64_t>(size, 0xFFFF + kEocd);
  const std::string tail = in.read(tail_at, size - tail_at);
  size_t eocd = std::string::npos;
  for (size_t k = tail.size() - kEocd + 1; k-- > 0;) {
    if (le(tail, k, 4) == 0x06054b50) {
      eocd = k;
      break;
    }
  }
  if (eocd == std::string::npos) in.bad("no end of central directory");
  CentralDirectory dir{le(tail, eocd + 10, 2), le(tail, eocd + 12, 4), le(tail, eocd + 16, 4)};
  const uint64_t eocd_at = tail_at + eocd;
  if (eocd_at >= 20) {
    const std::string loc = in.read(eocd_at - 20, 20);
    if (le(loc, 0, 4) == 0x07064b50) {
      const std::string z64 = in.read(le(loc, 8, 8), 56);
      if (le(z64, 0, 4) != 0x06064b50) in.bad("bad zip64 end of central directory");
      dir = {le(z64, 32, 8), le(z64, 40, 8), le(z64, 48, 8)};
    }
  }
  if (dir.entries == 0) in.bad("no entries");
  if (dir.size > (uint64_t(256) << 20)) in.bad("central directory larger than 256 MiB");
  return dir;
}

// The central directory entry at `p` of `cdir`; moves `p` past it.
ZipIndex::Entry parse_entry(const ArchiveBytes& in, const std::string& cdir, size_t& p) {
  if (p + 46 > cdir.size() || le(cdir, p, 4) != 0x02014b50) in.bad("bad central directory entry");
  ZipIndex::Entry e;
  e.flags = static_cast<uint32_t>(le(cdir, p + 8, 2));
  e.method = static_cast<uint32_t>(le(cdir, p + 10, 2));
  e.crc32 = static_cast<uint32_t>(le(cdir, p + 16, 4));
  e.comp_size = le(cdir, p + 20, 4);
  e.size = le(cdir, p + 24, 4);
  const size_t name_len = le(cdir, p + 28, 2), extra_len = le(cdir, p + 30, 2), comment_len = le(cdir, p + 32, 2);
  e.external_attr = le(cdir, p + 38, 4);
  e.local_offset = le(cdir, p + 42, 4);
  if (p + 46 + name_len + extra_len + comment_len > cdir.size()) in.bad("bad central directory entry");
  e.name = cdir.substr(p + 46, name_len);
  // Zip64 extra field: the saturated 32-bit values, in this order.
  const size_t extra_end = p + 46 + name_len + extra_len;
  for (size_t x = p + 46 + name_len; x + 4 <= extra_end;) {
    const uint64_t id = le(cdir, x, 2), len = le(cdir, x + 2, 2);
    if (x + 4 + len > extra_end) break;
    if (id == 1) {
      size_t f = x + 4;
      for (uint64_t* field : {&e.size, &e.comp_size, &e.local_offset}) {
        if (*field != 0xFFFFFFFF) continue;
        if (f + 8 > x + 4 + len) in.bad("bad zip64 extra field");
        *field = le(cdir, f, 8);
        f += 8;
      }
    }
    x += 4 + len;
  }
  p += 46 + name_len + extra_len + comment_len;
  return e;
}

// The bytes of a stored (uncompressed, unencrypted) entry of at most max_size bytes.
std::string stored_contents(const ArchiveBytes& in, const ZipIndex::Entry& e, uint64_t max_size) {
  if (e.method != 0) in.bad("compressed '" + printable(e.name, 100) + "' record");
  if (e.flags & 0x2061) in.bad("encrypted or patched '" + printable(e.name, 100) + "' record");
  if (e.size > max_size) in.bad("oversized '" + printable(e.name, 100) + "' record");
  const std::string header = in.read(e.local_offset, 30);
  if (le(header, 0, 4) != 0x04034b50) in.bad("bad local header for '" + printable(e.name, 100) + "'");
  return in.read(e.local_offset + 30 + le(header, 26, 2) + le(header, 28, 2), e.size);
}

// Throws ModelError unless the version record's text is a version PyTorchStreamReader reads.
void check_version(const std::string& text, const std::string& name) {
  size_t k = 0;
  while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k]))) ++k;
  uint64_t v = 0;
  size_t digits = 0;
  for (; k < text.size() && std::isdigit(static_cast<unsigned char>(text[k])) && digits < 19; ++k, ++digits) {
    v = v * 10 + (text[k] - '0');
  }
  if (digits == 0 || v < caffe2::serialize::kMinSupportedFileFormatVersion ||
      v > caffe2::serialize::kMaxSupportedFileFormatVersion) {
    throw ModelError(strfmt("checkpoint '%s' has an unsupported archive version '%s'", name.c_str(),
                            printable(text, 20).c_str()));
  }
}

}  // namespace

std::shared_ptr<caffe2::serialize::ReadAdapterInterface> memory_adapter(const std::string& bytes) {
  return std::make_shared<MemoryAdapter>(bytes);
}

std::shared_ptr<caffe2::serialize::ReadAdapterInterface> file_adapter(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ModelError(strfmt("cannot open checkpoint '%s': %s", path.c_str(), std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ModelError(strfmt("checkpoint '%s' is not a regular file", path.c_str()), "", "checkpoint_not_found");
  }
  return std::make_shared<FileAdapter>(fd, static_cast<uint64_t>(st.st_size));
}

ZipIndex ZipIndex::check(const caffe2::serialize::ReadAdapterInterface& in, const std::string& name) {
  const ArchiveBytes bytes(in, name);
  const CentralDirectory dir = locate_central_directory(bytes);
  const std::string cdir = bytes.read(dir.offset, dir.size);
  if (dir.entries > cdir.size() / 46) bytes.bad("central directory too short");

  ZipIndex index;
  index.name_ = name;
  index.entries_.reserve(static_cast<size_t>(dir.entries));
  size_t p = 0;
  for (uint64_t k = 0; k < dir.entries; ++k) {
    Entry e = parse_entry(bytes, cdir, p);
    auto [it, inserted] = index.by_name_.emplace(lower(e.name), index.entries_.size());
    if (!inserted) it->second = std::string::npos;
    index.entries_.push_back(std::move(e));
  }

  // The archive folder is the first entry's directory.
  const size_t slash = index.entries_.front().name.find('/');
  if (slash == std::string::npos) bytes.bad("entries are not in an archive folder");
  index.root_ = index.entries_.front().name.substr(0, slash + 1);

  // The records the reader's constructor reads.
  auto contents = [&](const std::string& record, uint64_t max_size) {
    index.check_readable(record);
    return stored_contents(bytes, *index.find(record), max_size);
  };
  if (index.find(".data/serialization_id")) contents(".data/serialization_id", 1 << 20);
  const char* version = index.find(".data/version") ? ".data/version" : "version";
  if (!index.find(version)) bytes.bad("no version record");
  check_version(contents(version, 64), name);
  return index;
}

// Names match case-insensitively, as in miniz's lookup.
const ZipIndex::Entry* ZipIndex::find(const std::string& record) const {
  auto it = by_name_.find(lower(root_ + record));
  if (it == by_name_.end()) return nullptr;
  if (it->second == std::string::npos) throw_corrupt(name_, "duplicate record '" + printable(record, 100) + "'");
  return &entries_[it->second];
}

void ZipIndex::check_readable(const std::string& record) const {
  const Entry* e = find(record);
  if (!e) throw_corrupt(name_, "missing record '" + printable(record, 300) + "'");
  // miniz: a name ending in '/' or the DOS directory attribute makes a directory.
  const bool directory = (!e->name.empty() && e->name.back() == '/') || (e->external_attr & 0x10);
  if (directory || (e->size > 0 && e->comp_size == 0) || (e->method == 0 && e->comp_size != e->size)) {
    throw_corrupt(name_, "record '" + printable(record, 300) + "' has no data of its own");
  }
}

namespace {

// CRC-32 (the zip format's: reflected polynomial 0xEDB88320), eight bytes per step through
// eight tables.
uint32_t crc32_of(const void* data, size_t n) {
  static const auto tables = [] {
    std::array<std::array<uint32_t, 256>, 8> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (int s = 1; s < 8; ++s)
      for (uint32_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (; n >= 8; n -= 8, p += 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);  // the archive format is little-endian, as is every supported host
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = tables[7][lo & 0xFF] ^ tables[6][(lo >> 8) & 0xFF] ^ tables[5][(lo >> 16) & 0xFF] ^ tables[4][lo >> 24] ^
        tables[3][hi & 0xFF] ^ tables[2][(hi >> 8) & 0xFF] ^ tables[1][(hi >> 16) & 0xFF] ^ tables[0][hi >> 24];
  }
  for (; n > 0; --n, ++p) c = tables[0][(c ^ *p) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

}  // namespace

void ZipIndex::check_crc(const std::string& record, const void* data, size_t n) const {
  const Entry* e = find(record);
  if (!e) throw_corrupt(name_, "missing record '" + printable(record, 300) + "'");
  const uint32_t got = crc32_of(data, n);
  if (got != e->crc32)
    throw_corrupt(name_, strfmt("record '%s' is damaged (CRC-32 %08x, the archive says %08x)",
                                printable(record, 300).c_str(), got, e->crc32));
}

}  // namespace libreyolo::io::detail
