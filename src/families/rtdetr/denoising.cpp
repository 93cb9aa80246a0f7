#include "families/rtdetr/denoising.hpp"

#include <algorithm>

#include "families/rtdetr/blocks.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::models::rtdetr {

DenoisingDraws global_generator_draws(int64_t batch, int64_t count, int64_t nc, const torch::Device& device) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  DenoisingDraws d;
  d.label_u = torch::rand({batch, count}, f32);
  d.new_label = torch::randint(0, nc, {batch, count}, f32.dtype(torch::kInt));
  d.sign_bits = torch::randint(0, 2, {batch, count, 4}, f32);
  d.part_u = torch::rand({batch, count, 4}, f32);
  return d;
}

torch::Tensor denoising_attn_mask(int64_t max_gt, int64_t groups, int64_t matching, const torch::Device& device,
                                  int64_t slots) {
  const int64_t n = 2 * max_gt * groups, span = 2 * max_gt;
  if (slots < 0) slots = n;
  if (slots < n) throw UsageError("denoising: " + std::to_string(slots) + " slots for " + std::to_string(n) + " queries");
  const int64_t size = slots + matching;
  auto mask = torch::zeros({size, size}, torch::TensorOptions().dtype(torch::kBool));
  mask.narrow(0, slots, matching).narrow(1, 0, slots).fill_(true);
  if (slots > n) mask.narrow(0, 0, n).narrow(1, n, slots - n).fill_(true);
  for (int64_t g = 0; g < groups; ++g) {
    auto rows = mask.narrow(0, g * span, span);
    if (g > 0) rows.narrow(1, 0, g * span).fill_(true);
    if (g + 1 < groups) rows.narrow(1, (g + 1) * span, n - (g + 1) * span).fill_(true);
  }
  return mask.to(device);
}

torch::Tensor denoising_pairs(const DenoisingGroup& group) {
  std::vector<torch::Tensor> pairs;
  for (size_t b = 0; b < group.positive_idx.size(); ++b) {
    const auto q = group.positive_idx[b].to(torch::kCPU, torch::kLong);
    const auto gt = group.positive_gt[b].to(torch::kCPU, torch::kLong);
    pairs.push_back(torch::stack({torch::full_like(q, static_cast<int64_t>(b)), q, gt}, 1));
  }
  return pairs.empty() ? torch::zeros({0, 3}, torch::kLong) : torch::cat(pairs, 0);
}

int64_t denoising_slots(int64_t count, int64_t max_gt) { return 2 * std::max(count, max_gt); }

