// Dataset YAML resolution.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <libreyolo/errors.hpp>

#include "data/dataset_yaml.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using namespace libreyolo;
using namespace libreyolo::data;

namespace {

void touch(const fs::path& p, const std::string& text = "") {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

std::string error_code_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code() + "/" + std::to_string(e.exit_code());
  }
  return "no error";
}

}  // namespace

TEST(DataYaml, RelativePathPrefersDatasetsDirThenYamlFolder) {
  const fs::path tmp = test::temp_dir("yaml_rel");
  touch(tmp / "cfg" / "data.yaml", "path: ds\ntrain: images/train\nval: images/val\nnames: [a, b]\n");
  touch(tmp / "cfg" / "ds" / "images" / "train" / "x.jpg");
  {
    // Not under the datasets dir: relative to the YAML's folder.
    test::ScopedEnv env("LIBREYOLO_DATASETS_DIR", (tmp / "nowhere").string());
    const DatasetSpec spec = load_dataset_yaml((tmp / "cfg" / "data.yaml").string());
    EXPECT_EQ(spec.root, (tmp / "cfg" / "ds").string());
    EXPECT_EQ(spec.splits.at("train").at(0), (tmp / "cfg" / "ds" / "images" / "train").string());
    EXPECT_EQ(spec.nc, 2);
    EXPECT_EQ(spec.names, (std::vector<std::string>{"a", "b"}));
  }
  {
    // Present under $LIBREYOLO_DATASETS_DIR: that one wins.
    fs::create_directories(tmp / "store" / "ds");
    test::ScopedEnv env("LIBREYOLO_DATASETS_DIR", (tmp / "store").string());
    const DatasetSpec spec = load_dataset_yaml((tmp / "cfg" / "data.yaml").string());
    EXPECT_EQ(spec.root, (tmp / "store" / "ds").string());
  }
}

TEST(DataYaml, DefaultDatasetsDirIsHomeDatasets) {
  test::ScopedEnv env("LIBREYOLO_DATASETS_DIR", "");
  test::ScopedEnv home("HOME", "/some/home");
  EXPECT_EQ(datasets_dir(), "/some/home/datasets");
}

TEST(DataYaml, AbsolutePathAndNoPath) {
  const fs::path tmp = test::temp_dir("yaml_abs");
  touch(tmp / "a.yaml", "path: " + (tmp / "root").string() + "\ntrain: t\nnames: {0: cat, 2: dog}\n");
  const DatasetSpec a = load_dataset_yaml((tmp / "a.yaml").string());
  EXPECT_EQ(a.root, (tmp / "root").string());
  EXPECT_EQ(a.splits.at("train").at(0), (tmp / "root" / "t").string());
  // {int: name} with a gap: the gap gets a placeholder, nc = highest id + 1.
  EXPECT_EQ(a.names, (std::vector<std::string>{"cat", "class1", "dog"}));
  EXPECT_EQ(a.nc, 3);

  touch(tmp / "sub" / "b.yaml", "train: images\nval: [v1, " + (tmp / "v2").string() + "]\nnc: 2\n");
  const DatasetSpec b = load_dataset_yaml((tmp / "sub" / "b.yaml").string());
  EXPECT_EQ(b.root, (tmp / "sub").string());
  ASSERT_EQ(b.splits.at("val").size(), 2u);
  EXPECT_EQ(b.splits.at("val")[0], (tmp / "sub" / "v1").string());
  EXPECT_EQ(b.splits.at("val")[1], (tmp / "v2").string());
  EXPECT_EQ(b.names, (std::vector<std::string>{"class0", "class1"}));
  EXPECT_FALSE(b.has_split("test"));
}

