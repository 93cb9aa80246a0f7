#include "families/rtdetr/config.hpp"

#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/log.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::models::rtdetr {

namespace {

struct SizeRow {
  const char* size;
  int depth;                    // PResNet depth (0 with an HGNetv2)
  const HgNetSpec& (*hgnet)();  // the HGNetv2 (nullptr with a PResNet)
  bool frozen_norm;
  int64_t hidden, enc_ffn;
  double expansion;
  int dec_layers, eval_idx;

  Config config(int nc) const {
    Config c;
    std::tie(c.size, c.depth, c.frozen_norm, c.hidden, c.enc_ffn) = std::make_tuple(size, depth, frozen_norm, hidden, enc_ffn);
    std::tie(c.expansion, c.dec_layers, c.eval_idx, c.nc) = std::make_tuple(expansion, dec_layers, eval_idx, nc);
    if (hgnet) c.hgnet = hgnet();
    return c;
  }
};

// clang-format off
const SizeRow kSizes[] = {
  // size   depth backbone   frozen hidden ffn  expansion layers eval_idx
  {"r18",   18,   nullptr,   false, 256,  1024, 0.5,      3,     -1},
  {"r34",   34,   nullptr,   false, 256,  1024, 0.5,      4,     -1},
  {"r50",   50,   nullptr,   true,  256,  1024, 1.0,      6,     -1},
  {"r50m",  50,   nullptr,   true,  256,  1024, 0.5,      6,      2},
  {"r101",  101,  nullptr,   true,  384,  2048, 1.0,      6,     -1},
  {"l",     0,    hgnetv2_l, true,  256,  1024, 1.0,      6,     -1},
  {"x",     0,    hgnetv2_x, true,  384,  2048, 1.0,      6,     -1},
};
// clang-format on

std::string identity(const std::string& k) { return k; }

std::optional<int64_t> dim0(const io::StateDict& sd, const std::string& key) {
  return io::leading_dim(sd, key, identity);
}

bool has(const io::StateDict& sd, const std::string& key) { return io::find_tensor(sd, key, identity) != nullptr; }

// How many of prefix{0}suffix, prefix{1}suffix, ... exist (stops at the first gap).
int count(const io::StateDict& sd, const std::string& prefix, const std::string& suffix) {
  int n = 0;
  while (has(sd, prefix + std::to_string(n) + suffix)) ++n;
  return n;
}

// The rank-4 weight's kernel height, or 0 when it is missing.
int64_t kernel_size(const io::StateDict& sd, const std::string& key) {
  const torch::Tensor* t = io::find_tensor(sd, key, identity);
  return t && t->dim() == 4 ? t->size(2) : 0;
}

}  // namespace

bool DecoderOptions::operator==(const DecoderOptions& o) const {
  return std::tie(level_points, points_scale_buffer, sampling, query_select, ffn_clamp, xavier_ffn_init, anchor_size,
                  named_enc_output, enc_aux_level) ==
         std::tie(o.level_points, o.points_scale_buffer, o.sampling, o.query_select, o.ffn_clamp, o.xavier_ffn_init,
                  o.anchor_size, o.named_enc_output, o.enc_aux_level);
}

std::vector<int64_t> Config::points_per_level() const {
  if (!v2.level_points.empty()) return {v2.level_points.begin(), v2.level_points.end()};
  return std::vector<int64_t>(kLevels, points);
}

bool HgStageSpec::operator==(const HgStageSpec& o) const {
  return std::tie(mid, out, blocks, downsample, light, kernel, layers) ==
         std::tie(o.mid, o.out, o.blocks, o.downsample, o.light, o.kernel, o.layers);
}

bool HgNetSpec::operator==(const HgNetSpec& o) const {
  return stem_mid == o.stem_mid && stem_out == o.stem_out && stages == o.stages && lab == o.lab &&
         dfine_names == o.dfine_names;
}

