#include "core/cuda_graph.hpp"

#include <mutex>
#include <optional>

#include "core/env.hpp"

#ifdef LIBREYOLO_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace libreyolo {

bool cuda_graphs_supported(const torch::Device& device, std::string* why) {
  auto no = [&](const char* reason) {
    if (why) *why = reason;
    return false;
  };
  if (!device.is_cuda()) return no("CUDA graphs need a CUDA device");
#ifndef LIBREYOLO_CUDA
  return no("this build has no CUDA support");
#else
  if (!torch::cuda::is_available()) return no("no CUDA device is available");
  return true;
#endif
}

#ifdef LIBREYOLO_CUDA

struct CapturedGraph::Impl {
  at::cuda::CUDAGraph graph;
  at::cuda::MempoolId_t pool;
  std::optional<at::cuda::CUDAStream> stream;  // the stream captured on
};

namespace {

std::mutex& capture_mutex() {
  static std::mutex m;
  return m;
}

std::string first_line(const std::string& s) {
  const auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

}  // namespace

std::unique_ptr<CapturedGraph> CapturedGraph::capture(const torch::Device& device,
                                                      const std::function<void()>& region,
                                                      std::vector<std::shared_ptr<const void>> keep_alive,
                                                      const CapturedGraph* after) {
  std::string why;
  if (!cuda_graphs_supported(device, &why)) throw CaptureError(why);
  std::lock_guard<std::mutex> lock(capture_mutex());
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  c10::cuda::CUDAGuard device_guard(index);
  // Everything queued before (the staging copies, an eager warm-up) is finished: the side stream
  // needs no event ordering and the allocator has no block still in use on another stream.
  c10::cuda::device_synchronize();
  std::unique_ptr<CapturedGraph> out(new CapturedGraph());
  out->impl_ = std::make_unique<Impl>();
  out->keep_alive_ = std::move(keep_alive);
  if (after && !after->impl_) throw CaptureError("the graph to continue has no capture");
  const bool own_pool = after == nullptr;
  const at::cuda::MempoolId_t pool = own_pool ? at::cuda::graph_pool_handle() : after->impl_->pool;
  // The stream captured on carries the region's main chain; what the region forks to other
  // streams (inference branches, the training step's weight gradients) is off its critical
  // path. Kernel nodes keep their stream's priority (PyTorch instantiates with node
  // priorities): captured on a high-priority stream, the block scheduler serves the main chain
  // first when both have blocks waiting (H200, v9-t fp32 batch 1 graphed 0.717-0.721 ->
  // 0.704-0.711 ms). LIBREYOLO_GRAPH_PRIORITY=0 captures at normal priority.
  static const bool high = env_switch_on("LIBREYOLO_GRAPH_PRIORITY");
  at::cuda::CUDAStream side = own_pool ? at::cuda::getStreamFromPool(high, index) : *after->impl_->stream;
  out->impl_->pool = pool;
  out->impl_->stream = side;
  bool began = false;
  try {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    out->impl_->graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    began = true;
    region();
    out->impl_->graph.capture_end();
  } catch (const std::exception& e) {
    const std::string reason = first_line(e.what());
    if (began) {
      // End the capture if it is still open, then give the pool back: nothing was executed.
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(side.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
        cudaGraph_t g = nullptr;
        cudaStreamEndCapture(side.stream(), &g);
        if (g) cudaGraphDestroy(g);
      }
      try {
        c10::cuda::CUDACachingAllocator::endAllocateToPool(index, pool);
      } catch (...) {
      }
      out->impl_.reset();  // the graph object before its pool
      try {  // this capture's reference to the pool (a shared pool stays its first graph's)
        c10::cuda::CUDACachingAllocator::releasePool(index, pool);
      } catch (...) {
      }
    }
    (void)cudaGetLastError();  // a failed capture leaves a (non-sticky) error behind
    throw CaptureError(reason);
  }
  return out;
}

void CapturedGraph::replay() {
  try {
    impl_->graph.replay();
  } catch (const std::exception& e) {
    (void)cudaGetLastError();
    throw CaptureError(first_line(e.what()));
  }
  ++replays_;
}

CapturedGraph::~CapturedGraph() = default;

void release_cached_blocks(const torch::Device& device) {
  if (!device.is_cuda()) return;
  c10::cuda::CUDAGuard guard(device);
  c10::cuda::device_synchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
}

#else  // no CUDA in this build

void release_cached_blocks(const torch::Device&) {}

struct CapturedGraph::Impl {};

std::unique_ptr<CapturedGraph> CapturedGraph::capture(const torch::Device& device, const std::function<void()>&,
                                                      std::vector<std::shared_ptr<const void>>, const CapturedGraph*) {
  std::string why;
  cuda_graphs_supported(device, &why);
  throw CaptureError(why);
}

void CapturedGraph::replay() { throw CaptureError("this build has no CUDA support"); }

CapturedGraph::~CapturedGraph() = default;

#endif

}  // namespace libreyolo
