// Mosaic geometry, HSV, flip, letterbox, box filters and targets.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "data/augment.hpp"
#include "ops/image_ops.hpp"
#include "support.hpp"

using namespace libreyolo;
using namespace libreyolo::data;

namespace {

Sample solid(int h, int w, uint8_t r, uint8_t g, uint8_t b, std::vector<Box> boxes = {}) {
  Sample s;
  s.image = torch::empty({h, w, 3}, torch::kUInt8);
  s.image.select(2, 0).fill_(r);
  s.image.select(2, 1).fill_(g);
  s.image.select(2, 2).fill_(b);
  s.boxes = std::move(boxes);
  return s;
}

std::vector<uint8_t> pixel(const torch::Tensor& img, int y, int x) {
  auto a = img.accessor<uint8_t, 3>();
  return {a[y][x][0], a[y][x][1], a[y][x][2]};
}

void expect_box(const Box& b, double x1, double y1, double x2, double y2, double cls) {
  EXPECT_NEAR(b.x1, x1, 1e-9);
  EXPECT_NEAR(b.y1, y1, 1e-9);
  EXPECT_NEAR(b.x2, x2, 1e-9);
  EXPECT_NEAR(b.y2, y2, 1e-9);
  EXPECT_EQ(b.cls, cls);
}

// ---- float64 HSV in OpenCV's 8-bit convention, written from the textbook definitions ----------
void ref_rgb_to_hsv(int r, int g, int b, double& h, double& s, double& v) {
  const double mx = std::max({r, g, b}), mn = std::min({r, g, b}), d = mx - mn;
  v = mx;
  s = mx > 0 ? 255.0 * d / mx : 0.0;
  double deg = 0;
  if (d > 0) {
    if (mx == r)
      deg = 60.0 * (g - b) / d;
    else if (mx == g)
      deg = 120.0 + 60.0 * (b - r) / d;
    else
      deg = 240.0 + 60.0 * (r - g) / d;
  }
  if (deg < 0) deg += 360.0;
  h = deg / 2.0;
}

void ref_hsv_to_rgb(double h, double s, double v, double out[3]) {
  const double sf = s / 255.0, deg = h * 2.0;
  const double c = v * sf, hp = deg / 60.0;
  const double x = c * (1 - std::abs(std::fmod(hp, 2.0) - 1));
  double r = 0, g = 0, b = 0;
  switch (static_cast<int>(hp) % 6) {
    case 0: r = c, g = x; break;
    case 1: r = x, g = c; break;
    case 2: g = c, b = x; break;
    case 3: g = x, b = c; break;
    case 4: r = x, b = c; break;
    default: r = c, b = x; break;
  }
  const double m = v - c;
  out[0] = r + m, out[1] = g + m, out[2] = b + m;
}

std::vector<uint8_t> colour_grid(int step) {
  std::vector<uint8_t> px;
  for (int r = 0; r < 256; r += step)
    for (int g = 0; g < 256; g += step)
      for (int b = 0; b < 256; b += step) px.insert(px.end(), {uint8_t(r), uint8_t(g), uint8_t(b)});
  return px;
}

int chroma(const uint8_t* p) { return std::max({p[0], p[1], p[2]}) - std::min({p[0], p[1], p[2]}); }

}  // namespace

// ---- mosaic ------------------------------------------------------------------------------------
TEST(DataAugment, MosaicCanvasGeometryMatchesAHandComputedCase) {
  // S = 64 (canvas 128), centre xc = 70, yc = 50.
  const Sample t0 = solid(60, 64, 10, 20, 30, {{10, 5, 50, 40, 0}});
  const Sample t1 = solid(32, 64, 200, 0, 0, {{0, 0, 64, 32, 1}});
  const Sample t2 = solid(64, 64, 0, 200, 0, {{30, 10, 60, 60, 2}});
  const Sample t3 = solid(20, 30, 0, 0, 200, {{2, 2, 4, 4, 3}, {0, 0, 30, 20, 3}});
  const Sample m = mosaic_canvas({&t0, &t1, &t2, &t3}, 64, 70, 50);
  EXPECT_EQ(m.image.sizes(), (torch::IntArrayRef{128, 128, 3}));
  // Tile 0 at canvas [6, 0, 70, 50], its top 10 rows cropped: padw 6, padh -10, y1 clipped to 0.
  // Tile 1 at [70, 18, 128, 50]: padw 70, padh 18, x2 134 clipped to 128.
  // Tile 2 at [6, 50, 70, 114]: padw 6, padh 50. Tile 3 at [70, 50, 100, 70].
  ASSERT_EQ(m.boxes.size(), 5u);
  expect_box(m.boxes[0], 16, 0, 56, 30, 0);
  expect_box(m.boxes[1], 70, 18, 128, 50, 1);
  expect_box(m.boxes[2], 36, 60, 66, 110, 2);
  expect_box(m.boxes[3], 72, 52, 74, 54, 3);
  expect_box(m.boxes[4], 70, 50, 100, 70, 3);
  EXPECT_EQ(pixel(m.image, 10, 20), (std::vector<uint8_t>{10, 20, 30}));
  EXPECT_EQ(pixel(m.image, 25, 100), (std::vector<uint8_t>{200, 0, 0}));
  EXPECT_EQ(pixel(m.image, 90, 20), (std::vector<uint8_t>{0, 200, 0}));
  EXPECT_EQ(pixel(m.image, 60, 80), (std::vector<uint8_t>{0, 0, 200}));
  EXPECT_EQ(pixel(m.image, 80, 100), (std::vector<uint8_t>{114, 114, 114}));
  EXPECT_EQ(pixel(m.image, 0, 2), (std::vector<uint8_t>{114, 114, 114}));
  EXPECT_EQ(pixel(m.image, 120, 120), (std::vector<uint8_t>{114, 114, 114}));
}

