// The fused Conv+BN+SiLU node's CUDA kernels (channels_last) against the composed ATen ops on
// the same GPU: block by block for fp32 and under fp16/bf16 autocast, then a whole YOLOv9-t
// training backward. Errors are reported so they are on record.
#include <ATen/autocast_mode.h>

#include "conv_bn_act_check.hpp"
#include "layers/cudnn_fusion.hpp"
#include "support.hpp"

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "kernels/bn_act.hpp"
#endif

namespace {

using libreyolo::test::ConvCase;
using libreyolo::test::ConvRun;
using libreyolo::test::rel_err;
using libreyolo::test::run_conv_case;

torch::Tensor autocast_forward(c10::ScalarType dtype, const std::function<torch::Tensor()>& fn) {
  at::autocast::set_autocast_dtype(at::kCUDA, dtype);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  auto y = fn();
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
  return y;
}

torch::Tensor cpu(const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kFloat); }

struct Tol {
  double y, grad;
};

void compare(const std::string& label, const ConvCase& cc, c10::optional<c10::ScalarType> amp, Tol tol) {
  std::function<torch::Tensor(const std::function<torch::Tensor()>&)> wrap;
  if (amp) wrap = [&](const std::function<torch::Tensor()>& fn) { return autocast_forward(*amp, fn); };
  const ConvRun f = run_conv_case(cc, true, torch::kCUDA, wrap);
  const ConvRun u = run_conv_case(cc, false, torch::kCUDA, wrap);
  ASSERT_NE(f.node.find("ConvBnActFn"), std::string::npos) << f.node;
  ASSERT_EQ(u.node.find("ConvBnActFn"), std::string::npos) << u.node;
  const double ey = rel_err(cpu(f.y), cpu(u.y));
  const double edx = cc.x_requires_grad ? rel_err(cpu(f.dx), cpu(u.dx)) : 0.0;
  const double edw = rel_err(cpu(f.dw), cpu(u.dw));
  const double edg = rel_err(cpu(f.dgamma), cpu(u.dgamma));
  const double edb = rel_err(cpu(f.dbeta), cpu(u.dbeta));
  const double erm = rel_err(cpu(f.running_mean), cpu(u.running_mean));
  const double erv = rel_err(cpu(f.running_var), cpu(u.running_var));
  std::cout << "[ REPORT   ] " << label << ": y " << ey << ", dx " << edx << ", dw " << edw << ", dgamma " << edg
            << ", dbeta " << edb << ", running mean " << erm << ", var " << erv << "\n";
  EXPECT_LE(ey, tol.y) << label;
  EXPECT_LE(edx, tol.grad) << label;
  EXPECT_LE(edw, tol.grad) << label;
  EXPECT_LE(edg, tol.grad) << label;
  EXPECT_LE(edb, tol.grad) << label;
  EXPECT_LE(erm, 1e-4) << label;
  EXPECT_LE(erv, 1e-4) << label;
}

std::vector<std::pair<std::string, ConvCase>> cases() {
  std::vector<std::pair<std::string, ConvCase>> out;
  ConvCase a;  // 3x3, SiLU
  a.c1 = 16, a.c2 = 32, a.input = {8, 16, 40, 40};
  out.emplace_back("3x3 16->32 40x40", a);
  ConvCase b;  // pointwise GEMM, channel count not a power of two
  b.c1 = 32, b.c2 = 48, b.k = 1, b.input = {4, 32, 20, 20};
  out.emplace_back("1x1 32->48 20x20", b);
  ConvCase c;  // strided, no activation (RepConvN's branches)
  c.c1 = 16, c.c2 = 16, c.s = 2, c.act = false, c.input = {4, 16, 33, 31};
  out.emplace_back("3x3/2 16->16 noact", c);
  ConvCase d;  // few channels (a partial warp of lanes)
  d.c1 = 3, d.c2 = 5, d.input = {2, 3, 17, 19};
  out.emplace_back("3x3 3->5", d);
  ConvCase e;  // many channels, few rows
  e.c1 = 64, e.c2 = 256, e.k = 1, e.input = {2, 64, 5, 5};
  out.emplace_back("1x1 64->256 5x5", e);
  ConvCase g;  // many rows (the first layer of a 640-px batch of 8), accumulating over 2 passes
  g.c1 = 3, g.c2 = 16, g.s = 2, g.input = {8, 3, 640, 640}, g.backward_passes = 2;
  out.emplace_back("3x3/2 3->16 640px x2", g);
  ConvCase h;  // grouped (YOLOv9's box towers): run as the dense form through the training plans
  h.c1 = 64, h.c2 = 64, h.groups = 4, h.input = {4, 64, 20, 20};
  out.emplace_back("3x3 64->64 groups 4", h);
  ConvCase i = h;  // the same with the weight gradient deferred (StepRunner) over two passes
  i.deferred = true, i.backward_passes = 2;
  out.emplace_back("3x3 64->64 groups 4 deferred x2", i);
  for (auto& [label, cc] : out) cc.channels_last = true;
  return out;
}

