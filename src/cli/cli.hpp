// The `libreyolo` command line, in LibreYOLO's grammar:
//   libreyolo [detect] <command> key=value ... [--key value] [--flag | --no-flag | flag]
// Exit codes: 0 ok, 1 runtime, 2 usage, 3 data, 4 model.
#pragma once
#include <exception>
#include <libreyolo/errors.hpp>
#include <iosfwd>
#include <string>
#include <vector>

#include "core/options.hpp"

namespace libreyolo::cli {

struct ParsedArgs {
  std::string command;
  Kwargs kwargs;     // key=value pairs in order (keys normalised: dashes -> underscores)
  bool json = false;
  bool quiet = false;
  bool verbose = false;
  bool help = false;
  std::vector<std::string> positional;
  // The task word before the command ("detect" or "classify"; "" when none): the model must do it.
  std::string task;
};

// Splits argv (without the program name). `bool_keys` are the command's boolean options, so
// that a bare `flag`, `--flag` and `--no-flag` become flag=true/false. Throws UsageError.
// With `known_keys` (the command's option names) given, a `--word` that is neither one of them nor
// a global flag is an unknown flag (config_unknown_key, with a "did you mean" among the keys and
// --help) instead of an option waiting for its value; `command` names the command in the message.
ParsedArgs parse_args(const std::vector<std::string>& args, const std::vector<std::string>& bool_keys,
                      const std::vector<std::string>& known_keys = {}, const std::string& command = "");

// `libreyolo profile run <data> [--options]` (cli/profile_run.cpp). Throws libreyolo::Error.
int cmd_profile_run(const std::vector<std::string>& args, std::ostream& out);
// `libreyolo profile infer [source]`: the inference profiler (cli/profile_run.cpp).
int cmd_profile_infer(const std::vector<std::string>& args, std::ostream& out);

// Runs a command line; output to `out` (results) and `err` (messages). Returns the exit code.
int run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// What the CLI reports for an exception that is not one of the library's errors: GPU memory
// (c10::OutOfMemoryError) is cuda_oom, host memory (std::bad_alloc) out_of_memory, other LibTorch
// errors and the rest io_error, each with its text.
RuntimeError error_for_exception(std::exception_ptr e);

}  // namespace libreyolo::cli
