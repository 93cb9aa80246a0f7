// The fused BatchNorm kernels' one-launch forms (statistics + apply, backward sums + input
// gradient in one kernel whose blocks wait for the reduction's last block) against the two-launch
// forms on the same inputs: every output equal bit for bit, over launches that fit on the GPU at
// once and one that does not (it falls back), repeated so that the generation words advance.
#include <c10/cuda/CUDAStream.h>

#include "kernels/bn_act.hpp"
#include "support.hpp"

namespace {

namespace k = libreyolo::kernels;

struct Shape {
  int64_t rows;
  int channels;
  torch::ScalarType dtype;
  bool act;
};

struct Outputs {
  std::vector<torch::Tensor> all;  // y, mean/invstd, running stats, dsum, dgamma, dbeta, dx
};

Outputs run(const Shape& sh, bool one_launch, bool accumulate, bool* took_fwd, bool* took_bwd) {
  const auto dev = torch::Device(torch::kCUDA, 0);
  const auto f32 = torch::TensorOptions().device(dev).dtype(torch::kFloat);
  torch::manual_seed(7);
  const int64_t C = sh.channels;
  const torch::Tensor x = (torch::randn({sh.rows, C}, f32) * 3 + 1).to(sh.dtype);
  const torch::Tensor dy = torch::randn({sh.rows, C}, f32).to(sh.dtype);
  const torch::Tensor gamma = torch::rand({C}, f32) + 0.5, beta = torch::randn({C}, f32);
  torch::Tensor rm = torch::randn({C}, f32), rv = torch::rand({C}, f32) + 1;
  torch::Tensor counters = torch::zeros({k::bn_act_counter_words()}, f32.dtype(torch::kInt));
  torch::Tensor scratch = torch::empty({4 * k::bn_act_max_partials_per_plane() + 4 * C}, f32);
  torch::Tensor stats = torch::empty({2 * C}, f32), y = torch::empty_like(x), dx = torch::empty_like(x);
  torch::Tensor dsum = torch::empty({2 * C}, f32);
  torch::Tensor dg = accumulate ? torch::randn({C}, f32) : torch::empty({C}, f32);
  torch::Tensor db = accumulate ? torch::randn({C}, f32) : torch::empty({C}, f32);
  k::BnActLaunch l;
  l.rows = sh.rows;
  l.channels = sh.channels;
  l.vec = k::bn_act_vector_width(l.channels);
  l.row_blocks = k::bn_act_row_blocks(l.rows, l.channels, l.vec);
  l.dtype = sh.dtype == torch::kFloat ? k::DType::Float32 : sh.dtype == torch::kHalf ? k::DType::Float16
                                                                                     : k::DType::BFloat16;
  l.act = sh.act;
  l.stream = c10::cuda::getCurrentCUDAStream(0).stream();
  l.one_launch = one_launch;
  *took_fwd = k::bn_act_takes_one_launch(l, false);
  *took_bwd = k::bn_act_takes_one_launch(l, true);
  auto* cnt = reinterpret_cast<unsigned*>(counters.data_ptr<int>());
  float* mean = stats.data_ptr<float>();
  Outputs o;
  for (int rep = 0; rep < 3; ++rep) {  // the running statistics and accumulated gradients move each time
    k::bn_act_forward(l, x.data_ptr(), gamma.data_ptr<float>(), beta.data_ptr<float>(), rm.data_ptr<float>(),
                      rv.data_ptr<float>(), 0.03f, 1e-3f, scratch.data_ptr<float>(), cnt, mean, mean + C, y.data_ptr());
    k::bn_act_backward(l, dy.data_ptr(), x.data_ptr(), gamma.data_ptr<float>(), beta.data_ptr<float>(), mean,
                       mean + C, scratch.data_ptr<float>(), cnt, dsum.data_ptr<float>(), dg.data_ptr<float>(),
                       db.data_ptr<float>(), accumulate, dx.data_ptr());
  }
  torch::cuda::synchronize();
  // The counters are back to zero (the generation words may have moved).
  EXPECT_EQ(counters.narrow(0, 0, k::bn_act_max_counters()).abs().sum().item<int64_t>(), 0);
  o.all = {y, stats, rm, rv, dsum, dg, db, dx};
  return o;
}

}  // namespace

TEST(GpuBnActOneLaunch, EqualsTwoLaunchesBitForBit) {
  LY_REQUIRE_CUDA();
  const std::vector<Shape> shapes = {
      {3200, 128, torch::kBFloat16, true},    // 20x20, batch 8
      {800, 256, torch::kHalf, true},         // many channels, few rows
      {51200, 32, torch::kFloat, false},      // 80x80, batch 8, no activation
      {1000, 5, torch::kBFloat16, true},      // channels not a multiple of 8 (scalar accesses)
      {7, 64, torch::kBFloat16, true},        // fewer rows than a block's
      {819200, 16, torch::kBFloat16, true},   // 320x320, batch 8: more blocks than fit at once
  };
  int one_fwd = 0, one_bwd = 0;
  for (const auto& sh : shapes) {
    for (bool accumulate : {false, true}) {
      bool f1 = false, b1 = false, f0 = true, b0 = true;
      const Outputs two = run(sh, false, accumulate, &f0, &b0);
      const Outputs one = run(sh, true, accumulate, &f1, &b1);
      EXPECT_FALSE(f0 || b0);
      one_fwd += f1, one_bwd += b1;
      const char* names[] = {"y", "mean/invstd", "running mean", "running var", "dsum", "dgamma", "dbeta", "dx"};
      for (size_t i = 0; i < two.all.size(); ++i) {
        EXPECT_TRUE(torch::equal(two.all[i].cpu(), one.all[i].cpu()))
            << names[i] << " differs: rows " << sh.rows << " channels " << sh.channels << " accumulate " << accumulate
            << " (one launch: forward " << f1 << ", backward " << b1 << ")";
      }
    }
  }
  std::cerr << "[ info ] one launch taken in " << one_fwd << " forward and " << one_bwd << " backward of "
            << 2 * shapes.size() << " cases\n";
  // All but the largest shape fit on any GPU with a few dozen multiprocessors.
  EXPECT_GE(one_fwd, 10);
  EXPECT_GE(one_bwd, 10);
}
