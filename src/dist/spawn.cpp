#include "dist/spawn.hpp"
#include "core/env.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <libreyolo/errors.hpp>

#include "core/interrupt.hpp"
#include "core/log.hpp"
#include "core/strings.hpp"

extern char** environ;

namespace libreyolo::dist {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw RuntimeError("Cannot open a socket to find a free port: " + std::string(std::strerror(errno)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw RuntimeError("Cannot find a free port: " + std::string(std::strerror(errno)));
  }
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

std::string child_device_mask(const std::vector<int>& devices, const char* current_mask) {
  std::vector<std::string> existing;
  if (current_mask && *current_mask) {
    std::stringstream ss(current_mask);
    std::string part;
    while (std::getline(ss, part, ',')) existing.push_back(part);
  }
  std::string out;
  for (int d : devices) {
    std::string v = (!existing.empty() && d < static_cast<int>(existing.size())) ? trim(existing[static_cast<size_t>(d)])
                                                                                 : std::to_string(d);
    out += (out.empty() ? "" : ",") + v;
  }
  return out;
}

bool is_spawned_worker() { return env_get("LIBREYOLO_DDP_WORKER") != nullptr; }

bool is_secondary_rank() {
  const char* rank = std::getenv("RANK");
  return rank && std::getenv("LOCAL_RANK") && std::string(rank) != "0";
}

namespace {

std::vector<std::string> own_argv() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    args.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  if (args.empty()) throw RuntimeError("Cannot read this program's command line (/proc/self/cmdline)");
  return args;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return strfmt("exited with code %d", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return strfmt("was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

}  // namespace

SpawnOutcome spawn_workers(const std::vector<int>& devices, const std::vector<std::pair<std::string, std::string>>& env) {
  const int n = static_cast<int>(devices.size());
  const std::vector<std::string> argv = own_argv();
  std::map<std::string, std::string> base;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) base[std::string(*e, static_cast<size_t>(eq - *e))] = std::string(eq + 1);
  }
  const std::string mask = child_device_mask(devices, std::getenv("CUDA_VISIBLE_DEVICES"));
  const int port = free_port();
  // Build every child's argv and envp before forking: the child only execs.
  std::vector<std::vector<std::string>> envs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto m = base;
    for (const auto& kv : env) m[kv.first] = kv.second;
    m["RANK"] = m["LOCAL_RANK"] = std::to_string(r);
    m["WORLD_SIZE"] = m["LOCAL_WORLD_SIZE"] = std::to_string(n);
    m["MASTER_ADDR"] = "127.0.0.1";
    m["MASTER_PORT"] = std::to_string(port);
    m["LIBREYOLO_DDP_WORKER"] = "1";
    m.erase("TORCHELASTIC_USE_AGENT_STORE");
    m["CUDA_VISIBLE_DEVICES"] = mask;
    if (!m.count("OMP_NUM_THREADS")) m["OMP_NUM_THREADS"] = "1";
    if (!m.count("TORCH_NCCL_ASYNC_ERROR_HANDLING")) m["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1";
    for (const auto& kv : m) envs[static_cast<size_t>(r)].push_back(kv.first + "=" + kv.second);
  }
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::vector<std::vector<char*>> cenvs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    for (auto& s : envs[static_cast<size_t>(r)]) cenvs[static_cast<size_t>(r)].push_back(const_cast<char*>(s.c_str()));
    cenvs[static_cast<size_t>(r)].push_back(nullptr);
  }
  log_info(strfmt("Multi-GPU: starting %d worker processes on GPU(s) %s (rendezvous 127.0.0.1:%d)", n, mask.c_str(),
                  port));
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  std::vector<pid_t> pids(static_cast<size_t>(n), -1);
  std::vector<int> status(static_cast<size_t>(n), 0);
  std::vector<bool> done(static_cast<size_t>(n), false);
  auto kill_all = [&](int sig) {
    for (int r = 0; r < n; ++r)
      if (pids[static_cast<size_t>(r)] > 0 && !done[static_cast<size_t>(r)]) ::kill(pids[static_cast<size_t>(r)], sig);
  };
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      kill_all(SIGKILL);
      throw RuntimeError("Cannot start a worker process: " + std::string(std::strerror(errno)));
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(1);
      ::execve("/proc/self/exe", cargv.data(), cenvs[static_cast<size_t>(r)].data());
      ::_exit(127);
    }
    pids[static_cast<size_t>(r)] = pid;
  }

  using Clock = std::chrono::steady_clock;
  int failed = -1;
  bool interrupted = false;
  std::optional<Clock::time_point> stopping;  // when the survivors were asked to stop
  int remaining = n;
  while (remaining > 0) {
    for (int r = 0; r < n; ++r) {
      if (done[static_cast<size_t>(r)]) continue;
      int st = 0;
      const pid_t got = ::waitpid(pids[static_cast<size_t>(r)], &st, WNOHANG);
      if (got == pids[static_cast<size_t>(r)] || (got < 0 && errno == ECHILD)) {
        done[static_cast<size_t>(r)] = true;
        status[static_cast<size_t>(r)] = st;
        --remaining;
        const bool ok = got > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (!ok && failed < 0 && !interrupted) {
          failed = r;
          if (remaining > 0) {
            log_error(strfmt("Multi-GPU: worker rank %d %s; stopping the other workers", r, describe_status(st).c_str()));
            kill_all(SIGTERM);
            stopping = Clock::now();
          }
        }
      }
    }
    if (remaining == 0) break;
    if (!interrupted && interrupt_requested()) {
      interrupted = true;
      log_warn("Multi-GPU: interrupted; stopping the workers");
      kill_all(SIGTERM);
      if (!stopping) stopping = Clock::now();
    }
    if (stopping && Clock::now() - *stopping > std::chrono::seconds(15)) {
      kill_all(SIGKILL);
      stopping = Clock::now() + std::chrono::hours(24);  // once
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  SpawnOutcome out;
  out.interrupted = interrupted;
  if (failed >= 0 && !interrupted)
    throw RuntimeError(strfmt("Multi-GPU training failed: worker rank %d %s (its messages are above)", failed,
                              describe_status(status[static_cast<size_t>(failed)]).c_str()),
                       "", "ddp_worker_failed");
  return out;
}

}  // namespace libreyolo::dist
