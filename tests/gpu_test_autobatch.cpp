// AutoBatch's probe on a GPU: real train-mode forward+backward passes of YOLOv9-t, after which
// the model is as it was (every module's train/eval mode, every BatchNorm's running statistics
// and batch counter, no gradients), the result is a power of two, and an out-of-memory error
// (forced with a per-process memory cap) ends probing instead of failing it.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <string>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "engine/autobatch.hpp"
#include "engine/step.hpp"
#include "models/detector.hpp"
#include "support.hpp"

using namespace libreyolo;

namespace {

struct ModelRecord {
  std::vector<bool> modes;                                      // root first, then modules() order
  std::vector<std::pair<std::string, torch::Tensor>> bn;        // BatchNorm buffers, cloned
};

ModelRecord record(torch::nn::Module& m) {
  ModelRecord r;
  r.modes.push_back(m.is_training());
  for (const auto& sub : m.modules(/*include_self=*/false)) r.modes.push_back(sub->is_training());
  for (const auto& kv : m.named_modules("", /*include_self=*/false)) {
    if (!models::is_batchnorm(*kv.value())) continue;
    for (const auto& b : kv.value()->named_buffers(/*recurse=*/false))
      r.bn.emplace_back(kv.key() + "." + b.key(), b.value().clone());
  }
  return r;
}

// Number of BatchNorm buffers that differ between two records (and whether the modes match).
int bn_differences(const ModelRecord& a, const ModelRecord& b) {
  EXPECT_EQ(a.bn.size(), b.bn.size());
  int n = 0;
  for (size_t i = 0; i < std::min(a.bn.size(), b.bn.size()); ++i) {
    EXPECT_EQ(a.bn[i].first, b.bn[i].first);
    if (!torch::equal(a.bn[i].second, b.bn[i].second)) ++n;
  }
  return n;
}

bool is_pow2(int v) { return v >= 1 && (v & (v - 1)) == 0; }

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

std::shared_ptr<models::Detector> yolo9t_on(const torch::Device& dev) {
  torch::manual_seed(0);
  auto model = models::find_family("yolo9")->build("t", 2);
  model->to(dev);
  return model;
}

// A cap on this process's share of the device memory for a scope.
struct MemoryCap {
  MemoryCap(double fraction, int device) : device_(device) {
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device_);
  }
  ~MemoryCap() { c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, device_); }
  int device_;
};

}  // namespace

TEST(GpuAutoBatch, ProbeRestoresModesAndBatchNormStatistics) {
  LY_REQUIRE_CUDA();
  const torch::Device dev(torch::kCUDA, 0);
  auto model = yolo9t_on(dev);
  model->train();
  // A frozen BatchNorm (eval inside a training model) must stay in eval.
  int frozen = 0;
  for (const auto& m : model->modules(false))
    if (models::is_batchnorm(*m) && frozen < 3) {
      m->eval();
      ++frozen;
    }
  ASSERT_EQ(frozen, 3);
  const ModelRecord before = record(*model);

  engine::AutoBatchOptions opt;
  opt.imgsz = 160;
  opt.max_probe = 16;
  opt.amp = engine::plan_amp(true, "bfloat16", dev);
  opt.channels_last = true;
  int r = 0;
  const std::string log = captured_log([&] { r = engine::probe_auto_batch(*model, dev, opt); });
  std::cout << log;
  EXPECT_TRUE(is_pow2(r) && r <= 1024) << r;
  for (int b : {1, 2, 4, 8, 16}) EXPECT_TRUE(contains(log, "AutoBatch: batch " + std::to_string(b) + ": ")) << log;
  EXPECT_FALSE(contains(log, "AutoBatch: batch 32")) << log;
  EXPECT_TRUE(contains(log, "total=")) << log;
  EXPECT_TRUE(contains(log, "estimated optimal global batch = " + std::to_string(r))) << log;

  const ModelRecord after = record(*model);
  EXPECT_EQ(after.modes, before.modes);
  EXPECT_EQ(bn_differences(before, after), 0);
  for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());

  // The check can fail: one train-mode forward does change the running statistics.
  model->forward_raw(torch::rand({2, 3, 64, 64}, torch::TensorOptions().device(dev)));
  EXPECT_GT(bn_differences(before, record(*model)), 0);
}

TEST(GpuAutoBatch, ProbeOfAnEvalModelInFloat32) {
  LY_REQUIRE_CUDA();
  const torch::Device dev(torch::kCUDA, 0);
  auto model = yolo9t_on(dev);
  model->eval();
  const ModelRecord before = record(*model);
  engine::AutoBatchOptions opt;
  opt.imgsz = 128;
  opt.max_probe = 8;
  int r = 0;
  const std::string log = captured_log([&] { r = engine::probe_auto_batch(*model, dev, opt); });
  std::cout << log;
  EXPECT_TRUE(is_pow2(r) && r <= 1024) << r;
  EXPECT_TRUE(contains(log, "AutoBatch: batch 8: ")) << log;
  const ModelRecord after = record(*model);
  EXPECT_FALSE(model->is_training());
  EXPECT_EQ(after.modes, before.modes);
  EXPECT_EQ(bn_differences(before, after), 0);
}

TEST(GpuAutoBatch, OutOfMemoryEndsProbing) {
  LY_REQUIRE_CUDA();
  const torch::Device dev(torch::kCUDA, 0);
  auto model = yolo9t_on(dev);
  model->train();
  const ModelRecord before = record(*model);
  engine::AutoBatchOptions opt;
  opt.imgsz = 640;
  opt.max_probe = 256;
  int r = 0;
  std::string log;
  {
    // 1 GiB for this process: YOLOv9-t at 640 px in fp32 runs out long before batch 256.
    const double total = static_cast<double>(at::cuda::getDeviceProperties(0)->totalGlobalMem);
    MemoryCap cap(std::min(1.0, 1024.0 * 1024.0 * 1024.0 / total), 0);
    log = captured_log([&] { EXPECT_NO_THROW(r = engine::probe_auto_batch(*model, dev, opt)); });
  }
  std::cout << log;
  EXPECT_TRUE(contains(log, "out of memory, probing stops")) << log;
  EXPECT_FALSE(contains(log, "AutoBatch: batch 256: ")) << log;
  EXPECT_TRUE(is_pow2(r) && r <= 1024) << r;
  EXPECT_EQ(record(*model).modes, before.modes);
  EXPECT_EQ(bn_differences(before, record(*model)), 0);
  for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
  // The device is usable afterwards.
  auto y = model->forward_raw(torch::zeros({2, 3, 64, 64}, torch::TensorOptions().device(dev)));
  EXPECT_TRUE(y[0].isfinite().all().item<bool>());
}

TEST(GpuAutoBatch, TrainerBatchIsCappedAtNbs) {
  LY_REQUIRE_CUDA();
  const torch::Device dev(torch::kCUDA, 0);
  auto model = yolo9t_on(dev);
  TrainConfig cfg;
  cfg.batch = -1;
  cfg.imgsz = 64;
  cfg.nbs = 8;
  int g = 0;
  const std::string log = captured_log(
      [&] { g = engine::resolve_train_batch(cfg, *model, dev, engine::plan_amp(true, "bfloat16", dev), true); });
  std::cout << log;
  EXPECT_TRUE(is_pow2(g) && g <= 8) << g;
  EXPECT_TRUE(contains(log, "AutoBatch: batch 8: ")) << log;  // max_probe = nbs
  EXPECT_FALSE(contains(log, "AutoBatch: batch 16")) << log;
  EXPECT_TRUE(contains(log, "AutoBatch: resolved global batch size = " + std::to_string(g))) << log;
}
