#include "families/yolo9/model.hpp"

#include <ATen/autocast_mode.h>

#include "layers/concat.hpp"
#include "layers/slice_ops.hpp"
#include "layers/conv_bn_act.hpp"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cmath>

#include "core/log.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::models::yolo9 {

namespace {

// clang-format off
const SizeConfig kConfigs[] = {
  // size conv0 conv1 elan? first(out,part) adown  stages {down, elan, part} x3          spp  n  up1      up2      down1 ed1      down2 ed2
  {"t", 16, 32,  true,  32,  32,  false, {{{64, 64, 64}, {96, 96, 96}, {128, 128, 128}}},    128, 3, 96, 96,  64, 64,  48,  96, 96,  64,  128, 128},
  {"s", 32, 64,  true,  64,  64,  false, {{{128, 128, 128}, {192, 192, 192}, {256, 256, 256}}}, 256, 3, 192, 192, 128, 128, 96, 192, 192, 128, 256, 256},
  {"m", 32, 64,  false, 128, 128, false, {{{240, 240, 240}, {360, 360, 360}, {480, 480, 480}}}, 480, 1, 360, 360, 240, 240, 184, 360, 360, 240, 480, 480},
  {"c", 64, 128, false, 256, 128, true,  {{{256, 512, 256}, {512, 512, 512}, {512, 512, 512}}}, 512, 1, 512, 512, 256, 256, 256, 512, 512, 512, 512, 512},
};
// clang-format on

Downsample make_down(torch::nn::Module& parent, const std::string& name, bool adown, int64_t c1,
                     int64_t c2) {
  Downsample d;
  if (adown) {
    d.adown = parent.register_module(name, ADown(c1, c2));
  } else {
    d.aconv = parent.register_module(name, AConv(c1, c2));
  }
  return d;
}

RepNCSPELAN make_elan(int64_t c_in, int64_t out, int64_t part, int64_t n) {
  return RepNCSPELAN(c_in, part, part / 2, out, n);
}

// cat[upsample2x(a), b]: the top-down path's concatenations. Without autograd assembled in place
// (common/concat.hpp): a upsampled by one strided copy into the first slice in its own dtype
// (autocast would upsample in float32 and the concatenation would follow), b copied after it.
torch::Tensor upsample_cat(const torch::Tensor& a, const torch::Tensor& b) {
  if (!common::ChannelConcat::applies(b) || a.dim() != 4 || b.size(2) != 2 * a.size(2) || b.size(3) != 2 * a.size(3))
    return torch::cat({common::upsample2x(a), b}, 1);
  const common::ChannelConcat cat(b.size(0), b.size(2), b.size(3),
                                  b.options().dtype(at::result_type(a, b)).memory_format(b.suggest_memory_format()),
                                  {a.size(1), b.size(1)});
  common::upsample2x_into(a, *cat.part(0));
  cat.part(1)->copy_(b);
  return cat.whole();
}

}  // namespace

const std::vector<std::string>& size_names() {
  static const std::vector<std::string> names = {"t", "s", "m", "c"};
  return names;
}

const SizeConfig& size_config(const std::string& size) {
  for (const auto& c : kConfigs) {
    if (size == c.size) return c;
  }
  throw UsageError("unknown YOLOv9 size '" + size + "'", "use one of t, s, m, c",
                   "model_unknown_size");
}

int64_t class_hidden_width(const std::string& size, int nc) {
  const int64_t ch0 = size_config(size).head_channels()[0];
  return std::max<int64_t>(ch0, std::min<int64_t>(nc, 100));
}

// ------------------------------------------------------------------------------- backbone

BackboneImpl::BackboneImpl(const SizeConfig& cfg) {
  conv0_ = register_module("conv0", Conv(3, cfg.conv0, 3, 2));
  conv1_ = register_module("conv1", Conv(cfg.conv0, cfg.conv1, 3, 2));
  if (cfg.first_is_elan) {
    elan1_plain_ = register_module(
        "elan1", ELAN(cfg.conv1, cfg.first_part, cfg.first_part / 2, cfg.first_out));
  } else {
    elan1_rep_ = register_module("elan1", make_elan(cfg.conv1, cfg.first_out, cfg.first_part, cfg.n));
  }
  const auto& st = cfg.stages;
  down2_ = make_down(*this, "down2", cfg.adown, cfg.first_out, st[0][0]);
  elan2_ = register_module("elan2", make_elan(st[0][0], st[0][1], st[0][2], cfg.n));
  down3_ = make_down(*this, "down3", cfg.adown, st[0][1], st[1][0]);
  elan3_ = register_module("elan3", make_elan(st[1][0], st[1][1], st[1][2], cfg.n));
  down4_ = make_down(*this, "down4", cfg.adown, st[1][1], st[2][0]);
  elan4_ = register_module("elan4", make_elan(st[2][0], st[2][1], st[2][2], cfg.n));
  spp_ = register_module("spp", SPPELAN(st[2][1], cfg.spp_out / 2, cfg.spp_out));
}

