// Exception types with the exit codes the CLI maps them to (LibreYOLO's convention):
// 1 runtime, 2 usage, 3 data, 4 model; 130 interrupted (Ctrl-C), as shells report SIGINT.
#pragma once
#include <stdexcept>
#include <string>

namespace libreyolo {

class Error : public std::runtime_error {
 public:
  Error(int exit_code, std::string code, const std::string& message, std::string suggestion = "")
      : std::runtime_error(message),
        exit_code_(exit_code),
        code_(std::move(code)),
        suggestion_(std::move(suggestion)) {}
  int exit_code() const noexcept { return exit_code_; }
  // Machine-readable error code, e.g. "config_unknown_key", "data_not_found".
  const std::string& code() const noexcept { return code_; }
  const std::string& suggestion() const noexcept { return suggestion_; }

 private:
  int exit_code_;
  std::string code_;
  std::string suggestion_;
};

// Bad arguments, unknown keys, values out of range (exit 2).
struct UsageError : Error {
  explicit UsageError(const std::string& message, std::string suggestion = "",
                      std::string code = "config_type_error")
      : Error(2, std::move(code), message, std::move(suggestion)) {}
};

// Missing or unusable dataset / source files (exit 3).
struct DataError : Error {
  explicit DataError(const std::string& message, std::string suggestion = "",
                     std::string code = "data_invalid")
      : Error(3, std::move(code), message, std::move(suggestion)) {}
};

// Missing, corrupt, hostile or mismatching model/checkpoint (exit 4).
struct ModelError : Error {
  explicit ModelError(const std::string& message, std::string suggestion = "",
                      std::string code = "model_load_failed")
      : Error(4, std::move(code), message, std::move(suggestion)) {}
};

// Anything that went wrong while running (exit 1).
struct RuntimeError : Error {
  explicit RuntimeError(const std::string& message, std::string suggestion = "",
                        std::string code = "io_error")
      : Error(1, std::move(code), message, std::move(suggestion)) {}
};

// Training stopped by SIGINT/SIGTERM after saving what could be saved (exit 130).
struct InterruptedError : Error {
  explicit InterruptedError(const std::string& message, std::string suggestion = "")
      : Error(130, "interrupted", message, std::move(suggestion)) {}
};

}  // namespace libreyolo
