#include "dist/syncs.hpp"

namespace libreyolo::dist {

namespace {

bool channels_last_4d(const torch::Tensor& g) {
  return !g.is_contiguous() && g.dim() == 4 && g.is_contiguous(torch::MemoryFormat::ChannelsLast);
}

// The gradient's elements in memory order, as a view where its layout allows (contiguous or
// channels_last), so that the way back can be a copy between equal strides.
torch::Tensor flat_view(const torch::Tensor& g) {
  return channels_last_4d(g) ? g.permute({0, 2, 3, 1}).reshape({-1}) : g.reshape({-1});
}

// `part` (g.numel() values in flat_view's order) viewed with g's sizes and strides.
torch::Tensor shaped_like(const torch::Tensor& part, const torch::Tensor& g) {
  if (channels_last_4d(g)) return part.view({g.size(0), g.size(2), g.size(3), g.size(1)}).permute({0, 3, 1, 2});
  return part.view(g.sizes());
}

}  // namespace

AllReduceGradSync::AllReduceGradSync(std::shared_ptr<Group> group, int64_t bucket_bytes)
    : group_(std::move(group)), bucket_bytes_(bucket_bytes) {}

void AllReduceGradSync::after_backward(std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard ng;
  const double inv = 1.0 / static_cast<double>(group_->world_size());
  // Consecutive gradients of one dtype, up to bucket_bytes_ each, flattened into one buffer per
  // bucket: one all-reduce per bucket, then the mean copied back into the gradients in place.
  size_t i = 0;
  while (i < grads.size()) {
    if (!grads[i].defined()) {
      ++i;
      continue;
    }
    const auto dtype = grads[i].scalar_type();
    std::vector<torch::Tensor> bucket;
    int64_t bytes = 0;
    while (i < grads.size() && grads[i].defined() && grads[i].scalar_type() == dtype &&
           (bucket.empty() || bytes + grads[i].nbytes() <= static_cast<size_t>(bucket_bytes_))) {
      bytes += static_cast<int64_t>(grads[i].nbytes());
      bucket.push_back(grads[i++]);
    }
    std::vector<torch::Tensor> flat_parts;
    std::vector<int64_t> numels;
    flat_parts.reserve(bucket.size());
    numels.reserve(bucket.size());
    for (auto& g : bucket) {
      flat_parts.push_back(flat_view(g));
      numels.push_back(g.numel());
    }
    std::vector<torch::Tensor> flat{torch::cat(flat_parts)};
    group_->all_reduce_sum(flat);
    flat[0].mul_(inv);
    // Back into the gradients with one multi-tensor copy (a few kernels, not one per gradient:
    // v9-t has about 700 gradient tensors).
    std::vector<torch::Tensor> parts = flat[0].split_with_sizes(numels);
    for (size_t k = 0; k < bucket.size(); ++k) parts[k] = shaped_like(parts[k], bucket[k]);
    at::_foreach_copy_(bucket, parts);
  }
}

void GroupSum::all_reduce_sum(torch::Tensor& t) {
  std::vector<torch::Tensor> v{t};
  group_->all_reduce_sum(v);
}

void broadcast_module(torch::nn::Module& m, Group& group, int src) {
  torch::NoGradGuard ng;
  auto send = [&](torch::Tensor t) {
    if (!t.defined()) return;
    if (t.is_contiguous()) {
      group.broadcast(t, src);
    } else {
      auto c = t.contiguous();
      group.broadcast(c, src);
      t.copy_(c);
    }
  };
  for (auto& p : m.parameters(true)) send(p);
  for (auto& b : m.buffers(true)) send(b);
}

}  // namespace libreyolo::dist
