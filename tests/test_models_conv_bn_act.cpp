// The fused Conv+BN+SiLU autograd node (layers/conv_bn_act.hpp) against the composed ops, on
// the CPU (the ATen path of the node). The CUDA kernels are compared on the GPU machine
// (gpu_test_conv_bn_act.cpp).
#include "conv_bn_act_check.hpp"
#include "support.hpp"

#ifdef LIBREYOLO_CUDA_KERNELS
#include "kernels/bn_act.hpp"
#endif

namespace {

using libreyolo::test::ConvCase;
using libreyolo::test::rel_err;
using libreyolo::test::run_conv_case;

void expect_same(const ConvCase& cc, double tol = 1e-5) {
  auto f = run_conv_case(cc, true, torch::kCPU);
  auto u = run_conv_case(cc, false, torch::kCPU);
  EXPECT_NE(f.node.find("ConvBnActFn"), std::string::npos) << f.node;  // the fused node ran
  EXPECT_EQ(u.node.find("ConvBnActFn"), std::string::npos) << u.node;  // the composed ops ran
  EXPECT_LT(rel_err(f.y, u.y), tol);
  if (cc.x_requires_grad) EXPECT_LT(rel_err(f.dx, u.dx), tol);
  EXPECT_EQ(f.dw.defined(), u.dw.defined());
  if (u.dw.defined()) EXPECT_LT(rel_err(f.dw, u.dw), tol);
  EXPECT_LT(rel_err(f.dgamma, u.dgamma), tol);
  EXPECT_LT(rel_err(f.dbeta, u.dbeta), tol);
  EXPECT_LT(rel_err(f.running_mean, u.running_mean), tol);
  EXPECT_LT(rel_err(f.running_var, u.running_var), tol);
}

TEST(ConvBnAct, Conv3x3WithSiluMatchesComposedOps) { expect_same({}); }

TEST(ConvBnAct, StridedWithoutActivationMatches) {
  ConvCase cc;
  cc.s = 2;
  cc.act = false;
  expect_same(cc);
}

TEST(ConvBnAct, PointwiseChannelsLastMatches) {
  ConvCase cc;
  cc.k = 1;
  cc.c1 = 16;
  cc.c2 = 24;
  cc.input = {3, 16, 7, 9};
  cc.channels_last = true;
  expect_same(cc);
}

TEST(ConvBnAct, InputWithoutGradStillTrainsWeights) {
  ConvCase cc;
  cc.x_requires_grad = false;
  expect_same(cc);
}

TEST(ConvBnAct, FrozenWeightStillGivesInputAndBatchNormGradients) {
  ConvCase cc;
  cc.freeze_weight = true;
  auto f = libreyolo::test::run_conv_case(cc, true, torch::kCPU);
  EXPECT_FALSE(f.dw.defined());
  expect_same(cc);
}

TEST(ConvBnAct, GradientsAccumulateOverPasses) {
  ConvCase cc;
  cc.backward_passes = 3;
  expect_same(cc);
  // And accumulation really happened: three passes differ from one.
  ConvCase one;
  auto a = run_conv_case(cc, true, torch::kCPU), b = run_conv_case(one, true, torch::kCPU);
  EXPECT_GT(rel_err(a.dgamma, b.dgamma), 1e-3);
}

TEST(ConvBnAct, Yolo9TrainingGradientsMatchComposedOps) {
  // On the CPU both run the same ATen kernels in the same order: equal to float rounding.
  const auto f = libreyolo::test::run_yolo9_step(torch::kCPU, torch::kFloat, true, {2, 3, 64, 64}, false);
  const auto u = libreyolo::test::run_yolo9_step(torch::kCPU, torch::kFloat, false, {2, 3, 64, 64}, false);
  const auto e = libreyolo::test::run_error(f, u);
  EXPECT_GT(e.count, 600u);
  EXPECT_LE(e.raw, 1e-5);
  EXPECT_LE(e.grad_worst, 1e-4) << e.worst_name;
}

// Under autocast the model casts every block's weight with one multi-tensor copy per forward
// (Yolo9Model::prepare_weight_casts); the composed ops cast each weight themselves. On the CPU
// (bfloat16 autocast) both round the same values the same way and run the same kernels.
TEST(ConvBnAct, Yolo9AutocastStepMatchesComposedOps) {
  const auto f = libreyolo::test::run_yolo9_step(torch::kCPU, torch::kFloat, true, {2, 3, 64, 64}, false,
                                                 torch::kBFloat16);
  const auto u = libreyolo::test::run_yolo9_step(torch::kCPU, torch::kFloat, false, {2, 3, 64, 64}, false,
                                                 torch::kBFloat16);
  const auto e = libreyolo::test::run_error(f, u);
  EXPECT_GT(e.count, 600u);
  EXPECT_LE(e.raw, 1e-3);
  EXPECT_LE(e.grad_worst, 1e-2) << e.worst_name;
  std::cout << "[ REPORT   ] cpu bf16 autocast step, fused vs composed: raw " << e.raw << ", gradients worst "
            << e.grad_worst << "\n";
}

TEST(ConvBnAct, EveryBlockTypeMatchesComposedOps) {
  libreyolo::test::check_blocks(torch::kCPU, false, 1e-5);
  libreyolo::test::check_blocks(torch::kCPU, true, 1e-5);
}

// An addend inside the node (RepConvN's sum before SiLU, a residual after it), with and without
// an activation: output and every gradient, the addend's included, equal the composed ops'.
TEST(ConvBnAct, AddendInsideTheNodeMatchesComposedOps) {
  for (bool after_act : {false, true}) {
    for (bool act : {true, false}) {
      if (!after_act && !act) continue;  // forward_sum_silu always applies SiLU
      auto [err, where] = libreyolo::test::compare_addend(torch::kCPU, after_act, act, {2, 8, 9, 7}, 16);
      EXPECT_LE(err, 1e-5) << (after_act ? "after" : "before") << " act " << act << ": " << where;
    }
  }
}

// RepConvN's sum and SiLU, and a bottleneck's residual, belong to the last convolution's node.
TEST(ConvBnAct, RepConvNAndResidualEndInTheFusedNode) {
  using namespace libreyolo::models::yolo9;
  const bool was = libreyolo::models::fused_conv_training();
  libreyolo::models::set_fused_conv_training(true);
  torch::manual_seed(3);
  RepNBottleneck b(8);
  b->train();
  auto x = torch::randn({2, 8, 6, 6}).set_requires_grad(true);
  auto inner = b->cv1->forward(x);
  auto y = b->forward(x);
  libreyolo::models::set_fused_conv_training(was);
  EXPECT_NE(inner.grad_fn()->name().find("ConvBnActFn"), std::string::npos) << inner.grad_fn()->name();
  EXPECT_NE(y.grad_fn()->name().find("ConvBnActFn"), std::string::npos) << y.grad_fn()->name();
  // An addend of other sizes is refused with a clear error.
  libreyolo::models::set_fused_conv_training(true);
  auto wrong = torch::zeros({2, 8, 5, 6});
  EXPECT_THROW(b->cv1->conv2->forward_sum_silu(x, wrong), c10::Error);
  // Switched off, the addend is added outside the node, with the same result.
  libreyolo::models::set_fused_addend(false);
  auto y_off = b->forward(x);
  libreyolo::models::set_fused_addend(true);
  libreyolo::models::set_fused_conv_training(was);
  EXPECT_EQ(y_off.grad_fn()->name().find("ConvBnActFn"), std::string::npos) << y_off.grad_fn()->name();
  EXPECT_LT(rel_err(y_off.detach(), b->forward(x).detach()), 1e-5);
}

// StepRunner's DeferredWeightGrads scope: weight gradients collected in backward and written
// after it (taken as they are in float32, converted under autocast, added when accumulating)
// equal autograd's own accumulation.
TEST(ConvBnAct, DeferredWeightGradientsEqualAutogradAccumulation) {
  for (bool amp : {false, true}) {
    for (int passes : {1, 3}) {
      ConvCase cc;
      cc.backward_passes = passes;
      std::function<torch::Tensor(const std::function<torch::Tensor()>&)> wrap;
      if (amp) {
        wrap = [](const std::function<torch::Tensor()>& fn) {
          at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
          at::autocast::set_autocast_enabled(at::kCPU, true);
          auto y = fn();
          at::autocast::set_autocast_enabled(at::kCPU, false);
          at::autocast::clear_cache();
          return y;
        };
      }
      auto plain = run_conv_case(cc, true, torch::kCPU, wrap);
      cc.deferred = true;
      auto deferred = run_conv_case(cc, true, torch::kCPU, wrap);
      ASSERT_TRUE(deferred.dw.defined());
      EXPECT_EQ(deferred.dw.scalar_type(), torch::kFloat);
      EXPECT_EQ(rel_err(deferred.dw, plain.dw), 0.0) << "amp " << amp << " passes " << passes;
      EXPECT_EQ(rel_err(deferred.dx, plain.dx), 0.0);
    }
  }
}

// A weight shared by several nodes gets each node's gradient once (the deferred gradients are
// added in rounds, never two into one tensor in one multi-tensor op).
TEST(ConvBnAct, DeferredGradientsOfASharedWeightAddUpAsAutogradsDo) {
  const auto plain = libreyolo::test::shared_weight_grad(torch::kCPU, false);
  const auto deferred = libreyolo::test::shared_weight_grad(torch::kCPU, true);
  EXPECT_LE(rel_err(deferred, plain), 1e-6);
  // Not one node's share: the three contributions are all there.
  EXPECT_GT(plain.abs().sum().item<double>(), 0.0);
}

TEST(ConvBnAct, DeferredWeightGradientsAreDroppedWhenNotFlushed) {
  libreyolo::models::set_fused_conv_training(true);
  libreyolo::models::yolo9::Conv conv(4, 8, 3);
  conv->train();
  auto x = torch::randn({2, 4, 6, 6}).set_requires_grad(true);
  {
    libreyolo::models::DeferredWeightGrads scope;
    conv->forward(x).sum().backward();
  }  // no flush: as when backward throws
  EXPECT_FALSE(conv->conv->weight.grad().defined());
  conv->forward(x).sum().backward();  // outside a scope: autograd accumulates as usual
  EXPECT_TRUE(conv->conv->weight.grad().defined());
}

TEST(ConvBnAct, NoGradModeUsesComposedPathAndUpdatesStatistics) {
  libreyolo::models::set_fused_conv_training(true);
  libreyolo::models::yolo9::Conv conv(4, 8, 3);
  conv->train();
  auto before = conv->bn->running_mean.clone();
  torch::NoGradGuard ng;
  auto y = conv->forward(torch::randn({2, 4, 6, 6}));
  EXPECT_FALSE(y.requires_grad());
  EXPECT_GT((conv->bn->running_mean - before).abs().max().item<double>(), 0.0);
}

TEST(ConvBnAct, SingleValuePerChannelIsAClearError) {
  libreyolo::models::set_fused_conv_training(true);
  libreyolo::models::yolo9::Conv conv(4, 8, 1);
  conv->train();
  auto x = torch::randn({1, 4, 1, 1}).set_requires_grad(true);
  try {
    conv->forward(x);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 1 value per channel"), std::string::npos);
  }
}

// The SyncBN seam: a statistics sync that plays a second process (its batch b, and the gradient
// at its output) makes the node on batch a compute what BatchNorm over the concatenated batch
// computes for a's rows: output, input gradient, running statistics. Each hook runs once.
TEST(ConvBnAct, StatsSyncNormalisesWithTheGlobalBatch) {
  using namespace libreyolo::models;
  // The other process's contribution, as the CPU path reduces: [sum, sumsq, count] (float64)
  // forward, [sum dy, sum dy*(z-mean)] backward.
  struct OtherProcess : BnStatsSync {
    torch::Tensor zb, gb, gamma, beta, mean, invstd;
    double eps = 0;
    bool act = false;
    int stats_calls = 0, grad_calls = 0;
    int rank() const override { return 0; }
    int world_size() const override { return 2; }
    void all_reduce_sum(torch::Tensor& t) override {
      const int64_t C = zb.size(1);
      if (t.scalar_type() == torch::kDouble) {  // the statistics
        auto zd = zb.to(torch::kDouble);
        t.narrow(0, 0, C).add_(zd.sum({0, 2, 3}));
        t.narrow(0, C, C).add_(zd.square().sum({0, 2, 3}));
        t.narrow(0, 2 * C, 1).add_(static_cast<double>(zb.numel() / C));
        const auto count = t.narrow(0, 2 * C, 1);
        mean = (t.narrow(0, 0, C) / count).to(torch::kFloat);
        invstd = (t.narrow(0, C, C) / count - (t.narrow(0, 0, C) / count).square() + eps).rsqrt().to(torch::kFloat);
        ++stats_calls;
      } else {  // the gradient sums
        auto v = [](const torch::Tensor& x) { return x.view({1, -1, 1, 1}); };
        const auto xmu = zb - v(mean);
        const auto g = act ? at::silu_backward(gb, xmu * v(invstd * gamma) + v(beta)) : gb;
        t.narrow(0, 0, C).add_(g.sum({0, 2, 3}));
        t.narrow(0, C, C).add_((g * xmu).sum({0, 2, 3}));
        ++grad_calls;
      }
    }
  };
  for (bool act : {false, true}) {
    torch::manual_seed(11);
    const auto a = torch::randn({2, 4, 6, 5}), b = torch::randn({3, 4, 6, 5});
    const auto ga = torch::randn({2, 6, 6, 5}), gb = torch::randn({3, 6, 6, 5});
    auto make_conv = [&] {
      torch::manual_seed(12);
      yolo9::Conv c(4, 6, 3, 1, 1, act);
      torch::NoGradGuard ng;
      c->bn->weight.uniform_(0.5, 1.5);
      c->bn->bias.uniform_(-0.5, 0.5);
      c->train();
      return c;
    };
    set_fused_conv_training(false);  // reference: the composed ops over both batches
    auto ref = make_conv();
    auto x = torch::cat({a, b}).set_requires_grad(true);
    auto y_ref = ref->forward(x);
    y_ref.backward(torch::cat({ga, gb}));

    set_fused_conv_training(true);
    auto conv = make_conv();
    auto sync = std::make_shared<OtherProcess>();
    {
      torch::NoGradGuard ng;
      sync->zb = torch::conv2d(b, conv->conv->weight, {}, 1, 1);
    }
    sync->gb = gb;
    sync->gamma = conv->bn->weight.detach();
    sync->beta = conv->bn->bias.detach();
    sync->eps = conv->bn->options.eps();
    sync->act = act;
    set_bn_stats_sync(sync);
    auto xa = a.clone().set_requires_grad(true);
    auto ya = conv->forward(xa);
    ya.backward(ga);
    set_bn_stats_sync(nullptr);
    EXPECT_NE(ya.grad_fn()->name().find("ConvBnActFn"), std::string::npos) << ya.grad_fn()->name();
    EXPECT_EQ(sync->stats_calls, 1);
    EXPECT_EQ(sync->grad_calls, 1);
    EXPECT_LT(rel_err(ya, y_ref.slice(0, 0, 2)), 1e-4) << "act " << act;
    EXPECT_LT(rel_err(xa.grad(), x.grad().slice(0, 0, 2)), 1e-4) << "act " << act;
    EXPECT_LT(rel_err(conv->bn->running_mean, ref->bn->running_mean), 1e-5);
    EXPECT_LT(rel_err(conv->bn->running_var, ref->bn->running_var), 1e-5);
  }
}


// Which tensors the training step reads as [N*H*W, C] rows in place (the 1x1 GEMM's input, the
// BatchNorm backward's dy): packed NHWC and channel slices of it, with their row stride; nothing
// whose rows would overlap or whose pixels are not evenly spaced.
TEST(ConvBnAct, RowStrideViewsOfNhwcMemory) {
  using libreyolo::models::nhwc_row_stride;
  const auto cl = at::MemoryFormat::ChannelsLast;
  const auto whole = torch::zeros({2, 24, 5, 7}).contiguous(cl);
  EXPECT_EQ(nhwc_row_stride(whole), 24);
  EXPECT_EQ(nhwc_row_stride(whole.narrow(1, 8, 16)), 24);  // a concatenation's part: rows 24 apart
  EXPECT_EQ(nhwc_row_stride(whole.narrow(1, 0, 8)), 24);
  EXPECT_EQ(nhwc_row_stride(torch::zeros({2, 24, 5, 7})), 0);      // NCHW
  EXPECT_EQ(nhwc_row_stride(whole.narrow(3, 1, 4)), 0);            // a spatial slice: rows not evenly spaced
  EXPECT_EQ(nhwc_row_stride(whole.narrow(2, 0, 3)), 0);
  EXPECT_EQ(nhwc_row_stride(whole.narrow(0, 1, 1).narrow(1, 4, 4)), 24);  // one image of the batch
  EXPECT_EQ(nhwc_row_stride(torch::zeros({24, 35})), 0);           // not 4-d
  EXPECT_EQ(nhwc_row_stride(torch::zeros({2, 8, 1, 1})), 8);       // 1x1: both layouts are packed rows
  // A view as rows exists and has that leading dimension.
  const auto part = whole.narrow(1, 8, 16);
  const auto rows = part.permute({0, 2, 3, 1}).reshape({-1, 16});
  EXPECT_EQ(rows.data_ptr(), part.data_ptr());
  EXPECT_EQ(rows.stride(0), 24);
  // The GEMM path is CUDA only.
  EXPECT_FALSE(libreyolo::models::conv1x1_gemm_applies(whole));
}

#ifdef LIBREYOLO_CUDA_KERNELS
// The fused BatchNorm reductions' grid by activation size (kernels::bn_act_reduce_grid_for): the
// measured bands, and for every shape a grid the kernels' buffers hold (counters, partials).
TEST(ConvBnAct, ReductionGridBySizeFitsTheKernelsBuffers) {
  namespace k = libreyolo::kernels;
  auto channels_per_block = [](const k::BnActGrid& g, int vec) { return g.block_groups * vec; };
  EXPECT_EQ(channels_per_block(k::bn_act_reduce_grid_for(8 * 20 * 20, 64, 8), 8), 64);
  EXPECT_EQ(k::bn_act_reduce_grid_for(8 * 20 * 20, 64, 8).rows_per_thread, 4);        // 0.2 M elements
  EXPECT_EQ(k::bn_act_reduce_grid_for(8 * 80 * 80, 64, 8).rows_per_thread, 8);        // 3.3 M
  EXPECT_EQ(channels_per_block(k::bn_act_reduce_grid_for(8 * 160 * 160, 64, 8), 8), 32);  // 13 M
  EXPECT_EQ(k::bn_act_reduce_grid_for(8 * 160 * 160, 64, 8).rows_per_thread, 16);
  EXPECT_EQ(k::bn_act_reduce_grid_for(32 * 160 * 160, 128, 8).rows_per_thread, 4);    // 105 M
  for (int64_t rows : {1, 7, 3200, 51200, 204800, 819200, 3276800})
    for (int c : {1, 3, 8, 16, 24, 48, 64, 128, 256, 1000, 4096}) {
      const int vec = k::bn_act_vector_width(c);
      const k::BnActGrid g = k::bn_act_reduce_grid_for(rows, c, vec);
      ASSERT_GE(g.block_groups, 1);
      ASSERT_LE(g.block_groups, 32);
      ASSERT_LE(k::bn_act_counters(c, vec, g.block_groups), k::bn_act_max_counters()) << rows << " x " << c;
      const int p = k::bn_act_row_blocks(rows, c, vec, g.block_groups, g.rows_per_thread);
      ASSERT_GE(p, 1);
      ASSERT_LE(static_cast<long long>(p) * c, k::bn_act_max_partials_per_plane()) << rows << " x " << c;
    }
}
#endif

}  // namespace

