// The assigner's per-pair metrics; see assign.hpp. One thread per (b, t, a), anchors fastest, so a
// warp reads consecutive anchors of the predicted boxes and logits and writes consecutive outputs;
// the ground-truth box of (b, t) is the same for the whole row (cached). The arithmetic follows
// the composed form's order (the loss's pairwise_ciou); the compiler may contract
// multiply-adds, so values agree to float32 rounding, not bit for bit.
#include "kernels/assign.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace libreyolo::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void assign_metrics_kernel(const float* __restrict__ gt, const float* __restrict__ pred,
                                      const float* __restrict__ cls_logits, const int64_t* __restrict__ gt_cls,
                                      int64_t T, int64_t A, int64_t pred_bs, int64_t cls_bs, int64_t rows, float eps,
                                      float atan_scale,
                                      float* __restrict__ iou_out, float* __restrict__ align_out) {
  const int64_t total = rows * A;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t row = i / A, a = i - row * A;  // row = b * T + t
    const int64_t b = row / T;
    const float* g = gt + row * 4;
    const float gx1 = __ldg(g), gy1 = __ldg(g + 1), gx2 = __ldg(g + 2), gy2 = __ldg(g + 3);
    const float* p = pred + b * pred_bs + a;
    const float px1 = p[0], py1 = p[A], px2 = p[2 * A], py2 = p[3 * A];
    const float gw = gx2 - gx1, gh = gy2 - gy1, pw = px2 - px1, ph = py2 - py1;
    const float g_area = gw * gh, p_area = pw * ph;
    const float g_cx = (gx2 + gx1) * 0.5f, g_cy = (gy2 + gy1) * 0.5f;
    const float p_cx = (px2 + px1) * 0.5f, p_cy = (py2 + py1) * 0.5f;
    const float g_atan = atanf(gw / (gh + eps)), p_atan = atanf(pw / (ph + eps));
    const float iw = fmaxf(fminf(gx2, px2) - fmaxf(gx1, px1), 0.f);
    const float ih = fmaxf(fminf(gy2, py2) - fmaxf(gy1, py1), 0.f);
    const float inter = iw * ih;
    const float iou = inter / (g_area + p_area - inter + eps);
    const float cw = fmaxf(gx2, px2) - fminf(gx1, px1), ch = fmaxf(gy2, py2) - fminf(gy1, py1);
    const float c2 = cw * cw + ch * ch + eps;
    const float dx = g_cx - p_cx, dy = g_cy - p_cy;
    const float diou = iou - (dx * dx + dy * dy) / c2;
    const float da = g_atan - p_atan;
    const float v = da * da * atan_scale;
    const float alpha = v / (v - iou + 1.f + eps);
    const float ciou = fminf(fmaxf(diou - alpha * v, 0.f), 1.f);
    const int64_t c = gt_cls[row];
    const float logit = cls_logits[b * cls_bs + c * A + a];
    const float score = sqrtf(1.f / (1.f + expf(-logit)));
    const float i2 = ciou * ciou;
    iou_out[i] = ciou;
    align_out[i] = score * (i2 * i2 * i2);
  }
}

}  // namespace

void assign_metrics(const AssignMetricsLaunch& l, const float* gt, const float* pred, const float* cls_logits,
                    const int64_t* gt_cls, float* iou, float* align) {
  const int64_t rows = l.batch * l.boxes, total = rows * l.anchors;
  if (total <= 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65535 * 4));
  assign_metrics_kernel<<<blocks, kThreads, 0, l.stream>>>(gt, pred, cls_logits, gt_cls, l.boxes, l.anchors,
                                                           l.pred_batch_stride, l.cls_batch_stride, rows, l.eps,
                                                           l.atan_scale, iou, align);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("assign_metrics: ") + cudaGetErrorString(e));
}

}  // namespace libreyolo::kernels
