// cuDNN runtime fusion of inference convolution + bias + SiLU (layers/cudnn_fusion.hpp): taken for the
// convolutions YOLO networks use (3x3 stride 1 and 2, 1x1, with and without SiLU, float16, bfloat16 and
// float32 with TF32 allowed, NHWC), each against a float64 CPU reference; declined where it does not apply
// (float32 with TF32 off, NCHW input, grouped); several timed candidates give the same answer;
// conv_bias_act() (the folded inference block) takes it; plans come back from the disk cache bit for bit, and
// a corrupted cache file is ignored; without a plan, a configuration runs unfused while its plan is built
// in the background, then fused with the plan the call itself would have built; a training convolution
// runs the heuristics' plan at once while a worker times its candidates, and adopts the fastest. Each test keeps its plan cache in a fresh directory. Errors are printed
// so they are on record.
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include "core/cuda_graph.hpp"
#include "layers/conv.hpp"
#include "layers/conv_bn_act.hpp"
#include "layers/cudnn_fusion.hpp"
#include "support.hpp"

#include <filesystem>
#include <fstream>
#include <iostream>

using namespace libreyolo;
using test::rel_err;

namespace {

struct Case {
  const char* name;
  int64_t cin, cout, k, stride;
  bool act;
};

torch::Tensor reference(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, const Case& c) {
  auto y = torch::conv2d(x.to(torch::kCPU, torch::kDouble), w.to(torch::kCPU, torch::kDouble),
                         b.to(torch::kCPU, torch::kDouble), c.stride, (c.k - 1) / 2);
  return c.act ? torch::silu(y) : y;
}

#define LY_REQUIRE_FUSION()                                                                              \
  LY_REQUIRE_CUDA();                                                                                     \
  if (!models::cudnn_fusion_enabled())                                                                   \
    GTEST_SKIP() << "cuDNN fusion not in this build (no cudnn_frontend headers) or LIBREYOLO_CUDNN_FUSION=0"; \
  const std::string plan_dir_ = test::temp_dir("cudnn_plans");                                           \
  const test::ScopedEnv plan_env_("LIBREYOLO_CUDNN_PLAN_CACHE", plan_dir_);                              \
  const test::ScopedEnv build_env_("LIBREYOLO_CUDNN_PLAN_BUILD", "wait");                                 \
  models::cudnn_fusion_forget_plans()

}  // namespace

TEST(GpuCudnnFusion, FusedConvolutionsMatchFloat64Reference) {
  LY_REQUIRE_FUSION();
  const std::vector<Case> cases = {
      {"3x3 16->32", 16, 32, 3, 1, true},   {"3x3 s2 32->64", 32, 64, 3, 2, true},
      {"1x1 64->32", 64, 32, 1, 1, true},   {"1x1 32->80 no act", 32, 80, 1, 1, false},
      {"3x3 3->16 s2 (stem)", 3, 16, 3, 2, true}, {"3x3 24->40", 24, 40, 3, 1, true},
  };
  // float32 runs as TF32 (10 mantissa bits, as float16): float16's tolerance.
  const test::CudnnSettings tf32(/*benchmark=*/false, at::globalContext().deterministicCuDNN(), /*allow_tf32=*/true);
  const std::vector<std::pair<torch::ScalarType, double>> dtypes = {
      {torch::kHalf, 3e-3}, {torch::kBFloat16, 2e-2}, {torch::kFloat, 3e-3}};
  torch::manual_seed(0);
  int fused = 0;
  for (const auto& c : cases) {
    for (const auto& [dt, tol] : dtypes) {
      const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
      auto x = torch::randn({2, c.cin, 17, 19}, opts).contiguous(at::MemoryFormat::ChannelsLast);
      auto w = (torch::randn({c.cout, c.cin, c.k, c.k}, opts) * 0.2).contiguous(at::MemoryFormat::ChannelsLast);
      auto b32 = torch::randn({c.cout}, torch::TensorOptions().device(torch::kCUDA));
      torch::InferenceMode im;
      auto y = models::cudnn_conv_bias_act(x, w, b32, c.stride, (c.k - 1) / 2, c.act);
      if (!y.defined()) {
        std::cout << "[ REPORT   ] fusion " << c.name << " " << c10::toString(dt) << ": declined by cuDNN\n";
        continue;
      }
      ++fused;
      EXPECT_EQ(y.scalar_type(), dt);
      EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
      const double e = rel_err(y, reference(x, w, b32, c));
      std::cout << "[ REPORT   ] fusion " << c.name << " " << c10::toString(dt) << ": rel err " << e << "\n";
      EXPECT_LE(e, tol) << c.name << " " << c10::toString(dt);
    }
  }
  // The YOLO shapes (8-multiple channels) must fuse; only the odd ones may be declined.
  EXPECT_GE(fused, 12);
  const auto s = models::cudnn_fusion_stats();
  std::cout << "[ REPORT   ] fusion plans: " << s.fused << " fused, " << s.declined << " declined, " << s.build_ms
            << " ms building\n";
}

