// The process group of data-parallel training: LibTorch's c10d (a TCPStore rendezvous, then
// ProcessGroupNCCL on CUDA or ProcessGroupGloo on the CPU), in torchrun's environment contract.
//
// A rank learns its place from RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR /
// MASTER_PORT, which torchrun sets and which our own spawn (dist/spawn.hpp) sets the same way.
// Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) every rank is a client of the agent's store;
// otherwise rank 0 hosts it.
//
// A watchdog thread beats a per-rank counter in the store every 2 s and watches the others': a
// rank that stops beating for 30 s (killed, crashed, hung host) or a store that goes away ends
// this process with a clear error, so no rank waits out the collectives' 3-hour timeout.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace libreyolo::dist {

struct RankEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool agent_store = false;  // torchrun's agent hosts the store: every rank is a client
  bool spawned = false;      // started by dist/spawn (LIBREYOLO_DDP_WORKER is set)
};

// The torchrun contract: present when LOCAL_RANK is set (the variable torchrun-launched and
// spawned processes have); a missing or malformed companion variable is a UsageError.
std::optional<RankEnv> rank_env_from_environment();

// `batch` is the global batch; one that world_size does not divide is a UsageError
// naming the two nearest valid values.
void check_global_batch(int batch, int world_size);

// Whether this build can run a process group on `device` ("" when it can, else why not).
std::string backend_unavailable(const torch::Device& device);

class Group {
 public:
  // Connects to the rendezvous and builds the backend for `device` (cuda:LOCAL_RANK or the CPU).
  static std::shared_ptr<Group> create(const RankEnv& env, const torch::Device& device,
                                       std::chrono::milliseconds timeout = std::chrono::hours(3));
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  const RankEnv& env() const { return env_; }
  const std::string& backend_name() const { return backend_name_; }
  const torch::Device& device() const { return device_; }

  // Collectives, in place, on tensors of the group's device. On CUDA they are ordered on the
  // current stream (the host does not wait); on the CPU they complete before returning.
  void all_reduce_sum(std::vector<torch::Tensor>& tensors);
  void broadcast(torch::Tensor& t, int src = 0);
  // Every rank waits for every other (and the host for the device).
  void barrier();
  // Rank src's value on every rank.
  std::string broadcast_string(const std::string& value, int src = 0);
  bool broadcast_flag(bool value, int src = 0);
  int64_t broadcast_int(int64_t value, int src = 0);

  // The end: stops our watchdog and releases the backend. finished=true (training completed)
  // first says "done" to the other ranks' watchdogs, so that they do not take this rank's
  // silence for a failure; a rank that ends on an error stays silent, and the others stop.
  void shutdown(bool finished = true);

 private:
  struct Impl;
  explicit Group(const RankEnv& env, const torch::Device& device);
  RankEnv env_;
  torch::Device device_;
  std::string backend_name_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace libreyolo::dist
