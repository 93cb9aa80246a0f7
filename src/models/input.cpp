#include "models/input.hpp"

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "core/env.hpp"
#include "kernels/network_input.hpp"
#include "layers/kernel_dtype.hpp"
#endif

namespace libreyolo::models {
namespace {

#ifdef LIBREYOLO_CUDA_KERNELS
// On unless LIBREYOLO_INPUT_KERNEL is 0, false or off (then ATen's ops, for comparisons).
bool input_kernel_enabled() {
  static const bool on = env_switch_on("LIBREYOLO_INPUT_KERNEL");
  return on;
}

// The one-pass kernel when the images are on the GPU and `out` is a dense buffer of a kernel dtype in
// the asked layout; false (nothing written) otherwise.
bool convert_on_gpu(const torch::Tensor& nhwc, const InputSpec& spec, bool channels_last, torch::Tensor& out) {
  kernels::DType dt;
  // The kernel flips and scales; a per-channel normalisation takes ATen's ops.
  if (!input_kernel_enabled() || spec.normalizes() || !nhwc.is_cuda() || !nhwc.is_contiguous() || !out.is_cuda() ||
      !kernel_dtype(out.scalar_type(), &dt))
    return false;
  if (!out.is_contiguous(channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous)) return false;
  c10::cuda::CUDAGuard guard(nhwc.device());
  kernels::NetworkInputLaunch l;
  l.batch = nhwc.size(0);
  l.height = nhwc.size(1);
  l.width = nhwc.size(2);
  l.bgr = spec.bgr;
  // As ATen's division by a scalar on CUDA: a multiplication by the float32 reciprocal, so the
  // values equal the composed ops' bit for bit.
  l.scale = spec.divisor != 1.0 ? 1.0f / static_cast<float>(spec.divisor) : 1.0f;
  l.channels_last = channels_last;
  l.dtype = dt;
  l.stream = c10::cuda::getCurrentCUDAStream(nhwc.device().index()).stream();
  kernels::network_input(l, nhwc.data_ptr<uint8_t>(), out.data_ptr());
  return true;
}
#endif

}  // namespace

torch::Tensor to_network_input(const torch::Tensor& images, const InputSpec& spec, const torch::Device& device,
                               bool channels_last, torch::Tensor out, torch::ScalarType dtype) {
  TORCH_CHECK(images.dim() == 4 && images.size(3) == 3, "network input: expected [B, H, W, 3] images, got ",
              images.sizes());
  const torch::Tensor nhwc = images.to(device, /*non_blocking=*/true);
  const auto layout = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  const std::vector<int64_t> shape = {nhwc.size(0), 3, nhwc.size(1), nhwc.size(2)};
  const bool reuse = out.defined() && out.sizes() == at::IntArrayRef(shape) && out.device() == nhwc.device() &&
                     out.scalar_type() == dtype;
#ifdef LIBREYOLO_CUDA_KERNELS
  if (nhwc.scalar_type() == torch::kUInt8 && nhwc.is_cuda()) {
    torch::Tensor dst = reuse ? out : torch::empty(shape, nhwc.options().dtype(dtype).memory_format(layout));
    if (convert_on_gpu(nhwc, spec, channels_last, dst)) return dst;
  }
#endif
  // The NCHW view of NHWC memory has channels_last strides already: with channels_last the
  // conversion to float is the only copy.
  torch::Tensor x = nhwc.permute({0, 3, 1, 2});
  if (spec.bgr) x = x.flip(1);
  // The values in float32 first (into the buffer when it is float32), then one rounding to dtype.
  torch::Tensor f = reuse && dtype == torch::kFloat ? out.copy_(x)
                                                    : x.to(torch::TensorOptions().dtype(torch::kFloat), false, false, layout);
  if (spec.divisor != 1.0) f.div_(spec.divisor);
  if (spec.normalizes()) {
    // Per channel with scalar operands: no host-to-device copy (a captured forward may run this).
    for (int64_t c = 0; c < 3; ++c) f.narrow(1, c, 1).sub_(spec.mean[c]).div_(spec.stddev[c]);
  }
  if (dtype == torch::kFloat) return f;
  return reuse ? out.copy_(f) : f.to(dtype);
}

}  // namespace libreyolo::models
