// RT-DETR's hyper-parameters: one struct for every width and count the network is built from,
// the table of LibreYOLO's sizes, and the same read back from a state dict's shapes (so a
// checkpoint of any width, e.g. a narrow test model, builds its own network). The backbone is a
// PResNet-vd (sizes r18-r101) or an HGNetv2 (sizes l and x). RT-DETRv2 is the same network with
// the decoder options of DecoderOptions (v2_options() sets them; its sizes are the PResNet ones).
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/state_dict.hpp"

namespace libreyolo::models::rtdetr {

// One HGNetv2 stage: a depthwise 3x3/2 downsample when `downsample`, then `blocks` HG blocks of
// `layers` convolutions `mid` wide (k x k; light: 1x1 then a depthwise k x k) aggregated to `out`
// channels. Its input width is the previous stage's output (the stem's for stage 0).
struct HgStageSpec {
  int64_t mid = 0, out = 0;
  int blocks = 0;
  bool downsample = false, light = false;
  int kernel = 3, layers = 6;
  bool operator==(const HgStageSpec& o) const;
  bool operator!=(const HgStageSpec& o) const { return !(*this == o); }
};

// An HGNetv2: the stem's middle and output widths and four stages.
struct HgNetSpec {
  int64_t stem_mid = 0, stem_out = 0;
  std::array<HgStageSpec, 4> stages{};
  // D-FINE's variant: a learnable scale and shift ("lab.scale", "lab.bias", one value each)
  // after every ReLU (`lab`); and its names (`dfine_names`): the stem's 2x2 convolutions padded
  // in the forward (their weights at "conv" instead of "conv.1") and a block's two aggregation
  // convolutions at "aggregation.0" and "aggregation.1".
  bool lab = false;
  bool dfine_names = false;
  // How a fresh backbone's convolutions start: Kaiming-normal (RT-DETR's HGNetv2), or each
  // layer's own default (D-FINE's, which LibreYOLO does not re-initialise). Not part of the
  // structure (==).
  bool kaiming_init = true;
  bool operator==(const HgNetSpec& o) const;
  bool operator!=(const HgNetSpec& o) const { return !(*this == o); }
  // Input width of stage i.
  int64_t stage_in(int i) const { return i == 0 ? stem_out : stages[static_cast<size_t>(i) - 1].out; }
};

// The backbones of sizes l and x.
const HgNetSpec& hgnetv2_l();
const HgNetSpec& hgnetv2_x();

// How a deformable-attention sampling point reads its level's value map: bilinearly (grid_sample,
// zeros outside) or, RT-DETRv2's "discrete" option, the value of the cell the point falls in
// (coordinates truncated, clamped to the map; the sampling offsets then get no gradient).
enum class Sampling { Bilinear, Discrete };

// How the queries are chosen among the encoder's proposals: the top-k of each token's best class
// logit; RT-DETRv2's "one2many" (top-k over token x class, a token once per selected class); or
// "agnostic" (one class-free score per token: the encoder score head has one output).
enum class QuerySelect { BestClass, OneToMany, Agnostic };

// What RT-DETRv2's decoder changes; the defaults are RT-DETR v1's.
struct DecoderOptions {
  // Sampling points per level; empty: Config::points on every level. v2 lays the points of all
  // levels out flat (level-major) and scales each offset by 1 / (its level's count) from a buffer
  // "num_points_scale"; v1 divides by the one count.
  std::vector<int> level_points;
  bool points_scale_buffer = false;
  Sampling sampling = Sampling::Bilinear;
  QuerySelect query_select = QuerySelect::BestClass;
  bool ffn_clamp = true;         // the decoder FFN's residual sum clamped to +-65504 before norm3
  bool xavier_ffn_init = false;  // xavier-uniform decoder FFN weights and decoder input projections
  // > 0: persistent buffers "anchors" [1, T, 4] and "valid_mask" [1, T, 1] of a square input of
  // this side, used by the eval forward at that size.
  int64_t anchor_size = 0;
  bool named_enc_output = false;  // the proposal projection as "enc_output.proj/.norm" (v1: ".0/.1")
  // The encoder top-k supervised as its own level (loss terms "..._enc_0") instead of as the last
  // auxiliary level ("..._aux_{L-1}").
  bool enc_aux_level = false;
  bool operator==(const DecoderOptions& o) const;
};

struct Config {
  std::string family = "rtdetr";   // the registry entry: "rtdetr", or "rtdetrv2" (v2_options)
  std::string size = "r18";        // LibreYOLO's size name, or "" when the widths match none
  std::optional<HgNetSpec> hgnet;  // the HGNetv2 backbone; none: a PResNet (depth, stem, stages)
  int depth = 18;                  // PResNet depth: 18/34 BasicBlock, 50/101 BottleNeck
  int64_t stem = 64;               // width of the stem's last conv (the first two have half)
  std::array<int64_t, 4> stages{64, 128, 256, 512};  // stage widths (BottleNeck outputs 4x)
  bool frozen_norm = false;  // backbone BatchNorms frozen (buffers only, no num_batches_tracked)
  int64_t hidden = 256;      // encoder width
  int64_t enc_ffn = 1024;    // AIFI feed-forward width
  double expansion = 0.5;    // CSPRepLayer hidden = int(hidden * expansion)
  int64_t dec_hidden = 256;  // decoder width
  int64_t dec_ffn = 1024;
  int dec_layers = 3;
  int eval_idx = -1;  // the decoder layer inference stops at and scores; -1: the last
  int heads = 8;
  int queries = 300;
  int points = 4;       // deformable-attention sampling points per head and level
  int denoising = 100;  // denoising queries in training (> 0: denoising_class_embed exists)
  int nc = 80;
  DecoderOptions v2;  // RT-DETRv2's decoder options (defaults: v1)

