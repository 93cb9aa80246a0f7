// The fused Conv+BN+SiLU node's CUDA kernels (channels_last) against the composed ATen ops on
// the same GPU: block by block for fp32 and under fp16/bf16 autocast, then a whole YOLOv9-t
// training backward. Errors are reported so they are on record.
#include <ATen/autocast_mode.h>

#include "conv_bn_act_check.hpp"
#include "support.hpp"

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
  for (auto& [label, cc] : out) cc.channels_last = true;
  return out;
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
