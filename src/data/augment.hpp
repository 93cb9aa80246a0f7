// Training augmentation and validation preprocessing of LibreYOLO's YOLOv9 recipe
// (../shared/reference/yolo9.md §4.4-4.9): mosaic, HSV, horizontal flip, top-left letterbox, box
// filters, normalised and padded targets. Images stay RGB; the HSV math gives what OpenCV gives on
// the same picture in BGR order.
//
// Every function writes one sample straight into caller-provided memory: an S x S x 3 uint8
// image and a [max_labels, 5] float target block (rows class, x1, y1, x2, y2 in [0, 1];
// padding rows class -1).
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "data/dataset.hpp"
#include "data/rng.hpp"

namespace libreyolo::data {

// The mosaic/mixup pipeline of a family. Yolo9: the 2S mosaic canvas resized to S; mixup blends
// with a Beta(32, 32) weight and keeps the mosaic's labels only. Yolox (yolox.md §5.9): the 2S
// canvas goes through a random affine (rotation, scale, shear, translation about the canvas
// origin) to S x S; mixup pastes a scaled, maybe flipped partner at a fixed 0.5 weight and keeps
// its labels; HSV and flip come after the mixup.
enum class AugmentStyle { Yolo9, Yolox };

struct AugmentOptions {
  int imgsz = 640;
  int max_labels = 100;
  double mosaic_prob = 1.0;
  double mixup_prob = 0.0;
  double hsv_prob = 1.0;
  double flip_prob = 0.5;
  double hgain = 5.0, sgain = 30.0, vgain = 30.0;
  AugmentStyle style = AugmentStyle::Yolo9;
  // Yolox only: random affine ranges (degrees, fraction of S, degrees) and the scale ranges.
  double degrees = 10.0, translate = 0.1, shear = 2.0;
  double mosaic_scale_lo = 0.1, mosaic_scale_hi = 2.0;
  double mixup_scale_lo = 0.5, mixup_scale_hi = 1.5;
};

// ---- HSV in OpenCV's uint8 space (H in [0, 180), S and V in [0, 255]) -----------------------
struct HsvGains {
  int h = 0, s = 0, v = 0;
};

// Per-pixel conversions over n pixels of interleaved RGB / HSV (usable in place).
void rgb_to_hsv(const uint8_t* rgb, uint8_t* hsv, int64_t n);
void hsv_to_rgb(const uint8_t* hsv, uint8_t* rgb, int64_t n);
// Shifts H (mod 180) and clamps S and V, through HSV and back: the reference's augment_hsv.
// `src` may equal `dst`; with `reverse` the source pixels are read right to left (a fused
// horizontal flip; then src must not equal dst).
void shift_hsv(const uint8_t* src, uint8_t* dst, int64_t n, HsvGains gains, bool reverse = false);
// The reference's draw: U(-1,1) x gain, each zeroed with p = 0.5, truncated toward zero.
HsvGains draw_hsv_gains(Rng& rng, const AugmentOptions& opt);

// ---- Mosaic ---------------------------------------------------------------------------------
struct MosaicParams {
  int xc = 0, yc = 0;                 // centre on the 2S canvas, in [0.5S, 1.5S)
  std::array<int64_t, 3> others{};    // dataset indices of tiles 1..3
};
MosaicParams draw_mosaic(Rng& rng, int imgsz, int64_t dataset_size);
// Places four tiles (top-left, top-right, bottom-left, bottom-right) around (xc, yc) on a 2S
// canvas of 114, shifts and clips their boxes, resizes the canvas to S x S and keeps boxes with
// w > 2 and h > 2. Deterministic: all random choices are in the arguments.
Sample mosaic4(const std::array<const Sample*, 4>& tiles, int imgsz, int xc, int yc);
// The same from dataset tiles (YoloDataset::load_mosaic_tile): exactly the above when every
// tile's pixels are at imgsz scale; else (a reduced decode) each tile is sampled once, straight
// into the output at its scale: the same boxes, pixels within interpolation of the above.
Sample mosaic4(const std::array<const Tile*, 4>& tiles, int imgsz, int xc, int yc);

// The 2S x 2S mosaic canvas itself (tiles placed as mosaic4 places them), boxes clipped to it.
Sample mosaic_canvas(const std::array<const Sample*, 4>& tiles, int imgsz, int xc, int yc);

// ---- YOLOX random affine and mixup (yolox.md §5.9) -----------------------------------------
// The 2x3 matrix taking source pixels to output pixels: m = {a, b, tx, c, d, ty}.
struct AffineParams {
  std::array<double, 6> m{1, 0, 0, 0, 1, 0};
};
// Draw order: angle, scale, shear x, shear y, translation x, y (as the reference).
AffineParams draw_affine(Rng& rng, const AugmentOptions& opt, int imgsz);
// Warps the image to S x S (bilinear, border 114): output pixel p samples the source at M^-1 p.
// Boxes: the four corners transformed, their hull clipped to [0, S]; none dropped here.
Sample warp_affine(const Sample& in, const AffineParams& p, int imgsz);
// YOLOX mixup of `base` (S x S) with `partner` (any size): the partner letterboxed top-left
// into S x S, resized by `scale`, mirrored when `flip`, cropped S x S at (off_x, off_y) of its
// max(scale S, S) canvas, blended 0.5 / 0.5 (truncated), its boxes moved alike and appended.
void mixup_yolox(Sample& base, const Sample& partner, double scale, bool flip, int off_x, int off_y, int imgsz);

// ---- Per-sample transform (../shared/reference/yolo9.md §4.5) -------------------------------
struct TransformParams {
  bool hsv = false;
  HsvGains gains;
  bool flip = false;
};
TransformParams draw_transform(Rng& rng, const AugmentOptions& opt);
// HSV, flip, top-left letterbox to S, keep boxes with w > 1 and h > 1 (falling back to the
// un-augmented image and all its boxes when none is left), normalise, clip, pad.
void apply_transform(const Sample& in, const TransformParams& p, int imgsz, int max_labels,
                     uint8_t* image_out, float* targets_out);

// ---- Samples as drawing plans (the GPU loader's path, data/gpu_batch.hpp) -------------------
// A sample described by where its pictures go instead of by its pixels, so that the pixels can
// be made elsewhere (the GPU) from full-size decodes. The plan reproduces the exact (not the
// reduced-decode) CPU pipeline: each tile's picture is the source image resized to tile_w x
// tile_h (resize_bilinear's arithmetic), placed on a canvas at (offset_x, offset_y), cut to its
// canvas rectangle; the canvas is `factor` times the output size and every output pixel is the
// rounded mean of its factor x factor canvas pixels (2 for the mosaic, 1 for a letterbox); the
// canvas is 114 outside the rectangles. Inside content_w x content_h output pixels the image is
// mirrored (flip) and HSV-shifted (hsv); outside it stays 114.
struct TileDraw {
  int64_t index = -1;               // dataset index of the source image
  int tile_w = 0, tile_h = 0;       // the picture's size at canvas scale
  int offset_x = 0, offset_y = 0;   // canvas position of the picture's pixel (0, 0)
  int x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // canvas rectangle [x1, x2) x [y1, y2) it covers
};
struct SampleDraw {
  int factor = 1;
  int num_tiles = 0;
  std::array<TileDraw, 4> tiles{};
  int content_w = 0, content_h = 0;
  bool hsv = false, flip = false;
  HsvGains gains;
};

// make_train_sample's random draws, boxes and targets (written to targets_out) for the YOLOv9
// recipe without mixup, with every tile's geometry taken from the image headers: what
// make_train_sample produces with DatasetOptions::reduced_decode = false (or a cache), pixels
// included once the plan is drawn by render_sample. Images already found corrupt are replaced
// by their next readable neighbour as load_resized does. Throws UsageError for a recipe it
// cannot plan (plannable() says which).
SampleDraw plan_train_sample(const YoloDataset& ds, int64_t index, bool mosaic, const AugmentOptions& opt,
                             Rng& rng, float* targets_out);
// Whether plan_train_sample covers `opt` (no mixup, YOLOv9 style); else the reason.
bool plannable(const AugmentOptions& opt, std::string* why = nullptr);
// make_val_sample as a plan.
SampleDraw plan_val_sample(const YoloDataset& ds, int64_t index, int max_labels, float* targets_out);
// Draws a plan on the CPU into an S x S x 3 output from the tiles' source images (full-size
// HWC uint8, sources[k] for tiles[k]): the arithmetic the GPU kernel (kernels/render.hpp) must
// match bit for bit.
void render_sample(const SampleDraw& plan, const std::array<const torch::Tensor*, 4>& sources, int S,
                   uint8_t* out);

// ---- Whole samples ---------------------------------------------------------------------------
// One training sample: mosaic (when enabled, with probability mosaic_prob) then the transform;
// with mixup_prob > 0 a mosaic sample is blended with a non-mosaic one, lambda ~ Beta(32, 32),
// and, as in the reference, keeps only the mosaic's targets.
void make_train_sample(const YoloDataset& ds, int64_t index, bool mosaic, const AugmentOptions& opt,
                       Rng& rng, uint8_t* image_out, float* targets_out);
// Validation preprocessing (../shared/reference/yolo9.md §4.9): the resized image letterboxed
// top-left, targets normalised.
void make_val_sample(const YoloDataset& ds, int64_t index, int max_labels, uint8_t* image_out,
                     float* targets_out);

}  // namespace libreyolo::data