// A grouped block in training runs its convolution and both gradients as the dense form through
// cached cuDNN plans (three new configurations), not through ATen's grouped convolution, which
// autotunes in every new process; its results are compared with the composed ops above.
TEST(ConvBnActGpu, GroupedTrainingConvolutionTakesCachedPlans) {
  LY_REQUIRE_CUDA();
  if (!libreyolo::models::cudnn_fusion_enabled() || !libreyolo::models::cudnn_fusion_takes(torch::kBFloat16))
    GTEST_SKIP() << "this build has no cudnn_frontend (or the fusion is off): no training plans";
  ConvCase h;
  h.c1 = 32, h.c2 = 32, h.groups = 2, h.input = {2, 32, 24, 24}, h.channels_last = true;
  const auto before = libreyolo::models::cudnn_fusion_stats();
  run_conv_case(h, true, torch::kCUDA, [](const std::function<torch::Tensor()>& fn) {
    return autocast_forward(torch::kBFloat16, fn);
  });
  const auto after = libreyolo::models::cudnn_fusion_stats();
  std::cout << "[ REPORT   ] grouped block: plans " << before.fused << " -> " << after.fused << ", declined "
            << before.declined << " -> " << after.declined << "\n";
  EXPECT_GE(after.fused - before.fused, 3);
}

// The kernels' addend (RepConvN's sum before SiLU, a residual after it): fp32 with 8-channel
// vectors and with odd channel counts (one channel per thread), and under bf16 autocast.
TEST(ConvBnActGpu, AddendInsideTheKernelsMatchesComposedOps) {
  LY_REQUIRE_CUDA();
  struct Case {
    std::vector<int64_t> input;
    int64_t c2;
    c10::optional<c10::ScalarType> amp;
    double tol;
  };
  const std::vector<Case> cases = {{{4, 16, 20, 20}, 32, c10::nullopt, 1e-4},
                                   {{2, 3, 17, 19}, 5, c10::nullopt, 1e-4},
                                   {{8, 32, 40, 40}, 64, at::kBFloat16, 3e-2}};
  for (const auto& c : cases) {
    for (bool after_act : {false, true}) {
      const libreyolo::test::CudnnSettings fp32(false, false, false);
      auto [err, where] = libreyolo::test::compare_addend(torch::kCUDA, after_act, true, c.input, c.c2, c.amp);
      std::cout << "[ REPORT   ] addend " << (after_act ? "after" : "before") << " SiLU, " << c.input[1] << "->"
                << c.c2 << (c.amp ? " bf16" : " fp32") << ": worst " << err << " (" << where << ")\n";
      EXPECT_LE(err, c.tol) << where;
    }
  }
}

