#include "families/rtmdet/model.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cmath>

#include "core/log.hpp"
#include "layers/slice_ops.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::models::rtmdet {

namespace {

// A plain container module (a Sequential or ModuleList of the reference): children "0", "1", ...
std::shared_ptr<torch::nn::Module> container() { return std::make_shared<torch::nn::Module>(); }

// LibreYOLO's size table: (deepen, widen) of CSPNeXt at widen 1 = stem 32/64, stages 128, 256,
// 512, 1024 with (3, 6, 6, 3) blocks; the neck's block count and width per size.
struct SizeRow {
  const char* name;
  double deepen, widen;
  int64_t neck_blocks, width;
  bool exp_on_reg;
};
constexpr SizeRow kSizes[] = {
    {"t", 0.167, 0.375, 1, 96, false}, {"s", 0.33, 0.5, 1, 128, false}, {"m", 0.67, 0.75, 2, 192, true},
    {"l", 1.0, 1.0, 3, 256, true},     {"x", 1.33, 1.25, 4, 320, true},
};

Arch arch_of(const SizeRow& r) {
  Arch a;
  a.stem = static_cast<int64_t>(std::floor(64 * r.widen / 2));
  a.stem_out = static_cast<int64_t>(64 * r.widen);
  const int64_t base_width[4] = {128, 256, 512, 1024}, base_blocks[4] = {3, 6, 6, 3};
  for (int i = 0; i < 4; ++i) {
    a.stage[i] = static_cast<int64_t>(base_width[i] * r.widen);
    a.blocks[i] = std::max<int64_t>(std::llround(base_blocks[i] * r.deepen), 1);
  }
  a.neck_blocks = r.neck_blocks;
  a.width = r.width;
  a.exp_on_reg = r.exp_on_reg;
  return a;
}

torch::nn::Conv2d prediction_conv(int64_t cin, int64_t cout) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(cin, cout, 1).bias(true));
}

// The reference's 1x1 prediction convolutions start at N(0, 0.01) weights and the given bias.
void init_prediction_conv(torch::nn::Conv2d& c, double bias) {
  torch::NoGradGuard no_grad;
  c->weight.normal_(0.0, 0.01);
  c->bias.fill_(bias);
}

const double kClsPriorBias = -std::log((1.0 - 0.01) / 0.01);

}  // namespace

bool Arch::operator==(const Arch& o) const {
  return stem == o.stem && stem_out == o.stem_out && stage == o.stage && blocks == o.blocks &&
         neck_blocks == o.neck_blocks && width == o.width && exp_on_reg == o.exp_on_reg;
}

const std::vector<std::string>& size_names() {
  static const std::vector<std::string> names = {"t", "s", "m", "l", "x"};
  return names;
}

Arch size_arch(const std::string& size) {
  for (const auto& r : kSizes)
    if (size == r.name) return arch_of(r);
  throw UsageError("unknown RTMDet size '" + size + "'", "use one of t, s, m, l, x", "model_unknown_size");
}

std::optional<std::string> size_of_stem(int64_t stem) {
  for (const auto& r : kSizes)
    if (arch_of(r).stem == stem) return std::string(r.name);
  return std::nullopt;
}

// ----------------------------------------------------------------------------------- the head

HeadImpl::HeadImpl(int64_t width_, int nc_, bool exp) : width(width_), nc(nc_), exp_on_reg(exp) {
  auto cls_list = container(), reg_list = container();
  cls_convs.resize(kStrides.size());
  reg_convs.resize(kStrides.size());
  for (size_t l = 0; l < kStrides.size(); ++l) {
    auto cls_level = container(), reg_level = container();
    for (int i = 0; i < kStackedConvs; ++i) {
      const std::string pos = std::to_string(i);
      Conv c = cls_level->register_module(pos, conv_bn_act(width, width, 3));
      Conv r = reg_level->register_module(pos, conv_bn_act(width, width, 3));
      if (l > 0) {  // the convolution is level 0's (same module, same tensor); the BatchNorm stays own
        c->conv = c->replace_module("conv", cls_convs[0][static_cast<size_t>(i)]->conv);
        r->conv = r->replace_module("conv", reg_convs[0][static_cast<size_t>(i)]->conv);
      }
      cls_convs[l].push_back(c);
      reg_convs[l].push_back(r);
    }
    cls_list->register_module(std::to_string(l), cls_level);
    reg_list->register_module(std::to_string(l), reg_level);
  }
  register_module("cls_convs", cls_list);
  register_module("reg_convs", reg_list);
  cls_list_ = container();
  auto reg_pred = container();
  for (size_t l = 0; l < kStrides.size(); ++l) {
    rtm_cls.push_back(cls_list_->register_module(std::to_string(l), prediction_conv(width, nc)));
    rtm_reg.push_back(reg_pred->register_module(std::to_string(l), prediction_conv(width, 4)));
  }
  register_module("rtm_cls", cls_list_);
  register_module("rtm_reg", reg_pred);
  init_weights();
}