TEST(GpuCudnnFusion, DeclinesWhatItDoesNotCover) {
  LY_REQUIRE_FUSION();
  torch::InferenceMode im;
  const auto h = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kHalf);
  auto b32 = torch::zeros({16}, torch::TensorOptions().device(torch::kCUDA));
  auto x = torch::randn({1, 16, 8, 8}, h).contiguous(at::MemoryFormat::ChannelsLast);
  auto w = torch::randn({16, 16, 3, 3}, h).contiguous(at::MemoryFormat::ChannelsLast);
  {  // float32 only while TF32 convolutions are allowed
    const test::CudnnSettings no_tf32(false, at::globalContext().deterministicCuDNN(), /*allow_tf32=*/false);
    EXPECT_FALSE(models::cudnn_fusion_takes(torch::kFloat));
    EXPECT_FALSE(models::cudnn_conv_bias_act(x.to(torch::kFloat), w.to(torch::kFloat), b32, 1, 1, true).defined());
  }
  {
    const test::CudnnSettings tf32(false, at::globalContext().deterministicCuDNN(), /*allow_tf32=*/true);
    EXPECT_TRUE(models::cudnn_fusion_takes(torch::kFloat));
    EXPECT_TRUE(models::cudnn_conv_bias_act(x.to(torch::kFloat), w.to(torch::kFloat), b32, 1, 1, true).defined());
  }
  EXPECT_FALSE(models::cudnn_conv_bias_act(x.contiguous(), w, b32, 1, 1, true).defined());  // NCHW input
  auto wg = torch::randn({16, 1, 3, 3}, h).contiguous(at::MemoryFormat::ChannelsLast);     // depthwise
  EXPECT_FALSE(models::cudnn_conv_bias_act(x, wg, b32, 1, 1, true).defined());
  EXPECT_FALSE(models::cudnn_conv_bias_act(x, w, b32.to(torch::kHalf), 1, 1, true).defined());
  EXPECT_FALSE(models::cudnn_conv_bias_act(x.cpu(), w.cpu(), b32.cpu(), 1, 1, true).defined());
}

TEST(GpuCudnnFusion, TimedCandidatesAgreeAndConvBiasActTakesTheFusion) {
  LY_REQUIRE_FUSION();
  torch::manual_seed(1);
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto x = torch::randn({4, 48, 40, 40}, opts).contiguous(at::MemoryFormat::ChannelsLast);
  auto w = (torch::randn({64, 48, 3, 3}, opts) * 0.1).contiguous(at::MemoryFormat::ChannelsLast);
  auto b32 = torch::randn({64}, torch::TensorOptions().device(torch::kCUDA));
  auto b = b32.to(torch::kBFloat16);
  const Case c{"3x3 48->64", 48, 64, 3, 1, true};
  torch::Tensor tuned;
  {
    const test::ScopedEnv n("LIBREYOLO_CUDNN_FUSION_CANDIDATES", "4");
    torch::InferenceMode im;
    tuned = models::cudnn_conv_bias_act(x, w, b32, 1, 1, true);
  }
  ASSERT_TRUE(tuned.defined());
  const double e = rel_err(tuned, reference(x, w, b32, c));
  std::cout << "[ REPORT   ] fastest of 4 timed fused plans: rel err " << e << "\n";
  EXPECT_LE(e, 2e-2);
  // The folded block's entry point, with the default (one candidate): same answer within rounding,
  // and then the cached plan: no new build, the same bits as a direct call.
  models::ConvBiasActParams p;
  p.weight = &w;
  p.bias = &b;
  p.bias32 = &b32;
  p.stride = 1;
  p.padding = 1;
  torch::Tensor y, again;
  {
    torch::InferenceMode im;
    y = models::conv_bias_act(x, p);
    const auto before = models::cudnn_fusion_stats();
    again = models::cudnn_conv_bias_act(x, w, b32, 1, 1, true);
    EXPECT_EQ(models::cudnn_fusion_stats().fused, before.fused);
  }
  EXPECT_LE(rel_err(y, tuned), 1e-2);
  EXPECT_TRUE(torch::equal(y, again));
}