PaddedDenoising pad_denoising(const DenoisingGroup* group, int64_t batch, int64_t slots, int64_t nc, int64_t matching,
                              const torch::Device& device) {
  const int64_t n = group ? group->queries : 0;
  if (slots < n) throw UsageError("denoising: " + std::to_string(slots) + " slots for " + std::to_string(n) + " queries");
  PaddedDenoising p;
  p.labels = torch::full({batch, slots}, nc, torch::TensorOptions().dtype(torch::kLong).device(device));
  p.box_unact = torch::zeros({batch, slots, 4}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  if (n > 0) {
    p.labels.narrow(1, 0, n).copy_(group->labels);
    p.box_unact.narrow(1, 0, n).copy_(group->box_unact);
  }
  p.attn_mask = group ? denoising_attn_mask(group->max_gt, group->groups, matching, device, slots)
                      : denoising_attn_mask(0, 0, matching, device, slots);
  return p;
}

SeamInputs denoising_seam_inputs(const std::optional<DenoisingGroup>& group, bool enabled, int64_t batch,
                                 int64_t count, int64_t nc, int64_t matching, const torch::Device& device) {
  SeamInputs in;
  const DenoisingGroup* g = group ? &*group : nullptr;
  if (enabled) {
    const auto p = pad_denoising(g, batch, denoising_slots(count, g ? g->max_gt : 0), nc, matching, device);
    in.head = {p.labels, p.box_unact, p.attn_mask};
  }
  in.tail = {torch::tensor({g ? g->queries : 0, g ? g->groups : 0}, torch::kLong),
             g ? denoising_pairs(*g) : torch::zeros({0, 3}, torch::kLong)};
  return in;
}

void prepend_denoising(torch::nn::Embedding& embed, const std::vector<torch::Tensor>& head_inputs,
                       torch::Tensor& target, torch::Tensor& ref_unact, torch::Tensor& mask) {
  if (head_inputs.empty()) return;
  if (head_inputs.size() != 3 || !embed)
    throw UsageError("denoising: the network seam reads labels, box logits and a mask");
  target = torch::cat({embed->forward(head_inputs[0]).to(target.scalar_type()), target}, 1);
  ref_unact = torch::cat({head_inputs[1].to(ref_unact.scalar_type()), ref_unact}, 1);
  mask = head_inputs[2];
}

std::pair<int64_t, int64_t> denoising_counts(const SeamInputs& inputs) {
  if (inputs.tail.size() != 2 || inputs.tail[0].numel() != 2)
    throw UsageError("denoising: the network seam's tail reads the group's size and its pairs");
  const auto meta = inputs.tail[0].to(torch::kCPU, torch::kLong);
  return {meta[0].item<int64_t>(), meta[1].item<int64_t>()};
}

std::optional<DenoisingGroup> make_denoising_group(const std::vector<ImageTargets>& gts, int64_t nc, int64_t matching,
                                                   const DenoisingOptions& options, const DenoisingSource& source) {
  if (options.count <= 0 || gts.empty()) return std::nullopt;
  int64_t m = 0;
  for (const auto& g : gts) m = std::max(m, g.size());
  if (m == 0) return std::nullopt;
  const int64_t batch = static_cast<int64_t>(gts.size());
  const int64_t groups = std::max<int64_t>(1, options.count / m), n = 2 * m * groups;
  const auto device = gts[0].boxes.device();
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);

  // One row of 2m slots per image (positives, then negatives), repeated G times.
  auto labels = torch::full({batch, m}, nc, f32.dtype(torch::kLong));
  auto boxes = torch::zeros({batch, m, 4}, f32);
  auto real = torch::zeros({batch, m}, f32.dtype(torch::kBool));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t k = gts[b].size();
    if (k == 0) continue;
    labels[b].narrow(0, 0, k).copy_(gts[b].labels);
    boxes[b].narrow(0, 0, k).copy_(gts[b].boxes);
    real[b].narrow(0, 0, k).fill_(true);
  }
  labels = labels.repeat({1, 2 * groups});
  boxes = boxes.repeat({1, 2 * groups, 1});
  real = real.repeat({1, 2 * groups});
  const auto negative = (torch::arange(n, f32.dtype(torch::kLong)).remainder(2 * m) >= m).view({1, n, 1});

  DenoisingGroup dn;
  dn.max_gt = m;
  dn.groups = groups;
  dn.queries = n;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t k = gts[b].size();
    std::vector<int64_t> idx, gt;
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t r = 0; r < k; ++r) {
        idx.push_back(2 * m * g + r);
        gt.push_back(r);
      }
    dn.positive_idx.push_back(torch::tensor(idx, torch::kLong));
    dn.positive_gt.push_back(torch::tensor(gt, torch::kLong));
  }

  const auto draws = source(batch, n, nc, device);
  if (draws.label_u.sizes() != labels.sizes() || draws.new_label.sizes() != labels.sizes() ||
      draws.sign_bits.sizes() != boxes.sizes() || draws.part_u.sizes() != boxes.sizes())
    throw UsageError("denoising: the random draws do not have the group's shapes [B, N] and [B, N, 4]");
  if (options.label_noise > 0) {
    const auto flip = (draws.label_u.to(device) < options.label_noise * 0.5) & real;
    labels = torch::where(flip, draws.new_label.to(device, torch::kLong), labels);
  }
  if (options.box_noise > 0) {
    auto xyxy = cxcywh_to_xyxy(boxes);
    const auto half = (boxes.narrow(-1, 2, 2) * 0.5).repeat({1, 1, 2}) * options.box_noise;
    const auto sign = draws.sign_bits.to(device, torch::kFloat) * 2.0 - 1.0;
    const auto u = draws.part_u.to(device, torch::kFloat);
    const auto part = torch::where(negative, u + 1.0, u) * sign;
    xyxy = (xyxy + part * half).clamp(0.0, 1.0);
    boxes = xyxy_to_cxcywh(xyxy);
  }
  dn.labels = labels;
  dn.boxes = boxes;
  dn.box_unact = inverse_sigmoid(boxes);
  dn.attn_mask = denoising_attn_mask(m, groups, matching, device);
  return dn;
}

}  // namespace libreyolo::models::rtdetr
