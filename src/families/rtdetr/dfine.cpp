#include "families/rtdetr/dfine.hpp"

#include <c10/util/irange.h>

#include <cmath>
#include <map>
#include <string>

#include "core/log.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::models::rtdetr {

namespace F = torch::nn::functional;

namespace {

torch::nn::LayerNorm layer_norm(int64_t c) { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c}).eps(1e-5)); }

// HGNetv2 B0 and B2 (the B4 and B5 of sizes l and x are RT-DETR's l and x backbones).
HgNetSpec hgnet_b0() {
  // clang-format off
  HgNetSpec h{16, 16, {{
    // mid  out   blocks downsample light  kernel layers
    {16,   64,   1,     false,     false, 3,     3},
    {32,   256,  1,     true,      false, 3,     3},
    {64,   512,  2,     true,      true,  5,     3},
    {128,  1024, 1,     true,      true,  5,     3},
  }}};
  // clang-format on
  return h;
}

HgNetSpec hgnet_b2() {
  // clang-format off
  HgNetSpec h{24, 32, {{
    {32,   96,   1,     false,     false, 3,     4},
    {64,   384,  1,     true,      false, 3,     4},
    {128,  768,  3,     true,      true,  5,     4},
    {256,  1536, 1,     true,      true,  5,     4},
  }}};
  // clang-format on
  return h;
}

bool has(const io::StateDict& sd, const std::string& key) {
  for (const auto& kv : sd)
    if (kv.first == key) return true;
  return false;
}

