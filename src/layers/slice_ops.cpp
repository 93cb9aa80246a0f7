#include "layers/slice_ops.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "libreyolo/errors.hpp"
#include "layers/pixel_stride.hpp"
#include "layers/pool2.hpp"

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/spp_pool.hpp"
#include "layers/kernel_dtype.hpp"
#endif

namespace libreyolo::models::common {

void spp_max_pools_into(const torch::Tensor& y0, const torch::Tensor& o5, const torch::Tensor& o9,
                        const torch::Tensor& o13) {
  for (const auto* o : {&o5, &o9, &o13})
    if (o->sizes() != y0.sizes() || o->scalar_type() != y0.scalar_type() || o->device() != y0.device())
      throw UsageError("spp_max_pools_into: outputs must match the input's shape, dtype and device");
#ifdef LIBREYOLO_CUDA_KERNELS
  kernels::DType dt;
  const int64_t in_pixel = pixel_stride(y0), out_pixel = pixel_stride(o5);
  if (fused_pool() && y0.is_cuda() && kernel_dtype(y0.scalar_type(), &dt) && in_pixel > 0 && out_pixel > 0 &&
      pixel_stride(o9) == out_pixel && pixel_stride(o13) == out_pixel && y0.size(1) <= INT32_MAX &&
      y0.size(2) <= INT32_MAX && y0.size(3) <= INT32_MAX && !torch::GradMode::is_enabled()) {
    c10::cuda::CUDAGuard guard(y0.device());
    kernels::SppPoolLaunch l;
    l.batch = y0.size(0);
    l.channels = static_cast<int>(y0.size(1));
    l.height = static_cast<int>(y0.size(2));
    l.width = static_cast<int>(y0.size(3));
    l.in_pixel = in_pixel;
    l.out_pixel = out_pixel;
    l.dtype = dt;
    l.stream = c10::cuda::getCurrentCUDAStream(y0.device().index()).stream();
    const at::Tensor rows = at::empty({3 * y0.numel()}, y0.options().memory_format(at::MemoryFormat::Contiguous));
    kernels::spp_max_pools(l, y0.data_ptr(), rows.data_ptr(), o5.data_ptr(), o9.data_ptr(), o13.data_ptr());
    return;
  }
#endif
  auto y = y0;
  for (const auto* o : {&o5, &o9, &o13}) {
    y = torch::max_pool2d(y, {5, 5}, {1, 1}, {2, 2});
    o->copy_(y);
  }
}

namespace {

class ChannelSliceFn : public torch::autograd::Function<ChannelSliceFn> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& y,
                                                int64_t start, int64_t len) {
    ctx->saved_data["at"] = std::vector<int64_t>{start, len};
    ctx->saved_data["sizes"] = y.sizes().vec();
    ctx->saved_data["format"] = static_cast<int64_t>(y.suggest_memory_format());
    ctx->saved_data["dtype"] = static_cast<int64_t>(y.scalar_type());
    return {y, y.narrow(1, start, len)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto at = ctx->saved_data["at"].toIntVector();
    const int64_t start = at[0], len = at[1];
    const torch::Tensor &whole = grads[0], &part = grads[1];
    if (!part.defined()) return {whole, torch::Tensor(), torch::Tensor()};
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    const auto fmt = static_cast<at::MemoryFormat>(ctx->saved_data["format"].toInt());
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    torch::Tensor dy = torch::empty(sizes, part.options().dtype(dtype).memory_format(fmt));
    const int64_t channels = sizes[1], end = start + len;
    if (!whole.defined()) {
      if (start > 0) dy.narrow(1, 0, start).zero_();
      if (end < channels) dy.narrow(1, end, channels - end).zero_();
      dy.narrow(1, start, len).copy_(part);
    } else {
      if (start > 0) dy.narrow(1, 0, start).copy_(whole.narrow(1, 0, start));
      if (end < channels) dy.narrow(1, end, channels - end).copy_(whole.narrow(1, end, channels - end));
      auto into = dy.narrow(1, start, len);
      at::add_out(into, whole.narrow(1, start, len), part);
    }
    return {dy, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::pair<torch::Tensor, torch::Tensor> with_channel_slice(const torch::Tensor& y, int64_t start, int64_t len) {
  if (y.dim() < 2 || start < 0 || len < 1 || start + len > y.size(1))
    throw UsageError("with_channel_slice: channels [start, start + len) must lie inside y's");
  if (!torch::GradMode::is_enabled() || !y.requires_grad()) return {y, y.narrow(1, start, len)};
  auto out = ChannelSliceFn::apply(y, start, len);
  return {out[0], out[1]};
}

torch::Tensor upsample2x(const torch::Tensor& x) {
  if (x.dim() != 4) throw UsageError("upsample2x: x must be [N, C, H, W]");
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return torch::upsample_nearest2d(x, std::vector<int64_t>{x.size(2) * 2, x.size(3) * 2}, 2.0, 2.0);
}

void upsample2x_into(const torch::Tensor& x, const torch::Tensor& out) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  if (x.dim() != 4 || out.sizes() != at::IntArrayRef({n, c, 2 * h, 2 * w}))
    throw UsageError("upsample2x_into: out must be [N, C, 2H, 2W] of x [N, C, H, W]");
  const auto s = out.strides();
  // out[n, c, 2i + a, 2j + b] = x[n, c, i, j]: out seen as [N, C, H, 2, W, 2].
  out.as_strided({n, c, h, 2, w, 2}, {s[0], s[1], 2 * s[2], s[2], 2 * s[3], s[3]}, out.storage_offset())
      .copy_(x.unsqueeze(3).unsqueeze(5).expand({n, c, h, 2, w, 2}));
}

}  // namespace libreyolo::models::common
