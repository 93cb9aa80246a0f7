// DataLoader: determinism across worker counts, sharding, drop_last, errors, the no-aug switch
// and validation mode.
#include <filesystem>
#include <fstream>
#include <libreyolo/errors.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>

#include "data/dataset_yaml.hpp"
#include "data/loader.hpp"
#include "data/synthetic.hpp"
#include "io/image.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using namespace libreyolo;
using namespace libreyolo::data;

namespace {

// 20 train / 6 val images of 60 x 80 with shapes, generated once per test program.
const DatasetSpec& small_dataset() {
  static const DatasetSpec spec = [] {
    SyntheticOptions o;
    o.train_images = 20;
    o.val_images = 6;
    o.width = 80;
    o.height = 60;
    o.min_objects = 0;
    o.max_objects = 3;
    o.seed = 123;
    return load_dataset_yaml(generate_synthetic_dataset(test::temp_dir("loader_ds"), o));
  }();
  return spec;
}

std::shared_ptr<const YoloDataset> make_dataset(const std::string& split, int imgsz = 64) {
  DatasetOptions d;
  d.imgsz = imgsz;
  d.num_classes = small_dataset().nc;
  return std::make_shared<const YoloDataset>(list_split_images(small_dataset(), split), d);
}

std::vector<Batch> run_epoch(DataLoader& loader, int64_t epoch) {
  loader.set_epoch(epoch);
  std::vector<Batch> out;
  while (auto b = loader.next()) out.push_back(std::move(*b));
  return out;
}

void expect_same(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i].images, b[i].images)) << "batch " << i;
    EXPECT_TRUE(torch::equal(a[i].targets, b[i].targets)) << "batch " << i;
    EXPECT_EQ(a[i].indices, b[i].indices);
    EXPECT_EQ(a[i].orig_hw, b[i].orig_hw);
  }
}

}  // namespace

TEST(DataLoader, SameSeedSameBatchesWithZeroAndThreeWorkers) {
  auto ds = make_dataset("train");
  LoaderOptions o;
  o.batch = 4;
  o.seed = 5;
  DataLoader inline_loader(ds, o);
  o.workers = 3;
  DataLoader threaded(ds, o);
  const auto a = run_epoch(inline_loader, 1);
  const auto b = run_epoch(threaded, 1);
  ASSERT_EQ(a.size(), 5u);
  expect_same(a, b);
  EXPECT_EQ(a[0].images.sizes(), (torch::IntArrayRef{4, 64, 64, 3}));
  EXPECT_EQ(a[0].images.scalar_type(), torch::kUInt8);
  EXPECT_EQ(a[0].targets.sizes(), (torch::IntArrayRef{4, 100, 5}));
  // Again with the threaded loader: the same; another epoch or seed: different.
  expect_same(b, run_epoch(threaded, 1));
  EXPECT_FALSE(torch::equal(b[0].images, run_epoch(threaded, 2)[0].images));
  o.seed = 6;
  DataLoader other(ds, o);
  EXPECT_FALSE(torch::equal(b[0].images, run_epoch(other, 1)[0].images));
}

TEST(DataLoader, EpochIsAPermutationAndTargetsAreWellFormed) {
  auto ds = make_dataset("train");
  LoaderOptions o;
  o.batch = 5;
  o.workers = 2;
  DataLoader loader(ds, o);
  std::multiset<int64_t> seen;
  int objects = 0;
  for (const Batch& b : run_epoch(loader, 0)) {
    seen.insert(b.indices.begin(), b.indices.end());
    auto t = b.targets.accessor<float, 3>();
    for (int i = 0; i < t.size(0); ++i)
      for (int r = 0; r < t.size(1); ++r) {
        if (t[i][r][0] < 0) {
          for (int k = 1; k < 5; ++k) ASSERT_EQ(t[i][r][k], 0.0f);
          continue;
        }
        ++objects;
        ASSERT_LT(t[i][r][0], 4.0f);
        for (int k = 1; k < 5; ++k) ASSERT_TRUE(t[i][r][k] >= 0.0f && t[i][r][k] <= 1.0f);
        ASSERT_GT(t[i][r][3], t[i][r][1]);
        ASSERT_GT(t[i][r][4], t[i][r][2]);
      }
  }
  EXPECT_EQ(seen.size(), 20u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 20u);
  EXPECT_GT(objects, 10);  // mosaics of four images carry boxes
}

