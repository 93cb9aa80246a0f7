// Minimum-cost linear assignment (the rectangular assignment problem): for an R x C cost matrix,
// min(R, C) (row, column) pairs, each row and each column used at most once, with the smallest
// total cost. Solved exactly by shortest augmenting paths with dual potentials (Jonker-Volgenant
// style, O(min^2 max)), in double precision; among equal optima it picks the one
// scipy.optimize.linear_sum_assignment picks.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace libreyolo::models::rtdetr {

struct Assignment {
  std::vector<int64_t> rows, cols;  // pair k is (rows[k], cols[k]); rows ascending
};

// `cost` is row-major R x C. Entries may be +inf (the pair is not allowed); NaN and -inf are
// refused, and so is a matrix whose every full assignment needs a +inf entry (UsageError).
// An empty matrix (R or C zero) gives no pairs.
Assignment linear_sum_assignment(const std::vector<double>& cost, int64_t rows, int64_t cols);
// A 2-D tensor of any floating dtype, on any device (copied to the host as double).
Assignment linear_sum_assignment(const torch::Tensor& cost);

}  // namespace libreyolo::models::rtdetr
