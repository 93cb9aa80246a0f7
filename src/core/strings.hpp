// Small ASCII string helpers shared by option parsing, device names, model names and the zip
// reader. Locale-independent: only the bytes A-Z and the C whitespace set are treated specially.
#pragma once
#include <string>

namespace libreyolo {

// `s` with ASCII upper-case letters turned to lower case (other bytes unchanged).
std::string lower(std::string s);
// `s` without leading and trailing whitespace (space, \t, \n, \v, \f, \r).
std::string trim(const std::string& s);
// True when `s` begins with `prefix`.
bool starts_with(const std::string& s, const std::string& prefix);
// "1 epoch", "3 epochs", "1 batch", "2 batches": the count and the noun, `many` (default: `one`
// and an "s") unless the count is 1.
std::string count_of(long long n, const std::string& one, const std::string& many = "");
// A duration for people: "42.3 s", "4 min 05 s", "2 h 07 min".
std::string duration_text(double seconds);
// The columns UTF-8 text takes in a terminal: East Asian wide and fullwidth characters and emoji
// take 2, combining marks 0, everything else 1 (an invalid byte counts as one column).
int display_width(const std::string& utf8);
// `s` right-aligned in `width` display columns (as printf's %*s, counting columns, not bytes).
std::string pad_left(const std::string& s, int width);

}  // namespace libreyolo
