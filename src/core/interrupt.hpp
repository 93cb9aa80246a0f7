// Ctrl-C (SIGINT) and SIGTERM during long work: the first one only raises a flag that the work
// polls at safe points (the train loop after each step); a second SIGINT ends the process as usual.
#pragma once

namespace libreyolo {

class InterruptGuard {
 public:
  InterruptGuard();   // installs the handlers (nested guards share them)
  ~InterruptGuard();  // restores the previous handlers
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
};

bool interrupt_requested();
int interrupt_signal();    // the signal that raised the flag, 0 if none
void clear_interrupt();
void request_interrupt(int sig);  // what the handler does; also for tests

}  // namespace libreyolo
