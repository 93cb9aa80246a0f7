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

// The self-attention mask alone (the group's attn_mask).
torch::Tensor denoising_attn_mask(int64_t max_gt, int64_t groups, int64_t matching, const torch::Device& device);

}  // namespace libreyolo::models::rtdetr
