#include "ops/resample.hpp"

#include <ATen/Parallel.h>
#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/resample.hpp"
#endif

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

namespace libreyolo::ops {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// One axis: for each output position its first source index, tap count and fixed-point weights.
struct Taps {
  std::vector<int64_t> first, count;
  std::vector<int32_t> weights;  // `ksize` per output
  int64_t ksize = 0;
};

Taps taps(int64_t in_size, double in0, double in1, int64_t out_size) {
  const double scale = (in1 - in0) / static_cast<double>(out_size);
  const double filterscale = std::max(scale, 1.0);
  const double support = 2.0 * filterscale;
  Taps t;
  t.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.first.resize(static_cast<size_t>(out_size));
  t.count.resize(static_cast<size_t>(out_size));
  t.weights.assign(static_cast<size_t>(out_size * t.ksize), 0);
  std::vector<double> k(static_cast<size_t>(t.ksize));
  for (int64_t xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (static_cast<double>(xx) + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int64_t xmin = static_cast<int64_t>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int64_t xmax = static_cast<int64_t>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int64_t x = 0; x < xmax; ++x) {
      const double w = bicubic((static_cast<double>(x + xmin) - center + 0.5) * ss);
      k[static_cast<size_t>(x)] = w;
      ww += w;
    }
    for (int64_t x = 0; x < xmax; ++x) {
      const double w = ww != 0.0 ? k[static_cast<size_t>(x)] / ww : k[static_cast<size_t>(x)];
      t.weights[static_cast<size_t>(xx * t.ksize + x)] =
          static_cast<int32_t>(w * (1 << kPrecisionBits) + (w < 0 ? -0.5 : 0.5));
    }
    t.first[static_cast<size_t>(xx)] = xmin;
    t.count[static_cast<size_t>(xx)] = xmax;
  }
  return t;
}

inline uint8_t clip8(int64_t v) {
  v >>= kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

}  // namespace

namespace {

// The source rows [row0, row1) that output rows [top, top + win_h) read: their vertical taps' span,
// or those rows themselves without a vertical pass.
std::pair<int64_t, int64_t> source_rows(const Taps& ty, bool vertical, int64_t top, int64_t win_h) {
  if (!vertical) return {top, top + win_h};
  const int64_t row0 = ty.first[static_cast<size_t>(top)];
  int64_t row1 = row0;
  for (int64_t yy = top; yy < top + win_h; ++yy)
    row1 = std::max(row1, ty.first[static_cast<size_t>(yy)] + ty.count[static_cast<size_t>(yy)]);
  return {row0, row1};
}

// Rows [top, top + win_h) and columns [left, left + win_w) of the resampling of `src` by the taps
// tx, ty (each output pixel depends on its own taps only: a window is computed alone, the same
// bytes as in the whole output). `horizontal` / `vertical`: whether that pass resamples (else the
// source's columns / rows are taken as they are).
torch::Tensor resample(const torch::Tensor& src, const Taps& tx, const Taps& ty, bool horizontal, bool vertical,
                       int64_t top, int64_t left, int64_t win_h, int64_t win_w) {
  const int64_t w = src.size(1), c = src.size(2);
  const uint8_t* in = src.data_ptr<uint8_t>();
  // Rows in parallel (each output row is computed alone; the arithmetic is PIL's whatever the split).
  const auto rows = [](int64_t n, int64_t work_per_row, const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, work_per_row));
    at::parallel_for(0, n, grain, fn);
  };
  const auto [row0, row1] = source_rows(ty, vertical, top, win_h);
  // The horizontal pass (or the window's columns) of those rows: [row1 - row0, win_w, c].
  torch::Tensor mid;
  if (horizontal) {
    mid = torch::empty({row1 - row0, win_w, c}, torch::kUInt8);
    uint8_t* m = mid.data_ptr<uint8_t>();
    // Three channels (RGB) are summed together per tap.
    rows(row1 - row0, win_w * c * tx.ksize, [&](int64_t r0, int64_t r1) {
      for (int64_t y = row0 + r0; y < row0 + r1; ++y) {
        const uint8_t* line = in + y * w * c;
        uint8_t* dst = m + (y - row0) * win_w * c;
        for (int64_t ox = 0; ox < win_w; ++ox) {
          const int64_t xx = left + ox;
          const int64_t f = tx.first[static_cast<size_t>(xx)], n = tx.count[static_cast<size_t>(xx)];
          const int32_t* k = &tx.weights[static_cast<size_t>(xx * tx.ksize)];
          const uint8_t* p = line + f * c;
          if (c == 3) {
            int64_t s0 = int64_t{1} << (kPrecisionBits - 1), s1 = s0, s2 = s0;
            for (int64_t x = 0; x < n; ++x, p += 3) {
              s0 += static_cast<int64_t>(p[0]) * k[x];
              s1 += static_cast<int64_t>(p[1]) * k[x];
              s2 += static_cast<int64_t>(p[2]) * k[x];
            }
            dst[ox * 3] = clip8(s0);
            dst[ox * 3 + 1] = clip8(s1);
            dst[ox * 3 + 2] = clip8(s2);
            continue;
          }
          for (int64_t ch = 0; ch < c; ++ch) {
            int64_t ss = int64_t{1} << (kPrecisionBits - 1);
            for (int64_t x = 0; x < n; ++x) ss += static_cast<int64_t>(p[x * c + ch]) * k[x];
            dst[ox * c + ch] = clip8(ss);
          }
        }
      }
    });
  } else {
    mid = src.narrow(0, row0, row1 - row0).narrow(1, left, win_w).contiguous();
  }
  if (!vertical) return mid;
  const uint8_t* m = mid.data_ptr<uint8_t>();
  auto out = torch::empty({win_h, win_w, c}, torch::kUInt8);
  uint8_t* o = out.data_ptr<uint8_t>();
  const int64_t stride = win_w * c;
  rows(win_h, stride * ty.ksize, [&](int64_t r0, int64_t r1) {
    for (int64_t oy = r0; oy < r1; ++oy) {
      const int64_t yy = top + oy;
      const int64_t f = ty.first[static_cast<size_t>(yy)] - row0, n = ty.count[static_cast<size_t>(yy)];
      const int32_t* k = &ty.weights[static_cast<size_t>(yy * ty.ksize)];
      const uint8_t* base = m + f * stride;
      uint8_t* dst = o + oy * stride;
      // Every byte of the row (all channels alike): the taps run down the column.
      for (int64_t i = 0; i < stride; ++i) {
        int64_t ss = int64_t{1} << (kPrecisionBits - 1);
        for (int64_t y = 0; y < n; ++y) ss += static_cast<int64_t>(base[y * stride + i]) * k[y];
        dst[i] = clip8(ss);
      }
    }
  });
  return out;
}

