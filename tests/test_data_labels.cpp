// Label files, the label path rule and the dataset's handling of bad files.
#include <filesystem>
#include <fstream>
#include <libreyolo/errors.hpp>

#include "data/dataset.hpp"
#include "io/image.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using namespace libreyolo;
using namespace libreyolo::data;

namespace {

void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

void write_image(const fs::path& p, int h, int w, uint8_t value) {
  fs::create_directories(p.parent_path());
  io::save_image(p.string(), torch::full({h, w, 3}, value, torch::kUInt8));
}

}  // namespace

TEST(DataLabels, LabelPathRule) {
  EXPECT_EQ(label_path_for("/d/images/train/a.jpg"), "/d/labels/train/a.txt");
  EXPECT_EQ(label_path_for("/d/images/a.b.PNG"), "/d/labels/a.b.txt");
  EXPECT_EQ(label_path_for("/d/pics/a.jpg"), "/d/pics/a.txt");
  // Every "/images/" of the directory is replaced, then a trailing "/images".
  EXPECT_EQ(label_path_for("/images/x/images/b.jpg"), "/labels/x/labels/b.txt");
  EXPECT_EQ(label_path_for("/d/myimages/a.jpg"), "/d/myimages/a.txt");
}

TEST(DataLabels, ParsesBoxesAndPolygons) {
  const fs::path tmp = test::temp_dir("labels");
  write_text(tmp / "a.txt",
             "0 0.5 0.5 0.2 0.4\n"
             "\n"
             "3 0.1 0.2 0.5 0.1 0.3 0.6\n"   // polygon: x in [0.1, 0.5], y in [0.1, 0.6]
             "+1 1.0 -0.1 0.4 0.4\n");       // overhangs the top-right corner: clipped to the image
  std::vector<std::string> problems;
  const auto boxes = parse_label_file((tmp / "a.txt").string(), 200, 100, 0, &problems);
  EXPECT_TRUE(problems.empty());
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_DOUBLE_EQ(boxes[0].x1, 80.0);
  EXPECT_DOUBLE_EQ(boxes[0].y1, 30.0);
  EXPECT_DOUBLE_EQ(boxes[0].x2, 120.0);
  EXPECT_DOUBLE_EQ(boxes[0].y2, 70.0);
  EXPECT_DOUBLE_EQ(boxes[0].cls, 0.0);
  EXPECT_DOUBLE_EQ(boxes[1].cls, 3.0);
  EXPECT_NEAR(boxes[1].x1, 20.0, 1e-9);
  EXPECT_NEAR(boxes[1].y1, 10.0, 1e-9);
  EXPECT_NEAR(boxes[1].x2, 100.0, 1e-9);
  EXPECT_NEAR(boxes[1].y2, 60.0, 1e-9);
  EXPECT_NEAR(boxes[2].x1, 160.0, 1e-9);
  EXPECT_NEAR(boxes[2].y1, 0.0, 1e-9);
  EXPECT_NEAR(boxes[2].x2, 200.0, 1e-9);
  EXPECT_NEAR(boxes[2].y2, 10.0, 1e-9);
}

TEST(DataLabels, MissingAndEmptyFilesMeanNoObjects) {
  const fs::path tmp = test::temp_dir("labels_empty");
  std::vector<std::string> problems;
  EXPECT_TRUE(parse_label_file((tmp / "none.txt").string(), 10, 10, 0, &problems).empty());
  write_text(tmp / "empty.txt", "");
  EXPECT_TRUE(parse_label_file((tmp / "empty.txt").string(), 10, 10, 0, &problems).empty());
  write_text(tmp / "blank.txt", "\n  \n\t\n");
  EXPECT_TRUE(parse_label_file((tmp / "blank.txt").string(), 10, 10, 0, &problems).empty());
  EXPECT_TRUE(problems.empty());
}

