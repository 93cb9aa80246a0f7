#include "data/hsv.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <libreyolo/errors.hpp>

namespace libreyolo::data {
namespace {

// ---- HSV ---------------------------------------------------------------------------------
// The forward conversion is OpenCV's 8-bit fixed-point one: S and H are scaled through
// reciprocal tables with 12 fraction bits and rounded by adding half before the shift.
constexpr int kHsvShift = 12;

struct HsvTables {
  int sdiv[256];  // round(255 * 2^12 / v)
  int hdiv[256];  // round(180 * 2^12 / (6 * diff))
};

const HsvTables& hsv_tables() {
  static const HsvTables t = [] {
    HsvTables x{};
    for (int i = 1; i < 256; ++i) {
      x.sdiv[i] = static_cast<int>(std::lround((255 << kHsvShift) / static_cast<double>(i)));
      x.hdiv[i] = static_cast<int>(std::lround((180 << kHsvShift) / (6.0 * i)));
    }
    return x;
  }();
  return t;
}

inline void pixel_to_hsv(int r, int g, int b, const HsvTables& t, int& h, int& s, int& v) {
  v = std::max(r, std::max(g, b));
  const int diff = v - std::min(r, std::min(g, b));
  s = (diff * t.sdiv[v] + (1 << (kHsvShift - 1))) >> kHsvShift;
  int hh;
  if (v == r)
    hh = g - b;
  else if (v == g)
    hh = b - r + 2 * diff;
  else
    hh = r - g + 4 * diff;
  // Arithmetic shift = floor division, also for the negative hues of the red sector.
  hh = (hh * t.hdiv[diff] + (1 << (kHsvShift - 1))) >> kHsvShift;
  h = hh < 0 ? hh + 180 : hh;
}


// The inverse, in single precision like OpenCV's 8-bit path: sector of the hue wheel and the
// four levels v, v(1-s), v(1-s f), v(1-s(1-f)), each channel picking one of them. Per-hue
// sector and fraction come from a table; s = 0 needs no branch (all four levels equal v).
struct HueEntry {
  float frac;
  uint8_t pick[3];  // level index of r, g, b
};

const HueEntry* hue_table() {
  static const std::array<HueEntry, 180> table = [] {
    // Levels: 0 = v, 1 = v(1-s), 2 = v(1-s f), 3 = v(1-s(1-f)).
    constexpr uint8_t kPick[6][3] = {{0, 3, 1}, {2, 0, 1}, {1, 0, 3},
                                     {1, 2, 0}, {3, 1, 0}, {0, 1, 2}};
    std::array<HueEntry, 180> t{};
    for (int h = 0; h < 180; ++h) {
      float hf = h * (6.0f / 180.0f);
      int sector = static_cast<int>(std::floor(hf));
      hf -= sector;
      if (sector < 0 || sector >= 6) sector = 0, hf = 0;
      t[h].frac = hf;
      for (int c = 0; c < 3; ++c) t[h].pick[c] = kPick[sector][c];
    }
    return t;
  }();
  return table.data();
}

inline void hsv_to_pixel(int h, int s, int v, const HueEntry* hues, uint8_t* rgb) {
  const float sf = s * (1.0f / 255.0f);
  const float vf = v * (1.0f / 255.0f);
  const HueEntry& e = hues[h];
  const float level[4] = {vf, vf * (1.0f - sf), vf * (1.0f - sf * e.frac),
                          vf * (1.0f - sf * (1.0f - e.frac))};
  rgb[0] = round_u8(level[e.pick[0]] * 255.0f);
  rgb[1] = round_u8(level[e.pick[1]] * 255.0f);
  rgb[2] = round_u8(level[e.pick[2]] * 255.0f);
}
}  // namespace

// ---- HSV ---------------------------------------------------------------------------------
void rgb_to_hsv(const uint8_t* rgb, uint8_t* hsv, int64_t n) {
  const HsvTables& t = hsv_tables();
  for (int64_t i = 0; i < n; ++i) {
    int h, s, v;
    pixel_to_hsv(rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2], t, h, s, v);
    hsv[3 * i] = static_cast<uint8_t>(h);
    hsv[3 * i + 1] = static_cast<uint8_t>(s);
    hsv[3 * i + 2] = static_cast<uint8_t>(v);
  }
}

void hsv_to_rgb(const uint8_t* hsv, uint8_t* rgb, int64_t n) {
  const HueEntry* hues = hue_table();
  for (int64_t i = 0; i < n; ++i) {
    if (hsv[3 * i] >= 180) throw UsageError("hsv_to_rgb: hue must be < 180");
    hsv_to_pixel(hsv[3 * i], hsv[3 * i + 1], hsv[3 * i + 2], hues, rgb + 3 * i);
  }
}

