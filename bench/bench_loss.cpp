// YOLOv9 loss forward and forward+backward time on synthetic head outputs.
// Usage: bench_loss [--device cpu|cuda] [--batch 8,16] [--imgsz 640] [--nc 80] [--gt 8]
//                   [--iters 20] [--warmup 5] [--dtype float32|bfloat16]
// Prints one JSON object on stdout.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <libreyolo/errors.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "core/device.hpp"
#include "families/yolo9/loss.hpp"

#ifdef LIBREYOLO_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace {

struct Options {
  std::string device = "cpu";
  std::vector<int64_t> batches = {8, 16};
  int64_t imgsz = 640;
  int nc = 80;
  int64_t gt = 8;
  int iters = 20;
  int warmup = 5;
  std::string dtype = "float32";
};

int64_t parse_int(const std::string& key, const std::string& v) {
  try {
    size_t used = 0;
    const long long n = std::stoll(v, &used);
    if (used == v.size() && n > 0) return n;
  } catch (const std::exception&) {
  }
  throw libreyolo::UsageError("bench_loss: " + key + " needs a positive integer, got '" + v + "'");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (i + 1 >= argc) throw libreyolo::UsageError("bench_loss: " + key + " needs a value");
    const std::string v = argv[++i];
    if (key == "--device") {
      o.device = v;
    } else if (key == "--batch") {
      o.batches.clear();
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');)
        o.batches.push_back(parse_int(key, item));
    } else if (key == "--imgsz") {
      o.imgsz = parse_int(key, v);
    } else if (key == "--nc") {
      o.nc = static_cast<int>(parse_int(key, v));
    } else if (key == "--gt") {
      o.gt = parse_int(key, v);
    } else if (key == "--iters") {
      o.iters = static_cast<int>(parse_int(key, v));
    } else if (key == "--warmup") {
      o.warmup = static_cast<int>(parse_int(key, v));
    } else if (key == "--dtype") {
      o.dtype = v;
    } else {
      throw libreyolo::UsageError("bench_loss: unknown option " + key);
    }
  }
  if (o.device != "cpu" && o.device != "cuda")
    throw libreyolo::UsageError("bench_loss: --device must be cpu or cuda");
  if (o.device == "cuda" && !torch::cuda::is_available())
    throw libreyolo::UsageError("bench_loss: no CUDA device here");
  if (o.dtype != "float32" && o.dtype != "bfloat16")
    throw libreyolo::UsageError("bench_loss: --dtype must be float32 or bfloat16");
  if (o.imgsz % 32 != 0)
    throw libreyolo::UsageError("bench_loss: --imgsz must be a multiple of 32");
  if (o.gt > 100) throw libreyolo::UsageError("bench_loss: --gt must be at most 100");
  return o;
}


// Random boxes of 2-60% of the image side, padded to 100 rows.
torch::Tensor make_targets(int64_t B, int64_t gt, int nc) {
  auto t = torch::zeros({B, 100, 5});
  t.select(2, 0).fill_(-1);
  auto xy = torch::rand({B, gt, 2}) * 0.7;
  auto wh = torch::rand({B, gt, 2}) * 0.58 + 0.02;
  t.narrow(1, 0, gt).select(2, 0).copy_(torch::randint(nc, {B, gt}).to(torch::kFloat));
  t.narrow(1, 0, gt).narrow(2, 1, 2).copy_(xy);
  t.narrow(1, 0, gt).narrow(2, 3, 2).copy_((xy + wh).clamp_max(1.0));
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const torch::Device device(o.device == "cuda" ? torch::kCUDA : torch::kCPU);
    const auto dtype = o.dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat;
    torch::manual_seed(0);
    libreyolo::loss::Yolo9Loss loss(o.nc);
    const std::vector<int64_t> strides = {8, 16, 32};

    std::string rows;
    for (int64_t B : o.batches) {
      std::vector<torch::Tensor> raw;
      for (int64_t s : strides) {
        auto r = torch::randn({B, 64 + o.nc, o.imgsz / s, o.imgsz / s}) * 2;
        r.narrow(1, 64, o.nc).sub_(6);  // class logits of a trained head are mostly negative
        raw.push_back(r.to(device, dtype).requires_grad_(true));
      }
      const auto targets = make_targets(B, o.gt, o.nc).to(device);
      const auto step = [&](bool backward) {
        for (auto& r : raw) r.mutable_grad() = torch::Tensor();
        auto out = loss.compute(raw, targets, o.imgsz, o.imgsz);
        if (backward) out.total.backward();
        return out;
      };
      const auto time_ms = [&](bool backward) {
        for (int i = 0; i < o.warmup; ++i) step(backward);
        libreyolo::synchronize(device);
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < o.iters; ++i) step(backward);
        libreyolo::synchronize(device);
        const std::chrono::duration<double, std::milli> dt = std::chrono::steady_clock::now() - t0;
        return dt.count() / o.iters;
      };
      double peak_mb = 0;
#ifdef LIBREYOLO_CUDA
      if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(0);
#endif
      const double fwd = time_ms(false);
      const double fwd_bwd = time_ms(true);
#ifdef LIBREYOLO_CUDA
      if (device.is_cuda())
        peak_mb =
            c10::cuda::CUDACachingAllocator::getDeviceStats(0)
                .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
                .peak /
            1048576.0;
#endif
      const auto out = step(false);
      rows += libreyolo::strfmt(
          "%s{\"batch\": %lld, \"anchors\": %lld, \"forward_ms\": %.3f, \"forward_backward_ms\": "
          "%.3f, "
          "\"peak_allocated_mb\": %.1f, \"loss\": %.6f, \"num_fg\": %.3f}",
          rows.empty() ? "" : ", ", static_cast<long long>(B),
          static_cast<long long>(raw[0].size(2) * raw[0].size(3) + raw[1].size(2) * raw[1].size(3) +
                                 raw[2].size(2) * raw[2].size(3)),
          fwd, fwd_bwd, peak_mb, out.total.item<double>(), out.num_fg.item<double>());
    }
    std::printf(
        "{\"bench\": \"yolo9_loss\", \"device\": \"%s\", \"dtype\": \"%s\", \"imgsz\": %lld, "
        "\"nc\": %d, "
        "\"gt_per_image\": %lld, \"iters\": %d, \"threads\": %d, \"results\": [%s]}\n",
        o.device.c_str(), o.dtype.c_str(), static_cast<long long>(o.imgsz), o.nc,
        static_cast<long long>(o.gt), o.iters, torch::get_num_threads(), rows.c_str());
    return 0;
  } catch (const libreyolo::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
