// The capture-ready step on the GPU: 30 micro-batches of YOLOv9-t (channels_last, fp16 autocast
// with the loss scaler, EMA, accumulation windows of 2, 2 and 1) through the trainer's window
// arithmetic. After the second step the CUDA caching allocator makes no device allocation (no
// new segment, no cudaMalloc, no retry), and every persistent tensor keeps its address.
#include <c10/cuda/CUDACachingAllocator.h>

#include "step_check.hpp"
#include "support.hpp"

using namespace libreyolo;

namespace {

struct AllocatorCounts {
  int64_t segments_allocated, device_allocs, retries, ooms, reserved_bytes;
};

AllocatorCounts allocator_counts(int device) {
  const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return {st.segment[all].allocated, st.num_device_alloc, st.num_alloc_retries, st.num_ooms,
          st.reserved_bytes[all].current};
}

}  // namespace

TEST(GpuStep, NoDeviceAllocationAfterTheSecondStep) {
  LY_REQUIRE_CUDA();
  const torch::Device dev(torch::kCUDA, 0);
  TrainConfig cfg;
  cfg.batch = 4;
  cfg.nbs = 8;  // accumulate 2
  cfg.epochs = 10;
  cfg.warmup_epochs = 1;
  const engine::AmpPlan amp = engine::plan_amp(true, "float16", dev);
  ASSERT_TRUE(amp.scaler);
  auto rig = test::make_step_rig(cfg, dev, amp, /*channels_last=*/true, /*batches_per_epoch=*/5);
  ASSERT_EQ(rig.setup.accumulate, 2);
  auto& runner = rig.runner();
  // Pinned host batches, as the loader gives them; made before the loop (they are host memory).
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int i = 0; i < 30; ++i) {
    auto [images, targets] = test::step_batch(500 + i, cfg.batch, 128);
    batches.emplace_back(images.pin_memory(), targets.pin_memory());
  }
  AllocatorCounts ref{};
  std::vector<std::pair<std::string, torch::Tensor>> ref_tensors;
  std::vector<const void*> ref_ptrs;
  for (int step = 1; step <= 30; ++step) {
    const int64_t bi = (step - 1) % rig.batches_per_epoch;
    const auto w = test::window_of(bi, rig.batches_per_epoch, rig.setup.accumulate);
    const auto& [images, targets] = batches[step - 1];
    runner.forward_backward(images, targets, static_cast<double>(w.size));
    if (w.optimizer_step) runner.optimizer_step();
    torch::cuda::synchronize();
    if (step == 2) {
      ref = allocator_counts(0);
      ref_tensors = test::step_tensors(rig);
      ref_ptrs = test::data_pointers(ref_tensors);
    } else if (step > 2) {
      const AllocatorCounts now = allocator_counts(0);
      EXPECT_EQ(now.segments_allocated, ref.segments_allocated) << "step " << step << ": new memory segment";
      EXPECT_EQ(now.device_allocs, ref.device_allocs) << "step " << step << ": cudaMalloc";
      EXPECT_EQ(now.retries, ref.retries) << "step " << step;
      EXPECT_EQ(now.ooms, ref.ooms) << "step " << step;
      EXPECT_EQ(now.reserved_bytes, ref.reserved_bytes) << "step " << step;
      auto tensors = test::step_tensors(rig);
      ASSERT_EQ(tensors.size(), ref_tensors.size()) << "step " << step;
      auto ptrs = test::data_pointers(tensors);
      for (size_t k = 0; k < ptrs.size(); ++k)
        EXPECT_EQ(ptrs[k], ref_ptrs[k]) << "step " << step << ": " << tensors[k].first << " was reallocated";
    }
  }
  EXPECT_EQ(runner.global_step(), 18);
  EXPECT_EQ(rig.ema->updates(), 18);
  std::cerr << "[ GpuStep ] after 30 steps: segments allocated " << ref.segments_allocated << ", reserved "
            << ref.reserved_bytes / (1 << 20) << " MiB, loss scale " << runner.scaler().current_scale() << "\n";
}
