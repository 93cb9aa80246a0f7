// The generic checkpoint view: state dict and metadata from LibreYOLO checkpoints and their
// variants, and writing lean checkpoints with the required v1.0 metadata.
#include <filesystem>

#include "io/checkpoint.hpp"
#include "pickle_test_util.hpp"

namespace fs = std::filesystem;
using libreyolo::ModelError;
using namespace libreyolo::io;
using namespace libreyolo::test;

namespace {

StateDict small_model() {
  return {{"backbone.conv.weight", torch::arange(6, torch::kFloat).reshape({2, 3})},
          {"head.bias", torch::zeros({3}, torch::kHalf)}};
}

CheckpointMeta small_meta() {
  CheckpointMeta m;
  m.family = "yolo9";
  m.size = "t";
  m.task = "detect";
  m.nc = 3;
  m.names = std::vector<std::string>{"cat", "dog", "b\xc3\xa4r"};
  m.imgsz = 640;
  return m;
}

// Writes `root` with the plain writer and reads it back as a checkpoint.
Checkpoint reread(const PyValuePtr& root) { return checkpoint_from_value(load_torch_bytes(save_torch_bytes(*root)), "t.pt"); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ModelError& e) {
    return e.what();
  }
  return "<no error>";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)

}  // namespace

TEST(Checkpoint, ReadsTheFixture) {
  LY_REQUIRE_FIXTURES(fx);
  Checkpoint ck = read_checkpoint(fx + "/yolo9t_nc80_s320.pt");
  ASSERT_EQ(ck.model.size(), 1338u);
  EXPECT_EQ(ck.model.front().first, "backbone.conv0.conv.weight");
  EXPECT_EQ(ck.model.front().second.sizes().vec(), (std::vector<int64_t>{16, 3, 3, 3}));
  EXPECT_EQ(ck.meta.family, "yolo9");
  EXPECT_EQ(ck.meta.size, "t");
  EXPECT_EQ(ck.meta.task, "detect");
  EXPECT_EQ(ck.meta.nc, 80);
  EXPECT_EQ(ck.meta.imgsz, 320);
  ASSERT_TRUE(ck.meta.names.has_value());
  ASSERT_EQ(ck.meta.names->size(), 80u);
  EXPECT_EQ(ck.meta.names->at(0), "class_0");
  EXPECT_EQ(ck.meta.names->at(79), "class_79");
  EXPECT_EQ(ck.root->get("schema_version")->as_string(), "1.0");
  // The fixture passes the writer's own validation.
  EXPECT_NO_THROW(validate_checkpoint(*ck.root, "fixture"));
}

TEST(Checkpoint, StateDictSources) {
  const StateDict sd = small_model();
  // `model` wins over `state_dict`.
  auto both = PyValue::new_dict();
  both->set("state_dict", from_state_dict({{"other", torch::ones({1})}}));
  both->set("model", from_state_dict(sd));
  EXPECT_EQ(reread(both).model.front().first, "backbone.conv.weight");
  // `state_dict` when there is no `model`.
  auto only_sd = PyValue::new_dict();
  only_sd->set("state_dict", from_state_dict(sd));
  only_sd->set("epoch", PyValue::from_int(3));
  Checkpoint a = reread(only_sd);
  ASSERT_EQ(a.model.size(), 2u);
  EXPECT_TRUE(torch::equal(a.model[0].second, sd[0].second));
  EXPECT_FALSE(a.meta.nc.has_value());
  EXPECT_FALSE(a.meta.names.has_value());
  EXPECT_EQ(a.root->get("epoch")->as_int(), 3);
  // A bare state dict, saved from a DataParallel wrapper.
  StateDict wrapped;
  for (const auto& [k, t] : sd) wrapped.emplace_back("module." + k, t);
  Checkpoint b = reread(from_state_dict(wrapped));
  ASSERT_EQ(b.model.size(), 2u);
  EXPECT_EQ(b.model[0].first, "backbone.conv.weight");
  EXPECT_EQ(b.model[1].first, "head.bias");
  EXPECT_FALSE(b.meta.family.has_value());
}

