// RT-DETR's Hungarian matcher: one-to-one matching of queries to ground-truth boxes per image,
// minimising C = 5 L1(cxcywh) + 2 focal class cost + 2 (-GIoU), with the focal cost
// 0.25 (1 - p)^2 (-log(p + 1e-8)) - 0.75 p^2 (-log(1 - p + 1e-8)) at the GT's class
// (p = sigmoid(logit)). Each output level is matched on its own.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "families/rtdetr/boxes.hpp"

namespace libreyolo::models::rtdetr {

struct MatcherWeights {
  double cls = 2.0, bbox = 5.0, giou = 2.0;
  double alpha = 0.25, gamma = 2.0;  // of the focal class cost
};

// One output level the criterion matches or supervises: logits [B, n, nc], boxes [B, n, 4]
// (sigmoid cxcywh).
struct OutputLevel {
  torch::Tensor logits, boxes;
};

// One image's matched pairs: query indices (ascending) and GT indices, int64 on the CPU.
struct ImageMatch {
  torch::Tensor query, gt;
  int64_t size() const { return query.size(0); }
};

// A batch's targets as rows on one device: every image's after the one before, or with `pad` > 0
// image b's in rows [b pad, b pad + n_b) of B pad rows (the rest label 0 and a unit-centred box,
// read by no loss), a shape that depends only on B and pad (which must be at least every n_b).
struct TargetRows {
  torch::Tensor labels, boxes;  // [S] int64, [S, 4] float32 cxcywh
  std::vector<int64_t> counts;  // per image
  int64_t pad = 0;
  int64_t first_row(size_t image) const;  // image's first row
};
TargetRows concatenate_targets(const std::vector<ImageTargets>& gts, const torch::Device& device, int64_t pad = 0);

// The matched pairs of L levels scored together (level l's matches[l]; every level has as many, P):
// rows (row of the levels' stack: level l's image i is l B + i, query, row of the targets),
// int64 [3, L P] on `device`, made on the host and copied once (from pinned memory on a GPU);
// level l's pairs are columns [l P, (l + 1) P). Throws UsageError for unequal counts.
// With `pad` > 0, each image has `pad` columns per level, its pairs first, so that P = B pad for
// any batch whose images have at most `pad` pairs each (more: UsageError); the padding columns
// gather query 0 of their image and its first target row, `scatter` sends them to query `queries`
// (one past the last) and `keep` is false on them, true on pairs. Without padding both are undefined.
struct StackedPairs {
  torch::Tensor index;    // [3, L P]
  torch::Tensor scatter;  // [L P] int64: the query a pair's class target is written to
  torch::Tensor keep;     // [L P] bool
  int64_t per_level = 0;
};
StackedPairs stacked_pairs(const std::vector<const std::vector<ImageMatch>*>& matches, const TargetRows& gts,
                           const torch::Device& device, int64_t queries = 0, int64_t pad = 0);

// A StackedPairs of L stacked levels with its GTs gathered (labels, cxcywh boxes), as the losses
// score them: row of the levels' stack and query per pair, on the device.
struct PairTargets {
  torch::Tensor row, qry, scatter, keep, labels, boxes;  // scatter, keep: as StackedPairs'
  int64_t levels = 0, per_level = 0;
  bool empty() const { return per_level == 0; }
  bool padded() const { return keep.defined(); }
};
PairTargets gather_pairs(const StackedPairs& pairs, int64_t levels, const TargetRows& gts);
// Per pair (or per pair's `per` consecutive values), v where the pair is real, 0 on padding:
// selected, not multiplied, so that a padding pair's gradient is 0 whatever its terms are.
torch::Tensor real_only(const torch::Tensor& v, const PairTargets& p, int64_t per = 1);
// values [L B, n] with v written at the pairs (padding: at a column past the last, dropped).
torch::Tensor put_at_pairs(const torch::Tensor& values, const PairTargets& p, const torch::Tensor& v);

// The denoising group's positive pairs, int64 [P, 3] (image, denoising query, GT index) on the
// CPU, as each of `batch` images' matches (in their order). Throws UsageError for another layout
// or an image outside the batch.
std::vector<ImageMatch> denoising_matches(const torch::Tensor& pairs, int64_t batch);

// The cost of every query against every GT of the batch, [B, Q, S] float32 (S = sum of the
// images' counts, image b's columns after those of images < b), on the outputs' device; logits
// [B, Q, nc], boxes [B, Q, 4] cxcywh. Undefined when the batch has no GT.
torch::Tensor matching_cost(const torch::Tensor& logits, const torch::Tensor& boxes,
                            const std::vector<ImageTargets>& gts, const MatcherWeights& w = {});
// The same for L levels of one shape at once: logits [L, B, Q, nc], boxes [L, B, Q, 4] -> [L, B, Q, S].
torch::Tensor matching_costs(const torch::Tensor& logits, const torch::Tensor& boxes,
                             const std::vector<ImageTargets>& gts, const MatcherWeights& w = {});
// The minimum-cost assignment of each image's block of such a cost (copied to the host).
std::vector<ImageMatch> solve_matches(const torch::Tensor& cost, const std::vector<ImageTargets>& gts);
// Both: the matches of one output level.
std::vector<ImageMatch> hungarian_match(const torch::Tensor& logits, const torch::Tensor& boxes,
                                        const std::vector<ImageTargets>& gts, const MatcherWeights& w = {});
// The matches of several output levels, level l against *gts[l] (an encoder level may match
// relabelled targets): the same as hungarian_match level by level, but the costs of consecutive
// levels of one shape are computed together and every level's reach the host in one copy, so a
// step waits for the device once instead of once a level.
std::vector<std::vector<ImageMatch>> hungarian_match_levels(const std::vector<OutputLevel>& levels,
                                                            const std::vector<const std::vector<ImageTargets>*>& gts,
                                                            const MatcherWeights& w = {});

}  // namespace libreyolo::models::rtdetr
