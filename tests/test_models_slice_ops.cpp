// models/common/slice_ops.hpp on the CPU (ATen's pools copied into their slices; the strided copy
// of 2x upsampling): the same bits as ATen's ops, nothing written outside the slices.
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
