#include "core/strings.hpp"

#include <cstdio>

#include <cctype>

namespace libreyolo {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t begin = 0, end = s.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(s[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  return s.substr(begin, end - begin);
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::string count_of(long long n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many.empty() ? one + "s" : many);
}

std::string duration_text(double seconds) {
  if (!(seconds >= 0)) seconds = 0;
  char buf[64];
  if (seconds < 60) {
    std::snprintf(buf, sizeof buf, "%.1f s", seconds);
  } else if (seconds < 3600) {
    const long long t = static_cast<long long>(seconds + 0.5);
    std::snprintf(buf, sizeof buf, "%lld min %02lld s", t / 60, t % 60);
  } else {
    const long long t = static_cast<long long>(seconds / 60 + 0.5);
    std::snprintf(buf, sizeof buf, "%lld h %02lld min", t / 60, t % 60);
  }
  return buf;
}

}  // namespace libreyolo