const torch::Tensor* find(const io::StateDict& sd, const std::string& key) {
  for (const auto& kv : sd)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

std::optional<int64_t> dim(const io::StateDict& sd, const std::string& key, int64_t d = 0) {
  const auto* t = find(sd, key);
  if (!t || t->dim() <= d) return std::nullopt;
  return t->size(d);
}

// Indices i with prefix + i + suffix present, counted from 0 without gaps.
int count(const io::StateDict& sd, const std::string& prefix, const std::string& suffix) {
  int n = 0;
  while (has(sd, prefix + std::to_string(n) + suffix)) ++n;
  return n;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Configuration

std::vector<int64_t> DfineConfig::strides() const {
  return levels == 2 ? std::vector<int64_t>{16, 32} : std::vector<int64_t>{8, 16, 32};
}

bool DfineConfig::operator==(const DfineConfig& o) const {
  return size == o.size && hgnet == o.hgnet && frozen_norm == o.frozen_norm && levels == o.levels &&
         hidden == o.hidden && enc_ffn == o.enc_ffn && elan_hidden == o.elan_hidden && elan_depth == o.elan_depth &&
         dec_hidden == o.dec_hidden && dec_ffn == o.dec_ffn && dec_layers == o.dec_layers && eval_idx == o.eval_idx &&
         points == o.points && reg_scale == o.reg_scale && reg_max == o.reg_max && heads == o.heads &&
         queries == o.queries && denoising == o.denoising && nc == o.nc && anchor_size == o.anchor_size &&
         silu == o.silu;
}

namespace {

// The smallest multiple of 32 whose encoder positions hold the queries.
int64_t min_input_side(const DfineConfig& cfg) {
  for (int64_t side = 32;; side += 32) {
    int64_t positions = 0;
    for (const int64_t stride : cfg.strides()) positions += (side / stride) * (side / stride);
    if (positions >= cfg.queries) return side;
  }
}

}  // namespace

const std::vector<std::string>& dfine_size_names() {
  static const std::vector<std::string> names{"n", "s", "m", "l", "x"};
  return names;
}

DfineConfig dfine_size_config(const std::string& size, int nc) {
  DfineConfig c;
  c.size = size;
  c.nc = nc;
  // elan_hidden = round(expansion * hidden // 2), elan_depth = round(3 * depth_mult) (half to
  // even) for expansions 0.34 / 0.5 / 1 / 1 / 1 and depth multipliers 0.5 / 0.34 / 0.67 / 1 / 1.
  if (size == "n") {
    c.hgnet = hgnet_b0();
    c.hgnet.lab = true;
    c.levels = 2;
    c.hidden = 128;
    c.enc_ffn = 512;
    c.elan_hidden = 21;
    c.elan_depth = 2;
    c.dec_hidden = 128;
    c.dec_ffn = 512;
    c.dec_layers = 3;
    c.points = {6, 6};
  } else if (size == "s") {
    c.hgnet = hgnet_b0();
    c.hgnet.lab = true;
    c.elan_hidden = 64;
    c.elan_depth = 1;
    c.dec_layers = 3;
  } else if (size == "m") {
    c.hgnet = hgnet_b2();
    c.hgnet.lab = true;
    c.elan_hidden = 128;
    c.elan_depth = 2;
    c.dec_layers = 4;
  } else if (size == "l") {
    c.hgnet = hgnetv2_l();
    c.frozen_norm = true;
    c.elan_hidden = 128;
    c.elan_depth = 3;
    c.dec_layers = 6;
  } else if (size == "x") {
    c.hgnet = hgnetv2_x();
    c.frozen_norm = true;
    c.hidden = 384;
    c.enc_ffn = 2048;
    c.elan_hidden = 192;
    c.elan_depth = 3;
    c.dec_layers = 6;
    c.reg_scale = 8.0;
  } else {
    throw UsageError("unknown D-FINE size '" + size + "' (sizes: n, s, m, l, x)");
  }
  c.hgnet.dfine_names = true;
  c.hgnet.kaiming_init = false;
  return c;
}

bool is_dfine_state_dict(const io::StateDict& sd) {
  for (const auto& kv : sd)
    if (kv.first.rfind("decoder.pre_bbox_head.", 0) == 0) return true;
  return false;
}

std::optional<DfineConfig> dfine_config_from_state_dict(const io::StateDict& sd) {
  DfineConfig c;
  const auto h = hgnet_from_state_dict(sd);
  if (!h) return std::nullopt;
  c.hgnet = *h;
  c.hgnet.lab = has(sd, "backbone.stem.stem1.lab.scale");
  c.hgnet.dfine_names = true;
  c.hgnet.kaiming_init = false;
  c.frozen_norm = !has(sd, "backbone.stem.stem1.bn.num_batches_tracked");
  c.levels = count(sd, "encoder.input_proj.", ".conv.weight");
  if (c.levels != 2 && c.levels != 3) return std::nullopt;
  const auto hidden = dim(sd, "encoder.lateral_convs.0.conv.weight"),
             ffn = dim(sd, "encoder.encoder.0.layers.0.linear1.weight"),
             elan = dim(sd, "encoder.fpn_blocks.0.cv2.1.conv.weight"),
             dec_hidden = dim(sd, "decoder.query_pos_head.layers.1.weight"),
             dec_ffn = dim(sd, "decoder.decoder.layers.0.linear1.weight"),
             nc = dim(sd, "decoder.dec_score_head.0.bias"),
             corners = dim(sd, "decoder.dec_bbox_head.0.layers.2.bias");
  const auto* scale = find(sd, "decoder.decoder.layers.0.cross_attn.num_points_scale");
  const auto* reg_scale = find(sd, "decoder.reg_scale");
  if (!hidden || !ffn || !elan || !dec_hidden || !dec_ffn || !nc || !corners || !scale || !reg_scale)
    return std::nullopt;
  c.hidden = *hidden;
  c.enc_ffn = *ffn;
  c.elan_hidden = *elan;
  c.elan_depth = count(sd, "encoder.fpn_blocks.0.cv2.0.bottlenecks.", ".conv1.conv.weight");
  c.dec_hidden = *dec_hidden;
  c.dec_ffn = *dec_ffn;
  c.dec_layers = count(sd, "decoder.decoder.layers.", ".norm1.weight");
  c.nc = static_cast<int>(*nc);
  c.reg_max = static_cast<int>(*corners / 4 - 1);
  c.reg_scale = reg_scale->to(torch::kDouble).item<double>();
  c.denoising = has(sd, "decoder.denoising_class_embed.weight") ? 100 : 0;
  // The points of each level: num_points_scale holds 1/n for each of a level's n points.
  c.points.clear();
  const auto s = scale->to(torch::kDouble);
  for (int64_t i = 0; i < s.numel();) {
    const int64_t n = std::llround(1.0 / s[i].item<double>());
    if (n < 1) return std::nullopt;
    c.points.push_back(n);
    i += n;
  }
  if (static_cast<int>(c.points.size()) != c.levels) return std::nullopt;
  // The anchors' input side from the buffer's token count.
  c.anchor_size = 0;
  if (const auto* a = find(sd, "decoder.anchors")) {
    int64_t per_side2 = 0;  // tokens of a 32 x 32 input
    for (const int64_t st : c.strides()) per_side2 += (32 / st) * (32 / st);
    const double k = std::sqrt(static_cast<double>(a->size(1)) / static_cast<double>(per_side2));
    c.anchor_size = std::llround(k) * 32;
  }
  c.size.clear();
  for (const auto& name : dfine_size_names()) {
    auto probe = dfine_size_config(name, c.nc);
    probe.frozen_norm = c.frozen_norm;
    probe.denoising = c.denoising;
    probe.anchor_size = c.anchor_size;
    probe.size.clear();
    if (probe == c) c.size = name;
  }
  return c;
}

// ---------------------------------------------------------------------------------------------
// FDR

torch::Tensor weighting_function(int reg_max, const torch::Tensor& up, const torch::Tensor& reg_scale) {
  const auto bound1 = up[0].abs() * reg_scale.abs();
  const auto bound2 = up[0].abs() * reg_scale.abs() * 2;
  const auto step = torch::pow(bound1 + 1, 2.0 / static_cast<double>(reg_max - 2));
  std::vector<torch::Tensor> values{-bound2};
  for (int i = reg_max / 2 - 1; i >= 1; --i) values.push_back(-torch::pow(step, static_cast<int64_t>(i)) + 1);
  values.push_back(torch::zeros_like(up[0].unsqueeze(0)));
  for (int i = 1; i < reg_max / 2; ++i) values.push_back(torch::pow(step, static_cast<int64_t>(i)) - 1);
  values.push_back(bound2);
  return torch::cat(values, 0);
}

torch::Tensor fdr_integral(const torch::Tensor& corners, const torch::Tensor& project, int reg_max) {
  auto shape = corners.sizes().vec();
  const auto p = torch::softmax(corners.reshape({-1, reg_max + 1}), 1);
  shape.back() = 4;
  return torch::linear(p, project.to(p.device())).reshape(shape);
}

torch::Tensor distance_to_box(const torch::Tensor& points, const torch::Tensor& distance,
                              const torch::Tensor& reg_scale) {
  const auto rs = reg_scale.abs();
  const auto px = points.select(-1, 0), py = points.select(-1, 1), pw = points.select(-1, 2),
             ph = points.select(-1, 3);
  const auto x1 = px - (0.5 * rs + distance.select(-1, 0)) * (pw / rs);
  const auto y1 = py - (0.5 * rs + distance.select(-1, 1)) * (ph / rs);
  const auto x2 = px + (0.5 * rs + distance.select(-1, 2)) * (pw / rs);
  const auto y2 = py + (0.5 * rs + distance.select(-1, 3)) * (ph / rs);
  return torch::stack({(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1}, -1);
}

// ---------------------------------------------------------------------------------------------
// Encoder

RepNCSPELAN4Impl::RepNCSPELAN4Impl(int64_t c1, int64_t c2, int64_t c3, int64_t c4, int depth) : half(c3 / 2) {
  cv1 = register_module("cv1", ConvNorm(c1, c3, 1, 1, Act::SiLU));
  auto two = container(), three = container();
  csp2 = two->register_module("0", CSPRepLayer(c3 / 2, c4, c4, depth));
  conv2 = two->register_module("1", ConvNorm(c4, c4, 3, 1, Act::SiLU));
  csp3 = three->register_module("0", CSPRepLayer(c4, c4, c4, depth));
  conv3 = three->register_module("1", ConvNorm(c4, c4, 3, 1, Act::SiLU));
  register_module("cv2", two);
  register_module("cv3", three);
  cv4 = register_module("cv4", ConvNorm(c3 + 2 * c4, c2, 1, 1, Act::SiLU));
}

torch::Tensor RepNCSPELAN4Impl::forward(const torch::Tensor& x) {
  const auto y = cv1->forward(x);
  const auto a = y.narrow(1, 0, half), b = y.narrow(1, half, half);
  const auto c = conv2->forward(csp2->forward(b));
  const auto d = conv3->forward(csp3->forward(c));
  return cv4->forward(torch::cat({a, b, c, d}, 1));
}

SCDownImpl::SCDownImpl(int64_t c1, int64_t c2, int64_t k, int64_t s) {
  cv1 = register_module("cv1", ConvNorm(c1, c2, 1, 1, Act::None));
  cv2 = register_module("cv2", ConvNorm(c2, c2, k, s, Act::None, false, /*groups=*/c2));
}

torch::Tensor SCDownImpl::forward(const torch::Tensor& x) { return cv2->forward(cv1->forward(x)); }

DfineEncoderImpl::DfineEncoderImpl(const DfineConfig& cfg) : hidden(cfg.hidden) {
  const auto& hg = cfg.hgnet;
  auto proj = container();
  for (int i = 0; i < cfg.levels; ++i) {
    const int64_t cin = hg.stages[static_cast<size_t>(4 - cfg.levels + i)].out;
    input_proj.push_back(proj->register_module(std::to_string(i), ConvNorm(cin, hidden, 1, 1, Act::None)));
  }
  register_module("input_proj", proj);
  auto enc = container(), enc0 = container(), enc_layers = container();
  aifi = enc_layers->register_module("0", EncoderLayer(hidden, cfg.heads, cfg.enc_ffn));
  enc0->register_module("layers", enc_layers);
  enc->register_module("0", enc0);
  register_module("encoder", enc);
  auto lat = container(), fpn = container(), down = container(), pan = container();
  for (int i = 0; i + 1 < cfg.levels; ++i) {
    const auto n = std::to_string(i);
    lateral_convs.push_back(lat->register_module(n, ConvNorm(hidden, hidden, 1, 1, Act::None)));
    fpn_blocks.push_back(
        fpn->register_module(n, RepNCSPELAN4(2 * hidden, hidden, 2 * hidden, cfg.elan_hidden, cfg.elan_depth)));
  }
  for (int i = 0; i + 1 < cfg.levels; ++i) {
    const auto n = std::to_string(i);
    auto seq = container();
    downsample_convs.push_back(seq->register_module("0", SCDown(hidden, hidden, 3, 2)));
    down->register_module(n, seq);
    pan_blocks.push_back(
        pan->register_module(n, RepNCSPELAN4(2 * hidden, hidden, 2 * hidden, cfg.elan_hidden, cfg.elan_depth)));
  }
  register_module("lateral_convs", lat);
  register_module("fpn_blocks", fpn);
  register_module("downsample_convs", down);
  register_module("pan_blocks", pan);
}

std::vector<torch::Tensor> DfineEncoderImpl::forward(const std::vector<torch::Tensor>& feats) {
  const size_t levels = input_proj.size();
  TORCH_CHECK(feats.size() == levels, "D-FINE encoder: ", feats.size(), " levels for ", levels);
  std::vector<torch::Tensor> proj;
  for (size_t i = 0; i < levels; ++i) proj.push_back(input_proj[i]->forward(feats[i]));
  {
    auto& top = proj.back();
    const int64_t h = top.size(2), w = top.size(3);
    const auto src = top.flatten(2).permute({0, 2, 1});
    const auto pos = sincos_position_embedding(h, w, hidden, src.device()).to(src.scalar_type());
    top = aifi->forward(src, pos).permute({0, 2, 1}).reshape({-1, hidden, h, w}).contiguous();
  }
  std::vector<torch::Tensor> inner{proj.back()};
  for (size_t idx = levels - 1; idx >= 1; --idx) {
    const size_t j = levels - 1 - idx;
    const auto high = lateral_convs[j]->forward(inner.front());
    inner.front() = high;
    const auto upsampled = F::interpolate(
        high, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest));
    inner.insert(inner.begin(), fpn_blocks[j]->forward(torch::cat({upsampled, proj[idx - 1]}, 1)));
  }
  std::vector<torch::Tensor> outs{inner.front()};
  for (size_t idx = 0; idx + 1 < levels; ++idx) {
    const auto down = downsample_convs[idx]->forward(outs.back());
    outs.push_back(pan_blocks[idx]->forward(torch::cat({down, inner[idx + 1]}, 1)));
  }
  return outs;
}

// ---------------------------------------------------------------------------------------------
// Decoder

DfineDeformableAttentionImpl::DfineDeformableAttentionImpl(int64_t embed_, int64_t heads_, std::vector<int64_t> points_)
    : embed(embed_), heads(heads_), total_points(0), points(std::move(points_)) {
  TORCH_CHECK(embed % heads == 0, "deformable attention width ", embed, " is not a multiple of ", heads, " heads");
  std::vector<float> scale;
  for (const int64_t n : points) {
    TORCH_CHECK(n > 0, "deformable attention: ", n, " sampling points on a level");
    total_points += n;
    scale.insert(scale.end(), static_cast<size_t>(n), 1.0f / static_cast<float>(n));
  }
  num_points_scale = register_buffer("num_points_scale", torch::tensor(scale, torch::kFloat));
  sampling_offsets = register_module("sampling_offsets", torch::nn::Linear(embed, heads * total_points * 2));
  attention_weights = register_module("attention_weights", torch::nn::Linear(embed, heads * total_points));
  reset_parameters();
}

void DfineDeformableAttentionImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  sampling_offsets->weight.zero_();
  const auto theta = torch::arange(heads, torch::kFloat) * (2.0 * M_PI / static_cast<double>(heads));
  auto dir = torch::stack({theta.cos(), theta.sin()}, -1);
  dir = dir / std::get<0>(dir.abs().max(-1, /*keepdim=*/true));
  std::vector<torch::Tensor> index;
  for (const int64_t n : points) index.push_back(torch::arange(1, n + 1, torch::kFloat));
  auto grid = dir.reshape({heads, 1, 2}).repeat({1, total_points, 1}) * torch::cat(index).reshape({1, -1, 1});
  sampling_offsets->bias.copy_(grid.flatten());
  attention_weights->weight.zero_();
  attention_weights->bias.zero_();
}

torch::Tensor DfineDeformableAttentionImpl::forward(const torch::Tensor& query, const torch::Tensor& ref,
                                                    const torch::Tensor& value, const LevelShapes& shapes) {
  const int64_t b = query.size(0), q = query.size(1), t = value.size(1);
  const auto v = value.reshape({b, t, heads, embed / heads});
  const auto off = sampling_offsets->forward(query).reshape({b, q, heads, total_points, 2});
  const auto aw = torch::softmax(attention_weights->forward(query).reshape({b, q, heads, total_points}), -1);
  const auto r = ref.reshape({b, q, 1, 1, 4});
  const auto scaled = off * num_points_scale.to(query.scalar_type()).unsqueeze(-1) * r.narrow(-1, 2, 2) * 0.5;
  const auto loc = r.narrow(-1, 0, 2) + scaled;
  return deformable_attention_core(v, shapes, loc, aw, points, Sampling::Bilinear);
}

GateImpl::GateImpl(int64_t c) {
  gate = register_module("gate", torch::nn::Linear(2 * c, 2 * c));
  norm = register_module("norm", layer_norm(c));
  torch::NoGradGuard no_grad;
  gate->bias.fill_(bias_with_prior(0.5));
  gate->weight.zero_();
}

torch::Tensor GateImpl::forward(const torch::Tensor& x1, const torch::Tensor& x2) {
  const auto g = torch::sigmoid(gate->forward(torch::cat({x1, x2}, -1)));
  const int64_t c = x1.size(-1);
  return norm->forward(g.narrow(-1, 0, c) * x1 + g.narrow(-1, c, c) * x2);
}

DfineDecoderLayerImpl::DfineDecoderLayerImpl(const DfineConfig& cfg) : silu(cfg.silu) {
  const int64_t c = cfg.dec_hidden;
  self_attn = register_module("self_attn", MultiheadAttention(c, cfg.heads));
  norm1 = register_module("norm1", layer_norm(c));
  cross_attn = register_module("cross_attn", DfineDeformableAttention(c, cfg.heads, cfg.points));
  gateway = register_module("gateway", Gate(c));
  linear1 = register_module("linear1", torch::nn::Linear(c, cfg.dec_ffn));
  linear2 = register_module("linear2", torch::nn::Linear(cfg.dec_ffn, c));
  norm3 = register_module("norm3", layer_norm(c));
  torch::NoGradGuard no_grad;
  torch::nn::init::xavier_uniform_(linear1->weight);
  torch::nn::init::xavier_uniform_(linear2->weight);
}

torch::Tensor DfineDecoderLayerImpl::forward(const torch::Tensor& tgt, const torch::Tensor& ref,
                                             const torch::Tensor& memory, const LevelShapes& shapes,
                                             const torch::Tensor& pos, const torch::Tensor& attn_mask) {
  const auto qk = tgt + pos;
  auto x = norm1->forward(tgt + self_attn->forward(qk, qk, tgt, attn_mask));
  x = gateway->forward(x, cross_attn->forward(x + pos, ref, memory, shapes));
  const auto h = linear1->forward(x);
  const auto y = x + linear2->forward(silu ? torch::silu(h) : torch::relu(h));
  return norm3->forward(y.clamp(-65504.0, 65504.0));
}

LqeImpl::LqeImpl(int reg_max_, bool silu) : reg_max(reg_max_) {
  reg_conf = register_module("reg_conf", Mlp(4 * (4 + 1), 64, 1, 2, silu));
  torch::NoGradGuard no_grad;
  reg_conf->layers.back()->weight.zero_();
  reg_conf->layers.back()->bias.zero_();
}

torch::Tensor LqeImpl::forward(const torch::Tensor& scores, const torch::Tensor& corners) {
  const int64_t b = corners.size(0), l = corners.size(1);
  const auto prob = torch::softmax(corners.reshape({b, l, 4, reg_max + 1}), -1);
  const auto top = std::get<0>(prob.topk(4, -1));
  const auto stat = torch::cat({top, top.mean(-1, /*keepdim=*/true)}, -1);
  return scores + reg_conf->forward(stat.reshape({b, l, -1}));
}

DfineTransformerImpl::DfineTransformerImpl(const DfineConfig& cfg_) : cfg(cfg_) {
  const int64_t c = cfg.dec_hidden;
  up = register_parameter("up", torch::full({1}, 0.5), /*requires_grad=*/false);
  reg_scale = register_parameter("reg_scale", torch::full({1}, cfg.reg_scale), /*requires_grad=*/false);
  if (cfg.anchor_size > 0) {
    LevelShapes shapes;
    for (const int64_t stride : cfg.strides()) {
      if (cfg.anchor_size % stride != 0)
        throw UsageError(strfmt("D-FINE: anchors for an input of %lld, not a multiple of %lld",
                                static_cast<long long>(cfg.anchor_size), static_cast<long long>(stride)));
      shapes.push_back({cfg.anchor_size / stride, cfg.anchor_size / stride});
    }
    auto [a, v] = make_anchors(shapes, torch::kCPU, 1e4);
    anchors = register_buffer("anchors", a);
    valid_mask = register_buffer("valid_mask", v);
  }
  auto proj = container();
  for (int i = 0; i < cfg.levels; ++i) {
    if (cfg.hidden == c) {
      input_proj.push_back(ConvNorm{nullptr});
    } else {
      input_proj.push_back(proj->register_module(std::to_string(i), ConvNorm(cfg.hidden, c, 1, 1, Act::None)));
    }
  }
  register_module("input_proj", proj);
  auto decoder = container(), list = container(), lqe = container();
  decoder->register_parameter("up", up, /*requires_grad=*/false);
  decoder->register_parameter("reg_scale", reg_scale, /*requires_grad=*/false);
  for (int l = 0; l < cfg.dec_layers; ++l) {
    layers.push_back(list->register_module(std::to_string(l), DfineDecoderLayer(cfg)));
    lqe_layers.push_back(lqe->register_module(std::to_string(l), Lqe(cfg.reg_max, cfg.silu)));
  }
  decoder->register_module("layers", list);
  decoder->register_module("lqe_layers", lqe);
  register_module("decoder", decoder);
  if (cfg.denoising > 0)
    denoising_class_embed = register_module(
        "denoising_class_embed", torch::nn::Embedding(torch::nn::EmbeddingOptions(cfg.nc + 1, c).padding_idx(cfg.nc)));
  query_pos_head = register_module("query_pos_head", Mlp(4, 2 * c, c, 2, cfg.silu));
  auto enc_output = container();
  enc_proj = enc_output->register_module("proj", torch::nn::Linear(c, c));
  enc_norm = enc_output->register_module("norm", layer_norm(c));
  register_module("enc_output", enc_output);
  enc_score_head = register_module("enc_score_head", torch::nn::Linear(c, cfg.nc));
  enc_bbox_head = register_module("enc_bbox_head", Mlp(c, c, 4, 3, cfg.silu));
  score_heads_ = container();
  for (int l = 0; l < cfg.dec_layers; ++l)
    dec_score_head.push_back(score_heads_->register_module(std::to_string(l), torch::nn::Linear(c, cfg.nc)));
  register_module("dec_score_head", score_heads_);
  pre_bbox_head = register_module("pre_bbox_head", Mlp(c, c, 4, 3, cfg.silu));
  auto box_heads = container();
  for (int l = 0; l < cfg.dec_layers; ++l)
    dec_bbox_head.push_back(box_heads->register_module(std::to_string(l), Mlp(c, c, 4 * (cfg.reg_max + 1), 3, cfg.silu)));
  register_module("dec_bbox_head", box_heads);
  reset_parameters();
}

void DfineTransformerImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  const double prior = bias_with_prior(0.01);
  enc_score_head->bias.fill_(prior);
  for (auto* m : {&enc_bbox_head, &pre_bbox_head}) {
    (*m)->layers.back()->weight.zero_();
    (*m)->layers.back()->bias.zero_();
  }
  for (size_t l = 0; l < dec_score_head.size(); ++l) {
    dec_score_head[l]->bias.fill_(prior);
    dec_bbox_head[l]->layers.back()->weight.zero_();
    dec_bbox_head[l]->layers.back()->bias.zero_();
  }
  torch::nn::init::xavier_uniform_(enc_proj->weight);
  torch::nn::init::xavier_uniform_(query_pos_head->layers[0]->weight);
  torch::nn::init::xavier_uniform_(query_pos_head->layers[1]->weight);
  for (auto& p : input_proj)
    if (p) torch::nn::init::xavier_uniform_(p->conv->weight);
  if (denoising_class_embed) {
    auto w = denoising_class_embed->weight;
    w.narrow(0, 0, w.size(0) - 1).normal_();
    w[w.size(0) - 1].zero_();
  }
}

