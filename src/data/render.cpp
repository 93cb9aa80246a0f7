// Drawing sample plans into pixels on the CPU (data/augment.hpp SampleDraw). The GPU kernel
// (kernels/render.cu) repeats this arithmetic operation for operation; the GPU loader's tests
// compare the two bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <libreyolo/errors.hpp>
#include <vector>

#include "data/augment.hpp"
#include "data/stage_timer.hpp"
#include "ops/image_ops.hpp"

namespace libreyolo::data {
namespace {

constexpr int kPad = 114;

// One tile's source and, per canvas column and row of its rectangle, the resize taps.
struct TileTaps {
  const TileDraw* tile = nullptr;
  const uint8_t* src = nullptr;
  int64_t src_w = 0;
  std::vector<ops::BilinearTap> x, y;
};

class Canvas {
 public:
  Canvas(const SampleDraw& d, const std::array<const torch::Tensor*, 4>& sources) : w_(d.canvas_w), h_(d.canvas_h) {
    if (d.num_tiles < 0 || d.num_tiles > 4 || w_ < 1 || h_ < 1) throw UsageError("render_sample: bad plan");
    for (int k = 0; k < d.num_tiles; ++k) {
      const torch::Tensor* s = sources[static_cast<size_t>(k)];
      if (!s) throw UsageError("render_sample: a tile has no source image");
      if (s->dim() != 3 || s->size(2) != 3 || s->scalar_type() != torch::kUInt8 || !s->is_contiguous())
        throw UsageError("render_sample: a source must be a contiguous [H, W, 3] uint8 image");
      const TileDraw& t = d.tiles[static_cast<size_t>(k)];
      if (t.tile_w < 1 || t.tile_h < 1 || t.x1 < 0 || t.y1 < 0 || t.x2 > w_ || t.y2 > h_)
        throw UsageError("render_sample: a tile outside its canvas");
      TileTaps tt;
      tt.tile = &t;
      tt.src = s->data_ptr<uint8_t>();
      tt.src_w = s->size(1);
      const int64_t sh = s->size(0);
      for (int cx = t.x1; cx < t.x2; ++cx)
        tt.x.push_back(ops::bilinear_tap(tt.src_w, static_cast<double>(tt.src_w) / t.tile_w, 0.0, cx - t.offset_x));
      for (int cy = t.y1; cy < t.y2; ++cy)
        tt.y.push_back(ops::bilinear_tap(sh, static_cast<double>(sh) / t.tile_h, 0.0, cy - t.offset_y));
      tiles_.push_back(std::move(tt));
    }
  }

  // Canvas pixel (cx, cy): the first tile covering it, resized at this point; else 114.
  void pixel(int cx, int cy, int v[3]) const {
    v[0] = v[1] = v[2] = kPad;
    if (cx < 0 || cy < 0 || cx >= w_ || cy >= h_) return;
    for (const TileTaps& tt : tiles_) {
      const TileDraw& t = *tt.tile;
      if (cx < t.x1 || cx >= t.x2 || cy < t.y1 || cy >= t.y2) continue;
      const ops::BilinearTap& tx = tt.x[static_cast<size_t>(cx - t.x1)];
      const ops::BilinearTap& ty = tt.y[static_cast<size_t>(cy - t.y1)];
      const uint8_t* r0 = tt.src + ty.i0 * tt.src_w * 3;
      const uint8_t* r1 = tt.src + ty.i1 * tt.src_w * 3;
      for (int c = 0; c < 3; ++c) {
        const int top = r0[3 * tx.i0 + c] * (2048 - tx.w1) + r0[3 * tx.i1 + c] * tx.w1;
        const int bottom = r1[3 * tx.i0 + c] * (2048 - tx.w1) + r1[3 * tx.i1 + c] * tx.w1;
        v[c] = (top * (2048 - ty.w1) + bottom * ty.w1 + (1 << 21)) >> 22;
      }
      return;
    }
  }

  int width() const { return w_; }
  int height() const { return h_; }

  // Every canvas pixel of [x0, x1] x [y0, y1] (inside the canvas) into `out`, row-major: the
  // same values as pixel(), tile by tile (last tile first, so that the first covering tile wins).
  void fill(int x0, int y0, int x1, int y1, uint8_t* out) const {
    const int64_t ww = x1 - x0 + 1;
    std::memset(out, kPad, static_cast<size_t>(ww * (y1 - y0 + 1) * 3));
    for (auto it = tiles_.rbegin(); it != tiles_.rend(); ++it) {
      const TileTaps& tt = *it;
      const TileDraw& t = *tt.tile;
      const int cx0 = std::max(t.x1, x0), cx1 = std::min(t.x2 - 1, x1);
      const int cy0 = std::max(t.y1, y0), cy1 = std::min(t.y2 - 1, y1);
      for (int cy = cy0; cy <= cy1; ++cy) {
        const ops::BilinearTap& ty = tt.y[static_cast<size_t>(cy - t.y1)];
        const uint8_t* r0 = tt.src + ty.i0 * tt.src_w * 3;
        const uint8_t* r1 = tt.src + ty.i1 * tt.src_w * 3;
        uint8_t* o = out + ((cy - y0) * ww + (cx0 - x0)) * 3;
        for (int cx = cx0; cx <= cx1; ++cx, o += 3) {
          const ops::BilinearTap& tx = tt.x[static_cast<size_t>(cx - t.x1)];
          for (int c = 0; c < 3; ++c) {
            const int top = r0[3 * tx.i0 + c] * (2048 - tx.w1) + r0[3 * tx.i1 + c] * tx.w1;
            const int bottom = r1[3 * tx.i0 + c] * (2048 - tx.w1) + r1[3 * tx.i1 + c] * tx.w1;
            o[c] = static_cast<uint8_t>((top * (2048 - ty.w1) + bottom * ty.w1 + (1 << 21)) >> 22);
          }
        }
      }
    }
  }

