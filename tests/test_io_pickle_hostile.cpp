// The reader against malformed and hostile input: every case must end in a ModelError that says
// what is wrong (or a successful load), never a crash, hang, huge allocation or other exception.
#include <chrono>

#include "pickle_test_util.hpp"

using libreyolo::ModelError;
using namespace libreyolo::io;
using namespace libreyolo::test;

namespace {

// The ModelError message of loading `archive`, or "<loaded>".
std::string load_error(const std::string& archive) {
  try {
    load_torch_bytes(archive, "crafted.pt");
    return "<loaded>";
  } catch (const ModelError& e) {
    return e.what();
  }
}

std::string pickle_error(const Pickle& p, const Records& records = {}) {
  return load_error(make_archive(p.b, records));
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)

const Records kSix = {{"data/0", float_bytes({0, 1, 2, 3, 4, 5})}};

}  // namespace

TEST(PickleHostile, CraftedTensorBaseline) {
  Pickle p;
  p.float_tensor("0", 6, 1, {2, 2}, {2, 1}).stop();
  PyValuePtr v = load_torch_bytes(make_archive(p.b, kSix));
  ASSERT_TRUE(v->is_tensor());
  EXPECT_TRUE(torch::equal(v->tensor, torch::tensor({{1.f, 2.f}, {3.f, 4.f}})));
}

TEST(PickleHostile, TensorViewsOutsideTheirStorage) {
  struct Case {
    int64_t numel, offset;
    std::vector<int64_t> size, stride;
    const char* why;
  };
  const std::vector<Case> cases = {
      {6, 0, {7}, {1}, "outside its storage"},
      {6, 5, {2}, {1}, "outside its storage"},
      {6, 0, {2, 2}, {5, 1}, "outside its storage"},
      {6, 0, {3}, {0x7FFFFFFF}, "outside its storage"},
      {6, 0, {int64_t(1) << 32, int64_t(1) << 32}, {1, 1}, "tensor size overflows"},
      {6, 0, {2, 2}, {int64_t(1) << 62, int64_t(1) << 62}, "tensor extent overflows"},
      {6, INT64_MAX, {2}, {1}, "tensor extent overflows"},
      {int64_t(1) << 61, 0, {1}, {1}, "storage size overflows"},
      {6, 0, {-1}, {1}, "negative"},
      {6, 0, {2}, {-1}, "negative"},
      {6, -1, {2}, {1}, "negative storage offset"},
      {6, 0, {2, 3}, {1}, "differ in length"},
      {6, 7, {0}, {1}, "outside the storage"},
      {100, 0, {2}, {1}, "holds 24 bytes, its tensor needs 400"},
      {-1, 0, {1}, {1}, "negative storage size"},
  };
  for (const auto& c : cases) {
    Pickle p;
    p.float_tensor("0", c.numel, c.offset, c.size, c.stride).stop();
    EXPECT_CONTAINS(pickle_error(p, kSix), c.why);
  }
  // An empty view may sit at the end of its storage.
  Pickle ok;
  ok.float_tensor("0", 6, 6, {0}, {1}).stop();
  EXPECT_EQ(pickle_error(ok, kSix), "<loaded>");
  // Too many dimensions.
  Pickle dims;
  dims.float_tensor("0", 6, 0, std::vector<int64_t>(65, 1), std::vector<int64_t>(65, 1)).stop();
  EXPECT_CONTAINS(pickle_error(dims, kSix), "dimensions");
  // The data record is missing.
  Pickle missing;
  missing.float_tensor("7", 6, 0, {6}, {1}).stop();
  EXPECT_CONTAINS(pickle_error(missing, kSix), "missing record 'data/7'");
}