void DfineTransformerImpl::reset_num_classes(int nc) {
  const int64_t c = cfg.dec_hidden;
  cfg.nc = nc;
  enc_score_head = replace_module("enc_score_head", torch::nn::Linear(c, nc));
  for (size_t l = 0; l < dec_score_head.size(); ++l)
    dec_score_head[l] = score_heads_->replace_module(std::to_string(l), torch::nn::Linear(c, nc));
  if (denoising_class_embed)
    denoising_class_embed = replace_module(
        "denoising_class_embed", torch::nn::Embedding(torch::nn::EmbeddingOptions(nc + 1, c).padding_idx(nc)));
  torch::NoGradGuard no_grad;
  const double prior = bias_with_prior(0.01);
  enc_score_head->bias.fill_(prior);
  for (auto& h : dec_score_head) h->bias.fill_(prior);
  if (denoising_class_embed) {
    auto w = denoising_class_embed->weight;
    w.narrow(0, 0, nc).normal_();
    w[nc].zero_();
  }
}

std::pair<torch::Tensor, LevelShapes> DfineTransformerImpl::encoder_memory(const std::vector<torch::Tensor>& feats) {
  TORCH_CHECK(feats.size() == input_proj.size(), "D-FINE decoder: ", feats.size(), " levels for ",
              input_proj.size());
  std::vector<torch::Tensor> flat;
  LevelShapes shapes;
  for (size_t i = 0; i < feats.size(); ++i) {
    const auto p = input_proj[i] ? input_proj[i]->forward(feats[i]) : feats[i];
    shapes.push_back({p.size(2), p.size(3)});
    flat.push_back(p.flatten(2).permute({0, 2, 1}));
  }
  return {torch::cat(flat, 1), shapes};
}