namespace {

// The mosaic canvas written per pixel from the reference's geometry: tile 0's bottom-right
// corner, tile 1's bottom-left, tile 2's top-right and tile 3's top-left corner meet at (xc, yc)
// on a 2S canvas of 114; tiles larger than S are first shrunk to fit (int() sizes).
torch::Tensor reference_canvas(const std::array<const Sample*, 4>& tiles, int S, int xc, int yc) {
  const int S2 = 2 * S;
  torch::Tensor canvas = torch::full({S2, S2, 3}, 114, torch::kUInt8);
  auto cv = canvas.accessor<uint8_t, 3>();
  for (int k = 0; k < 4; ++k) {
    torch::Tensor img = tiles[k]->image;
    const int h0 = static_cast<int>(img.size(0)), w0 = static_cast<int>(img.size(1));
    const double scale = std::min({1.0, static_cast<double>(S) / h0, static_cast<double>(S) / w0});
    if (scale < 1.0)
      img = libreyolo::ops::resize_bilinear(img, std::max(1, static_cast<int>(h0 * scale)),
                                            std::max(1, static_cast<int>(w0 * scale)));
    const int h = static_cast<int>(img.size(0)), w = static_cast<int>(img.size(1));
    auto src = img.accessor<uint8_t, 3>();
    const int left = k % 2 == 0 ? xc - w : xc, top = k < 2 ? yc - h : yc;
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        const int X = left + x, Y = top + y;
        if (X < 0 || Y < 0 || X >= S2 || Y >= S2) continue;
        for (int c = 0; c < 3; ++c) cv[Y][X][c] = src[y][x][c];
      }
  }
  return canvas;
}

// OpenCV warpAffine's geometry written plainly: output pixel p samples the image at M^-1 p,
// bilinear in single precision with the border value 114, rounded half to even.
torch::Tensor reference_warp(const torch::Tensor& img, const AffineParams& p, int S) {
  const auto& m = p.m;
  const double det = m[0] * m[4] - m[1] * m[3];
  const double r00 = m[4] / det, r01 = -m[1] / det, r10 = -m[3] / det, r11 = m[0] / det;
  const int h = static_cast<int>(img.size(0)), w = static_cast<int>(img.size(1));
  auto src = img.accessor<uint8_t, 3>();
  auto at = [&](int x, int y, int c) { return x < 0 || y < 0 || x >= w || y >= h ? 114.0f : static_cast<float>(src[y][x][c]); };
  torch::Tensor out = torch::empty({S, S, 3}, torch::kUInt8);
  auto o = out.accessor<uint8_t, 3>();
  for (int y = 0; y < S; ++y)
    for (int x = 0; x < S; ++x) {
      const double dx = x - m[2], dy = y - m[5];
      const double sx = r00 * dx + r01 * dy, sy = r10 * dx + r11 * dy;
      for (int c = 0; c < 3; ++c) {
        if (!(sx > -1 && sy > -1 && sx < w && sy < h)) {
          o[y][x][c] = 114;
          continue;
        }
        const int x0 = static_cast<int>(std::floor(sx)), y0 = static_cast<int>(std::floor(sy));
        const float fx = static_cast<float>(sx - x0), fy = static_cast<float>(sy - y0);
        const float top = at(x0, y0, c) * (1 - fx) + at(x0 + 1, y0, c) * fx;
        const float bottom = at(x0, y0 + 1, c) * (1 - fx) + at(x0 + 1, y0 + 1, c) * fx;
        o[y][x][c] = static_cast<uint8_t>(std::clamp(std::nearbyint(top * (1 - fy) + bottom * fy), 0.0f, 255.0f));
      }
    }
  return out;
}

std::array<Sample, 4> random_tiles(Rng& rng, int lo, int hi) {
  std::array<Sample, 4> t;
  for (Sample& s : t) {
    const int h = static_cast<int>(rng.randint(lo, hi)), w = static_cast<int>(rng.randint(lo, hi));
    s.image = torch::randint(0, 256, {h, w, 3}, torch::kUInt8);
    for (int b = 0; b < 3; ++b) {
      const double x1 = rng.uniform(0, w), y1 = rng.uniform(0, h);
      s.boxes.push_back({x1, y1, x1 + rng.uniform(0, w), y1 + rng.uniform(0, h), static_cast<double>(b)});
    }
  }
  return t;
}

}  // namespace