TEST(GpuCudnnFusion, PlansComeBackFromDiskAndCorruptFilesAreIgnored) {
  LY_REQUIRE_FUSION();
  torch::manual_seed(2);
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kHalf);
  auto x = torch::randn({2, 32, 24, 24}, opts).contiguous(at::MemoryFormat::ChannelsLast);
  auto w = (torch::randn({32, 32, 3, 3}, opts) * 0.1).contiguous(at::MemoryFormat::ChannelsLast);
  auto b32 = torch::randn({32}, torch::TensorOptions().device(torch::kCUDA));
  torch::InferenceMode im;
  const auto built = models::cudnn_conv_bias_act(x, w, b32, 1, 1, true);
  ASSERT_TRUE(built.defined());
  std::vector<std::filesystem::path> files;
  for (const auto& f : std::filesystem::directory_iterator(plan_dir_)) files.push_back(f.path());
  ASSERT_EQ(files.size(), 1u) << "one plan file per configuration in " << plan_dir_;

  models::cudnn_fusion_forget_plans();  // as a new process: the plan comes from disk
  auto s0 = models::cudnn_fusion_stats();
  const auto loaded = models::cudnn_conv_bias_act(x, w, b32, 1, 1, true);
  auto s1 = models::cudnn_fusion_stats();
  ASSERT_TRUE(loaded.defined());
  EXPECT_EQ(s1.loaded, s0.loaded + 1);
  EXPECT_TRUE(torch::equal(loaded, built)) << "the stored plan is the plan that was built";

  // One flipped byte in the payload: the checksum rejects the file, the plan is built again (and
  // the file rewritten), the answer is the same.
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char ch = 0;
    f.read(&ch, 1);
    ch = static_cast<char>(ch ^ 0x5a);
    f.seekp(-5, std::ios::end);
    f.write(&ch, 1);
  }
  models::cudnn_fusion_forget_plans();
  const auto rebuilt = models::cudnn_conv_bias_act(x, w, b32, 1, 1, true);
  auto s2 = models::cudnn_fusion_stats();
  ASSERT_TRUE(rebuilt.defined());
  EXPECT_EQ(s2.loaded, s1.loaded) << "a corrupt file must not be loaded";
  EXPECT_EQ(s2.fused, s1.fused + 1);
  EXPECT_TRUE(torch::equal(rebuilt, built));
  // Garbage in place of the file: same.
  { std::ofstream(files[0], std::ios::binary | std::ios::trunc) << "not a plan"; }
  models::cudnn_fusion_forget_plans();
  EXPECT_TRUE(torch::equal(models::cudnn_conv_bias_act(x, w, b32, 1, 1, true), built));
  EXPECT_EQ(models::cudnn_fusion_stats().loaded, s1.loaded);
}

TEST(GpuCudnnFusion, BackgroundBuildDeclinesUntilThePlanArrivesThenRunsTheSamePlan) {
  LY_REQUIRE_FUSION();
  torch::manual_seed(3);
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kHalf);
  auto x = torch::randn({2, 32, 20, 20}, opts).contiguous(at::MemoryFormat::ChannelsLast);
  auto w = (torch::randn({48, 32, 3, 3}, opts) * 0.1).contiguous(at::MemoryFormat::ChannelsLast);
  auto b32 = torch::randn({48}, torch::TensorOptions().device(torch::kCUDA));
  const test::CudnnSettings heuristics(/*benchmark=*/false, at::globalContext().deterministicCuDNN(), true);
  torch::InferenceMode im;
  torch::Tensor first, later;
  {
    const test::ScopedEnv background("LIBREYOLO_CUDNN_PLAN_BUILD", "background");
    const auto s0 = models::cudnn_fusion_stats();
    first = models::cudnn_conv_bias_act(x, w, b32, 1, 1, true);
    EXPECT_FALSE(first.defined()) << "no plan in memory or on disk: declined while it is built";
    // Asked again before it is ready: declined again, never a second build of it.
    const bool again = models::cudnn_conv_bias_act(x, w, b32, 1, 1, true).defined();
    models::cudnn_fusion_wait_background();
    const auto s1 = models::cudnn_fusion_stats();
    EXPECT_EQ(s1.pending, 0);
    EXPECT_EQ(s1.fused, s0.fused + 1) << "one plan built" << (again ? " (it was ready for the second call)" : "");
    std::cout << "[ REPORT   ] background build: " << s1.build_ms - s0.build_ms << " ms\n";
    later = models::cudnn_conv_bias_act(x, w, b32, 1, 1, true);
    ASSERT_TRUE(later.defined()) << "the plan built in the background runs";
    EXPECT_EQ(models::cudnn_fusion_stats().fused, s1.fused);
  }
  size_t files = 0;
  for (const auto& f : std::filesystem::directory_iterator(plan_dir_)) files += f.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1u) << "the background build keeps its plan on disk";
  // Built by the call itself in a fresh cache: the same plan (the heuristics' first that builds), the same bits.
  const std::string fresh = test::temp_dir("cudnn_plans_fg");
  const test::ScopedEnv fresh_env("LIBREYOLO_CUDNN_PLAN_CACHE", fresh);
  models::cudnn_fusion_forget_plans();
  const auto foreground = models::cudnn_conv_bias_act(x, w, b32, 1, 1, true);
  ASSERT_TRUE(foreground.defined());
  EXPECT_TRUE(torch::equal(foreground, later));
  EXPECT_LE(rel_err(later, reference(x, w, b32, {"3x3 32->48", 32, 48, 3, 1, true})), 3e-3);
}

