// Pixel operations: bilinear resize (OpenCV INTER_LINEAR geometry), resize_longest, letterbox.
#include <cmath>
#include <vector>

#include <libreyolo/errors.hpp>

#include "ops/image_ops.hpp"
#include "support.hpp"

namespace ops = libreyolo::ops;

namespace {

torch::Tensor random_image(int64_t h, int64_t w, int64_t c, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randint(0, 256, {h, w, c}, torch::kUInt8);
}

// Exact real-valued bilinear interpolation with half-pixel centres and border clamping.
torch::Tensor reference_resize(const torch::Tensor& img, int64_t oh, int64_t ow) {
  const int64_t h = img.size(0), w = img.size(1), C = img.size(2);
  auto src = img.accessor<uint8_t, 3>();
  auto out = torch::empty({oh, ow, C}, torch::kFloat64);
  auto dst = out.accessor<double, 3>();
  auto axis = [](int64_t d, int64_t in, int64_t o, int64_t* i0, int64_t* i1, double* t) {
    double f = (d + 0.5) * static_cast<double>(in) / static_cast<double>(o) - 0.5;
    f = std::min(std::max(f, 0.0), static_cast<double>(in - 1));
    *i0 = static_cast<int64_t>(std::floor(f));
    *i1 = std::min(*i0 + 1, in - 1);
    *t = f - static_cast<double>(*i0);
  };
  for (int64_t y = 0; y < oh; ++y) {
    int64_t y0, y1;
    double ty;
    axis(y, h, oh, &y0, &y1, &ty);
    for (int64_t x = 0; x < ow; ++x) {
      int64_t x0, x1;
      double tx;
      axis(x, w, ow, &x0, &x1, &tx);
      for (int64_t c = 0; c < C; ++c) {
        const double top = src[y0][x0][c] * (1 - tx) + src[y0][x1][c] * tx;
        const double bottom = src[y1][x0][c] * (1 - tx) + src[y1][x1][c] * tx;
        dst[y][x][c] = top * (1 - ty) + bottom * ty;
      }
    }
  }
  return out;
}

// The exact integer arithmetic resize_bilinear has always used, written out per pixel: taps at
// half-pixel centres clamped to the border, weights round(frac * 2^11), the four products summed
// exactly and rounded once, (sum + 2^21) >> 22. Any faster implementation must match it bit
// for bit (the augmentation's outputs must not move).
// fixed_point_resample: the same at src = (d + 0.5) * scale - 0.5 + shift per axis (a resize:
// scale in / out, shift 0).
torch::Tensor fixed_point_resample(const torch::Tensor& img, int64_t oh, int64_t ow, double scale_y,
                                   double shift_y, double scale_x, double shift_x) {
  const int64_t h = img.size(0), w = img.size(1), C = img.size(2);
  auto src = img.accessor<uint8_t, 3>();
  auto out = torch::empty({oh, ow, C}, torch::kUInt8);
  auto dst = out.accessor<uint8_t, 3>();
  auto taps = [](int64_t d, int64_t in, double scale, double shift, int64_t* i0, int64_t* i1, int64_t* w1) {
    const double f = (static_cast<double>(d) + 0.5) * scale - 0.5 + shift;
    int64_t s = static_cast<int64_t>(std::floor(f));
    double frac = f - static_cast<double>(s);
    if (s < 0) s = 0, frac = 0.0;
    if (s >= in - 1) s = in - 1, frac = 0.0;
    *i0 = s;
    *i1 = std::min(s + 1, in - 1);
    *w1 = std::lround(frac * 2048.0);
  };
  for (int64_t y = 0; y < oh; ++y) {
    int64_t y0, y1, wy;
    taps(y, h, scale_y, shift_y, &y0, &y1, &wy);
    for (int64_t x = 0; x < ow; ++x) {
      int64_t x0, x1, wx;
      taps(x, w, scale_x, shift_x, &x0, &x1, &wx);
      for (int64_t c = 0; c < C; ++c) {
        const int64_t sum = (2048 - wy) * ((2048 - wx) * src[y0][x0][c] + wx * src[y0][x1][c]) +
                            wy * ((2048 - wx) * src[y1][x0][c] + wx * src[y1][x1][c]);
        dst[y][x][c] = static_cast<uint8_t>((sum + (1 << 21)) >> 22);
      }
    }
  }
  return out;
}

torch::Tensor fixed_point_resize(const torch::Tensor& img, int64_t oh, int64_t ow) {
  return fixed_point_resample(img, oh, ow, static_cast<double>(img.size(0)) / static_cast<double>(oh), 0.0,
                              static_cast<double>(img.size(1)) / static_cast<double>(ow), 0.0);
}

double max_diff_to_reference(const torch::Tensor& img, int64_t oh, int64_t ow) {
  const auto got = ops::resize_bilinear(img, static_cast<int>(oh), static_cast<int>(ow));
  EXPECT_EQ(got.sizes(), torch::IntArrayRef({oh, ow, img.size(2)}));
  EXPECT_EQ(got.scalar_type(), torch::kUInt8);
  return (got.to(torch::kFloat64) - reference_resize(img, oh, ow)).abs().max().item<double>();
}

}  // namespace

