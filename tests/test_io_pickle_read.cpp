// The torch.save reader on real files: the reference fixtures and Python-written files of
// varied content (tests/python/make_pickles.py).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "pickle_test_util.hpp"

namespace fs = std::filesystem;
using libreyolo::ModelError;
using namespace libreyolo::io;
using namespace libreyolo::test;

namespace {

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream ss(line);
  while (std::getline(ss, cur, sep)) out.push_back(cur);
  return out;
}

std::string shape_str(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

std::string dtype_str(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat: return "float32";
    case torch::kLong: return "int64";
    default: return c10::toString(t.scalar_type());
  }
}

const PyValue& entry(const PyValue& d, const std::string& key) {
  auto v = d.get(key);
  if (!v) throw std::runtime_error("missing key " + key);
  return *v;
}

}  // namespace

TEST(PickleRead, FixtureCheckpointMatchesReference) {
  LY_REQUIRE_FIXTURES(fx);
  const std::string path = fx + "/yolo9t_nc80_s320.pt";
  PyValuePtr root = load_torch_file(path);
  ASSERT_TRUE(root->is_dict());
  EXPECT_FALSE(root->ordered);
  EXPECT_EQ(entry(*root, "schema_version").as_string(), "1.0");
  EXPECT_EQ(entry(*root, "model_family").as_string(), "yolo9");
  EXPECT_EQ(entry(*root, "size").as_string(), "t");
  EXPECT_EQ(entry(*root, "task").as_string(), "detect");
  EXPECT_EQ(entry(*root, "nc").as_int(), 80);
  EXPECT_EQ(entry(*root, "imgsz").as_int(), 320);
  EXPECT_FALSE(entry(*root, "libreyolo_version").as_string().empty());
  const PyValue& names = entry(*root, "names");
  ASSERT_EQ(names.dict.size(), 80u);
  for (size_t k = 0; k < names.dict.size(); ++k) {
    EXPECT_EQ(names.dict[k].first->kind, PyValue::Kind::Int);
    EXPECT_EQ(names.dict[k].first->i, static_cast<int64_t>(k));
    EXPECT_TRUE(names.dict[k].second->is_string());
  }

  const PyValue& model = entry(*root, "model");
  EXPECT_TRUE(model.ordered);
  StateDict sd = to_state_dict(model, "model");
  ASSERT_EQ(sd.size(), 1338u);

  // Names, shapes and dtypes in file order, as listed in the reference state-dict table.
  std::ifstream tsv(std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/yolo9_state_dict_t_nc80.tsv");
  ASSERT_TRUE(tsv.good());
  std::string line;
  size_t row = 0;
  while (std::getline(tsv, line)) {
    if (line.empty() || line[0] == '#') continue;
    auto cols = split(line, '\t');
    ASSERT_EQ(cols.size(), 3u) << line;
    ASSERT_LT(row, sd.size());
    EXPECT_EQ(sd[row].first, cols[0]);
    EXPECT_EQ(shape_str(sd[row].second), cols[1]) << cols[0];
    EXPECT_EQ(dtype_str(sd[row].second), cols[2]) << cols[0];
    ++row;
  }
  EXPECT_EQ(row, sd.size());

  // Values: per-tensor sums and first elements computed by Python's torch.load.
  auto py = python_with_torch();
  if (!py) GTEST_SKIP() << "python with torch not found: values not cross-checked";
  std::string out;
  ASSERT_EQ(run_command(*py + " " + LIBREYOLO_SOURCE_DIR + "/tests/python/fixture_checksums.py " + path, &out), 0)
      << out;
  std::istringstream lines(out);
  row = 0;
  while (std::getline(lines, line)) {
    auto cols = split(line, '\t');
    if (cols.size() != 5) continue;
    ASSERT_LT(row, sd.size());
    const auto& [name, t] = sd[row++];
    ASSERT_EQ(name, cols[0]);
    const double sum = std::stod(cols[3]);
    const double first = std::stod(cols[4]);
    EXPECT_NEAR(t.to(torch::kDouble).sum().item<double>(), sum, 1e-9 * std::max(1.0, std::fabs(sum))) << name;
    EXPECT_EQ(t.reshape(-1)[0].to(torch::kDouble).item<double>(), first) << name;
  }
  EXPECT_EQ(row, sd.size());
}

TEST(PickleRead, FixtureExpectationsHaveReadmeShapes) {
  LY_REQUIRE_FIXTURES(fx);
  PyValuePtr root = load_torch_file(fx + "/yolo9t_nc80_s320_expect.pt");
  StateDict sd = to_state_dict(*root, "expect");
  std::map<std::string, std::vector<int64_t>> want = {
      {"input", {2, 3, 320, 320}},         {"targets", {2, 100, 5}},
      {"eval_predictions", {2, 84, 2100}}, {"train_raw_0", {2, 144, 40, 40}},
      {"train_raw_1", {2, 144, 20, 20}},   {"train_raw_2", {2, 144, 10, 10}},
      {"loss_total_loss", {1}},            {"loss_box_loss", {1}},
      {"loss_dfl_loss", {1}},              {"loss_cls_loss", {1}},
      {"bn_running_mean_after_train_forward.backbone.conv0.bn", {16}},
  };
  size_t grads = 0;
  for (const auto& [name, t] : sd) {
    EXPECT_EQ(t.scalar_type(), torch::kFloat) << name;
    EXPECT_TRUE(t.device().is_cpu());
    if (name.rfind("grad.", 0) == 0) {
      ++grads;
      continue;
    }
    auto it = want.find(name);
    ASSERT_NE(it, want.end()) << "unexpected entry " << name;
    EXPECT_EQ(t.sizes().vec(), it->second) << name;
    want.erase(it);
  }
  EXPECT_TRUE(want.empty());
  EXPECT_EQ(grads, 5u);
  const auto input = root->get("input")->tensor;
  EXPECT_GE(input.min().item<float>(), 0.0f);
  EXPECT_LE(input.max().item<float>(), 1.0f);
}

namespace {

void check_varied(const PyValue& root) {
  ASSERT_TRUE(root.is_dict());
  const std::vector<int64_t> ints = {0,      1,           -1,          255,           256,
                                     65535,  65536,       -2147483648LL, 2147483647,  2147483648LL,
                                     1LL << 40, INT64_MIN, INT64_MAX};
  const PyValue& iv = entry(root, "ints");
  ASSERT_EQ(iv.kind, PyValue::Kind::List);
  ASSERT_EQ(iv.items.size(), ints.size());
  for (size_t k = 0; k < ints.size(); ++k) {
    EXPECT_EQ(iv.items[k]->kind, PyValue::Kind::Int);
    EXPECT_EQ(iv.items[k]->i, ints[k]) << k;
  }
  const PyValue& fv = entry(root, "floats");
  ASSERT_EQ(fv.kind, PyValue::Kind::Tuple);
  ASSERT_EQ(fv.items.size(), 6u);
  EXPECT_EQ(fv.items[0]->as_float(), 0.0);
  EXPECT_FALSE(std::signbit(fv.items[0]->f));
  EXPECT_TRUE(std::signbit(fv.items[1]->f));
  EXPECT_EQ(fv.items[2]->f, 1.5);
  EXPECT_EQ(fv.items[3]->f, -2.25e-300);
  EXPECT_TRUE(std::isinf(fv.items[4]->f));
  EXPECT_EQ(fv.items[5]->f, 1e300);
  EXPECT_TRUE(std::isnan(entry(root, "nan").f));
  EXPECT_EQ(entry(root, "text").as_string(), "h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9f\x90\x8d");
  EXPECT_EQ(entry(root, "empty").as_string(), "");
  EXPECT_EQ(entry(root, "raw").kind, PyValue::Kind::Bytes);
  EXPECT_EQ(entry(root, "raw").s, std::string("\x00\x01\xfe\xff" "abc", 7));
  const PyValue& flags = entry(root, "flags");
  ASSERT_EQ(flags.items.size(), 3u);
  EXPECT_EQ(flags.items[0]->kind, PyValue::Kind::Bool);
  EXPECT_TRUE(flags.items[0]->b);
  EXPECT_FALSE(flags.items[1]->as_bool());
  EXPECT_TRUE(flags.items[2]->is_none());

  const PyValue& nested = entry(root, "nested");
  const PyValue& a = entry(nested, "a");
  ASSERT_EQ(a.items.size(), 3u);
  EXPECT_EQ(a.items[0]->as_int(), 1);
  EXPECT_EQ(a.items[1]->kind, PyValue::Kind::Tuple);
  EXPECT_EQ(a.items[1]->items[1]->as_int(), 3);
  const PyValue& b = entry(*a.items[2], "b");
  ASSERT_EQ(b.items.size(), 3u);
  EXPECT_EQ(b.items[0]->kind, PyValue::Kind::List);
  EXPECT_EQ(b.items[1]->kind, PyValue::Kind::Dict);
  EXPECT_EQ(b.items[2]->kind, PyValue::Kind::Tuple);
  EXPECT_EQ(entry(nested, "t1").items.size(), 1u);

  const PyValue& names = entry(root, "names");
  ASSERT_EQ(names.dict.size(), 3u);
  EXPECT_EQ(names.dict[1].first->i, 1);
  EXPECT_EQ(names.dict[1].second->s, "bicycle");
  const PyValue& od = entry(root, "od");
  EXPECT_TRUE(od.ordered);
  ASSERT_EQ(od.dict.size(), 2u);
  EXPECT_EQ(od.dict[0].first->s, "z");
  EXPECT_EQ(od.dict[1].second->as_int(), 2);
  EXPECT_FALSE(names.ordered);

  // A module state_dict (OrderedDict with a _metadata BUILD).
  const PyValue& sdv = entry(root, "sd");
  EXPECT_TRUE(sdv.ordered);
  StateDict sd = to_state_dict(sdv, "sd");
  std::vector<std::string> keys;
  for (auto& kv : sd) keys.push_back(kv.first);
  EXPECT_EQ(keys, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                            "1.running_var", "1.num_batches_tracked"}));
  EXPECT_TRUE(torch::equal(sd[0].second, torch::arange(2, torch::kFloat).reshape({2, 1, 1, 1}) + 0.5));
  EXPECT_EQ(sd[6].second.scalar_type(), torch::kLong);
  EXPECT_EQ(sd[6].second.dim(), 0);
  EXPECT_EQ(sd[6].second.item<int64_t>(), 0);

  auto T = [&](const char* k) { return entry(root, k).tensor; };
  const torch::Tensor base = torch::arange(24, torch::kFloat).reshape({4, 6});
  EXPECT_TRUE(torch::equal(T("f32"), base));
  EXPECT_TRUE(torch::equal(T("f64"), torch::arange(5, torch::kDouble) / 4));
  auto f16 = T("f16");
  EXPECT_EQ(f16.scalar_type(), torch::kHalf);
  EXPECT_TRUE(torch::equal(f16.to(torch::kFloat), torch::tensor({0.5f, -2.0f, 65504.0f})));
  auto bf16 = T("bf16");
  EXPECT_EQ(bf16.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(bf16.to(torch::kFloat), torch::tensor({1.0f, -3.5f, 256.0f})));
  EXPECT_TRUE(torch::equal(T("i64"), torch::tensor({-(int64_t(1) << 62), int64_t(0), int64_t(1) << 62})));
  EXPECT_TRUE(torch::equal(T("i32"), torch::arange(-3, 3, torch::kInt)));
  EXPECT_TRUE(torch::equal(T("i16"), torch::tensor({-300, 300}, torch::kShort)));
  EXPECT_TRUE(torch::equal(T("i8"), torch::tensor({-128, 127}, torch::kChar)));
  EXPECT_TRUE(torch::equal(T("u8"), torch::tensor({0, 200, 255}, torch::kByte)));
  EXPECT_TRUE(torch::equal(T("b"), torch::tensor({true, false, true})));
  auto c64 = T("c64");
  EXPECT_EQ(c64.scalar_type(), torch::kComplexFloat);
  EXPECT_TRUE(torch::equal(torch::view_as_real(c64), torch::tensor({{1.f, 2.f}, {-3.f, -4.f}})));
  auto u16 = T("u16");
  EXPECT_EQ(u16.scalar_type(), torch::kUInt16);
  EXPECT_TRUE(torch::equal(u16.to(torch::kInt), torch::tensor({1, 65535}, torch::kInt)));
  EXPECT_EQ(T("scalar").dim(), 0);
  EXPECT_EQ(T("scalar").item<float>(), 3.25f);
  EXPECT_EQ(T("zero_size").sizes().vec(), (std::vector<int64_t>{0, 3}));

  // Views keep their layout and share memory with the tensors they came from.
  auto tr = T("transposed");
  EXPECT_EQ(tr.strides().vec(), (std::vector<int64_t>{1, 6}));
  EXPECT_TRUE(torch::equal(tr, base.t()));
  auto st = T("strided");
  EXPECT_EQ(st.storage_offset(), 6);
  EXPECT_TRUE(torch::equal(st, base.slice(0, 1).slice(1, 0, 6, 2)));
  auto f32 = T("f32");
  EXPECT_TRUE(tr.is_alias_of(f32));
  EXPECT_TRUE(st.is_alias_of(f32));
  EXPECT_TRUE(T("same_as_f32").is_alias_of(f32));
  EXPECT_FALSE(T("f64").is_alias_of(f32));
  f32.index_put_({1, 2}, -100.0f);
  EXPECT_EQ(tr.index({2, 1}).item<float>(), -100.0f);
  EXPECT_EQ(st.index({0, 1}).item<float>(), -100.0f);

  EXPECT_TRUE(torch::equal(T("param"), torch::full({2, 2}, 7.0f)));
  EXPECT_EQ(entry(root, "device").as_string(), "cuda:1");
  const PyValue& size = entry(root, "size");
  ASSERT_EQ(size.kind, PyValue::Kind::Tuple);
  EXPECT_EQ(size.items[1]->as_int(), 3);
  const PyValue& set = entry(root, "set");
  ASSERT_EQ(set.items.size(), 1u);
  EXPECT_EQ(set.items[0]->as_int(), 5);
  EXPECT_EQ(entry(root, "barray").s, "xy");
}

}  // namespace

