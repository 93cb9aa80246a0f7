// The EMA update on CUDA in one launch (kernels/lerp_list.hpp) against ATen's three multi-tensor
// passes: the same bits, eagerly and replayed from a CUDA graph, and after a tensor is replaced.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "engine/ema.hpp"
#include "support.hpp"

using namespace libreyolo;

namespace {

// A conv weight in channels_last (a non-contiguous but dense layout), BatchNorm statistics, and
// sizes around the kernel's 8,192-element items and its 4-wide vector accesses.
torch::nn::Sequential small_model(const torch::Device& dev) {
  torch::nn::Sequential m(torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 40, 3).bias(false)),
                          torch::nn::BatchNorm2d(40), torch::nn::Linear(97, 211), torch::nn::Linear(8192, 3),
                          torch::nn::Linear(3, 5));
  m->to(dev);
  for (auto& p : m->named_parameters())
    if (p.value().dim() == 4) p.value().set_data(p.value().contiguous(at::MemoryFormat::ChannelsLast));
  return m;
}

void perturb(torch::nn::Module& m, int step) {
  torch::NoGradGuard ng;
  for (auto& p : m.parameters()) p.add_(torch::randn_like(p) * (0.01 * (step + 1)));
  for (auto& b : m.buffers())
    if (b.is_floating_point()) b.mul_(0.9).add_(0.05 * (step + 1));
}

std::vector<torch::Tensor> state(torch::nn::Module& m) {
  std::vector<torch::Tensor> s;
  for (auto& p : m.parameters()) s.push_back(p.detach().clone());
  for (auto& b : m.buffers()) s.push_back(b.clone());
  return s;
}

void expect_same_bits(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << what << ": tensor " << i;
}

}  // namespace

TEST(GpuEma, OneLaunchEqualsMultiTensorPassesEagerGraphedAndAfterAReplacedTensor) {
  LY_REQUIRE_CUDA();
  const torch::Device dev(torch::kCUDA, 0);
  torch::manual_seed(3);
  auto model = small_model(dev);
  auto ema_a = small_model(dev), ema_b = small_model(dev);
  {  // both averages start from the same values, not the model's
    torch::NoGradGuard ng;
    auto pa = ema_a->parameters(), pb = ema_b->parameters();
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  const auto start = state(*ema_a);
  engine::ModelEMA a(ema_a.ptr(), *model, 0.999, 20.0), b(ema_b.ptr(), *model, 0.999, 20.0);
  auto update = [&](engine::ModelEMA& e, bool kernel) {
    engine::set_ema_kernel(kernel);
    e.update(*model);
  };
  for (int step = 0; step < 5; ++step) {
    perturb(*model, step);
    update(a, true);
    update(b, false);
  }
  engine::set_ema_kernel(true);
  auto sa = state(*ema_a), sb = state(*ema_b);
  expect_same_bits(sa, sb, "eager");
  // The averages moved (a no-op kernel would pass the comparison above if the ATen side also did
  // nothing; it does not, but say so).
  for (size_t i = 0; i < start.size(); ++i)
    if (start[i].is_floating_point()) EXPECT_FALSE(torch::equal(sa[i], start[i])) << "tensor " << i << " did not move";

  // Captured: stage() outside the graph, apply() replayed.
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard g(side);
    graph.capture_begin();
    a.apply(*model);
    graph.capture_end();
  }
  torch::cuda::synchronize();
  {  // the capture itself ran nothing: bring b to the same point by one eager update first
    engine::set_ema_kernel(false);
    b.apply(*model);
    engine::set_ema_kernel(true);
    graph.replay();
    torch::cuda::synchronize();
  }
  expect_same_bits(state(*ema_a), state(*ema_b), "after one replay");
  for (int step = 5; step < 8; ++step) {
    perturb(*model, step);
    a.stage();
    graph.replay();
    engine::set_ema_kernel(false);
    b.stage();
    b.apply(*model);
    engine::set_ema_kernel(true);
  }
  torch::cuda::synchronize();
  expect_same_bits(state(*ema_a), state(*ema_b), "replayed");

  // A model tensor replaced by a new allocation: the work table follows it.
  {
    torch::NoGradGuard ng;
    auto p = model->parameters()[2];
    p.set_data(p.detach().clone() + 1.0);
  }
  update(a, true);
  update(b, false);
  expect_same_bits(state(*ema_a), state(*ema_b), "after a replaced tensor");
}
