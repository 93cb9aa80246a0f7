// The generated shapes dataset: layout, determinism and labels that match the pixels.
#include <filesystem>
#include <fstream>
#include <libreyolo/errors.hpp>
#include <sstream>

#include "data/dataset.hpp"
#include "data/dataset_yaml.hpp"
#include "data/synthetic.hpp"
#include "io/image.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using namespace libreyolo;
using namespace libreyolo::data;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

SyntheticOptions small_options(uint64_t seed) {
  SyntheticOptions o;
  o.train_images = 12;
  o.val_images = 4;
  o.width = 128;
  o.height = 96;
  o.seed = seed;
  return o;
}

}  // namespace

TEST(DataSynthetic, WritesTheYoloLayoutAndAReadableYaml) {
  const fs::path dir = test::temp_dir("synth_layout");
  const std::string yaml = generate_synthetic_dataset(dir.string(), small_options(1));
  EXPECT_EQ(yaml, (dir / "data.yaml").string());
  const DatasetSpec spec = load_dataset_yaml(yaml);
  EXPECT_EQ(spec.nc, 4);
  EXPECT_EQ(spec.names, (std::vector<std::string>{"circle", "square", "triangle", "cross"}));
  const auto train = list_split_images(spec, "train");
  const auto val = list_split_images(spec, "val");
  ASSERT_EQ(train.size(), 12u);
  ASSERT_EQ(val.size(), 4u);
  EXPECT_EQ(train[0], (dir / "images" / "train" / "000000.jpg").string());
  EXPECT_TRUE(fs::exists(dir / "labels" / "val" / "000003.txt"));
  const io::ImageSize sz = io::probe_image_size(train[5]);
  EXPECT_EQ(sz.width, 128);
  EXPECT_EQ(sz.height, 96);
}

TEST(DataSynthetic, AFolderGeneratedAgainHoldsOnlyTheNewSet) {
  const fs::path dir = test::temp_dir("synth_again");
  generate_synthetic_dataset(dir.string(), small_options(1));
  SyntheticOptions fewer = small_options(1);
  fewer.train_images = 5;
  fewer.val_images = 2;
  const DatasetSpec spec = load_dataset_yaml(generate_synthetic_dataset(dir.string(), fewer));
  EXPECT_EQ(list_split_images(spec, "train").size(), 5u);
  EXPECT_EQ(list_split_images(spec, "val").size(), 2u);
  EXPECT_FALSE(fs::exists(dir / "labels" / "train" / "000007.txt"));
}

TEST(DataSynthetic, SameSeedSameFilesOtherSeedOtherFiles) {
  const fs::path a = test::temp_dir("synth_a"), b = test::temp_dir("synth_b"), c = test::temp_dir("synth_c");
  SyntheticOptions oa = small_options(7);
  oa.threads = 1;
  SyntheticOptions ob = small_options(7);
  ob.threads = 3;
  generate_synthetic_dataset(a.string(), oa);
  generate_synthetic_dataset(b.string(), ob);
  generate_synthetic_dataset(c.string(), small_options(8));
  for (const char* f : {"images/train/000003.jpg", "labels/train/000003.txt", "images/val/000001.jpg"}) {
    EXPECT_EQ(read_file(a / f), read_file(b / f)) << f;
    EXPECT_NE(read_file(a / f), read_file(c / f)) << f;
  }
}

