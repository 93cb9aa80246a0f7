#include "models/common/slice_ops.hpp"

#include "libreyolo/errors.hpp"
#include "models/common/pixel_stride.hpp"
#include "models/pool2.hpp"

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/spp_pool.hpp"
#include "models/kernel_dtype.hpp"
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