TEST(PickleHostile, HugeDeclaredLengthsFailBeforeAllocating) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::string> bodies = {
      std::string("X\xff\xff\xff\xff", 5),                    // BINUNICODE 4 GiB
      std::string("\x8d\x00\x00\x00\x00\x00\x00\x00\x40", 9),  // BINUNICODE8 2^62
      std::string("B\xff\xff\xff\x7f", 5),                    // BINBYTES
      std::string("\x8e\xff\xff\xff\xff\xff\xff\xff\xff", 9),  // BINBYTES8 2^64-1
      std::string("\x96\xff\xff\xff\xff\xff\xff\xff\x0f", 9),  // BYTEARRAY8
      std::string("\x8b\xff\xff\xff\x7f", 5),                 // LONG4 2 GiB
      std::string("\x8a\x09" "123456789", 11),                // LONG1 9 bytes
      std::string("T\xff\xff\xff\xff", 5),                    // BINSTRING -1
  };
  for (const auto& body : bodies) {
    Pickle p;
    p.raw(body).stop();
    EXPECT_CONTAINS(pickle_error(p), "is corrupt");
  }
  // A storage of 2^31-1 floats whose record is tiny.
  Pickle big;
  big.float_tensor("0", 0x7FFFFFFF, 0, {1}, {1}).stop();
  EXPECT_CONTAINS(pickle_error(big, kSix), "its tensor needs");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

TEST(PickleHostile, DeepNestingIsBounded) {
  const int n = 100000;
  Pickle lists;
  lists.raw(std::string(n, ']')).raw(std::string(n - 1, 'a')).stop();
  EXPECT_CONTAINS(pickle_error(lists), "nested deeper than 512");
  Pickle tuples;
  tuples.int1(0).raw(std::string(n, '\x85')).stop();
  EXPECT_CONTAINS(pickle_error(tuples), "nested deeper than 512");
  Pickle dicts;  // {0: {0: {0: ...}}}
  dicts.op('}');
  for (int k = 0; k < n; ++k) dicts.int1(0).op('}');
  for (int k = 0; k < n; ++k) dicts.op('s');
  dicts.stop();
  EXPECT_CONTAINS(pickle_error(dicts), "nested deeper than 512");
  Pickle marks;
  marks.raw(std::string(n, '(')).stop();
  EXPECT_CONTAINS(pickle_error(marks), "too many open MARKs");
  // Moderate nesting is fine.
  Pickle ok;
  ok.raw(std::string(400, ']')).raw(std::string(399, 'a')).stop();
  PyValuePtr v = load_torch_bytes(make_archive(ok.b));
  int depth = 0;
  for (const PyValue* cur = v.get(); !cur->items.empty(); cur = cur->items[0].get()) ++depth;
  EXPECT_EQ(depth, 399);
}

// Small pickles that would make the reader (or whoever walks the result) do huge work.
TEST(PickleHostile, AmplificationIsBounded) {
  const auto t0 = std::chrono::steady_clock::now();
  Pickle dag;  // t0 = (0, 0); t(k+1) = (tk, tk): 2^60 leaves in a few hundred bytes
  dag.int1(0).op('q').le(0, 1);
  for (int k = 0; k < 60; ++k) dag.op('h').le(k, 1).op('h').le(k, 1).op('\x86').op('q').le(k + 1, 1);
  dag.stop();
  EXPECT_CONTAINS(pickle_error(dag), "expands to too many objects");
  Pickle copies;  // _codecs.encode of one 100 kB string, 2000 times
  copies.global("_codecs", "encode").op('q').le(0, 1);
  copies.str(std::string(100000, 'a')).str("latin1").op('\x86').op('q').le(1, 1).op('0');
  for (int k = 0; k < 2000; ++k) copies.op('h').le(0, 1).op('h').le(1, 1).op('R').op('0');
  copies.op('N').stop();
  EXPECT_CONTAINS(pickle_error(copies), "too much data built by REDUCE");
  Pickle big_key;
  big_key.op('}').str(std::string(2000, 'k')).op('N').op('s').stop();
  EXPECT_CONTAINS(pickle_error(big_key), "oversized (over 1024 bytes) dict key");
  Pickle reused_key;  // a 1000-byte key set 20000 times: allowed, and fast
  reused_key.op('}').str(std::string(1000, 'k')).op('q').le(0, 1).op('0').op('(');
  for (int k = 0; k < 20000; ++k) reused_key.op('h').le(0, 1).int1(k % 200);
  reused_key.op('u').stop();
  PyValuePtr v = load_torch_bytes(make_archive(reused_key.b));
  ASSERT_EQ(v->dict.size(), 1u);
  EXPECT_EQ(v->dict[0].second->as_int(), 19999 % 200);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
}

