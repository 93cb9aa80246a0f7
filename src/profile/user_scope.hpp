// What the two profilers (training window, inference loop) share: a user scope in the trace and a
// millisecond clock.
#pragma once
#include <ATen/record_function.h>

#include <chrono>
#include <memory>
#include <string>

namespace libreyolo::profile {

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A user scope (ProfilerStep#i, step/<phase>) in the trace, open from open() (or construction
// with a name) until close() (or destruction), also across calls, which RECORD_USER_SCOPE's block
// scope cannot; nothing when no profiler is on.
class UserScope {
 public:
  UserScope() = default;
  explicit UserScope(const std::string& name) { open(name); }
  UserScope(const UserScope&) = delete;
  UserScope& operator=(const UserScope&) = delete;
  ~UserScope() { close(); }

  void open(const std::string& name) {
    rf_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    if (rf_->isActive())
      rf_->before(name);
    else
      rf_.reset();
  }
  void close() {
    if (!rf_) return;
    rf_->end();
    rf_.reset();
  }

 private:
  std::unique_ptr<at::RecordFunction> rf_;
};

}  // namespace libreyolo::profile
