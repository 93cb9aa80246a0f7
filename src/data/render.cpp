// Drawing sample plans into pixels on the CPU (data/augment.hpp SampleDraw). The GPU kernel
// (kernels/render.cu) repeats this arithmetic operation for operation; the GPU loader's tests
// compare the two bit for bit.
#include <cmath>
#include <cstring>
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

 private:
  int w_, h_;
  std::vector<TileTaps> tiles_;
};

// The canvas sampled at output pixel (x, y) through the map: bilinear in single precision with
// 114 beyond the canvas, rounded half to even.
void warped_pixel(const Canvas& cv, const CanvasMap& m, int x, int y, uint8_t* o) {
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
  for (int Y = 0; Y < S; ++Y) {
    for (int X = 0; X < S; ++X) {
      uint8_t* o = row.data() + 3 * X;
      if (X >= cw || Y >= ch) {
        o[0] = o[1] = o[2] = kPad;
        continue;
      }
      const int Xs = d.flip ? d.content_w - 1 - X : X;
      if (d.warp) {
        warped_pixel(cv, d.map, Xs, Y, o);
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
