// On/off switches (and integer knobs) read from the environment (LIBREYOLO_FUSED_CONV, LIBREYOLO_FOLD_BN, ...): the
// project's fast paths are on by default and an environment variable turns one off for comparisons.
#pragma once
#include <cstdlib>
#include <cstring>

namespace libreyolo {

// True unless the variable `name` is set to 0, false or off.
inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return !(v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "false") == 0 || std::strcmp(v, "off") == 0));
}

// The integer in the variable `name` when it is set and within [lo, hi], else `fallback`
// (measurement knobs such as LIBREYOLO_WGRAD_LAG).
inline int env_int(const char* name, int lo, int hi, int fallback) {
  const char* v = std::getenv(name);
  const int n = v ? std::atoi(v) : 0;
  return v && n >= lo && n <= hi ? n : fallback;
}

}  // namespace libreyolo
