// The direct 3-channel 3x3 convolution kernel (layers/stem_conv.hpp, kernels/stem_conv.cu)
// against a float64 convolution: plain, with bias and SiLU, into a channel slice; float32,
// float16, bfloat16; 16/32/64 output channels (16 only in float32); strides 1 and 2, padding 0
// and 1; odd sizes. And a YOLOv9-t training step with the kernel against the one without.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "layers/stem_conv.hpp"
#include "support.hpp"
#include "yolo9_step_check.hpp"

using namespace libreyolo;

namespace {

struct StemSwitch {
  explicit StemSwitch(bool on) : was_(models::stem_kernel()) { models::set_stem_kernel(on); }
  ~StemSwitch() { models::set_stem_kernel(was_); }
  bool was_;
};

double tolerance(torch::ScalarType t) {
  return t == torch::kBFloat16 ? 1.6e-2 : t == torch::kHalf ? 2e-3 : 2e-5;  // relative to the output's scale
}

double rel_err(const torch::Tensor& got, const torch::Tensor& ref) {
  return (got.to(torch::kDouble) - ref).abs().max().item<double>() / std::max(ref.abs().max().item<double>(), 1e-12);
}

}  // namespace

TEST(GpuStemConv, ForwardMatchesFloat64) {
  LY_REQUIRE_CUDA();
  StemSwitch on(true);
  torch::manual_seed(0);
  const auto cl = at::MemoryFormat::ChannelsLast;
  for (auto dt : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
    for (int64_t co : {16, 32, 64}) {
      if (dt == torch::kFloat && co > 16) continue;
      for (auto [stride, padding] : {std::pair<int64_t, int64_t>{2, 1}, {1, 1}, {2, 0}, {1, 0}}) {
        const auto x = torch::randn({3, 3, 37, 50}, opts).contiguous(cl);
        const auto w = (torch::randn({co, 3, 3, 3}, opts) * 0.3).contiguous(cl);
        const auto bias = torch::randn({co}, torch::TensorOptions().device(torch::kCUDA));
        ASSERT_TRUE(models::stem_conv_applies(x, w, stride, padding, 1));
        const auto ref = at::convolution(x.to(torch::kDouble), w.to(torch::kDouble), {}, {stride, stride},
                                         {padding, padding}, {1, 1}, false, {0, 0}, 1);
        const std::string what = std::string(c10::toString(dt)) + " co " + std::to_string(co) + " stride " +
                                 std::to_string(stride) + " padding " + std::to_string(padding);
        const auto y = models::stem_conv_forward(x, w, stride, padding);
        EXPECT_EQ(y.sizes(), ref.sizes()) << what;
        EXPECT_EQ(y.scalar_type(), dt) << what;
        EXPECT_LT(rel_err(y, ref), tolerance(dt)) << what;
        // Bias and SiLU as the epilogue, written into channels [5, 5 + co) of a wider tensor.
        auto wide = torch::full({3, co + 9, ref.size(2), ref.size(3)}, 7.0, opts).contiguous(cl);
        const auto slice = wide.narrow(1, 5, co);
        ASSERT_TRUE(models::stem_conv_writes_into(slice, x, w, stride, padding)) << what;
        models::stem_conv_forward(x, w, stride, padding, bias, true, slice);
        const auto ref_act = torch::silu(ref + bias.to(torch::kDouble).view({1, -1, 1, 1}));
        EXPECT_LT(rel_err(slice, ref_act), tolerance(dt)) << what << " (bias, SiLU, into a slice)";
        EXPECT_TRUE((wide.narrow(1, 0, 5) == 7.0).all().item<bool>()) << what << ": written outside the slice";
        EXPECT_TRUE((wide.narrow(1, 5 + co, 4) == 7.0).all().item<bool>()) << what << ": written outside the slice";
      }
    }
  }
  // Not taken: 4 input channels, 5x5 kernels, 8 output channels, float32 into 32, CPU; and with the switch off.
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  EXPECT_FALSE(models::stem_conv_applies(torch::zeros({1, 4, 8, 8}, opts), torch::zeros({16, 4, 3, 3}, opts), 1, 1, 1));
  EXPECT_FALSE(models::stem_conv_applies(torch::zeros({1, 3, 8, 8}, opts), torch::zeros({16, 3, 5, 5}, opts), 1, 2, 1));
  EXPECT_FALSE(models::stem_conv_applies(torch::zeros({1, 3, 8, 8}, opts), torch::zeros({8, 3, 3, 3}, opts), 1, 1, 1));
  EXPECT_FALSE(models::stem_conv_applies(torch::zeros({1, 3, 8, 8}, opts), torch::zeros({32, 3, 3, 3}, opts), 1, 1, 1));
  EXPECT_FALSE(models::stem_conv_applies(torch::zeros({1, 3, 8, 8}), torch::zeros({16, 3, 3, 3}), 1, 1, 1));
  StemSwitch off(false);
  EXPECT_FALSE(models::stem_conv_applies(torch::zeros({1, 3, 8, 8}, opts), torch::zeros({16, 3, 3, 3}, opts), 2, 1, 1));
}

// The kernel changes the step's numbers only by summation order: a YOLOv9-t bf16 step with it
// against the step with cuDNN's stem convolution (loss and the stem's weight gradient close).
TEST(GpuStemConv, Yolo9tStepWithTheKernelsMatchesTheStepWithout) {
  LY_REQUIRE_CUDA();
  const auto dev = torch::Device(torch::kCUDA, 0);
  const test::CudnnSettings cudnn(/*benchmark=*/false, /*deterministic=*/true, /*allow_tf32=*/false);
  auto step = [&](bool stem) {
    StemSwitch sw(stem);
    const int64_t launched = models::stem_conv_launches();
    auto r = test::yolo9t_bf16_step(dev);
    EXPECT_EQ(models::stem_conv_launches() - launched, stem ? 1 : 0) << "the stem's forward took the kernel: " << stem;
    return r;
  };
  const auto off = step(false), on = step(true);
  ASSERT_EQ(off.second.size(), on.second.size());
  EXPECT_NEAR(on.first, off.first, 2e-2 * std::abs(off.first));
  // The stem's weight gradient (the first parameter's), from activations rounded differently.
  const double stem_err = rel_err(on.second[0], off.second[0].to(torch::kDouble));
  std::printf("[ REPORT   ] v9-t bf16 step, stem kernels on vs off: loss %.9g vs %.9g, stem dw rel diff %.3g\n",
              on.first, off.first, stem_err);
  EXPECT_LT(stem_err, 5e-2);
}