namespace {

// The backbones of sizes l and x, in that order.
const std::array<HgNetSpec, 2>& hgnet_sizes() {
  // clang-format off
  static const std::array<HgNetSpec, 2> specs{{
    {32, 48, {{
      // mid  out   blocks downsample light  kernel layers
      {48,   128,  1,     false,     false, 3,     6},
      {96,   512,  1,     true,      false, 3,     6},
      {192,  1024, 3,     true,      true,  5,     6},
      {384,  2048, 1,     true,      true,  5,     6},
    }}},
    {32, 64, {{
      {64,   128,  1,     false,     false, 3,     6},
      {128,  512,  2,     true,      false, 3,     6},
      {256,  1024, 5,     true,      true,  5,     6},
      {512,  2048, 2,     true,      true,  5,     6},
    }}},
  }};
  // clang-format on
  return specs;
}

}  // namespace

const HgNetSpec& hgnetv2_l() { return hgnet_sizes()[0]; }
const HgNetSpec& hgnetv2_x() { return hgnet_sizes()[1]; }

std::array<int, 4> Config::blocks() const {
  switch (depth) {
    case 18:
      return {2, 2, 2, 2};
    case 34:
    case 50:
      return {3, 4, 6, 3};
    case 101:
      return {3, 4, 23, 3};
    default:
      break;
  }
  throw UsageError(strfmt("RT-DETR: no PResNet of depth %d", depth), "use a depth of 18, 34, 50 or 101",
                   "model_unknown_size");
}

std::array<int64_t, 3> Config::backbone_channels() const {
  if (hgnet) return {hgnet->stages[1].out, hgnet->stages[2].out, hgnet->stages[3].out};
  const int64_t e = block_expansion();
  return {stages[1] * e, stages[2] * e, stages[3] * e};
}

const std::vector<std::string>& size_names() {
  static const std::vector<std::string> names = {"r18", "r34", "r50", "r50m", "r101", "l", "x"};
  return names;
}

Config size_config(const std::string& size, int nc) {
  for (const auto& r : kSizes) {
    if (size == r.size) return r.config(nc);
  }
  throw UsageError("unknown RT-DETR size '" + size + "'", "use one of r18, r34, r50, r50m, r101, l, x",
                   "model_unknown_size");
}

std::optional<HgNetSpec> hgnet_from_state_dict(const io::StateDict& sd) {
  HgNetSpec h;
  const auto mid = dim0(sd, "backbone.stem.stem1.conv.weight"), out = dim0(sd, "backbone.stem.stem4.conv.weight");
  if (!mid || !out) return std::nullopt;
  h.stem_mid = *mid;
  h.stem_out = *out;
  for (int i = 0; i < 4; ++i) {
    auto& st = h.stages[static_cast<size_t>(i)];
    const std::string stage = strfmt("backbone.stages.%d.", i), block = stage + "blocks.0.";
    st.downsample = has(sd, stage + "downsample.conv.weight");
    st.light = has(sd, block + "layers.0.conv1.conv.weight");
    const std::string first = block + (st.light ? "layers.0.conv1.conv.weight" : "layers.0.conv.weight");
    const std::string spatial = block + (st.light ? "layers.0.conv2.conv.weight" : "layers.0.conv.weight");
    const bool dfine = has(sd, block + "aggregation.1.conv.weight");
    const std::string excitation = dfine ? "aggregation.1.conv.weight" : "aggregation_excitation_conv.conv.weight";
    const auto width = dim0(sd, first), wide = dim0(sd, block + excitation);
    if (!width || !wide) return std::nullopt;
    st.mid = *width;
    st.out = *wide;
    st.kernel = static_cast<int>(kernel_size(sd, spatial));
    if (st.kernel == 0) return std::nullopt;
    st.layers = count(sd, block + "layers.", st.light ? ".conv1.conv.weight" : ".conv.weight");
    st.blocks = count(sd, stage + "blocks.", dfine ? ".aggregation.0.conv.weight" : ".aggregation_squeeze_conv.conv.weight");
    h.dfine_names = dfine;
  }
  return h;
}