TEST(Resize, MatchesFloatReferenceWithinOneLevel) {
  struct Case { int64_t h, w, oh, ow, c; };
  const std::vector<Case> cases = {
      {17, 23, 40, 61, 3},    // up
      {64, 48, 21, 13, 3},    // down, odd sizes
      {31, 29, 31, 57, 3},    // one axis only
      {50, 70, 25, 35, 1},    // exact 2x, grey
      {9, 9, 100, 3, 3},      // up one axis, strongly down the other
      {1, 1, 5, 7, 3},        // single pixel
      {1, 9, 4, 4, 3},        // single row
      {8, 1, 3, 5, 1},        // single column
      {13, 11, 1, 1, 3},      // to one pixel
      {12, 10, 7, 9, 4},      // generic channel count
      {240, 320, 161, 213, 3}};
  uint64_t seed = 10;
  for (const auto& k : cases) {
    const auto img = random_image(k.h, k.w, k.c, seed++);
    EXPECT_LE(max_diff_to_reference(img, k.oh, k.ow), 1.0)
        << k.h << "x" << k.w << " -> " << k.oh << "x" << k.ow << " c" << k.c;
  }
}

TEST(Resize, BitIdenticalToTheFixedPointDefinition) {
  // Random sizes up and down (both axes, either order of magnitude), the exact 2x reduction of
  // the mosaic canvas, the loader's 1080 x 810 -> 640 x 480, grey, RGB and 4 channels.
  struct Case { int64_t h, w, oh, ow, c; };
  std::vector<Case> cases = {{810, 1080, 480, 640, 3}, {1280, 1280, 640, 640, 3}, {64, 64, 32, 32, 3},
                             {480, 640, 640, 853, 3},  {5, 700, 9, 31, 3},         {300, 2, 40, 1, 1},
                             {33, 47, 17, 94, 4},      {1, 1, 3, 2, 3}};
  torch::manual_seed(123);
  for (int k = 0; k < 40; ++k) {
    const auto dims = torch::randint(1, 160, {4}, torch::kLong);
    const int64_t c = k % 3 == 0 ? 1 : 3;
    cases.push_back({dims[0].item<int64_t>(), dims[1].item<int64_t>(), dims[2].item<int64_t>(),
                     dims[3].item<int64_t>(), c});
  }
  uint64_t seed = 1000;
  for (const auto& k : cases) {
    const auto img = random_image(k.h, k.w, k.c, seed++);
    const auto got = ops::resize_bilinear(img, static_cast<int>(k.oh), static_cast<int>(k.ow));
    const auto want = fixed_point_resize(img, k.oh, k.ow);
    ASSERT_TRUE(torch::equal(got, want)) << k.h << "x" << k.w << " -> " << k.oh << "x" << k.ow << " c" << k.c
                                         << ": " << (got.to(torch::kInt) - want.to(torch::kInt)).abs().max().item<int>();
  }
  // The same through the letterbox (rows written with a stride into a wider canvas).
  const auto img = random_image(77, 50, 3, 77);
  double r = 0;
  const auto box = ops::letterbox_topleft(img, 320, &r);
  EXPECT_TRUE(torch::equal(box.slice(0, 0, 319).slice(1, 0, 207), fixed_point_resize(img, 319, 207)));
}