TEST(PickleHostile, RecursiveStructuresAreRefused) {
  Pickle self_list;  // l = []; l.append(l)
  self_list.op(']').op('q').le(0, 1).op('h').le(0, 1).op('a').stop();
  EXPECT_CONTAINS(pickle_error(self_list), "contains itself");
  Pickle self_dict;  // d = {}; d[1] = d
  self_dict.op('}').op('q').le(0, 1).int1(1).op('h').le(0, 1).op('s').stop();
  EXPECT_CONTAINS(pickle_error(self_dict), "contains itself");
  Pickle cycle;  // a = []; b = []; a.append(b); b.append(a)
  cycle.op(']').op('q').le(0, 1).op(']').op('q').le(1, 1).op('a');
  cycle.op('h').le(1, 1).op('h').le(0, 1).op('a').stop();
  EXPECT_CONTAINS(pickle_error(cycle), "already stored elsewhere");
  Pickle via_tuple;  // a = []; t = (a,); a.append(t)
  via_tuple.op(']').op('q').le(0, 1).op('\x85').op('q').le(1, 1).op('0');
  via_tuple.op('h').le(0, 1).op('h').le(1, 1).op('a').stop();
  EXPECT_CONTAINS(pickle_error(via_tuple), "already stored elsewhere");
}

TEST(PickleHostile, DisallowedGlobalsByEveryRoute) {
  const std::vector<std::pair<std::string, std::string>> globals = {
      {"os", "system"},           {"builtins", "getattr"},
      {"torch", "load"},          {"torch.nn.modules.conv", "Conv2d"},
      {"numpy.core.multiarray", "scalar"}, {"torch._utils", "_rebuild_device_tensor_from_numpy"},
      {"collections", "defaultdict"}, {"torch", "Tensor"},
  };
  for (const auto& [module, name] : globals) {
    Pickle g;
    g.global(module, name).op(')').op('R').stop();
    EXPECT_CONTAINS(pickle_error(g), "disallowed Python global '" + module + "." + name + "'");
    Pickle sg;  // protocol 4 STACK_GLOBAL
    sg.str(module).str(name).op('\x93').op(')').op('R').stop();
    EXPECT_CONTAINS(pickle_error(sg), "disallowed Python global '" + module + "." + name + "'");
  }
  Pickle binary;  // non-printable names are escaped in the message
  binary.global(std::string("os\x01\x7f", 4), "sys\ttem").stop();
  EXPECT_CONTAINS(pickle_error(binary), "'os??.sys?tem'");
}

