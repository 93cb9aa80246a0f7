// Samples as drawing plans (the GPU loader's CPU half, data/augment.hpp SampleDraw): the same
// random draws, targets and, once drawn by render_sample from full-size decodes, the same pixels
// bit for bit as make_train_sample / make_val_sample with the reference's full decode
// (reduced_decode = false). The GPU kernel is checked against render_sample on the GPU machine.
#include <filesystem>
#include <fstream>
#include <libreyolo/errors.hpp>

#include "data/augment.hpp"
#include "data/dataset_yaml.hpp"
#include "data/loader.hpp"
#include "data/synthetic.hpp"
#include "io/image.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using namespace libreyolo;
using namespace libreyolo::data;

namespace {

// Two image sizes (landscape 240 x 180, portrait 150 x 200) so that tiles differ in shape.
std::vector<std::string> plan_images() {
  static const std::vector<std::string> files = [] {
    std::vector<std::string> all;
    for (const auto& [w, h, seed] : {std::tuple{240, 180, 21}, std::tuple{150, 200, 22}}) {
      SyntheticOptions o;
      o.train_images = 6;
      o.val_images = 1;
      o.width = w;
      o.height = h;
      o.min_objects = 0;
      o.max_objects = 4;
      o.seed = static_cast<uint64_t>(seed);
      const DatasetSpec spec =
          load_dataset_yaml(generate_synthetic_dataset(test::temp_dir("plan_" + std::to_string(seed)), o));
      for (const std::string& f : list_split_images(spec, "train")) all.push_back(f);
    }
    return all;
  }();
  return files;
}

std::shared_ptr<YoloDataset> exact_dataset(const std::vector<std::string>& files, int S,
                                           ops::Fit fit = ops::Fit::Letterbox) {
  DatasetOptions d;
  d.imgsz = S;
  d.fit = fit;
  d.reduced_decode = false;
  return std::make_shared<YoloDataset>(files, d);
}

// The plan drawn on the CPU from full decodes of its tiles' files.
std::vector<uint8_t> draw(const YoloDataset& ds, const SampleDraw& plan, int S) {
  std::array<torch::Tensor, 4> src;
  std::array<const torch::Tensor*, 4> ptr{};
  for (int k = 0; k < plan.num_tiles; ++k) {
    src[static_cast<size_t>(k)] = io::decode_image(ds.image_path(plan.tiles[static_cast<size_t>(k)].index));
    ptr[static_cast<size_t>(k)] = &src[static_cast<size_t>(k)];
  }
  std::vector<uint8_t> out(static_cast<size_t>(S) * S * 3);
  render_sample(plan, ptr, S, out.data());
  return out;
}

}  // namespace

TEST(DataPlan, TrainPlansDrawTheCpuSamplesBitForBit) {
  const std::vector<std::string> files = plan_images();
  for (const int S : {128, 96}) {
    const auto ds = exact_dataset(files, S);
    AugmentOptions aug;
    aug.imgsz = S;
    aug.max_labels = 20;
    const size_t npix = static_cast<size_t>(S) * S * 3;
    int mosaics = 0, flips = 0, hsvs = 0;
    for (int64_t i = 0; i < ds->size(); ++i)
      for (const bool mosaic : {true, false})
        for (const uint64_t seed : {1u, 7u}) {
          std::vector<uint8_t> cpu(npix);
          std::vector<float> tc(100), tp(100);
          Rng rc = Rng::for_sample(seed, 2, i, 0), rp = Rng::for_sample(seed, 2, i, 0);
          make_train_sample(*ds, i, mosaic, aug, rc, cpu.data(), tc.data());
          const SampleDraw plan = plan_train_sample(*ds, i, mosaic, aug, rp, tp.data());
          EXPECT_EQ(tc, tp) << "S " << S << " sample " << i << " mosaic " << mosaic << " seed " << seed;
          EXPECT_EQ(rc.uniform(), rp.uniform()) << "the same number of draws";
          EXPECT_EQ(draw(*ds, plan, S), cpu) << "S " << S << " sample " << i << " mosaic " << mosaic;
          mosaics += plan.warp;
          flips += plan.flip;
          hsvs += plan.hsv;
        }
    // Both paths and both augmentations were exercised.
    EXPECT_GT(mosaics, 0);
    EXPECT_LT(mosaics, 4 * ds->size());
    EXPECT_GT(flips, 0);
    EXPECT_GT(hsvs, 0);
  }
}

