// Classification's predict on a CUDA device: files are decoded by nvJPEG and resized there. The
// device's bicubic resize gives the host's bytes; a predict from a file (device decode and resize)
// gives the classes and probabilities of the same image decoded on the host.
#include <cmath>
#include <string>
#include <vector>

#include <libreyolo/libreyolo.hpp>

#include "data/gpu_batch.hpp"
#include "engine/predictor.hpp"
#include "io/image.hpp"
#include "ops/resample.hpp"
#include "support.hpp"

namespace {

const torch::Device kCuda(torch::kCUDA, 0);

// A smooth picture with edges (random noise alone hides filter errors in the clipping).
torch::Tensor test_image(int64_t h, int64_t w, int64_t c, int seed) {
  torch::manual_seed(seed);
  const auto y = torch::linspace(0, 1, h).view({h, 1, 1}), x = torch::linspace(0, 1, w).view({1, w, 1});
  const auto phase = torch::rand({1, 1, c}) * 6;
  auto v = 127.5 + 100 * torch::sin(x * 9 + phase) * torch::cos(y * 7 - phase) + torch::randn({h, w, c}) * 20;
  v = torch::where((x > 0.3) & (x < 0.6) & (y > 0.2), torch::full_like(v, 250), v);
  return v.clamp(0, 255).to(torch::kUInt8).contiguous();
}

}  // namespace

TEST(GpuResample, DeviceBicubicEqualsTheHostsBitForBit) {
  LY_REQUIRE_CUDA();
  struct Case {
    int64_t h, w, c, out_h, out_w;
  };
  const std::vector<Case> cases = {{480, 640, 3, 256, 341}, {37, 53, 3, 224, 300}, {1, 1, 3, 5, 7},
                                   {300, 200, 1, 300, 77},  {129, 517, 3, 129, 517}, {1080, 810, 3, 298, 224}};
  int seed = 0;
  for (const auto& k : cases) {
    SCOPED_TRACE(std::to_string(k.h) + "x" + std::to_string(k.w) + " -> " + std::to_string(k.out_h) + "x" +
                 std::to_string(k.out_w));
    const auto img = test_image(k.h, k.w, k.c, seed++);
    const auto host = libreyolo::ops::resize_bicubic_pil(img, k.out_h, k.out_w);
    const auto dev = libreyolo::ops::resize_bicubic_pil(img.to(kCuda), k.out_h, k.out_w);
    ASSERT_TRUE(dev.is_cuda());
    EXPECT_TRUE(torch::equal(dev.cpu(), host));
    // A centre window of it, computed alone.
    const int64_t wh = std::max<int64_t>(1, k.out_h / 2), ww = std::max<int64_t>(1, k.out_w / 2);
    const int64_t top = (k.out_h - wh) / 2, left = (k.out_w - ww) / 2;
    const auto win = libreyolo::ops::resize_bicubic_pil_window(img.to(kCuda), k.out_h, k.out_w, top, left, wh, ww);
    EXPECT_TRUE(torch::equal(win.cpu(), host.narrow(0, top, wh).narrow(1, left, ww)));
    // A box of the source (a crop resized), as the training transform asks.
    const auto box_host = libreyolo::ops::resize_bicubic_pil(img, 64, 48, 3.5, 2.0, k.w * 0.8, k.h * 0.9);
    const auto box_dev = libreyolo::ops::resize_bicubic_pil(img.to(kCuda), 64, 48, 3.5, 2.0, k.w * 0.8, k.h * 0.9);
    EXPECT_TRUE(torch::equal(box_dev.cpu(), box_host));
  }
}

TEST(GpuClassifyPredict, DeviceDecodeAndResizeGiveTheHostsClasses) {
  LY_REQUIRE_CUDA();
  std::string why;
  if (!libreyolo::data::gpu_loader_available(&why)) GTEST_SKIP() << "no nvJPEG: " << why;
  const std::string dir = libreyolo::test::temp_dir("gpu_classify_predict");
  const std::string jpg = dir + "/picture.jpg";
  libreyolo::io::save_image(jpg, test_image(480, 640, 3, 3), 92);
  const auto pixels = libreyolo::io::decode_image(jpg);  // the host's decoder
  for (const char* name : {"resnet-18", "mobilenetv4-s"}) {
    SCOPED_TRACE(name);
    torch::manual_seed(0);
    libreyolo::LibreYOLO model(name, "cuda");
    model.predict(jpg);  // starts the device decoder (the host decodes this first call)
    libreyolo::engine::wait_for_predict_gpu_decoders();
    const auto from_file = model.predict(jpg);
    const libreyolo::ImageView view{pixels.data_ptr<uint8_t>(), 480, 640, 3, 0, false, "picture"};
    const auto from_host = model.predict(std::vector<libreyolo::ImageView>{view});
    ASSERT_EQ(from_file.size(), 1u);
    ASSERT_EQ(from_host.size(), 1u);
    const auto& a = from_file[0].probs;
    const auto& b = from_host[0].probs;
    ASSERT_EQ(a.size(), b.size());
    ASSERT_FALSE(a.empty());
    double worst = 0, top = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
      top = std::max(top, static_cast<double>(b[i]));
    }
    // The JPEG decoders round a few pixels differently by a level; the probabilities barely move.
    EXPECT_LE(worst, 0.05 * top) << "largest probability " << top;
    const auto& ranked = from_host[0].top;
    ASSERT_GE(ranked.size(), 2u);
    if (ranked[0].score - ranked[1].score > 2 * worst)  // a clear first class stays first
      EXPECT_EQ(from_file[0].top.at(0).class_id, ranked[0].class_id);
    std::printf("[ REPORT   ] %s: device-decoded vs host-decoded probabilities, worst difference %.3g; preprocess "
                "%.3f ms vs %.3f ms\n",
                name, worst, from_file[0].preprocess_ms, from_host[0].preprocess_ms);
  }
}

// The device JPEG decoder's handles take far longer to create than a decode (hundreds of ms for
// the JPEG engines): a request without `start` leaves it alone, the first with it starts it on a
// thread of its own and gets no decoder (the host decodes that call); once started, every request
// gets the same decoder.
TEST(GpuPredictDecoder, StartsOffTheFirstCallThenServesEveryLaterOne) {
  LY_REQUIRE_CUDA();
  std::string why;
  if (!libreyolo::data::gpu_loader_available(&why)) GTEST_SKIP() << "no nvJPEG: " << why;
  const torch::Device dev("cuda");
  const int size = 328;  // a size no other test of this process asks for
  namespace engine = libreyolo::engine;
  EXPECT_EQ(engine::predict_gpu_decoder(dev, size, false, /*start=*/false), nullptr);
  engine::wait_for_predict_gpu_decoders();
  EXPECT_EQ(engine::predict_gpu_decoder(dev, size, false, /*start=*/false), nullptr);  // nothing was started
  EXPECT_EQ(libreyolo::engine::predict_gpu_decoder(dev, size, false), nullptr);
  libreyolo::engine::wait_for_predict_gpu_decoders();
  auto* ready = libreyolo::engine::predict_gpu_decoder(dev, size, false);
  ASSERT_NE(ready, nullptr);
  EXPECT_EQ(libreyolo::engine::predict_gpu_decoder(dev, size, false), ready);
  EXPECT_EQ(libreyolo::engine::predict_gpu_decoder(dev, size, true), nullptr);  // saving decodes on the host
  const auto t = ready->start_times();
  std::printf("[ REPORT   ] device JPEG decoder (%s) started off the call: engines %.1f ms, hybrid %.1f ms\n",
              ready->backend().c_str(), t.hardware_ms, t.hybrid_ms);
}
