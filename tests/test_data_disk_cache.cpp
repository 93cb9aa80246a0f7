// cache=disk: entries equal what decoding gives, are reused by a later dataset, and are rebuilt
// when the image changes or the entry is damaged (hostile bytes included).
#include <filesystem>
#include <fstream>

#include "data/dataset.hpp"
#include "data/dataset_yaml.hpp"
#include "data/disk_cache.hpp"
#include "data/synthetic.hpp"
#include "support.hpp"

using namespace libreyolo;
using namespace libreyolo::data;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> fresh_images(const std::string& tag) {
  SyntheticOptions o;
  o.train_images = 6;
  o.val_images = 1;
  o.width = 128;
  o.height = 96;
  o.num_classes = 2;
  o.threads = 1;
  return list_split_images(load_dataset_yaml(generate_synthetic_dataset(test::temp_dir(tag), o)), "train");
}

DatasetOptions opts(CacheMode m) {
  DatasetOptions d;
  d.imgsz = 64;
  d.cache = m;
  d.threads = 1;
  return d;
}

}  // namespace

TEST(DataDiskCache, EntriesEqualDecodingAndAreReusedByALaterDataset) {
  const auto files = fresh_images("disk_cache_a");
  YoloDataset plain(files, opts(CacheMode::None));
  YoloDataset cached(files, opts(CacheMode::Disk));
  ASSERT_TRUE(cached.disk_cached());
  ASSERT_EQ(plain.size(), cached.size());
  for (int64_t i = 0; i < cached.size(); ++i) {
    ASSERT_EQ(plain.image_path(i), cached.image_path(i));
    EXPECT_TRUE(fs::exists(disk_cache_path(cached.image_path(i), 64))) << i;
    const Sample a = plain.load_resized(i), b = cached.load_resized(i);
    EXPECT_TRUE(torch::equal(a.image, b.image)) << i;
    ASSERT_EQ(a.boxes.size(), b.boxes.size());
    for (size_t k = 0; k < a.boxes.size(); ++k) EXPECT_EQ(a.boxes[k].x1, b.boxes[k].x1);
  }
  // A later dataset reads the entries: none is written again.
  const std::string entry = disk_cache_path(cached.image_path(0), 64);
  const auto t0 = fs::last_write_time(entry);
  YoloDataset again(files, opts(CacheMode::Disk));
  EXPECT_EQ(fs::last_write_time(entry), t0);
  EXPECT_TRUE(torch::equal(again.load_resized(0).image, plain.load_resized(0).image));
  // Another imgsz has entries of its own.
  EXPECT_NE(disk_cache_path(cached.image_path(0), 64), disk_cache_path(cached.image_path(0), 96));
}

TEST(DataDiskCache, ChangedImagesAndDamagedEntriesAreRebuilt) {
  const auto files = fresh_images("disk_cache_b");
  YoloDataset cached(files, opts(CacheMode::Disk));
  ASSERT_GE(cached.size(), 4);
  const std::string img0 = cached.image_path(0), img1 = cached.image_path(1);
  // The image changes on disk (another picture): its entry no longer applies.
  fs::copy_file(img1, img0, fs::copy_options::overwrite_existing);
  EXPECT_FALSE(read_disk_cache(img0, 64).has_value());
  YoloDataset plain(files, opts(CacheMode::None));
  EXPECT_TRUE(torch::equal(cached.load_resized(0).image, plain.load_resized(0).image));
  EXPECT_TRUE(read_disk_cache(img0, 64).has_value());  // rewritten on that load
  // Damaged entries: truncated, and hostile bytes with the right magic and absurd sizes.
  const std::string e2 = disk_cache_path(cached.image_path(2), 64);
  fs::resize_file(e2, 10);
  EXPECT_FALSE(read_disk_cache(cached.image_path(2), 64).has_value());
  EXPECT_TRUE(torch::equal(cached.load_resized(2).image, plain.load_resized(2).image));
  const std::string e3 = disk_cache_path(cached.image_path(3), 64);
  {
    std::fstream f(e3, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(24);
    const int32_t huge[2] = {1 << 30, 1 << 30};
    f.write(reinterpret_cast<const char*>(huge), sizeof huge);
  }
  EXPECT_FALSE(read_disk_cache(cached.image_path(3), 64).has_value());
  EXPECT_TRUE(torch::equal(cached.load_resized(3).image, plain.load_resized(3).image));
  // A foreign file in the entry's place.
  const std::string e4 = disk_cache_path(cached.image_path(4), 64);
  std::ofstream(e4, std::ios::binary | std::ios::trunc) << "not an entry at all, not even a header";
  EXPECT_FALSE(read_disk_cache(cached.image_path(4), 64).has_value());
  EXPECT_TRUE(torch::equal(cached.load_resized(4).image, plain.load_resized(4).image));
}

TEST(DataDiskCache, ReducedAndFullDecodesKeepEntriesOfTheirOwn) {
  // 128 x 96 JPEGs at imgsz 64: the reduced decode (the default) reads them at DCT 1/2, whose
  // pixels differ from the full decode's. A cache filled by one must never serve the other.
  const auto files = fresh_images("disk_cache_c");
  DatasetOptions full = opts(CacheMode::None);
  full.reduced_decode = false;
  DatasetOptions full_disk = full;
  full_disk.cache = CacheMode::Disk;
  const YoloDataset reduced_plain(files, opts(CacheMode::None)), full_plain(files, full);
  const YoloDataset reduced_cached(files, opts(CacheMode::Disk));
  const YoloDataset full_cached(files, full_disk);
  int differ = 0;
  for (int64_t i = 0; i < full_cached.size(); ++i) {
    const std::string p = full_cached.image_path(i);
    EXPECT_TRUE(fs::exists(disk_cache_path(p, 64))) << i;
    EXPECT_TRUE(fs::exists(disk_cache_path(p, 64, ops::Fit::Letterbox, false))) << i;
    EXPECT_TRUE(torch::equal(full_cached.load_resized(i).image, full_plain.load_resized(i).image)) << i;
    EXPECT_TRUE(torch::equal(reduced_cached.load_resized(i).image, reduced_plain.load_resized(i).image)) << i;
    differ += !torch::equal(full_plain.load_resized(i).image, reduced_plain.load_resized(i).image);
  }
  EXPECT_EQ(differ, full_cached.size()) << "the two decodes must differ here, or this test checks nothing";
  // A reduced entry in the full entry's place is not read as one, and is replaced on the next load.
  const std::string p0 = full_cached.image_path(0);
  const std::string full_entry = disk_cache_path(p0, 64, ops::Fit::Letterbox, false);
  fs::copy_file(disk_cache_path(p0, 64), full_entry, fs::copy_options::overwrite_existing);
  EXPECT_FALSE(read_disk_cache(p0, 64, ops::Fit::Letterbox, false).has_value());
  EXPECT_TRUE(torch::equal(full_cached.load_resized(0).image, full_plain.load_resized(0).image));
  EXPECT_TRUE(read_disk_cache(p0, 64, ops::Fit::Letterbox, false).has_value());
}
