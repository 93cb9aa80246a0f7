#include "families/rtdetr/config.hpp"

#include <torch/types.h>

#include <tuple>

#include "core/log.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::models::rtdetr {

namespace {

struct SizeRow {
  const char* size;
  int depth;
  bool frozen_norm;
  int64_t hidden, enc_ffn;
  double expansion;
  int dec_layers, eval_idx;

  Config config(int nc) const {
    Config c;
    std::tie(c.size, c.depth, c.frozen_norm, c.hidden, c.enc_ffn) = std::make_tuple(size, depth, frozen_norm, hidden, enc_ffn);
    std::tie(c.expansion, c.dec_layers, c.eval_idx, c.nc) = std::make_tuple(expansion, dec_layers, eval_idx, nc);
    return c;
  }
};

// clang-format off
const SizeRow kSizes[] = {
  // size   depth frozen hidden ffn  expansion layers eval_idx
  {"r18",   18,   false, 256,  1024, 0.5,      3,     -1},
  {"r34",   34,   false, 256,  1024, 0.5,      4,     -1},
  {"r50",   50,   true,  256,  1024, 1.0,      6,     -1},
  {"r50m",  50,   true,  256,  1024, 0.5,      6,      2},
  {"r101",  101,  true,  384,  2048, 1.0,      6,     -1},
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

}  // namespace

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
  const int64_t e = block_expansion();
  return {stages[1] * e, stages[2] * e, stages[3] * e};
}

const std::vector<std::string>& size_names() {
  static const std::vector<std::string> names = {"r18", "r34", "r50", "r50m", "r101"};
  return names;
}

Config size_config(const std::string& size, int nc) {
  for (const auto& r : kSizes) {
    if (size == r.size) return r.config(nc);
  }
  throw UsageError("unknown RT-DETR size '" + size + "'", "use one of r18, r34, r50, r50m, r101",
                   "model_unknown_size");
}

std::optional<Config> config_from_state_dict(const io::StateDict& sd) {
  Config c;
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
  c.dec_layers = count(sd, "decoder.dec_score_head.", ".weight");
  if (c.dec_layers == 0) return std::nullopt;
  const auto nc = dim0(sd, strfmt("decoder.dec_score_head.%d.bias", c.dec_layers - 1));
  if (!nc) return std::nullopt;
  c.nc = static_cast<int>(*nc);
  c.denoising = has(sd, "decoder.denoising_class_embed.weight") ? 100 : 0;

  // The topology (depth, expansion, decoder depth) gives eval_idx (r50m differs from r50 by its
  // expansion only); the size name needs the stock widths too.
  c.size.clear();
  const Config stock;
  for (const auto& r : kSizes) {
    if (r.depth != c.depth || r.expansion != c.expansion || r.dec_layers != c.dec_layers) continue;
    c.eval_idx = r.eval_idx;
    if (r.hidden == c.hidden && r.enc_ffn == c.enc_ffn && c.stem == stock.stem && c.stages == stock.stages &&
        c.dec_hidden == stock.dec_hidden && c.dec_ffn == stock.dec_ffn)
      c.size = r.size;
  }
  return c;
}

}  // namespace libreyolo::models::rtdetr