std::optional<Config> config_from_state_dict(const io::StateDict& sd) {
  Config c;
  if (has(sd, "backbone.stem.stem1.conv.weight")) {
    c.hgnet = hgnet_from_state_dict(sd);
    if (!c.hgnet) return std::nullopt;
    c.depth = 0;
    c.frozen_norm = !has(sd, "backbone.stem.stem1.bn.num_batches_tracked");
  } else {
    const auto stem = dim0(sd, "backbone.conv1.conv1_3.conv.weight");
    if (!stem) return std::nullopt;
    c.stem = *stem;
    const bool bottleneck = has(sd, "backbone.res_layers.0.blocks.0.branch2c.conv.weight");
    std::array<int, 4> counts{};
    for (int i = 0; i < 4; ++i) {
      const std::string stage = strfmt("backbone.res_layers.%d.blocks.", i);
      const auto w = dim0(sd, stage + "0.branch2a.conv.weight");
      if (!w) return std::nullopt;
      c.stages[i] = *w;
      counts[i] = count(sd, stage, ".branch2a.conv.weight");
    }
    c.depth = 0;
    for (int d : {18, 34, 50, 101}) {
      Config probe;
      probe.depth = d;
      if (probe.bottleneck() == bottleneck && probe.blocks() == counts) c.depth = d;
    }
    if (c.depth == 0) return std::nullopt;
    c.frozen_norm = !has(sd, "backbone.conv1.conv1_1.norm.num_batches_tracked");
  }

  const auto hidden = dim0(sd, "encoder.input_proj.0.0.weight");
  const auto enc_ffn = dim0(sd, "encoder.encoder.0.layers.0.linear1.weight");
  const auto csp = dim0(sd, "encoder.fpn_blocks.0.conv1.conv.weight");
  const auto dec_hidden = dim0(sd, "decoder.input_proj.0.conv.weight");
  const auto dec_ffn = dim0(sd, "decoder.decoder.layers.0.linear1.weight");
  const auto offsets = dim0(sd, "decoder.decoder.layers.0.cross_attn.sampling_offsets.weight");
  if (!hidden || !enc_ffn || !csp || !dec_hidden || !dec_ffn || !offsets) return std::nullopt;
  c.hidden = *hidden;
  c.enc_ffn = *enc_ffn;
  c.expansion = static_cast<double>(*csp) / static_cast<double>(*hidden);
  c.dec_hidden = *dec_hidden;
  c.dec_ffn = *dec_ffn;
  c.points = static_cast<int>(*offsets / (c.heads * Config::kLevels * 2));
  if (is_v2_state_dict(sd)) {
    v2_options(c, 0);
    // The buffer holds 1/n n times per level, level by level; values that do not read so (a
    // state dict of shapes only) leave the points spread evenly over the levels.
    const torch::Tensor* scale = io::find_tensor(sd, "decoder.decoder.layers.0.cross_attn.num_points_scale", identity);
    const auto s = scale->to(torch::kCPU, torch::kDouble).contiguous();  // the buffer may live on a GPU
    const double* v = s.data_ptr<double>();
    std::vector<int> counts;
    for (int64_t i = 0; i < s.numel();) {
      const double inv = v[i] > 0 ? 1.0 / v[i] : 0.0;
      const int n = std::isfinite(inv) && inv >= 1 && inv < 1e6 ? static_cast<int>(std::lround(inv)) : 0;
      if (n < 1 || i + n > s.numel()) {
        counts.clear();
        break;
      }
      counts.push_back(n);
      i += n;
    }
    if (static_cast<int>(counts.size()) == Config::kLevels) {
      c.v2.level_points = counts;
    } else {
      if (s.numel() % Config::kLevels != 0) return std::nullopt;
      c.v2.level_points.assign(Config::kLevels, static_cast<int>(s.numel() / Config::kLevels));
    }
    c.points = c.v2.level_points[0];
    c.v2.named_enc_output = has(sd, "decoder.enc_output.proj.weight");
    // The anchors of a square input of side S have S^2 (1/64 + 1/256 + 1/1024) = 21 S^2 / 1024 rows.
    if (const auto t = io::find_tensor(sd, "decoder.anchors", identity); t && t->dim() == 3) {
      const auto side = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(t->size(1)) * 1024.0 / 21.0)));
      if (side % 32 != 0 || side * side * 21 / 1024 != t->size(1)) return std::nullopt;
      c.v2.anchor_size = side;
    }
  }
  c.dec_layers = count(sd, "decoder.dec_score_head.", ".weight");
  if (c.dec_layers == 0) return std::nullopt;
  const auto nc = dim0(sd, strfmt("decoder.dec_score_head.%d.bias", c.dec_layers - 1));
  if (!nc) return std::nullopt;
  c.nc = static_cast<int>(*nc);
  // A one-output encoder score head over several classes: class-agnostic query selection (v2).
  if (const auto enc_classes = dim0(sd, "decoder.enc_score_head.weight");
      c.v2.points_scale_buffer && enc_classes && *enc_classes == 1 && c.nc != 1)
    c.v2.query_select = QuerySelect::Agnostic;
  c.denoising = has(sd, "decoder.denoising_class_embed.weight") ? 100 : 0;

  // The topology (backbone kind and depth, expansion, decoder depth) gives eval_idx (r50m differs
  // from r50 by its expansion only); the size name needs the stock widths too.
  c.size.clear();
  const Config stock;
  for (const auto& r : kSizes) {
    if (r.depth != c.depth || (r.hgnet != nullptr) != c.hgnet.has_value() || r.expansion != c.expansion ||
        r.dec_layers != c.dec_layers)
      continue;
    c.eval_idx = r.eval_idx;
    const bool backbone = r.hgnet ? *c.hgnet == r.hgnet() : c.stem == stock.stem && c.stages == stock.stages;
    if (backbone && r.hidden == c.hidden && r.enc_ffn == c.enc_ffn && c.dec_hidden == stock.dec_hidden &&
        c.dec_ffn == stock.dec_ffn)
      c.size = r.size;
  }
  return c;
}

