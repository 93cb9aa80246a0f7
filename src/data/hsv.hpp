// HSV jitter in OpenCV's 8-bit HSV space (H in [0, 180), S and V in [0, 255]), on interleaved
// RGB pixels: the forward conversion in OpenCV's integer fixed point, the inverse in single
// precision, so that a shift gives what OpenCV gives on the same picture in BGR order.
#pragma once
#include <algorithm>
#include <cstdint>

namespace libreyolo::data {

struct HsvGains {
  int h = 0, s = 0, v = 0;
};

// Per-pixel conversions over n pixels of interleaved RGB / HSV (usable in place).
void rgb_to_hsv(const uint8_t* rgb, uint8_t* hsv, int64_t n);
void hsv_to_rgb(const uint8_t* hsv, uint8_t* rgb, int64_t n);
// Shifts H (mod 180) and clamps S and V, through HSV and back. `src` may equal `dst`; with
// `reverse` the source pixels are read right to left (a fused horizontal flip; then src must
// not equal dst).
void shift_hsv(const uint8_t* src, uint8_t* dst, int64_t n, HsvGains gains, bool reverse = false);

// Rounds to nearest, ties to even (what OpenCV's saturate_cast does), clamped to [0, 255], for
// |x| < 2^22. The build has no -ffast-math, so the addition and subtraction are not folded.
inline uint8_t round_u8(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  const float r = (x + kMagic) - kMagic;
  return static_cast<uint8_t>(std::min(255.0f, std::max(0.0f, r)));
}

}  // namespace libreyolo::data
