#include "families/rtdetr/hgnetv2.hpp"

#include <string>

namespace libreyolo::models::rtdetr {

namespace {

// One zero row below and one zero column right of the input.
torch::Tensor pad_after_input(const torch::Tensor& x) { return torch::constant_pad_nd(x, {0, 1, 0, 1}, 0); }

}  // namespace

HgConvImpl::HgConvImpl(int64_t cin, int64_t cout, int64_t k, int64_t s, bool relu_, bool frozen, int64_t groups,
                       bool pad_after_, bool lab)
    : relu(relu_), pad_after(pad_after_) {
  const int64_t pad = pad_after ? 0 : (k - 1) / 2;
  conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(cin, cout, k).stride(s).padding(pad).groups(groups).bias(false));
  if (pad_after) {
    // The padding is the container's parameterless entry "0"; only "1" is registered.
    auto seq = container();
    seq->register_module("1", conv);
    register_module("conv", seq);
  } else {
    register_module("conv", conv);
  }
  if (frozen) {
    frozen_bn = register_module("bn", FrozenBatchNorm2d(cout));
  } else {
    bn = register_module("bn", torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(cout).eps(1e-5).momentum(0.1)));
  }
  if (lab && relu) {
    auto affine = container();
    lab_scale = affine->register_parameter("scale", torch::ones({1}));
    lab_bias = affine->register_parameter("bias", torch::zeros({1}));
    register_module("lab", affine);
  }
}

torch::Tensor HgConvImpl::forward(const torch::Tensor& x) {
  const auto in = pad_after ? pad_after_input(x) : x;
  const auto y = fold_.forward(in, conv, bn, frozen_bn, relu ? Act::ReLU : Act::None, is_training());
  return relu && lab_scale.defined() ? lab_scale * y + lab_bias : y;
}

void HgConvImpl::train(bool on) {
  fold_.note_mode(is_training(), on);
  torch::nn::Module::train(on);
}

HgStemImpl::HgStemImpl(int64_t mid, int64_t out, bool frozen, bool lab, bool pad_outside_) : pad_outside(pad_outside_) {
  const bool inner = !pad_outside;  // the padding as the convolution's container entry "0"
  stem1 = register_module("stem1", HgConv(3, mid, 3, 2, true, frozen, 1, false, lab));
  stem2a = register_module("stem2a", HgConv(mid, mid / 2, 2, 1, true, frozen, 1, inner, lab));
  stem2b = register_module("stem2b", HgConv(mid / 2, mid, 2, 1, true, frozen, 1, inner, lab));
  stem3 = register_module("stem3", HgConv(2 * mid, mid, 3, 2, true, frozen, 1, false, lab));
  stem4 = register_module("stem4", HgConv(mid, out, 1, 1, true, frozen, 1, false, lab));
}

torch::Tensor HgStemImpl::forward(const torch::Tensor& x) {
  const auto y = stem1->forward(x);
  const auto branch = pad_outside ? stem2b->forward(pad_after_input(stem2a->forward(pad_after_input(y))))
                                  : stem2b->forward(stem2a->forward(y));
  // Stride 1 over the padded map: the output keeps y's size (ceil mode changes nothing here).
  const auto pooled = torch::max_pool2d(pad_after_input(y), {2, 2}, {1, 1}, {0, 0}, {1, 1}, /*ceil_mode=*/true);
  return stem4->forward(stem3->forward(torch::cat({pooled, branch}, 1)));
}

HgLightConvImpl::HgLightConvImpl(int64_t cin, int64_t cout, int64_t k, bool frozen, bool lab) {
  conv1 = register_module("conv1", HgConv(cin, cout, 1, 1, false, frozen));
  conv2 = register_module("conv2", HgConv(cout, cout, k, 1, true, frozen, /*groups=*/cout, false, lab));
}

torch::Tensor HgLightConvImpl::forward(const torch::Tensor& x) { return conv2->forward(conv1->forward(x)); }