TEST(Checkpoint, RefusesFilesWithoutAStateDict) {
  auto meta_only = PyValue::new_dict();
  meta_only->set("nc", PyValue::from_int(3));
  EXPECT_CONTAINS(error_of([&] { reread(meta_only); }), "holds no state dict");
  auto bad_model = PyValue::new_dict();
  auto m = from_state_dict(small_model());
  m->set("extra", PyValue::from_int(1));
  bad_model->set("model", m);
  EXPECT_CONTAINS(error_of([&] { reread(bad_model); }), "['extra'] is not a tensor");
  EXPECT_CONTAINS(error_of([&] { checkpoint_from_value(PyValue::new_list(), "x.pt"); }), "does not hold a dict");
  StateDict dup = {{"module.a", torch::ones({1})}, {"a", torch::ones({1})}};
  EXPECT_CONTAINS(error_of([&] { reread(from_state_dict(dup)); }), "duplicate state dict entry 'a'");
}

TEST(Checkpoint, MetadataVariants) {
  auto root = make_checkpoint(small_model(), small_meta());
  // names as a list, and as a dict with string keys in any order.
  root->set("names", PyValue::new_list({PyValue::from_string("x"), PyValue::from_string("y")}));
  EXPECT_EQ(reread(root).meta.names, (std::vector<std::string>{"x", "y"}));
  auto names = PyValue::new_dict();
  names->set(PyValue::from_string("1"), PyValue::from_string("y"));
  names->set(PyValue::from_string("0"), PyValue::from_string("x"));
  root->set("names", names);
  EXPECT_EQ(reread(root).meta.names, (std::vector<std::string>{"x", "y"}));
  // imgsz as a square pair.
  root->set("imgsz", PyValue::new_list({PyValue::from_int(416), PyValue::from_int(416)}));
  EXPECT_EQ(reread(root).meta.imgsz, 416);
  root->set("imgsz", PyValue::new_list({PyValue::from_int(416), PyValue::from_int(320)}));
  EXPECT_FALSE(reread(root).meta.imgsz.has_value());
  // None reads as absent.
  root->set("task", PyValue::none());
  EXPECT_FALSE(reread(root).meta.task.has_value());
  // Wrong types are errors naming the field.
  root->set("nc", PyValue::from_string("80"));
  EXPECT_CONTAINS(error_of([&] { reread(root); }), "'nc' must be an int");
  root->set("nc", PyValue::from_int(2));
  auto gap = PyValue::new_dict();
  gap->set(PyValue::from_int(0), PyValue::from_string("x"));
  gap->set(PyValue::from_int(2), PyValue::from_string("z"));
  root->set("names", gap);
  EXPECT_CONTAINS(error_of([&] { reread(root); }), "'names' key 2 is not a class id");
  root->set("names", PyValue::from_int(5));
  EXPECT_CONTAINS(error_of([&] { reread(root); }), "'names' must be a dict or a list");
}

TEST(Checkpoint, WritesLeanCheckpointsPythonAccepts) {
  const std::string path = temp_dir("ckpt") + "/lean.pt";
  PyValuePtr root = make_checkpoint(small_model(), small_meta());
  write_checkpoint(path, *root);
  Checkpoint ck = read_checkpoint(path);
  EXPECT_EQ(ck.meta.family, "yolo9");
  EXPECT_EQ(ck.meta.nc, 3);
  EXPECT_EQ(ck.meta.names, small_meta().names);
  EXPECT_EQ(ck.meta.imgsz, 640);
  ASSERT_EQ(ck.model.size(), 2u);
  EXPECT_TRUE(torch::equal(ck.model[1].second, torch::zeros({3}, torch::kHalf)));
  EXPECT_TRUE(ck.root->get("model")->ordered);

  auto py = python_with_torch();
  if (!py) GTEST_SKIP() << "python with torch not found: not checked by torch.load";
  std::string out;
  const std::string script = std::string(LIBREYOLO_SOURCE_DIR) + "/tests/python/check_cpp_file.py";
  EXPECT_EQ(run_command(*py + " " + script + " lean " + path, &out), 0) << out;
}

