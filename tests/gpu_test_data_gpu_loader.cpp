// The GPU loader (loader=gpu, data/gpu_batch.hpp) against the CPU loader with the reference's
// full decode (reduced_decode = false), same seed: identical targets, indices and sizes; pixels
// bit for bit where both decode the same way (PNG files: the CPU decodes them for both, so the
// kernel's arithmetic is compared exactly), within the JPEG decoders' difference otherwise
// (nvJPEG vs libjpeg-turbo, measured and reported). A file cut short after the dataset
// was read is skipped and counted, as on the CPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "data/dataset_yaml.hpp"
#include "data/loader.hpp"
#include "data/synthetic.hpp"
#include "io/image.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using namespace libreyolo;
using namespace libreyolo::data;

namespace {

std::vector<std::string> jpeg_files() {
  static const std::vector<std::string> files = [] {
    SyntheticOptions o;
    o.train_images = 24;
    o.val_images = 1;
    o.width = 320;
    o.height = 240;
    o.min_objects = 0;
    o.max_objects = 5;
    o.seed = 31;
    return list_split_images(load_dataset_yaml(generate_synthetic_dataset(test::temp_dir("gpuload_jpg"), o)), "train");
  }();
  return files;
}

// The same pictures as PNG files (labels copied).
std::vector<std::string> png_files() {
  static const std::vector<std::string> files = [] {
    const std::string dir = test::temp_dir("gpuload_png");
    fs::create_directories(fs::path(dir) / "images");
    fs::create_directories(fs::path(dir) / "labels");
    std::vector<std::string> out;
    for (const std::string& f : jpeg_files()) {
      const std::string to = (fs::path(dir) / "images" / fs::path(f).stem()).string() + ".png";
      io::save_image(to, io::decode_image(f));
      fs::copy_file(label_path_for(f), label_path_for(to), fs::copy_options::overwrite_existing);
      out.push_back(to);
    }
    return out;
  }();
  return files;
}

std::shared_ptr<const YoloDataset> dataset(const std::vector<std::string>& files, int S) {
  DatasetOptions d;
  d.imgsz = S;
  d.reduced_decode = false;
  return std::make_shared<const YoloDataset>(files, d);
}

std::vector<Batch> epoch(DataLoader& l, int64_t e) {
  l.set_epoch(e);
  std::vector<Batch> out;
  while (auto b = l.next()) out.push_back(std::move(*b));
  return out;
}

struct PixelDiff {
  double mean = 0, max = 0, over8 = 0;  // mean |a - b|, largest, fraction of values off by > 8
};

// Epochs 0 (mosaic) and 1 (mosaic off) of both loaders, and the validation loader.
PixelDiff compare_loaders(const std::vector<std::string>& files, bool exact) {
  const int S = 160;
  PixelDiff d;
  double sum = 0, n = 0, over = 0;
  for (const LoaderMode mode : {LoaderMode::Train, LoaderMode::Val}) {
    LoaderOptions o;
    o.mode = mode;
    o.batch = 5;
    o.workers = 3;
    o.seed = 11;
    o.augment.max_labels = 20;
    LoaderOptions g = o;
    g.gpu = 0;
    DataLoader cpu(dataset(files, S), o), gpu(dataset(files, S), g);
    for (int64_t e = 0; e < (mode == LoaderMode::Train ? 2 : 1); ++e) {
      cpu.set_mosaic(e == 0);
      gpu.set_mosaic(e == 0);
      const std::vector<Batch> a = epoch(cpu, e), b = epoch(gpu, e);
      EXPECT_EQ(a.size(), b.size());
      for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        EXPECT_TRUE(b[i].images.is_cuda());
        EXPECT_TRUE(torch::equal(a[i].targets, b[i].targets)) << "epoch " << e << " batch " << i;
        EXPECT_EQ(a[i].indices, b[i].indices);
        EXPECT_EQ(a[i].orig_hw, b[i].orig_hw);
        const torch::Tensor gb = b[i].images.cpu();
        EXPECT_EQ(a[i].images.sizes(), gb.sizes());
        if (a[i].images.sizes() != gb.sizes()) continue;
        if (exact) EXPECT_TRUE(torch::equal(a[i].images, gb)) << "epoch " << e << " batch " << i;
        const torch::Tensor diff = (a[i].images.to(torch::kInt) - gb.to(torch::kInt)).abs();
        sum += diff.sum().item<double>();
        n += static_cast<double>(diff.numel());
        over += (diff > 8).sum().item<double>();
        d.max = std::max(d.max, diff.max().item<double>());
      }
    }
  }
  d.mean = sum / n;
  d.over8 = over / n;
  return d;
}

}  // namespace

TEST(GpuLoader, PngBatchesEqualTheCpuLoadersBitForBit) {
  LY_REQUIRE_CUDA();
  std::string why;
  ASSERT_TRUE(gpu_loader_available(&why)) << why;
  const PixelDiff d = compare_loaders(png_files(), true);
  EXPECT_EQ(d.max, 0);
}

TEST(GpuLoader, JpegBatchesHaveTheCpuLoadersTargetsAndNearlyItsPixels) {
  LY_REQUIRE_CUDA();
  const PixelDiff d = compare_loaders(jpeg_files(), false);
  std::printf("[ REPORT   ] GPU loader (nvJPEG) vs CPU loader (libjpeg-turbo), full decode: mean |diff| %.4f, max %.0f, "
              "values off by > 8: %.5f%%\n", d.mean, d.max, 100.0 * d.over8);
  EXPECT_LT(d.mean, 1.0);
  EXPECT_LT(d.over8, 0.005);
}

TEST(GpuLoader, DamagedFilesAreSkippedAndCounted) {
  LY_REQUIRE_CUDA();
  const std::string dir = test::temp_dir("gpuload_bad");
  fs::create_directories(fs::path(dir) / "images");
  fs::create_directories(fs::path(dir) / "labels");
  std::vector<std::string> files;
  for (size_t i = 0; i < 10; ++i) {
    const std::string f = jpeg_files()[i];
    const std::string to = (fs::path(dir) / "images" / fs::path(f).filename()).string();
    fs::copy_file(f, to, fs::copy_options::overwrite_existing);
    fs::copy_file(label_path_for(f), label_path_for(to), fs::copy_options::overwrite_existing);
    files.push_back(to);
  }
  const auto ds = dataset(files, 128);
  for (const size_t k : {size_t{2}, size_t{7}}) {  // cut short after the header probe
    const auto size = fs::file_size(files[k]);
    fs::resize_file(files[k], size / 3);
  }
  LoaderOptions o;
  o.batch = 4;
  o.workers = 2;
  o.gpu = 0;
  DataLoader l(ds, o);
  const std::vector<Batch> b = epoch(l, 0);
  EXPECT_EQ(b.size(), 2u);
  EXPECT_GE(ds->num_unreadable(), 1);
  std::printf("[ REPORT   ] GPU loader: %lld of 2 damaged files found in one epoch\n",
              static_cast<long long>(ds->num_unreadable()));
}
