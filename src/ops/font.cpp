#include "ops/font.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <type_traits>

#include "core/env.hpp"
#include "core/log.hpp"

#ifdef LIBREYOLO_FREETYPE
#include <dlfcn.h>
#include <ft2build.h>
#include FT_FREETYPE_H
#endif

namespace libreyolo::ops {

std::vector<uint32_t> utf8_code_points(const std::string& utf8) {
  std::vector<uint32_t> out;
  const auto* s = reinterpret_cast<const unsigned char*>(utf8.data());
  const size_t n = utf8.size();
  for (size_t i = 0; i < n;) {
    const unsigned char b = s[i];
    int len = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
    uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      ok = (s[i + k] & 0xC0) == 0x80;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not characters.
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    out.push_back(ok ? cp : 0xFFFD);
    i += ok ? static_cast<size_t>(len) : 1;
  }
  return out;
}

int truetype_pixel_size(int scale) { return 8 * std::max(scale, 1) + 1; }

#ifdef LIBREYOLO_FREETYPE
namespace {

// FreeType's entry points, from the library loaded at run time (no link-time dependency).
struct FreeTypeApi {
  decltype(&FT_Init_FreeType) init = nullptr;
  decltype(&FT_New_Face) new_face = nullptr;
  decltype(&FT_Set_Pixel_Sizes) set_pixel_sizes = nullptr;
  decltype(&FT_Get_Char_Index) char_index = nullptr;
  decltype(&FT_Load_Glyph) load_glyph = nullptr;
  decltype(&FT_Render_Glyph) render_glyph = nullptr;
};

struct Glyph {
  int left = 0, top = 0, width = 0, rows = 0, advance = 0;
  std::vector<uint8_t> coverage;
};

// One face for the process; glyphs rendered once per (size, code point). FreeType's objects are
// not for concurrent use: every call holds the mutex.
class Face {
 public:
  static Face& get() {
    static Face f;
    return f;
  }
  bool ok() const { return face_ != nullptr; }
  const std::string& path() const { return path_; }

  std::optional<std::pair<int, int>> extent(const std::vector<uint32_t>& cps, int px) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!face_ || !size(px)) return std::nullopt;
    int w = 0;
    for (uint32_t cp : cps) w += glyph(cp, px).advance;
    return std::make_pair(w, line_height_);
  }

