// Test helpers for the pickle reader/writer: hand-made pickles, archives around them, and the
// files written by tests/python/make_pickles.py.
#pragma once
#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <string>
#include <utility>
#include <vector>

#include "io/pickle.hpp"
#include "libreyolo/errors.hpp"
#include "support.hpp"

namespace libreyolo::test {

using Records = std::vector<std::pair<std::string, std::string>>;

// A torch.save-style zip holding `pkl` as data.pkl plus the given records (name -> bytes).
inline std::string make_archive(const std::string& pkl, const Records& records = {}) {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter w([&out](const void* buf, size_t n) -> size_t {
    if (buf) {
      out.append(static_cast<const char*>(buf), n);
    } else {
      out.append(n, '\0');
    }
    return n;
  });
  w.writeRecord("data.pkl", pkl.data(), pkl.size());
  for (const auto& [name, data] : records) w.writeRecord(name, data.data(), data.size());
  w.writeEndOfFile();
  return out;
}

// All records of an archive except `version` and the serialization id (which the writer adds).
inline std::pair<std::string, Records> split_archive(const std::string& bytes) {
  std::istringstream in(bytes);
  caffe2::serialize::PyTorchStreamReader reader(&in);
  std::string pkl;
  Records records;
  for (const auto& name : reader.getAllRecords()) {
    if (name == "version" || name == ".data/version" || name == ".data/serialization_id") continue;
    auto [ptr, n] = reader.getRecord(name);
    std::string data(static_cast<const char*>(ptr.get()), n);
    if (name == "data.pkl") {
      pkl = std::move(data);
    } else {
      records.emplace_back(name, std::move(data));
    }
  }
  return {pkl, records};
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Builds protocol-2 pickles opcode by opcode.
struct Pickle {
  std::string b = std::string("\x80\x02", 2);
  Pickle& op(char c) {
    b += c;
    return *this;
  }
  Pickle& raw(const std::string& s) {
    b += s;
    return *this;
  }
  Pickle& le(uint64_t v, int bytes) {
    for (int k = 0; k < bytes; ++k) b += static_cast<char>((v >> (8 * k)) & 0xFF);
    return *this;
  }
  Pickle& str(const std::string& s) { return op('X').le(s.size(), 4).raw(s); }
  Pickle& int1(uint8_t v) { return op('K').le(v, 1); }
  Pickle& int4(int32_t v) { return op('J').le(static_cast<uint32_t>(v), 4); }
  // BININT when it fits, else an 8-byte LONG1.
  Pickle& integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) return int4(static_cast<int32_t>(v));
    return op('\x8a').le(8, 1).le(static_cast<uint64_t>(v), 8);
  }
  Pickle& global(const std::string& module, const std::string& name) {
    return op('c').raw(module + "\n" + name + "\n");
  }
  Pickle& mark() { return op('('); }
  Pickle& stop() { return op('.'); }
  // _rebuild_tensor_v2(('storage', torch.FloatStorage, key, 'cpu', numel), offset, size, stride, False, OrderedDict())
  Pickle& float_tensor(const std::string& key, int64_t numel, int64_t offset,
                       const std::vector<int64_t>& size, const std::vector<int64_t>& stride) {
    global("torch._utils", "_rebuild_tensor_v2").mark();
    mark().str("storage").global("torch", "FloatStorage").str(key).str("cpu").integer(numel);
    op('t').op('Q');
    integer(offset);
    mark();
    for (auto s : size) integer(s);
    op('t').mark();
    for (auto s : stride) integer(s);
    op('t').op('\x89').global("collections", "OrderedDict").op(')').op('R');
    return op('t').op('R');
  }
};

inline std::string float_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// The files of tests/python/make_pickles.py. They are made once and kept next to the test
// program (keyed by the script's contents), because every test runs in its own process.
struct PythonPickles {
  std::string dir;
  std::string marker_dir;  // where the hostile files would create files if they ever ran
  std::string error;       // why generation failed (empty on success)
};
inline const PythonPickles& python_pickles() {
  static PythonPickles result = [] {
    PythonPickles r;
    auto py = python_with_torch();
    if (!py) {
      r.error = "no python with torch";
      return r;
    }
    const std::string script = std::string(LIBREYOLO_SOURCE_DIR) + "/tests/python/make_pickles.py";
    const std::string cache = std::filesystem::read_symlink("/proc/self/exe").parent_path().string() +
                              "/pickles_" + std::to_string(std::hash<std::string>{}(read_file(script)));
    r.dir = cache + "/files";
    r.marker_dir = cache + "/markers";
    if (std::filesystem::exists(cache + "/files/.complete")) return r;
    // Made in a temporary folder and renamed into place, so concurrent tests never see half a set.
    const std::string tmp = cache + ".tmp" + std::to_string(::getpid());
    std::filesystem::create_directories(tmp + "/files");
    std::filesystem::create_directories(r.marker_dir);
    std::string out;
    if (run_command(*py + " " + script + " " + tmp + "/files " + r.marker_dir, &out) != 0) {
      r.error = "make_pickles.py failed: " + out;
      return r;
    }
    std::ofstream(tmp + "/files/.complete") << "ok";
    std::error_code ec;
    std::filesystem::rename(tmp + "/files", r.dir, ec);  // fails harmlessly when another test won
    // Not std::filesystem::remove_all: it resolves into libtorch's copy and crashes.
    run_command("rm -rf '" + tmp + "'");
    return r;
  }();
  return result;
}

}  // namespace libreyolo::test

#define LY_REQUIRE_PYTHON_PICKLES(var)                                        \
  const auto& var = ::libreyolo::test::python_pickles();                     \
  if (var.error == "no python with torch") GTEST_SKIP() << "python with torch not found"; \
  ASSERT_TRUE(var.error.empty()) << var.error
