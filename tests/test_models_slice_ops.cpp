// layers/slice_ops.hpp on the CPU (ATen's pools copied into their slices; the strided copy
// of 2x upsampling): the same bits as ATen's ops, nothing written outside the slices.
#include "libreyolo/errors.hpp"
#include "slice_ops_check.hpp"

using namespace libreyolo;

TEST(SliceOps, SppPoolsIntoSlicesEqualChainedMaxPools) {
  torch::manual_seed(0);
  for (bool nan : {false, true}) {
    test::check_spp_pools(torch::TensorOptions(), 2, 8, 20, 20, nan);
    test::check_spp_pools(torch::TensorOptions(), 1, 5, 3, 4, nan);
  }
}

TEST(SliceOps, UpsampleIntoSliceEqualsUpsampleNearest) {
  torch::manual_seed(1);
  test::check_upsample_into(torch::TensorOptions(), false);
  test::check_upsample_into(torch::TensorOptions(), true);
  test::check_upsample_into(torch::TensorOptions().dtype(torch::kBFloat16), true);
}

// The neck's training upsampling keeps x's dtype under autocast (CUDA's autocast runs
// upsample_nearest2d in float32: GpuSliceOps.Upsample2xKeepsDtypeUnderAutocast).
TEST(SliceOps, Upsample2xKeepsDtypeUnderAutocast) {
  torch::manual_seed(2);
  test::check_upsample2x_autocast(torch::TensorOptions().dtype(torch::kBFloat16), false);
}

// with_channel_slice gives y the gradient that y and y.narrow would get through autograd, bit for
// bit: both outputs used, either alone, the slice at the end or in the middle.
TEST(SliceOps, ChannelSliceGradientEqualsNarrow) {
  torch::manual_seed(3);
  for (auto dt : {torch::kFloat, torch::kBFloat16}) {
    for (int use = 0; use < 3; ++use) {  // 0: both, 1: the whole only, 2: the slice only
      for (const auto& [start, len] : {std::pair<int64_t, int64_t>{4, 4}, {2, 3}}) {
        const auto base = torch::randn({2, 8, 5, 6}).to(dt).contiguous(at::MemoryFormat::ChannelsLast);
        const auto w = torch::randn({2, 8, 5, 6}).to(dt);
        const auto v = torch::randn({2, len, 5, 6}).to(dt);
        auto run = [&](bool node) {
          const auto leaf = base.clone().requires_grad_(true);
          const auto y = leaf * 1.5;  // a non-leaf, as a layer's output
          torch::Tensor whole = y, part;
          if (node) {
            std::tie(whole, part) = models::common::with_channel_slice(y, start, len);
          } else {
            part = y.narrow(1, start, len);
          }
          torch::Tensor loss = torch::zeros({}, torch::TensorOptions().dtype(dt));
          if (use != 2) loss = loss + (whole * w).sum();
          if (use != 1) loss = loss + (part.sigmoid() * v).sum();
          loss.backward();
          return leaf.grad();
        };
        const auto expect = run(false), got = run(true);
        EXPECT_TRUE(torch::equal(got, expect)) << c10::toString(dt) << " use " << use << " start " << start;
      }
    }
  }
  const auto y = torch::randn({1, 4, 2, 2});
  const auto [whole, part] = models::common::with_channel_slice(y, 1, 2);  // no gradient recorded: views
  EXPECT_TRUE(whole.is_same(y));
  EXPECT_EQ(part.data_ptr(), y.narrow(1, 1, 2).data_ptr());
  EXPECT_THROW(models::common::with_channel_slice(y, 3, 2), UsageError);
}
