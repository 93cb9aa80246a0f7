#include "families/yolo9/blocks.hpp"

#include "layers/branches.hpp"
#include "layers/concat.hpp"
#include "layers/slice_ops.hpp"
#include "layers/conv_bn_act.hpp"
#include "layers/pool2.hpp"

#include <optional>

namespace libreyolo::models::yolo9 {

RepConvNImpl::RepConvNImpl(int64_t c1, int64_t c2) {
  conv1 = register_module("conv1", Conv(c1, c2, 3, 1, 1, false));
  conv2 = register_module("conv2", Conv(c1, c2, 1, 1, 1, false));
}

// silu(conv1(x) + conv2(x)). In training one node for both branches where the CUDA kernels take it
// (layers/conv_bn_act.hpp repconvn_train), else the sum and SiLU inside conv2's node.
torch::Tensor RepConvNImpl::forward(const torch::Tensor& x) {
  const auto sources = fold_sources();
  if (common::fold_allowed(x, sources)) return common::run_folded(fold_, sources, x, {1, 1, 1, true});  // conv1's 3x3
  if (conv1->bn->is_training() && conv2->bn->is_training()) {
    const ConvBnActParams p1 = conv1->training_params(false), p2 = conv2->training_params(false);
    if (repconvn_train_applicable(x, p1, p2)) return repconvn_train(x, p1, p2);
  }
  return conv2->forward_sum_silu(x, conv1->forward(x));
}

RepNBottleneckImpl::RepNBottleneckImpl(int64_t c) {
  cv1 = register_module("cv1", RepConvN(c, c));
  cv2 = register_module("cv2", Conv(c, c, 3));
}

torch::Tensor RepNBottleneckImpl::forward(const torch::Tensor& x, const torch::Tensor* into) {
  return cv2->forward(cv1->forward(x), {into, &x});
}

RepNCSPImpl::RepNCSPImpl(int64_t c1, int64_t c2, int64_t n) {
  const int64_t c_ = c2 / 2;
  cv1 = register_module("cv1", Conv(c1, c_, 1));
  cv2 = register_module("cv2", Conv(c1, c_, 1));
  cv3 = register_module("cv3", Conv(2 * c_, c2, 1));
  torch::nn::ModuleList list;
  for (int64_t i = 0; i < n; ++i) {
    m.emplace_back(c_);
    list->push_back(m.back());
  }
  register_module("m", list);
}

torch::Tensor RepNCSPImpl::forward(const torch::Tensor& x, const ConvOutput& o) {
  if (!common::ChannelConcat::applies(x)) {
    auto a = cv1->forward(x);
    for (auto& b : m) a = b->forward(a);
    return cv3->forward(torch::cat({a, cv2->forward(x)}, 1), o);
  }
  // The last producer of each half writes it into the concatenation; cv2 on a side stream while
  // the bottlenecks run (common/branches.hpp).
  const int64_t c_ = cv1->conv->weight.size(0);
  const common::ChannelConcat cat(x, *cv1, {c_, c_});
  {
    common::Branches branches(x);
    branches.side([&] { cv2->forward(x, {cat.part(1)}); });
    if (m.empty()) {
      cv1->forward(x, {cat.part(0)});
    } else {
      auto a = cv1->forward(x);
      for (size_t i = 0; i + 1 < m.size(); ++i) a = m[i]->forward(a);
      m.back()->forward(a, cat.part(0));
    }
  }  // joined
  return cv3->forward(cat.whole(), o);
}

CSPStageImpl::CSPStageImpl(int64_t c1, int64_t c2, int64_t n) {
  csp = register_module("0", RepNCSP(c1, c2, n));
  conv = register_module("1", Conv(c2, c2, 3));
}

torch::Tensor CSPStageImpl::forward(const torch::Tensor& x, const ConvOutput& o) {
  return conv->forward(csp->forward(x), o);
}

namespace {

// cv4(cat[y, p, q]) with y = cv1(x), p = cv2(second half of y's channels), q = cv3(p): ELAN and
// RepNCSPELAN. cat[a, b, p, q] with [a, b] = chunk(y) is cat[y, p, q]: y is reused, not split and
// re-concatenated. Assembled in place (common/concat.hpp) when no autograd graph is recorded.
template <class Mid>
torch::Tensor elan_forward(const torch::Tensor& x, Conv& cv1, Mid& cv2, Mid& cv3, Conv& cv4, int64_t c3,
                           const ConvOutput& o) {
  const int64_t c2 = cv1->conv->weight.size(0), half = (c2 + 1) / 2;
  if (!common::ChannelConcat::applies(x)) {
    const auto [y, second] = common::with_channel_slice(cv1->forward(x), half, c2 - half);
    auto p = cv2->forward(second);
    auto q = cv3->forward(p);
    return cv4->forward(torch::cat({y, p, q}, 1), o);
  }
  const common::ChannelConcat cat(x, *cv1, {c2, c3, c3});
  const auto y = cv1->forward(x, {cat.part(0)});
  const auto p = cv2->forward(y.narrow(1, half, c2 - half), {cat.part(1)});
  cv3->forward(p, {cat.part(2)});
  return cv4->forward(cat.whole(), o);
}

}  // namespace

ELANImpl::ELANImpl(int64_t c1, int64_t c2, int64_t c3, int64_t c4) {
  cv1 = register_module("cv1", Conv(c1, c2, 1));
  cv2 = register_module("cv2", Conv(c2 / 2, c3, 3));
  cv3 = register_module("cv3", Conv(c3, c3, 3));
  cv4 = register_module("cv4", Conv(c2 + 2 * c3, c4, 1));
}

torch::Tensor ELANImpl::forward(const torch::Tensor& x, const ConvOutput& o) {
  return elan_forward(x, cv1, cv2, cv3, cv4, cv2->conv->weight.size(0), o);
}

RepNCSPELANImpl::RepNCSPELANImpl(int64_t c1, int64_t c2, int64_t c3, int64_t c4, int64_t n) {
  cv1 = register_module("cv1", Conv(c1, c2, 1));
  cv2 = register_module("cv2", CSPStage(c2 / 2, c3, n));
  cv3 = register_module("cv3", CSPStage(c3, c3, n));
  cv4 = register_module("cv4", Conv(c2 + 2 * c3, c4, 1));
}

torch::Tensor RepNCSPELANImpl::forward(const torch::Tensor& x, const ConvOutput& o) {
  return elan_forward(x, cv1, cv2, cv3, cv4, cv2->conv->conv->weight.size(0), o);
}

AConvImpl::AConvImpl(int64_t c1, int64_t c2) {
  cv = register_module("cv", Conv(c1, c2, 3, 2));
}

torch::Tensor AConvImpl::forward(const torch::Tensor& x, const ConvOutput& o) {
  return cv->forward(avg_pool2_split(x, x.size(1)).first, o);
}

ADownImpl::ADownImpl(int64_t c1, int64_t c2) {
  cv1 = register_module("cv1", Conv(c1 / 2, c2 / 2, 3, 2));
  cv2 = register_module("cv2", Conv(c1 / 2, c2 / 2, 1, 1));
}

torch::Tensor ADownImpl::forward(const torch::Tensor& x, const ConvOutput& o) {
  const int64_t half = (x.size(1) + 1) / 2;  // torch.chunk puts the larger part first
  const auto [first, second] = avg_pool2_split(x, half);
  const auto pooled = torch::max_pool2d(second, {3, 3}, {2, 2}, {1, 1});
  if (!common::ChannelConcat::applies(x)) {
    auto y = torch::cat({cv1->forward(first), cv2->forward(pooled)}, 1);
    return finish_output(y, o);
  }
  // Both halves written into their slices of the result (or of o.into).
  const int64_t ca = cv1->conv->weight.size(0), cb = cv2->conv->weight.size(0);
  std::optional<common::ChannelConcat> own;
  const torch::Tensor* whole = o.into;
  if (!whole) {
    own.emplace(pooled.size(0), pooled.size(2), pooled.size(3), common::ChannelConcat::options(first, *cv1),
                std::vector<int64_t>{ca, cb});
    whole = &own->whole();
  }
  const torch::Tensor a = whole->narrow(1, 0, ca), b = whole->narrow(1, ca, cb);
  cv1->forward(first, {&a});
  cv2->forward(pooled, {&b});
  if (o.residual) whole->add_(*o.residual);
  return *whole;
}

SPPELANImpl::SPPELANImpl(int64_t c1, int64_t c2, int64_t c3) {
  cv1 = register_module("cv1", Conv(c1, c2, 1));
  cv5 = register_module("cv5", Conv(4 * c2, c3, 1));
}

torch::Tensor SPPELANImpl::forward(const torch::Tensor& x, const ConvOutput& o) {
  if (common::ChannelConcat::applies(x)) {  // cv1 and the three pools write their slices
    const int64_t c = cv1->conv->weight.size(0);
    const common::ChannelConcat cat(x, *cv1, {c, c, c, c});
    const auto y0 = cv1->forward(x, {cat.part(0)});
    common::spp_max_pools_into(y0, *cat.part(1), *cat.part(2), *cat.part(3));
    return cv5->forward(cat.whole(), o);
  }
  auto y0 = cv1->forward(x);
  auto y1 = torch::max_pool2d(y0, {5, 5}, {1, 1}, {2, 2});
  auto y2 = torch::max_pool2d(y1, {5, 5}, {1, 1}, {2, 2});
  auto y3 = torch::max_pool2d(y2, {5, 5}, {1, 1}, {2, 2});
  return cv5->forward(torch::cat({y0, y1, y2, y3}, 1), o);
}

}  // namespace libreyolo::models::yolo9
