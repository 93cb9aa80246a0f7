#include <iostream>
#include <string>
#include <vector>

#include "cli/cli.hpp"
#include "core/background.hpp"
#include "core/crash_report.hpp"

int main(int argc, char** argv) {
  libreyolo::install_crash_report();
  std::vector<std::string> args(argv + 1, argv + argc);
  const int code = libreyolo::cli::run(args, std::cout, std::cerr);
  libreyolo::stop_background_work();  // before the static objects go (core/background.hpp)
  return code;
}
