#include "core/interrupt.hpp"

#include <atomic>
#include <csignal>
#include <mutex>

namespace libreyolo {

namespace {
std::atomic<int> g_signal{0};
std::mutex g_mutex;
int g_depth = 0;
struct sigaction g_old_int, g_old_term;

void on_signal(int sig) {
  if (sig == SIGINT && g_signal.load() != 0) {
    // Second Ctrl-C: the default action, at once.
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  g_signal.store(sig);
}
}  // namespace

InterruptGuard::InterruptGuard() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_depth++ > 0) return;
  g_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

InterruptGuard::~InterruptGuard() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_depth > 0) return;
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

bool interrupt_requested() { return g_signal.load() != 0; }
int interrupt_signal() { return g_signal.load(); }
void clear_interrupt() { g_signal.store(0); }
void request_interrupt(int sig) { g_signal.store(sig); }

}  // namespace libreyolo
