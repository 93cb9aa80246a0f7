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

}  // namespace libreyolo
