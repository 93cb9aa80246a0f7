#include "io/io_detail.hpp"

#include "core/log.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::io::detail {

bool valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t k = 0;
  while (k < n) {
    const unsigned char c = p[k];
    size_t extra;
    if (c < 0x80) {
      ++k;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      extra = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      extra = 2;
    } else if (c >= 0xF0 && c <= 0xF4) {
      extra = 3;
    } else {
      return false;
    }
    if (k + extra >= n) return false;
    for (size_t e = 1; e <= extra; ++e) {
      if ((p[k + e] & 0xC0) != 0x80) return false;
    }
    // Overlong three/four-byte forms and code points above U+10FFFF. Encoded surrogates are
    // let through: Python writes them with 'surrogatepass'.
    if (c == 0xE0 && p[k + 1] < 0xA0) return false;
    if (c == 0xF0 && p[k + 1] < 0x90) return false;
    if (c == 0xF4 && p[k + 1] > 0x8F) return false;
    k += extra + 1;
  }
  return true;
}

std::string printable(const std::string& s, size_t max_len) {
  std::string out;
  for (char ch : s) {
    if (out.size() >= max_len) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(ch);
    out += (c >= 0x20 && c < 0x7F) ? ch : '?';
  }
  return out;
}

void throw_corrupt(const std::string& name, const std::string& what) {
  throw ModelError(strfmt("checkpoint '%s' is corrupt: %s", name.c_str(), what.c_str()),
                   "The file may be truncated or damaged; save or download it again.");
}

}  // namespace libreyolo::io::detail
