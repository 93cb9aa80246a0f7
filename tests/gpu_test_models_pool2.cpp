// The 2x2 stride-1 average pooling kernels (layers/pool2.hpp, kernels/pool2.cu) against ATen's
// avg_pool2d on the same channels_last input: forward and input gradient, bit for bit, in float32,
// float16 and bfloat16, vectorised and not, split at C (AConv) and at C/2 (ADown); and a YOLOv9
// training step with the switch on against the same step with it off.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>

#include "layers/pool2.hpp"
#include "support.hpp"
#include "yolo9_step_check.hpp"

using namespace libreyolo;

namespace {

struct PoolSwitch {
  explicit PoolSwitch(bool on) : was_(models::fused_pool()) { models::set_fused_pool(on); }
  ~PoolSwitch() { models::set_fused_pool(was_); }
  bool was_;
};

// Forward parts and input gradient of avg_pool2_split under the given switch.
struct PoolRun {
  torch::Tensor a, b, grad;
};

PoolRun run_pool(const torch::Tensor& x0, const torch::Tensor& ga, const torch::Tensor& gb, int64_t split,
                 bool fused) {
  PoolSwitch sw(fused);
  torch::Tensor x = x0.detach().clone(at::MemoryFormat::ChannelsLast).requires_grad_(true);
  auto [a, b] = models::avg_pool2_split(x, split);
  torch::Tensor loss = (a.to(torch::kFloat) * ga.to(torch::kFloat)).sum();
  if (b.size(1) > 0) loss = loss + (b.to(torch::kFloat) * gb.to(torch::kFloat)).sum();
  loss.backward();
  return {a.detach(), b.detach(), x.grad()};
}

}  // namespace

TEST(GpuPool2, KernelsEqualAtenBitForBit) {
  LY_REQUIRE_CUDA();
  const auto dev = torch::Device(torch::kCUDA, 0);
  torch::manual_seed(3);
  struct Case {
    std::vector<int64_t> shape;  // N, C, H, W
    int64_t split;
  };
  // 8-channel vectors (C and split multiples of 8) and the scalar path; odd sizes; split at C.
  const std::vector<Case> cases = {{{4, 32, 40, 40}, 32}, {{2, 64, 21, 17}, 32}, {{3, 12, 9, 11}, 12},
                                   {{2, 10, 8, 7}, 5},    {{1, 16, 2, 2}, 8},    {{2, 48, 33, 30}, 24}};
  int checked = 0;
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    for (const auto& c : cases) {
      const torch::Tensor x =
          torch::randn(c.shape, torch::TensorOptions().device(dev)).mul(3).to(dtype).contiguous(
              at::MemoryFormat::ChannelsLast);
      const std::vector<int64_t> out = {c.shape[0], c.shape[1], c.shape[2] - 1, c.shape[3] - 1};
      // Output gradients with values small enough for float16's subnormals after the division.
      const torch::Tensor ga = (torch::randn({out[0], c.split, out[2], out[3]}, x.options()) * 1e-4).to(dtype);
      const torch::Tensor gb = (torch::randn({out[0], out[1] - c.split, out[2], out[3]}, x.options())).to(dtype);
      const PoolRun ref = run_pool(x, ga, gb, c.split, false);
      const PoolRun got = run_pool(x, ga, gb, c.split, true);
      const std::string what = std::string(c10::toString(dtype)) + " " + c10::str(c10::IntArrayRef(c.shape)) +
                               " split " + std::to_string(c.split);
      EXPECT_TRUE(got.a.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
      EXPECT_TRUE(torch::equal(got.a, ref.a)) << what;
      EXPECT_TRUE(torch::equal(got.b, ref.b)) << what;
      EXPECT_TRUE(torch::equal(got.grad, ref.grad))
          << what << ": max |diff| " << (got.grad.to(torch::kFloat) - ref.grad.to(torch::kFloat)).abs().max().item<float>();
      ++checked;
    }
  }
  EXPECT_EQ(checked, 18);
}

// Inference reads the pooling's input from a channel slice of a wider channels_last tensor (a
// block's output written into its concatenation, layers/concat.hpp): the same bits as
// pooling a packed copy, vectorised (slice offset and width multiples of 8) and not.
TEST(GpuPool2, ChannelSliceInputEqualsPackedCopy) {
  LY_REQUIRE_CUDA();
  torch::manual_seed(5);
  const auto cl = at::MemoryFormat::ChannelsLast;
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    const std::vector<std::array<int64_t, 3>> slices = {{32, 64, 64}, {8, 32, 16}, {3, 12, 6}};
    for (const auto [offset, width, split] : slices) {
      const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
      const auto wide = torch::randn({2, 112, 21, 18}, opts).contiguous(cl);
      const auto slice = wide.narrow(1, offset, width);
      torch::NoGradGuard ng;
      const auto [a, b] = models::avg_pool2_split(slice, split);
      const auto [ra, rb] = models::avg_pool2_split(slice.contiguous(cl), split);
      const std::string what = std::string(c10::toString(dtype)) + " channels " + std::to_string(offset) + "+" +
                               std::to_string(width);
      EXPECT_TRUE(torch::equal(a, ra)) << what;
      EXPECT_TRUE(torch::equal(b, rb)) << what;
      PoolSwitch off(false);
      EXPECT_TRUE(torch::equal(a, models::avg_pool2_split(slice, split).first)) << what << " (ATen)";
    }
  }
}

// The switch changes no value of a YOLOv9-t training step in bf16 autocast (the loss is a plain
// sum of the outputs: this is about the pooling inside, not the detector's loss).
TEST(GpuPool2, Yolo9tStepWithTheKernelsEqualsTheStepWithout) {
  LY_REQUIRE_CUDA();
  const auto dev = torch::Device(torch::kCUDA, 0);
  const test::CudnnSettings cudnn(/*benchmark=*/false, /*deterministic=*/true, /*allow_tf32=*/false);
  auto step = [&](bool fused) {
    PoolSwitch sw(fused);
    return test::yolo9t_bf16_step(dev);
  };
  const auto off = step(false), on = step(true);
  EXPECT_EQ(off.first, on.first);
  ASSERT_EQ(off.second.size(), on.second.size());
  double worst = 0;
  for (size_t i = 0; i < off.second.size(); ++i)
    worst = std::max(worst, (off.second[i] - on.second[i]).abs().max().item<double>());
  std::printf("[ REPORT   ] v9-t bf16 step, pooling kernels on vs off: loss %.9g vs %.9g, worst gradient diff %.3g\n",
              off.first, on.first, worst);
  EXPECT_EQ(worst, 0.0);
}