TEST(PickleHostile, MalformedPicklesSayWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "needs 1 more bytes"},                      // no STOP
      {".", "stack underflow"},                        // STOP on an empty stack
      {std::string("h\x05.", 3), "memo entry 5 is missing"},
      {"K\x01" "a.", "stack underflow"},                // APPEND without a list
      {"]K\x01u.", "missing MARK"},
      {std::string("\xff.", 2), "unsupported pickle opcode 0xff"},
      {std::string("\x80\x06.", 3), "unsupported pickle protocol 6"},
      {"cos", "unterminated text argument"},
      {"}]K\x01s.", "unhashable or oversized"},
      {"](K\x01K\x02u.", "SETITEMS on a list"},
      {"}K\x01" "a.", "APPEND on a dict"},
      {"])R.", "REDUCE on an object that is not an allowed global"},
      {"ccollections\nOrderedDict\nK\x01\x85R.", "called with 1 arguments"},
      {"ctorch\nFloatStorage\n)R.", "cannot be called"},
      {"]Nb.", "BUILD on a list"},
      {"K\x01Q.", "persistent id is not"},
      {std::string("X\x02\0\0\0\xc3\x28.", 8), "not valid UTF-8"},
      {"(K\x01" "d.", "odd number of items"},
      {"K\x01\x93.", "stack underflow"},
      {"(]]K\x01l.", "<loaded>"},
  };
  for (const auto& [body, why] : cases) {
    Pickle p;
    p.raw(body);
    const std::string msg = pickle_error(p);
    if (std::string(why) == "<loaded>") {
      EXPECT_EQ(msg, "<loaded>");
    } else {
      EXPECT_CONTAINS(msg, why);
      EXPECT_CONTAINS(msg, "crafted.pt");
    }
  }
  Pickle pid_dtype;  // a dtype where the storage type belongs
  pid_dtype.mark().str("storage").global("torch", "float32").str("0").str("cpu").int1(6).op('t').op('Q').stop();
  EXPECT_CONTAINS(pickle_error(pid_dtype, kSix), "persistent id has no storage type");
  Pickle pid_short;
  pid_short.str("storage").op('\x85').op('Q').stop();
  EXPECT_CONTAINS(pickle_error(pid_short, kSix), "persistent id is not");
  Pickle stack_global_int;
  stack_global_int.str("os").int1(1).op('\x93').stop();
  EXPECT_CONTAINS(pickle_error(stack_global_int), "STACK_GLOBAL arguments are not strings");
  Pickle v2_args;  // _rebuild_tensor_v2 with too few arguments
  v2_args.global("torch._utils", "_rebuild_tensor_v2").mark().int1(0).op('t').op('R').stop();
  EXPECT_CONTAINS(pickle_error(v2_args), "called with 1 arguments");
  Pickle not_storage;  // a list where the storage belongs
  not_storage.global("torch._utils", "_rebuild_tensor_v2").mark().op(']').int1(0).op(')').op(')');
  not_storage.op('\x89').op('N').op('t').op('R').stop();
  EXPECT_CONTAINS(pickle_error(not_storage), "not built from a storage");
}

TEST(PickleHostile, ContainerLevelDamage) {
  EXPECT_CONTAINS(load_error(""), "is corrupt");
  EXPECT_CONTAINS(load_error("PK\x03\x04 not really a zip"), "is corrupt");
  EXPECT_CONTAINS(load_error(std::string(1000, 'x')), "is corrupt");
  // A zip without data.pkl.
  std::string no_pkl;
  {
    caffe2::serialize::PyTorchStreamWriter w([&](const void* b, size_t n) -> size_t {
      no_pkl.append(b ? static_cast<const char*>(b) : std::string(n, '\0').c_str(), n);
      return n;
    });
    w.writeRecord("other", "x", 1);
    w.writeEndOfFile();
  }
  EXPECT_CONTAINS(load_error(no_pkl), "missing record 'data.pkl'");
  // Archives PyTorchStreamReader's constructor would fail on are refused before it runs.
  auto zip = [](const Records& records) {
    std::string out;
    caffe2::serialize::PyTorchStreamWriter w([&](const void* b, size_t n) -> size_t {
      out.append(b ? std::string(static_cast<const char*>(b), n) : std::string(n, '\0'));
      return n;
    });
    for (const auto& [name, data] : records) w.writeRecord(name, data.data(), data.size());
    w.writeEndOfFile();
    return out;
  };
  const std::string good = zip({{"data.pkl", std::string("\x80\x02N.", 4)}});
  EXPECT_EQ(load_error(good), "<loaded>");
  EXPECT_CONTAINS(load_error(zip({{"data.pkl", "N."}, {".data/version", "11\n"}})), "unsupported archive version '11?'");
  EXPECT_CONTAINS(load_error(zip({{"data.pkl", "N."}, {".data/version", "x"}})), "unsupported archive version");
  std::string renamed = good;  // the version record renamed: "verzion"
  ASSERT_NE(renamed.find("archive/version"), std::string::npos);
  for (size_t k = renamed.find("archive/version"); k != std::string::npos; k = renamed.find("archive/version", k + 1)) {
    renamed[k + 11] = 'z';
  }
  EXPECT_CONTAINS(load_error(renamed), "no version record");
  const size_t eocd = good.rfind(std::string("PK\x05\x06", 4));
  ASSERT_NE(eocd, std::string::npos);
  EXPECT_CONTAINS(load_error(good.substr(0, eocd)), "no end of central directory");
  // Records miniz would "read" by leaving the buffer untouched (uninitialized memory) are refused:
  // a data record flagged as a directory in the central directory, or one without stored bytes.
  Pickle t;
  t.float_tensor("0", 6, 0, {6}, {1}).stop();
  const std::string archive = make_archive(t.b, kSix);
  ASSERT_EQ(load_error(archive), "<loaded>");
  auto central_entry = [&](const std::string& bytes) {
    for (size_t k = bytes.find("archive/data/0"); k != std::string::npos; k = bytes.find("archive/data/0", k + 1)) {
      if (k >= 46 && bytes.compare(k - 46, 4, std::string("PK\x01\x02", 4)) == 0) return k - 46;
    }
    return std::string::npos;
  };
  const size_t entry = central_entry(archive);
  ASSERT_NE(entry, std::string::npos);
  std::string as_directory = archive;
  as_directory[entry + 38] |= 0x10;  // external attributes: DOS directory
  EXPECT_CONTAINS(load_error(as_directory), "record 'data/0' has no data of its own");
  std::string no_data = archive;
  for (int k = 0; k < 4; ++k) no_data[entry + 20 + k] = 0;  // compressed size 0
  EXPECT_CONTAINS(load_error(no_data), "is corrupt");  // miniz itself refuses this one
  // Byte order.
  Pickle p;
  p.op('N').stop();
  EXPECT_CONTAINS(load_error(make_archive(p.b, {{"byteorder", "big"}})), "big-endian");
  EXPECT_CONTAINS(load_error(make_archive(p.b, {{"byteorder", "middle"}})), "unknown byteorder");
  EXPECT_EQ(load_error(make_archive(p.b, {{"byteorder", "little"}})), "<loaded>");
}