QuerySelection DfineTransformerImpl::select_queries(const torch::Tensor& memory, const LevelShapes& shapes) {
  QuerySelection s;
  bool stored = anchors.defined() && !is_training();
  if (stored) {
    int64_t tokens = 0;
    for (const auto& hw : shapes) tokens += hw[0] * hw[1];
    stored = anchors.size(1) == tokens && shapes.front()[0] * cfg.strides().front() == cfg.anchor_size &&
             shapes.front()[1] * cfg.strides().front() == cfg.anchor_size;
  }
  if (stored) {
    s.anchors = anchors.to(memory.device(), memory.scalar_type());
    s.valid = valid_mask.to(memory.device());
  } else {
    std::tie(s.anchors, s.valid) = make_anchors(shapes, memory.device(), 1e4);
    s.anchors = s.anchors.to(memory.scalar_type());
  }
  const int64_t b = memory.size(0);
  if (memory.size(1) < cfg.queries)
    throw UsageError(strfmt("D-FINE: the input gives %lld encoder positions, fewer than its %d queries; use a larger "
                            "imgsz (at least %lld for this network)",
                            static_cast<long long>(memory.size(1)), cfg.queries,
                            static_cast<long long>(min_input_side(cfg))));
  const auto masked = s.valid.to(memory.scalar_type()) * memory;
  const auto out_memory = enc_norm->forward(enc_proj->forward(masked));
  s.enc_logits = enc_score_head->forward(out_memory);
  s.topk_ind = forced_topk_ind.defined()
                   ? forced_topk_ind.to(s.enc_logits.device())
                   : std::get<1>(torch::topk(std::get<0>(s.enc_logits.max(-1)), cfg.queries, -1));
  const auto gather = [&](const torch::Tensor& t) {
    return t.gather(1, s.topk_ind.unsqueeze(-1).expand({-1, -1, t.size(-1)}));
  };
  const auto topk_memory = gather(out_memory);
  const auto topk_anchors = gather(s.anchors.expand({b, -1, -1}));
  s.enc_delta = enc_bbox_head->forward(topk_memory);
  s.ref_unact = s.enc_delta + topk_anchors;
  s.topk_logits = gather(s.enc_logits);
  s.target = topk_memory.detach();
  return s;
}