TEST(DataPlan, ValPlansDrawTheCpuSamplesBitForBit) {
  const auto ds = exact_dataset(plan_images(), 112);
  const int S = 112;
  for (int64_t i = 0; i < ds->size(); ++i) {
    std::vector<uint8_t> cpu(static_cast<size_t>(S) * S * 3);
    std::vector<float> tc(50), tp(50);
    make_val_sample(*ds, i, 10, cpu.data(), tc.data());
    const SampleDraw plan = plan_val_sample(*ds, i, 10, tp.data());
    EXPECT_EQ(tc, tp);
    EXPECT_FALSE(plan.hsv || plan.flip);
    EXPECT_EQ(draw(*ds, plan, S), cpu) << "sample " << i;
  }
}

TEST(DataPlan, StretchedSamplesFillTheSquareWithTheBoxesScaledPerAxis) {
  // A family whose input is stretched (ops::Fit::Stretch): the dataset holds S x S images, the
  // validation sample is that image, and its targets are the original boxes divided by the
  // original sides; the plan (the GPU loader's path) draws it bit for bit, the training plan
  // with the same targets and draws as the CPU sample.
  const std::vector<std::string> files = plan_images();
  const int S = 96;
  const auto ds = exact_dataset(files, S, ops::Fit::Stretch);
  const size_t npix = static_cast<size_t>(S) * S * 3;
  int boxes_seen = 0;
  for (int64_t i = 0; i < ds->size(); ++i) {
    const Sample s = ds->load_resized(i);
    ASSERT_EQ(s.image.size(0), S);
    ASSERT_EQ(s.image.size(1), S);
    std::vector<uint8_t> cpu(npix);
    std::vector<float> tc(50), tp(50);
    make_val_sample(*ds, i, 10, cpu.data(), tc.data(), ops::Fit::Stretch);
    const SampleDraw plan = plan_val_sample(*ds, i, 10, tp.data(), ops::Fit::Stretch);
    EXPECT_EQ(tc, tp);
    EXPECT_EQ(plan.content_w, S);
    EXPECT_EQ(plan.content_h, S);
    EXPECT_EQ(draw(*ds, plan, S), cpu) << "sample " << i;
    const auto original = ds->original_boxes(i);
    const auto [h0, w0] = ds->original_hw(i);
    for (size_t k = 0; k < original.size() && k < 10; ++k) {
      EXPECT_NEAR(tc[5 * k + 1], original[k].x1 / w0, 1e-6);
      EXPECT_NEAR(tc[5 * k + 2], original[k].y1 / h0, 1e-6);
      EXPECT_NEAR(tc[5 * k + 3], original[k].x2 / w0, 1e-6);
      EXPECT_NEAR(tc[5 * k + 4], original[k].y2 / h0, 1e-6);
      ++boxes_seen;
    }
  }
  EXPECT_GT(boxes_seen, 0);

  AugmentOptions aug;
  aug.imgsz = S;
  aug.max_labels = 20;
  aug.mosaic_prob = 0.0;
  aug.fit = ops::Fit::Stretch;
  int flips = 0;
  for (int64_t i = 0; i < ds->size(); ++i)
    for (const uint64_t seed : {3u, 9u}) {
      std::vector<uint8_t> cpu(npix);
      std::vector<float> tc(100), tp(100);
      Rng rc = Rng::for_sample(seed, 1, i, 0), rp = Rng::for_sample(seed, 1, i, 0);
      make_train_sample(*ds, i, true, aug, rc, cpu.data(), tc.data());
      const SampleDraw plan = plan_train_sample(*ds, i, true, aug, rp, tp.data());
      EXPECT_EQ(tc, tp) << "sample " << i << " seed " << seed;
      EXPECT_FALSE(plan.warp);
      EXPECT_EQ(draw(*ds, plan, S), cpu) << "sample " << i << " seed " << seed;
      flips += plan.flip;
    }
  EXPECT_GT(flips, 0);
}

