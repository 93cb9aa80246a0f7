#include "core/options.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <libreyolo/errors.hpp>

#include "core/strings.hpp"

namespace libreyolo {

const char* option_type_name(OptionType t) {
  switch (t) {
    case OptionType::Int: return "int";
    case OptionType::Float: return "float";
    case OptionType::Bool: return "bool";
    case OptionType::String: return "str";
  }
  return "?";
}

bool parse_bool(const std::string& key, const std::string& value) {
  std::string v = lower(value);
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  throw UsageError("Invalid value for '" + key + "': '" + value + "' is not a valid boolean",
                   "Use " + key + "=true or " + key + "=false.");
}

long long parse_int(const std::string& key, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || errno != 0 || *end != '\0')
    throw UsageError("Invalid value for '" + key + "': '" + value + "' is not a valid integer");
  return v;
}

long long parse_int_in_range(const std::string& key, const std::string& value, long long lo, long long hi) {
  errno = 0;
  char* end = nullptr;
  std::strtoll(value.c_str(), &end, 10);
  const bool overflow = errno == ERANGE && !value.empty() && *end == '\0';
  const long long v = overflow ? 0 : parse_int(key, value);
  if (overflow || v < lo || v > hi)
    throw UsageError("Invalid value for '" + key + "': " + value + " is out of range (allowed: " +
                         std::to_string(lo) + " to " + std::to_string(hi) + ")",
                     "", "config_range_error");
  return v;
}

double parse_float(const std::string& key, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(value.c_str(), &end);
  if (value.empty() || errno != 0 || *end != '\0' || !std::isfinite(v))
    throw UsageError("Invalid value for '" + key + "': '" + value + "' is not a valid number");
  return v;
}

std::string format_option_value(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// Similarity in the spirit of difflib's ratio: 2 * matches / (len a + len b), with matches
// counted by the longest-common-subsequence, which ranks typos and transpositions sensibly.
static double similarity(const std::string& a, const std::string& b) {
  if (a.empty() && b.empty()) return 1.0;
  std::vector<std::vector<int>> dp(a.size() + 1, std::vector<int>(b.size() + 1, 0));
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j)
      dp[i][j] = a[i - 1] == b[j - 1] ? dp[i - 1][j - 1] + 1 : std::max(dp[i - 1][j], dp[i][j - 1]);
  return 2.0 * dp[a.size()][b.size()] / static_cast<double>(a.size() + b.size());
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  double best_score = 0.6;
  for (const auto& c : candidates) {
    double s = similarity(word, c);
    if (s >= best_score + 1e-12 || (best.empty() && s >= best_score)) {
      best = c;
      best_score = s;
    }
  }
  return best;
}

void throw_unknown_key(const std::string& key, const std::vector<std::string>& names,
                       const std::string& command) {
  std::string msg = "No such option: " + key;
  if (!command.empty()) msg += " (for '" + command + "')";
  std::string near = closest_match(key, names);
  // The hint goes into the message only (the CLI prints message and suggestion, so putting it
  // in both showed it twice); the suggestion says where the full list is.
  if (!near.empty()) msg += ". Did you mean '" + near + "'?";
  const std::string suggestion = "Run 'libreyolo " + (command.empty() ? std::string("<command>") : command) +
                                 " --help' to list the options.";
  throw UsageError(msg, suggestion, "config_unknown_key");
}

}  // namespace libreyolo
