#include "layers/stem_conv.hpp"

#include <atomic>
#include <stdexcept>

#include "core/env.hpp"
#include "layers/pixel_stride.hpp"

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/stem_conv.hpp"
#include "layers/kernel_dtype.hpp"
#endif

namespace libreyolo::models {

namespace {

std::atomic<int64_t> launches{0};

EnvFlag stem_flag{"LIBREYOLO_STEM_KERNEL"};

int64_t out_size(int64_t in, int64_t stride, int64_t padding) { return (in + 2 * padding - 3) / stride + 1; }

#ifdef LIBREYOLO_CUDA_KERNELS
kernels::StemConvLaunch launch_for(const at::Tensor& x, const at::Tensor& w, int64_t stride, int64_t padding,
                                   int64_t out_pixel) {
  kernels::StemConvLaunch l;
  l.batch = x.size(0);
  l.height = static_cast<int>(x.size(2));
  l.width = static_cast<int>(x.size(3));
  l.out_height = static_cast<int>(out_size(x.size(2), stride, padding));
  l.out_width = static_cast<int>(out_size(x.size(3), stride, padding));
  l.out_channels = static_cast<int>(w.size(0));
  l.stride = static_cast<int>(stride);
  l.padding = static_cast<int>(padding);
  l.out_pixel = out_pixel;
  for (int i = 0; i < 4; ++i) l.w_stride[i] = w.stride(i);
  kernel_dtype(x.scalar_type(), &l.dtype);
  l.stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  return l;
}
#endif

// The shapes, dtype and switch the kernel takes, for x and a weight of `wsizes`.
bool takes(const at::Tensor& x, at::IntArrayRef wsizes, int64_t stride, int64_t padding, int64_t groups) {
#ifdef LIBREYOLO_CUDA_KERNELS
  kernels::DType dt;
  if (!stem_flag.load() || !x.is_cuda() || groups != 1 || x.dim() != 4 || wsizes.size() != 4 || x.size(1) != 3 ||
      wsizes[1] != 3 || wsizes[2] != 3 || wsizes[3] != 3 || !kernel_dtype(x.scalar_type(), &dt) ||
      !kernels::stem_conv_supports(static_cast<int>(wsizes[0]), dt) || stride < 1 || padding < 0 || padding > 2)
    return false;
  const int64_t oh = out_size(x.size(2), stride, padding), ow = out_size(x.size(3), stride, padding);
  return oh >= 1 && ow >= 1 && x.size(2) <= INT32_MAX && x.size(3) <= INT32_MAX;
#else
  (void)x, (void)wsizes, (void)stride, (void)padding, (void)groups;
  return false;
#endif
}

}  // namespace

void set_stem_kernel(bool on) { stem_flag.store(on); }
bool stem_kernel() { return stem_flag.load(); }
int64_t stem_conv_launches() { return launches.load(); }

bool stem_conv_applies(const at::Tensor& x, const at::Tensor& w, int64_t stride, int64_t padding, int64_t groups) {
  return takes(x, w.sizes(), stride, padding, groups) && w.scalar_type() == x.scalar_type() &&
         w.device() == x.device();
}

bool stem_conv_writes_into(const at::Tensor& into, const at::Tensor& x, const at::Tensor& w, int64_t stride,
                           int64_t padding) {
  if (!into.defined() || into.dim() != 4 || into.scalar_type() != x.scalar_type() || into.device() != x.device())
    return false;
  const std::vector<int64_t> sizes{x.size(0), w.size(0), out_size(x.size(2), stride, padding),
                                   out_size(x.size(3), stride, padding)};
  return into.sizes() == at::IntArrayRef(sizes) && common::pixel_stride(into) > 0;
}

at::Tensor stem_conv_forward(const at::Tensor& x, const at::Tensor& w, int64_t stride, int64_t padding,
                             const at::Tensor& bias, bool silu, const at::Tensor& into) {
  if (!stem_conv_applies(x, w, stride, padding, 1)) throw std::invalid_argument("stem_conv_forward: not applicable");
#ifdef LIBREYOLO_CUDA_KERNELS
  c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xl = x.contiguous(at::MemoryFormat::ChannelsLast);
  at::Tensor y = into;
  if (y.defined()) {
    if (!stem_conv_writes_into(y, x, w, stride, padding))
      throw std::invalid_argument("stem_conv_forward: `into` must be [N, Cout, OH, OW] of x's dtype, channels-last");
  } else {
    y = at::empty({x.size(0), w.size(0), out_size(x.size(2), stride, padding), out_size(x.size(3), stride, padding)},
                  x.options().memory_format(at::MemoryFormat::ChannelsLast));
  }
  at::Tensor b;
  if (bias.defined()) {
    if (bias.numel() != w.size(0)) throw std::invalid_argument("stem_conv_forward: bias must have Cout values");
    b = bias.to(x.device(), at::kFloat).contiguous();
  }
  kernels::stem_conv_forward(launch_for(xl, w, stride, padding, common::pixel_stride(y)), xl.data_ptr(), w.data_ptr(),
                             b.defined() ? b.data_ptr<float>() : nullptr, silu, y.data_ptr());
  launches.fetch_add(1);
  return y;
#else
  (void)bias, (void)silu, (void)into;
  return {};
#endif
}

}  // namespace libreyolo::models
