// The torch.save writer: round trips through the C++ reader, files checked by Python's
// torch.load(weights_only=True), atomic replacement, and what it refuses.
#include <cmath>
#include <filesystem>

#include "pickle_test_util.hpp"

namespace fs = std::filesystem;
using libreyolo::ModelError;
using namespace libreyolo::io;
using namespace libreyolo::test;

namespace {

PyValuePtr str(const std::string& s) { return PyValue::from_string(s); }
PyValuePtr num(int64_t v) { return PyValue::from_int(v); }
PyValuePtr ten(torch::Tensor t) { return PyValue::from_tensor(std::move(t)); }

PyValuePtr bytes_value(const std::string& b) {
  auto v = PyValue::none();
  v->kind = PyValue::Kind::Bytes;
  v->s = b;
  return v;
}

// The content tests/python/check_cpp_file.py expects ("varied").
PyValuePtr varied_value() {
  auto root = PyValue::new_dict();
  auto model = PyValue::new_dict(true);
  model->set("conv.weight", ten(torch::arange(8, torch::kFloat).reshape({2, 1, 2, 2})));
  model->set("bn.running_var", ten(torch::full({2}, 0.5f)));
  model->set("bn.num_batches_tracked", ten(torch::tensor(int64_t(7))));
  root->set("model", model);
  const torch::Tensor base = torch::arange(12, torch::kFloat).reshape({3, 4});
  root->set("f32", ten(base));
  root->set("t", ten(base.t()));
  root->set("slice", ten(base.slice(0, 1).slice(1, 0, 4, 2)));
  root->set("f64", ten(torch::arange(4, torch::kDouble) / 8));
  root->set("f16", ten(torch::tensor({0.5f, -2.0f, 65504.0f}).to(torch::kHalf)));
  root->set("bf16", ten(torch::tensor({1.0f, -3.5f, 256.0f}).to(torch::kBFloat16)));
  root->set("i64", ten(torch::tensor({-(int64_t(1) << 62), int64_t(0), int64_t(1) << 62})));
  root->set("i32", ten(torch::arange(-3, 3, torch::kInt)));
  root->set("i16", ten(torch::tensor({-300, 300}, torch::kShort)));
  root->set("i8", ten(torch::tensor({-128, 127}, torch::kChar)));
  root->set("u8", ten(torch::tensor({0, 200, 255}, torch::kByte)));
  root->set("bool", ten(torch::tensor({true, false, true})));
  auto c64 = torch::view_as_complex(torch::tensor({{1.f, 2.f}, {-3.f, -4.f}}));
  root->set("c64", ten(c64));
  root->set("conj", ten(c64.conj()));
  root->set("u16", ten(torch::tensor({1, 65535}, torch::kInt).to(torch::kUInt16)));
  root->set("f8", ten(torch::tensor({0.5f, -2.0f}).to(torch::kFloat8_e4m3fn)));
  root->set("zero", ten(torch::zeros({0, 3})));
  root->set("scalar", ten(torch::tensor(2.5f)));
  auto names = PyValue::new_dict();
  names->set(num(0), str("person"));
  names->set(num(1), str("car"));
  root->set("names", names);
  auto nested = PyValue::new_dict();
  nested->set("a", PyValue::new_list({num(1), PyValue::new_tuple({num(2), PyValue::from_float(3.5)}), PyValue::none(),
                                      PyValue::from_bool(true), PyValue::from_bool(false), str("s\xc3\xa9"),
                                      bytes_value(std::string("\x00\xff", 2))}));
  nested->set("t", PyValue::new_tuple());
  nested->set("t1", PyValue::new_tuple({num(1)}));
  nested->set("t4", PyValue::new_tuple({num(1), num(2), num(3), num(4)}));
  root->set("nested", nested);
  std::vector<PyValuePtr> ints;
  for (int64_t v : {int64_t(0), int64_t(255), int64_t(256), int64_t(65535), int64_t(65536), int64_t(-1),
                    int64_t(INT32_MIN), int64_t(INT32_MAX), int64_t(INT32_MAX) + 1, int64_t(INT32_MIN) - 1,
                    int64_t(1) << 40, INT64_MIN, INT64_MAX}) {
    ints.push_back(num(v));
  }
  root->set("ints", PyValue::new_list(ints));
  root->set("floats", PyValue::new_list({PyValue::from_float(1.25), PyValue::from_float(-0.0),
                                         PyValue::from_float(INFINITY), PyValue::from_float(NAN)}));
  std::vector<PyValuePtr> long_list;
  for (int k = 0; k < 2500; ++k) long_list.push_back(num(k));
  root->set("long_list", PyValue::new_list(long_list));
  auto big = PyValue::new_dict();
  for (int k = 0; k < 1200; ++k) big->dict.emplace_back(str("k" + std::to_string(k)), num(k));
  root->set("big_dict", big);
  root->set("od_empty", PyValue::new_dict(true));
  root->set("empty_list", PyValue::new_list());
  root->set("empty_dict", PyValue::new_dict());
  return root;
}

// Deep equality of two values (tensors: dtype, shape, strides, offset and bits).
void expect_same(const PyValue& a, const PyValue& b, const std::string& where) {
  ASSERT_EQ(a.kind, b.kind) << where;
  switch (a.kind) {
    case PyValue::Kind::None: break;
    case PyValue::Kind::Bool: EXPECT_EQ(a.b, b.b) << where; break;
    case PyValue::Kind::Int: EXPECT_EQ(a.i, b.i) << where; break;
    case PyValue::Kind::Float:
      if (std::isnan(a.f)) {
        EXPECT_TRUE(std::isnan(b.f)) << where;
      } else {
        EXPECT_EQ(a.f, b.f) << where;
        EXPECT_EQ(std::signbit(a.f), std::signbit(b.f)) << where;
      }
      break;
    case PyValue::Kind::String:
    case PyValue::Kind::Bytes: EXPECT_EQ(a.s, b.s) << where; break;
    case PyValue::Kind::Tuple:
    case PyValue::Kind::List:
      ASSERT_EQ(a.items.size(), b.items.size()) << where;
      for (size_t k = 0; k < a.items.size(); ++k) expect_same(*a.items[k], *b.items[k], where + "[" + std::to_string(k) + "]");
      break;
    case PyValue::Kind::Dict:
      EXPECT_EQ(a.ordered, b.ordered) << where;
      ASSERT_EQ(a.dict.size(), b.dict.size()) << where;
      for (size_t k = 0; k < a.dict.size(); ++k) {
        expect_same(*a.dict[k].first, *b.dict[k].first, where + ".key" + std::to_string(k));
        expect_same(*a.dict[k].second, *b.dict[k].second, where + "." + a.dict[k].first->repr(40));
      }
      break;
    case PyValue::Kind::Tensor: {
      const auto &x = a.tensor, &y = b.tensor;
      ASSERT_EQ(x.scalar_type(), y.scalar_type()) << where;
      ASSERT_EQ(x.sizes(), y.sizes()) << where;
      if (x.is_conj() || y.is_conj()) {
        EXPECT_TRUE(torch::equal(x.resolve_conj(), y.resolve_conj())) << where;
        break;
      }
      EXPECT_EQ(x.strides(), y.strides()) << where;
      EXPECT_EQ(x.storage_offset(), y.storage_offset()) << where;
      // Bitwise, so NaNs, -0.0 and float8 compare exactly.
      auto bits = [](const torch::Tensor& t) {
        return at::empty({0}, t.options().dtype(torch::kByte))
            .set_(t.storage(), 0, {static_cast<int64_t>(t.storage().nbytes())}, {1});
      };
      EXPECT_TRUE(torch::equal(bits(x), bits(y))) << where;
      break;
    }
  }
}

}  // namespace