TEST(DataAugment, MosaicCanvasEqualsTheReferencePlacementBitForBit) {
  // Random tiles (smaller than, equal to and larger than S, odd sizes) and random centres (odd
  // ones, and the extremes).
  torch::manual_seed(5);
  Rng rng(11);
  for (const int S : {64, 37, 96}) {
    for (int trial = 0; trial < 16; ++trial) {
      const std::array<Sample, 4> t = random_tiles(rng, 1, 3 * S / 2);
      int xc = static_cast<int>(rng.randint(0, 2 * S)), yc = static_cast<int>(rng.randint(0, 2 * S));
      if (trial == 0) xc = 0, yc = 2 * S;
      if (trial == 1) xc = 2 * S, yc = 0;
      const Sample canvas = mosaic_canvas({&t[0], &t[1], &t[2], &t[3]}, S, xc, yc);
      ASSERT_TRUE(torch::equal(canvas.image, reference_canvas({&t[0], &t[1], &t[2], &t[3]}, S, xc, yc)))
          << "S " << S << " centre " << xc << "," << yc;
    }
  }
}

TEST(DataAugment, MosaicSampleIsTheCanvasWarpedBitForBit) {
  // The plan never builds the 2S canvas; drawn, it must still be the reference canvas warped by
  // the affine (any rotation, scale, shear, translation), and its boxes the canvas boxes'
  // transformed hulls clipped to S.
  torch::manual_seed(6);
  Rng rng(12);
  AugmentOptions o;
  o.degrees = 30, o.shear = 5, o.translate = 0.2, o.mosaic_scale_lo = 0.3, o.mosaic_scale_hi = 2.0;
  for (const int S : {64, 48}) {
    for (int trial = 0; trial < 12; ++trial) {
      const std::array<Sample, 4> t = random_tiles(rng, 8, S);
      std::array<Tile, 4> tiles;
      for (int k = 0; k < 4; ++k)
        tiles[k] = {t[k].image, static_cast<int>(t[k].image.size(0)), static_cast<int>(t[k].image.size(1)), t[k].boxes, k};
      const int xc = static_cast<int>(rng.randint(S / 2, 3 * S / 2)), yc = static_cast<int>(rng.randint(S / 2, 3 * S / 2));
      const AffineParams a = draw_affine(rng, o, S);
      std::vector<Box> boxes;
      SampleDraw d = mosaic_plan({&tiles[0], &tiles[1], &tiles[2], &tiles[3]}, S, xc, yc, &boxes);
      warp_plan(d, a, S, &boxes);
      std::array<const torch::Tensor*, 4> src{};
      for (int k = 0; k < d.num_tiles; ++k) src[k] = &t[d.tiles[k].index].image;
      torch::Tensor got = torch::empty({S, S, 3}, torch::kUInt8);
      render_sample(d, src, S, got.data_ptr<uint8_t>());
      const torch::Tensor want = reference_warp(reference_canvas({&t[0], &t[1], &t[2], &t[3]}, S, xc, yc), a, S);
      ASSERT_TRUE(torch::equal(got, want)) << "S " << S << " trial " << trial;
      const Sample canvas = mosaic_canvas({&t[0], &t[1], &t[2], &t[3]}, S, xc, yc);
      const Sample warped = warp_affine(canvas, a, S);
      ASSERT_TRUE(torch::equal(warped.image, want));
      ASSERT_EQ(boxes.size(), warped.boxes.size());
      for (size_t i = 0; i < boxes.size(); ++i)
        expect_box(boxes[i], warped.boxes[i].x1, warped.boxes[i].y1, warped.boxes[i].x2, warped.boxes[i].y2,
                   warped.boxes[i].cls);
    }
  }
}

TEST(DataAugment, MosaicFromReducedTilesHasTheSameBoxesAndNearlyTheSamePixels) {
  // Tiles whose pixels are a half-resolution decode (as a JPEG decoded at DCT scale 1/2) are
  // resampled as the plan draws them: the boxes must be exactly those of the full tiles, the
  // pixels those of the full tiles within interpolation.
  torch::manual_seed(21);
  Rng rng(23);
  AugmentOptions o;
  for (const int S : {128, 96}) {
    for (int trial = 0; trial < 8; ++trial) {
      std::array<Tile, 4> full, reduced;
      for (int k = 0; k < 4; ++k) {
        const int h = static_cast<int>(rng.randint(8, S)), w = static_cast<int>(rng.randint(8, S));
        const torch::Tensor coarse = torch::randint(0, 256, {std::max(2, h / 6), std::max(2, w / 6), 3}, torch::kUInt8);
        const torch::Tensor img = libreyolo::ops::resize_bilinear(coarse, h, w);  // smooth, like a photo
        std::vector<Box> b = {{1.0 * k, 2.0, w - 1.0, h - 2.0, 1.0 * k}};
        full[k] = {img, h, w, b, k};
        reduced[k] = {libreyolo::ops::resize_bilinear(img, (h + 1) / 2, (w + 1) / 2), h, w, b, k};
      }
      const int xc = static_cast<int>(rng.randint(S / 2, 3 * S / 2)), yc = static_cast<int>(rng.randint(S / 2, 3 * S / 2));
      const AffineParams a = draw_affine(rng, o, S);
      torch::Tensor img_full = torch::empty({S, S, 3}, torch::kUInt8), img_reduced = torch::empty({S, S, 3}, torch::kUInt8);
      std::vector<Box> bf, br;
      for (auto* set : {&full, &reduced}) {
        std::vector<Box>& boxes = set == &full ? bf : br;
        SampleDraw d = mosaic_plan({&(*set)[0], &(*set)[1], &(*set)[2], &(*set)[3]}, S, xc, yc, &boxes);
        warp_plan(d, a, S, &boxes);
        std::array<const torch::Tensor*, 4> src{};
        for (int k = 0; k < d.num_tiles; ++k) src[k] = &(*set)[d.tiles[k].index].image;
        render_sample(d, src, S, (set == &full ? img_full : img_reduced).data_ptr<uint8_t>());
      }
      ASSERT_EQ(bf.size(), br.size());
      for (size_t i = 0; i < bf.size(); ++i) expect_box(br[i], bf[i].x1, bf[i].y1, bf[i].x2, bf[i].y2, bf[i].cls);
      const torch::Tensor diff = (img_full.to(torch::kInt) - img_reduced.to(torch::kInt)).abs().to(torch::kDouble);
      EXPECT_LT(diff.mean().item<double>(), 4.0) << "S " << S << " trial " << trial;
    }
  }
}

