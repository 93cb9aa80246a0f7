// The environment variables the product reads, listed in one place (env_vars(), core/env.cpp) with
// what each changes; docs/cli.md's tables show them to users. The project's fast paths are on by
// default and a variable turns one off for comparisons (LIBREYOLO_FUSED_CONV=0, ...); a few set
// places and measurement knobs. Reading a variable that is not in the list is a programming error.
#pragma once
#include <vector>

namespace libreyolo {

struct EnvVar {
  const char* name;
  const char* effect;  // what it changes, and its default
};

// Every LIBREYOLO_* variable the product reads.
const std::vector<EnvVar>& env_vars();

// The value of a listed variable (null when unset). Throws std::logic_error for a name that is
// not in env_vars().
const char* env_get(const char* name);

// True unless the listed variable `name` is set to 0, false or off.
bool env_switch_on(const char* name);

// The integer in the listed variable `name` when it is set and within [lo, hi], else `fallback`
// (measurement knobs such as LIBREYOLO_WGRAD_LAG).
int env_int(const char* name, int lo, int hi, int fallback);

}  // namespace libreyolo