DfineDecoderOutputs DfineTransformerImpl::decode(const torch::Tensor& target, const torch::Tensor& ref_unact,
                                                 const torch::Tensor& memory, const LevelShapes& shapes,
                                                 const torch::Tensor& attn_mask) {
  DfineDecoderOutputs out;
  const auto project = weighting_function(cfg.reg_max, up, reg_scale);
  const int last = cfg.last_layer();
  const bool every = is_training();
  auto output = target;
  torch::Tensor output_detach, corners_undetach, ref_initial;
  auto ref_detach = torch::sigmoid(ref_unact);
  for (int i = 0; i < static_cast<int>(layers.size()); ++i) {
    const auto pos = query_pos_head->forward(ref_detach).clamp(-10.0, 10.0);
    output = layers[static_cast<size_t>(i)]->forward(output, ref_detach.unsqueeze(2), memory, shapes, pos, attn_mask);
    if (i == 0) {
      out.pre_boxes = torch::sigmoid(pre_bbox_head->forward(output) + inverse_sigmoid(ref_detach));
      out.pre_logits = dec_score_head[0]->forward(output);
      ref_initial = out.pre_boxes.detach();
    }
    auto corners = dec_bbox_head[static_cast<size_t>(i)]->forward(output_detach.defined() ? output + output_detach
                                                                                          : output);
    if (corners_undetach.defined()) corners = corners + corners_undetach;
    const auto box = distance_to_box(ref_initial, fdr_integral(corners, project, cfg.reg_max), reg_scale);
    if (every || i == last) {
      const auto scores = lqe_layers[static_cast<size_t>(i)]->forward(
          dec_score_head[static_cast<size_t>(i)]->forward(output), corners);
      out.logits.push_back(scores);
      out.boxes.push_back(box);
      out.corners.push_back(corners);
      out.refs.push_back(ref_initial);
      if (!every) break;
    }
    corners_undetach = corners;
    ref_detach = box.detach();
    output_detach = output.detach();
  }
  return out;
}