TEST(DataAugment, IdentityDrawsGiveBackTheInput) {
  // Tile 0 of exactly S x S with the centre at (S, S) fills the canvas's top-left quarter; the
  // identity affine shows that quarter; no HSV or flip: the sample is tile 0, boxes unchanged.
  torch::manual_seed(8);
  const int S = 32;
  Rng rng(3);
  std::array<Sample, 4> t = random_tiles(rng, 4, S);
  t[0].image = torch::randint(0, 256, {S, S, 3}, torch::kUInt8);
  t[0].boxes = {{3, 4, 20, 30, 2}};
  AugmentOptions o;
  o.translate = 0, o.mosaic_scale_lo = o.mosaic_scale_hi = 1.0;
  const AffineParams id = draw_affine(rng, o, S);
  std::array<Tile, 4> tiles;
  for (int k = 0; k < 4; ++k)
    tiles[k] = {t[k].image, static_cast<int>(t[k].image.size(0)), static_cast<int>(t[k].image.size(1)), t[k].boxes, k};
  std::vector<Box> boxes;
  SampleDraw d = mosaic_plan({&tiles[0], &tiles[1], &tiles[2], &tiles[3]}, S, S, S, &boxes);
  warp_plan(d, id, S, &boxes);
  std::array<const torch::Tensor*, 4> src{};
  for (int k = 0; k < d.num_tiles; ++k) src[k] = &t[d.tiles[k].index].image;
  torch::Tensor got = torch::empty({S, S, 3}, torch::kUInt8);
  render_sample(d, src, S, got.data_ptr<uint8_t>());
  EXPECT_TRUE(torch::equal(got, t[0].image));
  ASSERT_GE(boxes.size(), 1u);
  expect_box(boxes[0], 3, 4, 20, 30, 2);
  for (size_t i = 1; i < boxes.size(); ++i) EXPECT_TRUE(boxes[i].x2 - boxes[i].x1 <= 0 || boxes[i].y2 - boxes[i].y1 <= 0);
  // And the transform with no HSV and no flip letterboxes an S x S image to itself.
  std::vector<uint8_t> img(S * S * 3);
  std::vector<float> tgt(5 * 4);
  apply_transform(t[0], TransformParams{}, S, 4, img.data(), tgt.data());
  EXPECT_EQ(0, std::memcmp(img.data(), t[0].image.data_ptr<uint8_t>(), img.size()));
  EXPECT_FLOAT_EQ(tgt[0], 2.0f);
  EXPECT_FLOAT_EQ(tgt[1], 3.0f / S);
  EXPECT_FLOAT_EQ(tgt[4], 30.0f / S);
}

TEST(DataAugment, MosaicDrawStaysInRangeAndPrefersPartnersWithLabels) {
  Rng rng(7);
  int64_t labelled = 0;
  std::array<int64_t, 5> uniform{};
  for (int i = 0; i < 2000; ++i) {
    const MosaicParams p = draw_mosaic(rng, 640, 5, [](int64_t j) { return j == 3 ? int64_t{2} : int64_t{0}; });
    ASSERT_GE(p.xc, 320);
    ASSERT_LT(p.xc, 960);
    ASSERT_GE(p.yc, 320);
    ASSERT_LT(p.yc, 960);
    for (int64_t o : p.others) {
      ASSERT_TRUE(o >= 0 && o < 5);
      labelled += o == 3;
    }
    for (int64_t o : draw_mosaic(rng, 640, 5).others) ++uniform[static_cast<size_t>(o)];
  }
  // Only image 3 has labels: a partner is another image only when 20 draws all missed it.
  EXPECT_GT(labelled, 6000 * 0.97);
  // Without label counts every image is as likely.
  for (int64_t c : uniform) EXPECT_NEAR(c, 6000 / 5, 150);
}

// ---- HSV ---------------------------------------------------------------------------------------
TEST(DataAugment, RgbToHsvMatchesTheFloatDefinition) {
  const auto px = colour_grid(5);
  const int64_t n = static_cast<int64_t>(px.size() / 3);
  std::vector<uint8_t> hsv(px.size());
  rgb_to_hsv(px.data(), hsv.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    double h, s, v;
    ref_rgb_to_hsv(px[3 * i], px[3 * i + 1], px[3 * i + 2], h, s, v);
    ASSERT_LT(hsv[3 * i], 180);
    const double dh = std::abs(hsv[3 * i] - h);
    // Rounded to nearest; the fixed-point reciprocals may move a near-tie by a fraction.
    ASSERT_LE(std::min(dh, 180 - dh), 0.7) << i;  // hue is mod 180
    ASSERT_LE(std::abs(hsv[3 * i + 1] - s), 0.7) << i;
    ASSERT_EQ(hsv[3 * i + 2], v);
  }
}