namespace {

struct Outcome {
  size_t loaded = 0, refused = 0;
};

void expect_load_or_model_error(const std::string& bytes, Outcome& o) {
  try {
    load_torch_bytes(bytes, "damaged.pt");
    ++o.loaded;
  } catch (const ModelError&) {
    ++o.refused;
  }
}

}  // namespace

// Damage a real Python-written file everywhere: cut it, flip its bytes, inside the zip and inside
// the pickle (re-wrapped so the zip itself stays valid).
TEST(PickleHostile, TruncatedAndFlippedRealFiles) {
  LY_REQUIRE_PYTHON_PICKLES(pk);
  const std::string file = read_file(pk.dir + "/varied_p2.pt");
  auto [pkl, records] = split_archive(file);
  ASSERT_GT(pkl.size(), 1000u);

  Outcome cut_zip, cut_pkl, flip_zip, flip_pkl;
  for (size_t n = 0; n < file.size(); n += 5) expect_load_or_model_error(file.substr(0, n), cut_zip);
  for (size_t n = 0; n < pkl.size(); ++n) expect_load_or_model_error(make_archive(pkl.substr(0, n), records), cut_pkl);
  for (size_t k = 0; k < file.size(); k += 3) {
    std::string damaged = file;
    damaged[k] = static_cast<char>(damaged[k] ^ 0x5A);
    expect_load_or_model_error(damaged, flip_zip);
  }
  for (size_t k = 0; k < pkl.size(); ++k) {
    for (unsigned char x : {0x01, 0xFF}) {
      std::string damaged = pkl;
      damaged[k] = static_cast<char>(damaged[k] ^ x);
      expect_load_or_model_error(make_archive(damaged, records), flip_pkl);
    }
  }
  // Cutting a zip or its pickle always breaks it; some flips are harmless (a changed digit).
  EXPECT_EQ(cut_zip.loaded, 0u);
  EXPECT_EQ(cut_pkl.loaded, 0u);
  EXPECT_GT(flip_pkl.loaded, 0u);
  EXPECT_GT(flip_pkl.refused, 0u);
  EXPECT_GT(flip_zip.refused, 0u);
}
