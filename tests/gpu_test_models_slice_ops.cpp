// layers/slice_ops.hpp on the GPU: SPPELAN's three max pools in one kernel
// (kernels/spp_pool.hpp) against ATen's chained
// max_pool2d bit for bit, NaN included, float32/float16/bfloat16, input and outputs channel
// slices; 2x upsampling into a slice against upsample_nearest2d; the training upsampling's dtype
// under autocast.
#include "slice_ops_check.hpp"
#include "support.hpp"

using namespace libreyolo;

TEST(GpuSliceOps, SppPoolKernelEqualsChainedMaxPools) {
  LY_REQUIRE_CUDA();
  torch::manual_seed(0);
  torch::InferenceMode im;
  for (auto dt : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
    for (bool nan : {false, true}) {
      test::check_spp_pools(opts, 2, 64, 20, 20, nan);  // SPPELAN's at 640 px
      test::check_spp_pools(opts, 3, 12, 9, 15, nan);
      test::check_spp_pools(opts, 1, 8, 2, 3, nan);     // smaller than a window
    }
  }
}

TEST(GpuSliceOps, UpsampleIntoSliceEqualsUpsampleNearest) {
  LY_REQUIRE_CUDA();
  torch::manual_seed(1);
  for (auto dt : {torch::kFloat, torch::kBFloat16}) {
    test::check_upsample_into(torch::TensorOptions().device(torch::kCUDA).dtype(dt), true);
    test::check_upsample_into(torch::TensorOptions().device(torch::kCUDA).dtype(dt), false);
  }
}

TEST(GpuSliceOps, Upsample2xKeepsDtypeUnderAutocast) {
  LY_REQUIRE_CUDA();
  torch::manual_seed(2);
  for (auto dt : {torch::kBFloat16, torch::kHalf})
    test::check_upsample2x_autocast(torch::TensorOptions().device(torch::kCUDA).dtype(dt), true);
}