TEST(Resample, WindowEqualsTheFixedPointDefinitionAndLeavesTheRestAlone) {
  // Scales both ways, shifts of either sign (the mosaic's half-pixel offsets among them),
  // written as a window into a larger image: the window follows the definition bit for bit,
  // the pixels around it are untouched.
  struct Case { int64_t h, w, oh, ow; double sy, dy, sx, dx; };
  std::vector<Case> cases = {{405, 540, 240, 320, 405.0 / 240, 0.0, 540.0 / 320, 0.0},
                             {405, 540, 100, 130, 2 * 405.0 / 480, 1.5 * 405.0 / 480, 2 * 540.0 / 640, -0.5 * 540.0 / 640},
                             {20, 30, 25, 7, 0.5, -3.25, 3.0, 4.0}};
  torch::manual_seed(7);
  for (int k = 0; k < 30; ++k) {
    const auto d = torch::randint(1, 90, {4}, torch::kLong);
    const auto f = torch::rand({4}, torch::kFloat64);
    cases.push_back({d[0].item<int64_t>(), d[1].item<int64_t>(), d[2].item<int64_t>(), d[3].item<int64_t>(),
                     0.25 + 3 * f[0].item<double>(), 10 * f[1].item<double>() - 5, 0.25 + 3 * f[2].item<double>(),
                     10 * f[3].item<double>() - 5});
  }
  uint64_t seed = 500;
  for (const auto& k : cases) {
    const auto img = random_image(k.h, k.w, 3, seed++);
    auto canvas = torch::full({k.oh + 5, k.ow + 9, 3}, 7, torch::kUInt8);
    uint8_t* at = canvas.data_ptr<uint8_t>() + (2 * canvas.size(1) + 4) * 3;
    ops::resample_bilinear_into(img, at, k.oh, k.ow, canvas.size(1) * 3, k.sy, k.dy, k.sx, k.dx);
    const auto want = fixed_point_resample(img, k.oh, k.ow, k.sy, k.dy, k.sx, k.dx);
    const auto window = canvas.slice(0, 2, 2 + k.oh).slice(1, 4, 4 + k.ow);
    ASSERT_TRUE(torch::equal(window, want)) << k.h << "x" << k.w << " -> " << k.oh << "x" << k.ow;
    auto rest = canvas.clone();
    rest.slice(0, 2, 2 + k.oh).slice(1, 4, 4 + k.ow).fill_(7);
    ASSERT_TRUE(torch::equal(rest, torch::full_like(rest, 7))) << "wrote outside its window";
  }
  // Scale in / out with no shift is resize_bilinear.
  const auto img = random_image(81, 108, 3, 9);
  auto out = torch::empty({48, 64, 3}, torch::kUInt8);
  ops::resample_bilinear_into(img, out.data_ptr<uint8_t>(), 48, 64, 64 * 3, 81.0 / 48, 0.0, 108.0 / 64, 0.0);
  EXPECT_TRUE(torch::equal(out, ops::resize_bilinear(img, 48, 64)));
  EXPECT_THROW(ops::resample_bilinear_into(img, out.data_ptr<uint8_t>(), 4, 4, 12, 0.0, 0.0, 1.0, 0.0),
               libreyolo::UsageError);
  EXPECT_THROW(ops::resample_bilinear_into(img.transpose(0, 1), out.data_ptr<uint8_t>(), 4, 4, 12, 1.0, 0.0, 1.0, 0.0),
               libreyolo::UsageError);
}