// The same resampling of a uint8 [H, W, C] image on a CUDA device (kernels/resample.hpp: the same
// taps and integer arithmetic, so the same bytes), on the current stream.
torch::Tensor resample_device(const torch::Tensor& src, const Taps& tx, const Taps& ty, bool horizontal,
                              bool vertical, int64_t top, int64_t left, int64_t win_h, int64_t win_w) {
#ifdef LIBREYOLO_CUDA_KERNELS
  const int64_t w = src.size(1), c = src.size(2);
  const auto dev = src.device();
  const c10::cuda::CUDAGuard guard(dev);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dev.index()).stream();
  // One upload of an axis's taps (small: a few kB).
  const auto upload = [&](const Taps& t, torch::Tensor& first, torch::Tensor& count, torch::Tensor& weights) {
    const auto n = static_cast<int64_t>(t.first.size());
    first = torch::from_blob(const_cast<int64_t*>(t.first.data()), {n}, torch::kLong).to(dev);
    count = torch::from_blob(const_cast<int64_t*>(t.count.data()), {n}, torch::kLong).to(dev);
    weights = torch::from_blob(const_cast<int32_t*>(t.weights.data()), {static_cast<int64_t>(t.weights.size())},
                               torch::kInt)
                  .to(dev);
    kernels::ResampleTaps k;
    k.first = first.data_ptr<int64_t>();
    k.count = count.data_ptr<int64_t>();
    k.weights = weights.data_ptr<int32_t>();
    k.ksize = t.ksize;
    return k;
  };
  const auto [row0, row1] = source_rows(ty, vertical, top, win_h);
  torch::Tensor xf, xc, xw, yf, yc, yw;
  torch::Tensor mid;
  if (horizontal) {
    const auto k = upload(tx, xf, xc, xw);
    mid = torch::empty({row1 - row0, win_w, c}, src.options());
    kernels::resample_horizontal(src.data_ptr<uint8_t>(), w, c, row0, row1 - row0, k, left, win_w,
                                 mid.data_ptr<uint8_t>(), stream);
  } else {
    mid = src.narrow(0, row0, row1 - row0).narrow(1, left, win_w).contiguous();
  }
  if (!vertical) return mid;
  const auto k = upload(ty, yf, yc, yw);
  auto out = torch::empty({win_h, win_w, c}, src.options());
  kernels::resample_vertical(mid.data_ptr<uint8_t>(), win_w * c, row0, k, top, win_h, out.data_ptr<uint8_t>(), stream);
  return out;
