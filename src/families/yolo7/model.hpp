// YOLOv7 detect model (size b) with LibreYOLO's parameter names: the network is one list of 106
// layers, "layers.{i}", i the layer's index (layers without weights, the concatenations, pools and
// upsamplings, hold an index but no tensors). Every width is a multiple of the first layer's
// (32 in b), so a narrower network of the same graph is built from that one number.
#pragma once
#include <torch/torch.h>

#include <array>
#include <string>
#include <vector>

#include "families/yolo7/blocks.hpp"
#include "layers/level_cache.hpp"
#include "models/detector.hpp"

namespace libreyolo::models::yolo7 {

const std::vector<std::string>& size_names();  // {"b"}
// The first layer's width of a size (b: 32). Throws UsageError for an unknown size.
int64_t size_width(const std::string& size);

// Anchor sizes (w, h) in input pixels, per level (strides 8, 16, 32) and anchor.
constexpr std::array<std::array<std::array<double, 2>, kAnchorsPerCell>, 3> kAnchors{{
    {{{12, 16}, {19, 36}, {40, 28}}},
    {{{36, 75}, {76, 55}, {72, 146}}},
    {{{142, 110}, {192, 243}, {459, 401}}},
}};
constexpr std::array<int64_t, 3> kStrides{8, 16, 32};

// What a layer does to its sources' outputs.
enum class Op { Conv, Pool, Upsample, Concat, SppCsp, RepConv, Detect };

struct Layer {
  Op op;
  std::vector<int> src;  // indices of the layers it reads; -1 is the network's input
  int64_t out = 0;       // output channels (Detect: 0)
  Conv conv{nullptr};
  SPPCSPConv spp{nullptr};
  RepConv rep{nullptr};
};

// Per-anchor constants of a prediction grid, level-major, anchor-major inside a level, then row,
// then column: cells [2, A] (gx, gy), anchor sizes [2, A] (w, h), strides [1, A], float32.
struct Grid {
  torch::Tensor cells, anchors, strides;
};
Grid make_grid(const LevelSizes& level_hw, const torch::Device& device);

class Yolo7Model : public Detector {
 public:
  // width: the first layer's output channels (32 in b; every other width scales with it).
  Yolo7Model(int64_t width, int nc);

  // Per level [B, 3 (5 + nc), H/s, W/s]: the detection layers' raw maps, in train and eval mode.
  std::vector<torch::Tensor> forward_raw(const torch::Tensor& x) override;
  // [B, 4 + nc, A], A = 3 (H/8 W/8 + H/16 W/16 + H/32 W/32), the flattening order of Grid: every
  // channel sigmoided, cx = (2 sx - 0.5 + gx) s, w = (2 sw)^2 anchor_w (likewise y, h), xyxy in
  // input pixels, then score = obj * cls per class.
  torch::Tensor decode(const std::vector<torch::Tensor>& raw) override;

  std::string family_name() const override { return "yolo7"; }
  std::string size() const override { return "b"; }
  int num_classes() const override { return heads_->heads[0]->nc; }
  std::vector<int64_t> strides() const override { return {kStrides.begin(), kStrides.end()}; }
  void reset_num_classes(int nc) override;
  // The reference's one group: the layer list.
  std::vector<std::string> freeze_groups() const override { return {"layers"}; }

  int64_t width() const { return width_; }
  const std::vector<Layer>& layer_table() const { return layers_; }
  MultiheadDetectionImpl& heads() { return *heads_; }
  // Objectness and class biases of every level at the prior (a fresh model has them).
  void init_biases(double prior = 0.01);

 private:
  void check_input(const torch::Tensor& x) const;
  std::vector<torch::Tensor> run(const torch::Tensor& x);

  int64_t width_;
  std::vector<Layer> layers_;
  std::vector<int> last_use_;  // per layer, the last layer that reads its output
  MultiheadDetection heads_{nullptr};
  common::BatchedLayerState batched_{*this};
  LevelCache<Grid> grids_;
};

// The registry entry (src/families/registry.cpp lists it).
Family make_family();

}  // namespace libreyolo::models::yolo7