  std::optional<TextMask> render(const std::vector<uint32_t>& cps, int px) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!face_ || !size(px)) return std::nullopt;
    TextMask m;
    for (uint32_t cp : cps) m.width += glyph(cp, px).advance;
    m.height = line_height_;
    m.alpha.assign(static_cast<size_t>(m.width) * m.height, 0);
    int pen = 0;
    for (uint32_t cp : cps) {
      const Glyph& g = glyph(cp, px);
      for (int r = 0; r < g.rows; ++r) {
        const int y = ascender_ - g.top + r;
        if (y < 0 || y >= m.height) continue;
        for (int c = 0; c < g.width; ++c) {
          const int x = pen + g.left + c;
          if (x < 0 || x >= m.width) continue;
          uint8_t& a = m.alpha[static_cast<size_t>(y) * m.width + x];
          a = std::max(a, g.coverage[static_cast<size_t>(r) * g.width + c]);
        }
      }
      pen += g.advance;
    }
    return m;
  }

 private:
  Face() {
    void* lib = dlopen("libfreetype.so.6", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      fallback("libfreetype.so.6 could not be loaded (Debian: apt install libfreetype6)");
      return;
    }
    auto sym = [&](auto& fn, const char* name) { fn = reinterpret_cast<std::decay_t<decltype(fn)>>(dlsym(lib, name)); };
    sym(api_.init, "FT_Init_FreeType");
    sym(api_.new_face, "FT_New_Face");
    sym(api_.set_pixel_sizes, "FT_Set_Pixel_Sizes");
    sym(api_.char_index, "FT_Get_Char_Index");
    sym(api_.load_glyph, "FT_Load_Glyph");
    sym(api_.render_glyph, "FT_Render_Glyph");
    if (!api_.init || !api_.new_face || !api_.set_pixel_sizes || !api_.char_index || !api_.load_glyph ||
        !api_.render_glyph) {
      fallback("libfreetype.so.6 lacks an entry point this build uses");
      return;
    }
    if (api_.init(&library_) != 0) {
      fallback("FreeType did not initialise");
      return;
    }
    std::vector<std::string> candidates;
    if (const char* f = env_get("LIBREYOLO_FONT"); f && *f) candidates.emplace_back(f);
    for (const char* p : {"/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/dejavu/DejaVuSans.ttf",
                          "/usr/share/fonts/TTF/DejaVuSans.ttf", "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
                          "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
                          "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
                          "/usr/share/fonts/truetype/freefont/FreeSans.ttf"})
      candidates.emplace_back(p);
    for (const auto& p : candidates) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(p, ec)) continue;
      if (api_.new_face(library_, p.c_str(), 0, &face_) == 0) {
        path_ = p;
        return;
      }
      face_ = nullptr;
    }
    fallback("no TrueType sans font found (Debian: apt install fonts-dejavu-core, or set LIBREYOLO_FONT)");
  }

  void fallback(const std::string& why) {
    face_ = nullptr;
    log_info("Text in pictures is drawn in the built-in bitmap font: " + why);
  }

  bool size(int px) {
    if (px == px_) return true;
    if (api_.set_pixel_sizes(face_, 0, static_cast<FT_UInt>(px)) != 0) return false;
    px_ = px;
    ascender_ = static_cast<int>(face_->size->metrics.ascender >> 6);
    line_height_ = ascender_ - static_cast<int>(face_->size->metrics.descender >> 6);
    return true;
  }

  const Glyph& glyph(uint32_t cp, int px) {
    const uint64_t key = (static_cast<uint64_t>(px) << 32) | cp;
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    Glyph g;
    FT_UInt index = api_.char_index(face_, cp);
    if (index == 0 && cp != 0xFFFD) index = api_.char_index(face_, 0xFFFD);
    if (api_.load_glyph(face_, index, FT_LOAD_DEFAULT) == 0 &&
        api_.render_glyph(face_->glyph, FT_RENDER_MODE_NORMAL) == 0) {
      const FT_GlyphSlot s = face_->glyph;
      g.left = s->bitmap_left;
      g.top = s->bitmap_top;
      g.width = static_cast<int>(s->bitmap.width);
      g.rows = static_cast<int>(s->bitmap.rows);
      g.advance = static_cast<int>(std::lround(s->advance.x / 64.0));
      g.coverage.resize(static_cast<size_t>(g.width) * g.rows);
      for (int r = 0; r < g.rows; ++r)
        std::copy_n(s->bitmap.buffer + static_cast<ptrdiff_t>(r) * s->bitmap.pitch, g.width,
                    g.coverage.begin() + static_cast<ptrdiff_t>(r) * g.width);
    }
    return cache_.emplace(key, std::move(g)).first->second;
  }

  std::mutex mu_;
  FreeTypeApi api_;
  FT_Library library_ = nullptr;
  FT_Face face_ = nullptr;
  std::string path_;
  int px_ = 0, ascender_ = 0, line_height_ = 0;
  std::map<uint64_t, Glyph> cache_;
};

}  // namespace

bool truetype_built() { return true; }
bool truetype_text() { return Face::get().ok(); }
std::string truetype_font_path() { return Face::get().path(); }
std::optional<std::pair<int, int>> truetype_extent(const std::string& utf8, int scale) {
  return Face::get().extent(utf8_code_points(utf8), truetype_pixel_size(scale));
}
std::optional<TextMask> truetype_mask(const std::string& utf8, int scale) {
  return Face::get().render(utf8_code_points(utf8), truetype_pixel_size(scale));
}
#else
bool truetype_built() { return false; }
bool truetype_text() {
  static const bool said = [] {
    log_info("Text in pictures is drawn in the built-in bitmap font: this build has no FreeType headers");
    return true;
  }();
  (void)said;
  return false;
}
std::string truetype_font_path() { return ""; }
std::optional<std::pair<int, int>> truetype_extent(const std::string&, int) { return std::nullopt; }
std::optional<TextMask> truetype_mask(const std::string&, int) { return std::nullopt; }
#endif

}  // namespace libreyolo::ops
