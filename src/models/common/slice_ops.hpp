// Inference operations that write their result into a given view, typically a channel slice of a
// concatenation assembled in place (models/common/concat.hpp), in the input's dtype.
#pragma once
#include <torch/torch.h>

namespace libreyolo::models::common {

// The three chained max_pool2d(5, stride 1, padding 2) of an SPP block: o5 = pool(y0),
// o9 = pool(o5), o13 = pool(o9), all shaped like y0. On CUDA (channels-last float32/float16/
// bfloat16 views, LIBREYOLO_FUSED_POOL on) one kernel computes the three (kernels/spp_pool.hpp:
// the same bits); elsewhere ATen's pools, each copied into its place.
void spp_max_pools_into(const torch::Tensor& y0, const torch::Tensor& o5, const torch::Tensor& o9,
                        const torch::Tensor& o13);

// Nearest-neighbour 2x upsampling of x [N, C, H, W] into out [N, C, 2H, 2W] as one strided copy,
// in x's dtype (autocast would run upsample_nearest2d in float32: the values are the same).
void upsample2x_into(const torch::Tensor& x, const torch::Tensor& out);

}  // namespace libreyolo::models::common
