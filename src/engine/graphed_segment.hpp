// A differentiable part of the training forward replayed from two CUDA graphs: its forward, and
// its backward into its parameters' gradients (for a family whose whole step cannot be captured,
// the part before the seam: Detector::train_head). One instance per input shape; its input is a
// tensor that outlives it (the step's staged network input), read in place by the forward graph;
// the region may read other such tensors (a seam's static inputs) the same way.
//
// run() replays the forward graph and returns its outputs (those that require a gradient at capture)
// attached to autograd through one node:
// when the backward reaches them, the node copies their gradients into static buffers, replays
// the backward graph and adds the parameter gradients it computed into the parameters' .grad with
// one multi-tensor add (the same values eager backward would accumulate: gradients are summed
// into .grad either way). The outputs are views of static buffers: the next run() overwrites them.
//
// Capture: the region must be a fixed-shape function of the input alone, without host reads, run
// eagerly at this shape before (cuDNN's algorithm choice, lazy allocations). The forward is
// captured first; the backward graph continues it (same stream, same memory pool: it reads the
// activations the forward left there). Neither capture executes anything: BatchNorm statistics
// and every other buffer move only when a replay runs.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "core/cuda_graph.hpp"

namespace libreyolo::engine {

class GraphedSegment {
 public:
  using Region = std::function<std::vector<torch::Tensor>(const torch::Tensor& input)>;

  // Captures `region` on `input` (which must stay allocated and be rewritten in place between
  // runs) for `params` (leaf tensors requiring grad; those the region does not reach get no
  // gradient). Throws CaptureError (nothing executed, nothing changed).
  static std::unique_ptr<GraphedSegment> capture(const torch::Device& device, const Region& region,
                                                 const torch::Tensor& input, std::vector<torch::Tensor> params);
  ~GraphedSegment();
  GraphedSegment(const GraphedSegment&) = delete;
  GraphedSegment& operator=(const GraphedSegment&) = delete;

  // The region's outputs for the input's current contents, differentiable with respect to the
  // parameters. Throws CaptureError when a replay fails.
  std::vector<torch::Tensor> run();

  // Backward-node side (engine use): the gradients at the outputs in, parameter .grad updated.
  void backward(const std::vector<torch::Tensor>& output_grads);

 private:
  GraphedSegment() = default;
  std::unique_ptr<CapturedGraph> forward_, backward_;
  std::vector<torch::Tensor> outputs_;       // static: written by the forward graph
  std::vector<bool> differentiable_;         // per output: attached to autograd
  std::vector<torch::Tensor> output_grads_;  // static, per differentiable output: read by the backward graph
  std::vector<torch::Tensor> params_;        // the parameters the backward graph reaches
  std::vector<torch::Tensor> param_grads_;   // static: written by the backward graph
};

}  // namespace libreyolo::engine
