// Drawing boxes and labels.
#include <libreyolo/errors.hpp>

#include "ops/draw.hpp"
#include "support.hpp"

namespace ops = libreyolo::ops;

namespace {

torch::Tensor black(int h, int w) { return torch::zeros({h, w, 3}, torch::kUInt8); }

// Pixels that are exactly `c`.
torch::Tensor mask_of(const torch::Tensor& img, ops::Rgb8 c) {
  return img.select(2, 0).eq(c.r) & img.select(2, 1).eq(c.g) & img.select(2, 2).eq(c.b);
}

int64_t count(const torch::Tensor& img, ops::Rgb8 c) { return mask_of(img, c).sum().item<int64_t>(); }

const ops::Rgb8 kRed{255, 0, 0};

}  // namespace

TEST(Draw, RectangleOutline) {
  auto img = black(20, 20);
  ops::draw_rect(img, 2, 3, 10, 12, kRed, 2);
  // 9 x 10 rectangle minus its 5 x 6 interior.
  EXPECT_EQ(count(img, kRed), 9 * 10 - 5 * 6);
  EXPECT_TRUE(mask_of(img, kRed)[3][2].item<bool>());
  EXPECT_TRUE(mask_of(img, kRed)[12][10].item<bool>());
  EXPECT_TRUE(mask_of(img, kRed)[4][3].item<bool>());    // second ring
  EXPECT_FALSE(mask_of(img, kRed)[5][4].item<bool>());   // interior
  EXPECT_FALSE(mask_of(img, kRed)[2][2].item<bool>());   // outside
  EXPECT_FALSE(mask_of(img, kRed)[13][11].item<bool>());

  // Clipped at the borders: only the part inside is drawn, no out-of-range writes.
  auto clip = black(10, 10);
  ops::draw_rect(clip, -5, -5, 4, 4, kRed, 2);
  EXPECT_EQ(count(clip, kRed), 5 * 2 + 5 * 2 - 4);  // bottom and right bands, corner shared
  ops::draw_rect(clip, 20, 20, 30, 30, {0, 255, 0}, 2);
  EXPECT_EQ(count(clip, {0, 255, 0}), 0);
  ops::fill_rect(clip, -100, 8, 100, 100, {0, 0, 255});
  EXPECT_EQ(count(clip, {0, 0, 255}), 20);
}

TEST(Draw, TextUsesTheFont) {
  // '1' is .#. over ##. ... over ###: 1 + 2 + 1 + 1 + 1 + 1 + 3 = 10 pixels.
  auto img = black(7, 5);
  ops::draw_text(img, 0, 0, "1", kRed);
  EXPECT_EQ(count(img, kRed), 10);
  const auto m = mask_of(img, kRed);
  EXPECT_TRUE(m[0][2].item<bool>());
  EXPECT_TRUE(m[1][1].item<bool>());
  EXPECT_TRUE(m[6][1].item<bool>() && m[6][2].item<bool>() && m[6][3].item<bool>());
  EXPECT_FALSE(m[0][0].item<bool>());
  // Scale 2 doubles every font pixel.
  auto big = black(14, 10);
  ops::draw_text(big, 0, 0, "1", kRed, 2);
  EXPECT_EQ(count(big, kRed), 40);
  // Upper case draws as lower case; unknown characters as '?'.
  auto upper = black(7, 11), lower = black(7, 11), odd = black(7, 5), q = black(7, 5);
  ops::draw_text(upper, 0, 0, "AB", kRed);
  ops::draw_text(lower, 0, 0, "ab", kRed);
  EXPECT_TRUE(torch::equal(upper, lower));
  ops::draw_text(odd, 0, 0, "@", kRed);
  ops::draw_text(q, 0, 0, "?", kRed);
  EXPECT_TRUE(torch::equal(odd, q));
  EXPECT_GT(count(q, kRed), 0);
  // Sizes: 6 px per glyph minus the trailing gap.
  EXPECT_EQ(ops::text_width("ab", 1), 11);
  EXPECT_EQ(ops::text_width("dog 0.87", 2), (8 * 6 - 1) * 2);
  EXPECT_EQ(ops::text_width("", 3), 0);
  EXPECT_EQ(ops::text_height(3), 21);
  // Every character the label format produces has a glyph of its own (not '?').
  for (char c : std::string("abcdefghijklmnopqrstuvwxyz0123456789.,:-_%()/'!+")) {
    auto g = black(7, 5);
    ops::draw_text(g, 0, 0, std::string(1, c), kRed);
    EXPECT_GT(count(g, kRed), 0) << c;
    if (c != '?') EXPECT_FALSE(torch::equal(g, q)) << c;
  }
  // Clipped at the borders.
  auto edge = black(5, 5);
  ops::draw_text(edge, -2, -2, "88", kRed, 3);  // the left column of row 1 lands at x = 0
  ops::draw_text(edge, -20, -20, "88", kRed, 1);
  EXPECT_GT(count(edge, kRed), 0);
}

TEST(Draw, DetectionsGetBoxAndLabel) {
  auto img = black(100, 120);
  ops::Detections det;
  det.boxes = torch::tensor({10.0f, 40.0f, 60.0f, 90.0f, 0.0f, 0.0f, 30.0f, 20.0f}).view({2, 4});
  det.scores = torch::tensor({0.87f, 0.5f});
  det.classes = torch::tensor({1, 7}, torch::kInt64);
  ops::draw_detections(img, det, {"cat", "dog"}, 2);
  const auto dog = ops::class_color(1), seven = ops::class_color(7);
  ASSERT_FALSE(dog.r == seven.r && dog.g == seven.g && dog.b == seven.b);
  // Box 1: outline corners in the class colour; the interior away from the label is untouched.
  const auto m = mask_of(img, dog);
  EXPECT_TRUE(m[40][10].item<bool>());
  EXPECT_TRUE(m[89][59].item<bool>());
  EXPECT_EQ(img[70][35].sum().item<int>(), 0);
  // Its tag sits above the box: "dog 0.87" is 47 px wide + 2 px padding, 9 px tall.
  EXPECT_TRUE(m[31][10].item<bool>());
  EXPECT_TRUE(m[39][58].item<bool>());
  EXPECT_FALSE(m[30][10].item<bool>());
  // The text inside the tag is black or white, and there is some.
  const auto tag = img.slice(0, 31, 40).slice(1, 10, 59);
  const auto tag_text = tag.to(torch::kInt).sum(2);
  EXPECT_GT((tag_text.eq(0) | tag_text.eq(765)).sum().item<int64_t>(), 20);
  // Box 2 touches the image top, so its tag ("7 0.50", class id outside names) is inside.
  // Row 8 is the tag's bottom padding; x = 20 is inside the box, away from its outline.
  EXPECT_TRUE(mask_of(img, seven)[8][20].item<bool>());
  EXPECT_FALSE(mask_of(img, seven)[9][20].item<bool>());

  // Empty detections change nothing; bad images are refused.
  auto untouched = black(10, 10);
  ops::draw_detections(untouched, ops::Detections{torch::empty({0, 4}), torch::empty({0}),
                                                  torch::empty({0}, torch::kInt64)},
                       {});
  EXPECT_EQ(untouched.sum().item<int64_t>(), 0);
  EXPECT_THROW(ops::draw_detections(black(10, 10).to(torch::kFloat), det, {}), libreyolo::UsageError);
  EXPECT_THROW(ops::draw_rect(black(10, 10).transpose(0, 1), 0, 0, 1, 1, kRed), libreyolo::UsageError);
}
