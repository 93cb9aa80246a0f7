#include "families/yolox/model.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cmath>

#include "core/log.hpp"
#include "libreyolo/errors.hpp"
#include "layers/slice_ops.hpp"

namespace libreyolo::models::yolox {

namespace {

// clang-format off
const SizeConfig kConfigs[] = {
  // size depth width depthwise inference size
  {"n", 0.33, 0.25,  true,  416},
  {"t", 0.33, 0.375, false, 416},
  {"s", 0.33, 0.50,  false, 640},
  {"m", 0.67, 0.75,  false, 640},
  {"l", 1.00, 1.00,  false, 640},
  {"x", 1.33, 1.25,  false, 640},
};
// clang-format on

// A plain container module (the reference's ModuleList / Sequential), children "0", "1", ...
std::shared_ptr<torch::nn::Module> container() { return std::make_shared<torch::nn::Module>(); }

torch::nn::Conv2d pred_conv(int64_t cin, int64_t cout) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(cin, cout, 1).bias(true));
}

}  // namespace

int64_t SizeConfig::base_depth() const {
  return std::max<int64_t>(static_cast<int64_t>(std::llround(3 * depth)), 1);
}
int64_t SizeConfig::neck_depth() const { return static_cast<int64_t>(std::llround(3 * depth)); }

const std::vector<std::string>& size_names() {
  static const std::vector<std::string> names = {"n", "t", "s", "m", "l", "x"};
  return names;
}

const SizeConfig& size_config(const std::string& size) {
  for (const auto& c : kConfigs)
    if (size == c.size) return c;
  throw UsageError("unknown YOLOX size '" + size + "'", "use one of n, t, s, m, l, x", "model_unknown_size");
}

// ------------------------------------------------------------------------------------ blocks

DWConvImpl::DWConvImpl(int64_t cin, int64_t cout, int64_t k, int64_t s) {
  dconv = register_module("dconv", BaseConv(cin, cin, k, s, /*groups=*/cin));
  pconv = register_module("pconv", BaseConv(cin, cout, 1, 1));
}

AnyConv register_conv(torch::nn::Module& parent, const std::string& name, int64_t cin, int64_t cout, int64_t k,
                      int64_t s, bool depthwise) {
  AnyConv c;
  if (depthwise) {
    c.dw = parent.register_module(name, DWConv(cin, cout, k, s));
  } else {
    c.base = parent.register_module(name, BaseConv(cin, cout, k, s));
  }
  return c;
}

BottleneckImpl::BottleneckImpl(int64_t cin, int64_t cout, bool shortcut, double expansion, bool depthwise)
    : add(shortcut && cin == cout) {
  const int64_t hidden = static_cast<int64_t>(static_cast<double>(cout) * expansion);
  conv1 = register_module("conv1", BaseConv(cin, hidden, 1));
  conv2 = register_conv(*this, "conv2", hidden, cout, 3, 1, depthwise);
}

torch::Tensor BottleneckImpl::forward(const torch::Tensor& x) {
  auto y = conv2(conv1->forward(x));
  return add ? y + x : y;
}

CSPLayerImpl::CSPLayerImpl(int64_t cin, int64_t cout, int64_t n, bool shortcut, bool depthwise) {
  const int64_t hidden = cout / 2;  // int(cout * 0.5)
  conv1 = register_module("conv1", BaseConv(cin, hidden, 1));
  conv2 = register_module("conv2", BaseConv(cin, hidden, 1));
  conv3 = register_module("conv3", BaseConv(2 * hidden, cout, 1));
  auto seq = container();
  for (int64_t i = 0; i < n; ++i) {
    m.emplace_back(hidden, hidden, shortcut, 1.0, depthwise);
    seq->register_module(std::to_string(i), m.back());
  }
  register_module("m", seq);
}

torch::Tensor CSPLayerImpl::forward(const torch::Tensor& x) {
  auto a = conv1->forward(x);
  for (auto& b : m) a = b->forward(a);
  return conv3->forward(torch::cat({a, conv2->forward(x)}, 1));
}