#ifdef LIBREYOLO_CUDA_KERNELS
// The kernels with 4 channels per thread (the default) and with 8: the same BatchNorm in float32 up
// to the order of the sums (their grids differ), with an addend before SiLU.
TEST(ConvBnActGpu, VectorWidthsFourAndEightAgree) {
  LY_REQUIRE_CUDA();
  namespace k = libreyolo::kernels;
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat);
  EXPECT_EQ(k::bn_act_vector_width(48), 4);
  EXPECT_EQ(k::bn_act_vector_width(6), 1);
  for (const int64_t rows : {int64_t{1000}, int64_t{40 * 40 * 32 + 3}}) {
    torch::manual_seed(5);
    const int64_t c = 48;
    auto x = torch::randn({rows, c}, f32) * 2 + 0.5, a = torch::randn({rows, c}, f32), dy = torch::randn({rows, c}, f32);
    auto gamma = torch::rand({c}, f32) + 0.5, beta = torch::randn({c}, f32);
    auto counters = torch::zeros({k::bn_act_max_counters()}, f32.dtype(torch::kInt));
    auto partials = torch::empty({3 * k::bn_act_max_partials_per_plane() + 3 * c}, f32);
    std::vector<torch::Tensor> ref;
    for (const int vec : {4, 8}) {
      k::BnActLaunch l;
      l.rows = rows;
      l.channels = static_cast<int>(c);
      l.dtype = k::DType::Float32;
      l.vec = vec;
      const auto g = k::bn_act_reduce_grid_for(rows, l.channels, vec);
      l.block_groups = g.block_groups;
      l.row_blocks = k::bn_act_row_blocks(rows, l.channels, vec, g.block_groups, g.rows_per_thread);
      l.stream = c10::cuda::getCurrentCUDAStream().stream();
      l.addend = a.data_ptr();
      auto rmean = torch::zeros({c}, f32), rvar = torch::ones({c}, f32), stats = torch::empty({2 * c}, f32);
      auto y = torch::empty_like(x), dx = torch::empty_like(x), da = torch::empty_like(x);
      auto dsum = torch::empty({2 * c}, f32), dg = torch::empty({c}, f32), db = torch::empty({c}, f32);
      float* mean = stats.data_ptr<float>();
      auto* cnt = reinterpret_cast<unsigned*>(counters.data_ptr<int>());
      k::bn_act_forward(l, x.data_ptr(), gamma.data_ptr<float>(), beta.data_ptr<float>(), rmean.data_ptr<float>(),
                        rvar.data_ptr<float>(), 0.03f, 1e-3f, partials.data_ptr<float>(), cnt, mean, mean + c,
                        y.data_ptr());
      l.daddend = da.data_ptr();
      k::bn_act_backward_reduce(l, dy.data_ptr(), x.data_ptr(), gamma.data_ptr<float>(), beta.data_ptr<float>(), mean,
                                mean + c, partials.data_ptr<float>(), cnt, dsum.data_ptr<float>(),
                                dg.data_ptr<float>(), db.data_ptr<float>(), false);
      k::bn_act_backward_elemt(l, dy.data_ptr(), x.data_ptr(), gamma.data_ptr<float>(), beta.data_ptr<float>(), mean,
                               mean + c, dsum.data_ptr<float>(), nullptr, dx.data_ptr());
      std::vector<torch::Tensor> got = {y, dx, da, dsum, dg, db, stats, rmean, rvar};
      if (ref.empty()) {
        ref = got;
        continue;
      }
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_LT(rel_err(got[i].cpu(), ref[i].cpu()), 1e-5) << "rows " << rows << " output " << i;
    }
  }
}
#endif

// RepConvN as one node (both BatchNorms and the sum in the dual kernels) against its two-node form
// (conv2's node with conv1's output as the addend): output, input gradient, every parameter
// gradient and running statistic; fp32 (8 channels and an odd count) and bf16 autocast.
TEST(ConvBnActGpu, RepConvNOneNodeMatchesTwoNodes) {
  LY_REQUIRE_CUDA();
  using libreyolo::models::yolo9::RepConvN;
  const libreyolo::test::CudnnSettings fp32(false, false, false);
  struct Case {
    int64_t c;
    std::vector<int64_t> input;
    c10::optional<c10::ScalarType> amp;
    double tol;
  };
  for (const auto& k : std::vector<Case>{{32, {4, 32, 20, 20}, c10::nullopt, 1e-4},
                                         {5, {2, 5, 17, 19}, c10::nullopt, 1e-4},
                                         {64, {8, 64, 40, 40}, at::kBFloat16, 3e-2}}) {
    std::map<std::string, torch::Tensor> got[2];
    std::string node[2];
    for (int one = 0; one < 2; ++one) {
      libreyolo::models::set_fused_repconvn(one == 1);
      torch::manual_seed(41);
      RepConvN m(k.c, k.c);
      m->to(torch::kCUDA);
      libreyolo::engine::to_channels_last(*m);
      m->train();
      torch::manual_seed(42);
      auto x = torch::randn(k.input).to(torch::kCUDA).contiguous(at::MemoryFormat::ChannelsLast).set_requires_grad(true);
      torch::Tensor y;
      if (k.amp) {
        y = autocast_forward(*k.amp, [&] { return m->forward(x); });
      } else {
        y = m->forward(x);
      }
      node[one] = y.grad_fn()->name();
      torch::manual_seed(43);
      (y.to(torch::kFloat) * torch::randn(y.sizes()).to(torch::kCUDA)).sum().backward();
      got[one]["output"] = cpu(y);
      got[one]["x.grad"] = cpu(x.grad());
      for (const auto& p : m->named_parameters()) got[one][p.key() + ".grad"] = cpu(p.value().grad());
      for (const auto& b : m->named_buffers())
        if (b.value().is_floating_point()) got[one][b.key()] = cpu(b.value());
    }
    libreyolo::models::set_fused_repconvn(true);
    EXPECT_NE(node[1].find("RepConvNFn"), std::string::npos) << node[1];
    EXPECT_EQ(node[0].find("RepConvNFn"), std::string::npos) << node[0];
    double worst = 0;
    std::string where;
    for (const auto& [name, t] : got[0]) {
      const double e = rel_err(got[1][name], t);
      if (e > worst) worst = e, where = name;
    }
    std::cout << "[ REPORT   ] RepConvN one node vs two, " << k.c << " channels" << (k.amp ? " bf16" : " fp32")
              << ": worst " << worst << " (" << where << ")\n";
    EXPECT_LE(worst, k.tol) << where;
  }
}