namespace {

__attribute__((always_inline)) inline int32_t bits(float x) {
  int32_t i;
  std::memcpy(&i, &x, sizeof i);
  return i;
}
__attribute__((always_inline)) inline float from_bits(int32_t i) {
  float x;
  std::memcpy(&x, &i, sizeof x);
  return x;
}

// The whole shift for one block of de-interleaved pixels, branch-free so that the compiler can
// vectorise it: the same integer forward conversion and single-precision inverse as
// pixel_to_hsv / hsv_to_pixel (the tests check that they agree exactly), with the shifts done
// arithmetically instead of through tables. AVX-512 and AVX2 clones (gathers for the two
// reciprocal tables) are picked at run time where the CPU has them.
// No trapping math: otherwise GCC sinks the int-to-float conversions into branches it then
// cannot turn back into selects. An AVX-512 clone (16 lanes; about a third less time per image
// where the CPU has it) with contraction off: AVX-512 brings FMA, and fused multiply-adds would
// change the last bit of some levels (FusedHsvShiftEqualsConvertShiftConvertBack catches that).
__attribute__((target_clones("avx512f", "avx2", "default"), optimize("no-trapping-math", "fp-contract=off"))) void shift_hsv_block(
    int32_t* __restrict r, int32_t* __restrict g, int32_t* __restrict b, int m,
    const int32_t* __restrict sdiv, const int32_t* __restrict hdiv, int gh, int gs, int gv) {
  // Plain conditionals only: functions such as std::max are not inlined across the different
  // optimisation attributes.
  constexpr float kMagic = 12582912.0f;  // see round_u8
  for (int i = 0; i < m; ++i) {
    const int R = r[i], G = g[i], B = b[i];
    const int gb_max = G > B ? G : B, gb_min = G < B ? G : B;
    const int v = R > gb_max ? R : gb_max;
    const int diff = v - (R < gb_min ? R : gb_min);
    const int s = (diff * sdiv[v] + (1 << (kHsvShift - 1))) >> kHsvShift;
    int h = R - G + 4 * diff;
    h = v == G ? B - R + 2 * diff : h;
    h = v == R ? G - B : h;
    h = (h * hdiv[diff] + (1 << (kHsvShift - 1))) >> kHsvShift;
    h += h < 0 ? 180 : 0;

    int H = h + gh;  // gh in [0, 180)
    H -= H >= 180 ? 180 : 0;
    int S = s + gs, V = v + gv;
    S = S < 0 ? 0 : (S > 255 ? 255 : S);
    V = V < 0 ? 0 : (V > 255 ? 255 : V);

    const float sf = S * (1.0f / 255.0f);
    const float vf = V * (1.0f / 255.0f);
    const float hf = H * (6.0f / 180.0f);
    const int sec = static_cast<int>(hf);
    const float f = hf - sec;
    const float p = vf * (1.0f - sf);
    const float q = vf * (1.0f - sf * f);
    const float t = vf * (1.0f - sf * (1.0f - f));
    // Level of each channel per sector (r: v q p p t v, g: t v v q p p, b: p p t v v q) as
    // bit masks: plain selects get merged into one multi-way branch that blocks vectorising.
    const int32_t iv = bits(vf), ip = bits(p), iq = bits(q), it = bits(t);
    const int32_t m0 = -(sec == 0), m1 = -(sec == 1), m2 = -(sec == 2);
    const int32_t m3 = -(sec == 3), m4 = -(sec == 4), m5 = -(sec == 5);
    float out[3] = {from_bits(((m0 | m5) & iv) | (m1 & iq) | ((m2 | m3) & ip) | (m4 & it)),
                    from_bits(((m1 | m2) & iv) | (m3 & iq) | ((m4 | m5) & ip) | (m0 & it)),
                    from_bits(((m3 | m4) & iv) | (m5 & iq) | ((m0 | m1) & ip) | (m2 & it))};
    for (float& x : out) {
      x = (x * 255.0f + kMagic) - kMagic;  // round half to even, as round_u8
      x = x < 0.0f ? 0.0f : (x > 255.0f ? 255.0f : x);
    }
    r[i] = static_cast<int32_t>(out[0]);
    g[i] = static_cast<int32_t>(out[1]);
    b[i] = static_cast<int32_t>(out[2]);
  }
}

}  // namespace

void shift_hsv(const uint8_t* src, uint8_t* dst, int64_t n, HsvGains g, bool reverse) {
  static const std::array<std::array<int32_t, 256>, 2> tables = [] {
    const HsvTables& t = hsv_tables();
    std::array<std::array<int32_t, 256>, 2> x{};
    std::copy(t.sdiv, t.sdiv + 256, x[0].begin());
    std::copy(t.hdiv, t.hdiv + 256, x[1].begin());
    return x;
  }();
  const int gh = ((g.h % 180) + 180) % 180;
  constexpr int kBlock = 128;
  int32_t r[kBlock], gr[kBlock], b[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int m = static_cast<int>(std::min<int64_t>(kBlock, n - start));
    for (int i = 0; i < m; ++i) {
      const int64_t k = start + i;
      const uint8_t* p = src + 3 * (reverse ? n - 1 - k : k);
      r[i] = p[0];
      gr[i] = p[1];
      b[i] = p[2];
    }
    shift_hsv_block(r, gr, b, m, tables[0].data(), tables[1].data(), gh, g.s, g.v);
    uint8_t* d = dst + 3 * start;
    for (int i = 0; i < m; ++i) {
      d[3 * i] = static_cast<uint8_t>(r[i]);
      d[3 * i + 1] = static_cast<uint8_t>(gr[i]);
      d[3 * i + 2] = static_cast<uint8_t>(b[i]);
    }
  }
}

}  // namespace libreyolo::data