// Background builds beside the caller's own work on the legacy default stream, as in a training
// run whose validation builds in the background: many shapes built by the workers (each handed
// over and made into a graph on the caller's handle), then the same shapes read back from disk by
// the workers (the plans appear in the cache folder after the caller found it empty, as when
// another process writes them), while the caller keeps queueing convolutions, matrix products and
// synchronisations. Nothing may fail, and every fused result equals the one the call builds itself.
TEST(GpuCudnnFusion, BackgroundBuildsAndDiskLoadsBesideDefaultStreamWorkArriveAndAgree) {
  LY_REQUIRE_FUSION();
  torch::manual_seed(5);
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kHalf);
  const auto cl = at::MemoryFormat::ChannelsLast;
  struct Shape {
    torch::Tensor x, w, b;
    int64_t stride, padding;
  };
  std::vector<Shape> shapes;
  for (int64_t cin : {16, 24, 32})
    for (int64_t cout : {16, 40})
      for (int64_t k : {1, 3})
        for (int64_t stride : {1, 2})
          shapes.push_back({torch::randn({2, cin, 24, 20}, opts).contiguous(cl),
                            (torch::randn({cout, cin, k, k}, opts) * 0.1).contiguous(cl),
                            torch::randn({cout}, torch::TensorOptions().device(torch::kCUDA)), stride, (k - 1) / 2});
  const test::CudnnSettings heuristics(/*benchmark=*/false, at::globalContext().deterministicCuDNN(), true);
  torch::InferenceMode im;
  auto a = torch::randn({256, 256}, opts), big = torch::randn({8, 32, 64, 64}, opts);
  auto wb = torch::randn({32, 32, 3, 3}, opts);
  // Rounds of every shape with default-stream work in between, until each has run fused.
  const auto until_all_fused = [&](const char* phase) {
    std::vector<torch::Tensor> out(shapes.size());
    int rounds = 0;
    for (bool all = false; !all && rounds < 400; ++rounds) {
      all = true;
      for (size_t i = 0; i < shapes.size(); ++i) {
        const auto& s = shapes[i];
        if (!out[i].defined()) out[i] = models::cudnn_conv_bias_act(s.x, s.w, s.b, s.stride, s.padding, true);
        all = all && out[i].defined();
        a = torch::tanh(torch::mm(a, a) * 0.01);
        big = torch::conv2d(big, wb, {}, 1, 1).tanh();
      }
      if (rounds % 4 == 0) torch::cuda::synchronize();
      if (rounds > 100) models::cudnn_fusion_wait_background();
    }
    torch::cuda::synchronize();
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << phase;
    for (size_t i = 0; i < shapes.size(); ++i) EXPECT_TRUE(out[i].defined()) << phase << ": shape " << i;
    std::cout << "[ REPORT   ] " << phase << ": every shape fused after " << rounds << " rounds\n";
    return out;
  };
  std::vector<torch::Tensor> built, loaded;
  {
    const test::ScopedEnv background("LIBREYOLO_CUDNN_PLAN_BUILD", "background");
    built = until_all_fused("built in the background");
    models::cudnn_fusion_wait_background();
  }
  {
    // A cache folder that is empty when the caller looks, filled before the workers look.
    const std::string later_dir = test::temp_dir("cudnn_plans_later");
    const test::ScopedEnv later_env("LIBREYOLO_CUDNN_PLAN_CACHE", later_dir);
    const test::ScopedEnv background("LIBREYOLO_CUDNN_PLAN_BUILD", "background");
    models::cudnn_fusion_forget_plans();
    const auto s0 = models::cudnn_fusion_stats();
    // The first shape's job starts at once; those queued behind it find the files.
    for (const auto& s : shapes) EXPECT_FALSE(models::cudnn_conv_bias_act(s.x, s.w, s.b, s.stride, s.padding, true).defined());
    for (const auto& f : std::filesystem::directory_iterator(plan_dir_))
      std::filesystem::copy_file(f.path(), std::filesystem::path(later_dir) / f.path().filename(),
                                 std::filesystem::copy_options::skip_existing);
    loaded = until_all_fused("loaded from disk in the background");
    models::cudnn_fusion_wait_background();
    const auto s1 = models::cudnn_fusion_stats();
    EXPECT_GT(s1.loaded, s0.loaded) << "some plans were read from disk by the workers";
    std::cout << "[ REPORT   ] plans the workers read from disk: " << s1.loaded - s0.loaded << " of " << shapes.size() << "\n";
  }
  // Built by the call itself in a fresh cache: the same plans, the same bits.
  const test::ScopedEnv fresh_env("LIBREYOLO_CUDNN_PLAN_CACHE", test::temp_dir("cudnn_plans_fg"));
  models::cudnn_fusion_forget_plans();
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& s = shapes[i];
    const auto own = models::cudnn_conv_bias_act(s.x, s.w, s.b, s.stride, s.padding, true);
    ASSERT_TRUE(own.defined());
    EXPECT_TRUE(torch::equal(own, built[i])) << "shape " << i;
    EXPECT_TRUE(torch::equal(own, loaded[i])) << "shape " << i;
  }
}

