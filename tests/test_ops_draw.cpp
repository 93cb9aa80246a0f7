// Drawing boxes and labels.
#include <libreyolo/errors.hpp>

#include "ops/draw.hpp"
#include "ops/font.hpp"
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
const ops::Rgb8 kWhite{255, 255, 255};

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

TEST(Draw, BitmapFontGlyphs) {
  // '1' is .#. over ##. ... over ###: 1 + 2 + 1 + 1 + 1 + 1 + 3 = 10 pixels.
  auto img = black(7, 5);
  ops::draw_bitmap_text(img, 0, 0, "1", kRed);
  EXPECT_EQ(count(img, kRed), 10);
  const auto m = mask_of(img, kRed);
  EXPECT_TRUE(m[0][2].item<bool>());
  EXPECT_TRUE(m[1][1].item<bool>());
  EXPECT_TRUE(m[6][1].item<bool>() && m[6][2].item<bool>() && m[6][3].item<bool>());
  EXPECT_FALSE(m[0][0].item<bool>());
  // Scale 2 doubles every font pixel.
  auto big = black(14, 10);
  ops::draw_bitmap_text(big, 0, 0, "1", kRed, 2);
  EXPECT_EQ(count(big, kRed), 40);
  // Upper case draws as lower case; unknown characters as '?'.
  auto upper = black(7, 11), lower = black(7, 11), odd = black(7, 5), q = black(7, 5);
  ops::draw_bitmap_text(upper, 0, 0, "AB", kRed);
  ops::draw_bitmap_text(lower, 0, 0, "ab", kRed);
  EXPECT_TRUE(torch::equal(upper, lower));
  ops::draw_bitmap_text(odd, 0, 0, "@", kRed);
  ops::draw_bitmap_text(q, 0, 0, "?", kRed);
  EXPECT_TRUE(torch::equal(odd, q));
  EXPECT_GT(count(q, kRed), 0);
  // Sizes: 6 px per glyph minus the trailing gap.
  EXPECT_EQ(ops::bitmap_text_width("ab", 1), 11);
  EXPECT_EQ(ops::bitmap_text_width("dog 0.87", 2), (8 * 6 - 1) * 2);
  EXPECT_EQ(ops::bitmap_text_width("", 3), 0);
  EXPECT_EQ(ops::bitmap_text_height(3), 21);
  // Every character the label format produces has a glyph of its own (not '?').
  for (char c : std::string("abcdefghijklmnopqrstuvwxyz0123456789.,:-_%()/'!+")) {
    auto g = black(7, 5);
    ops::draw_bitmap_text(g, 0, 0, std::string(1, c), kRed);
    EXPECT_GT(count(g, kRed), 0) << c;
    if (c != '?') EXPECT_FALSE(torch::equal(g, q)) << c;
  }
  // Clipped at the borders.
  auto edge = black(5, 5);
  ops::draw_bitmap_text(edge, -2, -2, "88", kRed, 3);  // the left column of row 1 lands at x = 0
  ops::draw_bitmap_text(edge, -20, -20, "88", kRed, 1);
  EXPECT_GT(count(edge, kRed), 0);
}

