#include "core/crash_report.hpp"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace libreyolo {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV (invalid memory access)";
    case SIGBUS: return "SIGBUS (bus error)";
    case SIGILL: return "SIGILL (illegal instruction)";
    case SIGFPE: return "SIGFPE (arithmetic fault)";
    case SIGABRT: return "SIGABRT (abort)";
    default: return "fatal signal";
  }
}

void say(const char* s) {
  for (size_t n = std::strlen(s); n > 0;) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

// Only async-signal-safe calls (write, backtrace after its first use, raise). The handler was
// installed with SA_RESETHAND: re-raising ends the process with the signal's default action.
void on_fatal_signal(int sig) {
  static std::atomic<bool> busy{false};
  if (!busy.exchange(true)) {  // a second thread crashing meanwhile goes straight to the default
    say("\nlibreyolo: fatal signal ");
    say(signal_name(sig));
    say("; call stack of the thread it hit (please include it in a bug report):\n");
    void* frames[64];
    const int n = ::backtrace(frames, 64);
    ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  }
  ::raise(sig);
}

}  // namespace

void install_crash_report() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  // backtrace() loads its unwinder on first use (which allocates): do that now, not in the handler.
  void* warm[2];
  ::backtrace(warm, 2);
  // Its own stack, so that a stack overflow can still be reported.
  static char alt_stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  ::sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_ONSTACK;
  for (int sig : kSignals) ::sigaction(sig, &sa, nullptr);
}

}  // namespace libreyolo
