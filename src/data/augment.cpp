#include "data/augment.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <libreyolo/errors.hpp>
#include <vector>

#include "core/log.hpp"
#include "data/stage_timer.hpp"
#include "ops/image_ops.hpp"

namespace libreyolo::data {
namespace {

constexpr uint8_t kPad = 114;

// ---- output -------------------------------------------------------------------------------
inline float clip01(double x) { return static_cast<float>(std::min(1.0, std::max(0.0, x))); }

void write_targets(const std::vector<Box>& boxes, const ops::FitBox& fit, int S, int max_labels, float* out) {
  const size_t k = std::min(boxes.size(), static_cast<size_t>(max_labels));
  for (size_t i = 0; i < k; ++i) {
    const Box& b = boxes[i];
    float* row = out + 5 * i;
    row[0] = static_cast<float>(b.cls);
    row[1] = clip01(b.x1 * fit.sx / S);
    row[2] = clip01(b.y1 * fit.sy / S);
    row[3] = clip01(b.x2 * fit.sx / S);
    row[4] = clip01(b.y2 * fit.sy / S);
  }
  for (size_t i = k; i < static_cast<size_t>(max_labels); ++i) {
    float* row = out + 5 * i;
    row[0] = -1.0f;
    row[1] = row[2] = row[3] = row[4] = 0.0f;
  }
}

void check_image(const torch::Tensor& img) {
  if (img.dim() != 3 || img.size(2) != 3 || img.scalar_type() != torch::kUInt8 || !img.is_contiguous())
    throw RuntimeError("augment: expected a contiguous [H, W, 3] uint8 image");
}

// `img` fitted onto the S x S output (its content nw x nh at the top-left) with optional HSV
// shift and horizontal flip. The reference augments first and resizes after; when the resize is
// the identity (the usual letterbox case: the image's longer side is already S) everything
// happens in one pass.
void fit_into(const torch::Tensor& img, int S, const ops::FitBox& fit, const TransformParams* aug, uint8_t* out) {
  check_image(img);
  const int h = static_cast<int>(img.size(0));
  const int w = static_cast<int>(img.size(1));
  const int nw = static_cast<int>(fit.width);
  const int nh = static_cast<int>(fit.height);
  const bool hsv = aug && aug->hsv;
  const bool flip = aug && aug->flip;
  const size_t out_stride = static_cast<size_t>(S) * 3;

  auto augment_row = [&](const uint8_t* src, uint8_t* dst, int width) {
    if (hsv)
      shift_hsv(src, dst, width, aug->gains, flip);
    else if (flip)
      for (int x = 0; x < width; ++x) std::memcpy(dst + 3 * x, src + 3 * (width - 1 - x), 3);
    else
      std::memcpy(dst, src, static_cast<size_t>(width) * 3);
  };

  if (nw == w && nh == h) {
    const uint8_t* src = img.data_ptr<uint8_t>();
    for (int y = 0; y < h; ++y) augment_row(src + static_cast<size_t>(y) * w * 3, out + y * out_stride, w);
  } else {
    torch::Tensor src = img;
    if (hsv || flip) {
      src = torch::empty_like(img);
      const uint8_t* s = img.data_ptr<uint8_t>();
      uint8_t* d = src.data_ptr<uint8_t>();
      for (int y = 0; y < h; ++y)
        augment_row(s + static_cast<size_t>(y) * w * 3, d + static_cast<size_t>(y) * w * 3, w);
    }
    const torch::Tensor resized = ops::resize_bilinear(src, nh, nw).contiguous();
    const uint8_t* r = resized.data_ptr<uint8_t>();
    for (int y = 0; y < nh; ++y)
      std::memcpy(out + y * out_stride, r + static_cast<size_t>(y) * nw * 3, static_cast<size_t>(nw) * 3);
  }
  if (nw < S)
    for (int y = 0; y < nh; ++y) std::memset(out + y * out_stride + nw * 3, kPad, (S - nw) * 3);
  if (nh < S) std::memset(out + nh * out_stride, kPad, (S - nh) * out_stride);
}

}  // namespace

HsvGains draw_hsv_gains(Rng& rng, const AugmentOptions& opt) {
  double u[3];
  u[0] = rng.uniform(-1.0, 1.0) * opt.hgain;
  u[1] = rng.uniform(-1.0, 1.0) * opt.sgain;
  u[2] = rng.uniform(-1.0, 1.0) * opt.vgain;
  for (double& x : u) x *= static_cast<double>(rng.randint(0, 1));
  // static_cast truncates toward zero, like numpy's astype(int16).
  return {static_cast<int>(u[0]), static_cast<int>(u[1]), static_cast<int>(u[2])};
}


// ---- mosaic and affine ---------------------------------------------------------------------
int64_t draw_partner(Rng& rng, int64_t n, const std::function<int64_t(int64_t)>& labels) {
  int64_t i = 0;
  for (int tries = 0; tries < 20; ++tries) {
    i = rng.randint(0, n - 1);
    if (!labels || labels(i) > 0) break;
  }
  return i;
}

MosaicParams draw_mosaic(Rng& rng, int S, int64_t n, const std::function<int64_t(int64_t)>& labels) {
  MosaicParams m;
  m.yc = static_cast<int>(rng.uniform(0.5 * S, 1.5 * S));
  m.xc = static_cast<int>(rng.uniform(0.5 * S, 1.5 * S));
  for (auto& o : m.others) o = draw_partner(rng, n, labels);
  return m;
}

MosaicParams draw_mosaic(Rng& rng, int S, const YoloDataset& ds) {
  return draw_mosaic(rng, S, ds.size(), [&ds](int64_t i) { return ds.label_count(i); });
}

SampleDraw mosaic_plan(const std::array<const Tile*, 4>& tiles, int S, int xc, int yc, std::vector<Box>* boxes) {
  StageScope timed(Stage::MosaicPlace);
  const int S2 = 2 * S;
  if (xc < 0 || xc > S2 || yc < 0 || yc > S2) throw UsageError("mosaic centre outside the canvas");
  SampleDraw d;
  d.canvas_w = d.canvas_h = d.content_w = d.content_h = S2;
  for (int k = 0; k < 4; ++k) {
    const Tile& tile = *tiles[static_cast<size_t>(k)];
    int h = tile.height, w = tile.width;
    if (h < 1 || w < 1) throw UsageError("mosaic tile of zero size");
    const double scale = std::min({1.0, static_cast<double>(S) / h, static_cast<double>(S) / w});
    if (scale < 1.0) {
      h = std::max(1, static_cast<int>(h * scale));
      w = std::max(1, static_cast<int>(w * scale));
    }
    // Canvas rectangle (a) and the part of the tile (b) that lands there.
    int x1a, y1a, x2a, y2a, x1b, y1b, x2b, y2b;
    switch (k) {
      case 0:
        x1a = std::max(xc - w, 0), y1a = std::max(yc - h, 0), x2a = xc, y2a = yc;
        x1b = w - (x2a - x1a), y1b = h - (y2a - y1a), x2b = w, y2b = h;
        break;
      case 1:
        x1a = xc, y1a = std::max(yc - h, 0), x2a = std::min(xc + w, S2), y2a = yc;
        x1b = 0, y1b = h - (y2a - y1a), x2b = std::min(w, x2a - x1a), y2b = h;
        break;
      case 2:
        x1a = std::max(xc - w, 0), y1a = yc, x2a = xc, y2a = std::min(S2, yc + h);
        x1b = w - (x2a - x1a), y1b = 0, x2b = w, y2b = std::min(y2a - y1a, h);
        break;
      default:
        x1a = xc, y1a = yc, x2a = std::min(xc + w, S2), y2a = std::min(S2, yc + h);
        x1b = 0, y1b = 0, x2b = std::min(w, x2a - x1a), y2b = std::min(y2a - y1a, h);
        break;
    }
    const int padw = x1a - x1b, padh = y1a - y1b;
    const int rows = y2a - y1a, cols = x2a - x1a;
    if (rows > 0 && cols > 0 && rows == y2b - y1b && cols == x2b - x1b)
      d.tiles[static_cast<size_t>(d.num_tiles++)] = {tile.index, w, h, padw, padh, x1a, y1a, x2a, y2a};
    for (const Box& b : tile.boxes)
      boxes->push_back({std::clamp(b.x1 * scale + padw, 0.0, 1.0 * S2), std::clamp(b.y1 * scale + padh, 0.0, 1.0 * S2),
                        std::clamp(b.x2 * scale + padw, 0.0, 1.0 * S2), std::clamp(b.y2 * scale + padh, 0.0, 1.0 * S2),
                        b.cls});
  }
  return d;
}

AffineParams make_affine(double degrees, double scale, double shear_x, double shear_y, double tx, double ty) {
  const double deg2rad = M_PI / 180.0;
  const double shx = std::tan(shear_x * deg2rad), shy = std::tan(shear_y * deg2rad);
  const double a = scale * std::cos(degrees * deg2rad), b = scale * std::sin(degrees * deg2rad);
  AffineParams p;
  p.m = {a - shy * b, b + shy * a, tx, -b + shx * a, a + shx * b, ty};
  return p;
}

AffineParams draw_affine(Rng& rng, const AugmentOptions& opt, int S) {
  const double angle = rng.uniform(-opt.degrees, opt.degrees);
  const double scale = rng.uniform(opt.mosaic_scale_lo, opt.mosaic_scale_hi);
  const double shx = rng.uniform(-opt.shear, opt.shear);
  const double shy = rng.uniform(-opt.shear, opt.shear);
  const double tx = rng.uniform(-opt.translate, opt.translate) * S;
  const double ty = rng.uniform(-opt.translate, opt.translate) * S;
  return make_affine(angle, scale, shx, shy, tx, ty);
}

CanvasBox canvas_preimage(const CanvasMap& m, int w, int h) {
  CanvasBox b{INFINITY, INFINITY, -INFINITY, -INFINITY};
  for (const double X : {0.0, w - 1.0})
    for (const double Y : {0.0, h - 1.0}) {
      const double dx = X - m.tx, dy = Y - m.ty;
      const double sx = m.r00 * dx + m.r01 * dy, sy = m.r10 * dx + m.r11 * dy;
      b.x0 = std::min(b.x0, sx), b.x1 = std::max(b.x1, sx), b.y0 = std::min(b.y0, sy), b.y1 = std::max(b.y1, sy);
    }
  return b;
}

void warp_plan(SampleDraw& d, const AffineParams& p, int S, std::vector<Box>* boxes) {
  StageScope timed(Stage::MosaicPlace);
  const auto& m = p.m;
  const double det = m[0] * m[4] - m[1] * m[3];
  if (!(std::abs(det) > 1e-12)) throw UsageError("warp_plan: singular affine matrix");
  d.warp = true;
  d.map = {m[4] / det, -m[1] / det, -m[3] / det, m[0] / det, m[2], m[5]};
  d.content_w = d.content_h = S;
  // Spectral norm of the linear part: sqrt of the larger eigenvalue of A^T A.
  const double fro = m[0] * m[0] + m[1] * m[1] + m[3] * m[3] + m[4] * m[4];
  d.zoom = std::sqrt(0.5 * (fro + std::sqrt(std::max(0.0, fro * fro - 4.0 * det * det))));
  // The canvas points the output samples, widened by the bilinear neighbour and a pixel of
  // rounding.
  const CanvasBox b = canvas_preimage(d.map, S, S);
  int kept = 0;
  for (int k = 0; k < d.num_tiles; ++k) {
    const TileDraw& t = d.tiles[static_cast<size_t>(k)];
    const bool seen = t.x2 > b.x0 - 2 && t.x1 <= b.x1 + 2 && t.y2 > b.y0 - 2 && t.y1 <= b.y1 + 2;
    if (seen) d.tiles[static_cast<size_t>(kept++)] = t;
  }
  d.num_tiles = kept;
  const double Sd = S;
  for (Box& b : *boxes) {
    const double xs[4] = {b.x1, b.x2, b.x1, b.x2}, ys[4] = {b.y1, b.y1, b.y2, b.y2};
    double x1 = INFINITY, y1 = INFINITY, x2 = -INFINITY, y2 = -INFINITY;
    for (int k = 0; k < 4; ++k) {
      const double X = m[0] * xs[k] + m[1] * ys[k] + m[2], Y = m[3] * xs[k] + m[4] * ys[k] + m[5];
      x1 = std::min(x1, X), x2 = std::max(x2, X), y1 = std::min(y1, Y), y2 = std::max(y2, Y);
    }
    b = {std::clamp(x1, 0.0, Sd), std::clamp(y1, 0.0, Sd), std::clamp(x2, 0.0, Sd), std::clamp(y2, 0.0, Sd), b.cls};
  }
}

namespace {

Tile tile_of(const Sample& s, int64_t index) {
  check_image(s.image);
  return {s.image, static_cast<int>(s.image.size(0)), static_cast<int>(s.image.size(1)), s.boxes, index};
}

}  // namespace

Sample mosaic_canvas(const std::array<const Sample*, 4>& samples, int S, int xc, int yc) {
  std::array<Tile, 4> t;
  for (int k = 0; k < 4; ++k) t[static_cast<size_t>(k)] = tile_of(*samples[static_cast<size_t>(k)], k);
  Sample out;
  const SampleDraw d = mosaic_plan({&t[0], &t[1], &t[2], &t[3]}, S, xc, yc, &out.boxes);
  std::array<const torch::Tensor*, 4> src{};
  for (int k = 0; k < d.num_tiles; ++k) src[static_cast<size_t>(k)] = &t[static_cast<size_t>(d.tiles[static_cast<size_t>(k)].index)].image;
  out.image = torch::empty({2 * S, 2 * S, 3}, torch::kUInt8);
  render_sample(d, src, 2 * S, out.image.data_ptr<uint8_t>());
  return out;
}

Sample warp_affine(const Sample& in, const AffineParams& p, int S) {
  const Tile t = tile_of(in, 0);
  SampleDraw d;
  d.num_tiles = 1;
  d.tiles[0] = {0, t.width, t.height, 0, 0, 0, 0, t.width, t.height};
  d.canvas_w = t.width;
  d.canvas_h = t.height;
  Sample out;
  out.boxes = in.boxes;
  warp_plan(d, p, S, &out.boxes);
  out.image = torch::empty({S, S, 3}, torch::kUInt8);
  render_sample(d, {&t.image, nullptr, nullptr, nullptr}, S, out.image.data_ptr<uint8_t>());
  return out;
}

void mixup_paste(Sample& base, const Sample& partner, double jit, bool flip, int off_x, int off_y, int S) {
  StageScope timed(Stage::Mixup);
  check_image(base.image);
  check_image(partner.image);
  if (base.image.size(0) != S || base.image.size(1) != S) throw UsageError("mixup_paste: base must be S x S");
  // Partner letterboxed top-left into S x S, then the whole canvas resized by the jitter.
  const int ph = static_cast<int>(partner.image.size(0)), pw = static_cast<int>(partner.image.size(1));
  const double r = std::min(static_cast<double>(S) / ph, static_cast<double>(S) / pw);
  const int rw = std::max(1, static_cast<int>(pw * r)), rh = std::max(1, static_cast<int>(ph * r));
  torch::Tensor boxed = torch::empty({S, S, 3}, torch::kUInt8);
  std::memset(boxed.data_ptr<uint8_t>(), kPad, static_cast<size_t>(S) * S * 3);
  {
    const torch::Tensor resized = ops::resize_bilinear(partner.image, rh, rw).contiguous();
    for (int y = 0; y < rh; ++y)
      std::memcpy(boxed.data_ptr<uint8_t>() + static_cast<size_t>(y) * S * 3,
                  resized.data_ptr<uint8_t>() + static_cast<size_t>(y) * rw * 3, static_cast<size_t>(rw) * 3);
  }
  const int jw = std::max(1, static_cast<int>(S * jit)), jh = jw;
  const torch::Tensor jittered = ops::resize_bilinear(boxed, jh, jw).contiguous();
  const uint8_t* jp = jittered.data_ptr<uint8_t>();
  // Zero canvas of max(jS, S), the jittered image top-left (mirrored when flip), S x S cropped.
  uint8_t* bp = base.image.data_ptr<uint8_t>();
  for (int y = 0; y < S; ++y) {
    for (int x = 0; x < S; ++x) {
      const int cy = y + off_y, cx = x + off_x;
      uint8_t* d = bp + (static_cast<size_t>(y) * S + x) * 3;
      for (int c = 0; c < 3; ++c) {
        int v = 0;
        if (cy < jh && cx < jw) v = jp[(static_cast<size_t>(cy) * jw + (flip ? jw - 1 - cx : cx)) * 3 + c];
        d[c] = static_cast<uint8_t>(0.5f * d[c] + 0.5f * static_cast<float>(v));  // truncated, as astype(uint8)
      }
    }
  }
  const double k = r * jit, Sd = S;
  for (const Box& b : partner.boxes) {
    double x1 = std::clamp(b.x1 * k, 0.0, static_cast<double>(jw)), x2 = std::clamp(b.x2 * k, 0.0, static_cast<double>(jw));
    const double y1 = std::clamp(b.y1 * k, 0.0, static_cast<double>(jh)), y2 = std::clamp(b.y2 * k, 0.0, static_cast<double>(jh));
    if (flip) {
      const double f1 = jw - x2, f2 = jw - x1;
      x1 = f1, x2 = f2;
    }
    base.boxes.push_back({std::clamp(x1 - off_x, 0.0, Sd), std::clamp(y1 - off_y, 0.0, Sd),
                          std::clamp(x2 - off_x, 0.0, Sd), std::clamp(y2 - off_y, 0.0, Sd), b.cls});
  }
}


// ---- per-sample transform ----------------------------------------------------------------
TransformParams draw_transform(Rng& rng, const AugmentOptions& opt) {
  TransformParams p;
  p.hsv = rng.uniform() < opt.hsv_prob;
  p.gains = draw_hsv_gains(rng, opt);
  p.flip = rng.uniform() < opt.flip_prob;
  p.augment_empty = opt.recipe.augment_empty;
  p.fit = opt.fit;
  return p;
}

namespace {

// apply_transform's box path for an image of h x w: whether the image is augmented and the
// boxes written (in the image's pixels; scaled by the fit when written).
struct TransformOutcome {
  bool augment = false;
  ops::FitBox fit;
  std::vector<Box> boxes;
};

TransformOutcome transform_boxes(const std::vector<Box>& boxes, int h, int w, const TransformParams& p, int S) {
  TransformOutcome out;
  out.fit = ops::fit_box(h, w, S, p.fit);
  if (boxes.empty()) {
    out.augment = p.augment_empty;
    return out;
  }
  out.boxes.reserve(boxes.size());
  for (const Box& b0 : boxes) {
    Box b = b0;
    if (p.flip) {
      b.x1 = w - b0.x2;
      b.x2 = w - b0.x1;
    }
    // The filter is measured after the fit's scaling and before clipping.
    if ((b.x2 - b.x1) * out.fit.sx > 1.0 && (b.y2 - b.y1) * out.fit.sy > 1.0) out.boxes.push_back(b);
  }
  if (out.boxes.empty()) {
    // Nothing survived: the reference falls back to the un-augmented image and all its boxes.
    out.boxes = boxes;
    return out;
  }
  out.augment = true;
  return out;
}

// The transform's draws and boxes applied to a plan of an h x w picture: its flags and targets.
void finish_plan(SampleDraw& d, const std::vector<Box>& boxes, int h, int w, const AugmentOptions& opt, Rng& rng,
                 float* targets_out) {
  transform_plan(d, boxes, h, w, draw_transform(rng, opt), opt.imgsz, opt.max_labels, targets_out);
}

// A picture of h x w at imgsz scale fitted to S x S: one tile covering nw x nh output pixels at
// the top-left (the picture itself when the fit keeps its size; otherwise resized once more, which
// the CPU does in two steps: then the pixels agree within interpolation only).
SampleDraw fit_plan(int64_t index, const ops::FitBox& fit, int S) {
  const int nw = static_cast<int>(fit.width);
  const int nh = static_cast<int>(fit.height);
  SampleDraw d;
  d.num_tiles = 1;
  d.tiles[0] = {index, nw, nh, 0, 0, 0, 0, nw, nh};
  d.canvas_w = d.canvas_h = S;
  d.content_w = nw;
  d.content_h = nh;
  return d;
}

// The mosaic's draws (centre, partners, affine) and geometry (mosaic_sample_plan), the tiles'
// geometry read from the dataset.
SampleDraw draw_mosaic_sample(const YoloDataset& ds, int64_t index, const AugmentOptions& opt, Rng& rng,
                              std::vector<Box>* boxes) {
  const MosaicParams mp = draw_mosaic(rng, opt.imgsz, ds);
  const std::array<Tile, 4> t = {ds.tile_geometry(ds.readable_from(index)), ds.tile_geometry(ds.readable_from(mp.others[0])),
                                 ds.tile_geometry(ds.readable_from(mp.others[1])),
                                 ds.tile_geometry(ds.readable_from(mp.others[2]))};
  return mosaic_sample_plan({&t[0], &t[1], &t[2], &t[3]}, mp.xc, mp.yc, draw_affine(rng, opt, opt.imgsz), opt, boxes);
}

// A mosaic plan's pixels from this thread's tile loads. False when a load found an image
// corrupt (it is marked, and replaced in the next plan): draw the plan again.
bool render_mosaic(const YoloDataset& ds, const SampleDraw& d, int S, uint8_t* out) {
  std::array<Tile, 4> t;
  std::array<const torch::Tensor*, 4> src{};
  for (int k = 0; k < d.num_tiles; ++k) {
    const auto K = static_cast<size_t>(k);
    const double need = std::ceil(std::max(d.tiles[K].tile_w, d.tiles[K].tile_h) * std::min(1.0, d.zoom));
    t[K] = ds.load_mosaic_tile(d.tiles[K].index, k, static_cast<int>(need));
    if (t[K].index != d.tiles[K].index) return false;
    src[K] = &t[K].image;
  }
  render_sample(d, src, S, out);
  return true;
}

// Real (class >= 0) rows of two target blocks, the first's first, padded again.
void merge_targets(float* targets, const float* other, int max_labels) {
  int n = 0;
  while (n < max_labels && targets[5 * n] >= 0) ++n;
  for (int i = 0; i < max_labels && n < max_labels; ++i)
    if (other[5 * i] >= 0) std::memcpy(targets + 5 * n++, other + 5 * i, 5 * sizeof(float));
}

}  // namespace

SampleDraw mosaic_sample_plan(const std::array<const Tile*, 4>& tiles, int xc, int yc, const AffineParams& affine,
                              const AugmentOptions& opt, std::vector<Box>* boxes) {
  const int S = opt.imgsz;
  std::vector<Box> placed;
  SampleDraw d = mosaic_plan(tiles, S, xc, yc, &placed);
  warp_plan(d, affine, S, &placed);
  boxes->clear();
  const double side = opt.recipe.drop_box_side;
  for (const Box& b : placed)
    if (side <= 0 || (b.x2 - b.x1 > side && b.y2 - b.y1 > side)) boxes->push_back(b);
  return d;
}

void transform_plan(SampleDraw& d, const std::vector<Box>& boxes, int h, int w, const TransformParams& p, int S,
                    int max_labels, float* targets_out) {
  const TransformOutcome out = transform_boxes(boxes, h, w, p, S);
  d.hsv = out.augment && p.hsv;
  d.flip = out.augment && p.flip;
  d.gains = p.gains;
  write_targets(out.boxes, out.fit, S, max_labels, targets_out);
}

void apply_transform(const Sample& in, const TransformParams& p, int S, int max_labels,
                     uint8_t* image_out, float* targets_out) {
  StageScope timed(Stage::Transform);
  check_image(in.image);
  const TransformOutcome t =
      transform_boxes(in.boxes, static_cast<int>(in.image.size(0)), static_cast<int>(in.image.size(1)), p, S);
  fit_into(in.image, S, t.fit, t.augment ? &p : nullptr, image_out);
  write_targets(t.boxes, t.fit, S, max_labels, targets_out);
}

// ---- plans ---------------------------------------------------------------------------------
bool plannable(const AugmentOptions& opt, std::string* why) {
  if (opt.recipe.mixup != Mixup::Blend) {
    if (why) *why = "the recipe's scaled-paste mixup";
    return false;
  }
  if (opt.mixup_prob > 0) {
    if (why) *why = strfmt("mixup (mixup=%g)", opt.mixup_prob);
    return false;
  }
  return true;
}

SampleDraw plan_train_sample(const YoloDataset& ds, int64_t index, bool mosaic, const AugmentOptions& opt,
                             Rng& rng, float* targets_out) {
  std::string why;
  if (!plannable(opt, &why)) throw UsageError("plan_train_sample: " + why + " has no plan");
  const int S = opt.imgsz;
  if (mosaic && rng.uniform() < opt.mosaic_prob) {
    std::vector<Box> boxes;
    SampleDraw d = draw_mosaic_sample(ds, index, opt, rng, &boxes);
    finish_plan(d, boxes, S, S, opt, rng, targets_out);
    return d;
  }
  const int64_t i = ds.readable_from(index);
  const Tile t = ds.tile_geometry(i);
  SampleDraw d = fit_plan(i, ops::fit_box(t.height, t.width, S, opt.fit), S);
  finish_plan(d, t.boxes, t.height, t.width, opt, rng, targets_out);
  return d;
}

SampleDraw plan_val_sample(const YoloDataset& ds, int64_t index, int max_labels, float* targets_out, ops::Fit fit) {
  const int S = ds.imgsz();
  const int64_t i = ds.readable_from(index);
  const Tile t = ds.tile_geometry(i);
  const ops::FitBox box = ops::fit_box(t.height, t.width, S, fit);
  write_targets(t.boxes, box, S, max_labels, targets_out);
  return fit_plan(i, box, S);
}

// ---- whole samples -----------------------------------------------------------------------
void make_train_sample(const YoloDataset& ds, int64_t index, bool mosaic, const AugmentOptions& opt,
                       Rng& rng, uint8_t* image_out, float* targets_out) {
  const int S = opt.imgsz;
  const size_t npix = static_cast<size_t>(S) * S * 3;
  if (mosaic && rng.uniform() < opt.mosaic_prob) {
    const Rng start = rng;
    if (opt.recipe.mixup == Mixup::ScaledPaste) {
      Sample m;
      m.image = torch::empty({S, S, 3}, torch::kUInt8);
      SampleDraw d;
      do {
        rng = start;
        d = draw_mosaic_sample(ds, index, opt, rng, &m.boxes);
      } while (!render_mosaic(ds, d, S, m.image.data_ptr<uint8_t>()));
      if (opt.mixup_prob > 0 && !m.boxes.empty() && rng.uniform() < opt.mixup_prob) {
        const double jit = rng.uniform(opt.mixup_scale_lo, opt.mixup_scale_hi);
        const bool flip = rng.uniform() > 0.5;
        // A partner with labels (up to 20 draws, else no mixup).
        Sample partner;
        for (int tries = 0; tries < 20 && partner.boxes.empty(); ++tries)
          partner = ds.load_resized(rng.randint(0, ds.size() - 1));
        if (!partner.boxes.empty()) {
          const int extra = std::max(1, static_cast<int>(S * jit)) - S;
          const int off_y = extra > 0 ? static_cast<int>(rng.randint(0, extra - 1)) : 0;
          const int off_x = extra > 0 ? static_cast<int>(rng.randint(0, extra - 1)) : 0;
          mixup_paste(m, partner, jit, flip, off_x, off_y, S);
        }
      }
      apply_transform(m, draw_transform(rng, opt), S, opt.max_labels, image_out, targets_out);
      return;
    }
    SampleDraw d;
    do {
      rng = start;
      std::vector<Box> boxes;
      d = draw_mosaic_sample(ds, index, opt, rng, &boxes);
      finish_plan(d, boxes, S, S, opt, rng, targets_out);
    } while (!render_mosaic(ds, d, S, image_out));
    if (opt.mixup_prob > 0 && rng.uniform() < opt.mixup_prob) {
      // A partner (preferring one with labels) through the plain path, blended with a weight of
      // Beta(32, 32); the targets of both are kept.
      const Sample other = ds.load_resized(draw_partner(rng, ds.size(), [&ds](int64_t i) { return ds.label_count(i); }));
      std::vector<uint8_t> img2(npix);
      std::vector<float> targets2(static_cast<size_t>(opt.max_labels) * 5);
      apply_transform(other, draw_transform(rng, opt), S, opt.max_labels, img2.data(), targets2.data());
      const float lam = static_cast<float>(rng.beta(32.0, 32.0));
      StageScope timed(Stage::Mixup);
      for (size_t i = 0; i < npix; ++i) image_out[i] = round_u8(lam * image_out[i] + (1.0f - lam) * img2[i]);
      merge_targets(targets_out, targets2.data(), opt.max_labels);
    }
    return;
  }
  const Sample s = ds.load_resized(index);
  apply_transform(s, draw_transform(rng, opt), S, opt.max_labels, image_out, targets_out);
}

void make_val_sample(const YoloDataset& ds, int64_t index, int max_labels, uint8_t* image_out,
                     float* targets_out, ops::Fit fit) {
  const int S = ds.imgsz();
  const Sample s = ds.load_resized(index);
  StageScope timed(Stage::Transform);
  const ops::FitBox box = ops::fit_box(s.image.size(0), s.image.size(1), S, fit);
  fit_into(s.image, S, box, nullptr, image_out);
  write_targets(s.boxes, box, S, max_labels, targets_out);
}

}  // namespace libreyolo::data
