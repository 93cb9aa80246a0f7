#include "engine/graphed_segment.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <string>

namespace libreyolo::engine {

namespace {

// The outputs' one backward node: no next edges (the parameter gradients are added into .grad
// by the segment itself, as AccumulateGrad would add them).
class SegmentBackward final : public torch::autograd::Node {
 public:
  explicit SegmentBackward(GraphedSegment* segment) : segment_(segment) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    segment_->backward(grads);
    return {};
  }
  std::string name() const override { return "GraphedSegmentBackward"; }

 private:
  GraphedSegment* segment_;  // outlives every autograd graph made from its run()
};

}  // namespace

std::unique_ptr<GraphedSegment> GraphedSegment::capture(const torch::Device& device, const Region& region,
                                                        const torch::Tensor& input, std::vector<torch::Tensor> params) {
  std::unique_ptr<GraphedSegment> s(new GraphedSegment());
  for (auto& p : params)
    if (p.defined() && p.requires_grad()) s->params_.push_back(p);
  if (s->params_.empty()) throw CaptureError("the segment has no parameter that requires a gradient");
  torch::AutoGradMode grad_on(true);
  std::vector<torch::Tensor> outs;
  s->forward_ = CapturedGraph::capture(device, [&] { outs = region(input); });
  if (outs.empty()) throw CaptureError("the segment's region returned no tensor");
  // Outputs without a gradient (detached references a loss reads) are returned as they are.
  std::vector<torch::Tensor> differentiable;
  for (const auto& o : outs) {
    s->differentiable_.push_back(o.requires_grad());
    if (!o.requires_grad()) continue;
    differentiable.push_back(o);
    s->output_grads_.push_back(torch::zeros_like(o));
  }
  if (differentiable.empty()) throw CaptureError("no output of the segment depends on its parameters");
  s->backward_ = CapturedGraph::capture(
      device,
      [&] {
        s->param_grads_ = torch::autograd::grad(differentiable, s->params_, s->output_grads_, /*retain_graph=*/false,
                                                /*create_graph=*/false, /*allow_unused=*/true);
      },
      {}, s->forward_.get());
  for (const auto& o : outs) s->outputs_.push_back(o.detach());
  return s;
}

GraphedSegment::~GraphedSegment() = default;

std::vector<torch::Tensor> GraphedSegment::run() {
  forward_->replay();
  auto node = std::shared_ptr<SegmentBackward>(new SegmentBackward(this), torch::autograd::deleteNode);
  std::vector<torch::Tensor> out;
  out.reserve(outputs_.size());
  for (size_t i = 0; i < outputs_.size(); ++i) {
    torch::Tensor v = outputs_[i].detach();
    if (differentiable_[i]) torch::autograd::create_gradient_edge(v, node);
    out.push_back(std::move(v));
  }
  return out;
}

void GraphedSegment::backward(const std::vector<torch::Tensor>& output_grads) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < output_grads_.size(); ++i) {
    if (i < output_grads.size() && output_grads[i].defined())
      output_grads_[i].copy_(output_grads[i]);
    else
      output_grads_[i].zero_();
  }
  backward_->replay();
  std::vector<torch::Tensor> into, add;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!param_grads_[i].defined()) continue;
    torch::Tensor& g = params_[i].mutable_grad();
    if (!g.defined()) {
      g = param_grads_[i].clone();  // a copy: the static buffer is rewritten by the next replay
    } else {
      into.push_back(g);
      add.push_back(param_grads_[i]);
    }
  }
  if (!into.empty()) at::_foreach_add_(into, add);
}

}  // namespace libreyolo::engine