TEST(DataPlan, CorruptImagesAreReplacedAsOnTheCpu) {
  // An image that breaks after the dataset read its header: the CPU path finds it when
  // decoding; a GPU-side decoder reports it (mark_unreadable). Either way its neighbour takes
  // its place, with the same targets.
  const std::vector<std::string> src = plan_images();
  const std::string dir = test::temp_dir("plan_corrupt");
  std::vector<std::string> files;
  for (size_t i = 0; i < 4; ++i) {
    const fs::path to = fs::path(dir) / "images" / fs::path(src[i]).filename();
    fs::create_directories(to.parent_path());
    fs::create_directories(fs::path(dir) / "labels");
    fs::copy_file(src[i], to, fs::copy_options::overwrite_existing);
    fs::copy_file(label_path_for(src[i]), label_path_for(to.string()), fs::copy_options::overwrite_existing);
    files.push_back(to.string());
  }
  const int S = 96;
  const auto cpu_ds = exact_dataset(files, S);
  const auto plan_ds = exact_dataset(files, S);
  {
    std::string bytes;
    {
      std::ifstream in(files[1], std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    std::ofstream out(files[1], std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 3));  // header kept, body cut
  }
  AugmentOptions aug;
  aug.imgsz = S;
  aug.max_labels = 10;
  std::vector<uint8_t> img(static_cast<size_t>(S) * S * 3);
  std::vector<float> tc(50), tp(50);
  Rng rc = Rng::for_sample(3, 0, 1, 0), rp = Rng::for_sample(3, 0, 1, 0);
  make_train_sample(*cpu_ds, 1, false, aug, rc, img.data(), tc.data());
  EXPECT_EQ(cpu_ds->num_unreadable(), 1);
  EXPECT_EQ(plan_ds->readable_from(1), 1);
  plan_ds->mark_unreadable(1, "test");
  plan_ds->mark_unreadable(1, "test");  // counted once
  EXPECT_EQ(plan_ds->num_unreadable(), 1);
  EXPECT_EQ(plan_ds->readable_from(1), 2);
  const SampleDraw plan = plan_train_sample(*plan_ds, 1, false, aug, rp, tp.data());
  EXPECT_EQ(plan.tiles[0].index, 2);
  EXPECT_EQ(tc, tp);
  EXPECT_EQ(draw(*plan_ds, plan, S), img);
}

TEST(DataPlan, RecipesWithoutAPlanAreNamed) {
  AugmentOptions mix;
  mix.mixup_prob = 0.2;
  std::string why;
  EXPECT_FALSE(plannable(mix, &why));
  EXPECT_NE(why.find("mixup"), std::string::npos);
  AugmentOptions x;
  x.recipe = AugmentRecipe{Mixup::ScaledPaste, 0.0, false};
  EXPECT_FALSE(plannable(x, &why));
  EXPECT_NE(why.find("scaled-paste"), std::string::npos);
  EXPECT_TRUE(plannable(AugmentOptions{}));
  const auto ds = exact_dataset(plan_images(), 64);
  Rng rng = Rng::for_sample(0, 0, 0, 0);
  std::vector<float> t(500);
  EXPECT_THROW(plan_train_sample(*ds, 0, true, mix, rng, t.data()), UsageError);
}

TEST(DataPlan, TheGpuLoaderSaysWhyItCannotRun) {
  // On a machine without a GPU (or a build without nvJPEG) asking for it is a clear error.
  const auto ds = exact_dataset(plan_images(), 64);
  LoaderOptions o;
  o.gpu = 0;
  std::string why;
  if (gpu_loader_supports(*ds, o, &why)) GTEST_SKIP() << "this machine can run the GPU loader";
  EXPECT_FALSE(why.empty());
  try {
    DataLoader loader(ds, o);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("loader=gpu"), std::string::npos) << e.what();
  }
  LoaderOptions mix = o;
  mix.augment.mixup_prob = 0.5;
  EXPECT_FALSE(gpu_loader_supports(*ds, mix, &why));
  EXPECT_NE(why.find("mixup"), std::string::npos) << why;
}
