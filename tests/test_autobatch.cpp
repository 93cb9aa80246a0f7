// AutoBatch (batch=-1) on the CPU: the power-of-two rounding, the least-squares fit and its
// fallbacks, the per-GPU -> global arithmetic (the reference's table), the probe's
// non-CUDA path, the trainer's resolution and the batch validation. The probe itself (CUDA) is
// tests/gpu_test_autobatch.cpp.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <libreyolo/errors.hpp>

#include "core/config_schema.hpp"
#include "core/log.hpp"
#include "engine/autobatch.hpp"
#include "engine/memory_check.hpp"
#include "models/detector.hpp"
#include "support.hpp"

using namespace libreyolo;

namespace {

// Runs f with the log captured (Info and above) and returns what it wrote.
template <class F>
std::string captured_log(F&& f) {
  const LogLevel before = log_level();
  set_log_level(LogLevel::Info);
  testing::internal::CaptureStderr();
  f();
  std::string log = testing::internal::GetCapturedStderr();
  set_log_level(before);
  return log;
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace

TEST(AutoBatch, FloorPow2StrictIsTheLargestPowerOfTwoStrictlyBelow) {
  // The reference's rounding: the largest power of two strictly below.
  EXPECT_EQ(engine::floor_pow2_strict(33), 32);
  EXPECT_EQ(engine::floor_pow2_strict(32), 16);
  EXPECT_EQ(engine::floor_pow2_strict(65), 64);
  EXPECT_EQ(engine::floor_pow2_strict(17.5), 16);
  EXPECT_EQ(engine::floor_pow2_strict(5), 4);
  EXPECT_EQ(engine::floor_pow2_strict(4), 2);
  EXPECT_EQ(engine::floor_pow2_strict(2), 1);
  EXPECT_EQ(engine::floor_pow2_strict(0.5), 1);
  // Around the boundaries and outside the usual range.
  EXPECT_EQ(engine::floor_pow2_strict(2.0000001), 2);
  EXPECT_EQ(engine::floor_pow2_strict(3), 2);
  EXPECT_EQ(engine::floor_pow2_strict(4.0000001), 4);
  EXPECT_EQ(engine::floor_pow2_strict(1024), 512);
  EXPECT_EQ(engine::floor_pow2_strict(1025), 1024);
  EXPECT_EQ(engine::floor_pow2_strict(0), 1);
  EXPECT_EQ(engine::floor_pow2_strict(-7), 1);
  EXPECT_EQ(engine::floor_pow2_strict(std::nan("")), 1);
  EXPECT_EQ(engine::floor_pow2_strict(1e300), 1 << 30);
  for (int k = 2; k <= 20; ++k) {
    const double p = std::ldexp(1.0, k);
    EXPECT_EQ(engine::floor_pow2_strict(p), 1 << (k - 1)) << p;
    EXPECT_EQ(engine::floor_pow2_strict(p + 0.5), 1 << k) << p;
    EXPECT_EQ(engine::floor_pow2_strict(p - 0.5), 1 << (k - 1)) << p;
  }
}

TEST(AutoBatch, ResolveMatchesTheReferenceTable) {
  struct Row {
    int per_gpu, ws, nbs, global;
  };
  // The reference's per-GPU -> global table (nbs 0 = None).
  const std::vector<Row> rows = {{13, 4, 0, 52}, {32, 8, 0, 256}, {16, 1, 32, 16},
                                 {16, 2, 32, 32}, {16, 4, 32, 32}, {4, 8, 4, 8}};
  for (const Row& r : rows) {
    int g = 0;
    const std::string log = captured_log([&] { g = engine::resolve_auto_batch(r.per_gpu, r.ws, r.nbs); });
    EXPECT_EQ(g, r.global) << r.per_gpu << " x " << r.ws << " nbs " << r.nbs;
    EXPECT_TRUE(contains(log, "AutoBatch: per-GPU=" + std::to_string(r.global / r.ws) + "  world_size=" +
                                  std::to_string(r.ws) + "  global=" + std::to_string(r.global)))
        << log;
    const bool warned = contains(log, "exceeds nbs");
    EXPECT_EQ(warned, r.global > r.nbs && r.nbs > 0) << log;
  }
  const std::string log = captured_log([] { engine::resolve_auto_batch(4, 8, 4); });
  EXPECT_TRUE(contains(log, "AutoBatch: world_size=8 exceeds nbs=4 — global batch is 8. Gradient accumulation will "
                            "not reach the intended effective batch size."))
      << log;
}

TEST(AutoBatch, ResolveCapsAtNbsAndRoundsToTheWorldSize) {
  EXPECT_EQ(engine::resolve_auto_batch(64, 1, 32), 32);    // capped at nbs
  EXPECT_EQ(engine::resolve_auto_batch(16, 3, 40), 39);    // min(48, 40) -> multiple of 3
  EXPECT_EQ(engine::resolve_auto_batch(16, 0, 0), 16);     // world size below 1 counts as 1
  EXPECT_EQ(engine::resolve_auto_batch(0, 2, 0), 2);       // at least one image per GPU
  EXPECT_EQ(engine::resolve_auto_batch(1024, 1, 0), 1024); // no cap without nbs
}

TEST(AutoBatch, FitOfALinearProfile) {
  // mem = 0.5 + 0.25 * b: the target 8.5 GiB is reached at b = 32, and the result is the power
  // of two strictly below it.
  const std::vector<int> sizes = {1, 2, 4, 8, 16, 32, 64};
  std::vector<double> gib;
  for (int b : sizes) gib.push_back(0.5 + 0.25 * b);
  int r = 0;
  std::string log = captured_log([&] { r = engine::fit_auto_batch(sizes, gib, 8.5, 7); });
  EXPECT_EQ(r, 16);
  EXPECT_TRUE(contains(log, "AutoBatch: estimated optimal global batch = 16  (raw=32.0, target=8.5 GiB)")) << log;
  EXPECT_EQ(engine::fit_auto_batch(sizes, gib, 8.75, 7), 32);  // raw 33
  EXPECT_EQ(engine::fit_auto_batch(sizes, gib, 16.75, 7), 64);  // raw 65
  // Two points are enough; a profile with noise is fitted by least squares, not by its ends.
  EXPECT_EQ(engine::fit_auto_batch({1, 2}, {0.75, 1.0}, 8.5, 7), 16);
  // Least squares: slope 7/23, intercept 14/23, raw 30.9 -> 16 (the line through the two ends,
  // slope 2/7, would give raw 32.5 -> 32).
  EXPECT_EQ(engine::fit_auto_batch({1, 2, 4, 8}, {1.0, 1.0, 2.0, 3.0}, 10.0, 7), 16);
  // Clamped to [1, 1024].
  EXPECT_EQ(engine::fit_auto_batch(sizes, gib, 1e6, 7), 1024);
  EXPECT_EQ(engine::fit_auto_batch(sizes, gib, 0.1, 7), 1);  // target below the intercept
}

TEST(AutoBatch, FitFallsBackWithAWarningNamingWhy) {
  int r = 0;
  std::string log = captured_log([&] { r = engine::fit_auto_batch({1}, {0.75}, 8.5, 7); });
  EXPECT_EQ(r, 7);
  EXPECT_TRUE(contains(log, "AutoBatch: too few probe points — keeping batch=7")) << log;
  EXPECT_TRUE(contains(log, "WARNING")) << log;

  log = captured_log([&] { r = engine::fit_auto_batch({}, {}, 8.5, 5); });
  EXPECT_EQ(r, 5);
  EXPECT_TRUE(contains(log, "too few probe points — keeping batch=5")) << log;

  log = captured_log([&] { r = engine::fit_auto_batch({4, 4}, {1.0, 1.1}, 8.5, 9); });  // one distinct size
  EXPECT_EQ(r, 9);
  EXPECT_TRUE(contains(log, "too few probe points")) << log;

  log = captured_log([&] { r = engine::fit_auto_batch({1, 2, 4}, {2.0, 2.0, 2.0}, 8.5, 11); });  // flat
  EXPECT_EQ(r, 11);
  EXPECT_TRUE(contains(log, "AutoBatch: non-positive slope — keeping batch=11")) << log;

  log = captured_log([&] { r = engine::fit_auto_batch({1, 2, 4}, {3.0, 2.0, 1.0}, 8.5, 12); });  // decreasing
  EXPECT_EQ(r, 12);
  EXPECT_TRUE(contains(log, "non-positive slope — keeping batch=12")) << log;
  EXPECT_FALSE(contains(log, "estimated optimal")) << log;
}

TEST(AutoBatch, ProbeOnTheCpuKeepsTheFallbackAndLeavesTheModelAlone) {
  torch::manual_seed(0);
  auto model = models::find_family("yolo9")->build("t", 2);
  model->eval();
  auto before = models::state_dict(*model);
  for (auto& kv : before) kv.second = kv.second.clone();
  engine::AutoBatchOptions opt;
  opt.imgsz = 64;
  opt.fallback = 12;
  int r = 0;
  const std::string log = captured_log([&] { r = engine::probe_auto_batch(*model, torch::Device(torch::kCPU), opt); });
  EXPECT_EQ(r, 12);
  EXPECT_TRUE(contains(log, "AutoBatch: non-CUDA device (cpu) — keeping batch=12")) << log;
  EXPECT_FALSE(model->is_training());
  const auto after = models::state_dict(*model);
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(before[i].second, after[i].second)) << before[i].first;
}

TEST(AutoBatch, TrainerBatchIsResolvedOnlyForMinusOne) {
  torch::manual_seed(0);
  auto model = models::find_family("yolo9")->build("t", 2);
  const torch::Device cpu(torch::kCPU);
  TrainConfig cfg;
  cfg.imgsz = 64;
  cfg.batch = 8;
  std::string log = captured_log([&] { EXPECT_EQ(engine::resolve_train_batch(cfg, *model, cpu, {}, false), 8); });
  EXPECT_FALSE(contains(log, "AutoBatch")) << log;

  cfg.batch = -1;
  cfg.nbs = 0;
  log = captured_log([&] { EXPECT_EQ(engine::resolve_train_batch(cfg, *model, cpu, {}, false), 16); });
  EXPECT_TRUE(contains(log, "non-CUDA device (cpu) — keeping batch=16")) << log;
  EXPECT_TRUE(contains(log, "AutoBatch: per-GPU=16  world_size=1  global=16")) << log;
  EXPECT_TRUE(contains(log, "AutoBatch: resolved global batch size = 16")) << log;

  cfg.nbs = 8;  // the fallback is capped at nbs like a probed batch
  EXPECT_EQ(engine::resolve_train_batch(cfg, *model, cpu, {}, false), 8);
  cfg.nbs = 64;
  EXPECT_EQ(engine::resolve_train_batch(cfg, *model, cpu, {}, false), 16);
  cfg.nbs = 0;
  EXPECT_EQ(engine::resolve_train_batch(cfg, *model, cpu, {}, false, /*world_size=*/2), 32);
}

TEST(AutoBatch, ValidationAcceptsMinusOneAndRejectsOtherNonPositiveBatches) {
  TrainConfig cfg;
  cfg.batch = -1;
  EXPECT_NO_THROW(validate(cfg));
  for (int bad : {0, -2, -5}) {
    cfg.batch = bad;
    try {
      validate(cfg);
      ADD_FAILURE() << "batch=" << bad << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_EQ(e.code(), "config_range_error") << e.what();
      EXPECT_TRUE(contains(e.what(), "batch")) << e.what();
      EXPECT_TRUE(contains(e.what(), "-1")) << e.what();
    }
  }
}

TEST(MemoryCheck, CpuEstimateGrowsWithThePixelsAndLeavesTheModelAsItWas) {
  torch::manual_seed(0);
  auto model = models::find_family("yolo9")->build("t", 2);
  model->eval();
  std::vector<torch::Tensor> before;
  for (const auto& b : model->buffers()) before.push_back(b.clone());
  const double per_pixel = engine::cpu_activation_bytes_per_pixel(*model);
  // A train-mode forward keeps float32 activations of many layers per input pixel: hundreds of
  // bytes for YOLOv9-t, never nothing.
  EXPECT_GT(per_pixel, 50.0);
  EXPECT_FALSE(model->is_training());
  const auto after = model->buffers();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(after[i], before[i])) << i;
  const engine::MemoryEstimate small = engine::estimate_cpu_training_memory(*model, 2, 320, 1);
  const engine::MemoryEstimate large = engine::estimate_cpu_training_memory(*model, 8, 640, 1);
  // Four times the batch and the pixels: about 16 times the activations (two measurements).
  EXPECT_NEAR(large.activations_gib / small.activations_gib, 16.0, 4.0);
  engine::MemoryEstimate over = large;
  over.available_gib = 0.5 * over.need_gib();
  EXPECT_THROW(engine::check_memory_fits(over, 8, 640), UsageError);
  over.available_gib = 2.0 * over.need_gib();
  EXPECT_NO_THROW(engine::check_memory_fits(over, 8, 640));
}

