// Shared by the CPU and GPU tests of layers/slice_ops.hpp: SPPELAN's pools written into
// channel slices against ATen's chained max_pool2d, and 2x upsampling against upsample_nearest2d,
// compared bit for bit (NaNs where ATen has them).
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include "layers/slice_ops.hpp"

namespace libreyolo::test {

inline bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && torch::equal(torch::isnan(a), torch::isnan(b)) &&
         torch::equal(torch::nan_to_num(a.to(torch::kFloat), 0.0), torch::nan_to_num(b.to(torch::kFloat), 0.0));
}

// y0 [n, c, h, w] as channels [8, 8 + c) of a wider channels_last tensor, the outputs as three
// slices of another; a NaN planted when `nan`.
inline void check_spp_pools(const torch::TensorOptions& opts, int64_t n, int64_t c, int64_t h, int64_t w, bool nan) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  auto wide = torch::randn({n, c + 16, h, w}, opts).contiguous(cl);
  const auto y0 = wide.narrow(1, 8, c);
  if (nan) y0.select(0, 0).select(0, c / 2).select(0, h / 2).select(0, w / 2).fill_(NAN);
  auto out = torch::full({n, 4 * c, h, w}, 3.0, opts).contiguous(cl);
  models::common::spp_max_pools_into(y0, out.narrow(1, c, c), out.narrow(1, 2 * c, c), out.narrow(1, 3 * c, c));
  auto y = y0;
  for (int k = 1; k <= 3; ++k) {
    y = torch::max_pool2d(y.contiguous(), {5, 5}, {1, 1}, {2, 2});
    EXPECT_TRUE(same_bits(out.narrow(1, k * c, c), y)) << "pool " << k << " " << c10::toString(opts.dtype()) << " c "
                                                       << c << " " << h << "x" << w << (nan ? " with NaN" : "");
  }
  EXPECT_TRUE((out.narrow(1, 0, c) == 3.0).all().item<bool>()) << "written outside its slices";
}

inline void check_upsample_into(const torch::TensorOptions& opts, bool channels_last) {
  auto x = torch::randn({2, 6, 5, 7}, opts);
  if (channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
  auto out = torch::zeros({2, 10, 10, 14}, opts);
  if (channels_last) out = out.contiguous(at::MemoryFormat::ChannelsLast);
  models::common::upsample2x_into(x, out.narrow(1, 4, 6));
  EXPECT_TRUE(torch::equal(out.narrow(1, 4, 6), torch::upsample_nearest2d(x, {10, 14}, 2.0, 2.0)));
  EXPECT_EQ(out.narrow(1, 0, 4).abs().sum().item<double>(), 0.0);
}

// upsample2x with autocast on for `opts`' device in `dtype`: x's dtype kept, the values of the
// upsampling, the gradient each pixel's four summed in float and rounded once. `plain_float`:
// autocast runs upsample_nearest2d itself in float32 there (CUDA).
inline void check_upsample2x_autocast(const torch::TensorOptions& opts, bool plain_float) {
  const auto dev = opts.device().type();
  const auto dtype = opts.dtype().toScalarType();
  const auto x = torch::randn({2, 5, 3, 4}, opts).contiguous(at::MemoryFormat::ChannelsLast).requires_grad_(true);
  const auto g = torch::randn({2, 5, 6, 8}, opts);
  torch::Tensor y, plain;
  at::autocast::set_autocast_enabled(dev, true);
  at::autocast::set_autocast_dtype(dev, dtype);
  y = models::common::upsample2x(x);
  plain = torch::upsample_nearest2d(x, std::vector<int64_t>{6, 8}, 2.0, 2.0);
  at::autocast::set_autocast_enabled(dev, false);
  at::autocast::clear_cache();
  if (plain_float) EXPECT_EQ(plain.scalar_type(), torch::kFloat);  // what autocast does without the guard
  EXPECT_EQ(y.scalar_type(), dtype);
  EXPECT_TRUE(torch::equal(y.to(torch::kFloat), plain.to(torch::kFloat)));
  y.backward(g);
  const auto expect = g.to(torch::kFloat).view({2, 5, 3, 2, 4, 2}).sum({3, 5}).to(dtype);
  EXPECT_TRUE(torch::equal(x.grad(), expect)) << c10::toString(dtype);
}

}  // namespace libreyolo::test