std::pair<torch::Tensor, torch::Tensor> DfineTransformerImpl::forward(const std::vector<torch::Tensor>& feats,
                                                                      QuerySelection* selection) {
  const auto [memory, shapes] = encoder_memory(feats);
  auto s = select_queries(memory, shapes);
  const auto out = decode(s.target, s.ref_unact.detach(), memory, shapes);
  if (selection) *selection = std::move(s);
  return {out.logits.back(), out.boxes.back()};
}

// ---------------------------------------------------------------------------------------------
// Model

int64_t DfineModel::min_input_size() const { return min_input_side(cfg_); }

DfineModel::DfineModel(const DfineConfig& cfg) : cfg_(cfg) {
  if (cfg_.levels != 2 && cfg_.levels != 3) throw UsageError("D-FINE works on 2 or 3 levels");
  if (static_cast<int>(cfg_.points.size()) != cfg_.levels)
    throw UsageError("D-FINE: one sampling-point count per level is needed");
  dn_options_.count = cfg_.denoising;
  backbone = register_module("backbone", HGNetv2(cfg_.hgnet, cfg_.frozen_norm));
  encoder = register_module("encoder", DfineEncoder(cfg_));
  decoder = register_module("decoder", DfineTransformer(cfg_));
}

std::vector<torch::Tensor> DfineModel::backbone_forward(const torch::Tensor& x) {
  return backbone->forward_from(x, 4 - cfg_.levels);
}

DfineEvalTrace DfineModel::forward_trace(const torch::Tensor& x) {
  DfineEvalTrace t;
  t.backbone = backbone_forward(x);
  t.encoder = encoder->forward(t.backbone);
  std::tie(t.pred_logits, t.pred_boxes) = decoder->forward(t.encoder, &t.selection);
  return t;
}

std::vector<torch::Tensor> DfineModel::forward_raw(const torch::Tensor& x) {
  if (x.dim() != 4 || x.size(1) != 3) throw UsageError("D-FINE expects images [B, 3, H, W], got " + c10::str(x.sizes()));
  if (is_training()) {
    auto t = forward_train_outputs(x);
    return {t.matching.logits.back(), t.matching.boxes.back(), torch::tensor({x.size(2), x.size(3)}, torch::kLong)};
  }
  const auto [logits, boxes] = decoder->forward(encoder->forward(backbone_forward(x)));
  return {logits, boxes, torch::tensor({x.size(2), x.size(3)}, torch::kLong)};
}

