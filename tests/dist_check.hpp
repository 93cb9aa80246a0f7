// Helpers of the multi-process tests (CPU and GPU): start the CLI as ranks with torchrun's
// environment, wait with a deadline, compare two checkpoints' weights.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist/spawn.hpp"
#include "io/checkpoint.hpp"

extern char** environ;

namespace libreyolo::test {

using Env = std::vector<std::pair<std::string, std::string>>;

// The CLI program: LIBREYOLO_CLI when set (prebuilt binaries carried to another machine, where
// the build's path does not exist: scripts/gpu.sh sets it), else the one this build made.
inline std::string cli_path() {
  const char* v = std::getenv("LIBREYOLO_CLI");
  return v && *v ? v : LIBREYOLO_CLI_PATH;
}

// Starts the CLI with `args`, this process's environment minus any rank variables plus `add`;
// stderr goes to err_path.
inline pid_t launch(const std::vector<std::string>& args, const Env& add, const std::string& err_path) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const char* k : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "LIBREYOLO_DDP_WORKER", "TORCHELASTIC_USE_AGENT_STORE"})
    env.erase(k);
  for (const auto& [k, v] : add) env[k] = v;
  std::vector<std::string> envs;
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (auto& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> full = {cli_path()};
  full.insert(full.end(), args.begin(), args.end());
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    ADD_FAILURE() << "could not start the CLI '" << full[0] << "': " << std::strerror(rc)
                  << " (on a machine without this build, LIBREYOLO_CLI names the program)";
    return -1;
  }
  return pid;
}

// Waits at most `seconds`; returns the wait status, or nullopt (the process is then killed; or
// there was none: pid <= 0, a launch that failed, which waitpid would take for "any child").
inline std::optional<int> wait_for(pid_t pid, double seconds) {
  if (pid <= 0) return std::nullopt;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return std::nullopt;
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

inline Env rank_env(int rank, int world, int port) {
  return {{"RANK", std::to_string(rank)},         {"LOCAL_RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},  {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"},           {"MASTER_PORT", std::to_string(port)},
          {"OMP_NUM_THREADS", "1"},                {"LIBREYOLO_TF32", "0"},
          {"LIBREYOLO_DETERMINISTIC", "1"}};
}

inline bool exited_ok(int status) { return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// Runs `world` ranks to completion; returns their exit statuses and stderr texts.
inline std::vector<std::pair<int, std::string>> run_ranks(int world, const std::vector<std::string>& args,
                                                   const std::string& dir, double seconds, const Env& extra = {}) {
  const int port = dist::free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    Env env = rank_env(r, world, port);
    env.insert(env.end(), extra.begin(), extra.end());
    pids.push_back(launch(args, env, dir + "/rank" + std::to_string(r) + ".txt"));
  }
  std::vector<std::pair<int, std::string>> out;
  for (int r = 0; r < world; ++r) {
    EXPECT_GT(pids[static_cast<size_t>(r)], 0);
    auto st = wait_for(pids[static_cast<size_t>(r)], seconds);
    out.emplace_back(st ? *st : -1, slurp(dir + "/rank" + std::to_string(r) + ".txt"));
  }
  return out;
}


// The weights of two checkpoints: the largest per-tensor difference relative to the tensor's
// magnitude (at least 1e-3), and the whole model's ||a - b|| / ||a||.
struct WeightDiff {
  double worst = 0, global = 0;
  std::string worst_name;
  int tensors = 0;
};
inline WeightDiff weight_diff(const std::string& a_path, const std::string& b_path, const char* key) {
  const auto a = io::read_checkpoint(a_path), b = io::read_checkpoint(b_path);
  const auto sa = io::to_state_dict(*a.root->get(key), key), sb = io::to_state_dict(*b.root->get(key), key);
  std::map<std::string, torch::Tensor> by_name(sb.begin(), sb.end());
  WeightDiff d;
  double num = 0, den = 0;
  for (const auto& [name, ta] : sa) {
    const auto it = by_name.find(name);
    if (it == by_name.end() || !ta.is_floating_point()) continue;
    const auto diff = (ta - it->second).to(torch::kDouble);
    const double rel = diff.abs().max().item<double>() / std::max(ta.abs().max().item<double>(), 1e-3);
    if (rel > d.worst) d.worst = rel, d.worst_name = name;
    num += diff.square().sum().item<double>();
    den += ta.to(torch::kDouble).square().sum().item<double>();
    ++d.tensors;
  }
  d.global = std::sqrt(num / std::max(den, 1e-30));
  return d;
}
}  // namespace libreyolo::test