TEST(DataLoader, ShardsCoverTheDatasetWithEqualCounts) {
  auto ds = make_dataset("train");
  for (bool pad : {true, false}) {
    std::set<int64_t> all;
    int64_t total = 0;
    for (int rank = 0; rank < 3; ++rank) {
      LoaderOptions o;
      o.batch = 2;
      o.rank = rank;
      o.world = 3;
      o.seed = 9;
      o.pad_shards = pad;
      DataLoader loader(ds, o);
      const auto idx = loader.epoch_indices(4);
      EXPECT_EQ(idx.size(), pad ? 7u : 6u);
      EXPECT_EQ(loader.size(), pad ? 3 : 3);
      all.insert(idx.begin(), idx.end());
      total += static_cast<int64_t>(idx.size());
      // Every rank visits its whole shard (batches of 2, the odd sample dropped).
      std::vector<int64_t> visited;
      for (const Batch& b : run_epoch(loader, 4)) visited.insert(visited.end(), b.indices.begin(), b.indices.end());
      EXPECT_EQ(visited, std::vector<int64_t>(idx.begin(), idx.begin() + 6));
    }
    EXPECT_EQ(total, pad ? 21 : 18);
    EXPECT_EQ(all.size(), pad ? 20u : 18u);
  }
}

TEST(DataLoader, ShardsMatchTorchDistributedSampler) {
  auto py = test::python_with_torch();
  if (!py) GTEST_SKIP() << "python with torch not found";
  auto ds = make_dataset("train");
  std::string out;
  const std::string script =
      "from torch.utils.data import DistributedSampler\n"
      "for r in range(3):\n"
      "    s = DistributedSampler(range(20), num_replicas=3, rank=r, shuffle=True, seed=9, drop_last=False)\n"
      "    s.set_epoch(4)\n"
      "    print(' '.join(map(str, list(s))))\n";
  ASSERT_EQ(test::run_command(*py + " -c \"" + script + "\"", &out), 0) << out;
  std::istringstream lines(out);
  for (int rank = 0; rank < 3; ++rank) {
    LoaderOptions o;
    o.rank = rank;
    o.world = 3;
    o.seed = 9;
    DataLoader loader(ds, o);
    std::string line;
    ASSERT_TRUE(std::getline(lines, line));
    std::istringstream nums(line);
    std::vector<int64_t> expect;
    for (int64_t v; nums >> v;) expect.push_back(v);
    EXPECT_EQ(loader.epoch_indices(4), expect) << "rank " << rank;
  }
}

TEST(DataLoader, DropLastFollowsTheReferenceRule) {
  auto ds = make_dataset("train");
  LoaderOptions o;
  o.batch = 8;
  DataLoader train(ds, o);
  EXPECT_TRUE(train.drop_last());
  EXPECT_EQ(train.size(), 2);
  EXPECT_EQ(run_epoch(train, 0).size(), 2u);
  o.batch = 32;  // fewer images than the batch: one partial batch instead of none
  DataLoader big(ds, o);
  EXPECT_FALSE(big.drop_last());
  ASSERT_EQ(big.size(), 1);
  EXPECT_EQ(run_epoch(big, 0).at(0).images.size(0), 20);
}