SPPBottleneckImpl::SPPBottleneckImpl(int64_t cin, int64_t cout) {
  const int64_t hidden = cin / 2;
  conv1 = register_module("conv1", BaseConv(cin, hidden, 1));
  conv2 = register_module("conv2", BaseConv(hidden * 4, cout, 1));
}

torch::Tensor SPPBottleneckImpl::forward(const torch::Tensor& x) {
  auto y = conv1->forward(x);
  std::vector<torch::Tensor> parts{y};
  for (int64_t k : {5, 9, 13}) parts.push_back(torch::max_pool2d(y, {k, k}, {1, 1}, {k / 2, k / 2}));
  return conv2->forward(torch::cat(parts, 1));
}

FocusImpl::FocusImpl(int64_t cin, int64_t cout) { conv = register_module("conv", BaseConv(4 * cin, cout, 3, 1)); }

torch::Tensor FocusImpl::forward(const torch::Tensor& x) {
  using torch::indexing::None;
  using torch::indexing::Slice;
  const auto tl = x.index({Slice(), Slice(), Slice(0, None, 2), Slice(0, None, 2)});
  const auto bl = x.index({Slice(), Slice(), Slice(1, None, 2), Slice(0, None, 2)});
  const auto tr = x.index({Slice(), Slice(), Slice(0, None, 2), Slice(1, None, 2)});
  const auto br = x.index({Slice(), Slice(), Slice(1, None, 2), Slice(1, None, 2)});
  return conv->forward(torch::cat({tl, bl, tr, br}, 1));
}

DarkStageImpl::DarkStageImpl(int64_t cin, int64_t cout, int64_t n, bool with_spp, bool depthwise) {
  down = register_conv(*this, "0", cin, cout, 3, 2, depthwise);
  if (with_spp) {
    spp = register_module("1", SPPBottleneck(cout, cout));
    csp = register_module("2", CSPLayer(cout, cout, n, /*shortcut=*/false, depthwise));
  } else {
    csp = register_module("1", CSPLayer(cout, cout, n, /*shortcut=*/true, depthwise));
  }
}

torch::Tensor DarkStageImpl::forward(const torch::Tensor& x) {
  auto y = down(x);
  if (spp) y = spp->forward(y);
  return csp->forward(y);
}

CSPDarknetImpl::CSPDarknetImpl(const SizeConfig& cfg) {
  const int64_t c = cfg.base_channels(), d = cfg.base_depth();
  const bool dw = cfg.depthwise;
  stem = register_module("stem", Focus(3, c));
  dark2 = register_module("dark2", DarkStage(c, 2 * c, d, false, dw));
  dark3 = register_module("dark3", DarkStage(2 * c, 4 * c, 3 * d, false, dw));
  dark4 = register_module("dark4", DarkStage(4 * c, 8 * c, 3 * d, false, dw));
  dark5 = register_module("dark5", DarkStage(8 * c, 16 * c, d, true, dw));
}

std::array<torch::Tensor, 3> CSPDarknetImpl::forward(const torch::Tensor& x) {
  auto x2 = dark3->forward(dark2->forward(stem->forward(x)));
  auto x1 = dark4->forward(x2);
  auto x0 = dark5->forward(x1);
  return {x2, x1, x0};
}

PAFPNImpl::PAFPNImpl(const SizeConfig& cfg) {
  const int64_t c0 = static_cast<int64_t>(256 * cfg.width), c1 = static_cast<int64_t>(512 * cfg.width),
                c2 = static_cast<int64_t>(1024 * cfg.width), n = cfg.neck_depth();
  const bool dw = cfg.depthwise;
  backbone = register_module("backbone", CSPDarknet(cfg));
  lateral_conv0 = register_module("lateral_conv0", BaseConv(c2, c1, 1));
  C3_p4 = register_module("C3_p4", CSPLayer(2 * c1, c1, n, false, dw));
  reduce_conv1 = register_module("reduce_conv1", BaseConv(c1, c0, 1));
  C3_p3 = register_module("C3_p3", CSPLayer(2 * c0, c0, n, false, dw));
  bu_conv2 = register_conv(*this, "bu_conv2", c0, c0, 3, 2, dw);
  C3_n3 = register_module("C3_n3", CSPLayer(2 * c0, c1, n, false, dw));
  bu_conv1 = register_conv(*this, "bu_conv1", c1, c1, 3, 2, dw);
  C3_n4 = register_module("C3_n4", CSPLayer(2 * c1, c2, n, false, dw));
}