TEST(DataAugment, HsvToRgbMatchesTheFloatDefinition) {
  std::vector<uint8_t> hsv;
  for (int h = 0; h < 180; h += 3)
    for (int s = 0; s < 256; s += 5)
      for (int v = 0; v < 256; v += 5) hsv.insert(hsv.end(), {uint8_t(h), uint8_t(s), uint8_t(v)});
  const int64_t n = static_cast<int64_t>(hsv.size() / 3);
  std::vector<uint8_t> rgb(hsv.size());
  hsv_to_rgb(hsv.data(), rgb.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    double ref[3];
    ref_hsv_to_rgb(hsv[3 * i], hsv[3 * i + 1], hsv[3 * i + 2], ref);
    for (int c = 0; c < 3; ++c) ASSERT_LE(std::abs(rgb[3 * i + c] - ref[c]), 0.5 + 1e-3) << i;
  }
}

TEST(DataAugment, HsvZeroGainIsIdentityUpToHueQuantisation) {
  const auto px = colour_grid(3);
  const int64_t n = static_cast<int64_t>(px.size() / 3);
  std::vector<uint8_t> out(px.size());
  shift_hsv(px.data(), out.data(), n, {0, 0, 0});
  for (int64_t i = 0; i < n; ++i) {
    const int c = chroma(&px[3 * i]);
    for (int k = 0; k < 3; ++k) {
      const int err = std::abs(out[3 * i + k] - px[3 * i + k]);
      // Greys are exact. Otherwise H has 2-degree steps: rounded H is off by up to 0.66 of a step
      // (half a step plus the fixed-point reciprocal), which moves the middle channel by up to
      // chroma * 1.32 / 60; S and the final rounding add half a level each. OpenCV's round trip
      // is not the identity either.
      if (c == 0) ASSERT_EQ(err, 0) << i;
      ASSERT_LE(err, 1.0 + c / 45.0) << i;
      if (c <= 60) ASSERT_LE(err, 1) << i;  // low-chroma colours: within one level
    }
  }
}

TEST(DataAugment, HsvShiftMatchesAFloat64Pipeline) {
  const auto px = colour_grid(5);
  const int64_t n = static_cast<int64_t>(px.size() / 3);
  for (const HsvGains g : {HsvGains{4, -25, 17}, HsvGains{-5, 30, -30}, HsvGains{0, 0, 29}}) {
    std::vector<uint8_t> out(px.size());
    shift_hsv(px.data(), out.data(), n, g);
    double sum_err = 0;
    for (int64_t i = 0; i < n; ++i) {
      double h, s, v;
      ref_rgb_to_hsv(px[3 * i], px[3 * i + 1], px[3 * i + 2], h, s, v);
      // uint8 HSV: H and S rounded; H wraps mod 180, S and V clip.
      double hq = std::fmod(std::round(h), 180.0);
      hq = std::fmod(hq + g.h + 180.0, 180.0);
      const double sq = std::clamp(std::round(s) + g.s, 0.0, 255.0);
      const double vq = std::clamp(v + g.v, 0.0, 255.0);
      double ref[3];
      ref_hsv_to_rgb(hq, sq, vq, ref);
      // Rounding ties of H or S may land one step apart; allow the effect of one step.
      const double tol = 1.0 + (vq * sq / 255.0) / 30.0 + vq / 255.0;
      for (int k = 0; k < 3; ++k) {
        const double err = std::abs(out[3 * i + k] - ref[k]);
        ASSERT_LE(err, tol) << "pixel " << i << " gains " << g.h << "," << g.s << "," << g.v;
        sum_err += err;
      }
    }
    EXPECT_LT(sum_err / (3.0 * n), 0.3);
  }
  // Hue wraps: pure red (H = 0) shifted by -5 becomes magenta-ish red (H = 175): blue rises.
  const uint8_t red[3] = {255, 0, 0};
  uint8_t o[3];
  shift_hsv(red, o, 1, {-5, 0, 0});
  EXPECT_EQ(o[0], 255);
  EXPECT_EQ(o[1], 0);
  EXPECT_NEAR(o[2], 255.0 * 10 / 60, 1.0);
}

TEST(DataAugment, HsvGainDrawFollowsTheRecipe) {
  Rng rng(3);
  AugmentOptions opt;
  int zero_h = 0, n = 4000;
  for (int i = 0; i < n; ++i) {
    const HsvGains g = draw_hsv_gains(rng, opt);
    ASSERT_LE(std::abs(g.h), 4);  // |U(-1,1) * 5| < 5, truncated toward zero
    ASSERT_LE(std::abs(g.s), 29);
    ASSERT_LE(std::abs(g.v), 29);
    zero_h += g.h == 0;
  }
  // P(h == 0) = 0.5 (zeroed) + 0.5 * P(|U * 5| < 1) = 0.5 + 0.1.
  EXPECT_NEAR(static_cast<double>(zero_h) / n, 0.6, 0.04);
}

