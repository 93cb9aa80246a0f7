#include "layers/pool2.hpp"

#include "core/env.hpp"

#include <atomic>

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/pool2.hpp"
#include "layers/pixel_stride.hpp"
#include "layers/kernel_dtype.hpp"
#endif

namespace libreyolo::models {
namespace {

EnvFlag fused_pool_flag{"LIBREYOLO_FUSED_POOL"};

std::pair<torch::Tensor, torch::Tensor> aten_split(const torch::Tensor& x, int64_t split) {
  const torch::Tensor y = torch::avg_pool2d(x, {2, 2}, {1, 1}, {0, 0}, false, true);
  return {y.narrow(1, 0, split), y.narrow(1, split, y.size(1) - split)};
}

#ifdef LIBREYOLO_CUDA_KERNELS
bool kernel_applies(const torch::Tensor& x) {
  kernels::DType dt;
  return fused_pool_flag.load() && x.is_cuda() && x.dim() == 4 && kernel_dtype(x.scalar_type(), &dt) &&
         x.size(2) >= 2 && x.size(3) >= 2 && x.size(1) <= INT32_MAX && x.size(2) <= INT32_MAX &&
         x.size(3) <= INT32_MAX && common::pixel_stride(x) > 0;
}

kernels::Pool2Launch launch_for(const torch::Tensor& x, int64_t split, std::initializer_list<const void*> ptrs) {
  kernels::Pool2Launch l;
  l.batch = x.size(0);
  l.channels = static_cast<int>(x.size(1));
  l.height = static_cast<int>(x.size(2));
  l.width = static_cast<int>(x.size(3));
  l.split = static_cast<int>(split);
  kernel_dtype(x.scalar_type(), &l.dtype);
  l.in_pixel = common::pixel_stride(x);  // a channel slice of a wider tensor reads in place
  l.vec = kernels::avg_pool2_vector_width(l.channels, l.split);
  if (l.in_pixel % l.vec != 0) l.vec = 1;
  const auto bytes = static_cast<uintptr_t>(l.vec) * x.element_size();
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % bytes != 0) l.vec = 1;
  l.stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  return l;
}

class Pool2Fn : public torch::autograd::Function<Pool2Fn> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                int64_t split) {
    c10::cuda::CUDAGuard guard(x.device());
    const auto opts = x.options().memory_format(at::MemoryFormat::ChannelsLast);
    const int64_t n = x.size(0), c = x.size(1), oh = x.size(2) - 1, ow = x.size(3) - 1;
    torch::Tensor a = torch::empty({n, split, oh, ow}, opts);
    torch::Tensor b = torch::empty({n, c - split, oh, ow}, opts);
    void* bp = c > split ? b.data_ptr() : nullptr;
    kernels::avg_pool2_forward(launch_for(x, split, {x.data_ptr(), a.data_ptr(), bp}), x.data_ptr(), a.data_ptr(),
                               bp);
    ctx->saved_data["shape"] = x.sizes().vec();
    ctx->saved_data["split"] = split;
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    return {a, b};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto shape = ctx->saved_data["shape"].toIntVector();
    const int64_t split = ctx->saved_data["split"].toInt();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const torch::Tensor& any = grads[0].defined() ? grads[0] : grads[1];
    if (!any.defined()) return {torch::Tensor(), torch::Tensor()};
    c10::cuda::CUDAGuard guard(any.device());
    auto prepare = [&](const torch::Tensor& g) {
      if (!g.defined() || g.size(1) == 0) return torch::Tensor();
      return g.to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
    };
    const torch::Tensor ga = prepare(grads[0]), gb = prepare(grads[1]);
    torch::Tensor gx =
        torch::empty(shape, any.options().dtype(dtype).memory_format(at::MemoryFormat::ChannelsLast));
    const void* pa = ga.defined() ? ga.data_ptr() : nullptr;
    const void* pb = gb.defined() ? gb.data_ptr() : nullptr;
    kernels::avg_pool2_backward(launch_for(gx, split, {gx.data_ptr(), pa, pb}), pa, pb, gx.data_ptr());
    return {gx, torch::Tensor()};
  }
};
#endif

}  // namespace

void set_fused_pool(bool on) { fused_pool_flag.store(on); }
bool fused_pool() { return fused_pool_flag.load(); }

std::pair<torch::Tensor, torch::Tensor> avg_pool2_split(const torch::Tensor& x, int64_t split) {
  TORCH_CHECK(x.dim() == 4 && split >= 0 && split <= x.size(1), "avg_pool2_split: bad input or split");
#ifdef LIBREYOLO_CUDA_KERNELS
  if (kernel_applies(x)) {
    auto out = Pool2Fn::apply(x, split);
    return {out[0], out[1]};
  }
#endif
  return aten_split(x, split);
}

}  // namespace libreyolo::models
