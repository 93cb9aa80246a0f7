#include "core/paths.hpp"

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include <libreyolo/errors.hpp>

namespace fs = std::filesystem;

namespace libreyolo {

std::string make_run_dir(const std::string& project, const std::string& name, bool exist_ok) {
  std::error_code ec;
  const fs::path base = fs::path(project) / name;
  if (exist_ok) {
    fs::create_directories(base, ec);
    if (ec) throw RuntimeError("cannot create directory " + base.string() + ": " + ec.message());
    return base.string();
  }
  if (base.has_parent_path()) {
    fs::create_directories(base.parent_path(), ec);
    if (ec) throw RuntimeError("cannot create directory " + base.parent_path().string() + ": " + ec.message());
  }
  // mkdir either creates the directory or fails because it exists: two runs started at the same
  // instant never share one.
  for (int n = 1; n <= 99999; ++n) {
    const fs::path dir = n == 1 ? base : fs::path(project) / (name + std::to_string(n));
    if (::mkdir(dir.c_str(), 0777) == 0) return dir.string();
    if (errno != EEXIST)
      throw RuntimeError("cannot create directory " + dir.string() + ": " + std::strerror(errno));
  }
  throw RuntimeError("cannot find a free run directory name under " + project);
}

void check_dir_creatable(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec).lexically_normal();
  while (!p.empty() && !fs::exists(p, ec)) {
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
  if (!fs::is_directory(p, ec))
    throw RuntimeError("cannot create the run directory under " + dir + ": " + p.string() + " is not a directory", "",
                       "output_not_writable");
  // A probe directory made and removed at once: what the run's mkdir will meet (permissions,
  // a read-only or special file system), also for root, whom access() would always allow.
  const fs::path probe = p / (".libreyolo_probe_" + std::to_string(::getpid()));
  if (::mkdir(probe.c_str(), 0700) != 0)
    throw RuntimeError("cannot create the run directory under " + dir + ": " + p.string() + " is not writable (" +
                           std::strerror(errno) + ")",
                       "Pass project=<a writable folder>.", "output_not_writable");
  ::rmdir(probe.c_str());
}

void remove_tree(const std::string& path) {
  nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

void write_file_atomic(const std::string& path, const std::string& content) {
  fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw RuntimeError("cannot write " + tmp);
    f.write(content.data(), static_cast<std::streamsize>(content.size()));
    f.flush();
    if (!f) {
      f.close();
      std::remove(tmp.c_str());
      throw RuntimeError("cannot write " + tmp + " (disk full?)");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw RuntimeError("cannot rename " + tmp + " to " + path + ": " + ec.message());
  }
}

int remove_orphan_temp_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  // "<name>.tmp.<pid>" or ".<name>.tmp.<pid>.<n>"
  static const std::regex pattern(R"(^(.+)\.tmp\.(\d+)(\.\d+)?$)");
  int removed = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, pattern)) continue;
    const long pid = std::strtol(m[2].str().c_str(), nullptr, 10);
    if (pid <= 0 || pid == static_cast<long>(::getpid())) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) continue;  // its writer is still alive
    if (fs::remove(e.path(), ec)) ++removed;
  }
  return removed;
}

}  // namespace libreyolo