std::array<torch::Tensor, 3> BackboneImpl::forward(const torch::Tensor& x, const Placement& place,
                                                   torch::Tensor* b5) {
  const auto at = [&](int level, const torch::Tensor& input, const ConvImpl& producer) -> ConvOutput {
    return {place ? place(level, input, producer) : nullptr};
  };
  auto y = conv1_->forward(conv0_->forward(x));
  y = elan1_plain_ ? elan1_plain_->forward(y) : elan1_rep_->forward(y);
  const auto d2 = down2_(y);
  auto p3 = elan2_->forward(d2, at(0, d2, *elan2_->cv4));
  const auto d3 = down3_(p3);
  auto p4 = elan3_->forward(d3, at(1, d3, *elan3_->cv4));
  const auto e4 = elan4_->forward(down4_(p4));
  if (b5) *b5 = e4;
  auto p5 = spp_->forward(e4, at(2, e4, *spp_->cv5));
  return {p3, p4, p5};
}

// ----------------------------------------------------------------------------------- neck

NeckImpl::NeckImpl(const SizeConfig& cfg) {
  const int64_t p3 = cfg.stages[0][1], p4 = cfg.stages[1][1], p5 = cfg.spp_out;
  elan_up1_ = register_module("elan_up1", make_elan(p5 + p4, cfg.up1_out, cfg.up1_part, cfg.n));
  elan_up2_ =
      register_module("elan_up2", make_elan(cfg.up1_out + p3, cfg.up2_out, cfg.up2_part, cfg.n));
  down1_ = make_down(*this, "down1", cfg.adown, cfg.up2_out, cfg.down1_out);
  elan_down1_ = register_module("elan_down1", make_elan(cfg.down1_out + cfg.up1_out, cfg.elan_down1_out,
                                                        cfg.elan_down1_part, cfg.n));
  down2_ = make_down(*this, "down2", cfg.adown, cfg.elan_down1_out, cfg.down2_out);
  elan_down2_ = register_module(
      "elan_down2", make_elan(cfg.down2_out + p5, cfg.elan_down2_out, cfg.elan_down2_part, cfg.n));
}

namespace {

// The concatenation `consumer` reads whose second part `producer` writes for input x (ELAN and
// SPPELAN keep their input's batch and spatial size: the concatenation's): [consumer's input
// channels - producer's output channels, producer's output channels].
common::ChannelConcat second_part_of(const RepNCSPELAN& consumer, const ConvImpl& producer, const torch::Tensor& x) {
  const int64_t total = consumer->cv1->conv->weight.size(1), second = producer.conv->weight.size(0);
  return common::ChannelConcat(x, producer, {total - second, second});
}

}  // namespace

const torch::Tensor* NeckImpl::Concats::place(int level, const torch::Tensor& input, const ConvImpl& producer) {
  auto& cat = level == 0 ? up2_ : level == 1 ? up1_ : down2_;
  cat = second_part_of(level == 0 ? neck_.elan_up2_ : level == 1 ? neck_.elan_up1_ : neck_.elan_down2_, producer,
                       input);
  return cat->part(1);
}

