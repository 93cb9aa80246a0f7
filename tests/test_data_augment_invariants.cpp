// Properties of whole training samples that need no reference implementation: every target box
// still shows its object (the classes here are colours), and objects in mosaic samples appear
// at the scale of the plain samples and of validation (a mosaic that shrinks its objects trains
// a model for objects the validation images do not have).
#include <cmath>
#include <filesystem>
#include <fstream>

#include "data/augment.hpp"
#include "io/image.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using namespace libreyolo;
using namespace libreyolo::data;

namespace {

constexpr uint8_t kColours[3][3] = {{255, 40, 40}, {40, 255, 40}, {40, 40, 255}};

// Images of w x h with 2-4 filled, non-overlapping rectangles on grey noise, the class given by
// the colour (red, green, blue), labels in the YOLO layout. Returns the image files.
// `small`: objects of 1/16 to 1/8 of the picture's height instead of 1/6 to 1/2.
std::vector<std::string> colour_images(const std::string& tag, int count, int w, int h, uint64_t seed,
                                       bool small = false) {
  const fs::path root = test::temp_dir(tag);
  fs::create_directories(root / "images");
  fs::create_directories(root / "labels");
  Rng rng(seed);
  std::vector<std::string> files;
  for (int i = 0; i < count; ++i) {
    torch::Tensor img = torch::randint(90, 150, {h, w, 3}, torch::kUInt8);
    auto a = img.accessor<uint8_t, 3>();
    std::ofstream labels(root / "labels" / ("img" + std::to_string(i) + ".txt"));
    // Objects in separate columns of the picture, so that none overlaps another.
    const int n = static_cast<int>(rng.randint(2, 4));
    for (int k = 0; k < n; ++k) {
      const int cls = static_cast<int>(rng.randint(0, 2));
      const int col_w = w / n;
      const int bw = small ? static_cast<int>(rng.randint(h / 16, h / 8)) : static_cast<int>(rng.randint(col_w / 3, col_w - 4));
      const int bh = small ? static_cast<int>(rng.randint(h / 16, h / 8)) : static_cast<int>(rng.randint(h / 6, h / 2));
      const int x1 = k * col_w + static_cast<int>(rng.randint(1, col_w - bw - 1)), y1 = static_cast<int>(rng.randint(1, h - bh - 1));
      for (int y = y1; y < y1 + bh; ++y)
        for (int x = x1; x < x1 + bw; ++x)
          for (int c = 0; c < 3; ++c) a[y][x][c] = kColours[cls][c];
      labels << cls << ' ' << (x1 + bw / 2.0) / w << ' ' << (y1 + bh / 2.0) / h << ' ' << 1.0 * bw / w << ' '
             << 1.0 * bh / h << '\n';
    }
    const std::string path = (root / "images" / ("img" + std::to_string(i) + ".png")).string();
    std::ofstream(path, std::ios::binary) << io::encode_png(img);
    files.push_back(path);
  }
  return files;
}

// The class whose colour the pixel shows: the dominant channel, when it clearly dominates.
int colour_class(const uint8_t* p) {
  const int mx = std::max({p[0], p[1], p[2]});
  for (int c = 0; c < 3; ++c)
    if (p[c] == mx && mx - p[(c + 1) % 3] > 60 && mx - p[(c + 2) % 3] > 60) return c;
  return -1;
}

struct Stats {
  int boxes = 0, wrong = 0;
  int whole = 0;     // boxes away from the output's border (not cut by it)
  double side = 0;   // summed sqrt(area) of those, in output pixels
};

Stats sample_stats(const YoloDataset& ds, const AugmentOptions& opt, bool mosaic, int seeds) {
  const int S = opt.imgsz;
  Stats st;
  std::vector<uint8_t> img(static_cast<size_t>(S) * S * 3);
  std::vector<float> t(static_cast<size_t>(opt.max_labels) * 5);
  for (int seed = 0; seed < seeds; ++seed)
    for (int64_t i = 0; i < ds.size(); ++i) {
      Rng rng = Rng::for_sample(static_cast<uint64_t>(seed), 1, i, 0);
      make_train_sample(ds, i, mosaic, opt, rng, img.data(), t.data());
      for (int r = 0; r < opt.max_labels && t[5 * r] >= 0; ++r) {
        const float* row = &t[5 * r];
        const double x1 = row[1] * S, y1 = row[2] * S, x2 = row[3] * S, y2 = row[4] * S;
        ++st.boxes;
        // The centre of every box of some size away from the border shows the class colour
        // (boxes cut by the border may show a part of the object off their centre).
        if (x1 < 1 || y1 < 1 || x2 > S - 1 || y2 > S - 1) continue;
        ++st.whole;
        st.side += std::sqrt((x2 - x1) * (y2 - y1));
        if (x2 - x1 < 6 || y2 - y1 < 6) continue;
        const int cx = static_cast<int>((x1 + x2) / 2), cy = static_cast<int>((y1 + y2) / 2);
        if (colour_class(&img[(static_cast<size_t>(cy) * S + cx) * 3]) != static_cast<int>(row[0])) ++st.wrong;
      }
    }
  return st;
}

}  // namespace

TEST(DataAugmentInvariants, EveryBoxKeepsItsColourThroughEveryTransform) {
  const auto files = colour_images("aug_colour", 8, 160, 120, 3);
  // The blend recipe (YOLOv9's) and the scaled-paste one (YOLOX's).
  for (const bool paste : {false, true}) {
    DatasetOptions d;
    d.imgsz = 96;
    const YoloDataset ds(files, d);
    AugmentOptions opt;
    opt.imgsz = 96;
    opt.max_labels = 40;
    if (paste) {
      opt.recipe = AugmentRecipe{Mixup::ScaledPaste, 0.0, false};
      opt.degrees = 10, opt.shear = 2, opt.mosaic_scale_lo = 0.1, opt.mosaic_scale_hi = 2.0;
    }
    for (const bool mosaic : {true, false}) {
      const Stats st = sample_stats(ds, opt, mosaic, 12);
      ASSERT_GT(st.boxes, 50);
      EXPECT_EQ(st.wrong, 0) << "paste " << paste << " mosaic " << mosaic << ": " << st.wrong
                             << " of " << st.boxes << " boxes show another colour";
    }
  }
}

TEST(DataAugmentInvariants, MosaicSamplesShowObjectsAtThePlainSamplesScale) {
  // The mosaic's affine scale s is drawn uniformly in [0.5, 1.5] around the tiles' own scale,
  // which is the plain samples' (and validation's) scale. Counted per object, a window at scale
  // s shows 1/s^2 as many objects, so the mean object side, mosaic over plain, is
  // E[s / s^2] / E[1 / s^2] = ln 3 / (4/3) = 0.82 (a little less: larger objects are cut by the
  // border more often). Showing the whole 2S canvas at S (scale 1/2) would give 0.5.
  const auto files = colour_images("aug_scale", 8, 160, 120, 4, /*small=*/true);
  DatasetOptions d;
  d.imgsz = 128;
  const YoloDataset ds(files, d);
  AugmentOptions opt;
  opt.imgsz = 128;
  opt.max_labels = 40;
  const Stats plain = sample_stats(ds, opt, false, 4);
  const Stats mosaic = sample_stats(ds, opt, true, 24);
  ASSERT_GT(mosaic.whole, 100);
  const double ratio = (mosaic.side / mosaic.whole) / (plain.side / plain.whole);
  std::printf("mean object side (sqrt area), mosaic / plain: %.3f\n", ratio);
  EXPECT_GT(ratio, 0.7);
  EXPECT_LT(ratio, 0.95);
}