TEST(DataYaml, DirectoryScanIsRecursiveSortedAndFiltered) {
  const fs::path tmp = test::temp_dir("yaml_scan");
  touch(tmp / "images" / "train" / "b.jpg");
  touch(tmp / "images" / "train" / "a.PNG");
  touch(tmp / "images" / "train" / "sub" / "c.jpeg");
  touch(tmp / "images" / "train" / "notes.txt");
  touch(tmp / "images" / "train" / "d.json");
  touch(tmp / "data.yaml", "train: images/train\nnames: [x]\n");
  const auto imgs = list_split_images(load_dataset_yaml((tmp / "data.yaml").string()), "train");
  const fs::path d = tmp / "images" / "train";
  EXPECT_EQ(imgs, (std::vector<std::string>{(d / "a.PNG").string(), (d / "b.jpg").string(),
                                            (d / "sub" / "c.jpeg").string()}));
}

TEST(DataYaml, TxtListsAndListsOfSources) {
  const fs::path tmp = test::temp_dir("yaml_txt");
  touch(tmp / "imgs" / "one.jpg");
  touch(tmp / "more" / "two.png");
  touch(tmp / "lists" / "train.txt", "# comment\n../imgs/one.jpg\n\n  ./x/three.jpg  \n" +
                                         (tmp / "abs.jpg").string() + "\n");
  touch(tmp / "data.yaml", "train: [lists/train.txt, more]\nnames: [x]\n");
  const auto imgs = list_split_images(load_dataset_yaml((tmp / "data.yaml").string()), "train");
  EXPECT_EQ(imgs, (std::vector<std::string>{(tmp / "imgs" / "one.jpg").string(),
                                            (tmp / "lists" / "x" / "three.jpg").string(),
                                            (tmp / "abs.jpg").string(),
                                            (tmp / "more" / "two.png").string()}));
}

TEST(DataYaml, MissingThingsAreDataErrors) {
  const fs::path tmp = test::temp_dir("yaml_err");
  EXPECT_EQ(error_code_of([&] { load_dataset_yaml((tmp / "nope.yaml").string()); }),
            "data_not_found/3");
  touch(tmp / "d.yaml", "train: images/train\nval: images/val\nnames: [x]\n");
  touch(tmp / "images" / "val" / "readme.md");
  const DatasetSpec spec = load_dataset_yaml((tmp / "d.yaml").string());
  // Split path that does not exist; split absent from the YAML; split without images.
  EXPECT_EQ(error_code_of([&] { list_split_images(spec, "train"); }), "data_not_found/3");
  EXPECT_EQ(error_code_of([&] { list_split_images(spec, "test"); }), "data_not_found/3");
  EXPECT_EQ(error_code_of([&] { list_split_images(spec, "val"); }), "data_invalid/3");
  touch(tmp / "bad.yaml", "train: [unclosed\n");
  EXPECT_EQ(error_code_of([&] { load_dataset_yaml((tmp / "bad.yaml").string()); }), "data_invalid/3");
  touch(tmp / "nonames.yaml", "train: images/train\n");
  EXPECT_EQ(error_code_of([&] { load_dataset_yaml((tmp / "nonames.yaml").string()); }),
            "data_invalid/3");
  touch(tmp / "badnc.yaml", "train: a\nnc: many\n");
  EXPECT_EQ(error_code_of([&] { load_dataset_yaml((tmp / "badnc.yaml").string()); }), "data_invalid/3");
}

TEST(DataYaml, ANameThatIsNotTextIsADataErrorNamingTheFileAndTheEntry) {
  const fs::path dir = test::temp_dir("yaml_names");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"names: [cat, [dog, wolf]]\n", "names entry 1 must be a name (text), not a list"},
      {"names: {0: cat, 1: {a: b}}\n", "names id 1 must be a name (text), not a mapping"},
      {"names: {[0]: cat}\n", "(got 'a list or mapping')"},
  };
  for (const auto& [text, says] : cases) {
    const fs::path yaml = dir / "data.yaml";
    touch(yaml, "path: " + dir.string() + "\ntrain: images\nval: images\n" + text);
    try {
      load_dataset_yaml(yaml.string());
      ADD_FAILURE() << text << " accepted";
    } catch (const DataError& e) {
      EXPECT_EQ(e.exit_code(), 3);
      const std::string m = e.what();
      EXPECT_NE(m.find(yaml.string()), std::string::npos) << m;
      EXPECT_NE(m.find(says), std::string::npos) << m;
    }
  }
}