const std::vector<std::string>& v2_size_names() {
  static const std::vector<std::string> names = {"r18", "r34", "r50", "r50m", "r101"};
  return names;
}

void v2_options(Config& c, int64_t input_size) {
  c.family = "rtdetrv2";
  DecoderOptions& o = c.v2;
  o.level_points.assign(Config::kLevels, c.points);
  o.points_scale_buffer = true;
  o.sampling = Sampling::Bilinear;
  o.query_select = QuerySelect::BestClass;
  o.ffn_clamp = false;
  o.xavier_ffn_init = true;
  o.anchor_size = input_size;
  o.named_enc_output = true;
  o.enc_aux_level = true;
}

Config v2_size_config(const std::string& size, int nc) {
  const auto& names = v2_size_names();
  if (std::find(names.begin(), names.end(), size) == names.end())
    throw UsageError("unknown RT-DETRv2 size '" + size + "'" +
                         (size == "l" || size == "x" ? " (its HGNetv2 sizes are RT-DETR's: rtdetr-" + size + ")" : ""),
                     "use one of r18, r34, r50, r50m, r101", "model_unknown_size");
  Config c = size_config(size, nc);
  v2_options(c, 640);
  return c;
}

bool is_v2_state_dict(const io::StateDict& sd) {
  return has(sd, "decoder.decoder.layers.0.cross_attn.num_points_scale");
}

}  // namespace libreyolo::models::rtdetr