// The text of pictures comes from a TrueType font: letters the bitmap font drew alike ("s9uare",
// "trian9le", "ePoch") are told apart, widths are proportional, non-ASCII names draw as
// themselves, and the measures are those of the drawing.
TEST(Draw, TrueTypeTextTellsLettersApart) {
  if (!ops::truetype_built())
    GTEST_SKIP() << "this build has no FreeType headers (Debian: libfreetype-dev): pictures use the bitmap font";
  ASSERT_TRUE(ops::truetype_text()) << "no TrueType font (Debian: apt install fonts-dejavu-core, or set LIBREYOLO_FONT)";
  EXPECT_FALSE(ops::truetype_font_path().empty());
  const int h = ops::text_height(2);
  EXPECT_GE(h, 14);  // the line box holds the bitmap font's 7 x 2 rows
  auto drawn = [&](const std::string& t) {
    auto img = black(h, std::max(1, ops::text_width(t, 2)));
    ops::draw_text(img, 0, 0, t, kWhite, 2);
    return img;
  };
  auto ink = [](const torch::Tensor& img) { return img.to(torch::kInt64).sum().item<int64_t>(); };
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
           {"q", "9"}, {"g", "9"}, {"p", "P"}, {"square", "s9uare"}, {"epoch", "ePoch"}, {"\xc3\xbc", "u"}}) {
    const auto x = drawn(a), y = drawn(b);
    EXPECT_GT(ink(x), 0) << a;
    EXPECT_FALSE(x.sizes() == y.sizes() && torch::equal(x, y)) << a << " and " << b << " draw the same";
  }
  // An umlaut is not a replacement character or a question mark.
  const auto u = drawn("\xc3\xbc"), fffd = drawn("\xef\xbf\xbd"), qm = drawn("?");
  EXPECT_FALSE(u.sizes() == fffd.sizes() && torch::equal(u, fffd));
  EXPECT_FALSE(u.sizes() == qm.sizes() && torch::equal(u, qm));
  // Proportional: four i are narrower than four W; widths add up; anti-aliased edges.
  EXPECT_LT(ops::text_width("iiii", 2), ops::text_width("WWWW", 2));
  EXPECT_EQ(ops::text_width("ab", 2), ops::text_width("a", 2) + ops::text_width("b", 2));
  const auto w = drawn("Wg");
  const auto grey = (w.select(2, 0) > 0).logical_and(w.select(2, 0) < 255);
  EXPECT_GT(grey.sum().item<int64_t>(), 0) << "no partial coverage: not anti-aliased";
  // Descenders stay inside the line box: the bottom rows of "gjpqy" have ink, the box holds it.
  const auto d = drawn("gjpqy");
  EXPECT_GT(ink(d.slice(0, h * 2 / 3, h)), 0);
  // Invalid UTF-8 bytes each become U+FFFD.
  EXPECT_EQ(ops::utf8_code_points("a\xff\xc3\xbc\xe2\x82"), (std::vector<uint32_t>{'a', 0xFFFD, 0xFC, 0xFFFD, 0xFFFD}));
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
  // Its tag sits above the box: the label's measured size plus 1 px of padding on each side.
  const int tw = ops::text_width("dog 0.87", 1) + 2, th = ops::text_height(1) + 2;
  ASSERT_LT(th, 20);
  EXPECT_TRUE(m[40 - th][10].item<bool>());
  EXPECT_TRUE(m[39][10 + tw - 1].item<bool>());
  EXPECT_FALSE(m[40 - th - 1][10].item<bool>());
  EXPECT_FALSE(m[39][10 + tw].item<bool>());
  // The text inside the tag is drawn over it: some of the tag's pixels are not the tag colour.
  const auto tag = m.slice(0, 40 - th + 1, 39).slice(1, 11, 10 + tw - 1);
  EXPECT_GT(tag.logical_not().sum().item<int64_t>(), 20);
  // Box 2 touches the image top, so its tag ("7 0.50", class id outside names) is inside.
  // Row th - 1 is the tag's bottom padding; x = 20 is inside the box, away from its outline.
  EXPECT_TRUE(mask_of(img, seven)[th - 1][20].item<bool>());
  EXPECT_FALSE(mask_of(img, seven)[th][20].item<bool>());

  // Empty detections change nothing; bad images are refused.
  auto untouched = black(10, 10);
  ops::draw_detections(untouched, ops::Detections{torch::empty({0, 4}), torch::empty({0}),
                                                  torch::empty({0}, torch::kInt64)},
                       {});
  EXPECT_EQ(untouched.sum().item<int64_t>(), 0);
  EXPECT_THROW(ops::draw_detections(black(10, 10).to(torch::kFloat), det, {}), libreyolo::UsageError);
  EXPECT_THROW(ops::draw_rect(black(10, 10).transpose(0, 1), 0, 0, 1, 1, kRed), libreyolo::UsageError);
}