TEST(DataLabels, BadRowsAreSkippedAndNamed) {
  const fs::path tmp = test::temp_dir("labels_bad");
  const std::string file = (tmp / "bad.txt").string();
  write_text(file,
             "0 0.5 0.5 0.2\n"            // 1: too few fields
             "x 0.5 0.5 0.2 0.2\n"        // 2: not a number
             "1 0.5 0.5 0.2 0.2\n"        // 3: good
             "1.5 0.5 0.5 0.2 0.2\n"      // 4: fractional class
             "-1 0.5 0.5 0.2 0.2\n"       // 5: negative class
             "7 0.5 0.5 0.2 0.2\n"        // 6: class >= nc
             "2 0.1 0.1 0.2 0.2 0.3\n"    // 7: odd polygon
             "2 nan 0.5 0.2 0.2\n"        // 8: not finite
             "2 0.5 0.5 0.2 0.2 \r\n");   // 9: good (trailing blanks, CRLF)
  std::vector<std::string> problems;
  const auto boxes = parse_label_file(file, 10, 10, 5, &problems);
  ASSERT_EQ(boxes.size(), 2u);
  EXPECT_DOUBLE_EQ(boxes[0].cls, 1.0);
  EXPECT_DOUBLE_EQ(boxes[1].cls, 2.0);
  ASSERT_EQ(problems.size(), 7u);
  const int lines[] = {1, 2, 4, 5, 6, 7, 8};
  for (size_t i = 0; i < problems.size(); ++i)
    EXPECT_EQ(problems[i].rfind(file + ":" + std::to_string(lines[i]) + ":", 0), 0u) << problems[i];
  // Without nc the class range is not checked.
  problems.clear();
  EXPECT_EQ(parse_label_file(file, 10, 10, 0, &problems).size(), 3u);
}

TEST(DataLabels, CorruptImagesAreSkippedAndCounted) {
  const fs::path tmp = test::temp_dir("ds_corrupt");
  const fs::path img = tmp / "images";
  write_image(img / "a.png", 40, 80, 10);
  write_image(img / "b.jpg", 60, 30, 200);
  write_text(img / "c.jpg", "this is not an image");
  write_text(tmp / "labels" / "a.txt", "0 0.5 0.5 0.5 0.5\n");
  write_text(tmp / "labels" / "b.txt", "1 0.5 0.5 1.0 1.0\n0 0.25 0.25 0.5 0.5\n");
  DatasetOptions opt;
  opt.imgsz = 64;
  YoloDataset ds({(img / "a.png").string(), (img / "b.jpg").string(), (img / "c.jpg").string()}, opt);
  ASSERT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.num_corrupt(), 1);
  EXPECT_EQ(ds.num_boxes(), 3);
  EXPECT_EQ(ds.original_hw(0), std::make_pair(40, 80));
  EXPECT_EQ(ds.original_hw(1), std::make_pair(60, 30));

  // load_resized: longest side 64, boxes scaled by r = min(64/h, 64/w).
  const Sample a = ds.load_resized(0);
  EXPECT_EQ(a.image.sizes(), (torch::IntArrayRef{32, 64, 3}));
  ASSERT_EQ(a.boxes.size(), 1u);
  EXPECT_NEAR(a.boxes[0].x1, 20 * 0.8, 1e-9);
  EXPECT_NEAR(a.boxes[0].y2, 30 * 0.8, 1e-9);
  const Sample b = ds.load_resized(1);
  EXPECT_EQ(b.image.sizes(), (torch::IntArrayRef{64, 32, 3}));
  EXPECT_NEAR(b.boxes[0].x2, 30 * (64.0 / 60), 1e-9);
  const torch::Tensor orig = ds.original_labels(1);
  EXPECT_EQ(orig.sizes(), (torch::IntArrayRef{2, 5}));
  EXPECT_FLOAT_EQ(orig[1][2].item<float>(), 15.0f);
  EXPECT_FLOAT_EQ(orig[0][4].item<float>(), 1.0f);
}