void HeadImpl::init_weights() {
  torch::NoGradGuard no_grad;
  for (auto& level : cls_convs)
    for (auto& c : level) {
      c->conv->weight.normal_(0.0, 0.01);
      c->bn->weight.fill_(1.0);
      c->bn->bias.zero_();
    }
  for (auto& level : reg_convs)
    for (auto& c : level) {
      c->conv->weight.normal_(0.0, 0.01);
      c->bn->weight.fill_(1.0);
      c->bn->bias.zero_();
    }
  for (auto& c : rtm_cls) init_prediction_conv(c, kClsPriorBias);
  for (auto& c : rtm_reg) init_prediction_conv(c, 0.0);
}

torch::Tensor HeadImpl::forward_level(const torch::Tensor& x, size_t level) {
  auto cls = x, reg = x;
  for (auto& c : cls_convs[level]) cls = c->forward(cls);
  for (auto& c : reg_convs[level]) reg = c->forward(reg);
  cls = rtm_cls[level]->forward(cls);
  reg = rtm_reg[level]->forward(reg);
  const double stride = static_cast<double>(kStrides[level]);
  reg = exp_on_reg ? reg.exp() * stride : reg * stride;
  return torch::cat({reg, cls}, 1);
}

void HeadImpl::reset_num_classes(int new_nc) {
  if (new_nc < 1) throw UsageError(strfmt("number of classes must be >= 1, got %d", new_nc));
  if (new_nc == nc) return;
  nc = new_nc;
  for (size_t l = 0; l < rtm_cls.size(); ++l) {
    const auto device = rtm_cls[l]->weight.device();
    const auto dtype = rtm_cls[l]->weight.scalar_type();
    auto conv = prediction_conv(width, nc);
    init_prediction_conv(conv, kClsPriorBias);
    conv->to(device, dtype);
    rtm_cls[l] = cls_list_->replace_module(std::to_string(l), conv);
  }
}

// ---------------------------------------------------------------------------------- the model

RTMDetModel::RTMDetModel(const Arch& a, int nc) : arch_(a) {
  if (nc < 1) throw UsageError(strfmt("number of classes must be >= 1, got %d", nc));
  if (a.stem < 1 || a.stem_out < 1 || a.width < 1 || a.neck_blocks < 1)
    throw UsageError("RTMDet widths and depths must be >= 1");
  for (int i = 0; i < 4; ++i)
    if (a.stage[i] < 2 || a.blocks[i] < 1) throw UsageError("RTMDet stage widths must be >= 2 and depths >= 1");

  auto backbone = register_module("backbone", container());
  auto stem = backbone->register_module("stem", container());
  stem_[0] = stem->register_module("0", conv_bn_act(3, a.stem, 3, 2));
  stem_[1] = stem->register_module("1", conv_bn_act(a.stem, a.stem, 3));
  stem_[2] = stem->register_module("2", conv_bn_act(a.stem, a.stem_out, 3));
  int64_t cin = a.stem_out;
  for (int i = 0; i < 4; ++i) {
    auto stage = backbone->register_module("stage" + std::to_string(i + 1), container());
    const int64_t c = a.stage[i];
    down_[i] = stage->register_module("0", conv_bn_act(cin, c, 3, 2));
    const bool last = i == 3;
    if (last) spp_ = stage->register_module("1", SPPBottleneck(c, c));
    // Identity in the blocks of stages 1-3, channel attention in every stage.
    stage_csp_[i] = stage->register_module(last ? "2" : "1", CSPLayer(c, c, a.blocks[i], !last, true));
    cin = c;
  }

  // The neck on (C3, C4, C5) = stages 2, 3, 4: no identity, no attention.
  const int64_t c3 = a.stage[1], c4 = a.stage[2], c5 = a.stage[3], n = a.neck_blocks;
  auto neck = register_module("neck", container());
  auto reduce = neck->register_module("reduce_layers", container());
  auto top_down = neck->register_module("top_down_blocks", container());
  reduce_[0] = reduce->register_module("0", conv_bn_act(c5, c4, 1));
  top_down_[0] = top_down->register_module("0", CSPLayer(2 * c4, c4, n, false, false));
  reduce_[1] = reduce->register_module("1", conv_bn_act(c4, c3, 1));
  top_down_[1] = top_down->register_module("1", CSPLayer(2 * c3, c3, n, false, false));
  auto downsamples = neck->register_module("downsamples", container());
  auto bottom_up = neck->register_module("bottom_up_blocks", container());
  downsample_[0] = downsamples->register_module("0", conv_bn_act(c3, c3, 3, 2));
  bottom_up_[0] = bottom_up->register_module("0", CSPLayer(2 * c3, c4, n, false, false));
  downsample_[1] = downsamples->register_module("1", conv_bn_act(c4, c4, 3, 2));
  bottom_up_[1] = bottom_up->register_module("1", CSPLayer(2 * c4, c5, n, false, false));
  auto out_convs = neck->register_module("out_convs", container());
  const int64_t level_c[3] = {c3, c4, c5};
  for (int i = 0; i < 3; ++i)
    out_convs_[i] = out_convs->register_module(std::to_string(i), conv_bn_act(level_c[i], a.width, 3));

  head_ = register_module("head", Head(a.width, nc, a.exp_on_reg));
}

