// Spawned data-parallel workers: the program runs again, once per GPU, with the rank environment
// torchrun would give it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT) plus LIBREYOLO_DDP_WORKER=1, and CUDA_VISIBLE_DEVICES narrowed to the requested
// GPUs (translated through an existing mask) in the children only. A worker reaches the same
// train() call, sees LOCAL_RANK and trains as its rank instead of spawning again.
//
// The parent waits for every worker. When one fails, the others get SIGTERM, then SIGKILL after
// a grace period, and the parent throws naming the rank. Ctrl-C or SIGTERM to the parent stops
// every worker the same way. Workers die with the parent (PR_SET_PDEATHSIG).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace libreyolo::dist {

// A TCP port that was free a moment ago on 127.0.0.1.
int free_port();

// The value of CUDA_VISIBLE_DEVICES for workers on `devices` (indices as this process sees them).
std::string child_device_mask(const std::vector<int>& devices, const char* current_mask);

struct SpawnOutcome {
  bool interrupted = false;  // the parent was asked to stop (the workers were stopped)
};

// Runs one worker per entry of `devices`; `env` is added to every worker's environment. Returns
// when all ended successfully (or after an interrupt); throws RuntimeError when one failed.
SpawnOutcome spawn_workers(const std::vector<int>& devices, const std::vector<std::pair<std::string, std::string>>& env);

// True in a process started by spawn_workers.
bool is_spawned_worker();
// True in a rank other than 0 of a data-parallel run (torchrun's or ours): RANK and LOCAL_RANK
// are set and RANK is not 0. Such a process speaks only of warnings and errors.
bool is_secondary_rank();

}  // namespace libreyolo::dist
