#include <gtest/gtest.h>
#include <signal.h>

#include "core/crash_report.hpp"

namespace {

// A crash through the installed handler: the signal is named, a call stack follows, and the process
// still ends by the same signal (exit status and core dumps as without the handler).
[[noreturn]] void crash_with(int sig) {
  libreyolo::install_crash_report();
  libreyolo::install_crash_report();  // idempotent
  ::raise(sig);
  std::abort();
}

}  // namespace

TEST(CrashReport, ASegfaultNamesItselfPrintsTheStackAndStillEndsBySIGSEGV) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(crash_with(SIGSEGV), ::testing::KilledBySignal(SIGSEGV),
              "libreyolo: fatal signal SIGSEGV \\(invalid memory access\\); call stack of the thread it hit");
}

TEST(CrashReport, AnAbortIsReportedAndEndsBySIGABRT) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(crash_with(SIGABRT), ::testing::KilledBySignal(SIGABRT), "fatal signal SIGABRT");
}

TEST(CrashReport, TheStackNamesTheFramesOfTheCrashingCall) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // backtrace_symbols_fd writes one line per frame: the raise() inside the handler's caller
  // chain shows up as a line with a bracketed address.
  EXPECT_EXIT(crash_with(SIGBUS), ::testing::KilledBySignal(SIGBUS), "SIGBUS[^\n]*\n(.*\\[0x[0-9a-f]+\\]\n){3,}");
}