// Concatenations assembled in place (layers/concat.hpp) rest on three things the fused
// operation must do: read its input from a channel slice of a wider channels_last tensor, write
// its result into one, and add a residual after the activation (each against float64, fp16, bf16
// and float32); and it must write nothing outside its slice. Also the detection head's 1x1
// convolution without activation into a slice.
TEST(GpuCudnnFusion, ChannelSlicesInAndOutAndResidual) {
  LY_REQUIRE_FUSION();
  torch::manual_seed(3);
  const test::CudnnSettings tf32(/*benchmark=*/false, at::globalContext().deterministicCuDNN(), /*allow_tf32=*/true);
  const std::vector<std::pair<torch::ScalarType, double>> dtypes = {
      {torch::kHalf, 3e-3}, {torch::kBFloat16, 2e-2}, {torch::kFloat, 3e-3}};
  for (const auto& [dt, tol] : dtypes) {
    const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
    const auto cl = at::MemoryFormat::ChannelsLast;
    // The input: channels 32..63 of a 96-channel tensor; the output: channels 16..47 of 64.
    auto wide_in = torch::randn({2, 96, 20, 24}, opts).contiguous(cl);
    const auto x = wide_in.narrow(1, 32, 32);
    auto w = (torch::randn({32, 32, 3, 3}, opts) * 0.1).contiguous(cl);
    auto b32 = torch::randn({32}, torch::TensorOptions().device(torch::kCUDA));
    auto wide_out = torch::full({2, 64, 20, 24}, 7.0, opts).contiguous(cl);
    const auto out = wide_out.narrow(1, 16, 32);
    const auto residual = torch::randn({2, 32, 20, 24}, opts).contiguous(cl);
    const Case c{"3x3 32->32", 32, 32, 3, 1, true};
    const auto ref = reference(x, w, b32, c) + residual.to(torch::kCPU, torch::kDouble);
    torch::InferenceMode im;
    const auto before = models::cudnn_fusion_stats();
    const auto y = models::cudnn_conv_bias_act(x, w, b32, 1, 1, true, residual, out);
    ASSERT_TRUE(y.defined()) << "a channel-slice input, a slice output and a residual must fuse ("
                             << c10::toString(dt) << ")";
    EXPECT_EQ(models::cudnn_fusion_stats().fused, before.fused + 1);
    EXPECT_EQ(y.data_ptr(), out.data_ptr());
    const double e = rel_err(y, ref);
    std::cout << "[ REPORT   ] fusion slice in/out + residual " << c10::toString(dt) << ": rel err " << e << "\n";
    EXPECT_LE(e, tol);
    EXPECT_TRUE((wide_out.narrow(1, 0, 16) == 7.0).all().item<bool>()) << "written outside its slice";
    EXPECT_TRUE((wide_out.narrow(1, 48, 16) == 7.0).all().item<bool>()) << "written outside its slice";
    // The residual from a slice too, and a packed output: same values within rounding.
    auto wide_r = torch::zeros({2, 64, 20, 24}, opts).contiguous(cl);
    wide_r.narrow(1, 32, 32).copy_(residual);
    const auto y2 = models::cudnn_conv_bias_act(x, w, b32, 1, 1, true, wide_r.narrow(1, 32, 32));
    ASSERT_TRUE(y2.defined());
    EXPECT_TRUE(y2.is_contiguous(cl));
    EXPECT_LE(rel_err(y2, ref), tol);
    // A residual of the wrong shape or dtype is declined, nothing written.
    EXPECT_FALSE(models::cudnn_conv_bias_act(x, w, b32, 1, 1, true, residual.narrow(1, 0, 16)).defined());
    const auto other = dt == torch::kFloat ? torch::kHalf : torch::kFloat;
    EXPECT_FALSE(models::cudnn_conv_bias_act(x, w, b32, 1, 1, true, residual.to(other)).defined());
    // A detection head's last convolution: 1x1, bias, no activation, into channels 64..143 of a
    // 144-channel output (float32 adds an identity op to its graph for cuDNN's fused engines).
    auto wide_head = torch::full({2, 144, 20, 24}, 7.0, opts).contiguous(cl);
    const auto head_out = wide_head.narrow(1, 64, 80);
    auto w1 = (torch::randn({80, 32, 1, 1}, opts) * 0.2).contiguous(cl);
    auto b1 = torch::randn({80}, torch::TensorOptions().device(torch::kCUDA));
    const auto y3 = models::cudnn_conv_bias_act(x, w1, b1, 1, 0, false, {}, head_out);
    ASSERT_TRUE(y3.defined()) << "a 1x1 convolution without activation into a slice must fuse (" << c10::toString(dt)
                              << ")";
    EXPECT_EQ(y3.data_ptr(), head_out.data_ptr());
    const double e3 = rel_err(y3, reference(x, w1, b1, {"1x1 32->80 no act", 32, 80, 1, 1, false}));
    std::cout << "[ REPORT   ] fusion 1x1 no act into a slice " << c10::toString(dt) << ": rel err " << e3 << "\n";
    EXPECT_LE(e3, tol);
    EXPECT_TRUE((wide_head.narrow(1, 0, 64) == 7.0).all().item<bool>()) << "written outside its slice";
  }
}