std::string RTMDetModel::size() const {
  for (const auto& name : size_names())
    if (size_arch(name) == arch_) return name;
  if (auto s = size_of_stem(arch_.stem)) return *s;
  return arch_.exp_on_reg ? "m" : "t";
}

void RTMDetModel::reset_num_classes(int nc) { head_->reset_num_classes(nc); }

void RTMDetModel::check_input(const torch::Tensor& x) const { check_stride32_input(x, "RTMDet"); }

std::vector<torch::Tensor> RTMDetModel::run(const torch::Tensor& x) {
  // Backbone: stage 2, 3 and 4 outputs (strides 8, 16, 32).
  auto y = stem_[2]->forward(stem_[1]->forward(stem_[0]->forward(x)));
  std::array<torch::Tensor, 4> stage_out;
  for (size_t i = 0; i < 4; ++i) {
    y = down_[i]->forward(y);
    if (i == 3) y = spp_->forward(y);
    y = stage_csp_[i]->forward(y);
    stage_out[i] = y;
  }
  const auto &c3 = stage_out[1], &c4 = stage_out[2], &c5 = stage_out[3];
  // Top-down: the reduced maps r5, r4 are kept for the bottom-up path.
  const auto r5 = reduce_[0]->forward(c5);
  const auto t4 = top_down_[0]->forward(torch::cat({common::upsample2x(r5), c4}, 1));
  const auto r4 = reduce_[1]->forward(t4);
  const auto p3 = top_down_[1]->forward(torch::cat({common::upsample2x(r4), c3}, 1));
  // Bottom-up.
  const auto n4 = bottom_up_[0]->forward(torch::cat({downsample_[0]->forward(p3), r4}, 1));
  const auto n5 = bottom_up_[1]->forward(torch::cat({downsample_[1]->forward(n4), r5}, 1));
  const std::array<torch::Tensor, 3> levels{p3, n4, n5};
  std::vector<torch::Tensor> maps;
  maps.reserve(3);
  for (size_t l = 0; l < 3; ++l) maps.push_back(head_->forward_level(out_convs_[l]->forward(levels[l]), l));
  return maps;
}

std::vector<torch::Tensor> RTMDetModel::forward_raw(const torch::Tensor& x) {
  check_input(x);
  return batched_.run_forward(x, [&] { return run(x); });
}

namespace {

// (x s, y s) of every cell of every level, level-major then row-major: [2, A] float32.
torch::Tensor make_priors(const LevelSizes& level_hw, const torch::Device& device) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  std::vector<torch::Tensor> parts;
  for (size_t i = 0; i < level_hw.size(); ++i) {
    const int64_t h = level_hw[i][0], w = level_hw[i][1];
    const float s = static_cast<float>(kStrides[i]);
    const auto px = (torch::arange(w, f32) * s).view({1, w}).expand({h, w}).reshape({1, -1});
    const auto py = (torch::arange(h, f32) * s).view({h, 1}).expand({h, w}).reshape({1, -1});
    parts.push_back(torch::cat({px, py}, 0));
  }
  return torch::cat(parts, 1).to(device);
}

}  // namespace

torch::Tensor RTMDetModel::decode(const std::vector<torch::Tensor>& raw) {
  const int64_t nc = num_classes(), channels = 4 + nc;
  if (raw.size() != kStrides.size()) throw UsageError(strfmt("RTMDet decode expects 3 level maps, got %zu", raw.size()));
  for (const auto& r : raw)
    if (r.dim() != 4 || r.size(1) != channels || r.size(0) != raw[0].size(0))
      throw UsageError(strfmt("RTMDet decode expects maps [B, %lld, H, W], got ", static_cast<long long>(channels)) +
                       c10::str(r.sizes()));
  // Boxes in float32 even under autocast (bf16 cannot resolve pixel coordinates).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto dtype = raw[0].scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  const int64_t batch = raw[0].size(0);
  std::vector<torch::Tensor> flat;
  flat.reserve(raw.size());
  for (const auto& r : raw) flat.push_back(r.reshape({batch, channels, -1}));
  const auto x = torch::cat(flat, 2).to(dtype);  // [B, 4 + nc, A]
  const auto priors = priors_.get(raw, [](const LevelSizes& sizes, c10::Device device) {
    return make_priors(sizes, device);
  }).to(dtype);                                  // [2, A]
  const auto lt = x.narrow(1, 0, 2), rb = x.narrow(1, 2, 2);
  return torch::cat({priors - lt, priors + rb, torch::sigmoid(x.narrow(1, 4, nc))}, 1);
}

}  // namespace libreyolo::models::rtmdet