TEST(DataSynthetic, LabelsAreInsideDisjointAndOnTheShapes) {
  const fs::path dir = test::temp_dir("synth_labels");
  SyntheticOptions o = small_options(3);
  o.train_images = 30;
  o.num_classes = 8;
  const DatasetSpec spec = load_dataset_yaml(generate_synthetic_dataset(dir.string(), o));
  DatasetOptions d;
  d.imgsz = 128;
  d.num_classes = 8;
  YoloDataset ds(list_split_images(spec, "train"), d);
  ASSERT_EQ(ds.size(), 30);
  std::vector<int> per_class(8, 0);
  double inside_sat = 0, outside_sat = 0;
  int64_t inside_n = 0, outside_n = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto boxes = ds.original_boxes(i);
    EXPECT_GE(boxes.size(), 1u);
    EXPECT_LE(boxes.size(), 4u);
    const torch::Tensor img = io::decode_image(ds.image_path(i));
    auto px = img.accessor<uint8_t, 3>();
    std::vector<uint8_t> mask(128 * 96, 0);
    for (size_t k = 0; k < boxes.size(); ++k) {
      const Box& b = boxes[k];
      per_class[static_cast<size_t>(b.cls)]++;
      EXPECT_GE(b.x1, 0.0);
      EXPECT_GE(b.y1, 0.0);
      EXPECT_LE(b.x2, 128.0);
      EXPECT_LE(b.y2, 96.0);
      const double w = b.x2 - b.x1, h = b.y2 - b.y1;
      EXPECT_GE(std::sqrt(w * h), 0.18 * 96 - 1);
      EXPECT_LE(std::sqrt(w * h), 0.42 * 96 + 1);
      for (size_t j = k + 1; j < boxes.size(); ++j) {
        const Box& c = boxes[j];
        const double iw = std::max(0.0, std::min(b.x2, c.x2) - std::max(b.x1, c.x1));
        const double ih = std::max(0.0, std::min(b.y2, c.y2) - std::max(b.y1, c.y1));
        EXPECT_LT(iw * ih, 1e-3);  // disjoint (up to the 6 decimals of the label file)
      }
      // Squares fill their box: saturated object colour inside, muted background outside.
      if (b.cls != 1) continue;
      for (int y = static_cast<int>(b.y1) + 2; y < static_cast<int>(b.y2) - 2; ++y)
        for (int x = static_cast<int>(b.x1) + 2; x < static_cast<int>(b.x2) - 2; ++x) {
          const int mx = std::max({px[y][x][0], px[y][x][1], px[y][x][2]});
          const int mn = std::min({px[y][x][0], px[y][x][1], px[y][x][2]});
          inside_sat += mx > 0 ? double(mx - mn) / mx : 0;
          ++inside_n;
        }
    }
    for (const Box& b : boxes)
      for (int y = std::max(0, int(b.y1) - 1); y < std::min(96, int(b.y2) + 2); ++y)
        for (int x = std::max(0, int(b.x1) - 1); x < std::min(128, int(b.x2) + 2); ++x) mask[y * 128 + x] = 1;
    for (int y = 0; y < 96; ++y)
      for (int x = 0; x < 128; ++x) {
        if (mask[y * 128 + x]) continue;
        const int mx = std::max({px[y][x][0], px[y][x][1], px[y][x][2]});
        const int mn = std::min({px[y][x][0], px[y][x][1], px[y][x][2]});
        outside_sat += mx > 0 ? double(mx - mn) / mx : 0;
        ++outside_n;
      }
  }
  ASSERT_GT(inside_n, 0);
  EXPECT_GT(inside_sat / inside_n, 0.5);
  EXPECT_LT(outside_sat / outside_n, 0.35);
  for (int k = 0; k < 8; ++k) EXPECT_GT(per_class[k], 0) << "class " << k;
}

TEST(DataSynthetic, BuiltinIsGeneratedOnceAndReused) {
  const fs::path root = test::temp_dir("synth_builtin");
  const std::string yaml = ensure_builtin_dataset(root.string());
  EXPECT_EQ(yaml, (root / "libreyolo-builtin-v1" / "data.yaml").string());
  const auto stamp = fs::last_write_time(yaml);
  EXPECT_EQ(ensure_builtin_dataset(root.string()), yaml);
  EXPECT_EQ(fs::last_write_time(yaml), stamp);
  const DatasetSpec spec = load_dataset_yaml(yaml);
  EXPECT_EQ(list_split_images(spec, "train").size(), 200u);
  EXPECT_EQ(list_split_images(spec, "val").size(), 50u);
  // No temp folder left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(root), fs::directory_iterator()), 1);
}

TEST(DataSynthetic, BadOptionsAreUsageErrors) {
  SyntheticOptions o;
  o.num_classes = 9;
  EXPECT_THROW(generate_synthetic_dataset(test::temp_dir("synth_bad"), o), UsageError);
  o.num_classes = 2;
  o.max_size = 0.99;
  EXPECT_THROW(generate_synthetic_dataset(test::temp_dir("synth_bad2"), o), UsageError);
}
