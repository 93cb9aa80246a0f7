#include "kernels/render.hpp"

#include <stdexcept>
#include <string>

namespace libreyolo::kernels {
namespace {

constexpr int kPad = 114;
constexpr int kHsvShift = 12;

struct Tap {
  int i0, i1, w1;
};

// ops/image_ops.cpp make_taps for one output position: double precision, half-pixel centres,
// clamped to the border, 11-bit weight rounded half away from zero (std::lround).
__device__ __forceinline__ Tap axis_tap(int in, int out, int d) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double f = __dadd_rn(__dmul_rn(static_cast<double>(d) + 0.5, scale), -0.5);
  long long s = static_cast<long long>(floor(f));
  double frac = f - static_cast<double>(s);
  if (s < 0) s = 0, frac = 0.0;
  if (s >= in - 1) s = in - 1, frac = 0.0;
  Tap t;
  t.i0 = static_cast<int>(s);
  t.i1 = static_cast<int>(s + 1 < in - 1 ? s + 1 : in - 1);
  t.w1 = static_cast<int>(llround(__dmul_rn(frac, 2048.0)));
  return t;
}

// data/hsv.cpp shift_hsv_block for one pixel; no contraction into fused multiply-adds.
__device__ __forceinline__ void shift_hsv(int& R, int& G, int& B, const int* sdiv, const int* hdiv, int gh,
                                          int gs, int gv) {
  const int gb_max = G > B ? G : B, gb_min = G < B ? G : B;
  const int v = R > gb_max ? R : gb_max;
  const int diff = v - (R < gb_min ? R : gb_min);
  const int s = (diff * sdiv[v] + (1 << (kHsvShift - 1))) >> kHsvShift;
  int h = R - G + 4 * diff;
  h = v == G ? B - R + 2 * diff : h;
  h = v == R ? G - B : h;
  h = (h * hdiv[diff] + (1 << (kHsvShift - 1))) >> kHsvShift;
  h += h < 0 ? 180 : 0;
  int H = h + gh;
  H -= H >= 180 ? 180 : 0;
  int S = s + gs, V = v + gv;
  S = S < 0 ? 0 : (S > 255 ? 255 : S);
  V = V < 0 ? 0 : (V > 255 ? 255 : V);
  const float sf = __fmul_rn(static_cast<float>(S), 1.0f / 255.0f);
  const float vf = __fmul_rn(static_cast<float>(V), 1.0f / 255.0f);
  const float hf = __fmul_rn(static_cast<float>(H), 6.0f / 180.0f);
  const int sec = static_cast<int>(hf);
  const float f = __fsub_rn(hf, static_cast<float>(sec));
  const float p = __fmul_rn(vf, __fsub_rn(1.0f, sf));
  const float q = __fmul_rn(vf, __fsub_rn(1.0f, __fmul_rn(sf, f)));
  const float t = __fmul_rn(vf, __fsub_rn(1.0f, __fmul_rn(sf, __fsub_rn(1.0f, f))));
  float r, g, b;
  switch (sec) {
    case 0: r = vf, g = t, b = p; break;
    case 1: r = q, g = vf, b = p; break;
    case 2: r = p, g = vf, b = t; break;
    case 3: r = p, g = q, b = vf; break;
    case 4: r = t, g = p, b = vf; break;
    default: r = vf, g = p, b = q; break;
  }
  auto level = [](float x) {
    float y = rintf(__fmul_rn(x, 255.0f));  // round half to even, as the CPU's magic-number trick
    y = y < 0.0f ? 0.0f : (y > 255.0f ? 255.0f : y);
    return static_cast<int>(y);
  };
  R = level(r), G = level(g), B = level(b);
}

// Canvas pixel (cx, cy): the first tile covering it, resized at this point; else 114.
__device__ __forceinline__ void canvas_pixel(const RenderSample& d, int cx, int cy, int* v) {
  v[0] = v[1] = v[2] = kPad;
  if (cx < 0 || cy < 0 || cx >= d.canvas_w || cy >= d.canvas_h) return;
  for (int k = 0; k < d.num_tiles; ++k) {
    const RenderTile& t = d.tiles[k];
    if (cx < t.x1 || cx >= t.x2 || cy < t.y1 || cy >= t.y2) continue;
    const Tap tx = axis_tap(t.src_w, t.tile_w, cx - t.offset_x);
    const Tap ty = axis_tap(t.src_h, t.tile_h, cy - t.offset_y);
    const uint8_t* r0 = t.src + static_cast<int64_t>(ty.i0) * t.src_w * 3;
    const uint8_t* r1 = t.src + static_cast<int64_t>(ty.i1) * t.src_w * 3;
    for (int c = 0; c < 3; ++c) {
      const int top = r0[3 * tx.i0 + c] * (2048 - tx.w1) + r0[3 * tx.i1 + c] * tx.w1;
      const int bottom = r1[3 * tx.i0 + c] * (2048 - tx.w1) + r1[3 * tx.i1 + c] * tx.w1;
      v[c] = (top * (2048 - ty.w1) + bottom * ty.w1 + (1 << 21)) >> 22;
    }
    return;
  }
}

// data/render.cpp warped_pixel: the canvas through the map, bilinear in single precision.
__device__ __forceinline__ void warped_pixel(const RenderSample& d, int x, int y, int* v) {
  const double dx = __dadd_rn(static_cast<double>(x), -d.tx), dy = __dadd_rn(static_cast<double>(y), -d.ty);
  const double sx = __dadd_rn(__dmul_rn(d.r00, dx), __dmul_rn(d.r01, dy));
  const double sy = __dadd_rn(__dmul_rn(d.r10, dx), __dmul_rn(d.r11, dy));
  if (!(sx > -1 && sy > -1 && sx < d.canvas_w && sy < d.canvas_h)) {
    v[0] = v[1] = v[2] = kPad;
    return;
  }
  const int x0 = static_cast<int>(floor(sx)), y0 = static_cast<int>(floor(sy));
  const float fx = static_cast<float>(__dadd_rn(sx, -static_cast<double>(x0)));
  const float fy = static_cast<float>(__dadd_rn(sy, -static_cast<double>(y0)));
  int p00[3], p10[3], p01[3], p11[3];
  canvas_pixel(d, x0, y0, p00);
  canvas_pixel(d, x0 + 1, y0, p10);
  canvas_pixel(d, x0, y0 + 1, p01);
  canvas_pixel(d, x0 + 1, y0 + 1, p11);
  const float gx = __fsub_rn(1.0f, fx), gy = __fsub_rn(1.0f, fy);
  for (int c = 0; c < 3; ++c) {
    const float top = __fadd_rn(__fmul_rn(static_cast<float>(p00[c]), gx), __fmul_rn(static_cast<float>(p10[c]), fx));
    const float bottom = __fadd_rn(__fmul_rn(static_cast<float>(p01[c]), gx), __fmul_rn(static_cast<float>(p11[c]), fx));
    float r = rintf(__fadd_rn(__fmul_rn(top, gy), __fmul_rn(bottom, fy)));
    r = r < 0.0f ? 0.0f : (r > 255.0f ? 255.0f : r);
    v[c] = static_cast<int>(r);
  }
}

__global__ void render_kernel(const RenderSample* __restrict__ samples, int S, uint8_t* __restrict__ out) {
  __shared__ int sdiv[256], hdiv[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    // data/hsv.cpp hsv_tables: round(255 * 2^12 / i) and round(180 * 2^12 / (6 i)).
    sdiv[i] = i == 0 ? 0 : static_cast<int>(llround((255 << kHsvShift) / static_cast<double>(i)));
    hdiv[i] = i == 0 ? 0 : static_cast<int>(llround((180 << kHsvShift) / (6.0 * i)));
  }
  __syncthreads();
  const int n = blockIdx.y;
  const int pix = blockIdx.x * blockDim.x + threadIdx.x;
  if (pix >= S * S) return;
  const int X = pix % S, Y = pix / S;
  const RenderSample& d = samples[n];
  uint8_t* o = out + (static_cast<int64_t>(n) * S * S + pix) * 3;
  if (X >= d.content_w || Y >= d.content_h) {
    o[0] = o[1] = o[2] = kPad;
    return;
  }
  const int Xs = d.flip ? d.content_w - 1 - X : X;
  int v[3];
  if (d.warp)
    warped_pixel(d, Xs, Y, v);
  else
    canvas_pixel(d, Xs, Y, v);
  int R = v[0], G = v[1], B = v[2];
  if (d.hsv) shift_hsv(R, G, B, sdiv, hdiv, d.gain_h, d.gain_s, d.gain_v);
  o[0] = static_cast<uint8_t>(R);
  o[1] = static_cast<uint8_t>(G);
  o[2] = static_cast<uint8_t>(B);
}

}  // namespace

void render_samples(const RenderSample* samples, int count, int S, uint8_t* out, cudaStream_t stream) {
  if (count <= 0) return;
  constexpr int kThreads = 256;
  const dim3 grid((S * S + kThreads - 1) / kThreads, count);
  render_kernel<<<grid, kThreads, 0, stream>>>(samples, S, out);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("render_samples: ") + cudaGetErrorString(e));
}

}  // namespace libreyolo::kernels