TEST(Checkpoint, WriteValidatesRequiredMetadata) {
  const std::string dir = temp_dir("ckpt");
  struct Case {
    std::function<void(PyValue&)> damage;
    const char* why;
  };
  const std::vector<Case> cases = {
      {[](PyValue& r) { r.dict.erase(r.dict.begin()); }, "'model' must be"},
      {[](PyValue& r) { r.set("model", PyValue::new_dict(true)); }, "'model' must be"},
      {[](PyValue& r) { r.get("model")->set("x", PyValue::from_int(1)); }, "'model' must be"},
      {[](PyValue& r) { r.set("schema_version", PyValue::from_string("2.0")); }, "'schema_version' must be \"1.0\""},
      {[](PyValue& r) { r.set("libreyolo_version", PyValue::none()); }, "'libreyolo_version'"},
      {[](PyValue& r) { r.set("model_family", PyValue::from_string("")); }, "'model_family'"},
      {[](PyValue& r) { r.set("size", PyValue::from_int(1)); }, "'size'"},
      {[](PyValue& r) { r.set("task", PyValue::none()); }, "'task'"},
      {[](PyValue& r) { r.set("nc", PyValue::from_int(0)); }, "'nc' must be an int > 0"},
      {[](PyValue& r) { r.set("nc", PyValue::from_bool(true)); }, "'nc' must be an int > 0"},
      {[](PyValue& r) { r.set("imgsz", PyValue::from_float(640)); }, "'imgsz' must be an int > 0"},
      {[](PyValue& r) { r.set("nc", PyValue::from_int(4)); }, "'names' has 3 entries for nc=4"},
      {[](PyValue& r) { r.set("names", PyValue::new_list()); }, "'names' must be a dict"},
      {[](PyValue& r) { r.get("names")->dict[1].first = PyValue::from_int(7); }, "'names' key 7"},
      {[](PyValue& r) { r.get("names")->dict[1].first = PyValue::from_int(0); }, "'names' key 0"},
      {[](PyValue& r) { r.get("names")->dict[1].first = PyValue::from_string("1"); }, "'names' key '1'"},
      {[](PyValue& r) { r.get("names")->dict[2].second = PyValue::none(); }, "values must be strings"},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    PyValuePtr root = make_checkpoint(small_model(), small_meta());
    cases[k].damage(*root);
    const std::string path = dir + "/case" + std::to_string(k) + ".pt";
    EXPECT_CONTAINS(error_of([&] { write_checkpoint(path, *root); }), cases[k].why);
    EXPECT_FALSE(fs::exists(path)) << k;
  }
  // Training extras are allowed next to the required fields.
  PyValuePtr root = make_checkpoint(small_model(), small_meta());
  root->set("epoch", PyValue::from_int(4));
  root->set("optimizer", PyValue::new_dict());
  EXPECT_NO_THROW(write_checkpoint(dir + "/extras.pt", *root));
  // make_checkpoint needs every field.
  CheckpointMeta partial = small_meta();
  partial.imgsz.reset();
  EXPECT_CONTAINS(error_of([&] { make_checkpoint(small_model(), partial); }), "'imgsz'");
  partial = small_meta();
  partial.nc = 5;
  EXPECT_CONTAINS(error_of([&] { make_checkpoint(small_model(), partial); }), "3 names for nc=5");
}

TEST(Checkpoint, DamagedBytesAreRefusedNotLoaded) {
  // One flipped bit inside a tensor's record (the zip structure intact) or inside data.pkl: the
  // record's CRC-32 no longer matches, and the file is refused with the record named instead of
  // loading as other weights.
  StateDict model = small_model();
  model.emplace_back("neck.marker", torch::full({64}, 1234.5f));
  PyValuePtr root = make_checkpoint(model, small_meta());
  const std::string good = save_torch_bytes(*root);
  ASSERT_NO_THROW(checkpoint_from_value(load_torch_bytes(good, "good.pt"), "good.pt"));
  // The marker's bytes: 1234.5f repeated.
  const float v = 1234.5f;
  const std::string pattern(reinterpret_cast<const char*>(&v), 4);
  const size_t at = good.find(pattern + pattern + pattern + pattern);
  ASSERT_NE(at, std::string::npos);
  std::string bad = good;
  bad[at + 4 * 30 + 1] ^= 0x10;
  EXPECT_CONTAINS(error_of([&] { load_torch_bytes(bad, "bad.pt"); }), "is damaged (CRC-32");
  // The pickle: the class name's bytes.
  const size_t pkl = good.find("collections");
  ASSERT_NE(pkl, std::string::npos);
  std::string bad_pkl = good;
  bad_pkl[pkl + 2] ^= 0x01;
  EXPECT_CONTAINS(error_of([&] { load_torch_bytes(bad_pkl, "bad.pt"); }), "data.pkl' is damaged");
}
