#include "ops/dfl.hpp"

#include <libreyolo/errors.hpp>

#include "core/env.hpp"
#include "core/log.hpp"

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/dfl_decode.hpp"
#include "layers/kernel_dtype.hpp"
#endif

namespace libreyolo::ops {

torch::Tensor cell_centres(int64_t n, int64_t stride, const torch::Device& device) {
  const auto lopt = torch::TensorOptions().dtype(torch::kLong).device(device);
  return (torch::arange(n, lopt) * stride + stride / 2).to(torch::kFloat);
}

AnchorPoints make_anchor_points(const std::vector<std::array<int64_t, 2>>& level_hw,
                                const std::vector<int64_t>& strides, int64_t reg_max,
                                const torch::Device& device) {
  if (level_hw.size() != strides.size()) {
    throw UsageError(strfmt("make_anchor_points: %zu level sizes for %zu strides", level_hw.size(),
                            strides.size()));
  }
  const auto fopt = torch::TensorOptions().dtype(torch::kFloat).device(device);
  std::vector<torch::Tensor> xs, ys, ss;
  for (size_t l = 0; l < level_hw.size(); ++l) {
    const int64_t s = strides[l], h = level_hw[l][0], w = level_hw[l][1];
    const auto x = cell_centres(w, s, device), y = cell_centres(h, s, device);
    xs.push_back(x.unsqueeze(0).expand({h, w}).reshape(-1));
    ys.push_back(y.unsqueeze(1).expand({h, w}).reshape(-1));
    ss.push_back(torch::full({h * w}, static_cast<double>(s), fopt));
  }
  AnchorPoints a;
  a.xy = torch::stack({torch::cat(xs), torch::cat(ys)}, 0);
  a.stride = torch::cat(ss);
  a.bins = torch::arange(reg_max, fopt);
  return a;
}

torch::Tensor dfl_boxes(const torch::Tensor& box_logits, const AnchorPoints& anchors) {
  const int64_t bins = anchors.bins.size(0);
  if (box_logits.dim() != 4 || box_logits.size(1) != 4 || box_logits.size(2) != bins ||
      box_logits.size(3) != anchors.stride.size(0)) {
    throw UsageError(strfmt("dfl_boxes: expected logits [B, 4, %lld, %lld], got ", static_cast<long long>(bins),
                            static_cast<long long>(anchors.stride.size(0))) +
                     c10::str(box_logits.sizes()));
  }
  const auto ltrb = (at::softmax(box_logits, 2) * anchors.bins.view({1, 1, bins, 1})).sum(2) * anchors.stride;
  return at::cat({anchors.xy - ltrb.narrow(1, 0, 2), anchors.xy + ltrb.narrow(1, 2, 2)}, 1);
}

torch::Tensor dfl_decode_kernel(const std::vector<torch::Tensor>& raw, const std::vector<int64_t>& strides,
                                int64_t reg_max, int64_t classes) {
#ifdef LIBREYOLO_CUDA_KERNELS
  static const bool on = env_switch_on("LIBREYOLO_DECODE_KERNEL");
  kernels::DflDecodeLaunch l;
  if (!on || raw.empty() || raw.size() > 4 || raw.size() != strides.size() || reg_max != 16 ||
      torch::GradMode::is_enabled() || !models::kernel_dtype(raw[0].scalar_type(), &l.dtype))
    return {};
  const int64_t channels = 4 * reg_max + classes;
  for (size_t i = 0; i < raw.size(); ++i) {
    const auto& r = raw[i];
    if (!r.is_cuda() || r.dim() != 4 || r.scalar_type() != raw[0].scalar_type() || r.device() != raw[0].device() ||
        r.size(0) != raw[0].size(0) || r.size(1) != channels || !r.is_contiguous(at::MemoryFormat::ChannelsLast) ||
        r.size(2) > INT32_MAX || r.size(3) > INT32_MAX)
      return {};
    l.level[i] = {r.data_ptr(), static_cast<int>(r.size(2)), static_cast<int>(r.size(3)), static_cast<int>(strides[i])};
  }
  l.batch = raw[0].size(0);
  l.levels = static_cast<int>(raw.size());
  l.reg_max = static_cast<int>(reg_max);
  l.classes = static_cast<int>(classes);
  int64_t anchors = 0;
  for (const auto& r : raw) anchors += r.size(2) * r.size(3);
  c10::cuda::CUDAGuard guard(raw[0].device());
  torch::Tensor out = torch::empty({l.batch, 4 + classes, anchors}, raw[0].options().dtype(torch::kFloat));
  l.stream = c10::cuda::getCurrentCUDAStream(raw[0].device().index()).stream();
  kernels::dfl_decode(l, out.data_ptr<float>());
  return out;
#else
  (void)raw, (void)strides, (void)reg_max, (void)classes;
  return {};
#endif
}

}  // namespace libreyolo::ops