// ---- per-sample transform ------------------------------------------------------------------------
TEST(DataAugment, FlipMirrorsPixelsAndBoxes) {
  Sample s = solid(64, 64, 255, 0, 0, {{0, 0, 10, 20, 2}});
  s.image.narrow(1, 32, 32).select(2, 0).fill_(0);
  s.image.narrow(1, 32, 32).select(2, 2).fill_(255);  // right half blue
  TransformParams p;
  p.flip = true;
  std::vector<uint8_t> img(64 * 64 * 3);
  std::vector<float> tgt(100 * 5);
  apply_transform(s, p, 64, 100, img.data(), tgt.data());
  EXPECT_EQ(img[0], 0);  // left edge is now blue
  EXPECT_EQ(img[2], 255);
  EXPECT_EQ(img[(63) * 3], 255);  // right edge red
  EXPECT_FLOAT_EQ(tgt[0], 2.0f);
  EXPECT_FLOAT_EQ(tgt[1], 54.0f / 64);
  EXPECT_FLOAT_EQ(tgt[2], 0.0f);
  EXPECT_FLOAT_EQ(tgt[3], 1.0f);
  EXPECT_FLOAT_EQ(tgt[4], 20.0f / 64);
  EXPECT_FLOAT_EQ(tgt[5], -1.0f);
}

TEST(DataAugment, LetterboxIsTopLeftWithPad114) {
  // Longer side already S: pasted as is.
  Sample s = solid(32, 64, 1, 2, 3, {{8, 8, 24, 16, 0}});
  std::vector<uint8_t> img(64 * 64 * 3);
  std::vector<float> tgt(100 * 5);
  apply_transform(s, TransformParams{}, 64, 100, img.data(), tgt.data());
  EXPECT_EQ(img[(31 * 64 + 63) * 3 + 2], 3);
  EXPECT_EQ(img[(32 * 64) * 3], 114);
  EXPECT_EQ(img[(63 * 64 + 63) * 3 + 1], 114);
  EXPECT_FLOAT_EQ(tgt[1], 8.0f / 64);
  EXPECT_FLOAT_EQ(tgt[4], 16.0f / 64);
  // Smaller image: resized by r = min(64/20, 64/40) = 1.6 to 64 x 32, boxes x 1.6.
  Sample small = solid(20, 40, 9, 9, 9, {{5, 5, 15, 10, 1}});
  apply_transform(small, TransformParams{}, 64, 100, img.data(), tgt.data());
  EXPECT_EQ(img[(31 * 64 + 63) * 3], 9);
  EXPECT_EQ(img[(32 * 64) * 3], 114);
  EXPECT_FLOAT_EQ(tgt[1], static_cast<float>(5 * 1.6 / 64));
  EXPECT_FLOAT_EQ(tgt[3], static_cast<float>(15 * 1.6 / 64));
}

TEST(DataAugment, SmallBoxesAreFilteredAndAllGoneFallsBack) {
  TransformParams p;
  p.hsv = true;
  p.gains = {5, 30, 30};
  p.flip = true;
  std::vector<uint8_t> img(32 * 32 * 3);
  std::vector<float> tgt(100 * 5);
  // w = 1 is not > 1: dropped; the other box survives, the image is augmented (flipped).
  Sample s = solid(32, 32, 100, 50, 20, {{0, 0, 1, 10, 0}, {4, 4, 12, 20, 1}, {-5, 2, 40, 3.5, 2}});
  s.image[0][0][0] = 0;
  apply_transform(s, p, 32, 100, img.data(), tgt.data());
  EXPECT_FLOAT_EQ(tgt[0], 1.0f);
  EXPECT_FLOAT_EQ(tgt[1], 20.0f / 32);
  EXPECT_FLOAT_EQ(tgt[3], 28.0f / 32);
  EXPECT_FLOAT_EQ(tgt[5], 2.0f);  // out-of-image box: measured before clipping, then clipped
  EXPECT_FLOAT_EQ(tgt[6], 0.0f);
  EXPECT_FLOAT_EQ(tgt[8], 1.0f);
  EXPECT_FLOAT_EQ(tgt[10], -1.0f);
  EXPECT_NE(img[0], 100);  // HSV changed the colours
  // Every box too small: the un-augmented image and all its boxes.
  Sample tiny = solid(32, 32, 100, 50, 20, {{0, 0, 1, 10, 0}, {3, 3, 4, 4, 1}});
  tiny.image[0][0][0] = 0;
  apply_transform(tiny, p, 32, 100, img.data(), tgt.data());
  EXPECT_EQ(img[0], 0);  // not flipped, not recoloured
  EXPECT_EQ(img[3], 100);
  EXPECT_FLOAT_EQ(tgt[0], 0.0f);
  EXPECT_FLOAT_EQ(tgt[3], 1.0f / 32);
  EXPECT_FLOAT_EQ(tgt[5], 1.0f);
  EXPECT_FLOAT_EQ(tgt[10], -1.0f);
}

