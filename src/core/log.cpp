#include "core/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <vector>

namespace libreyolo {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::Info)};
std::mutex g_mutex;

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::Debug: return "DEBUG";
    case LogLevel::Info: return "INFO";
    case LogLevel::Warning: return "WARNING";
    case LogLevel::Error: return "ERROR";
    default: return "";
  }
}
const char* level_colour(LogLevel l) {
  switch (l) {
    case LogLevel::Debug: return "\033[2m";
    case LogLevel::Warning: return "\033[33m";
    case LogLevel::Error: return "\033[31m";
    default: return "";
  }
}
}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void log_message(LogLevel level, const std::string& message) {
  if (static_cast<int>(level) < g_level.load()) return;
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
  static const bool tty = isatty(fileno(stderr));
  std::lock_guard<std::mutex> lock(g_mutex);
  const char* colour = tty ? level_colour(level) : "";
  std::fprintf(stderr, "%s%s | %-8s | %s%s\n", colour, stamp, level_name(level), message.c_str(),
               (tty && *colour) ? "\033[0m" : "");
  std::fflush(stderr);
}

std::string strfmt(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string out;
  if (n > 0) {
    std::vector<char> buf(static_cast<size_t>(n) + 1);
    std::vsnprintf(buf.data(), buf.size(), fmt, ap2);
    out.assign(buf.data(), static_cast<size_t>(n));
  }
  va_end(ap2);
  return out;
}

}  // namespace libreyolo
