// BatchNorm folding on the GPU (layers/fold.hpp): the folded block's epilogue (one
// bias+SiLU kernel, every layout and dtype path) against a float64 CPU reference; whole YOLOv9-t
// and YOLOX-n forwards folded against unfolded in float32 and under bfloat16 autocast; CUDA graph
// replay of the folded forward against eager, a weight written in place after the capture seen
// by the next replay (the folds are refreshed into the captured storage), and the fold switch as
// part of a graph's key. Errors are printed so they are on record.
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include "fold_check.hpp"
#include "layers/conv.hpp"
#include "layers/conv_bn_act.hpp"
#include "models/detector.hpp"
#include "models/forward_graphs.hpp"
#include "support.hpp"

using namespace libreyolo;
namespace common = libreyolo::models::common;
using test::FoldSwitch;
using test::rel_err;

namespace {

struct EpilogueCase {
  const char* name;
  int64_t cin, cout, k, stride, groups;
  bool channels_last, act;
};

// act(conv(x, w) + b) in float64 on the CPU from the same (rounded) inputs.
torch::Tensor reference(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, const EpilogueCase& c) {
  auto y = torch::conv2d(x.to(torch::kCPU, torch::kDouble), w.to(torch::kCPU, torch::kDouble),
                         b.to(torch::kCPU, torch::kDouble), c.stride, (c.k - 1) / 2, 1, c.groups);
  return c.act ? torch::silu(y) : y;
}

}  // namespace

TEST(GpuFoldBn, EpilogueMatchesFloat64ReferenceOnEveryPath) {
  LY_REQUIRE_CUDA();
  const test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true, /*allow_tf32=*/false);
  const std::vector<EpilogueCase> cases = {
      {"3x3 16->32 NHWC (vector)", 16, 32, 3, 1, 1, true, true},
      {"3x3 s2 16->24 NHWC", 16, 24, 3, 2, 1, true, true},
      {"3x3 16->13 NHWC (scalar)", 16, 13, 3, 1, 1, true, true},
      {"1x1 32->64 NHWC (GEMM)", 32, 64, 1, 1, 1, true, true},
      {"1x1 32->64 NHWC no act", 32, 64, 1, 1, 1, true, false},
      {"3x3 depthwise 32 NHWC", 32, 32, 3, 1, 32, true, true},
      {"3x3 16->32 NCHW", 16, 32, 3, 1, 1, false, true},
      {"1x1 16->8 NCHW no act", 16, 8, 1, 1, 1, false, false},
  };
  const std::vector<std::pair<torch::ScalarType, double>> dtypes = {
      {torch::kFloat, 1e-5}, {torch::kHalf, 3e-3}, {torch::kBFloat16, 2e-2}};
  torch::manual_seed(0);
  for (const auto& c : cases) {
    for (const auto& [dt, tol] : dtypes) {
      const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
      const auto fmt = c.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
      auto x = torch::randn({2, c.cin, 17, 19}, opts).contiguous(fmt);
      auto w = (torch::randn({c.cout, c.cin / c.groups, c.k, c.k}, opts) * 0.2).contiguous(fmt);
      auto b32 = torch::randn({c.cout}, torch::TensorOptions().device(torch::kCUDA));
      auto b = b32.to(dt);
      models::ConvBiasActParams p;
      p.weight = &w;
      p.bias = &b;
      p.bias32 = &b32;
      p.stride = c.stride;
      p.padding = (c.k - 1) / 2;
      p.groups = c.groups;
      p.pointwise = c.k == 1 && c.stride == 1 && c.groups == 1;
      p.act = c.act;
      torch::Tensor y;
      {
        torch::InferenceMode im;
        y = models::conv_bias_act(x, p);
      }
      EXPECT_EQ(y.scalar_type(), dt) << c.name;
      const double e = rel_err(y, reference(x, w, b32, c));
      std::cout << "[ REPORT   ] epilogue " << c.name << " " << c10::toString(dt) << ": rel err " << e << "\n";
      EXPECT_LE(e, tol) << c.name << " " << c10::toString(dt);
    }
  }
}