torch::Tensor DfineModel::decode(const std::vector<torch::Tensor>& raw) {
  if (raw.size() != 3) throw UsageError("D-FINE decode takes {pred_logits, pred_boxes, input size}");
  const auto& boxes = raw[1];
  const double h = static_cast<double>(raw[2][0].item<int64_t>()), w = static_cast<double>(raw[2][1].item<int64_t>());
  const auto cx = boxes.select(2, 0), cy = boxes.select(2, 1);
  const auto hw = 0.5 * boxes.select(2, 2).clamp_min(0.0), hh = 0.5 * boxes.select(2, 3).clamp_min(0.0);
  const auto xyxy = torch::stack({(cx - hw) * w, (cy - hh) * h, (cx + hw) * w, (cy + hh) * h}, 1);  // [B, 4, Q]
  return torch::cat({xyxy, torch::sigmoid(raw[0]).transpose(1, 2).to(xyxy.scalar_type())}, 1);
}

DfineTrainOutputs DfineModel::forward_train_outputs(const torch::Tensor& x, const std::vector<ImageTargets>& gts) {
  if (!is_training()) throw UsageError("D-FINE: the training outputs need the model in training mode");
  return decoder_train_outputs(encoder->forward(backbone_forward(x)), gts);
}

DfineTrainOutputs DfineModel::decoder_train_outputs(const std::vector<torch::Tensor>& encoded,
                                                    const std::vector<ImageTargets>& gts) {
  DfineTrainOutputs t;
  const auto [memory, shapes] = decoder->encoder_memory(encoded);
  const auto s = decoder->select_queries(memory, shapes);
  auto target = s.target, ref_unact = s.ref_unact.detach();
  torch::Tensor mask;
  t.denoising = denoising_group(gts);
  if (t.denoising) {
    const auto& dn = *t.denoising;
    const auto embed = decoder->denoising_class_embed->forward(dn.labels.to(target.device()));
    target = torch::cat({embed.to(target.scalar_type()), target}, 1);
    ref_unact = torch::cat({dn.box_unact.to(ref_unact.device(), ref_unact.scalar_type()), ref_unact}, 1);
    mask = dn.attn_mask.to(target.device());
  }
  const auto out = decoder->decode(target, ref_unact, memory, shapes, mask);
  const int64_t n = t.denoising ? t.denoising->queries : 0, q = s.target.size(1);
  const auto split = [&](const torch::Tensor& v, DfineDecoderOutputs& dst, std::vector<torch::Tensor> DfineDecoderOutputs::*field) {
    (dst.*field).push_back(v.narrow(1, n, q));
    if (n > 0) (t.dn.*field).push_back(v.narrow(1, 0, n));
  };
  for (size_t l = 0; l < out.logits.size(); ++l) {
    split(out.logits[l], t.matching, &DfineDecoderOutputs::logits);
    split(out.boxes[l], t.matching, &DfineDecoderOutputs::boxes);
    split(out.corners[l], t.matching, &DfineDecoderOutputs::corners);
    split(out.refs[l], t.matching, &DfineDecoderOutputs::refs);
  }
  t.matching.pre_logits = out.pre_logits.narrow(1, n, q);
  t.matching.pre_boxes = out.pre_boxes.narrow(1, n, q);
  if (n > 0) {
    t.dn.pre_logits = out.pre_logits.narrow(1, 0, n);
    t.dn.pre_boxes = out.pre_boxes.narrow(1, 0, n);
  }
  t.enc_topk_logits = s.topk_logits;
  t.enc_topk_boxes = torch::sigmoid(s.ref_unact);
  t.up = decoder->up;
  t.reg_scale = decoder->reg_scale;
  if (t.denoising) {
    t.dn_groups = t.denoising->groups;
    t.dn_pairs = denoising_pairs(*t.denoising);
  }
  return t;
}

std::optional<DenoisingGroup> DfineModel::denoising_group(const std::vector<ImageTargets>& gts) {
  if (!decoder->denoising_class_embed || gts.empty()) return std::nullopt;
  auto group = make_denoising_group(gts, cfg_.nc, cfg_.queries, dn_options_, dn_source_);
  if (group) {
    // D-FINE's group takes the noised boxes' widths and heights as magnitudes (an edge pushed
    // past the opposite one gives a positive size), then their logits.
    group->boxes = torch::where(group->boxes < 0, -group->boxes, group->boxes);
    group->box_unact = inverse_sigmoid(group->boxes);
  }
  return group;
}

std::vector<torch::Tensor> DfineModel::forward_train(const torch::Tensor& x, const torch::Tensor& targets) {
  if (!is_training()) return forward_raw(x);
  return train_tail(Seam::Head, train_head(Seam::Head, x, {}), x, targets, {});
}

std::vector<torch::Tensor> DfineModel::head_parameters(Seam seam) {
  if (seam == Seam::Network) return parameters();
  std::vector<torch::Tensor> p = backbone->parameters();
  for (const auto& e : encoder->parameters()) p.push_back(e);
  return p;
}

SeamInputs DfineModel::seam_inputs(Seam seam, const torch::Tensor& targets) {
  if (seam == Seam::Head) return {};
  if (!targets.defined()) throw UsageError("D-FINE: the network seam needs the batch's targets");
  const bool denoising = decoder->denoising_class_embed && dn_options_.count > 0;
  const auto group = denoising ? denoising_group(split_targets(targets)) : std::nullopt;
  return denoising_seam_inputs(group, denoising, targets.size(0), dn_options_.count, cfg_.nc, cfg_.queries,
                               targets.device());
}

std::vector<torch::Tensor> DfineModel::train_head(Seam seam, const torch::Tensor& x,
                                                  const std::vector<torch::Tensor>& head_inputs) {
  if (x.dim() != 4 || x.size(1) != 3) throw UsageError("D-FINE expects images [B, 3, H, W], got " + c10::str(x.sizes()));
  const auto e = encoder->forward(backbone_forward(x));
  if (seam == Seam::Head) return e;
  if (!is_training()) throw UsageError("D-FINE: the training outputs need the model in training mode");
  const auto [memory, shapes] = decoder->encoder_memory(e);
  const auto s = decoder->select_queries(memory, shapes);
  auto target = s.target, ref_unact = s.ref_unact.detach();
  torch::Tensor mask;
  prepend_denoising(decoder->denoising_class_embed, head_inputs, target, ref_unact, mask);
  const auto out = decoder->decode(target, ref_unact, memory, shapes, mask);
  std::vector<torch::Tensor> head;
  for (const auto* field : {&out.logits, &out.boxes, &out.corners, &out.refs}) head.insert(head.end(), field->begin(), field->end());
  head.push_back(out.pre_logits);
  head.push_back(out.pre_boxes);
  head.push_back(s.topk_logits);
  head.push_back(torch::sigmoid(s.ref_unact));
  return head;
}

