#include "ops/resample.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdint>
#include <stdexcept>
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

torch::Tensor resize_bicubic_pil(const torch::Tensor& hwc, int64_t out_h, int64_t out_w, double x0, double y0,
                                 double x1, double y1) {
  if (hwc.dim() != 3 || hwc.scalar_type() != torch::kUInt8 || !hwc.device().is_cpu())
    throw std::invalid_argument("resize_bicubic_pil: expected a CPU uint8 [H, W, C] image");
  if (out_h < 1 || out_w < 1) throw std::invalid_argument("resize_bicubic_pil: output size must be positive");
  const auto src = hwc.contiguous();
  const int64_t h = src.size(0), w = src.size(1), c = src.size(2);
  const Taps tx = taps(w, x0, x1, out_w), ty = taps(h, y0, y1, out_h);
  // The rows the vertical pass reads; the horizontal pass computes only those.
  const int64_t row0 = ty.first.front();
  const int64_t row1 = ty.first.back() + ty.count.back();
  const bool horizontal = out_w != w || x0 != 0.0 || x1 != static_cast<double>(w);
  const bool vertical = out_h != h || y0 != 0.0 || y1 != static_cast<double>(h);
  const uint8_t* in = src.data_ptr<uint8_t>();
  // Rows in parallel (each output row is computed alone; the arithmetic is PIL's whatever the split).
  // Three channels (RGB) are summed together per tap.
  const auto rows = [](int64_t n, int64_t work_per_row, const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, work_per_row));
    at::parallel_for(0, n, grain, fn);
  };
  torch::Tensor mid;
  int64_t mid_row0 = 0;
  if (horizontal) {
    mid = torch::empty({row1 - row0, out_w, c}, torch::kUInt8);
    uint8_t* m = mid.data_ptr<uint8_t>();
    rows(row1 - row0, out_w * c * tx.ksize, [&](int64_t r0, int64_t r1) {
      for (int64_t y = row0 + r0; y < row0 + r1; ++y) {
        const uint8_t* line = in + y * w * c;
        uint8_t* dst = m + (y - row0) * out_w * c;
        for (int64_t xx = 0; xx < out_w; ++xx) {
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
            dst[xx * 3] = clip8(s0);
            dst[xx * 3 + 1] = clip8(s1);
            dst[xx * 3 + 2] = clip8(s2);
            continue;
          }
          for (int64_t ch = 0; ch < c; ++ch) {
            int64_t ss = int64_t{1} << (kPrecisionBits - 1);
            for (int64_t x = 0; x < n; ++x) ss += static_cast<int64_t>(p[x * c + ch]) * k[x];
            dst[xx * c + ch] = clip8(ss);
          }
        }
      }
    });
    mid_row0 = row0;
  } else {
    mid = src;
  }
  if (!vertical) return horizontal ? mid : src.clone();
  const int64_t mw = mid.size(1);
  const uint8_t* m = mid.data_ptr<uint8_t>();
  auto out = torch::empty({out_h, mw, c}, torch::kUInt8);
  uint8_t* o = out.data_ptr<uint8_t>();
  const int64_t stride = mw * c;
  rows(out_h, stride * ty.ksize, [&](int64_t r0, int64_t r1) {
    for (int64_t yy = r0; yy < r1; ++yy) {
      const int64_t f = ty.first[static_cast<size_t>(yy)] - mid_row0, n = ty.count[static_cast<size_t>(yy)];
      const int32_t* k = &ty.weights[static_cast<size_t>(yy * ty.ksize)];
      const uint8_t* base = m + f * stride;
      uint8_t* dst = o + yy * stride;
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

torch::Tensor resize_bicubic_pil(const torch::Tensor& hwc, int64_t out_h, int64_t out_w) {
  return resize_bicubic_pil(hwc, out_h, out_w, 0.0, 0.0, static_cast<double>(hwc.size(1)),
                            static_cast<double>(hwc.size(0)));
}

}  // namespace libreyolo::ops