TEST(DataLabels, LoadedImagesOwnTheirPixels) {
  // Decoding goes through memory reused by the thread; what load_resized returns must not be a
  // view of it, whether the image needed a resize (c) or not (a, b).
  const fs::path tmp = test::temp_dir("ds_own");
  write_image(tmp / "images" / "a.png", 32, 24, 50);
  write_image(tmp / "images" / "b.png", 32, 24, 150);
  write_image(tmp / "images" / "c.png", 64, 40, 250);
  DatasetOptions opt;
  opt.imgsz = 32;
  YoloDataset ds({(tmp / "images" / "a.png").string(), (tmp / "images" / "b.png").string(),
                  (tmp / "images" / "c.png").string()}, opt);
  const Sample a = ds.load_resized(0);
  const Sample b = ds.load_resized(1);
  const Sample c = ds.load_resized(2);
  const Sample a2 = ds.load_resized(0);
  EXPECT_TRUE(torch::equal(a.image, torch::full({32, 24, 3}, 50, torch::kUInt8)));
  EXPECT_TRUE(torch::equal(b.image, torch::full({32, 24, 3}, 150, torch::kUInt8)));
  EXPECT_TRUE(torch::equal(c.image, torch::full({32, 20, 3}, 250, torch::kUInt8)));
  EXPECT_TRUE(torch::equal(a2.image, a.image));
  EXPECT_NE(a.image.data_ptr(), a2.image.data_ptr());
}

TEST(DataLabels, ImageBrokenAfterTheHeaderIsReplacedAtLoad) {
  const fs::path tmp = test::temp_dir("ds_truncated");
  write_image(tmp / "images" / "a.png", 32, 32, 50);
  write_image(tmp / "images" / "b.png", 32, 32, 150);
  DatasetOptions opt;
  opt.imgsz = 32;
  YoloDataset ds({(tmp / "images" / "a.png").string(), (tmp / "images" / "b.png").string()}, opt);
  ASSERT_EQ(ds.size(), 2);
  // Keep a valid header but cut the data: the header probe passed, decoding fails later.
  const auto full = fs::file_size(tmp / "images" / "a.png");
  fs::resize_file(tmp / "images" / "a.png", full / 2);
  // A mosaic tile is replaced the same way (and the image is reported once).
  const Tile t = ds.load_mosaic_tile(0, 2);
  EXPECT_EQ(t.image[0][0][0].item<uint8_t>(), 150);
  EXPECT_EQ(ds.num_unreadable(), 1);
  const Sample s = ds.load_resized(0);  // replaced by the next readable image
  EXPECT_EQ(s.image[0][0][0].item<uint8_t>(), 150);
  EXPECT_EQ(ds.num_unreadable(), 1);
  EXPECT_EQ(ds.num_corrupt(), 1);
  // Nothing readable left: a DataError, not a crash or a loop.
  fs::remove(tmp / "images" / "b.png");
  EXPECT_THROW(ds.load_resized(1), DataError);
  EXPECT_THROW(ds.load_mosaic_tile(1, 0), DataError);
}

TEST(DataLabels, NoUsableImageIsADataError) {
  const fs::path tmp = test::temp_dir("ds_none");
  write_text(tmp / "x.jpg", "garbage");
  EXPECT_THROW(YoloDataset({(tmp / "x.jpg").string()}, DatasetOptions{}), DataError);
}

TEST(DataLabels, RamCacheGivesTheSameSamples) {
  const fs::path tmp = test::temp_dir("ds_cache");
  const fs::path img = tmp / "images";
  torch::Tensor pic = torch::arange(0, 50 * 70 * 3, torch::kInt32).remainder(251).to(torch::kUInt8)
                          .reshape({50, 70, 3});
  fs::create_directories(img);
  io::save_image((img / "p.png").string(), pic);
  write_text(tmp / "labels" / "p.txt", "0 0.5 0.5 0.5 0.5\n");
  write_text(img / "broken.png", "nope");
  DatasetOptions plain;
  plain.imgsz = 48;
  DatasetOptions cached = plain;
  cached.cache = CacheMode::Ram;
  YoloDataset a({(img / "p.png").string(), (img / "broken.png").string()}, plain);
  YoloDataset b({(img / "p.png").string(), (img / "broken.png").string()}, cached);
  EXPECT_TRUE(b.cached());
  EXPECT_EQ(b.size(), 1);
  EXPECT_EQ(b.num_corrupt(), 1);
  EXPECT_TRUE(torch::equal(a.load_resized(0).image, b.load_resized(0).image));
  EXPECT_DOUBLE_EQ(a.load_resized(0).boxes[0].x1, b.load_resized(0).boxes[0].x1);
}
