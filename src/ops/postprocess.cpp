#include "ops/postprocess.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include <libreyolo/errors.hpp>

#include "core/env.hpp"
#include "core/log.hpp"
#include "ops/nms.hpp"

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/detect_nms.hpp"
#include "layers/kernel_dtype.hpp"
#endif

namespace libreyolo::ops {
namespace {

struct Candidate {
  float box[4];
  float score;
  int64_t cls;
};

// clamp(v, 0, hi) keeping NaN, as torch.clamp does.
inline float clip(float v, float hi) { return std::isnan(v) ? v : std::min(std::max(v, 0.0f), hi); }

// float32 CPU predictions: one pass over each class row (contiguous in [4 + nc, A]), no
// intermediate tensors. PyTorch compares a float32 tensor with a Python float in float32.
std::vector<Candidate> collect_cpu(const torch::Tensor& p, double conf, int64_t cap) {
  const torch::Tensor pc = p.contiguous();
  const float* base = pc.data_ptr<float>();
  const int64_t a_count = pc.size(1), nc = pc.size(0) - 4;
  const float threshold = static_cast<float>(conf);
  struct Hit {
    float score;
    int32_t anchor, cls;
  };
  std::vector<Hit> hits;
  for (int64_t c = 0; c < nc; ++c) {
    const float* row = base + (4 + c) * a_count;
    for (int64_t a = 0; a < a_count; ++a)
      if (row[a] > threshold)
        hits.push_back({row[a], static_cast<int32_t>(a), static_cast<int32_t>(c)});
  }
  if (static_cast<int64_t>(hits.size()) > cap)
    std::nth_element(hits.begin(), hits.begin() + cap, hits.end(),
                     [](const Hit& x, const Hit& y) { return x.score > y.score; });
  const size_t n = std::min<size_t>(hits.size(), static_cast<size_t>(cap));
  std::vector<Candidate> out(n);
  for (size_t i = 0; i < n; ++i) {
    const Hit& h = hits[i];
    for (int k = 0; k < 4; ++k) out[i].box[k] = base[k * a_count + h.anchor];
    out[i].score = h.score;
    out[i].cls = h.cls;
  }
  return out;
}

// Any dtype or device, pred [B, 4 + nc, A]: every image's candidates found on pred's device and
// copied to the host in one go. Per image they come class by class (nonzero's order), or, when an
// image has more than `cap`, as its top `cap` by score (topk on the device, as LibreYOLO).
std::vector<std::vector<Candidate>> collect_aten(const torch::Tensor& p, double conf, int64_t cap) {
  const int64_t batch = p.size(0);
  std::vector<std::vector<Candidate>> out(static_cast<size_t>(batch));
  const torch::Tensor scores = p.slice(1, 4);  // [B, nc, A]
  const torch::Tensor triples = (scores > conf).nonzero();  // [K, 3]: image, class, anchor (sorted)
  if (triples.size(0) == 0) return out;
  const torch::Tensor img = triples.select(1, 0), cls = triples.select(1, 1), anchor = triples.select(1, 2);
  const torch::Tensor score = scores.index({img, cls, anchor});
  // [K, 7] = image, box (p[img, 0:4, anchor]), score, class (ids exact in float32 below 2^24).
  const torch::Tensor boxes = p.slice(1, 0, 4).permute({0, 2, 1}).index({img, anchor});
  const torch::Tensor packed = torch::cat({img.unsqueeze(1).to(torch::kFloat32), boxes.to(torch::kFloat32),
                                           score.unsqueeze(1).to(torch::kFloat32),
                                           cls.unsqueeze(1).to(torch::kFloat32)},
                                          1)
                                   .to(torch::kCPU)
                                   .contiguous();
  const int64_t k = packed.size(0);
  const float* q = packed.data_ptr<float>();
  for (int64_t i = 0; i < k; ++i, q += 7)
    out[static_cast<size_t>(q[0])].push_back({{q[1], q[2], q[3], q[4]}, q[5], static_cast<int64_t>(q[6])});
  // An image over the cap (a tiny conf): the same topk over its scores in the same order.
  int64_t offset = 0;
  for (int64_t b = 0; b < batch; ++b) {
    auto& c = out[static_cast<size_t>(b)];
    const auto count = static_cast<int64_t>(c.size());
    if (count > cap) {
      const torch::Tensor top = std::get<1>(score.narrow(0, offset, count).topk(cap)).to(torch::kCPU);
      const int64_t* t = top.data_ptr<int64_t>();
      std::vector<Candidate> kept(static_cast<size_t>(cap));
      for (int64_t j = 0; j < cap; ++j) kept[static_cast<size_t>(j)] = c[static_cast<size_t>(t[j])];
      c.swap(kept);
    }
    offset += count;
  }
  return out;
}

void check_thresholds(int max_det, const ImageGeometry& g) {
  if (max_det < 1) throw UsageError(strfmt("postprocess_yolo: max_det must be >= 1, got %d", max_det));
  if (!(g.sx > 0) || !std::isfinite(g.sx) || !(g.sy > 0) || !std::isfinite(g.sy))
    throw UsageError(strfmt("postprocess_yolo: scales must be positive, got %g x %g", g.sx, g.sy));
  if (g.orig_h < 1 || g.orig_w < 1)
    throw UsageError(strfmt("postprocess_yolo: bad original size %dx%d", g.orig_w, g.orig_h));
}

// Candidates -> detections: mapped to the original image, clipped, degenerate and non-finite
// rows dropped, class-aware NMS, the best max_det kept.
Detections finish(const std::vector<Candidate>& cand, double iou, int max_det, const ImageGeometry& g);

// The device path (kernels/detect_nms.hpp): the whole post-processing of a CUDA pred on the GPU,
// then one copy of the fixed-size result rows to the host, the only synchronisation. An image with
// more candidates than the kernel's buffer takes the host path (collect_aten + finish), the same
// detections. False (nothing done) when the kernel does not apply: not CUDA, a dtype it lacks,
// or LIBREYOLO_NMS_KERNEL=0.
bool postprocess_device(const torch::Tensor& pred, double conf, double iou, int max_det,
                        const std::vector<ImageGeometry>& geometry, std::vector<Detections>& out) {
#ifdef LIBREYOLO_CUDA_KERNELS
  static const bool on = env_switch_on("LIBREYOLO_NMS_KERNEL");
  kernels::DetectNmsLaunch l;
  if (!on || !pred.is_cuda() || !models::kernel_dtype(pred.scalar_type(), &l.dtype) ||
      (pred.size(1) - 4) * pred.size(2) > 0xffffffffLL || pred.size(2) == 0)
    return false;
  const torch::Tensor p = pred.contiguous();
  l.batch = p.size(0);
  l.classes = static_cast<int>(p.size(1) - 4);
  l.anchors = p.size(2);
  // PyTorch compares a tensor with a Python float in the tensor's dtype.
  l.conf = torch::scalar_tensor(conf, torch::kFloat64).to(p.scalar_type()).to(torch::kFloat32).item<float>();
  l.iou = iou_threshold_float32(iou);
  l.max_det = std::min(max_det, kernels::kDetectNmsCapacity);  // never more rows than candidates
  std::vector<kernels::DetectImage> images;
  images.reserve(geometry.size());
  for (const auto& g : geometry)
    images.push_back({static_cast<float>(g.sx), static_cast<float>(g.sy), static_cast<float>(g.orig_w),
                      static_cast<float>(g.orig_h)});
  c10::cuda::CUDAGuard guard(p.device());
  const auto bytes = p.options().dtype(torch::kUInt8);
  const torch::Tensor workspace = torch::empty({kernels::detect_nms_workspace_bytes(l.batch)}, bytes);
  const torch::Tensor rows = torch::empty({l.batch, 2 + 6 * static_cast<int64_t>(l.max_det)},
                                          p.options().dtype(torch::kFloat32));
  l.stream = c10::cuda::getCurrentCUDAStream(p.device().index()).stream();
  kernels::detect_nms(l, p.data_ptr(), images.data(), workspace.data_ptr(), rows.data_ptr<float>());
  const torch::Tensor host = rows.to(torch::kCPU);  // the one synchronisation
  const int64_t cap = std::max<int64_t>(max_det, kMaxNmsCandidates);
  for (int64_t b = 0; b < l.batch; ++b) {
    const float* r = host.data_ptr<float>() + b * host.size(1);
    const auto& g = geometry[static_cast<size_t>(b)];
    if (r[0] > static_cast<float>(kernels::kDetectNmsCapacity)) {  // more than the kernel sorts
      out.push_back(finish(collect_aten(p.narrow(0, b, 1), conf, cap).front(), iou, max_det, g));
      continue;
    }
    const auto kept = static_cast<int64_t>(r[1]);
    if (kept == 0) {
      out.push_back(no_detections());
      continue;
    }
    Detections d{torch::empty({kept, 4}, torch::kFloat32), torch::empty({kept}, torch::kFloat32),
                 torch::empty({kept}, torch::kInt64)};
    float* ob = d.boxes.data_ptr<float>();
    float* os = d.scores.data_ptr<float>();
    int64_t* oc = d.classes.data_ptr<int64_t>();
    for (int64_t k = 0; k < kept; ++k) {
      const float* q = r + 2 + 6 * k;
      for (int j = 0; j < 4; ++j) ob[4 * k + j] = q[j];
      os[k] = q[4];
      oc[k] = static_cast<int64_t>(q[5]);
    }
    out.push_back(std::move(d));
  }
  return true;
#else
  (void)pred, (void)conf, (void)iou, (void)max_det, (void)geometry, (void)out;
  return false;
#endif
}

}  // namespace

Detections postprocess_yolo(const torch::Tensor& pred, double conf, double iou, int max_det,
                            const ImageGeometry& geometry) {
  if (!pred.defined() || !at::isFloatingType(pred.scalar_type()) ||
      !(pred.dim() == 2 || (pred.dim() == 3 && pred.size(0) == 1)) || pred.size(-2) <= 4)
    throw UsageError("postprocess_yolo: pred must be a floating tensor [4 + nc, A] for one image");
  check_thresholds(max_det, geometry);
  const torch::Tensor p = pred.dim() == 3 ? pred[0] : pred;
  if (p.is_cuda()) return postprocess_yolo_batch(p.unsqueeze(0), conf, iou, max_det, {geometry}).front();
  const int64_t cap = std::max<int64_t>(max_det, kMaxNmsCandidates);
  const std::vector<Candidate> cand = p.is_cpu() && p.scalar_type() == torch::kFloat32
                                          ? collect_cpu(p, conf, cap)
                                          : collect_aten(p.unsqueeze(0), conf, cap).front();
  return finish(cand, iou, max_det, geometry);
}

std::vector<Detections> postprocess_yolo_batch(const torch::Tensor& pred, double conf, double iou, int max_det,
                                               const std::vector<ImageGeometry>& geometry) {
  if (!pred.defined() || !at::isFloatingType(pred.scalar_type()) || pred.dim() != 3 || pred.size(1) <= 4 ||
      pred.size(0) != static_cast<int64_t>(geometry.size()))
    throw UsageError("postprocess_yolo_batch: pred must be a floating tensor [B, 4 + nc, A], one geometry per image");
  for (const auto& g : geometry) check_thresholds(max_det, g);
  std::vector<Detections> out;
  out.reserve(geometry.size());
  if (pred.is_cpu() && pred.scalar_type() == torch::kFloat32) {
    for (size_t i = 0; i < geometry.size(); ++i)
      out.push_back(postprocess_yolo(pred[static_cast<int64_t>(i)], conf, iou, max_det, geometry[i]));
    return out;
  }
  if (postprocess_device(pred, conf, iou, max_det, geometry, out)) return out;
  const int64_t cap = std::max<int64_t>(max_det, kMaxNmsCandidates);
  const auto cand = collect_aten(pred, conf, cap);
  for (size_t i = 0; i < geometry.size(); ++i)
    out.push_back(finish(cand[i], iou, max_det, geometry[i]));
  return out;
}

namespace {

Detections finish(const std::vector<Candidate>& cand, double iou, int max_det, const ImageGeometry& g) {
  if (cand.empty()) return no_detections();

  // Map to the original image, clip, drop degenerate and non-finite rows. (The reference also
  // shifts boxes by min(min(boxes), 0) before NMS; after clipping that shift is zero.)
  const int64_t k = static_cast<int64_t>(cand.size());
  torch::Tensor out_boxes = torch::empty({k, 4}, torch::kFloat32);
  torch::Tensor out_scores = torch::empty({k}, torch::kFloat32);
  torch::Tensor out_classes = torch::empty({k}, torch::kInt64);
  float* ob = out_boxes.data_ptr<float>();
  float* os = out_scores.data_ptr<float>();
  int64_t* oc = out_classes.data_ptr<int64_t>();
  // PyTorch divides a float32 tensor by a Python float in float32.
  const float sx = static_cast<float>(g.sx), sy = static_cast<float>(g.sy);
  const float w = static_cast<float>(g.orig_w), h = static_cast<float>(g.orig_h);
  int64_t n = 0;
  for (const Candidate& c : cand) {
    const float x1 = clip(c.box[0] / sx, w), y1 = clip(c.box[1] / sy, h);
    const float x2 = clip(c.box[2] / sx, w), y2 = clip(c.box[3] / sy, h);
    // NaN coordinates fail these comparisons too.
    if (!(x2 - x1 > 0.0f && y2 - y1 > 0.0f) || !std::isfinite(c.score)) continue;
    ob[4 * n] = x1, ob[4 * n + 1] = y1, ob[4 * n + 2] = x2, ob[4 * n + 3] = y2;
    os[n] = c.score;
    oc[n] = c.cls;
    ++n;
  }
  if (n == 0) return no_detections();
  out_boxes = out_boxes.narrow(0, 0, n);
  out_scores = out_scores.narrow(0, 0, n);
  out_classes = out_classes.narrow(0, 0, n);

  torch::Tensor keep = batched_nms(out_boxes, out_scores, out_classes, iou);
  if (keep.size(0) > max_det) keep = keep.narrow(0, 0, max_det);
  return {out_boxes.index_select(0, keep), out_scores.index_select(0, keep),
          out_classes.index_select(0, keep)};
}

}  // namespace

Detections no_detections() {
  return {torch::empty({0, 4}, torch::kFloat32), torch::empty({0}, torch::kFloat32),
          torch::empty({0}, torch::kInt64)};
}

Detections nms_detections(torch::Tensor boxes, torch::Tensor scores, torch::Tensor classes, double iou, int max_det) {
  const auto valid = (boxes.select(1, 2) - boxes.select(1, 0) > 0) & (boxes.select(1, 3) - boxes.select(1, 1) > 0) &
                     torch::isfinite(boxes).all(1) & torch::isfinite(scores);
  boxes = boxes.index({valid});
  scores = scores.index({valid});
  classes = classes.index({valid});
  auto keep = batched_nms(boxes, scores, classes, iou);  // by descending score
  if (keep.size(0) > max_det) keep = keep.narrow(0, 0, max_det);
  return {boxes.index_select(0, keep).cpu().contiguous(), scores.index_select(0, keep).cpu().contiguous(),
          classes.index_select(0, keep).cpu().contiguous()};
}

}  // namespace libreyolo::ops
