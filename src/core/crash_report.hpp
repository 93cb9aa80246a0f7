// A fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) names itself and prints the call stack of
// the thread it hit on stderr, then ends the process as the signal would have (same status, core
// dump where enabled). Without it such a crash says only "Segmentation fault" through the shell.
#pragma once

namespace libreyolo {

// Installs the handlers (idempotent). Call early in a program's main().
void install_crash_report();

}  // namespace libreyolo