  static constexpr int kLevels = 3;  // strides 8, 16, 32
  bool bottleneck() const { return depth >= 50; }
  int block_expansion() const { return bottleneck() ? 4 : 1; }
  std::array<int, 4> blocks() const;  // residual blocks per stage
  // Backbone output widths of stages 1, 2, 3.
  std::array<int64_t, 3> backbone_channels() const;
  int64_t csp_hidden() const { return static_cast<int64_t>(static_cast<double>(hidden) * expansion); }
  int last_layer() const { return eval_idx >= 0 ? eval_idx : dec_layers + eval_idx; }
  // Sampling points of each level (v2.level_points, or `points` on every level).
  std::vector<int64_t> points_per_level() const;
};

// LibreYOLO's sizes: r18, r34, r50, r50m, r101 (PResNet), l, x (HGNetv2).
const std::vector<std::string>& size_names();
// The default build of a size (frozen backbone norms for r50, r50m, r101, l, x). Throws UsageError.
Config size_config(const std::string& size, int nc);
// Every width and count from the shapes of a (key-normalised) state dict; eval_idx from the
// size the shapes match (r50m stops at layer 2). nullopt when a needed key is missing. Weights
// with RT-DETRv2's decoder (num_points_scale buffers) give its options (v2_options), the points
// per level read from that buffer and the anchors' input side from the anchors buffer.
std::optional<Config> config_from_state_dict(const io::StateDict& sd);

// RT-DETRv2 as LibreYOLO 1.6.0 builds it: the sizes (PResNet backbones only), the decoder options
// set on a configuration (4 points a level, bilinear sampling, best-class selection, anchors
// for `input_size`), and a size's default build. v2_size_config throws UsageError for an unknown
// size, an HGNetv2 one included.
const std::vector<std::string>& v2_size_names();
void v2_options(Config& c, int64_t input_size = 640);
Config v2_size_config(const std::string& size, int nc);
// True when the (key-normalised) state dict has RT-DETRv2's decoder.
bool is_v2_state_dict(const io::StateDict& sd);
// The HGNetv2 whose tensors are under "backbone." in `sd` (nullopt when a needed key is missing).
std::optional<HgNetSpec> hgnet_from_state_dict(const io::StateDict& sd);

}  // namespace libreyolo::models::rtdetr
