// Captured inference forwards of one model: per (input shape, autocast dtype,
// parameter dtype, device) the whole eval forward (input conversion, network, decode, float32
// output) is captured once in a CUDA graph and replayed. Owned by the loaded model, so graphs
// outlive a predict() call; a bounded cache of 8 (the least recently used shape goes).
//
// Modes: off (eager), on (capture a shape on its first use, after one eager warm-up run in the
// same call), auto (capture on the third occurrence). A family must declare that its eval forward
// can be captured (Family::capture_inference); `on` with one that does not is an error naming it,
// `auto` stays eager. A capture failure leaves that shape eager with one warning.
//
// Invalidation: release() drops every graph; the owner calls it when weights are loaded or
// trained, when the model moves to another device; a forward in training mode, or with another
// parameter dtype than a graph was captured with, drops them too. Graphs capture the
// BatchNorm-folded forward (common/fold.hpp): before a replay the folds are brought up to date in
// place (a weight written in place since is seen, as the unfolded graph would read it); should one
// have to be reallocated, the graphs are dropped. The fold switch is part of a graph's key.
#pragma once
#include <torch/torch.h>

#include <libreyolo/libreyolo.hpp>

#include <memory>
#include <string>
#include <vector>

#include "layers/fold.hpp"
#include "models/detector.hpp"

namespace libreyolo {
class CapturedGraph;
}

namespace libreyolo::models {

enum class GraphMode { Off, On, Auto };
// "false"/"off"/"0", "true"/"on"/"1", "auto". Throws UsageError naming `key` otherwise.
GraphMode parse_graph_mode(const std::string& value, const std::string& key = "cuda_graph");

struct ForwardSpec {
  torch::Device device{torch::kCPU};
  bool amp = false;
  torch::ScalarType amp_dtype = torch::kHalf;
  bool channels_last = true;
};

// The eager inference forward: input conversion (into *input when given, reused while the shape
// holds), the network and decode under autocast when asked, float32 predictions. What a graph
// captures, and what runs when none is used.
torch::Tensor eager_forward(Detector& model, const Family& family, const torch::Tensor& images, const ForwardSpec& spec,
                            torch::Tensor* input = nullptr, bool autocast_cache = true);

// The cache's counts and the graphs alive ("1x3x640x640 bf16" each), as the API reports them.
using ForwardGraphInfo = GraphInfo;

class ForwardGraphs {
 public:
  static constexpr size_t kMaxGraphs = 8;
  ForwardGraphs();
  ~ForwardGraphs();

  // images: [B, S, S, 3] uint8 letterboxed (host or device) -> [B, 4+nc, A] float32 on the device.
  // A replayed shape returns its graph's output tensor, overwritten by that shape's next replay.
  torch::Tensor forward(Detector& model, const Family& family, const torch::Tensor& images, const ForwardSpec& spec,
                        GraphMode mode);
  // Captures the shape [batch, imgsz, imgsz, 3] now (API capture_graph). Throws UsageError when the
  // family or device cannot, RuntimeError when the capture fails.
  void capture(Detector& model, const Family& family, int64_t batch, int64_t imgsz, const ForwardSpec& spec);
  // Drops every graph (why is logged when there was one).
  void release(const std::string& why);
  ForwardGraphInfo info() const;

 private:
  struct Entry;
  Entry& entry_for(const torch::Tensor& images, const ForwardSpec& spec, torch::ScalarType param_dtype);
  torch::Tensor eager(Detector& model, const Family& family, Entry& e, const ForwardSpec& spec, bool capturing);
  bool try_capture(Detector& model, const Family& family, Entry& e, const ForwardSpec& spec);
  std::vector<std::unique_ptr<Entry>> entries_;  // most recently used last
  ForwardGraphInfo counts_;
  common::FoldedLayers folds_;
  bool said_off_ = false;
};

}  // namespace libreyolo::models