TEST(DataLoader, ValidationModeIsOrderedCompleteAndUnaugmented) {
  auto ds = make_dataset("val");
  LoaderOptions o;
  o.mode = LoaderMode::Val;
  o.batch = 4;
  o.workers = 2;
  DataLoader loader(ds, o);
  EXPECT_FALSE(loader.drop_last());
  const auto batches = run_epoch(loader, 3);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].indices, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(batches[1].indices, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(batches[1].images.size(0), 2);
  for (const Batch& b : batches)
    for (size_t i = 0; i < b.indices.size(); ++i) {
      EXPECT_EQ(b.orig_hw[i], std::make_pair(60, 80));
      // 80 x 60 -> 64 x 48: rows 48.. are padding.
      EXPECT_EQ(b.images[i][50][10][0].item<uint8_t>(), 114);
      std::vector<uint8_t> img(64 * 64 * 3);
      std::vector<float> tgt(100 * 5);
      make_val_sample(*ds, b.indices[i], 100, img.data(), tgt.data());
      EXPECT_EQ(std::memcmp(img.data(), b.images[i].data_ptr<uint8_t>(), img.size()), 0);
      // Targets are the original pixel boxes scaled to the 64 letterbox.
      const torch::Tensor gt = ds->original_labels(b.indices[i]);
      for (int64_t r = 0; r < gt.size(0); ++r) {
        EXPECT_NEAR(b.targets[i][r][1].item<float>(), gt[r][0].item<float>() * 0.8f / 64, 1e-5);
        EXPECT_EQ(b.targets[i][r][0].item<float>(), gt[r][4].item<float>());
      }
      EXPECT_EQ(b.targets[i][gt.size(0)][0].item<float>(), -1.0f);
    }
}

TEST(DataLoader, NoAugSwitchTurnsMosaicOff) {
  auto ds = make_dataset("train");
  LoaderOptions o;
  o.batch = 4;
  o.workers = 2;
  o.augment.hsv_prob = 0;
  o.augment.flip_prob = 0;
  DataLoader loader(ds, o);
  EXPECT_TRUE(loader.mosaic());
  auto matches_plain = [&](const Batch& b) {
    int same = 0;
    for (size_t i = 0; i < b.indices.size(); ++i) {
      std::vector<uint8_t> img(64 * 64 * 3);
      std::vector<float> tgt(100 * 5);
      make_val_sample(*ds, b.indices[i], 100, img.data(), tgt.data());
      same += std::memcmp(img.data(), b.images[i].data_ptr<uint8_t>(), img.size()) == 0;
    }
    return same;
  };
  loader.set_epoch(0);
  auto mosaic_batch = loader.next();
  ASSERT_TRUE(mosaic_batch);
  EXPECT_EQ(matches_plain(*mosaic_batch), 0);
  // Switching off after set_epoch but before the first batch still applies to this epoch.
  loader.set_epoch(1);
  loader.set_mosaic(false);
  EXPECT_FALSE(loader.mosaic());
  int batches = 0;
  while (auto b = loader.next()) {
    EXPECT_EQ(matches_plain(*b), 4);
    ++batches;
  }
  EXPECT_EQ(batches, 5);
  // With HSV and flip on (the reference's no-aug phase keeps them) samples are recoloured.
  o.augment.hsv_prob = 1;
  DataLoader hsv_loader(ds, o);
  hsv_loader.set_mosaic(false);
  const auto hb = run_epoch(hsv_loader, 0);
  int plain = 0;
  for (const Batch& b : hb) plain += matches_plain(b);
  EXPECT_LT(plain, 20);
}