TEST(PickleRead, PythonVariedContentAllProtocols) {
  LY_REQUIRE_PYTHON_PICKLES(pk);
  for (int proto : {2, 4, 5}) {
    SCOPED_TRACE("protocol " + std::to_string(proto));
    const std::string path = pk.dir + "/varied_p" + std::to_string(proto) + ".pt";
    check_varied(*load_torch_file(path));
    // The in-memory path reads the same.
    check_varied(*load_torch_bytes(read_file(path), path));
  }
}

TEST(PickleRead, LargeDictWithLongMemoIndices) {
  LY_REQUIRE_PYTHON_PICKLES(pk);
  PyValuePtr root = load_torch_file(pk.dir + "/many.pt");
  StateDict sd = to_state_dict(*root);
  ASSERT_EQ(sd.size(), 1500u);
  for (size_t k = 0; k < sd.size(); ++k) {
    ASSERT_EQ(sd[k].first, "k" + std::to_string(k));
    ASSERT_EQ(sd[k].second.item<float>(), static_cast<float>(k));
  }
}

TEST(PickleRead, AnyStorageLocationLoadsOnCpu) {
  LY_REQUIRE_PYTHON_PICKLES(pk);
  PyValuePtr cuda = load_torch_file(pk.dir + "/cuda_location.pt");
  auto w = cuda->get("w")->tensor;
  auto v = cuda->get("v")->tensor;
  EXPECT_TRUE(w.device().is_cpu());
  EXPECT_TRUE(torch::equal(w, torch::arange(6, torch::kFloat).reshape({2, 3})));
  EXPECT_TRUE(torch::equal(v, torch::arange(2, 6, torch::kFloat)));
  EXPECT_TRUE(v.is_alias_of(w));
  PyValuePtr mps = load_torch_file(pk.dir + "/mps_location.pt");
  EXPECT_TRUE(torch::equal(mps->get("w")->tensor, torch::arange(6, torch::kFloat)));
}

