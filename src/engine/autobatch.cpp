#include "engine/autobatch.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include <c10/util/Exception.h>
#ifdef LIBREYOLO_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "core/log.hpp"
#include "engine/model_snapshot.hpp"

namespace libreyolo::engine {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int kMaxAutoBatch = 1024;
constexpr double kStopFraction = 0.90;  // probing stops once a probe used more of the memory

#ifdef LIBREYOLO_CUDA
bool is_out_of_memory(const c10::Error& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  // As the reference's check of a RuntimeError's text ("out of memory" from a CUDA call that is
  // not the caching allocator's, e.g. a library's workspace).
  return std::string(e.what_without_backtrace()).find("out of memory") != std::string::npos;
}

double peak_allocated_gib(c10::DeviceIndex index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  return static_cast<double>(stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak) /
         kGiB;
}

// One probe: a train-mode forward of `b` zero images and the backward of the first output that
// requires grad, as a float sum. Returns the allocator's peak in GiB.
double probe_once(models::Detector& model, const torch::Device& device, c10::DeviceIndex index, int b,
                  const AutoBatchOptions& opt) {
  c10::cuda::CUDACachingAllocator::emptyCache();
  c10::cuda::CUDACachingAllocator::resetPeakStats(index);
  {
    auto x = torch::zeros({b, 3, opt.imgsz, opt.imgsz}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    if (opt.channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    std::vector<torch::Tensor> out;
    {
      AutocastGuard ac(device, opt.amp.enabled, opt.amp.dtype);
      out = model.forward_train(x, {});
    }
    for (const auto& t : out) {
      if (t.defined() && t.requires_grad()) {
        t.to(torch::kFloat).sum().backward();
        break;
      }
    }
  }
  model.zero_grad(/*set_to_none=*/true);
  return peak_allocated_gib(index);
}
#endif

}  // namespace

int floor_pow2_strict(double x) {
  if (!(x > 2.0)) return 1;  // also NaN
  if (x > 1073741824.0) return 1073741824;  // 2^30: keeps the result an int
  int e = 0;
  const double m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  // x is 2^(e-1) exactly when m == 0.5: the power strictly below it is 2^(e-2).
  const int k = m == 0.5 ? e - 2 : e - 1;
  return 1 << k;
}

int fit_auto_batch(const std::vector<int>& sizes, const std::vector<double>& gib, double target_gib, int fallback) {
  const size_t n = std::min(sizes.size(), gib.size());
  bool distinct = false;
  for (size_t i = 1; i < n; ++i) distinct = distinct || sizes[i] != sizes[0];
  if (n < 2 || !distinct) {
    log_warn(strfmt("AutoBatch: too few probe points — keeping batch=%d", fallback));
    return fallback;
  }
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) {
    mx += sizes[i];
    my += gib[i];
  }
  mx /= static_cast<double>(n);
  my /= static_cast<double>(n);
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) {
    const double dx = sizes[i] - mx;
    sxx += dx * dx;
    sxy += dx * (gib[i] - my);
  }
  const double slope = sxy / sxx;
  const double intercept = my - slope * mx;
  if (!(slope > 0.0)) {
    log_warn(strfmt("AutoBatch: non-positive slope — keeping batch=%d", fallback));
    return fallback;
  }
  const double raw = (target_gib - intercept) / slope;
  const int result = std::clamp(floor_pow2_strict(raw), 1, kMaxAutoBatch);
  log_info(strfmt("AutoBatch: estimated optimal global batch = %d  (raw=%.1f, target=%.1f GiB)", result, raw,
                  target_gib));
  return result;
}

int resolve_auto_batch(int per_gpu, int world_size, int nbs) {
  const int ws = std::max(1, world_size);
  int g = 0;
  if (nbs > 0) {
    g = std::min(per_gpu * ws, nbs);
    g = std::max(ws, (g / ws) * ws);
    if (g > nbs)
      log_warn(strfmt("AutoBatch: world_size=%d exceeds nbs=%d — global batch is %d. Gradient accumulation will not "
                      "reach the intended effective batch size.",
                      ws, nbs, g));
  } else {
    g = std::max(ws, per_gpu * ws);
  }
  log_info(strfmt("AutoBatch: per-GPU=%d  world_size=%d  global=%d", g / ws, ws, g));
  return g;
}

int probe_auto_batch(models::Detector& model, const torch::Device& device, const AutoBatchOptions& opt) {
  if (!device.is_cuda()) {
    log_info(strfmt("AutoBatch: non-CUDA device (%s) — keeping batch=%d", device.str().c_str(), opt.fallback));
    return opt.fallback;
  }
#ifndef LIBREYOLO_CUDA
  log_warn(strfmt("AutoBatch: this build has no CUDA support — keeping batch=%d", opt.fallback));
  return opt.fallback;
#else
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(index);
  const double total_gib = static_cast<double>(prop->totalGlobalMem) / kGiB;
  const double target_gib = total_gib * opt.fraction;
  log_info(strfmt("AutoBatch: %s  total=%.1f GiB  target=%.0f%%", prop->name, total_gib, opt.fraction * 100.0));

  std::vector<int> sizes;
  std::vector<double> used;
  ModelStateSnapshot snapshot(model);
  try {
    model.train();
    for (int64_t b64 = 1; b64 <= std::max(1, opt.max_probe); b64 *= 2) {
      const int b = static_cast<int>(b64);
      double gib = 0;
      try {
        gib = probe_once(model, device, index, b, opt);
      } catch (const c10::Error& e) {
        if (!is_out_of_memory(e)) throw;
        c10::cuda::CUDACachingAllocator::emptyCache();
        model.zero_grad(/*set_to_none=*/true);
        log_info(strfmt("AutoBatch: batch %d: out of memory, probing stops", b));
        break;
      }
      sizes.push_back(b);
      used.push_back(gib);
      log_info(strfmt("AutoBatch: batch %d: %.2f GiB", b, gib));
      if (gib > kStopFraction * total_gib) break;
    }
  } catch (...) {
    model.zero_grad(/*set_to_none=*/true);
    snapshot.restore();
    c10::cuda::CUDACachingAllocator::emptyCache();
    throw;
  }
  snapshot.restore();
  c10::cuda::CUDACachingAllocator::emptyCache();
  return fit_auto_batch(sizes, used, target_gib, opt.fallback);
#endif
}

int resolve_train_batch(const TrainConfig& cfg, models::Detector& model, const torch::Device& device,
                        const AmpPlan& amp, bool channels_last, int world_size) {
  if (cfg.batch != -1) return cfg.batch;
  AutoBatchOptions opt;
  opt.imgsz = cfg.imgsz;
  opt.amp = amp;
  opt.channels_last = channels_last;
  opt.max_probe = cfg.nbs > 0 ? cfg.nbs : 64;
  int per_gpu = opt.fallback;
  try {
    per_gpu = probe_auto_batch(model, device, opt);
  } catch (const c10::Error& e) {
    log_warn(strfmt("AutoBatch: probe failed (%s) — using default %d", e.what_without_backtrace(), opt.fallback));
  } catch (const std::exception& e) {
    log_warn(strfmt("AutoBatch: probe failed (%s) — using default %d", e.what(), opt.fallback));
  }
  const int global = resolve_auto_batch(per_gpu, world_size, cfg.nbs);
  log_info(strfmt("AutoBatch: resolved global batch size = %d", global));
  return global;
}

}  // namespace libreyolo::engine
