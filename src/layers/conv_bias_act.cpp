// The inference convolution with its bias and activation (conv_bn_act.hpp, conv_bias_act): the
// stem kernel, cuDNN's runtime fusion, or a convolution followed by the bias+SiLU kernel.
#include "layers/conv_bn_act.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "layers/conv_detail.hpp"
#include "layers/cudnn_fusion.hpp"
#include "layers/stem_conv.hpp"

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/bias_act.hpp"
#include "layers/kernel_dtype.hpp"
#endif

namespace libreyolo::models {

using detail::as_rows;
using detail::rows_as_nchw;
using detail::direct_cudnn;

torch::Tensor finish_output(torch::Tensor z, const ConvOutput& o) {
  if (o.residual) z.add_(*o.residual);
  if (!o.into) return z;
  o.into->copy_(z);
  return *o.into;
}

torch::Tensor conv_bias_act(const torch::Tensor& x, const ConvBiasActParams& p) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast{c10::autocast_dispatch_keyset};
  const at::Tensor& w = *p.weight;
  const at::Tensor xc = x.scalar_type() == w.scalar_type() ? x : x.to(w.scalar_type());
  const bool gemm = p.pointwise && conv1x1_gemm_applies(xc);
#ifdef LIBREYOLO_CUDA_KERNELS
  kernels::DType dt = kernels::DType::Float32;
  if (xc.is_cuda() && detail::fused_kernels_on() && kernel_dtype(xc.scalar_type(), &dt)) {
    static const at::Tensor none;
    // A 3-channel input: the direct kernel with the bias and SiLU as its epilogue (layers/stem_conv.hpp).
    if (!p.output.residual && stem_conv_applies(xc, w, p.stride, p.padding, p.groups) &&
        (!p.output.into || stem_conv_writes_into(*p.output.into, xc, w, p.stride, p.padding)))
      return stem_conv_forward(xc, w, p.stride, p.padding, *p.bias32, p.act, p.output.into ? *p.output.into : none);
    // cuDNN's runtime fusion: the epilogue inside the convolution (cudnn_fusion_takes, NHWC, groups 1).
    if (at::Tensor y = cudnn_conv_bias_act(xc, w, *p.bias32, p.stride, p.padding, p.act,
                                           p.output.residual ? *p.output.residual : none,
                                           p.output.into ? *p.output.into : none);
        y.defined())
      return y;
    at::Tensor z;
    if (gemm) {
      z = conv1x1_gemm(xc, w);
    } else if (direct_cudnn(xc, w, p.groups)) {
      auto& ctx = at::globalContext();
      const auto fmt = at::MemoryFormat::ChannelsLast;
      z = at::cudnn_convolution(xc.contiguous(fmt), w.contiguous(fmt), {p.padding, p.padding}, {p.stride, p.stride},
                                {1, 1}, p.groups, ctx.benchmarkCuDNN(), ctx.deterministicCuDNN(),
                                ctx.allowTF32CuDNN(at::Float32Op::CONV));
    } else {
      z = at::convolution(xc, w, {}, {p.stride, p.stride}, {p.padding, p.padding}, {1, 1}, false, {0, 0}, p.groups);
    }
    // NHWC first: with H*W == 1 both layouts are the same memory.
    int64_t inner = -1;
    if (z.is_contiguous(at::MemoryFormat::ChannelsLast)) {
      inner = 1;
    } else if (z.is_contiguous()) {
      inner = z.size(2) * z.size(3);
    }
    if (inner > 0 && z.size(1) > 0) {
      c10::cuda::CUDAGuard guard(z.device());
      kernels::BiasActLaunch l;
      l.numel = z.numel();
      l.channels = static_cast<int>(z.size(1));
      l.inner = inner;
      l.dtype = dt;
      l.act = p.act;
      l.stream = c10::cuda::getCurrentCUDAStream(z.device().index()).stream();
      kernels::bias_act_inplace(l, z.data_ptr(), p.bias32->data_ptr<float>());
      return finish_output(z, p.output);
    }
    z.add_(p.bias->view({1, -1, 1, 1}));
    return finish_output(p.act ? at::silu_(z) : z, p.output);
  }
#endif
  at::Tensor z;
  if (gemm) {  // one cuBLAS call with the bias as its epilogue
    z = rows_as_nchw(at::addmm(*p.bias, as_rows(xc), w.view({w.size(0), w.size(1)}).t()), xc);
  } else {
    z = at::convolution(xc, w, *p.bias, {p.stride, p.stride}, {p.padding, p.padding}, {1, 1}, false, {0, 0},
                        p.groups);
  }
  return finish_output(p.act ? at::silu_(z) : z, p.output);
}

int64_t fused_dense_groups(const torch::Tensor& x, int64_t groups, at::ScalarType dtype, at::MemoryFormat fmt) {
  const bool fits = groups >= 2 && groups <= 4 && x.is_cuda() && cudnn_fusion_takes(dtype) &&
                    fmt == at::MemoryFormat::ChannelsLast && cudnn_fusion_enabled();
  return fits ? groups : 0;
}

}  // namespace libreyolo::models