namespace {

// Gradients of `out`'s weighted sum with respect to `inputs` (float64 throughout).
std::vector<torch::Tensor> weighted_grads(const torch::Tensor& out, const std::vector<torch::Tensor>& inputs) {
  torch::manual_seed(21);
  const torch::Tensor weights = torch::randn(out.sizes(), out.options());
  return torch::autograd::grad({(out * weights).sum()}, inputs);
}

}  // namespace

// A grouped convolution run as the equal dense one (block_diagonal: how the training node gives
// a grouped convolution to the cached cuDNN plans) and its weight gradient taken back
// (diagonal_blocks): the grouped convolution's output and gradients. Float64, so the only
// difference is summation order (the dense form adds exact zeros).
TEST(ConvBnAct, GroupedConvolutionAsItsDenseFormGivesTheSameResultsAndGradients) {
  namespace m = libreyolo::models;
  for (int64_t groups : {2, 4}) {
    for (bool channels_last : {false, true}) {
      torch::manual_seed(groups);
      auto fmt = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
      const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
      torch::Tensor x = torch::randn({2, 16, 9, 7}, f64).contiguous(fmt).requires_grad_();
      torch::Tensor w = torch::randn({24, 16 / groups, 3, 3}, f64).contiguous(fmt).requires_grad_();
      const torch::Tensor y = at::convolution(x, w, {}, {2, 2}, {1, 1}, {1, 1}, false, {0, 0}, groups);
      const auto g = weighted_grads(y, {x, w});

      const torch::Tensor dense = m::block_diagonal(w.detach(), groups).requires_grad_();
      EXPECT_TRUE(dense.is_contiguous(at::MemoryFormat::ChannelsLast));
      EXPECT_EQ(dense.sizes(), (std::vector<int64_t>{24, 16, 3, 3}));
      // Off the diagonal blocks every tap is zero.
      EXPECT_EQ(dense.detach().ne(0).sum().item<int64_t>(), w.detach().ne(0).sum().item<int64_t>());
      const torch::Tensor yd = at::convolution(x, dense, {}, {2, 2}, {1, 1}, {1, 1}, false, {0, 0}, 1);
      const auto gd = weighted_grads(yd, {x, dense});
      const torch::Tensor dw = m::diagonal_blocks(gd[1], groups, w);
      const std::string label = "groups " + std::to_string(groups) + (channels_last ? " channels_last" : "");
      EXPECT_LT(rel_err(yd, y), 1e-12) << label;
      EXPECT_LT(rel_err(gd[0], g[0]), 1e-12) << label;
      EXPECT_EQ(dw.sizes(), w.sizes()) << label;
      EXPECT_EQ(dw.suggest_memory_format(), w.suggest_memory_format()) << label;
      EXPECT_LT(rel_err(dw, g[1]), 1e-12) << label;
    }
  }
}

