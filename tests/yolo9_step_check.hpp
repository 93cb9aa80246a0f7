// One small YOLOv9-t training step on the GPU, for tests that compare a switch's two settings:
// the model (4 classes, seed 5) channels-last in training mode, a batch of two 128 px random
// images (seed 6), bf16 autocast, the loss a plain sum of the outputs' mean squares (the point is
// the layers inside, not the detector's loss), one backward. The caller fixes cuDNN's settings.
#pragma once
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "core/autocast.hpp"
#include "engine/step.hpp"
#include "models/detector.hpp"

namespace libreyolo::test {

// {loss, the parameters' gradients in parameter order}.
inline std::pair<double, std::vector<torch::Tensor>> yolo9t_bf16_step(const torch::Device& dev) {
  torch::manual_seed(5);
  auto model = models::find_family("yolo9")->build("t", 4);
  model->to(dev);
  engine::to_channels_last(*model);
  model->train();
  torch::manual_seed(6);
  torch::Tensor x =
      torch::rand({2, 3, 128, 128}, torch::TensorOptions().device(dev)).contiguous(at::MemoryFormat::ChannelsLast);
  torch::Tensor loss;
  {
    const AutocastGuard autocast(dev, true, torch::kBFloat16);
    auto outs = model->forward_raw(x);
    loss = torch::zeros({}, x.options());
    for (const auto& o : outs) loss = loss + o.to(torch::kFloat).square().mean();
  }
  loss.backward();
  std::vector<torch::Tensor> grads;
  for (auto& p : model->parameters())
    if (p.grad().defined()) grads.push_back(p.grad().clone());
  return {loss.item<double>(), grads};
}

}  // namespace libreyolo::test