// A grouped folded block (YOLOv9's box tower: 4 groups) takes the fused operation through its
// dense block-diagonal weight: against the float64 reference of the grouped Conv + BN + SiLU.
TEST(GpuCudnnFusion, GroupedBlockFusesThroughItsDenseWeight) {
  LY_REQUIRE_FUSION();
  torch::manual_seed(4);
  models::common::ConvBnAct block(64, 64, 3, 1, 4);
  {
    torch::NoGradGuard ng;
    auto& bn = *block->bn;
    bn.running_mean.normal_(0, 0.5);
    bn.running_var.uniform_(0.5, 2.0);
    bn.weight.uniform_(0.5, 1.5);
    bn.bias.normal_(0, 0.3);
  }
  block->eval();
  auto ref_x = torch::randn({2, 64, 20, 24}, torch::kDouble);
  torch::Tensor ref;
  {
    torch::NoGradGuard ng;
    auto cpu = block->forward_unfolded(ref_x.to(torch::kFloat)).to(torch::kDouble);  // grouped, float32
    ref = cpu;
  }
  block->to(torch::kCUDA);
  {
    torch::NoGradGuard ng;
    for (auto& p : block->parameters())
      if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
  }
  const auto x = ref_x.to(torch::kCUDA, torch::kFloat).contiguous(at::MemoryFormat::ChannelsLast);
  const test::CudnnSettings tf32(/*benchmark=*/false, at::globalContext().deterministicCuDNN(), /*allow_tf32=*/true);
  const std::vector<std::pair<torch::ScalarType, double>> dtypes = {
      {torch::kHalf, 3e-3}, {torch::kBFloat16, 2e-2}, {torch::kFloat, 3e-3}};
  for (const auto& [dt, tol] : dtypes) {
    torch::InferenceMode im;
    if (dt != torch::kFloat) {  // float32: no autocast
      at::autocast::set_autocast_dtype(at::kCUDA, dt);
      at::autocast::set_autocast_enabled(at::kCUDA, true);
    }
    const auto before = models::cudnn_fusion_stats();
    const auto y = block->forward(x);
    const auto after = models::cudnn_fusion_stats();
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
    EXPECT_EQ(y.scalar_type(), dt);
    EXPECT_EQ(after.fused, before.fused + 1) << c10::toString(dt);
    EXPECT_EQ(after.declined, before.declined) << c10::toString(dt);
    const double e = rel_err(y, ref);
    std::cout << "[ REPORT   ] grouped (4) 3x3 block through its dense weight " << c10::toString(dt) << ": rel err "
              << e << "\n";
    EXPECT_LE(e, tol);
  }
}

