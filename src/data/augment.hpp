// Training augmentation and validation preprocessing of the detection recipes: mosaic
// through a random affine, HSV, horizontal flip, the fit to S x S (top-left letterbox or
// stretch), box filters, mixup,
// normalised and padded targets. Images stay RGB; the HSV math gives what OpenCV gives on the
// same picture in BGR order (data/hsv.hpp).
//
// Every function writes one sample straight into caller-provided memory: an S x S x 3 uint8
// image and a [max_labels, 5] float target block (rows class, x1, y1, x2, y2 in [0, 1];
// padding rows class -1).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>

#include "data/dataset.hpp"
#include "data/hsv.hpp"
#include "data/recipe.hpp"
#include "data/rng.hpp"
#include "ops/image_ops.hpp"

namespace libreyolo::data {


struct AugmentOptions {
  int imgsz = 640;
  int max_labels = 100;
  double mosaic_prob = 1.0;
  double mixup_prob = 0.0;
  double hsv_prob = 1.0;
  double flip_prob = 0.5;
  double hgain = 5.0, sgain = 30.0, vgain = 30.0;
  AugmentRecipe recipe;  // what the family's recipe does after the mosaic (data/recipe.hpp)
  // How a plain (not mosaicked) image becomes S x S, in training and validation: the family's
  // input fit (models::InputSpec::fit).
  ops::Fit fit = ops::Fit::Letterbox;
  // The mosaic's random affine: rotation (+-degrees), translation (+- fraction of S), shear
  // (+-degrees), scale range. The scaled-paste mixup's partner scale range.
  double degrees = 0.0, translate = 0.1, shear = 0.0;
  double mosaic_scale_lo = 0.5, mosaic_scale_hi = 1.5;
  double mixup_scale_lo = 0.5, mixup_scale_hi = 1.5;
};

// The reference's draw: U(-1,1) x gain, each zeroed with p = 0.5, truncated toward zero.
HsvGains draw_hsv_gains(Rng& rng, const AugmentOptions& opt);

// ---- Mosaic and affine ----------------------------------------------------------------------
struct MosaicParams {
  int xc = 0, yc = 0;                 // centre on the 2S canvas, in [0.5S, 1.5S)
  std::array<int64_t, 3> others{};    // dataset indices of tiles 1..3
};
// Draws the centre, then each partner tile uniformly, drawing again (up to 20 draws) while the
// drawn image has no labels (`labels(i)`: the number of boxes of image i; empty: any image).
MosaicParams draw_mosaic(Rng& rng, int imgsz, int64_t dataset_size,
                         const std::function<int64_t(int64_t)>& labels = {});
MosaicParams draw_mosaic(Rng& rng, int imgsz, const YoloDataset& ds);
// One partner index as draw_mosaic draws them (also the blend mixup's partner).
int64_t draw_partner(Rng& rng, int64_t dataset_size, const std::function<int64_t(int64_t)>& labels);

// The 2x3 matrix taking canvas pixels to output pixels: m = {a, b, tx, c, d, ty}.
struct AffineParams {
  std::array<double, 6> m{1, 0, 0, 0, 1, 0};
};
// Rotation by `degrees` (counter-clockwise) and scaling about the origin, the shears (degrees)
// mixed in, then the translation (pixels): OpenCV's rotation matrix with the reference's shear.
AffineParams make_affine(double degrees, double scale, double shear_x, double shear_y, double tx, double ty);
// Draw order: angle, scale, shear x, shear y, translation x, y (as the reference).
AffineParams draw_affine(Rng& rng, const AugmentOptions& opt, int imgsz);

// ---- Samples as drawing plans ---------------------------------------------------------------
// A sample described by where its pictures go instead of by its pixels, so that the pixels can
// be made on the CPU (render_sample) or the GPU (kernels/render.hpp) from decodes of any
// resolution. Each tile's picture is its source image resized to tile_w x tile_h
// (resize_bilinear's arithmetic), placed on a canvas_w x canvas_h canvas at (offset_x,
// offset_y), cut to its canvas rectangle; the canvas is 114 outside the rectangles and its
// borders. Output pixel p takes canvas pixel p, or with `warp` the canvas sampled bilinearly at
// the point `map` gives for p (OpenCV warpAffine's geometry, 114 beyond the canvas). Inside
// content_w x content_h output pixels the image is mirrored (flip) and HSV-shifted (hsv);
// outside it stays 114.
struct TileDraw {
  int64_t index = -1;               // dataset index of the source image
  int tile_w = 0, tile_h = 0;       // the picture's size at canvas scale
  int offset_x = 0, offset_y = 0;   // canvas position of the picture's pixel (0, 0)
  int x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // canvas rectangle [x1, x2) x [y1, y2) it covers
};
// Canvas point of output pixel (x, y): (r00 dx + r01 dy, r10 dx + r11 dy) with dx = x - tx,
// dy = y - ty, in double precision, in that order of operations.
struct CanvasMap {
  double r00 = 1, r01 = 0, r10 = 0, r11 = 1, tx = 0, ty = 0;
};
// The bounding box of the canvas points output pixels [0, w) x [0, h) sample (the preimages of
// the region's corner pixels: the map is affine).
struct CanvasBox {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};
CanvasBox canvas_preimage(const CanvasMap& m, int w, int h);
struct SampleDraw {
  int num_tiles = 0;
  std::array<TileDraw, 4> tiles{};
  int canvas_w = 0, canvas_h = 0;
  bool warp = false;
  CanvasMap map;
  // The largest stretch of canvas distances in the output (1 without warp): a tile is shown at
  // up to `zoom` times its canvas size, which is the resolution its decode needs.
  double zoom = 1.0;
  int content_w = 0, content_h = 0;
  bool hsv = false, flip = false;
  HsvGains gains;
};

// The four tiles (their geometry: index, height x width at imgsz scale, boxes) around (xc, yc)
// on a 2S canvas, as the reference places them; a tile larger than S is shrunk to fit. The
// plan draws the canvas itself (2S x 2S, no warp); the boxes, shifted and clipped to the
// canvas, are appended to *boxes.
SampleDraw mosaic_plan(const std::array<const Tile*, 4>& tiles, int imgsz, int xc, int yc, std::vector<Box>* boxes);
// Sends a plan's canvas through the affine to an S x S output (content S x S) and the boxes
// with it: the hull of each box's four transformed corners, clipped to [0, S]; none dropped.
// Tiles the output never samples leave the plan (their images need no decode).
void warp_plan(SampleDraw& plan, const AffineParams& affine, int imgsz, std::vector<Box>* boxes);
// Draws a plan into an S x S x 3 output from the tiles' source images (sources[k] for
// tiles[k]: HWC uint8 at any resolution; a source of exactly tile_w x tile_h is taken as is).
void render_sample(const SampleDraw& plan, const std::array<const torch::Tensor*, 4>& sources, int S,
                   uint8_t* out);

// The mosaic of four tiles for given draws (centre, affine): a plan of the S x S window of the
// canvas, without HSV or flip, and its boxes (those with a side of at most the recipe's
// drop_box_side pixels dropped).
SampleDraw mosaic_sample_plan(const std::array<const Tile*, 4>& tiles, int xc, int yc, const AffineParams& affine,
                              const AugmentOptions& opt, std::vector<Box>* boxes);

// Sample-level forms of the above (tests, the scaled-paste mixup path): the 2S x 2S canvas of four
// samples, boxes clipped to it; an image warped to S x S (bilinear, border 114) with its boxes.
Sample mosaic_canvas(const std::array<const Sample*, 4>& tiles, int imgsz, int xc, int yc);
Sample warp_affine(const Sample& in, const AffineParams& p, int imgsz);

// The scaled-paste mixup of `base` (S x S) with `partner` (any size): the partner letterboxed top-left
// into S x S, resized by `scale`, mirrored when `flip`, cropped S x S at (off_x, off_y) of its
// max(scale S, S) canvas, blended 0.5 / 0.5 (truncated), its boxes moved alike and appended.
void mixup_paste(Sample& base, const Sample& partner, double scale, bool flip, int off_x, int off_y, int imgsz);

// ---- Per-sample transform -------------------------------------------------------------------
struct TransformParams {
  bool hsv = false;
  HsvGains gains;
  bool flip = false;
  bool augment_empty = true;  // an image without boxes is still shifted and flipped
  ops::Fit fit = ops::Fit::Letterbox;  // AugmentOptions::fit
};
TransformParams draw_transform(Rng& rng, const AugmentOptions& opt);
// The transform of an h x w picture's plan (its boxes given): the plan's HSV and flip, and the
// targets (boxes filtered, or all boxes and no augmentation when none is left).
void transform_plan(SampleDraw& plan, const std::vector<Box>& boxes, int h, int w, const TransformParams& p,
                    int imgsz, int max_labels, float* targets_out);
// HSV, flip, the fit to S (p.fit), keep boxes with w > 1 and h > 1 after the fit's scaling
// (falling back to the un-augmented image and all its boxes when none is left), normalise, clip, pad.
void apply_transform(const Sample& in, const TransformParams& p, int imgsz, int max_labels,
                     uint8_t* image_out, float* targets_out);

// ---- Whole samples --------------------------------------------------------------------------
// A training sample's random draws, boxes and targets (written to targets_out) for a blend
// recipe without mixup, with every tile's geometry taken from the image headers: the plan of
// what make_train_sample draws. Images already found corrupt are replaced by their next
// readable neighbour as the loads do. Throws UsageError for a recipe it cannot plan
// (plannable() says which).
SampleDraw plan_train_sample(const YoloDataset& ds, int64_t index, bool mosaic, const AugmentOptions& opt,
                             Rng& rng, float* targets_out);
// Whether plan_train_sample covers `opt` (a blend recipe, no mixup); else the reason.
bool plannable(const AugmentOptions& opt, std::string* why = nullptr);
// make_val_sample as a plan.
SampleDraw plan_val_sample(const YoloDataset& ds, int64_t index, int max_labels, float* targets_out,
                           ops::Fit fit = ops::Fit::Letterbox);

// One training sample: the mosaic (when enabled, with probability mosaic_prob) or the plain
// image, then the recipe's transform and mixup.
void make_train_sample(const YoloDataset& ds, int64_t index, bool mosaic, const AugmentOptions& opt,
                       Rng& rng, uint8_t* image_out, float* targets_out);
// Validation preprocessing: the resized image fitted to S x S (letterboxed top-left or stretched),
// targets normalised.
void make_val_sample(const YoloDataset& ds, int64_t index, int max_labels, uint8_t* image_out,
                     float* targets_out, ops::Fit fit = ops::Fit::Letterbox);

}  // namespace libreyolo::data