std::array<torch::Tensor, 3> NeckImpl::forward(const std::array<torch::Tensor, 3>& p,
                                               const std::function<void(int, const torch::Tensor&)>& ready,
                                               Concats* cats) {
  if (cats && cats->up1_ && cats->up2_ && cats->down2_) {  // P4, P3 and P5 are in their concatenations
    common::upsample2x_into(p[2], *cats->up1_->part(0));
    const torch::Tensor& up1 = cats->up1_->whole();
    cats->down1_ = second_part_of(elan_down1_, *elan_up1_->cv4, up1);
    const auto n4 = elan_up1_->forward(up1, {cats->down1_->part(1)});
    common::upsample2x_into(n4, *cats->up2_->part(0));
    auto o3 = elan_up2_->forward(cats->up2_->whole());
    if (ready) ready(0, o3);
    down1_(o3, {cats->down1_->part(0)});
    auto o4 = elan_down1_->forward(cats->down1_->whole());
    if (ready) ready(1, o4);
    down2_(o4, {cats->down2_->part(0)});
    auto o5 = elan_down2_->forward(cats->down2_->whole());
    if (ready) ready(2, o5);
    return {o3, o4, o5};
  }
  auto n4 = elan_up1_->forward(upsample_cat(p[2], p[1]));
  auto o3 = elan_up2_->forward(upsample_cat(n4, p[0]));
  if (ready) ready(0, o3);
  auto o4 = elan_down1_->forward(torch::cat({down1_(o3), n4}, 1));
  if (ready) ready(1, o4);
  auto o5 = elan_down2_->forward(torch::cat({down2_(o4), p[2]}, 1));
  if (ready) ready(2, o5);
  return {o3, o4, o5};
}

// ------------------------------------------------------------------------------ aux neck

AuxNeckImpl::AuxNeckImpl(const SizeConfig& cfg) {
  const int64_t b3 = cfg.stages[0][1], b4 = cfg.stages[1][1], b5 = cfg.stages[2][1];
  spp_ = register_module("spp", SPPELAN(b5, cfg.spp_out / 2, cfg.spp_out));
  elan_a4_ = register_module("elan_a4", make_elan(cfg.spp_out + b4, cfg.up1_out, cfg.up1_part, cfg.n));
  elan_a3_ = register_module("elan_a3", make_elan(cfg.up1_out + b3, cfg.up2_out, cfg.up2_part, cfg.n));
}

std::array<torch::Tensor, 3> AuxNeckImpl::forward(const torch::Tensor& p3, const torch::Tensor& p4,
                                                  const torch::Tensor& b5) {
  auto a5 = spp_->forward(b5);
  auto a4 = elan_a4_->forward(upsample_cat(a5, p4));
  auto a3 = elan_a3_->forward(upsample_cat(a4, p3));
  return {a3, a4, a5};
}

// ----------------------------------------------------------------------------------- head

TowerImpl::TowerImpl(int64_t c_in, int64_t hidden, int64_t c_out, int64_t groups) {
  c0 = register_module("0", Conv(c_in, hidden, 3));
  c1 = register_module("1", Conv(hidden, hidden, 3, 1, groups));
  out = register_module(
      "2", torch::nn::Conv2d(torch::nn::Conv2dOptions(hidden, c_out, 1).groups(groups).bias(true)));
}

torch::Tensor TowerImpl::forward(const torch::Tensor& x) { return output(c1->forward(c0->forward(x))); }

torch::Tensor TowerImpl::output(const torch::Tensor& h) {
  if (conv1x1_gemm_applies(h)) return conv1x1_bias_gemm(h, out->weight, out->bias, out->options.groups());
  return out->forward(h);
}

void TowerImpl::forward_into(const torch::Tensor& x, const torch::Tensor& into) {
  const torch::Tensor h = c1->forward(c0->forward(x));
  if (!common::fold_allowed(h, {out_source()})) {
    into.copy_(output(h));
    return;
  }
  common::run_folded(out_fold_, {out_source()}, h, {1, 0, out->options.groups(), false}, {&into});
}

void TowerImpl::replace_output(torch::nn::Conv2d conv) {
  conv->to(out->weight.device(), out->weight.scalar_type());
  out = replace_module("2", conv);
  out_fold_.clear();
}

HeadImpl::HeadImpl(const std::array<int64_t, 3>& ch, int nc_, int64_t hc_) : nc(nc_), hc(hc_) {
  // Box hidden width: max(ceil((ch0 // 4) / 4) * 4, 4 * reg_max, reg_max).
  const int64_t hb =
      std::max({(ch[0] / 4 + 3) / 4 * 4, 4 * kRegMax, kRegMax});
  torch::nn::ModuleList cv2, cv3;
  for (int i = 0; i < 3; ++i) {
    box.emplace_back(ch[i], hb, 4 * kRegMax, 4);
    cv2->push_back(box.back());
  }
  for (int i = 0; i < 3; ++i) {
    cls.emplace_back(ch[i], hc, nc, 1);
    cv3->push_back(cls.back());
  }
  register_module("cv2", cv2);
  register_module("cv3", cv3);
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 3; ++i) {
    box[i]->out->bias.fill_(1.0);
    init_class_bias(i);
  }
}

