#include "loss/normalizer.hpp"

#include <atomic>
#include <mutex>

namespace libreyolo {

namespace {
std::mutex g_mutex;
std::atomic<bool> g_installed{false};  // lets every loss call of one process skip the lock
std::shared_ptr<CountSync> g_sync;
}  // namespace

void set_count_sync(std::shared_ptr<CountSync> sync) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_installed.store(sync != nullptr);
  g_sync = std::move(sync);
}

std::shared_ptr<CountSync> count_sync() {
  if (!g_installed.load()) return nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_sync;
}

torch::Tensor loss_normalizer(const torch::Tensor& local, double min_value) {
  auto sync = count_sync();
  if (!sync || sync->world_size() <= 1) return local.clamp_min(min_value);
  // A private float32 copy: the all-reduce writes into it.
  torch::Tensor t = local.detach().to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true).reshape({1});
  sync->all_reduce_sum(t);
  return (t.clamp_min(min_value) / static_cast<double>(sync->world_size())).reshape({}).to(local.scalar_type());
}

}  // namespace libreyolo
