// The zip side of torch.save files (internal to src/io).
#pragma once
#include <caffe2/serialize/read_adapter_interface.h>

#include <memory>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace libreyolo::io::detail {

// PyTorchStreamReader inputs. The memory adapter keeps a reference to `bytes`.
std::shared_ptr<caffe2::serialize::ReadAdapterInterface> memory_adapter(const std::string& bytes);
std::shared_ptr<caffe2::serialize::ReadAdapterInterface> file_adapter(const std::string& path);

// The archive's central directory, read the way miniz reads it, for two checks
// PyTorchStreamReader does not make:
//  * its constructor leaks miniz's state when it fails after parsing the central directory
//    (no entries, no archive folder, a missing or bad version record), so check() refuses such
//    files before the reader is built;
//  * miniz "reads" an entry marked as a directory, or one with no stored data, by leaving the
//    caller's buffer untouched, so check_readable() refuses records that would come back as
//    uninitialized memory.
class ZipIndex {
 public:
  struct Entry {
    std::string name;
    uint64_t local_offset, comp_size, size, external_attr;
    uint32_t method, flags;
    uint32_t crc32;
  };

  // Throws ModelError (naming the file `name`) unless the reader's constructor will succeed.
  static ZipIndex check(const caffe2::serialize::ReadAdapterInterface& in, const std::string& name);
  // Throws ModelError unless `record` (inside the archive folder) exists once and reads as its
  // own bytes.
  void check_readable(const std::string& record) const;
  // Throws ModelError unless `data` (the record's n bytes as read) has the CRC-32 the archive
  // stores for it: a damaged checkpoint must not load as different weights.
  void check_crc(const std::string& record, const void* data, size_t n) const;

 private:
  const Entry* find(const std::string& record) const;  // nullptr when absent
  std::string name_;
  std::string root_;  // the archive folder, with its '/'
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> by_name_;  // lower-case name -> entry (npos: duplicated)
};

}  // namespace libreyolo::io::detail