TEST(ConvBnActGpu, Float32KernelsMatchComposedOps) {
  LY_REQUIRE_CUDA();
  for (const auto& [label, cc] : cases()) compare("fp32 " + label, cc, c10::nullopt, {1e-4, 1e-3});
}

// Under autocast both paths round activations to 16 bits, at different places (the composed ops
// round BatchNorm's output and SiLU's; the kernels only the final value), so they differ by
// about an ulp of the 16-bit type on the largest values.
TEST(ConvBnActGpu, AutocastKernelsMatchComposedOps) {
  LY_REQUIRE_CUDA();
  for (const auto& [label, cc] : cases()) {
    compare("fp16 " + label, cc, torch::kHalf, {4e-3, 2e-2});
    compare("bf16 " + label, cc, torch::kBFloat16, {3e-2, 6e-2});
  }
}

TEST(ConvBnActGpu, EveryBlockTypeMatchesComposedOps) {
  LY_REQUIRE_CUDA();
  // cuDNN's float32 convolutions (TF32) and BatchNorm's cancellations leave ~1e-4 between two
  // correct paths here; a wrong gradient is off by O(1).
  libreyolo::test::check_blocks(torch::kCUDA, true, 1e-3);
  libreyolo::test::check_blocks(torch::kCUDA, false, 1e-3);
}

// A whole YOLOv9-t training step (channels_last) from a fresh model, against float64 (composed
// ops). The step is ill-conditioned: train-mode BatchNorm divides by small batch variances, and
// with cuDNN's default TF32 convolutions two correct float32 paths differ by tens of percent
// (measured on an H200: raw maps 11-17%, mean gradient error 59-88% for both paths). So TF32 is
// turned off here; then float32 is close to float64, and the fused node (with its CUDA kernels and
// with ATen's ops) must be as close as the composed ops.
TEST(ConvBnActGpu, Yolo9TrainingStepAgainstFloat64) {
  LY_REQUIRE_CUDA();
  using libreyolo::test::run_error;
  using libreyolo::test::run_yolo9_step;
  auto& ctx = at::globalContext();
  const bool tf32 = ctx.allowTF32CuDNN();
  ctx.setAllowTF32CuDNN(false);
  const std::vector<int64_t> in{4, 3, 160, 160};
  const auto ref = run_yolo9_step(torch::kCUDA, torch::kDouble, false, in, true);
  const auto composed = run_error(run_yolo9_step(torch::kCUDA, torch::kFloat, false, in, true), ref);
  auto report = [](const char* what, const libreyolo::test::RunError& e) {
    std::cout << "[ REPORT   ] yolo9t fp32 (no TF32) step vs fp64, " << what << ": raw maps " << e.raw
              << ", gradients mean " << e.grad_mean << ", worst " << e.grad_worst << " (" << e.worst_name << ") over "
              << e.count << " parameters\n";
  };
  report("composed ops", composed);
  for (bool kernels : {true, false}) {
    libreyolo::models::set_fused_conv_kernels(kernels);
    const auto fused = run_error(run_yolo9_step(torch::kCUDA, torch::kFloat, true, in, true), ref);
    libreyolo::models::set_fused_conv_kernels(true);
    report(kernels ? "fused node, CUDA kernels" : "fused node, ATen ops", fused);
    EXPECT_EQ(fused.count, composed.count);
    EXPECT_LE(fused.raw, 2 * composed.raw + 1e-5);
    EXPECT_LE(fused.grad_mean, 2 * composed.grad_mean + 1e-4);
  }
  ctx.setAllowTF32CuDNN(tf32);
}

}  // namespace

// A weight shared by three fused nodes (RTMDet's head convolutions): the deferred gradients add up
// to autograd's accumulation on the GPU too, where one multi-tensor add of two gradients into the
// same tensor would lose one of them.
TEST(ConvBnActGpu, DeferredGradientsOfASharedWeightAddUpAsAutogradsDo) {
  LY_REQUIRE_CUDA();
  const libreyolo::test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true, false);
  const torch::Device dev(torch::kCUDA, 0);
  const auto plain = libreyolo::test::shared_weight_grad(dev, false, 3);
  const auto deferred = libreyolo::test::shared_weight_grad(dev, true, 3);
  EXPECT_LE(rel_err(deferred, plain), 1e-6);
}
