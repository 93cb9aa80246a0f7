#include "families/rtdetr/assignment.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "libreyolo/errors.hpp"

namespace libreyolo::models::rtdetr {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The column of each row for an n x m matrix with n <= m. Rows enter one at a time; each entry
// grows a shortest-path tree over reduced costs c - u - v (Dijkstra, columns taken in order of
// distance) until it reaches a free column, then the potentials are updated so that reduced
// costs stay non-negative and the path's assignments are flipped.
std::vector<int64_t> assign_rows(const std::vector<double>& c, int64_t n, int64_t m) {
  std::vector<double> u(n, 0.0), v(m, 0.0), dist(m);
  std::vector<int64_t> col_of_row(n, -1), row_of_col(m, -1), parent(m), open(m);
  std::vector<char> row_in_tree(n), col_in_tree(m);
  for (int64_t start = 0; start < n; ++start) {
    std::fill(dist.begin(), dist.end(), kInf);
    std::fill(row_in_tree.begin(), row_in_tree.end(), 0);
    std::fill(col_in_tree.begin(), col_in_tree.end(), 0);
    // Columns are scanned from the last to the first: ties then resolve as in
    // scipy.optimize.linear_sum_assignment (a constant matrix assigns row i to column i).
    for (int64_t j = 0; j < m; ++j) open[j] = m - 1 - j;
    int64_t open_count = m, row = start, sink = -1;
    double reached = 0.0;  // distance of the column last taken into the tree
    while (sink < 0) {
      row_in_tree[row] = 1;
      const double* cr = c.data() + row * m;
      int64_t pick = -1;
      double pick_dist = kInf;
      for (int64_t k = 0; k < open_count; ++k) {
        const int64_t j = open[k];
        const double d = reached + cr[j] - u[row] - v[j];
        if (d < dist[j]) {
          dist[j] = d;
          parent[j] = row;
        }
        // Among equally near columns a free one ends the search soonest.
        if (dist[j] < pick_dist || (dist[j] == pick_dist && row_of_col[j] < 0)) {
          pick_dist = dist[j];
          pick = k;
        }
      }
      if (pick < 0 || pick_dist == kInf) throw UsageError("linear assignment: no assignment of finite cost exists");
      reached = pick_dist;
      const int64_t j = open[pick];
      open[pick] = open[--open_count];
      col_in_tree[j] = 1;
      if (row_of_col[j] < 0)
        sink = j;
      else
        row = row_of_col[j];
    }
    u[start] += reached;
    for (int64_t i = 0; i < n; ++i)
      if (row_in_tree[i] && i != start) u[i] += reached - dist[col_of_row[i]];
    for (int64_t j = 0; j < m; ++j)
      if (col_in_tree[j]) v[j] -= reached - dist[j];
    for (int64_t j = sink;;) {
      const int64_t i = parent[j];
      row_of_col[j] = i;
      std::swap(col_of_row[i], j);
      if (i == start) break;
    }
  }
  return col_of_row;
}

}  // namespace

Assignment linear_sum_assignment(const std::vector<double>& cost, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0 || static_cast<int64_t>(cost.size()) != rows * cols)
    throw UsageError("linear assignment: the cost has " + std::to_string(cost.size()) + " entries, not " +
                     std::to_string(rows) + " x " + std::to_string(cols));
  for (const double x : cost)
    if (std::isnan(x) || x == -kInf) throw UsageError("linear assignment: the cost contains NaN or -inf");
  Assignment a;
  if (rows == 0 || cols == 0) return a;
  if (rows <= cols) {
    const auto col_of_row = assign_rows(cost, rows, cols);
    for (int64_t i = 0; i < rows; ++i) {
      a.rows.push_back(i);
      a.cols.push_back(col_of_row[i]);
    }
    return a;
  }
  // More rows than columns: every column gets a row (solved on the transpose).
  std::vector<double> t(cost.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = cost[i * cols + j];
  const auto row_of_col = assign_rows(t, cols, rows);
  std::vector<int64_t> order(cols);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return row_of_col[x] < row_of_col[y]; });
  for (const int64_t j : order) {
    a.rows.push_back(row_of_col[j]);
    a.cols.push_back(j);
  }
  return a;
}

Assignment linear_sum_assignment(const torch::Tensor& cost) {
  if (cost.dim() != 2) throw UsageError("linear assignment: the cost must be 2-D, got " + c10::str(cost.sizes()));
  const auto c = cost.detach().to(torch::kCPU, torch::kDouble).contiguous();
  const auto* p = c.data_ptr<double>();
  return linear_sum_assignment(std::vector<double>(p, p + c.numel()), c.size(0), c.size(1));
}

}  // namespace libreyolo::models::rtdetr
