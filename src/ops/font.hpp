// Text from a TrueType font: FreeType (libfreetype.so.6, loaded at run time) rasterises a sans
// font of the system (LIBREYOLO_FONT, else DejaVu Sans, Liberation Sans or FreeSans where Debian,
// Fedora or Arch put them) into anti-aliased coverage, UTF-8 decoded. Where the library or a font
// is missing, truetype_text() is false (said once in the log) and ops/draw's bitmap font draws.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace libreyolo::ops {

// A text's coverage in a width x height raster (row-major, 0 = none, 255 = full): the line box,
// ascender at the top row, descender at the bottom.
struct TextMask {
  int width = 0, height = 0;
  std::vector<uint8_t> alpha;
};

// Whether this build can draw TrueType text (it found FreeType's headers).
bool truetype_built();
// Whether text is drawn from a TrueType font (loads it on first use).
bool truetype_text();
// The font file in use ("" without one).
std::string truetype_font_path();

// The em size in pixels of text at `scale` (the bitmap font's scale: its capitals are 7 * scale
// pixels tall, about this font's at this size).
int truetype_pixel_size(int scale);

// Width (advances) and line height of `utf8` at `scale`; nullopt without a TrueType font.
std::optional<std::pair<int, int>> truetype_extent(const std::string& utf8, int scale);
// The rendered text; nullopt without a TrueType font. Bytes that are not UTF-8 draw as U+FFFD.
std::optional<TextMask> truetype_mask(const std::string& utf8, int scale);

// Code points of UTF-8 text; each byte of an invalid or truncated sequence is U+FFFD.
std::vector<uint32_t> utf8_code_points(const std::string& utf8);

}  // namespace libreyolo::ops
