#include "layers/sync_bn.hpp"

#include <atomic>
#include <memory>
#include <mutex>

namespace libreyolo::models {
namespace {

std::mutex& sync_mutex() {
  static std::mutex m;
  return m;
}
std::atomic<bool>& sync_installed() {  // lets the common case (none) skip the lock
  static std::atomic<bool> on{false};
  return on;
}
std::shared_ptr<BnStatsSync>& sync_slot() {
  static std::shared_ptr<BnStatsSync>* s = new std::shared_ptr<BnStatsSync>();  // never destroyed
  return *s;
}

}  // namespace

void set_bn_stats_sync(std::shared_ptr<BnStatsSync> sync) {
  std::lock_guard<std::mutex> lock(sync_mutex());
  sync_installed().store(sync != nullptr);
  sync_slot() = std::move(sync);
}

std::shared_ptr<BnStatsSync> bn_stats_sync() {
  if (!sync_installed().load()) return nullptr;
  std::lock_guard<std::mutex> lock(sync_mutex());
  return sync_slot();
}

namespace syncbn {
namespace {

at::Tensor per_channel(const at::Tensor& v) { return v.view({1, -1, 1, 1}); }

}  // namespace

Result batch_norm(const at::Tensor& z, const at::Tensor& gamma, const at::Tensor& beta, const at::Tensor& running_mean,
                  const at::Tensor& running_var, double momentum, double eps, BnStatsSync& sync) {
  const int64_t C = z.size(1);
  const double n = static_cast<double>(z.numel() / C);
  const double m = momentum;
  Result r;
  if (z.is_cuda()) {
    // This process's row [mean, invstd, count] in a zeroed [world, 2C+1] buffer; the sum over the
    // processes is every process's row (an all-gather), which ATen's kernel combines (and uses to
    // update the running statistics) in one launch.
    const int world = sync.world_size();
    at::Tensor rows = at::zeros({world, 2 * C + 1}, z.options().dtype(at::kFloat));
    auto local = at::batch_norm_stats(z, eps);
    at::Tensor mine = rows[sync.rank()];
    at::cat_out(mine, {std::get<0>(local), std::get<1>(local), at::full({1}, n, rows.options())}, 0);
    sync.all_reduce_sum(rows);
    const at::Tensor means = rows.narrow(1, 0, C).contiguous(), invstds = rows.narrow(1, C, C).contiguous();
    const at::Tensor counts = rows.select(1, 2 * C).contiguous();
    auto global = at::batch_norm_gather_stats_with_counts(z, means, invstds, running_mean, running_var, m, eps,
                                                          counts);
    r.mean = std::get<0>(global);
    r.invstd = std::get<1>(global);
    r.count = counts.sum().reshape({1});
    r.out = at::batch_norm_elemt(z, gamma, beta, r.mean, r.invstd, eps);
    return r;
  }
  // The CPU: sum and sum of squares in float64 (sumsq/count - mean^2 cancels badly in float32 when
  // |mean| is large against the spread).
  const at::Tensor zf = z.to(at::kFloat);
  at::Tensor stats = at::cat({zf.sum({0, 2, 3}, false, at::kDouble), zf.square().sum({0, 2, 3}, false, at::kDouble),
                              at::full({1}, n, zf.options().dtype(at::kDouble))});
  sync.all_reduce_sum(stats);
  const at::Tensor count = stats.narrow(0, 2 * C, 1);
  const at::Tensor mean64 = stats.narrow(0, 0, C) / count;
  const at::Tensor var64 = (stats.narrow(0, C, C) / count - mean64.square()).clamp_min(0.0);
  r.count = count.to(at::kFloat);
  r.mean = mean64.to(at::kFloat);
  r.invstd = (var64 + eps).rsqrt().to(at::kFloat);
  running_mean.mul_(1.0 - m).add_(r.mean, m);
  running_var.mul_(1.0 - m).add_((var64 * (count / (count - 1.0))).to(at::kFloat), m);
  const at::Tensor scale = r.invstd * gamma;
  r.out = ((zf - per_channel(r.mean)) * per_channel(scale) + per_channel(beta)).to(z.scalar_type());
  return r;
}

}  // namespace syncbn
}  // namespace libreyolo::models