namespace {

void to_channels_last(torch::nn::Module& m) {
  torch::NoGradGuard ng;
  for (auto& p : m.parameters())
    if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
}

torch::Tensor predict(models::Detector& m, const torch::Tensor& x, bool fold, c10::optional<c10::ScalarType> amp) {
  FoldSwitch s(fold);
  torch::InferenceMode im;
  if (amp) {
    at::autocast::set_autocast_dtype(at::kCUDA, *amp);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
  }
  auto y = m.predict_tensor(x).to(torch::kFloat);
  if (amp) {
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
  return y;
}

}  // namespace

TEST(GpuFoldBn, WholeModelsFoldedEqualUnfolded) {
  LY_REQUIRE_CUDA();
  const test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true, /*allow_tf32=*/false);
  const torch::Device dev(torch::kCUDA, 0);
  for (const std::string family : {"yolo9", "yolox"}) {
    for (const bool cl : {false, true}) {
      const models::Family* fam = models::find_family(family);
      torch::manual_seed(0);
      auto m = fam->build(fam->default_size, 80);
      test::randomize_batch_norms(*m, 21);
      m->to(dev);
      m->eval();
      if (cl) to_channels_last(*m);
      auto x = torch::rand({2, 3, 320, 320}, torch::TensorOptions().device(dev)) * (family == "yolox" ? 255.0 : 1.0);
      if (cl) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
      const auto ref = predict(*m, x, false, c10::nullopt);
      const double e32 = rel_err(predict(*m, x, true, c10::nullopt), ref);
      const double eu16 = rel_err(predict(*m, x, false, torch::kBFloat16), ref);
      const double ef16 = rel_err(predict(*m, x, true, torch::kBFloat16), ref);
      std::cout << "[ REPORT   ] " << family << (cl ? " channels_last" : " NCHW") << ": fp32 folded vs unfolded " << e32
                << "; bf16 vs fp32 unfolded " << eu16 << ", folded " << ef16 << "\n";
      EXPECT_LE(e32, 1e-4) << family << " cl " << cl;
      EXPECT_GT(eu16, 0.0);
      EXPECT_LE(ef16, 1.5 * eu16 + 1e-3) << family << " cl " << cl;
    }
  }
}

TEST(GpuFoldBn, GraphReplayOfTheFoldedForwardFollowsWeightsAndSwitch) {
  LY_REQUIRE_CUDA();
  const test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true, at::globalContext().allowTF32CuDNN());
  const torch::Device dev(torch::kCUDA, 0);
  for (const char* family : {"yolo9", "yolox"}) {
    const models::Family* fam = models::find_family(family);
    torch::manual_seed(0);
    auto model = fam->build(fam->default_size, 80);
    test::randomize_batch_norms(*model, 5);
    model->to(dev);
    model->eval();
    to_channels_last(*model);
    for (const bool bf16 : {false, true}) {
      FoldSwitch on(true);
      models::ForwardSpec spec;
      spec.device = dev;
      spec.amp = bf16;
      spec.amp_dtype = torch::kBFloat16;
      models::ForwardGraphs graphs;
      const auto images = torch::randint(0, 256, {2, 256, 256, 3}, torch::kUInt8);
      const auto eager = graphs.forward(*model, *fam, images, spec, models::GraphMode::Off).clone();
      const auto replay = graphs.forward(*model, *fam, images, spec, models::GraphMode::On).clone();
      EXPECT_TRUE(torch::equal(eager, replay)) << family << " bf16 " << bf16;
      ASSERT_EQ(graphs.info().captures, 1);
      // A BatchNorm's statistics and a convolution weight written in place after the capture: the
      // next replay equals an eager forward of the new weights, with the same graph.
      {
        torch::NoGradGuard ng;
        for (const auto& sub : model->modules(false)) {
          if (auto* c = dynamic_cast<common::ConvBnActImpl*>(sub.get())) {
            c->bn->running_var.mul_(1.5);
            c->conv->weight.mul_(0.9);
            break;
          }
        }
      }
      const auto replay2 = graphs.forward(*model, *fam, images, spec, models::GraphMode::On).clone();
      const auto eager2 = graphs.forward(*model, *fam, images, spec, models::GraphMode::Off).clone();
      EXPECT_FALSE(torch::equal(eager2, eager)) << family << ": the change did not show";
      EXPECT_TRUE(torch::equal(eager2, replay2)) << family << " bf16 " << bf16 << " max diff "
                                                 << (eager2 - replay2).abs().max().item<float>();
      EXPECT_EQ(graphs.info().captures, 1);
      EXPECT_EQ(graphs.info().releases, 0);
      // The switch is part of the key: folding off captures the unfolded forward of its own.
      {
        FoldSwitch off(false);
        const auto unfolded_eager = graphs.forward(*model, *fam, images, spec, models::GraphMode::Off).clone();
        const auto unfolded_replay = graphs.forward(*model, *fam, images, spec, models::GraphMode::On).clone();
        EXPECT_TRUE(torch::equal(unfolded_eager, unfolded_replay)) << family << " bf16 " << bf16;
        EXPECT_EQ(graphs.info().captures, 2);
        const double e = rel_err(eager2, unfolded_eager);
        std::cout << "[ REPORT   ] " << family << (bf16 ? " bf16" : " fp32")
                  << " graphed folded vs unfolded eager: rel err " << e << "\n";
        EXPECT_LE(e, bf16 ? 5e-2 : 1e-3) << family;
      }
    }
  }
}