std::array<torch::Tensor, 3> PAFPNImpl::forward(const torch::Tensor& x) {
  const auto [x2, x1, x0] = backbone->forward(x);
  auto f0 = lateral_conv0->forward(x0);
  auto p4 = C3_p4->forward(torch::cat({common::upsample2x(f0), x1}, 1));
  auto f1 = reduce_conv1->forward(p4);
  auto out3 = C3_p3->forward(torch::cat({common::upsample2x(f1), x2}, 1));
  auto out4 = C3_n3->forward(torch::cat({bu_conv2(out3), f1}, 1));
  auto out5 = C3_n4->forward(torch::cat({bu_conv1(out4), f0}, 1));
  return {out3, out4, out5};
}

// -------------------------------------------------------------------------------------- head

ConvPairImpl::ConvPairImpl(int64_t c, bool depthwise) {
  c0 = register_conv(*this, "0", c, c, 3, 1, depthwise);
  c1 = register_conv(*this, "1", c, c, 3, 1, depthwise);
}

HeadImpl::HeadImpl(const std::array<int64_t, 3>& in_ch, int64_t width_, int nc_, bool depthwise)
    : nc(nc_), width(width_) {
  auto cls_c = container(), reg_c = container(), reg_p = container(), obj_p = container(), stem_c = container();
  cls_pred_container = container();
  for (int k = 0; k < 3; ++k) {
    const std::string i = std::to_string(k);
    cls_convs.push_back(cls_c->register_module(i, ConvPair(width, depthwise)));
    reg_convs.push_back(reg_c->register_module(i, ConvPair(width, depthwise)));
    cls_preds.push_back(cls_pred_container->register_module(i, pred_conv(width, nc)));
    reg_preds.push_back(reg_p->register_module(i, pred_conv(width, 4)));
    obj_preds.push_back(obj_p->register_module(i, pred_conv(width, 1)));
    stems.push_back(stem_c->register_module(i, BaseConv(in_ch[k], width, 1)));
  }
  register_module("cls_convs", cls_c);
  register_module("reg_convs", reg_c);
  register_module("cls_preds", cls_pred_container);
  register_module("reg_preds", reg_p);
  register_module("obj_preds", obj_p);
  register_module("stems", stem_c);
}

std::vector<torch::Tensor> HeadImpl::forward(const std::array<torch::Tensor, 3>& feats) {
  std::vector<torch::Tensor> out;
  out.reserve(3);
  for (int k = 0; k < 3; ++k) {
    auto x = stems[k]->forward(feats[k]);
    auto cls_feat = cls_convs[k]->forward(x);
    auto reg_feat = reg_convs[k]->forward(x);
    out.push_back(torch::cat(
        {reg_preds[k]->forward(reg_feat), obj_preds[k]->forward(reg_feat), cls_preds[k]->forward(cls_feat)}, 1));
  }
  return out;
}

void HeadImpl::init_biases(double prior) {
  const double b = -std::log((1.0 - prior) / prior);
  torch::NoGradGuard no_grad;
  for (int k = 0; k < 3; ++k) {
    cls_preds[k]->bias.fill_(b);
    obj_preds[k]->bias.fill_(b);
  }
}

void HeadImpl::reset_num_classes(int new_nc) {
  if (new_nc < 1) throw UsageError(strfmt("number of classes must be >= 1, got %d", new_nc));
  if (new_nc == nc) return;
  nc = new_nc;
  // The new class outputs start at the class prior (upstream YOLOX initialises the head before
  // loading; LibreYOLO 1.6.0 leaves PyTorch's default bias here).
  const double b = -std::log((1.0 - 0.01) / 0.01);
  torch::NoGradGuard no_grad;
  for (int k = 0; k < 3; ++k) {
    auto conv = pred_conv(width, nc);
    conv->to(cls_preds[k]->weight.device(), cls_preds[k]->weight.scalar_type());
    conv->bias.fill_(b);
    cls_preds[k] = cls_pred_container->replace_module(std::to_string(k), conv);
  }
}