// LibreYOLO's prior for a fresh head: every class logit at -10 (sigmoid about 4.5e-5) on every
// level, whatever the class count.
void HeadImpl::init_class_bias(int level) {
  torch::NoGradGuard no_grad;
  cls[level]->out->bias.fill_(-10.0);
}

std::vector<torch::Tensor> HeadImpl::forward(const std::array<torch::Tensor, 3>& feats) {
  std::vector<torch::Tensor> out;
  out.reserve(3);
  for (int i = 0; i < 3; ++i) {
    out.push_back(torch::cat({box[i]->forward(feats[i]), cls[i]->forward(feats[i])}, 1));
  }
  return out;
}

torch::Tensor HeadImpl::start_level(int i, const torch::Tensor& feat, common::Branches& branches) {
  const common::ChannelConcat cat(feat, *box[i]->c0, {box[i]->out->weight.size(0), cls[i]->out->weight.size(0)});
  // The towers read feat and write their slices: nothing else of theirs outlives them.
  branches.side([&, i] { box[i]->forward_into(feat, *cat.part(0)); });
  branches.side([&, i] { cls[i]->forward_into(feat, *cat.part(1)); });
  return cat.whole();
}

void HeadImpl::reset_num_classes(int new_nc) {
  if (new_nc < 1) throw UsageError(strfmt("number of classes must be >= 1, got %d", new_nc));
  if (new_nc == nc) return;
  nc = new_nc;
  for (int i = 0; i < 3; ++i) {
    cls[i]->replace_output(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(hc, nc, 1).bias(true)));
    init_class_bias(i);
  }
}

// ---------------------------------------------------------------------------------- model

Yolo9Model::Yolo9Model(const std::string& size, int nc, std::optional<int64_t> hc) : size_(size) {
  const SizeConfig& cfg = size_config(size);
  if (nc < 1) throw UsageError(strfmt("number of classes must be >= 1, got %d", nc));
  const int64_t hidden = hc ? *hc : class_hidden_width(size, nc);
  if (hidden < 1) {
    throw UsageError(strfmt("class hidden width must be >= 1, got %lld", static_cast<long long>(hidden)));
  }
  backbone_ = register_module("backbone", Backbone(cfg));
  neck_ = register_module("neck", Neck(cfg));
  head_ = register_module("head", Head(cfg.head_channels(), nc, hidden));
}

void Yolo9Model::check_input(const torch::Tensor& x) const {
  if (x.dim() != 4 || x.size(1) != 3) {
    throw UsageError("YOLOv9 expects an input of shape [B, 3, H, W], got " +
                     c10::str(x.sizes()));
  }
}

bool Yolo9Model::enable_aux(double weight) {
  if (!(weight > 0)) {
    if (aux_) {
      unregister_module("aux");
      unregister_module("aux_head");
      aux_ = nullptr;
      aux_head_ = nullptr;
      layers_.reset();
    }
    aux_weight_ = 0.0;
    return true;
  }
  aux_weight_ = weight;
  if (aux_) return true;
  const SizeConfig& cfg = size_config(size_);
  const auto& like = head_->cls[0]->out->weight;
  aux_ = register_module("aux", AuxNeck(cfg));
  aux_head_ = register_module("aux_head", Head(cfg.head_channels(), head_->nc, head_->hc));
  for (torch::nn::Module* m : {static_cast<torch::nn::Module*>(aux_.get()), static_cast<torch::nn::Module*>(aux_head_.get())}) {
    m->to(like.device(), like.scalar_type());
    m->train(is_training());
  }
  layers_.reset();  // its layer lists now miss the new blocks
  return true;
}

std::vector<torch::Tensor> Yolo9Model::forward_train(const torch::Tensor& x, const torch::Tensor& /*targets*/) {
  if (!aux_ || !is_training()) return forward_raw(x);
  check_input(x);
  return layers_.run_forward(x, [&] {
    torch::Tensor b5;
    const auto p = backbone_->forward(x, {}, &b5);
    auto maps = head_->forward(neck_->forward(p));
    const auto aux = aux_head_->forward(aux_->forward(p[0], p[1], b5));
    maps.insert(maps.end(), aux.begin(), aux.end());
    return maps;
  });
}

