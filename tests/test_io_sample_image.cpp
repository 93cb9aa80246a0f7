// The built-in sample image and its committed JPEG (assets/sample.jpg).
// Regenerate the JPEG after changing the scene: LIBREYOLO_WRITE_SAMPLE=1 libreyolo_tests
// --gtest_filter=SampleImage.CommittedJpegMatchesScene
#include <cstdlib>
#include <string>

#include <libreyolo/errors.hpp>

#include "io/image.hpp"
#include "io/sample_image.hpp"
#include "support.hpp"

namespace io = libreyolo::io;

namespace {
std::array<int, 3> pixel(const torch::Tensor& img, double fy, double fx) {
  const int64_t y = static_cast<int64_t>(fy * img.size(0)), x = static_cast<int64_t>(fx * img.size(1));
  return {img[y][x][0].item<int>(), img[y][x][1].item<int>(), img[y][x][2].item<int>()};
}
}  // namespace

TEST(SampleImage, DeterministicScene) {
  const auto a = io::make_sample_image();
  ASSERT_EQ(a.sizes(), torch::IntArrayRef({480, 640, 3}));
  EXPECT_EQ(a.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(a, io::make_sample_image(480, 640)));
  EXPECT_EQ(io::make_sample_image(100, 250).sizes(), torch::IntArrayRef({100, 250, 3}));

  // The painted objects are where the scene puts them (colours within the +-4 texture).
  auto near = [](std::array<int, 3> got, std::array<int, 3> want) {
    for (int c = 0; c < 3; ++c)
      if (std::abs(got[c] - want[c]) > 4) return false;
    return true;
  };
  EXPECT_TRUE(near(pixel(a, 0.17, 0.82), {250, 215, 70})) << "sun";
  EXPECT_TRUE(near(pixel(a, 0.70, 0.14), {190, 55, 45})) << "house";
  EXPECT_TRUE(near(pixel(a, 0.40, 0.23), {115, 70, 45})) << "roof";
  EXPECT_TRUE(near(pixel(a, 0.45, 0.61), {35, 115, 50})) << "canopy";
  EXPECT_TRUE(near(pixel(a, 0.84, 0.45), {40, 80, 205})) << "ball";
  EXPECT_TRUE(near(pixel(a, 0.88, 0.85), {150, 60, 175})) << "triangle";
  const auto sky = pixel(a, 0.05, 0.05), ground = pixel(a, 0.95, 0.05);
  EXPECT_GT(sky[2], sky[0] + 60);
  EXPECT_GT(ground[1], ground[0] + 30);
  // Textured, not flat: neighbouring sky pixels differ somewhere in the first row.
  EXPECT_GT(a[0].slice(0, 0, 64).to(torch::kFloat).std().item<double>(), 1.0);
  EXPECT_THROW(io::make_sample_image(4, 640), libreyolo::UsageError);
}

TEST(SampleImage, CommittedJpegMatchesScene) {
  const std::string path = std::string(LIBREYOLO_SOURCE_DIR) + "/assets/sample.jpg";
  const auto scene = io::make_sample_image(480, 640);
  if (const char* w = std::getenv("LIBREYOLO_WRITE_SAMPLE"); w && std::string(w) == "1")
    io::save_image(path, scene, 90);
  const auto size = io::probe_image_size(path);
  EXPECT_EQ(size.height, 480);
  EXPECT_EQ(size.width, 640);
  const auto jpeg = io::decode_image(path);
  const double err = (jpeg.to(torch::kFloat) - scene.to(torch::kFloat)).abs().mean().item<double>();
  EXPECT_LT(err, 3.0) << "assets/sample.jpg no longer matches make_sample_image()";
}