TEST(Resize, HandComputedValues) {
  // [0, 255] widened to 4: sample positions -0.25 (clamped), 0.25, 0.75, 1.25 (clamped).
  auto row = torch::tensor({0, 255}, torch::kUInt8).view({1, 2, 1});
  auto out = ops::resize_bilinear(row, 1, 4);
  EXPECT_EQ(out.view(-1)[0].item<int>(), 0);
  EXPECT_EQ(out.view(-1)[1].item<int>(), 64);   // 63.75
  EXPECT_EQ(out.view(-1)[2].item<int>(), 191);  // 191.25
  EXPECT_EQ(out.view(-1)[3].item<int>(), 255);
  // Exact 2x reduction averages each 2x2 block (OpenCV's INTER_AREA coincides), rounding half up.
  auto block = torch::tensor({10, 20, 0, 0, 30, 41, 0, 255}, torch::kUInt8).view({2, 4, 1});
  auto half = ops::resize_bilinear(block, 1, 2);
  EXPECT_EQ(half.view(-1)[0].item<int>(), 25);  // (10 + 20 + 30 + 41) / 4 = 25.25
  EXPECT_EQ(half.view(-1)[1].item<int>(), 64);  // 255 / 4 = 63.75
}

TEST(Resize, IdentityAndConstantImages) {
  const auto img = random_image(19, 27, 3, 5);
  EXPECT_TRUE(torch::equal(ops::resize_bilinear(img, 19, 27), img));
  // A non-contiguous view is read correctly.
  const auto crop = img.slice(1, 3, 20);
  EXPECT_TRUE(torch::equal(ops::resize_bilinear(crop, 19, 17), crop));
  EXPECT_LE(max_diff_to_reference(crop.contiguous(), 30, 5), 1.0);
  // Constant stays constant at any size (weights sum to exactly one).
  const auto flat = torch::full({7, 5, 3}, 200, torch::kUInt8);
  EXPECT_TRUE(torch::equal(ops::resize_bilinear(flat, 13, 3), torch::full({13, 3, 3}, 200, torch::kUInt8)));
  const auto white = torch::full({3, 3, 1}, 255, torch::kUInt8);
  EXPECT_TRUE(torch::equal(ops::resize_bilinear(white, 100, 1), torch::full({100, 1, 1}, 255, torch::kUInt8)));
}

TEST(Resize, BadArguments) {
  const auto img = random_image(4, 4, 3, 1);
  EXPECT_THROW(ops::resize_bilinear(img, 0, 4), libreyolo::UsageError);
  EXPECT_THROW(ops::resize_bilinear(img.to(torch::kFloat), 2, 2), libreyolo::UsageError);
  EXPECT_THROW(ops::resize_bilinear(img.view({16, 3}), 2, 2), libreyolo::UsageError);
  EXPECT_THROW(ops::resize_bilinear(torch::empty({0, 4, 3}, torch::kUInt8), 2, 2),
               libreyolo::UsageError);
  EXPECT_THROW(ops::resize_longest(img, 0), libreyolo::UsageError);
  EXPECT_THROW(ops::letterbox_topleft(img, -1), libreyolo::UsageError);
}

TEST(Resize, ResizeLongestUsesTruncatedSizes) {
  double r = 0;
  // 810 x 1080 at 640: r = 640/1080, sizes 480 x 640.
  auto a = ops::resize_longest(random_image(810, 108, 1, 2).repeat({1, 10, 1}), 640, &r);
  EXPECT_EQ(a.sizes(), torch::IntArrayRef({480, 640, 1}));
  EXPECT_DOUBLE_EQ(r, 640.0 / 1080.0);
  // 50 x 77 at 320: 77 * (320/77) is 319.99999999999994 in double, so int() gives 319.
  auto b = ops::resize_longest(random_image(50, 77, 3, 3), 320, &r);
  EXPECT_EQ(b.sizes(), torch::IntArrayRef({207, 319, 3}));
  // 1 x 1000 at 640: the short side would truncate to 0 and is kept at 1.
  auto c = ops::resize_longest(random_image(1, 1000, 3, 4), 640, &r);
  EXPECT_EQ(c.sizes(), torch::IntArrayRef({1, 640, 3}));
  EXPECT_DOUBLE_EQ(r, 0.64);
  // Already the right size: the input comes back as is.
  const auto d = random_image(480, 640, 3, 5);
  auto e = ops::resize_longest(d, 640, &r);
  EXPECT_EQ(e.data_ptr(), d.data_ptr());
  EXPECT_DOUBLE_EQ(r, 1.0);
  // Upscaling a small image.
  auto f = ops::resize_longest(random_image(3, 7, 3, 6), 5, &r);
  EXPECT_EQ(f.sizes(), torch::IntArrayRef({2, 5, 3}));
}