std::vector<torch::Tensor> Yolo9Model::forward_raw(const torch::Tensor& x) {
  check_input(x);
  if (is_training()) layers_.advance_bn_counters();
  if (common::ChannelConcat::applies(x)) {
    // Inference: the backbone's levels are written into the neck's concatenations
    // (NeckImpl::Concats); each level's head starts as soon as the neck has its input, on side
    // streams (common/branches.hpp) while the neck goes on; its map is assembled in place.
    std::vector<torch::Tensor> maps(3);
    {
      common::Branches branches(x);
      NeckImpl::Concats cats(*neck_);
      const auto place = [&](int level, const torch::Tensor& input, const ConvImpl& producer) {
        return cats.place(level, input, producer);
      };
      const auto start_head = [&](int i, const torch::Tensor& f) {
        maps[static_cast<size_t>(i)] = head_->start_level(i, f, branches);
      };
      neck_->forward(backbone_->forward(x, place), start_head, &cats);
    }  // joined
    return maps;
  }
  if (!is_training() || !torch::GradMode::is_enabled()) return head_->forward(neck_->forward(backbone_->forward(x)));
  auto casts = layers_.prepare_weight_casts(x);  // valid for this forward only
  return head_->forward(neck_->forward(backbone_->forward(x)));
}

void Yolo9Model::reset_num_classes(int nc) {
  head_->reset_num_classes(nc);
  if (aux_head_) aux_head_->reset_num_classes(nc);
}

std::vector<std::string> Yolo9Model::freeze_groups() const {
  return {"backbone.conv0", "backbone.conv1",   "backbone.elan1",   "backbone.down2",
          "backbone.elan2", "backbone.down3",   "backbone.elan3",   "backbone.down4",
          "backbone.elan4", "backbone.spp",     "neck.elan_up1",    "neck.elan_up2",
          "neck.down1",     "neck.elan_down1",  "neck.down2",       "neck.elan_down2",
          "head"};
}

ops::AnchorPoints Yolo9Model::anchor_points(const std::vector<torch::Tensor>& raw) {
  return grids_.get(raw, [](const LevelSizes& sizes, c10::Device device) {
    const std::vector<int64_t> strides(HeadImpl::kStrides.begin(), HeadImpl::kStrides.end());
    return ops::make_anchor_points(sizes, strides, kRegMax, device);
  });
}

torch::Tensor Yolo9Model::decode(const std::vector<torch::Tensor>& raw) {
  const int64_t nc = head_->nc, channels = 4 * kRegMax + nc;
  if (raw.size() != 3) {
    throw UsageError(strfmt("YOLOv9 decode expects 3 level maps, got %zu", raw.size()));
  }
  for (const auto& r : raw) {
    if (r.dim() != 4 || r.size(1) != channels || r.size(0) != raw[0].size(0)) {
      throw UsageError(strfmt("YOLOv9 decode expects maps [B, %lld, H, W], got ",
                              static_cast<long long>(channels)) +
                       c10::str(r.sizes()));
    }
  }
  // Boxes are computed in float32 even under autocast: bf16 cannot resolve pixel coordinates.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  if (auto y = ops::dfl_decode_kernel(raw, {HeadImpl::kStrides.begin(), HeadImpl::kStrides.end()}, kRegMax, nc);
      y.defined())
    return y;
  const auto dtype = raw[0].scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  const int64_t batch = raw[0].size(0);
  std::vector<torch::Tensor> flat;
  flat.reserve(3);
  for (const auto& r : raw) flat.push_back(r.reshape({batch, channels, -1}));
  auto x = torch::cat(flat, 2).to(dtype);  // [B, C, A], level-major, row-major inside a level
  const int64_t anchors = x.size(2);
  const auto box = ops::dfl_boxes(x.narrow(1, 0, 4 * kRegMax).view({batch, 4, kRegMax, anchors}), anchor_points(raw));
  return torch::cat({box, torch::sigmoid(x.narrow(1, 4 * kRegMax, nc))}, 1);
}

}  // namespace libreyolo::models::yolo9
