// Inputs for PyTorchStreamReader, and ZipIndex (see torch_zip.hpp for why it exists; both of
// its checks came from fuzzing).
#include "io/torch_zip.hpp"

#include <caffe2/serialize/versions.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "core/log.hpp"
#include "core/strings.hpp"
#include "io/pickle_detail.hpp"
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
  ZipIndex index;
  index.name_ = name;
  const uint64_t size = in.size();
  auto bad = [&](const std::string& what) { throw_corrupt(name, "not a torch.save zip archive: " + what); };
  auto read = [&](uint64_t pos, uint64_t n) {
    if (pos > size || n > size - pos) bad("a zip structure points past the end of the file");
    std::string b(static_cast<size_t>(n), '\0');
    if (n > 0 && in.read(pos, b.data(), b.size()) != b.size()) bad("read error");
    return b;
  };

  // End of central directory: the last signature with room for its 22 bytes, as miniz finds it.
  constexpr uint64_t kEocd = 22;
  if (size < kEocd) bad("too small");
  const uint64_t tail_at = size - std::min<uint64_t>(size, 0xFFFF + kEocd);
  const std::string tail = read(tail_at, size - tail_at);
  size_t eocd = std::string::npos;
  for (size_t k = tail.size() - kEocd + 1; k-- > 0;) {
    if (le(tail, k, 4) == 0x06054b50) {
      eocd = k;
      break;
    }
  }
  if (eocd == std::string::npos) bad("no end of central directory");
  uint64_t entries = le(tail, eocd + 10, 2);
  uint64_t cdir_size = le(tail, eocd + 12, 4);
  uint64_t cdir_at = le(tail, eocd + 16, 4);
  // A zip64 locator right before it points to the zip64 record, whose counts then apply.
  const uint64_t eocd_at = tail_at + eocd;
  if (eocd_at >= 20) {
    const std::string loc = read(eocd_at - 20, 20);
    if (le(loc, 0, 4) == 0x07064b50) {
      const std::string z64 = read(le(loc, 8, 8), 56);
      if (le(z64, 0, 4) != 0x06064b50) bad("bad zip64 end of central directory");
      entries = le(z64, 32, 8);
      cdir_size = le(z64, 40, 8);
      cdir_at = le(z64, 48, 8);
    }
  }
  if (entries == 0) bad("no entries");
  if (cdir_size > (uint64_t(256) << 20)) bad("central directory larger than 256 MiB");
  const std::string cdir = read(cdir_at, cdir_size);
  if (entries > cdir.size() / 46) bad("central directory too short");

  std::vector<Entry>& list = index.entries_;
  list.reserve(static_cast<size_t>(entries));
  size_t p = 0;
  for (uint64_t k = 0; k < entries; ++k) {
    if (p + 46 > cdir.size() || le(cdir, p, 4) != 0x02014b50) bad("bad central directory entry");
    Entry e;
    e.flags = static_cast<uint32_t>(le(cdir, p + 8, 2));
    e.method = static_cast<uint32_t>(le(cdir, p + 10, 2));
    e.comp_size = le(cdir, p + 20, 4);
    e.size = le(cdir, p + 24, 4);
    const size_t name_len = le(cdir, p + 28, 2), extra_len = le(cdir, p + 30, 2), comment_len = le(cdir, p + 32, 2);
    e.external_attr = le(cdir, p + 38, 4);
    e.local_offset = le(cdir, p + 42, 4);
    if (p + 46 + name_len + extra_len + comment_len > cdir.size()) bad("bad central directory entry");
    e.name = cdir.substr(p + 46, name_len);
    // Zip64 extra field: the saturated 32-bit values, in this order.
    for (size_t x = p + 46 + name_len; x + 4 <= p + 46 + name_len + extra_len;) {
      const uint64_t id = le(cdir, x, 2), len = le(cdir, x + 2, 2);
      if (x + 4 + len > p + 46 + name_len + extra_len) break;
      if (id == 1) {
        size_t f = x + 4;
        for (uint64_t* field : {&e.size, &e.comp_size, &e.local_offset}) {
          if (*field != 0xFFFFFFFF) continue;
          if (f + 8 > x + 4 + len) bad("bad zip64 extra field");
          *field = le(cdir, f, 8);
          f += 8;
        }
      }
      x += 4 + len;
    }
    auto [it, inserted] = index.by_name_.emplace(lower(e.name), list.size());
    if (!inserted) it->second = std::string::npos;
    list.push_back(std::move(e));
    p += 46 + name_len + extra_len + comment_len;
  }

  // The archive folder is the first entry's directory.
  const size_t slash = list.front().name.find('/');
  if (slash == std::string::npos) bad("entries are not in an archive folder");
  index.root_ = list.front().name.substr(0, slash + 1);

  // The records the reader's constructor reads.
  auto contents = [&](const std::string& record, uint64_t max_size) {
    index.check_readable(record);
    const Entry& e = *index.find(record);
    if (e.method != 0) bad("compressed '" + printable(e.name, 100) + "' record");
    if (e.flags & 0x2061) bad("encrypted or patched '" + printable(e.name, 100) + "' record");
    if (e.size > max_size) bad("oversized '" + printable(e.name, 100) + "' record");
    const std::string header = read(e.local_offset, 30);
    if (le(header, 0, 4) != 0x04034b50) bad("bad local header for '" + printable(e.name, 100) + "'");
    return read(e.local_offset + 30 + le(header, 26, 2) + le(header, 28, 2), e.size);
  };
  if (index.find(".data/serialization_id")) contents(".data/serialization_id", 1 << 20);
  const char* version = index.find(".data/version") ? ".data/version" : "version";
  if (!index.find(version)) bad("no version record");
  const std::string text = contents(version, 64);
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

}  // namespace libreyolo::io::detail
