// libFuzzer target for the checkpoint reader (see checkpoint_input.hpp for the input format).
// Every input must load or be refused with ModelError; crashes, sanitizer reports, leaks and
// any other exception are findings.
#include <cstddef>
#include <cstdint>

#include "checkpoint_input.hpp"
#include "core/log.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  libreyolo::set_log_level(libreyolo::LogLevel::Error);  // checkpoint warnings would flood the output
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string archive;
  try {
    archive = libreyolo::fuzz::archive_from_input(data, size);
  } catch (const c10::Error&) {
    return 0;  // the test harness could not wrap this input (not the reader's business)
  }
  libreyolo::fuzz::exercise_checkpoint(archive);
  return 0;
}
