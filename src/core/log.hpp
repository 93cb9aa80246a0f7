// Logging to stderr in LibreYOLO's format: "YYYY-mm-dd HH:MM:SS | LEVEL    | message".
#pragma once
#include <cstdarg>
#include <string>

namespace libreyolo {

enum class LogLevel { Debug = 10, Info = 20, Warning = 30, Error = 40, Quiet = 100 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, const std::string& message);

// printf-style formatting into a std::string.
std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

inline void log_debug(const std::string& m) { log_message(LogLevel::Debug, m); }
inline void log_info(const std::string& m) { log_message(LogLevel::Info, m); }
inline void log_warn(const std::string& m) { log_message(LogLevel::Warning, m); }
inline void log_error(const std::string& m) { log_message(LogLevel::Error, m); }

}  // namespace libreyolo