TEST(DataAugment, NoBoxesMeansLetterboxOnlyInTheYoloxRecipeAndTargetsArePadding) {
  TransformParams p;
  p.augment_empty = false;
  p.hsv = true;
  p.gains = {5, 30, 30};
  p.flip = true;
  Sample s = solid(16, 32, 10, 200, 30);
  s.image[0][0][0] = 0;
  std::vector<uint8_t> img(32 * 32 * 3);
  std::vector<float> tgt(7 * 5, 42.0f);
  apply_transform(s, p, 32, 7, img.data(), tgt.data());
  EXPECT_EQ(img[0], 0);
  EXPECT_EQ(img[1], 200);
  for (int r = 0; r < 7; ++r) {
    EXPECT_FLOAT_EQ(tgt[5 * r], -1.0f);
    for (int k = 1; k < 5; ++k) EXPECT_FLOAT_EQ(tgt[5 * r + k], 0.0f);
  }
}

TEST(DataAugment, TargetsKeepTheFirstMaxLabelsRows) {
  std::vector<Box> boxes;
  for (int i = 0; i < 120; ++i) boxes.push_back({1.0 + i * 0.1, 2, 20, 30, double(i % 7)});
  Sample s = solid(64, 64, 1, 1, 1, boxes);
  std::vector<uint8_t> img(64 * 64 * 3);
  std::vector<float> tgt(100 * 5);
  apply_transform(s, TransformParams{}, 64, 100, img.data(), tgt.data());
  for (int r = 0; r < 100; ++r) {
    EXPECT_FLOAT_EQ(tgt[5 * r], float(r % 7));
    EXPECT_FLOAT_EQ(tgt[5 * r + 1], static_cast<float>((1.0 + r * 0.1) / 64));
  }
}

TEST(DataAugment, TransformDrawUsesTheProbabilities) {
  Rng rng(11);
  AugmentOptions opt;
  int flips = 0, hsv = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const TransformParams p = draw_transform(rng, opt);
    flips += p.flip;
    hsv += p.hsv;
  }
  EXPECT_EQ(hsv, n);  // hsv_prob = 1
  EXPECT_NEAR(static_cast<double>(flips) / n, 0.5, 0.04);
  opt.hsv_prob = 0;
  opt.flip_prob = 0;
  for (int i = 0; i < 100; ++i) {
    const TransformParams p = draw_transform(rng, opt);
    EXPECT_FALSE(p.hsv || p.flip);
  }
}

TEST(DataAugment, SampleGeneratorsAreIndependentAndRepeatable) {
  Rng a = Rng::for_sample(0, 1, 2, 0), b = Rng::for_sample(0, 1, 2, 0);
  Rng c = Rng::for_sample(0, 1, 3, 0), d = Rng::for_sample(0, 1, 2, 1), e = Rng::for_sample(0, 2, 2, 0);
  const uint64_t x = a.next_u64();
  EXPECT_EQ(x, b.next_u64());
  EXPECT_NE(x, c.next_u64());
  EXPECT_NE(x, d.next_u64());
  EXPECT_NE(x, e.next_u64());
  Rng r(5);
  double sum = 0;
  for (int i = 0; i < 2000; ++i) sum += r.beta(32, 32);
  EXPECT_NEAR(sum / 2000, 0.5, 0.01);
}

TEST(DataAugment, FusedHsvShiftEqualsConvertShiftConvertBack) {
  // shift_hsv runs a vectorised kernel; it must give exactly what the per-pixel conversions give.
  const auto px = colour_grid(3);
  const int64_t n = static_cast<int64_t>(px.size() / 3);
  std::vector<uint8_t> hsv(px.size()), expect(px.size()), got(px.size()), flipped(px.size());
  rgb_to_hsv(px.data(), hsv.data(), n);
  for (const HsvGains g : {HsvGains{0, 0, 0}, HsvGains{4, -25, 17}, HsvGains{-5, 30, -30},
                           HsvGains{179, 255, -255}, HsvGains{-200, 3, 3}}) {
    std::vector<uint8_t> shifted(hsv);
    for (int64_t i = 0; i < n; ++i) {
      shifted[3 * i] = static_cast<uint8_t>(((hsv[3 * i] + g.h) % 180 + 180) % 180);
      shifted[3 * i + 1] = static_cast<uint8_t>(std::clamp(hsv[3 * i + 1] + g.s, 0, 255));
      shifted[3 * i + 2] = static_cast<uint8_t>(std::clamp(hsv[3 * i + 2] + g.v, 0, 255));
    }
    hsv_to_rgb(shifted.data(), expect.data(), n);
    shift_hsv(px.data(), got.data(), n, g);
    ASSERT_EQ(got, expect) << g.h << "," << g.s << "," << g.v;
    // Reversed read: pixel i of the output is pixel n-1-i of the input.
    shift_hsv(px.data(), flipped.data(), n, g, true);
    for (int64_t i = 0; i < n; ++i)
      for (int c = 0; c < 3; ++c) ASSERT_EQ(flipped[3 * i + c], expect[3 * (n - 1 - i) + c]);
  }
}

// ---- YOLOX pipeline: mosaic canvas, random affine, mixup ---------------------------------------