// --------------------------------------------------------------------------------------- model

YoloxModel::YoloxModel(const std::string& size, int nc) : size_(size) {
  const SizeConfig& cfg = size_config(size);
  if (nc < 1) throw UsageError(strfmt("number of classes must be >= 1, got %d", nc));
  const int64_t w = cfg.head_width();
  const std::array<int64_t, 3> ch = {static_cast<int64_t>(256 * cfg.width), static_cast<int64_t>(512 * cfg.width),
                                     static_cast<int64_t>(1024 * cfg.width)};
  backbone_ = register_module("backbone", PAFPN(cfg));
  head_ = register_module("head", Head(ch, w, nc, cfg.depthwise));
  // A fresh model starts with the class/objectness prior, as the reference trainer sets it for a
  // fresh run (loaded weights overwrite it).
  head_->init_biases(0.01);
}

std::vector<torch::Tensor> YoloxModel::forward_raw(const torch::Tensor& x) {
  check_stride32_input(x, "YOLOX");
  return layers_.run_forward(x, [&] { return head_->forward(backbone_->forward(x)); });
}

void YoloxModel::reset_num_classes(int nc) { head_->reset_num_classes(nc); }

std::pair<torch::Tensor, torch::Tensor> make_grid(const std::vector<std::array<int64_t, 2>>& level_hw,
                                                  const std::vector<int64_t>& strides, const torch::Device& device) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  std::vector<torch::Tensor> cells, st;
  for (size_t i = 0; i < level_hw.size(); ++i) {
    const int64_t h = level_hw[i][0], w = level_hw[i][1];
    auto gy = torch::arange(h, f32).view({h, 1}).expand({h, w}).reshape({1, -1});
    auto gx = torch::arange(w, f32).view({1, w}).expand({h, w}).reshape({1, -1});
    cells.push_back(torch::cat({gx, gy}, 0));
    st.push_back(torch::full({h * w}, static_cast<float>(strides[i]), f32));
  }
  return {torch::cat(cells, 1).to(device), torch::cat(st).to(device)};
}

std::pair<torch::Tensor, torch::Tensor> YoloxModel::grid(const std::vector<torch::Tensor>& raw) {
  return grids_.get(raw, [&](const LevelSizes& sizes, c10::Device device) { return make_grid(sizes, strides(), device); });
}

torch::Tensor YoloxModel::decode(const std::vector<torch::Tensor>& raw) {
  const int64_t nc = head_->nc, channels = 5 + nc;
  if (raw.size() != 3) throw UsageError(strfmt("YOLOX decode expects 3 level maps, got %zu", raw.size()));
  for (const auto& r : raw)
    if (r.dim() != 4 || r.size(1) != channels || r.size(0) != raw[0].size(0))
      throw UsageError(strfmt("YOLOX decode expects maps [B, %lld, H, W], got ", static_cast<long long>(channels)) +
                       c10::str(r.sizes()));
  // Boxes in float32 even under autocast (bf16 cannot resolve pixel coordinates).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto dtype = raw[0].scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  const int64_t batch = raw[0].size(0);
  std::vector<torch::Tensor> flat;
  for (const auto& r : raw) flat.push_back(r.reshape({batch, channels, -1}));
  auto x = torch::cat(flat, 2).to(dtype);  // [B, C, A]
  auto [cells, st] = grid(raw);
  cells = cells.to(dtype);
  st = st.to(dtype);
  const auto xy = (x.narrow(1, 0, 2) + cells) * st;     // centres
  const auto half = torch::exp(x.narrow(1, 2, 2)) * st / 2;  // half sizes
  const auto scores = torch::sigmoid(x.narrow(1, 4, 1)) * torch::sigmoid(x.narrow(1, 5, nc));
  return torch::cat({xy - half, xy + half, scores}, 1);
}

}  // namespace libreyolo::models::yolox
