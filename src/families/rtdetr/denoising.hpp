// Contrastive denoising (CDN) for RT-DETR training: noised copies of the ground truth, decoded
// in front of the matching queries, that the criterion supervises with known targets.
//
// With n_b boxes in image b and m = max n_b over the batch, there are G = max(1, D / m) groups
// (D the configured denoising count) of 2m slots each, N = 2 m G queries: slot s = 2 m g + r is
// a positive copy of GT r when r < m, a negative copy of GT r - m otherwise, and padding when
// that GT does not exist in its image. Labels are replaced by a random class with probability
// label_noise / 2 (padding keeps class nc, the embedding's zero row); each xyxy edge moves by
// sign * u * (w/2 or h/2) * box_noise with u in [0, 1) for positives and [1, 2) for negatives,
// then the box is clipped to [0, 1] and taken to logit space. The self-attention mask keeps the
// matching queries from seeing any denoising query and each group from seeing the others.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <optional>
#include <vector>

#include "families/rtdetr/boxes.hpp"
#include "models/detector.hpp"

namespace libreyolo::models::rtdetr {

// The random numbers one group needs, [B, N] and [B, N, 4], drawn in this order.
struct DenoisingDraws {
  torch::Tensor label_u;    // [B, N] float in [0, 1): a label is replaced where < label_noise / 2
  torch::Tensor new_label;  // [B, N] int in [0, nc): the replacement
  torch::Tensor sign_bits;  // [B, N, 4] float in {0, 1}: the edge moves by the sign 2 bit - 1
  torch::Tensor part_u;     // [B, N, 4] float in [0, 1): the move's size (plus 1 on negatives)
};
using DenoisingSource = std::function<DenoisingDraws(int64_t batch, int64_t count, int64_t nc, const torch::Device&)>;
// Draws from torch's global generator of the device (rand, randint int32, randint, rand, with
// the shapes above), the sequence the reference implementation consumes.
DenoisingDraws global_generator_draws(int64_t batch, int64_t count, int64_t nc, const torch::Device& device);

struct DenoisingOptions {
  int64_t count = 100;       // D, the wanted number of denoising queries
  double label_noise = 0.5;  // a label is replaced with probability label_noise / 2
  double box_noise = 1.0;    // scale of the edge moves
};

struct DenoisingGroup {
  torch::Tensor labels;     // [B, N] int64 after label noise (nc on padding slots)
  torch::Tensor boxes;      // [B, N, 4] noised cxcywh boxes, clipped to [0, 1]
  torch::Tensor box_unact;  // [B, N, 4] inverse_sigmoid(boxes): the queries' initial references
  torch::Tensor attn_mask;  // [N + Q, N + Q] bool, true = may not attend
  // m (the batch's largest GT count), G (groups), N (denoising queries).
  int64_t max_gt = 0, groups = 0, queries = 0;
  // Per image: the slots that are positive copies of a real GT, in slot order (group-major), and
  // the GT each copies (0..n_b-1 repeated G times); int64 on the CPU.
  std::vector<torch::Tensor> positive_idx, positive_gt;
};

// The group for a batch (nullopt when it has no GT or options.count <= 0); `matching` is the
// number of matching queries (Q). Tensors on the targets' device.
std::optional<DenoisingGroup> make_denoising_group(const std::vector<ImageTargets>& gts, int64_t nc, int64_t matching,
                                                   const DenoisingOptions& options,
                                                   const DenoisingSource& source = global_generator_draws);

// The self-attention mask alone (the group's attn_mask), [slots + matching]^2 with the group's
// 2 max_gt groups queries first and `slots` (>= them; -1: no more) before the matching queries:
// the slots past the group are padding, seen by no other query and seeing every query.
torch::Tensor denoising_attn_mask(int64_t max_gt, int64_t groups, int64_t matching, const torch::Device& device,
                                  int64_t slots = -1);

// The positive pairs of a group, int64 [P, 3] (image, denoising query, GT index) on the CPU.
torch::Tensor denoising_pairs(const DenoisingGroup& group);

// A denoising block of a size that depends only on the configured count while each image has at
// most `count` boxes: 2 max(count, max_gt) slots (a group's 2 m G queries are at most 2 count when
// m <= count), so that a captured network serves every such batch.
int64_t denoising_slots(int64_t count, int64_t max_gt);

// What the decoder reads of a group laid out in `slots` >= group->queries slots (no group: all
// padding): labels [B, slots] int64 (padding: class nc, the embedding's zero row), box logits
// [B, slots, 4] float (padding: 0) and the attention mask with those slots (denoising_attn_mask).
// The padding changes no other query's output.
struct PaddedDenoising {
  torch::Tensor labels, box_unact, attn_mask;
};
PaddedDenoising pad_denoising(const DenoisingGroup* group, int64_t batch, int64_t slots, int64_t nc, int64_t matching,
                              const torch::Device& device);

// A network seam's inputs (Detector::seam_inputs) for a batch of `batch` images and its group (or
// none): with denoising on (`enabled`), head = the padded labels, box logits and mask in
// denoising_slots(count, m) slots; tail = {int64 [2] (N, G), the positive pairs}.
SeamInputs denoising_seam_inputs(const std::optional<DenoisingGroup>& group, bool enabled, int64_t batch,
                                 int64_t count, int64_t nc, int64_t matching, const torch::Device& device);
// The decoder's queries with such head inputs (none: unchanged) in front of the matching ones:
// the labels' embeddings before `target`, the box logits before `ref_unact`, and their mask.
void prepend_denoising(torch::nn::Embedding& embed, const std::vector<torch::Tensor>& head_inputs,
                       torch::Tensor& target, torch::Tensor& ref_unact, torch::Tensor& mask);
// The network seam's tail inputs read back: N denoising queries (0: none) and G groups.
std::pair<int64_t, int64_t> denoising_counts(const SeamInputs& inputs);

}  // namespace libreyolo::models::rtdetr