TEST(MemoryCheck, DeviceEstimateScalesTheCpuMeasurementAndOnlyWarns) {
  torch::manual_seed(0);
  auto model = models::find_family("yolo9")->build("t", 2);
  const double per_pixel = 400.0;  // bytes per input pixel, as measured on the CPU
  const torch::Device cuda(torch::kCUDA, 0);
  const auto fp32 = engine::estimate_cuda_training_memory(per_pixel, *model, 4, 640, /*amp=*/false, cuda);
  const auto amp = engine::estimate_cuda_training_memory(per_pixel, *model, 4, 640, /*amp=*/true, cuda);
  EXPECT_EQ(fp32.where, "cuda:0");
  // Autocast halves the activations; the float32 state and input stay.
  EXPECT_NEAR(amp.activations_gib * 2.0, fp32.activations_gib, 1e-12);
  EXPECT_DOUBLE_EQ(amp.fixed_gib, fp32.fixed_gib);
  EXPECT_GT(fp32.activations_gib, per_pixel * 640.0 * 640.0 * 4 / (1024.0 * 1024.0 * 1024.0));  // the backward's share on top
  // Too large for the device: a warning with the numbers, not an error (a step that does not fit
  // stops with cuda_oom); the host's check refuses the same numbers.
  engine::MemoryEstimate over = fp32;
  over.available_gib = 0.5 * over.need_gib();
  testing::internal::CaptureStderr();
  EXPECT_NO_THROW(engine::check_memory_fits(over, 4, 640));
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("GPU memory may not suffice"), std::string::npos) << said;
  EXPECT_NE(said.find("cuda:0"), std::string::npos) << said;
  over.where.clear();
  EXPECT_THROW(engine::check_memory_fits(over, 4, 640), UsageError);
  // Without CUDA the device's free memory is unknown.
  if (!torch::cuda::is_available()) EXPECT_EQ(engine::device_free_gib(cuda), 0.0);
}