// The training convolutions through cached plans (cudnn_conv_train: forward, input gradient,
// weight gradient) against float64 references on the CPU, for YOLO's 3x3 stride 1 and 2 shapes in
// float16, bfloat16 and float32 (TF32); each run twice gives the same bits (only deterministic
// engines are admitted); with autotuning on, plans are timed and written to the disk cache, and a
// fresh plan cache in memory reads them back and gives the same bits.
TEST(GpuCudnnFusion, TrainingConvolutionsMatchFloat64AndRepeatBitForBit) {
  LY_REQUIRE_FUSION();
  const test::CudnnSettings tuned(/*benchmark=*/true, at::globalContext().deterministicCuDNN(), /*allow_tf32=*/true);
  struct Shape {
    int64_t n, cin, hw, cout, stride;
  };
  const std::vector<Shape> shapes = {{4, 16, 40, 32, 1}, {4, 32, 40, 64, 2}, {2, 64, 20, 64, 1}};
  const std::vector<std::pair<torch::ScalarType, double>> dtypes = {
      {torch::kHalf, 3e-3}, {torch::kBFloat16, 2e-2}, {torch::kFloat, 3e-3}};
  const auto cl = at::MemoryFormat::ChannelsLast;
  torch::manual_seed(3);
  std::vector<torch::Tensor> first;
  for (int round = 0; round < 2; ++round) {
    if (round == 1) models::cudnn_fusion_forget_plans();  // as a new process: plans come from disk
    const auto before = models::cudnn_fusion_stats();
    size_t at = 0;
    for (const auto& [dtype, tol] : dtypes) {
      for (const auto& s : shapes) {
        torch::manual_seed(static_cast<uint64_t>(s.cin * 7 + s.stride));
        const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
        const auto x = torch::randn({s.n, s.cin, s.hw, s.hw}, opts).contiguous(cl);
        const auto w = (torch::randn({s.cout, s.cin, 3, 3}, opts) * 0.2).contiguous(cl);
        const int64_t oh = (s.hw + 2 - 3) / s.stride + 1;
        const auto dy = torch::randn({s.n, s.cout, oh, oh}, opts).contiguous(cl);
        const std::string what = std::string(c10::toString(dtype)) + " " + std::to_string(s.cin) + "->" +
                                 std::to_string(s.cout) + " s" + std::to_string(s.stride);
        const auto y = models::cudnn_conv_train(models::TrainConvOp::Forward, x, w, dy.sizes(), s.stride, 1);
        const auto dx = models::cudnn_conv_train(models::TrainConvOp::InputGrad, dy, w, x.sizes(), s.stride, 1);
        const auto dw = models::cudnn_conv_train(models::TrainConvOp::WeightGrad, dy, x, w.sizes(), s.stride, 1);
        ASSERT_TRUE(y.defined() && dx.defined() && dw.defined()) << what << ": a training convolution was declined";
        EXPECT_TRUE(y.is_contiguous(cl) && dx.is_contiguous(cl) && dw.is_contiguous(cl)) << what;
        // float64 references: forward, and the gradients of sum(y * dy).
        const auto x64 = x.to(torch::kCPU, torch::kDouble).requires_grad_(true);
        const auto w64 = w.to(torch::kCPU, torch::kDouble).requires_grad_(true);
        const auto y64 = torch::conv2d(x64, w64, {}, s.stride, 1);
        (y64 * dy.to(torch::kCPU, torch::kDouble)).sum().backward();
        const double ey = rel_err(y, y64.detach()), ex = rel_err(dx, x64.grad()), ew = rel_err(dw, w64.grad());
        std::cout << "[ REPORT   ] training conv " << what << " round " << round << ": rel err y " << ey << " dx "
                  << ex << " dw " << ew << "\n";
        EXPECT_LT(ey, tol) << what;
        EXPECT_LT(ex, tol) << what;
        EXPECT_LT(ew, tol) << what;
        for (const auto& t : {y, dx, dw}) {
          if (round == 0) {
            first.push_back(t.clone());
          } else {
            EXPECT_TRUE(torch::equal(t, first[at])) << what << ": the plan read from disk gives other bits";
          }
          ++at;
        }
        // Twice in a row: the same bits.
        EXPECT_TRUE(torch::equal(
            y, models::cudnn_conv_train(models::TrainConvOp::Forward, x, w, dy.sizes(), s.stride, 1)))
            << what;
        EXPECT_TRUE(torch::equal(
            dw, models::cudnn_conv_train(models::TrainConvOp::WeightGrad, dy, x, w.sizes(), s.stride, 1)))
            << what;
      }
    }
    const auto after = models::cudnn_fusion_stats();
    std::cout << "[ REPORT   ] round " << round << ": " << after.fused - before.fused << " plans, "
              << after.loaded - before.loaded << " from disk, " << after.declined - before.declined << " declined, "
              << after.build_ms - before.build_ms << " ms building\n";
    if (round == 1) EXPECT_EQ(after.loaded - before.loaded, after.fused - before.fused);
  }
  // A grouped or NCHW operand is declined (ATen's convolution takes it).
  const auto x = torch::randn({2, 16, 20, 20}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kHalf));
  const auto w = torch::randn({16, 16, 3, 3}, x.options()).contiguous(cl);
  EXPECT_FALSE(models::cudnn_conv_train(models::TrainConvOp::Forward, x, w, {2, 16, 20, 20}, 1, 1).defined());
}