// A detection head's 1x1 output convolution with bias as one addmm over NHWC rows
// (conv1x1_bias_gemm, which the YOLOv9 towers use on the GPU instead of cuDNN): at::conv2d's
// output and its input, weight and bias gradients, with 1 and 4 groups, also for an input that is a
// channel slice of a wider NHWC tensor.
TEST(ConvBnAct, PointwiseConvolutionWithBiasAsOneGemmMatchesConv2d) {
  namespace m = libreyolo::models;
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  for (int64_t groups : {1, 4}) {
    for (bool slice : {false, true}) {
      torch::manual_seed(5 + groups);
      torch::Tensor wide = torch::randn({3, slice ? 40 : 32, 5, 6}, f64).contiguous(at::MemoryFormat::ChannelsLast);
      wide.requires_grad_();
      const torch::Tensor x = slice ? wide.narrow(1, 4, 32) : wide;
      torch::Tensor w = torch::randn({12, 32 / groups, 1, 1}, f64).requires_grad_();
      torch::Tensor b = torch::randn({12}, f64).requires_grad_();
      const torch::Tensor want = at::convolution(x, w, b, {1, 1}, {0, 0}, {1, 1}, false, {0, 0}, groups);
      const auto gw = weighted_grads(want, {wide, w, b});
      const torch::Tensor got = m::conv1x1_bias_gemm(x, w, b, groups);
      const auto gg = weighted_grads(got, {wide, w, b});
      const std::string label = "groups " + std::to_string(groups) + (slice ? " slice" : "");
      EXPECT_TRUE(got.is_contiguous(at::MemoryFormat::ChannelsLast)) << label;
      EXPECT_LT(rel_err(got, want), 1e-12) << label;
      for (size_t i = 0; i < gw.size(); ++i) EXPECT_LT(rel_err(gg[i], gw[i]), 1e-12) << label << " gradient " << i;
    }
  }
  EXPECT_THROW(m::conv1x1_bias_gemm(torch::zeros({1, 30, 2, 2}), torch::zeros({12, 8, 1, 1}), torch::zeros({12}), 4),
               c10::Error);
}