TEST(Resize, LetterboxPadsRightAndBottom) {
  const auto img = random_image(2, 4, 3, 8);
  double r = 0;
  auto box = ops::letterbox_topleft(img, 8, &r);
  ASSERT_EQ(box.sizes(), torch::IntArrayRef({8, 8, 3}));
  EXPECT_DOUBLE_EQ(r, 2.0);
  EXPECT_TRUE(torch::equal(box.slice(0, 0, 4), ops::resize_bilinear(img, 4, 8)));
  EXPECT_TRUE(torch::equal(box.slice(0, 4), torch::full({4, 8, 3}, 114, torch::kUInt8)));

  // Tall image, custom pad: the right side is padded; int() truncation leaves a padded column.
  const auto tall = random_image(77, 50, 3, 9);
  auto t = ops::letterbox_topleft(tall, 320, &r, 0);
  ASSERT_EQ(t.sizes(), torch::IntArrayRef({320, 320, 3}));
  EXPECT_TRUE(torch::equal(t.slice(0, 0, 319).slice(1, 0, 207), ops::resize_bilinear(tall, 319, 207)));
  EXPECT_EQ(t.slice(1, 207).count_nonzero().item<int64_t>(), 0);
  EXPECT_EQ(t.slice(0, 319).count_nonzero().item<int64_t>(), 0);

  // Same size: a copy of the image, nothing padded.
  const auto sq = random_image(16, 16, 3, 10);
  auto s = ops::letterbox_topleft(sq, 16, &r);
  EXPECT_TRUE(torch::equal(s, sq));
  EXPECT_NE(s.data_ptr(), sq.data_ptr());

  // Grey images keep their single channel.
  auto g = ops::letterbox_topleft(random_image(10, 5, 1, 11), 20, &r);
  EXPECT_EQ(g.sizes(), torch::IntArrayRef({20, 20, 1}));
  EXPECT_TRUE(torch::equal(g.slice(1, 10), torch::full({20, 10, 1}, 114, torch::kUInt8)));
}

TEST(Fit, LetterboxKeepsTheAspectAndStretchScalesEachAxis) {
  const ops::FitBox lb = ops::fit_box(200, 100, 64, ops::Fit::Letterbox);
  EXPECT_EQ(lb.width, 32);
  EXPECT_EQ(lb.height, 64);
  EXPECT_DOUBLE_EQ(lb.sx, 0.32);
  EXPECT_DOUBLE_EQ(lb.sy, 0.32);
  const ops::FitBox st = ops::fit_box(200, 100, 64, ops::Fit::Stretch);
  EXPECT_EQ(st.width, 64);
  EXPECT_EQ(st.height, 64);
  EXPECT_DOUBLE_EQ(st.sx, 0.64);
  EXPECT_DOUBLE_EQ(st.sy, 0.32);

  // Pixels: a stretch is the resize to S x S; a letterbox is letterbox_topleft.
  const auto img = random_image(200, 100, 3, 5);
  ops::FitBox b;
  EXPECT_TRUE(torch::equal(ops::fit_image(img, 64, ops::Fit::Stretch, &b), ops::resize_bilinear(img, 64, 64)));
  EXPECT_DOUBLE_EQ(b.sx, 0.64);
  EXPECT_DOUBLE_EQ(b.sy, 0.32);
  double r = 0;
  const auto lb_pixels = ops::fit_image(img, 64, ops::Fit::Letterbox, &b);
  EXPECT_TRUE(torch::equal(lb_pixels, ops::letterbox_topleft(img, 64, &r)));
  EXPECT_DOUBLE_EQ(b.sx, r);
  EXPECT_EQ(lb_pixels[10][40][0].item<uint8_t>(), 114);  // padding right of the content

  EXPECT_THROW(ops::fit_box(0, 10, 64, ops::Fit::Stretch), libreyolo::UsageError);
  EXPECT_THROW(ops::fit_box(10, 10, 0, ops::Fit::Letterbox), libreyolo::UsageError);
}
