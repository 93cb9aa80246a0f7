// The environment variables the product reads, listed in one place (env_vars(), core/env.cpp) with
// what each changes; docs/cli.md's tables show them to users. The project's fast paths are on by
// default and a variable turns one off for comparisons (LIBREYOLO_FUSED_CONV=0, ...); a few set
// places and measurement knobs. Reading a variable that is not in the list is a programming error.
#pragma once
#include <atomic>
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

// A fast path's run-time switch: on unless its listed variable turns it off (env_switch_on), read
// at the first load(); the API and tests may store() another value later. Constant-initialised, so
// any static initialiser may use one.
class EnvFlag {
 public:
  explicit constexpr EnvFlag(const char* name) : name_(name) {}
  bool load() const {
    const int v = state_.load(std::memory_order_relaxed);
    return v >= 0 ? v != 0 : first_load();
  }
  void store(bool on) { state_.store(on ? 1 : 0); }

 private:
  bool first_load() const;
  const char* name_;
  mutable std::atomic<int> state_{-1};
};

}  // namespace libreyolo