TEST(PickleRead, LegacyFormatIsRefusedClearly) {
  LY_REQUIRE_PYTHON_PICKLES(pk);
  try {
    load_torch_file(pk.dir + "/legacy.pt");
    FAIL() << "legacy file loaded";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("legacy"), std::string::npos) << e.what();
  }
}

TEST(PickleRead, MissingFileHasItsOwnCode) {
  try {
    load_torch_file("/nonexistent/dir/x.pt");
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_EQ(e.code(), "checkpoint_not_found");
    EXPECT_EQ(e.exit_code(), 4);
  }
}

// Files whose pickles would run os.system / eval / subprocess.Popen are refused by name and
// nothing runs: the marker files they would create stay absent.
TEST(PickleRead, HostileGlobalsAreRefusedAndNeverRun) {
  LY_REQUIRE_PYTHON_PICKLES(pk);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"evil_system.pt", "'posix.system'"},
      {"evil_eval.pt", "'builtins.eval'"},
      {"evil_popen.pt", "'subprocess.Popen'"},
  };
  for (const auto& [file, global] : cases) {
    for (bool from_memory : {false, true}) {
      const std::string path = pk.dir + "/" + file;
      try {
        if (from_memory) {
          load_torch_bytes(read_file(path), path);
        } else {
          load_torch_file(path);
        }
        FAIL() << file << " loaded";
      } catch (const ModelError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("disallowed Python global " + global), std::string::npos) << msg;
        EXPECT_NE(msg.find(path), std::string::npos) << msg;
      }
    }
  }
  for (const char* marker : {"system", "eval", "popen"}) {
    EXPECT_FALSE(fs::exists(pk.marker_dir + "/" + marker)) << marker << " ran";
  }
  // The files are really hostile: Python without weights_only runs the payload.
  auto py = python_with_torch();
  std::string out;
  ASSERT_EQ(run_command(*py + " -c \"import torch,sys; torch.load(sys.argv[1], weights_only=False)\" " + pk.dir +
                            "/evil_system.pt",
                        &out),
            0)
      << out;
  EXPECT_TRUE(fs::exists(pk.marker_dir + "/system")) << "the os.system payload did not run under Python";
  fs::remove(pk.marker_dir + "/system");
}
