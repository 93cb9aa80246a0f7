// Trainings on the CPU at the same time share its cores. Every CPU training registers itself in a
// folder of the temporary directory (one file per registration, named by process id); each plans
// its compute threads as its share of the cores this process may run on, and plans again as
// others come and go. Without this, two trainings on two cores each run two OpenMP threads that
// spin while they wait for each other: both slow down four times and more instead of two.
#pragma once
#include <string>

namespace libreyolo {

// The cores this process may run on (its affinity mask; the hardware's count when unknown).
int available_cores();

class CpuShare {
 public:
  // Registers this training; `folder` empty: <temp>/libreyolo-cpu-<uid>.
  explicit CpuShare(int cores, std::string folder = "");
  ~CpuShare();
  CpuShare(const CpuShare&) = delete;
  CpuShare& operator=(const CpuShare&) = delete;

  // Live registrations, this one included (files of processes that no longer run are removed).
  int trainings() const;
  // This training's share of the cores: cores / trainings, at least 1.
  int cores() const;
  const std::string& folder() const { return folder_; }

 private:
  int cores_;
  std::string folder_, file_;
};

}  // namespace libreyolo
