// RT-DETR's hyper-parameters: one struct for every width and count the network is built from,
// the table of LibreYOLO's sizes, and the same read back from a state dict's shapes (so a
// checkpoint of any width, e.g. a narrow test model, builds its own network). The backbone is a
// PResNet-vd (sizes r18-r101) or an HGNetv2 (sizes l and x).
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
  bool operator==(const HgNetSpec& o) const;
  bool operator!=(const HgNetSpec& o) const { return !(*this == o); }
  // Input width of stage i.
  int64_t stage_in(int i) const { return i == 0 ? stem_out : stages[static_cast<size_t>(i) - 1].out; }
};

// The backbones of sizes l and x.
const HgNetSpec& hgnetv2_l();
const HgNetSpec& hgnetv2_x();

struct Config {
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

  static constexpr int kLevels = 3;  // strides 8, 16, 32
  bool bottleneck() const { return depth >= 50; }
  int block_expansion() const { return bottleneck() ? 4 : 1; }
  std::array<int, 4> blocks() const;  // residual blocks per stage
  // Backbone output widths of stages 1, 2, 3.
  std::array<int64_t, 3> backbone_channels() const;
  int64_t csp_hidden() const { return static_cast<int64_t>(static_cast<double>(hidden) * expansion); }
  int last_layer() const { return eval_idx >= 0 ? eval_idx : dec_layers + eval_idx; }
};

// LibreYOLO's sizes: r18, r34, r50, r50m, r101 (PResNet), l, x (HGNetv2).
const std::vector<std::string>& size_names();
// The default build of a size (frozen backbone norms for r50, r50m, r101, l, x). Throws UsageError.
Config size_config(const std::string& size, int nc);
// Every width and count from the shapes of a (key-normalised) state dict; eval_idx from the
// size the shapes match (r50m stops at layer 2). nullopt when a needed key is missing.
std::optional<Config> config_from_state_dict(const io::StateDict& sd);
// The HGNetv2 whose tensors are under "backbone." in `sd` (nullopt when a needed key is missing).
std::optional<HgNetSpec> hgnet_from_state_dict(const io::StateDict& sd);

}  // namespace libreyolo::models::rtdetr