TEST(PickleWrite, RoundTripThroughTheReader) {
  PyValuePtr v = varied_value();
  const std::string bytes = save_torch_bytes(*v);
  PyValuePtr back = load_torch_bytes(bytes, "roundtrip");
  expect_same(*v, *back, "root");
  // Views of one tensor still share one storage, written once.
  EXPECT_TRUE(back->get("t")->tensor.is_alias_of(back->get("f32")->tensor));
  EXPECT_TRUE(back->get("slice")->tensor.is_alias_of(back->get("f32")->tensor));
  auto [pkl, records] = split_archive(bytes);
  size_t data_records = 0;
  for (const auto& r : records) data_records += r.first.rfind("data/", 0) == 0;
  size_t tensors = 0;
  for (const auto& kv : v->dict) tensors += kv.second->is_tensor();
  EXPECT_EQ(data_records, tensors - 2 + 3);  // t and slice share f32's storage; model holds 3 more
  // The records torch.save writes.
  std::vector<std::string> names;
  for (const auto& r : records) names.push_back(r.first);
  for (const char* want : {".format_version", ".storage_alignment", "byteorder"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
}

TEST(PickleWrite, PythonLoadsCppFilesWithWeightsOnly) {
  auto py = python_with_torch();
  if (!py) GTEST_SKIP() << "python with torch not found";
  const std::string path = temp_dir("write") + "/varied.pt";
  save_torch_file(path, *varied_value());
  std::string out;
  const std::string script = std::string(LIBREYOLO_SOURCE_DIR) + "/tests/python/check_cpp_file.py";
  EXPECT_EQ(run_command(*py + " " + script + " varied " + path, &out), 0) << out;
  EXPECT_NE(out.find("OK"), std::string::npos) << out;
}

// A real checkpoint read and written back by C++ is the same file to Python: types
// (OrderedDict state dict, {int: str} names), key order, dtypes and values.
TEST(PickleWrite, FixtureCheckpointSurvivesARoundTrip) {
  LY_REQUIRE_FIXTURES(fx);
  auto py = python_with_torch();
  if (!py) GTEST_SKIP() << "python with torch not found";
  const std::string original = fx + "/yolo9t_nc80_s320.pt";
  PyValuePtr root = load_torch_file(original);
  const std::string copy = temp_dir("write") + "/copy.pt";
  save_torch_file(copy, *root);
  expect_same(*root, *load_torch_file(copy), "root");
  std::string out;
  const std::string script = std::string(LIBREYOLO_SOURCE_DIR) + "/tests/python/check_cpp_file.py";
  EXPECT_EQ(run_command(*py + " " + script + " same " + copy + " " + original, &out), 0) << out;
}

TEST(PickleWrite, PythonFilesSurviveARoundTrip) {
  LY_REQUIRE_PYTHON_PICKLES(pk);
  for (const char* file : {"varied_p2.pt", "varied_p4.pt", "many.pt"}) {
    PyValuePtr v = load_torch_file(pk.dir + "/" + file);
    expect_same(*v, *load_torch_bytes(save_torch_bytes(*v)), file);
  }
}

TEST(PickleWrite, ReplacesFilesAtomically) {
  const std::string dir = temp_dir("atomic");
  const std::string path = dir + "/ckpt.pt";
  auto first = PyValue::new_dict();
  first->set("v", num(1));
  save_torch_file(path, *first);
  auto second = PyValue::new_dict();
  second->set("v", num(2));
  second->set("w", ten(torch::ones({1000})));
  save_torch_file(path, *second);
  EXPECT_EQ(load_torch_file(path)->get("v")->as_int(), 2);
  // A value that cannot be saved leaves the existing file as it was.
  const std::string before = read_file(path);
  auto bad = PyValue::new_dict();
  bad->set("ok", ten(torch::ones({10})));
  bad->set("bad", str("\xff\xfe"));
  EXPECT_THROW(save_torch_file(path, *bad), ModelError);
  EXPECT_EQ(read_file(path), before);
  // Nothing but the checkpoint is left in the directory.
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir)) entries.push_back(e.path().filename().string());
  EXPECT_EQ(entries, std::vector<std::string>{"ckpt.pt"});
  // A missing directory is an I/O error, and nothing is created.
  try {
    save_torch_file(dir + "/missing/x.pt", *first);
    FAIL();
  } catch (const libreyolo::RuntimeError& e) {
    EXPECT_EQ(e.code(), "io_error");
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir + "/missing"));
}

TEST(PickleWrite, RefusesWhatItCannotWrite) {
  auto expect_refused = [](const PyValue& v, const std::string& why) {
    try {
      save_torch_bytes(v);
      ADD_FAILURE() << "saved: " << why;
    } catch (const ModelError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  expect_refused(*str("\xc3"), "not valid UTF-8");
  expect_refused(*ten(torch::Tensor()), "undefined tensor");
  expect_refused(*ten(torch::eye(3).to_sparse()), "dense");
  const auto f = torch::ones({4});
  expect_refused(*PyValue::new_list({ten(f), ten(f.view(torch::kInt))}), "different dtypes");
  auto self = PyValue::new_list();
  self->items.push_back(self);
  expect_refused(*self, "nested deeper than 512");
  self->items.clear();  // break the cycle so the test does not leak
  auto key = PyValue::new_dict();
  key->dict.emplace_back(PyValue::new_list(), num(1));
  expect_refused(*key, "unhashable dict key");
}