// PlanTuning::Background: a new training configuration runs the heuristics' plan at once while a
// worker times its candidates; a capture meanwhile keeps running that plan (and replays it after
// the timed one is adopted); the next eager call adopts the timed plan, which a new process then
// reads from disk without timing anything.
TEST(GpuCudnnFusion, TrainingPlansTimedOnAWorkerRunAtOnceThenAreAdopted) {
  LY_REQUIRE_FUSION();
  const test::ScopedEnv background("LIBREYOLO_CUDNN_PLAN_BUILD", "background");
  struct Tuning {
    Tuning() { models::set_training_plan_tuning(models::PlanTuning::Background); }
    ~Tuning() { models::set_training_plan_tuning(models::PlanTuning::InCall); }
  } tuning;
  const test::CudnnSettings tuned(/*benchmark=*/true, at::globalContext().deterministicCuDNN(), /*allow_tf32=*/true);
  const auto cl = at::MemoryFormat::ChannelsLast;
  const torch::Device dev(torch::kCUDA, 0);
  torch::manual_seed(11);
  const auto opts = torch::TensorOptions().device(dev).dtype(torch::kBFloat16);
  const auto x = torch::randn({8, 32, 40, 40}, opts).contiguous(cl);
  const auto w = (torch::randn({64, 32, 3, 3}, opts) * 0.2).contiguous(cl);
  const std::vector<int64_t> ysize = {8, 64, 40, 40};
  const auto y64 = torch::conv2d(x.to(torch::kCPU, torch::kDouble), w.to(torch::kCPU, torch::kDouble), {}, 1, 1);
  const auto fwd = [&] { return models::cudnn_conv_train(models::TrainConvOp::Forward, x, w, ysize, 1, 1); };

  const auto s0 = models::cudnn_fusion_stats();
  const auto first = fwd();  // the heuristics' plan, run at once
  ASSERT_TRUE(first.defined());
  const auto s1 = models::cudnn_fusion_stats();
  EXPECT_EQ(s1.provisional - s0.provisional, 1);
  EXPECT_EQ(s1.fused - s0.fused, 1);
  EXPECT_LT(rel_err(first, y64), 2e-2);

  models::cudnn_fusion_wait_background();  // the worker has timed the candidates
  EXPECT_TRUE(models::cudnn_training_plans_settled());
  EXPECT_EQ(models::cudnn_fusion_stats().adopted, s1.adopted);  // handed over, not adopted yet

  // A capture now runs the plan the configuration ran so far.
  torch::Tensor captured;
  auto graph = CapturedGraph::capture(dev, [&] { captured = fwd(); });
  ASSERT_TRUE(captured.defined()) << "declined inside a capture while a timed plan waited";
  graph->replay();
  torch::cuda::synchronize();
  EXPECT_TRUE(torch::equal(captured, first));

  // The next eager call adopts the timed plan; the graph still replays the one it captured.
  const auto adopted = fwd();
  ASSERT_TRUE(adopted.defined());
  const auto s2 = models::cudnn_fusion_stats();
  EXPECT_EQ(s2.adopted - s1.adopted, 1);
  EXPECT_EQ(s2.fused, s1.fused);
  EXPECT_LT(rel_err(adopted, y64), 2e-2);
  EXPECT_EQ(models::cudnn_adopt_timed_plans(), 0);
  captured.zero_();
  graph->replay();
  torch::cuda::synchronize();
  EXPECT_TRUE(torch::equal(captured, first));
  std::cout << "[ REPORT   ] heuristics' plan vs timed plan: " << (torch::equal(adopted, first) ? "same" : "other")
            << " bits; " << s2.build_ms - s0.build_ms << " ms building and timing\n";

  // Handed over, then adopted by cudnn_adopt_timed_plans() (what a step does before its capture).
  const auto dgrad = [&] {
    return models::cudnn_conv_train(models::TrainConvOp::InputGrad, first, w, x.sizes(), 1, 1);
  };
  ASSERT_TRUE(dgrad().defined());
  models::cudnn_fusion_wait_background();
  EXPECT_EQ(models::cudnn_adopt_timed_plans(), 1);
  EXPECT_EQ(models::cudnn_fusion_stats().adopted - s2.adopted, 1);
  ASSERT_TRUE(dgrad().defined());

  // As a new process: the timed plans come from disk, nothing is timed or provisional.
  models::cudnn_fusion_forget_plans();
  const auto s3 = models::cudnn_fusion_stats();
  const auto again = fwd();
  ASSERT_TRUE(again.defined());
  const auto s4 = models::cudnn_fusion_stats();
  EXPECT_EQ(s4.loaded - s3.loaded, 1);
  EXPECT_EQ(s4.provisional, s3.provisional);
  EXPECT_EQ(s4.pending, 0);
  EXPECT_TRUE(torch::equal(again, adopted)) << "the plan read from disk is not the adopted one";
}