TEST(DataLoader, SampleErrorsReachTheConsumer) {
  // PNGs cut in half: the header probe passes, decoding fails, and with every image broken the
  // dataset has nothing to substitute, so the sample fails.
  const fs::path tmp = test::temp_dir("loader_err");
  std::vector<std::string> files;
  for (const char* name : {"a.png", "b.png", "c.png"}) {
    const std::string p = (tmp / name).string();
    io::save_image(p, torch::randint(0, 255, {40, 40, 3}, torch::kUInt8));
    fs::resize_file(p, fs::file_size(p) / 2);
    files.push_back(p);
  }
  for (int workers : {0, 3}) {
    DatasetOptions d;
    d.imgsz = 64;
    auto ds = std::make_shared<const YoloDataset>(files, d);
    LoaderOptions o;
    o.batch = 1;
    o.workers = workers;
    DataLoader loader(ds, o);
    loader.set_epoch(0);
    bool threw = false;
    try {
      while (loader.next()) {
      }
    } catch (const DataError& e) {
      threw = true;
      EXPECT_NE(std::string(e.what()).find("decoded"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(threw) << "workers=" << workers;
    EXPECT_FALSE(loader.next());  // the epoch is over after the error
    loader.set_epoch(1);          // a new epoch fails the same way, without hanging
    EXPECT_THROW(loader.next(), DataError);
  }
}

TEST(DataLoader, DestroyingMidEpochJoinsCleanly) {
  auto ds = make_dataset("train");
  for (int round = 0; round < 3; ++round) {
    LoaderOptions o;
    o.batch = 2;
    o.workers = 3;
    o.prefetch = 3;
    DataLoader loader(ds, o);
    loader.set_epoch(round);
    if (round > 0) ASSERT_TRUE(loader.next());
  }
  // A loader that never started an epoch also goes away quietly.
  LoaderOptions o;
  o.workers = 2;
  DataLoader idle(ds, o);
}

TEST(DataLoader, PinMemoryOnlyWithCuda) {
  auto ds = make_dataset("val");
  LoaderOptions o;
  o.mode = LoaderMode::Val;
  o.pin_memory = true;
  o.batch = 6;
  DataLoader loader(ds, o);
  EXPECT_EQ(loader.pinned(), torch::cuda::is_available());
  auto b = loader.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->images.is_pinned(), torch::cuda::is_available());
}

TEST(DataLoader, BadOptionsAreUsageErrors) {
  auto ds = make_dataset("val");
  LoaderOptions o;
  o.batch = 0;
  EXPECT_THROW(DataLoader(ds, o), UsageError);
  o.batch = 2;
  o.rank = 3;
  o.world = 2;
  EXPECT_THROW(DataLoader(ds, o), UsageError);
  o.rank = 0;
  o.workers = -1;
  EXPECT_THROW(DataLoader(ds, o), UsageError);
}

TEST(DataLoader, MixupBlendsImagesAndKeepsBothSetsOfTargets) {
  auto ds = make_dataset("train");
  AugmentOptions plain;
  plain.imgsz = 64;
  AugmentOptions mix = plain;
  mix.mixup_prob = 1.0;
  const size_t npix = 64 * 64 * 3;
  int differing = 0, added = 0;
  const auto real = [](const std::vector<float>& t) {
    size_t n = 0;
    while (5 * n < t.size() && t[5 * n] >= 0) ++n;
    return n;
  };
  for (int64_t i = 0; i < 6; ++i) {
    std::vector<uint8_t> a(npix), b(npix);
    std::vector<float> ta(500), tb(500);
    Rng ra = Rng::for_sample(1, 0, i, 0), rb = Rng::for_sample(1, 0, i, 0);
    make_train_sample(*ds, i, true, plain, ra, a.data(), ta.data());
    make_train_sample(*ds, i, true, mix, rb, b.data(), tb.data());
    // The mosaic's rows first, then the partner's real rows: the partner's objects are half
    // visible in the blend, so they stay labelled.
    const size_t na = real(ta), nb = real(tb);
    ASSERT_GE(nb, na);
    EXPECT_TRUE(std::equal(ta.begin(), ta.begin() + 5 * na, tb.begin())) << "sample " << i;
    added += nb > na;
    differing += a != b;
    // Without mosaic there is no mixup.
    Rng rc = Rng::for_sample(1, 0, i, 0), rd = Rng::for_sample(1, 0, i, 0);
    make_train_sample(*ds, i, false, plain, rc, a.data(), ta.data());
    make_train_sample(*ds, i, false, mix, rd, b.data(), tb.data());
    EXPECT_EQ(a, b);
  }
  EXPECT_EQ(differing, 6);
  EXPECT_GT(added, 3);
}

TEST(DataLoader, ReducedDecodeMosaicKeepsTheTargetsAndTheRecipesPixels) {
  // The default (reduced_decode) decodes each mosaic tile at the JPEG DCT scale covering imgsz
  // and resamples it as the mosaic is drawn; reduced_decode=false decodes in full. Same seed:
  // identical targets, pixels within the interpolation difference measured here (240 x 180
  // JPEGs: DCT 1/2 at imgsz 96). Plain samples go through the same reduced decode in both
  // (load_resized) only when reduced_decode is on, so they are compared in the mosaic only.
  static const DatasetSpec spec = [] {
    SyntheticOptions o;
    o.train_images = 12;
    o.val_images = 1;
    o.width = 240;
    o.height = 180;
    o.seed = 9;
    return load_dataset_yaml(generate_synthetic_dataset(test::temp_dir("loader_reduced"), o));
  }();
  const int S = 96;
  DatasetOptions fast;
  fast.imgsz = S;
  DatasetOptions exact = fast;
  exact.reduced_decode = false;
  const YoloDataset a(list_split_images(spec, "train"), fast), b(list_split_images(spec, "train"), exact);
  // The tile the mosaic gets: boxes and nominal size as load_resized's, pixels at DCT 1/2.
  const Tile t = a.load_mosaic_tile(3, 1);
  const Sample r = b.load_resized(3);
  EXPECT_EQ(t.height, r.image.size(0));
  EXPECT_EQ(t.width, r.image.size(1));
  EXPECT_EQ(t.image.size(1), 120);
  EXPECT_EQ(t.index, 3);
  ASSERT_EQ(t.boxes.size(), r.boxes.size());
  for (size_t i = 0; i < t.boxes.size(); ++i) EXPECT_EQ(t.boxes[i].x2, r.boxes[i].x2);
  EXPECT_TRUE(torch::equal(b.load_mosaic_tile(3, 0).image, io::decode_image(b.image_path(3))))
      << "exact decode: the full decode, resampled by the mosaic";
  // A tile the mosaic shows small (40 of 96 px): the reduced decode takes DCT 1/4, the exact one
  // still decodes in full.
  EXPECT_EQ(a.load_mosaic_tile(3, 0, 40).image.size(1), 60);
  EXPECT_TRUE(torch::equal(b.load_mosaic_tile(3, 0, 40).image, io::decode_image(b.image_path(3))));
  EXPECT_THROW(a.load_mosaic_tile(0, YoloDataset::kTileSlots), UsageError);

  AugmentOptions aug;
  aug.imgsz = S;
  const size_t npix = static_cast<size_t>(S) * S * 3;
  double worst_mean = 0;
  for (int64_t i = 0; i < 12; ++i) {
    for (const bool mosaic : {true, false}) {
      std::vector<uint8_t> ia(npix), ib(npix);
      std::vector<float> ta(500), tb(500);
      Rng ra = Rng::for_sample(4, 1, i, 0), rb = Rng::for_sample(4, 1, i, 0);
      make_train_sample(a, i, mosaic, aug, ra, ia.data(), ta.data());
      make_train_sample(b, i, mosaic, aug, rb, ib.data(), tb.data());
      EXPECT_EQ(ta, tb) << "sample " << i;
      double sum = 0;
      for (size_t k = 0; k < npix; ++k) sum += std::abs(static_cast<int>(ia[k]) - static_cast<int>(ib[k]));
      const double mean = sum / static_cast<double>(npix);
      if (!mosaic) continue;
      worst_mean = std::max(worst_mean, mean);
      EXPECT_LT(mean, 2.0) << "sample " << i;
    }
  }
  RecordProperty("worst_mean_abs_diff", std::to_string(worst_mean));
  std::printf("reduced-decode mosaic vs the reference recipe: worst mean |diff| %.3f levels\n", worst_mean);
}
