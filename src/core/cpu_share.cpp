#include "core/cpu_share.hpp"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace libreyolo {

namespace fs = std::filesystem;

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

namespace {

// A registration's file is "<pid>.<n>"; its process runs when signal 0 reaches it (EPERM: it runs
// under another user).
bool alive(const std::string& name) {
  const auto dot = name.find('.');
  char* end = nullptr;
  const long pid = std::strtol(name.substr(0, dot).c_str(), &end, 10);
  if (pid <= 0 || (end && *end)) return false;
  return kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

}  // namespace

CpuShare::CpuShare(int cores, std::string folder) : cores_(std::max(1, cores)), folder_(std::move(folder)) {
  std::error_code ec;
  if (folder_.empty()) folder_ = (fs::temp_directory_path(ec) / ("libreyolo-cpu-" + std::to_string(getuid()))).string();
  fs::create_directories(folder_, ec);
  static std::atomic<int> counter{0};
  file_ = (fs::path(folder_) / (std::to_string(getpid()) + "." + std::to_string(counter++))).string();
  std::ofstream(file_) << cores_ << "\n";  // a registration that cannot be written only counts itself
}

CpuShare::~CpuShare() {
  std::error_code ec;
  fs::remove(file_, ec);
}

int CpuShare::trainings() const {
  int n = 0;
  bool self = false;
  std::error_code ec;
  for (fs::directory_iterator it(folder_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->path().string() == file_) {
      self = true;
      ++n;
    } else if (alive(name)) {
      ++n;
    } else {
      std::error_code rm;
      fs::remove(it->path(), rm);  // left by a process that ended without unregistering
    }
  }
  return self ? n : n + 1;
}

int CpuShare::cores() const { return std::max(1, cores_ / trainings()); }

}  // namespace libreyolo
