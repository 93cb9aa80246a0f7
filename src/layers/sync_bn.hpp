// SyncBN for the fused training node (conv_bn_act.hpp, BnStatsSync): BatchNorm with the global
// batch's statistics, and the process-wide slot the data-parallel set-up installs the sync in.
#pragma once
#include <ATen/ATen.h>

#include <memory>

#include "core/cross_process.hpp"

namespace libreyolo::models {

// Batch-statistics synchronisation for SyncBN under data parallelism. While one is installed
// (process-wide: one process per device), every fused node in training mode normalises with the
// statistics of the global batch, the way torch's SyncBatchNorm does:
//  - forward, right after the convolution: the node computes this process's per-channel
//    statistics, sums them over all processes with all_reduce_sum(), and normalises with the
//    global mean and biased variance; the running statistics follow the global mean and
//    unbiased variance. On CUDA the statistics are ATen's SyncBatchNorm kernels' (one Welford
//    pass per process, then a parallel combination of the processes' mean/invstd/count rows;
//    the rows are gathered by summing a [world, 2C+1] buffer in which each process filled its
//    own row). On the CPU they are the per-channel sum and sum of squares in float64.
//  - backward, before the input gradient: the per-channel sums of the gradient at BatchNorm's
//    output (sum dy, sum dy*(z-mean)) are summed over the processes the same way; the BatchNorm
//    weight and bias gradients stay this process's own (the gradient all-reduce of the
//    data-parallel step averages them, as with torch's SyncBatchNorm under DDP).
// The CUDA kernels of single-device training fuse the reduction with the normalisation in one
// launch, with no point to call back from: while a sync is installed the node takes this path.
// None installed (the default) is the no-op: the node is exactly what it is without this seam.
using BnStatsSync = CrossProcessSum;  // core/cross_process.hpp
// Installs (or, with nullptr, removes) the process-wide statistics sync. Set it before a step, not
// during one: backward asks again and treats "none" as local statistics.
void set_bn_stats_sync(std::shared_ptr<BnStatsSync> sync);
std::shared_ptr<BnStatsSync> bn_stats_sync();

namespace syncbn {

struct Result {
  at::Tensor out, mean, invstd, count;
};

// Training-mode BatchNorm of z with the global batch's statistics (see BnStatsSync); the running
// statistics follow them. mean and invstd are float32 [C]; count is the global row count
// (float32 [1]).
Result batch_norm(const at::Tensor& z, const at::Tensor& gamma, const at::Tensor& beta, const at::Tensor& running_mean,
                  const at::Tensor& running_var, double momentum, double eps, BnStatsSync& sync);

}  // namespace syncbn
}  // namespace libreyolo::models
