#include "ops/image_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <libreyolo/errors.hpp>

#include "core/log.hpp"

namespace libreyolo::ops {
namespace {

// Interpolation weights in fixed point: 11 bits each way keeps the two-pass product
// (255 * 2^11 * 2^11 plus rounding) inside int32 and the error well under half a level.
constexpr int kBits = 11;
constexpr int32_t kOne = 1 << kBits;

// Source taps for one axis: output i reads src[i0] * (kOne - w1) + src[i1] * w1.
struct Taps {
  std::vector<int32_t> i0, i1, w1;
};

// OpenCV INTER_LINEAR geometry: half-pixel centres, src = (dst + 0.5) * scale - 0.5 + shift
// (a plain resize: scale = in / out, shift = 0), positions outside [0, in - 1] clamp to the
// border pixel.
Taps make_taps(int64_t in, int64_t out, int64_t unit, double scale, double shift) {
  Taps t;
  t.i0.resize(out);
  t.i1.resize(out);
  t.w1.resize(out);
  for (int64_t d = 0; d < out; ++d) {
    const BilinearTap b = bilinear_tap(in, scale, shift, d);
    t.i0[d] = static_cast<int32_t>(b.i0 * unit);
    t.i1[d] = static_cast<int32_t>(b.i1 * unit);
    t.w1[d] = b.w1;
  }
  return t;
}

// Every output value is one exact integer sum rounded once,
//   (wy0 (wx0 p00 + wx1 p01) + wy1 (wx0 p10 + wx1 p11) + 2^21) >> 22,
// so the two passes can run in either order with bit-identical results. Horizontal first
// interpolates each needed source row once (cheap when upscaling: output rows share source
// rows); vertical first blends two whole source rows with contiguous, vectorisable arithmetic
// and leaves only out_w gathers per output row (cheap when downscaling).

// out[i] = a[i] * w0 + b[i] * w1 over a whole row.
__attribute__((target_clones("avx2", "default"))) void blend_rows(const uint8_t* __restrict a,
                                                                   const uint8_t* __restrict b, int32_t w0,
                                                                   int32_t w1, int32_t* __restrict out,
                                                                   int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * w0 + b[i] * w1;
}

// out[i] = (v[i0[i]] (2^11 - w1[i]) + v[i1[i]] w1[i] + 2^21) >> 22 for i < 3 n.
__attribute__((target_clones("avx2", "default"))) void gather_rgb(const int32_t* __restrict v,
                                                                  const int32_t* __restrict i0,
                                                                  const int32_t* __restrict i1,
                                                                  const int32_t* __restrict w1,
                                                                  uint8_t* __restrict out, int64_t n) {
  constexpr int32_t kRound = 1 << (2 * kBits - 1);
  for (int64_t i = 0; i < 3 * n; ++i)
    out[i] = static_cast<uint8_t>((v[i0[i]] * (kOne - w1[i]) + v[i1[i]] * w1[i] + kRound) >> (2 * kBits));
}

// kC > 0 fixes the channel count at compile time (the common 1 and 3); 0 reads `channels`.
// Per-axis geometry of a resampling: scale and shift of make_taps.
struct AxisMap {
  double scale = 1.0, shift = 0.0;
};

template <int kC>
void resize_rows(const uint8_t* src, int64_t in_h, int64_t in_w, uint8_t* dst, int64_t out_h,
                 int64_t out_w, int64_t dst_row_stride, int channels, AxisMap my, AxisMap mx) {
  const int C = kC > 0 ? kC : channels;
  const Taps xs = make_taps(in_w, out_w, C, mx.scale, mx.shift);
  const Taps ys = make_taps(in_h, out_h, 1, my.scale, my.shift);
  const int64_t src_row_stride = in_w * C;
  const int64_t row_len = out_w * C;
  constexpr int32_t kRound = 1 << (2 * kBits - 1);

  // Rough costs in element operations: a gather costs about four contiguous ones.
  int64_t source_rows = 0;
  for (int64_t y = 0, last = -1; y < out_h; ++y)
    for (const int64_t r : {int64_t(ys.i0[y]), int64_t(ys.i1[y])})
      if (r != last) ++source_rows, last = r;
  const int64_t cost_vertical_first = out_h * (src_row_stride + 4 * row_len);
  const int64_t cost_horizontal_first = source_rows * 4 * row_len + out_h * row_len;

  if (cost_vertical_first < cost_horizontal_first) {
    // Per output value (not per pixel) taps, so that the gather loop is one flat loop.
    std::vector<int32_t> ix0, ix1, wx;
    if (C == 3) {
      ix0.resize(static_cast<size_t>(row_len)), ix1.resize(static_cast<size_t>(row_len)), wx.resize(static_cast<size_t>(row_len));
      for (int64_t i = 0; i < row_len; ++i) {
        ix0[i] = xs.i0[i / 3] + static_cast<int32_t>(i % 3);
        ix1[i] = xs.i1[i / 3] + static_cast<int32_t>(i % 3);
        wx[i] = xs.w1[i / 3];
      }
    }
    std::vector<int32_t> blended(static_cast<size_t>(src_row_stride));
    int32_t* v = blended.data();
    for (int64_t y = 0; y < out_h; ++y) {
      const int32_t w1 = ys.w1[y], w0 = kOne - w1;
      blend_rows(src + ys.i0[y] * src_row_stride, src + ys.i1[y] * src_row_stride, w0, w1, v,
                 src_row_stride);
      uint8_t* o = dst + y * dst_row_stride;
      if (C == 3) {
        gather_rgb(v, ix0.data(), ix1.data(), wx.data(), o, out_w);
        continue;
      }
      for (int64_t x = 0; x < out_w; ++x) {
        const int32_t* p0 = v + xs.i0[x];
        const int32_t* p1 = v + xs.i1[x];
        const int32_t wx1 = xs.w1[x], wx0 = kOne - wx1;
        uint8_t* q = o + x * C;
        for (int c = 0; c < C; ++c) q[c] = static_cast<uint8_t>((p0[c] * wx0 + p1[c] * wx1 + kRound) >> (2 * kBits));
      }
    }
    return;
  }

  // Horizontally interpolated source rows, cached so that each source row is processed once
  // even when consecutive output rows share it (upscaling).
  std::vector<int32_t> storage(2 * row_len);
  int32_t* bufs[2] = {storage.data(), storage.data() + row_len};
  int64_t cached[2] = {-1, -1};
  auto horizontal = [&](int64_t sy, int32_t* out) {
    const uint8_t* row = src + sy * src_row_stride;
    for (int64_t x = 0; x < out_w; ++x) {
      const uint8_t* p0 = row + xs.i0[x];
      const uint8_t* p1 = row + xs.i1[x];
      const int32_t w1 = xs.w1[x], w0 = kOne - w1;
      int32_t* o = out + x * C;
      for (int c = 0; c < C; ++c) o[c] = p0[c] * w0 + p1[c] * w1;
    }
  };
  auto row_for = [&](int64_t sy, int64_t keep) -> const int32_t* {
    for (int s = 0; s < 2; ++s)
      if (cached[s] == sy) return bufs[s];
    const int s = cached[0] == keep ? 1 : 0;
    horizontal(sy, bufs[s]);
    cached[s] = sy;
    return bufs[s];
  };

  for (int64_t y = 0; y < out_h; ++y) {
    const int64_t a = ys.i0[y], b = ys.i1[y];
    const int32_t* r0 = row_for(a, b);
    const int32_t* r1 = row_for(b, a);
    const int32_t w1 = ys.w1[y], w0 = kOne - w1;
    uint8_t* o = dst + y * dst_row_stride;
    for (int64_t i = 0; i < row_len; ++i)
      o[i] = static_cast<uint8_t>((r0[i] * w0 + r1[i] * w1 + kRound) >> (2 * kBits));
  }
}

void check_hwc_u8(const torch::Tensor& t, const char* what) {
  if (!t.defined() || t.dim() != 3 || t.scalar_type() != torch::kUInt8 || !t.device().is_cpu() ||
      t.size(2) < 1)
    throw UsageError(strfmt("%s: expected a CPU uint8 tensor [H, W, C]", what));
  if (t.size(0) < 1 || t.size(1) < 1)
    throw UsageError(strfmt("%s: empty image (%lldx%lld)", what, (long long)t.size(1),
                            (long long)t.size(0)));
}

void resample_rows(const uint8_t* s, int64_t in_h, int64_t in_w, int C, uint8_t* dst, int64_t out_h,
                   int64_t out_w, int64_t dst_row_stride, AxisMap my, AxisMap mx) {
  switch (C) {
    case 1:
      resize_rows<1>(s, in_h, in_w, dst, out_h, out_w, dst_row_stride, C, my, mx);
      break;
    case 3:
      resize_rows<3>(s, in_h, in_w, dst, out_h, out_w, dst_row_stride, C, my, mx);
      break;
    default:
      resize_rows<0>(s, in_h, in_w, dst, out_h, out_w, dst_row_stride, C, my, mx);
  }
}

// Resizes `src` (contiguous) into dst rows of `dst_row_stride` bytes; equal sizes copy.
void resize_into(const torch::Tensor& src, uint8_t* dst, int64_t out_h, int64_t out_w,
                 int64_t dst_row_stride) {
  const int64_t in_h = src.size(0), in_w = src.size(1);
  const int C = static_cast<int>(src.size(2));
  const uint8_t* s = src.data_ptr<uint8_t>();
  if (in_h == out_h && in_w == out_w) {
    for (int64_t y = 0; y < out_h; ++y)
      std::memcpy(dst + y * dst_row_stride, s + y * in_w * C, size_t(in_w) * C);
    return;
  }
  const AxisMap my{static_cast<double>(in_h) / static_cast<double>(out_h), 0.0};
  const AxisMap mx{static_cast<double>(in_w) / static_cast<double>(out_w), 0.0};
  resample_rows(s, in_h, in_w, C, dst, out_h, out_w, dst_row_stride, my, mx);
}

}  // namespace

BilinearTap bilinear_tap(int64_t in, double scale, double shift, int64_t d) {
  const double f = (static_cast<double>(d) + 0.5) * scale - 0.5 + shift;
  int64_t s = static_cast<int64_t>(std::floor(f));
  double frac = f - static_cast<double>(s);
  if (s < 0) {
    s = 0;
    frac = 0.0;
  }
  if (s >= in - 1) {
    s = in - 1;
    frac = 0.0;
  }
  return {s, std::min(s + 1, in - 1), static_cast<int32_t>(std::lround(frac * kOne))};
}

// LibreYOLO's sizes: r = min(S/h, S/w), new side = max(int(side * r), 1) (Python float
// arithmetic, which is IEEE double here too).
FittedSize fitted_size(int64_t h, int64_t w, int target) {
  FittedSize f;
  f.ratio = std::min(static_cast<double>(target) / static_cast<double>(h),
                     static_cast<double>(target) / static_cast<double>(w));
  f.height = std::max<int64_t>(static_cast<int64_t>(static_cast<double>(h) * f.ratio), 1);
  f.width = std::max<int64_t>(static_cast<int64_t>(static_cast<double>(w) * f.ratio), 1);
  return f;
}

void resample_bilinear_into(const torch::Tensor& src, uint8_t* dst, int64_t out_h, int64_t out_w,
                            int64_t dst_row_stride, double scale_y, double shift_y, double scale_x,
                            double shift_x) {
  check_hwc_u8(src, "resample_bilinear_into");
  if (!src.is_contiguous()) throw UsageError("resample_bilinear_into: the source must be contiguous");
  if (out_h < 1 || out_w < 1) return;
  if (!(scale_y > 0 && scale_x > 0) || !std::isfinite(shift_y) || !std::isfinite(shift_x))
    throw UsageError("resample_bilinear_into: scales must be positive and shifts finite");
  resample_rows(src.data_ptr<uint8_t>(), src.size(0), src.size(1), static_cast<int>(src.size(2)), dst,
                out_h, out_w, dst_row_stride, AxisMap{scale_y, shift_y}, AxisMap{scale_x, shift_x});
}

torch::Tensor resize_bilinear(const torch::Tensor& hwc, int out_h, int out_w) {
  check_hwc_u8(hwc, "resize_bilinear");
  if (out_h < 1 || out_w < 1)
    throw UsageError(strfmt("resize_bilinear: output size must be positive, got %dx%d", out_w,
                            out_h));
  const torch::Tensor src = hwc.contiguous();
  const int64_t C = src.size(2);
  torch::Tensor out = torch::empty({out_h, out_w, C}, src.options());
  resize_into(src, out.data_ptr<uint8_t>(), out_h, out_w, int64_t(out_w) * C);
  return out;
}

torch::Tensor resize_longest(const torch::Tensor& hwc, int target, double* ratio) {
  check_hwc_u8(hwc, "resize_longest");
  if (target < 1) throw UsageError(strfmt("resize_longest: target must be positive, got %d", target));
  const FittedSize f = fitted_size(hwc.size(0), hwc.size(1), target);
  const int64_t nh = f.height, nw = f.width;
  if (ratio) *ratio = f.ratio;
  if (nh == hwc.size(0) && nw == hwc.size(1)) return hwc;
  return resize_bilinear(hwc, static_cast<int>(nh), static_cast<int>(nw));
}

const char* fit_name(Fit fit) { return fit == Fit::Stretch ? "stretch" : "letterbox"; }

FitBox fit_box(int64_t h, int64_t w, int size, Fit fit) {
  if (size < 1) throw UsageError(strfmt("fit_box: size must be positive, got %d", size));
  if (h < 1 || w < 1) throw UsageError(strfmt("fit_box: image size must be positive, got %lldx%lld",
                                              static_cast<long long>(w), static_cast<long long>(h)));
  FitBox b;
  if (fit == Fit::Stretch) {
    b.width = b.height = size;
    b.sx = static_cast<double>(size) / static_cast<double>(w);
    b.sy = static_cast<double>(size) / static_cast<double>(h);
    return b;
  }
  const FittedSize f = fitted_size(h, w, size);
  b.width = std::min<int64_t>(f.width, size);
  b.height = std::min<int64_t>(f.height, size);
  b.sx = b.sy = f.ratio;
  return b;
}

void fit_into(const torch::Tensor& hwc, int size, Fit fit, uint8_t* base, FitBox* box, uint8_t pad) {
  check_hwc_u8(hwc, "fit_into");
  const FitBox b = fit_box(hwc.size(0), hwc.size(1), size, fit);
  if (box) *box = b;
  const torch::Tensor src = hwc.contiguous();
  const int64_t C = src.size(2);
  const int64_t stride = int64_t(size) * C;
  // Pad only what the image does not cover, then resize straight into the canvas.
  for (int64_t y = 0; y < b.height; ++y)
    std::memset(base + y * stride + b.width * C, pad, size_t(stride - b.width * C));
  std::memset(base + b.height * stride, pad, size_t((size - b.height) * stride));
  resize_into(src, base, b.height, b.width, stride);
}

torch::Tensor fit_image(const torch::Tensor& hwc, int size, Fit fit, FitBox* box, uint8_t pad) {
  check_hwc_u8(hwc, "fit_image");
  if (size < 1) throw UsageError(strfmt("fit_image: size must be positive, got %d", size));
  torch::Tensor canvas = torch::empty({size, size, hwc.size(2)}, hwc.options());
  fit_into(hwc, size, fit, canvas.data_ptr<uint8_t>(), box, pad);
  return canvas;
}

void letterbox_topleft_into(const torch::Tensor& hwc, int size, uint8_t* base, double* ratio, uint8_t pad) {
  check_hwc_u8(hwc, "letterbox_topleft");
  if (size < 1) throw UsageError(strfmt("letterbox_topleft: size must be positive, got %d", size));
  FitBox b;
  fit_into(hwc, size, Fit::Letterbox, base, &b, pad);
  if (ratio) *ratio = b.sx;
}

torch::Tensor letterbox_topleft(const torch::Tensor& hwc, int size, double* ratio, uint8_t pad) {
  check_hwc_u8(hwc, "letterbox_topleft");
  if (size < 1) throw UsageError(strfmt("letterbox_topleft: size must be positive, got %d", size));
  FitBox b;
  torch::Tensor canvas = fit_image(hwc, size, Fit::Letterbox, &b, pad);
  if (ratio) *ratio = b.sx;
  return canvas;
}

}  // namespace libreyolo::ops
