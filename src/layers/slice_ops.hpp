// The necks' slice, pool and upsampling operations, in the input's dtype (also under autocast).
// The *_into ones (inference) write their result into a given view, typically a channel slice of
// a concatenation assembled in place (layers/concat.hpp); upsample2x and
// with_channel_slice are for training (autograd).
#pragma once
#include <torch/torch.h>

namespace libreyolo::models::common {

// The three chained max_pool2d(5, stride 1, padding 2) of an SPP block: o5 = pool(y0),
// o9 = pool(o5), o13 = pool(o9), all shaped like y0. On CUDA (channels-last float32/float16/
// bfloat16 views, LIBREYOLO_FUSED_POOL on) one kernel computes the three (kernels/spp_pool.hpp:
// the same bits); elsewhere ATen's pools, each copied into its place.
void spp_max_pools_into(const torch::Tensor& y0, const torch::Tensor& o5, const torch::Tensor& o9,
                        const torch::Tensor& o13);

// Nearest-neighbour 2x upsampling of x [N, C, H, W] with autograd, in x's dtype. Autocast lists
// upsample_nearest2d as a float32 op: in a mixed-precision step the neck's upsampling and the
// concatenation after it would run in float32, the consumer would cast back, and the backward
// would do the same in reverse (four extra passes over each concatenation). A copy of a value is
// exact in any dtype, and the backward sums a pixel's four gradients in float either way.
torch::Tensor upsample2x(const torch::Tensor& x);

// {y, y.narrow(1, start, len)} for two consumers, as one autograd node: y's gradient is written
// in one pass (the first output's gradient, the slice's added into its channels). With a plain
// narrow, autograd builds the slice's gradient as zeros of y's size with the slice copied in and
// then adds that to y's other gradient: three passes over y (an ELAN block, whose cv1 output goes
// to the concatenation whole and to cv2 by its second half). The same bits: outside the slice
// the first gradient, inside the sum of the two rounded once. Without a gradient to record, the
// plain views.
std::pair<torch::Tensor, torch::Tensor> with_channel_slice(const torch::Tensor& y, int64_t start, int64_t len);

// Nearest-neighbour 2x upsampling of x [N, C, H, W] into out [N, C, 2H, 2W] as one strided copy,
// in x's dtype (autocast would run upsample_nearest2d in float32: the values are the same).
void upsample2x_into(const torch::Tensor& x, const torch::Tensor& out);

}  // namespace libreyolo::models::common