#else
  (void)src, (void)tx, (void)ty, (void)horizontal, (void)vertical, (void)top, (void)left, (void)win_h, (void)win_w;
  throw std::invalid_argument("resize_bicubic_pil: this build has no CUDA kernels; resize on the CPU");
#endif
}

// resample() on the image's device.
torch::Tensor resample_on(const torch::Tensor& src, const Taps& tx, const Taps& ty, bool horizontal, bool vertical,
                          int64_t top, int64_t left, int64_t win_h, int64_t win_w) {
  return src.is_cuda() ? resample_device(src, tx, ty, horizontal, vertical, top, left, win_h, win_w)
                       : resample(src, tx, ty, horizontal, vertical, top, left, win_h, win_w);
}

torch::Tensor checked(const torch::Tensor& hwc, int64_t out_h, int64_t out_w) {
  if (hwc.dim() != 3 || hwc.scalar_type() != torch::kUInt8 || !(hwc.device().is_cpu() || hwc.device().is_cuda()))
    throw std::invalid_argument("resize_bicubic_pil: expected a uint8 [H, W, C] image on the CPU or a CUDA device");
  if (out_h < 1 || out_w < 1) throw std::invalid_argument("resize_bicubic_pil: output size must be positive");
  return hwc.contiguous();
}

}  // namespace

torch::Tensor resize_bicubic_pil(const torch::Tensor& hwc, int64_t out_h, int64_t out_w, double x0, double y0,
                                 double x1, double y1) {
  const auto src = checked(hwc, out_h, out_w);
  const int64_t h = src.size(0), w = src.size(1);
  const bool horizontal = out_w != w || x0 != 0.0 || x1 != static_cast<double>(w);
  const bool vertical = out_h != h || y0 != 0.0 || y1 != static_cast<double>(h);
  if (!horizontal && !vertical) return src.clone();
  return resample_on(src, taps(w, x0, x1, out_w), taps(h, y0, y1, out_h), horizontal, vertical, 0, 0, out_h, out_w);
}

torch::Tensor resize_bicubic_pil(const torch::Tensor& hwc, int64_t out_h, int64_t out_w) {
  return resize_bicubic_pil(hwc, out_h, out_w, 0.0, 0.0, static_cast<double>(hwc.size(1)),
                            static_cast<double>(hwc.size(0)));
}

torch::Tensor resize_bicubic_pil_window(const torch::Tensor& hwc, int64_t out_h, int64_t out_w, int64_t top,
                                        int64_t left, int64_t win_h, int64_t win_w) {
  const auto src = checked(hwc, out_h, out_w);
  if (top < 0 || left < 0 || win_h < 1 || win_w < 1 || top + win_h > out_h || left + win_w > out_w)
    throw std::invalid_argument("resize_bicubic_pil_window: the window must lie inside the output");
  const int64_t h = src.size(0), w = src.size(1);
  const bool horizontal = out_w != w, vertical = out_h != h;
  if (!horizontal && !vertical) return src.narrow(0, top, win_h).narrow(1, left, win_w).clone();
  return resample_on(src, taps(w, 0.0, static_cast<double>(w), out_w), taps(h, 0.0, static_cast<double>(h), out_h),
                     horizontal, vertical, top, left, win_h, win_w);
}

}  // namespace libreyolo::ops
