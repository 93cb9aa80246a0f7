#include "dist/syncs.hpp"

namespace libreyolo::dist {

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
    flat_parts.reserve(bucket.size());
    for (auto& g : bucket) flat_parts.push_back(g.reshape({-1}));
    std::vector<torch::Tensor> flat{torch::cat(flat_parts)};
    group_->all_reduce_sum(flat);
    flat[0].mul_(inv);
    int64_t off = 0;
    for (auto& g : bucket) {
      const int64_t n = g.numel();
      g.copy_(flat[0].narrow(0, off, n).view(g.sizes()));
      off += n;
    }
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
