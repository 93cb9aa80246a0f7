// One captured CUDA graph: a region of device work recorded once and replayed. Shared by the
// training step (engine/step) and, later, inference. The region is a function of tensors that
// outlive the graph (static inputs and outputs); whatever else it reads that was allocated
// outside it must be kept alive by the caller (`keep_alive`).
//
// Capture runs on a side stream in thread-local capture mode (another thread's CUDA calls, e.g.
// a loader thread pinning memory, neither break it nor are recorded), under one process-wide lock
// (one capture at a time), with its own memory pool. On failure the capture state is cleaned up,
// nothing was executed, and CaptureError says why: the caller runs the region eagerly instead.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace libreyolo {

class CaptureError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Whether this build and process can capture on `device` (a CUDA device with a CUDA build);
// otherwise `why` says why not.
bool cuda_graphs_supported(const torch::Device& device, std::string* why = nullptr);

// Gives the device's unused cached blocks (outside the graphs' pools) back to the driver. Called
// before the training step is captured: the blocks its eager steps cached are not needed by its
// replays (they use the graph's own pool), and without this the capture reserves its pool on top
// of them. Waits for the device. Nothing on a device without CUDA.
void release_cached_blocks(const torch::Device& device);

class CapturedGraph {
 public:
  // Records `region` (it must queue device work only: no host synchronisation, no host-to-device
  // copy from pageable memory, no allocation that must outlive the graph other than its outputs).
  // The current stream must be idle or ordered before: capture waits for it. Does NOT run it:
  // call replay(). Throws CaptureError. `after`: a graph whose region this one continues (a
  // backward after its forward): captured on the same stream into the same memory pool, so that it
  // may read what that region left in the pool (saved activations); replay them in order.
  static std::unique_ptr<CapturedGraph> capture(const torch::Device& device, const std::function<void()>& region,
                                                std::vector<std::shared_ptr<const void>> keep_alive = {},
                                                const CapturedGraph* after = nullptr);
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  // Queues the recorded work on the current stream. Throws CaptureError on a launch failure.
  void replay();
  int64_t replays() const { return replays_; }

 private:
  CapturedGraph() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::shared_ptr<const void>> keep_alive_;
  int64_t replays_ = 0;
};

}  // namespace libreyolo