std::vector<torch::Tensor> DfineModel::train_tail(Seam seam, const std::vector<torch::Tensor>& head,
                                                  const torch::Tensor& x, const torch::Tensor& targets,
                                                  const SeamInputs& inputs) {
  if (!is_training()) throw UsageError("D-FINE: the training outputs need the model in training mode");
  if (seam == Seam::Head) {
    if (static_cast<int>(head.size()) != cfg_.levels)
      throw UsageError(strfmt("D-FINE: the training head gives the encoder's %d levels", cfg_.levels));
    const auto gts = targets.defined() ? split_targets(targets) : std::vector<ImageTargets>{};
    return pack_dfine_outputs(decoder_train_outputs(head, gts), x.size(2), x.size(3));
  }
  const size_t layers = head.size() >= 8 ? (head.size() - 4) / 4 : 0;
  if (layers == 0 || head.size() != 4 * layers + 4)
    throw UsageError("D-FINE: the network seam gives every decoder layer's outputs, layer 0's and the encoder top-k");
  const auto [n, groups] = denoising_counts(inputs);
  const int64_t q = cfg_.queries;
  const int64_t slots = inputs.head.empty() ? 0 : inputs.head[0].size(1);
  DfineTrainOutputs t;
  const auto split = [&](const torch::Tensor& v, std::vector<torch::Tensor> DfineDecoderOutputs::*field) {
    (t.matching.*field).push_back(v.narrow(1, slots, q));
    if (n > 0) (t.dn.*field).push_back(v.narrow(1, 0, n));
  };
  for (size_t l = 0; l < layers; ++l) {
    split(head[l], &DfineDecoderOutputs::logits);
    split(head[layers + l], &DfineDecoderOutputs::boxes);
    split(head[2 * layers + l], &DfineDecoderOutputs::corners);
    split(head[3 * layers + l], &DfineDecoderOutputs::refs);
  }
  const auto& pre_logits = head[4 * layers];
  const auto& pre_boxes = head[4 * layers + 1];
  t.matching.pre_logits = pre_logits.narrow(1, slots, q);
  t.matching.pre_boxes = pre_boxes.narrow(1, slots, q);
  if (n > 0) {
    t.dn.pre_logits = pre_logits.narrow(1, 0, n);
    t.dn.pre_boxes = pre_boxes.narrow(1, 0, n);
    t.dn_groups = groups;
    t.dn_pairs = inputs.tail[1];
  }
  t.enc_topk_logits = head[4 * layers + 2];
  t.enc_topk_boxes = head[4 * layers + 3];
  t.up = decoder->up;
  t.reg_scale = decoder->reg_scale;
  return pack_dfine_outputs(t, x.size(2), x.size(3));
}

std::vector<torch::Tensor> pack_dfine_outputs(const DfineTrainOutputs& t, int64_t input_h, int64_t input_w) {
  const auto& m = t.matching;
  const int64_t layers = static_cast<int64_t>(m.logits.size());
  if (layers == 0) throw UsageError("D-FINE: training outputs without decoder layers");
  const bool dn = !t.dn.logits.empty();
  std::vector<torch::Tensor> raw = {m.logits.back(), m.boxes.back(), torch::tensor({input_h, input_w}, torch::kLong),
                                    torch::tensor({layers, int64_t{dn ? 1 : 0}, t.dn_groups}, torch::kLong), t.up,
                                    t.reg_scale};
  const auto put = [&](const DfineDecoderOutputs& o) {
    for (int64_t l = 0; l < layers; ++l) {
      raw.push_back(o.logits[l]);
      raw.push_back(o.boxes[l]);
      raw.push_back(o.corners[l]);
      raw.push_back(o.refs[l]);
    }
    raw.push_back(o.pre_logits);
    raw.push_back(o.pre_boxes);
  };
  put(m);
  raw.push_back(t.enc_topk_logits);
  raw.push_back(t.enc_topk_boxes);
  if (dn) {
    put(t.dn);
    raw.push_back(t.dn_pairs);
  }
  return raw;
}

DfineTrainOutputs unpack_dfine_outputs(const std::vector<torch::Tensor>& raw) {
  if (raw.size() < 6 || raw[3].numel() != 3) throw UsageError("D-FINE: not a training-mode output vector");
  const auto counts = raw[3].to(torch::kCPU);
  const int64_t layers = counts[0].item<int64_t>();
  const bool dn = counts[1].item<int64_t>() != 0;
  const size_t want = 6 + static_cast<size_t>(4 * layers + 4) + (dn ? static_cast<size_t>(4 * layers + 3) : 0);
  if (layers < 1 || raw.size() != want) throw UsageError("D-FINE: not a training-mode output vector");
  DfineTrainOutputs t;
  t.up = raw[4];
  t.reg_scale = raw[5];
  size_t i = 6;
  const auto take = [&](DfineDecoderOutputs& o) {
    for (int64_t l = 0; l < layers; ++l) {
      o.logits.push_back(raw[i++]);
      o.boxes.push_back(raw[i++]);
      o.corners.push_back(raw[i++]);
      o.refs.push_back(raw[i++]);
    }
    o.pre_logits = raw[i++];
    o.pre_boxes = raw[i++];
  };
  take(t.matching);
  t.enc_topk_logits = raw[i++];
  t.enc_topk_boxes = raw[i++];
  if (dn) {
    take(t.dn);
    t.dn_pairs = raw[i++].to(torch::kCPU);
    t.dn_groups = counts[2].item<int64_t>();
  }
  return t;
}

void DfineModel::reset_num_classes(int nc) {
  decoder->reset_num_classes(nc);
  cfg_.nc = nc;
}

}  // namespace libreyolo::models::rtdetr
