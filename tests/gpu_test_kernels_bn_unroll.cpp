// The BatchNorm reductions load a thread's rows several at a time (BnActLaunch::unroll) only to
// keep more memory accesses in flight: every output must be bit for bit the one-row-at-a-time
// launch's, for each element type, vector width and row count (a remainder of rows included),
// in the plain forward, SyncBN's local statistics and the backward reduction.

#include <c10/cuda/CUDAStream.h>

#include "kernels/bn_act.hpp"
#include "support.hpp"

namespace k = libreyolo::kernels;

namespace {

struct Outputs {
  std::vector<torch::Tensor> all;
};

k::DType dtype_of(torch::ScalarType t) {
  return t == torch::kFloat ? k::DType::Float32 : t == torch::kHalf ? k::DType::Float16 : k::DType::BFloat16;
}

Outputs run(int unroll, int64_t rows, int channels, torch::ScalarType type, bool act, uint64_t seed) {
  torch::manual_seed(seed);
  const auto dev = torch::Device(torch::kCUDA);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(dev);
  const torch::Tensor x = (torch::randn({rows, channels}, f32) * 3 + 1).to(type);
  const torch::Tensor dy = torch::randn({rows, channels}, f32).to(type);
  const torch::Tensor gamma = torch::rand({channels}, f32) + 0.5, beta = torch::randn({channels}, f32);
  torch::Tensor rm = torch::zeros({channels}, f32), rv = torch::ones({channels}, f32);
  k::BnActLaunch l;
  l.rows = rows;
  l.channels = channels;
  l.vec = k::bn_act_vector_width(channels);
  l.row_blocks = k::bn_act_row_blocks(rows, channels, l.vec);
  l.dtype = dtype_of(type);
  l.act = act;
  l.stream = c10::cuda::getCurrentCUDAStream().stream();
  l.unroll = unroll;
  const int64_t plane = static_cast<int64_t>(l.row_blocks) * channels;
  torch::Tensor partials = torch::empty({3 * plane}, f32);
  torch::Tensor counters = torch::zeros({k::bn_act_counters(channels, l.vec)}, f32.dtype(torch::kInt));
  auto* cnt = reinterpret_cast<unsigned*>(counters.data_ptr<int>());
  torch::Tensor mean = torch::empty({channels}, f32), invstd = torch::empty({channels}, f32);
  torch::Tensor y = torch::empty_like(x);
  k::bn_act_forward(l, x.data_ptr(), gamma.data_ptr<float>(), beta.data_ptr<float>(), rm.data_ptr<float>(),
                    rv.data_ptr<float>(), 0.03f, 1e-3f, partials.data_ptr<float>(), cnt, mean.data_ptr<float>(),
                    invstd.data_ptr<float>(), y.data_ptr());
  torch::Tensor row = torch::zeros({2 * channels + 1}, f32);
  k::bn_act_local_stats(l, x.data_ptr(), 1e-3f, partials.data_ptr<float>(), cnt, row.data_ptr<float>());
  torch::Tensor dsum = torch::empty({2 * channels}, f32), dgamma = torch::empty({channels}, f32),
                dbeta = torch::empty({channels}, f32), dx = torch::empty_like(x);
  k::bn_act_backward_reduce(l, dy.data_ptr(), x.data_ptr(), gamma.data_ptr<float>(), beta.data_ptr<float>(),
                            mean.data_ptr<float>(), invstd.data_ptr<float>(), partials.data_ptr<float>(), cnt,
                            dsum.data_ptr<float>(), dgamma.data_ptr<float>(), dbeta.data_ptr<float>(), false);
  k::bn_act_backward_elemt(l, dy.data_ptr(), x.data_ptr(), gamma.data_ptr<float>(), beta.data_ptr<float>(),
                           mean.data_ptr<float>(), invstd.data_ptr<float>(), dsum.data_ptr<float>(), nullptr,
                           dx.data_ptr());
  torch::cuda::synchronize();
  // The counters are back at zero after every launch (the contract the unrolled kernels keep).
  EXPECT_EQ(counters.abs().sum().item<int>(), 0);
  return {{mean, invstd, rm, rv, y, row, dsum, dgamma, dbeta, dx}};
}

}  // namespace

TEST(BnKernelsGpu, UnrolledReductionsEqualOneRowAtATimeBitForBit) {
  LY_REQUIRE_CUDA();
  ASSERT_EQ(k::bn_act_max_unroll(), 4);
  struct Case {
    int64_t rows;
    int channels;
    torch::ScalarType type;
    bool act;
  };
  // Rows from a 640-px first layer (1.6M: many rows per thread) down to fewer than one unrolled
  // iteration; C = 16 and 48 (vectors of 8), 5 (scalar lanes), 256 (several channel blocks).
  const std::vector<Case> cases = {{1638400, 16, torch::kBFloat16, true}, {409600, 48, torch::kHalf, true},
                                   {102400 + 77, 256, torch::kFloat, false}, {12345, 5, torch::kBFloat16, true},
                                   {333, 48, torch::kBFloat16, true},         {7, 16, torch::kFloat, true}};
  const char* names[] = {"mean", "invstd", "running_mean", "running_var", "y", "syncbn_row", "dsum", "dgamma", "dbeta", "dx"};
  uint64_t seed = 40;
  for (const Case& c : cases) {
    const Outputs a = run(1, c.rows, c.channels, c.type, c.act, seed);
    const Outputs b = run(k::bn_act_max_unroll(), c.rows, c.channels, c.type, c.act, seed);
    ++seed;
    for (size_t i = 0; i < a.all.size(); ++i)
      EXPECT_TRUE(torch::equal(a.all[i], b.all[i])) << names[i] << " differs: rows " << c.rows << " C " << c.channels;
  }
}