HgBlockImpl::HgBlockImpl(int64_t cin, const HgStageSpec& stage, bool residual_, bool frozen, bool lab,
                         bool dfine_names)
    : residual(residual_) {
  auto list = container();
  for (int i = 0; i < stage.layers; ++i) {
    const int64_t in = i == 0 ? cin : stage.mid;
    if (stage.light) {
      light.push_back(HgLightConv(in, stage.mid, stage.kernel, frozen, lab));
      list->register_module(std::to_string(i), light.back());
    } else {
      plain.push_back(HgConv(in, stage.mid, stage.kernel, 1, true, frozen, 1, false, lab));
      list->register_module(std::to_string(i), plain.back());
    }
  }
  register_module("layers", list);
  const int64_t total = cin + stage.layers * stage.mid;
  squeeze = HgConv(total, stage.out / 2, 1, 1, true, frozen, 1, false, lab);
  excitation = HgConv(stage.out / 2, stage.out, 1, 1, true, frozen, 1, false, lab);
  if (dfine_names) {
    auto seq = container();
    seq->register_module("0", squeeze);
    seq->register_module("1", excitation);
    register_module("aggregation", seq);
  } else {
    register_module("aggregation_squeeze_conv", squeeze);
    register_module("aggregation_excitation_conv", excitation);
  }
}

torch::Tensor HgBlockImpl::forward(const torch::Tensor& x) {
  std::vector<torch::Tensor> parts{x};
  auto y = x;
  for (auto& l : plain) parts.push_back(y = l->forward(y));
  for (auto& l : light) parts.push_back(y = l->forward(y));
  y = excitation->forward(squeeze->forward(torch::cat(parts, 1)));
  return residual ? y + x : y;
}

HgStageImpl::HgStageImpl(int64_t cin, const HgStageSpec& stage, bool frozen, bool lab, bool dfine_names) {
  if (stage.downsample)
    downsample = register_module("downsample", HgConv(cin, cin, 3, 2, false, frozen, /*groups=*/cin));
  auto list = container();
  for (int j = 0; j < stage.blocks; ++j) {
    blocks.push_back(HgBlock(j == 0 ? cin : stage.out, stage, /*residual=*/j > 0, frozen, lab, dfine_names));
    list->register_module(std::to_string(j), blocks.back());
  }
  register_module("blocks", list);
}

torch::Tensor HgStageImpl::forward(const torch::Tensor& x) {
  auto y = downsample ? downsample->forward(x) : x;
  for (auto& b : blocks) y = b->forward(y);
  return y;
}

HGNetv2Impl::HGNetv2Impl(const HgNetSpec& spec, bool frozen_norm) {
  stem = register_module("stem", HgStem(spec.stem_mid, spec.stem_out, frozen_norm, spec.lab, spec.dfine_names));
  auto list = container();
  for (int i = 0; i < 4; ++i) {
    stages.push_back(
        HgStage(spec.stage_in(i), spec.stages[static_cast<size_t>(i)], frozen_norm, spec.lab, spec.dfine_names));
    list->register_module(std::to_string(i), stages.back());
  }
  register_module("stages", list);
  if (spec.kaiming_init) reset_parameters();
}

void HGNetv2Impl::reset_parameters() {
  torch::NoGradGuard no_grad;
  for (auto& m : modules(/*include_self=*/false)) {
    if (auto* c = m->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(c->weight);
    } else if (auto* b = m->as<torch::nn::BatchNorm2d>()) {
      b->weight.fill_(1);
      b->bias.zero_();
    }
  }
}

std::array<torch::Tensor, 3> HGNetv2Impl::forward(const torch::Tensor& x) {
  auto y = stem->forward(x);
  std::array<torch::Tensor, 3> outs;
  for (size_t i = 0; i < stages.size(); ++i) {
    y = stages[i]->forward(y);
    if (i >= 1) outs[i - 1] = y;
  }
  return outs;
}

std::vector<torch::Tensor> HGNetv2Impl::forward_from(const torch::Tensor& x, int from) {
  auto y = stem->forward(x);
  std::vector<torch::Tensor> outs;
  for (size_t i = 0; i < stages.size(); ++i) {
    y = stages[i]->forward(y);
    if (static_cast<int>(i) >= from) outs.push_back(y);
  }
  return outs;
}

}  // namespace libreyolo::models::rtdetr