 private:
  int w_, h_;
  std::vector<TileTaps> tiles_;
};

// The part of the canvas an output region samples, drawn once: the bounding box of the
// region's preimage (its corners through the map), widened by the bilinear neighbour and a
// pixel of rounding, cut to the canvas. A point outside it (none expected) is drawn directly.
class CanvasWindow {
 public:
  CanvasWindow(const Canvas& cv, const CanvasMap& m, int w, int h) : cv_(cv) {
    const CanvasBox b = canvas_preimage(m, w, h);
    const auto clampi = [](double v, int hi) { return static_cast<int>(std::clamp(v, 0.0, static_cast<double>(hi))); };
    x0_ = clampi(std::floor(b.x0) - 1, cv.width() - 1), x1_ = clampi(std::floor(b.x1) + 2, cv.width() - 1);
    y0_ = clampi(std::floor(b.y0) - 1, cv.height() - 1), y1_ = clampi(std::floor(b.y1) + 2, cv.height() - 1);
    ww_ = x1_ - x0_ + 1;
    thread_local std::vector<uint8_t> buffer;
    buffer.resize(static_cast<size_t>(ww_) * (y1_ - y0_ + 1) * 3);
    px_ = buffer.data();
    cv.fill(x0_, y0_, x1_, y1_, px_);
  }
  void pixel(int x, int y, int v[3]) const {
    if (x < x0_ || x > x1_ || y < y0_ || y > y1_) return cv_.pixel(x, y, v);
    const uint8_t* p = px_ + (static_cast<int64_t>(y - y0_) * ww_ + (x - x0_)) * 3;
    v[0] = p[0], v[1] = p[1], v[2] = p[2];
  }
  int width() const { return cv_.width(); }
  int height() const { return cv_.height(); }

 private:
  const Canvas& cv_;
  int x0_ = 0, x1_ = -1, y0_ = 0, y1_ = -1;
  int64_t ww_ = 0;
  uint8_t* px_ = nullptr;
};

// The canvas sampled at output pixel (x, y) through the map: bilinear in single precision with
// 114 beyond the canvas, rounded half to even.
void warped_pixel(const CanvasWindow& cv, const CanvasMap& m, int x, int y, uint8_t* o) {
  const double dx = x - m.tx, dy = y - m.ty;
  const double sx = m.r00 * dx + m.r01 * dy, sy = m.r10 * dx + m.r11 * dy;
  if (!(sx > -1 && sy > -1 && sx < cv.width() && sy < cv.height())) {
    o[0] = o[1] = o[2] = kPad;
    return;
  }
  const int x0 = static_cast<int>(std::floor(sx)), y0 = static_cast<int>(std::floor(sy));
  const float fx = static_cast<float>(sx - x0), fy = static_cast<float>(sy - y0);
  int p00[3], p10[3], p01[3], p11[3];
  cv.pixel(x0, y0, p00);
  cv.pixel(x0 + 1, y0, p10);
  cv.pixel(x0, y0 + 1, p01);
  cv.pixel(x0 + 1, y0 + 1, p11);
  for (int c = 0; c < 3; ++c) {
    const float top = static_cast<float>(p00[c]) * (1 - fx) + static_cast<float>(p10[c]) * fx;
    const float bottom = static_cast<float>(p01[c]) * (1 - fx) + static_cast<float>(p11[c]) * fx;
    o[c] = round_u8(top * (1 - fy) + bottom * fy);
  }
}

}  // namespace

void render_sample(const SampleDraw& d, const std::array<const torch::Tensor*, 4>& sources, int S, uint8_t* out) {
  StageScope timed(Stage::MosaicDraw);
  if (S < 1) throw UsageError("render_sample: bad output size");
  const Canvas cv(d, sources);
  std::vector<uint8_t> row(static_cast<size_t>(S) * 3);
  const int cw = std::min(d.content_w, S), ch = std::min(d.content_h, S);
  std::optional<CanvasWindow> window;
  if (d.warp && cw > 0 && ch > 0) window.emplace(cv, d.map, cw, ch);
  for (int Y = 0; Y < S; ++Y) {
    for (int X = 0; X < S; ++X) {
      uint8_t* o = row.data() + 3 * X;
      if (X >= cw || Y >= ch) {
        o[0] = o[1] = o[2] = kPad;
        continue;
      }
      const int Xs = d.flip ? d.content_w - 1 - X : X;
      if (d.warp) {
        warped_pixel(*window, d.map, Xs, Y, o);
      } else {
        int v[3];
        cv.pixel(Xs, Y, v);
        o[0] = static_cast<uint8_t>(v[0]), o[1] = static_cast<uint8_t>(v[1]), o[2] = static_cast<uint8_t>(v[2]);
      }
    }
    if (d.hsv && Y < ch && cw > 0) shift_hsv(row.data(), row.data(), cw, d.gains);
    std::memcpy(out + static_cast<size_t>(Y) * S * 3, row.data(), row.size());
  }
}

}  // namespace libreyolo::data
