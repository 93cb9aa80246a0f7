// Pixel operations on uint8 HWC tensors (CPU), written for the data loader's hot path.
#pragma once
#include <torch/types.h>

#include <cstdint>

namespace libreyolo::ops {

// Bilinear resize with OpenCV INTER_LINEAR semantics (half-pixel centres, no antialiasing),
// [H, W, C] uint8 -> [out_h, out_w, C] uint8 (any C; 1 and 3 have unrolled loops). Results are
// within one level of the exact real-valued interpolation (fixed-point weights).
torch::Tensor resize_bilinear(const torch::Tensor& hwc, int out_h, int out_w);
// Output pixel (x, y) of an out_h x out_w window written at `dst` (rows dst_row_stride bytes
// apart, C = src's channels) reads `src` (contiguous) bilinearly at the pixel-centre position
//   ((x + 0.5) * scale_x - 0.5 + shift_x, (y + 0.5) * scale_y - 0.5 + shift_y),
// clamped to the border, with resize_bilinear's arithmetic (shift 0 and scale in / out is
// resize_bilinear bit for bit). For sampling a picture straight into part of a larger image.
void resample_bilinear_into(const torch::Tensor& src, uint8_t* dst, int64_t out_h, int64_t out_w,
                            int64_t dst_row_stride, double scale_y, double shift_y, double scale_x,
                            double shift_x);
// One axis of those resamplings at output position d: source pixels i0 and i1 (clamped to
// [0, in - 1]) and the 11-bit weight of i1 (of 2048). Every output value is then the exact
// integer (wy0 (wx0 p00 + wx1 p01) + wy1 (wx0 p10 + wx1 p11) + 2^21) >> 22.
struct BilinearTap {
  int64_t i0 = 0, i1 = 0;
  int32_t w1 = 0;
};
BilinearTap bilinear_tap(int64_t in, double scale, double shift, int64_t d);
// LibreYOLO's resized size of an h x w image for a longest side `target`: ratio
// min(target / h, target / w), sides int(side * ratio), at least 1.
struct FittedSize {
  double ratio = 1.0;
  int64_t height = 0, width = 0;
};
FittedSize fitted_size(int64_t h, int64_t w, int target);
// Resize so the longer side becomes `target` (sizes truncated with int(), at least 1),
// as LibreYOLO's load_resized_img does. Returns the ratio used via *ratio if given, and the
// input itself (no copy) when the size already matches.
torch::Tensor resize_longest(const torch::Tensor& hwc, int target, double* ratio = nullptr);
// How an image becomes a network's square S x S input. Letterbox: scaled by min(S/h, S/w) (sides
// as fitted_size gives them) into the top-left corner, the rest filled with the pad value. Stretch:
// resized to S x S, each axis by its own scale (no padding).
enum class Fit { Letterbox, Stretch };
const char* fit_name(Fit fit);
// Where an h x w image lands in the S x S input: the content's size and each axis' scale (input
// pixels per image pixel: a box maps by x * sx, y * sy, and back by dividing).
struct FitBox {
  int64_t width = 0, height = 0;
  double sx = 1.0, sy = 1.0;
};
FitBox fit_box(int64_t h, int64_t w, int size, Fit fit);
// The image fitted into an S x S x C canvas at `out` (size * size * C bytes, e.g. one slot of a
// batch allocated once), pad value `pad` outside the content; *box receives the geometry.
void fit_into(const torch::Tensor& hwc, int size, Fit fit, uint8_t* out, FitBox* box = nullptr, uint8_t pad = 114);
torch::Tensor fit_image(const torch::Tensor& hwc, int size, Fit fit, FitBox* box = nullptr, uint8_t pad = 114);

// Fit::Letterbox of the above, with the ratio min(S/h, S/w) in *ratio.
torch::Tensor letterbox_topleft(const torch::Tensor& hwc, int size, double* ratio = nullptr,
                                uint8_t pad = 114);
void letterbox_topleft_into(const torch::Tensor& hwc, int size, uint8_t* out, double* ratio = nullptr,
                            uint8_t pad = 114);

}  // namespace libreyolo::ops