TEST(DataAugmentYolox, AffineDrawFollowsTheRangesAndZeroMagnitudesGiveTheIdentity) {
  AugmentOptions o;
  o.degrees = 0;  // integer zero magnitudes are fine
  o.shear = 0;
  o.translate = 0;
  o.mosaic_scale_lo = o.mosaic_scale_hi = 1.0;
  Rng rng(3);
  const AffineParams id = draw_affine(rng, o, 64);
  const std::array<double, 6> want{1, 0, 0, 0, 1, 0};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(id.m[i], want[i], 1e-12) << i;
  // YOLOX's ranges: scale in [0.1, 2], translation within 10% of S.
  AugmentOptions d;
  d.mosaic_scale_lo = 0.1, d.mosaic_scale_hi = 2.0, d.degrees = 10, d.shear = 2;
  for (int k = 0; k < 200; ++k) {
    const AffineParams p = draw_affine(rng, d, 100);
    const double scale = std::sqrt(std::abs(p.m[0] * p.m[4] - p.m[1] * p.m[3]));
    EXPECT_GT(scale, 0.09);
    EXPECT_LT(scale, 2.1);
    EXPECT_LE(std::abs(p.m[2]), 10.0);
    EXPECT_LE(std::abs(p.m[5]), 10.0);
  }
}

TEST(DataAugmentYolox, AffineWarpsPixelsAndBoxes) {
  // A 2S canvas with a distinct colour per quadrant and one box.
  const int S = 32;
  Sample canvas = solid(2 * S, 2 * S, 10, 20, 30, {{8, 4, 40, 60, 2}});
  canvas.image.slice(0, S).slice(1, S).fill_(200);
  // Identity: the output is the canvas's top-left S x S; the box is clipped to it.
  AffineParams id;
  Sample a = warp_affine(canvas, id, S);
  EXPECT_TRUE(torch::equal(a.image, canvas.image.slice(0, 0, S).slice(1, 0, S)));
  ASSERT_EQ(a.boxes.size(), 1u);
  expect_box(a.boxes[0], 8, 4, 32, 32, 2);
  // Scale 0.5 about the origin: the whole canvas, output (x, y) = canvas (2x, 2y).
  AffineParams half;
  half.m = {0.5, 0, 0, 0, 0.5, 0};
  Sample b = warp_affine(canvas, half, S);
  EXPECT_EQ(pixel(b.image, 3, 3), (std::vector<uint8_t>{10, 20, 30}));
  EXPECT_EQ(pixel(b.image, S - 2, S - 2), (std::vector<uint8_t>{200, 200, 200}));
  expect_box(b.boxes[0], 4, 2, 20, 30, 2);
  // A shift past the canvas shows the border value 114.
  AffineParams shift;
  shift.m = {1, 0, 0, 0, 1, -40};  // source y = output y + 40
  Sample c = warp_affine(canvas, shift, S);
  EXPECT_EQ(pixel(c.image, 30, 5), (std::vector<uint8_t>{114, 114, 114}));
  EXPECT_EQ(pixel(c.image, 10, 5), (std::vector<uint8_t>{10, 20, 30}));
  expect_box(c.boxes[0], 8, 0, 32, 20, 2);  // moved up and clipped
  // A 90-degree rotation maps corners onto a rotated hull.
  AffineParams rot;
  rot.m = {0, 1, 0, -1, 0, 64};  // X = y, Y = 64 - x
  Sample d = warp_affine(solid(64, 64, 1, 2, 3, {{10, 20, 30, 25, 0}}), rot, 64);
  expect_box(d.boxes[0], 20, 34, 25, 54, 0);
}

TEST(DataAugmentYolox, MosaicCanvasKeepsTheFullCanvasAndClipsBoxes) {
  const int S = 16;
  const Sample t = solid(S, S, 50, 60, 70, {{0, 0, 16, 16, 1}});
  const Sample c = mosaic_canvas({&t, &t, &t, &t}, S, 16, 16);
  ASSERT_EQ(c.image.sizes(), (std::vector<int64_t>{2 * S, 2 * S, 3}));
  EXPECT_EQ(pixel(c.image, 0, 0), (std::vector<uint8_t>{50, 60, 70}));
  ASSERT_EQ(c.boxes.size(), 4u);
  expect_box(c.boxes[3], 16, 16, 32, 32, 1);
}

TEST(DataAugmentYolox, MixupBlendsHalfAndHalfAndKeepsThePartnersBoxes) {
  const int S = 20;
  Sample base = solid(S, S, 100, 100, 100, {{1, 1, 5, 5, 0}});
  const Sample partner = solid(10, 20, 201, 0, 50, {{2, 1, 6, 9, 3}});  // letterbox ratio 1
  Sample a = base;
  a.image = base.image.clone();
  mixup_paste(a, partner, 1.0, false, 0, 0, S);
  EXPECT_EQ(pixel(a.image, 2, 2), (std::vector<uint8_t>{150, 50, 75}));      // 0.5 a + 0.5 b, truncated
  EXPECT_EQ(pixel(a.image, 15, 2), (std::vector<uint8_t>{107, 107, 107}));   // the partner's 114 padding
  ASSERT_EQ(a.boxes.size(), 2u);
  expect_box(a.boxes[1], 2, 1, 6, 9, 3);
  // Scale 1.5, mirrored, cropped at (4, 2): boxes x -> 30 - x, then shifted and clipped to S.
  Sample b = base;
  b.image = base.image.clone();
  mixup_paste(b, partner, 1.5, true, 4, 2, S);
  ASSERT_EQ(b.boxes.size(), 2u);
  expect_box(b.boxes[1], 30 - 9 - 4, 0, 20, 13.5 - 2, 3);
}
