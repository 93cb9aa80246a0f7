#include "families/yolo7/model.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>

#include "core/log.hpp"
#include "core/strings.hpp"
#include "layers/slice_ops.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::models::yolo7 {

namespace {

constexpr int kInput = -1;

// Appends layers to the model's table and registers their modules in the "layers" list under
// their indices, in index order (the state dict's order).
class Builder {
 public:
  Builder(std::vector<Layer>& layers, torch::nn::Module& list) : layers_(layers), list_(list) {}

  int64_t channels(int src) const { return src == kInput ? 3 : layers_[static_cast<size_t>(src)].out; }

  int conv(int src, int64_t out, int64_t k, int64_t s = 1) {
    Layer l{Op::Conv, {src}, out};
    l.conv = list_.register_module(next_name(), Conv(channels(src), out, k, s));
    return add(std::move(l));
  }
  int pool(int src) { return add({Op::Pool, {src}, channels(src)}); }
  int upsample(int src) { return add({Op::Upsample, {src}, channels(src)}); }
  int concat(const std::vector<int>& src) {
    int64_t c = 0;
    for (int s : src) c += channels(s);
    return add({Op::Concat, src, c});
  }
  int sppcsp(int src, int64_t out) {
    Layer l{Op::SppCsp, {src}, out};
    l.spp = list_.register_module(next_name(), SPPCSPConv(channels(src), out));
    return add(std::move(l));
  }
  int repconv(int src, int64_t out) {
    Layer l{Op::RepConv, {src}, out};
    l.rep = list_.register_module(next_name(), RepConv(channels(src), out));
    return add(std::move(l));
  }
  MultiheadDetection detect(const std::array<int, 3>& src, int nc) {
    const std::array<int64_t, 3> cin{channels(src[0]), channels(src[1]), channels(src[2])};
    auto m = list_.register_module(next_name(), MultiheadDetection(cin, nc));
    add({Op::Detect, {src[0], src[1], src[2]}, 0});
    return m;
  }

  // Two 1x1 branches of `mid` on x, four 3x3 convolutions chained on the second, and the
  // concatenation of the chain's 4th and 2nd outputs and both branches (backbone's ELAN).
  int elan(int x, int64_t mid) {
    const int a = conv(x, mid, 1), b = conv(x, mid, 1);
    const int c2 = conv(conv(b, mid, 3), mid, 3), c4 = conv(conv(c2, mid, 3), mid, 3);
    return concat({c4, c2, b, a});
  }
  // The neck's wider ELAN: two 1x1 branches of `branch`, four chained 3x3 of `mid` on the second,
  // all six concatenated, latest first.
  int elan_wide(int x, int64_t branch, int64_t mid) {
    const int a = conv(x, branch, 1), b = conv(x, branch, 1);
    const int c1 = conv(b, mid, 3), c2 = conv(c1, mid, 3), c3 = conv(c2, mid, 3), c4 = conv(c3, mid, 3);
    return concat({c4, c3, c2, c1, b, a});
  }
  // Downsampling by two: a 2x2 max pool then 1x1, and a 1x1 then a strided 3x3, concatenated
  // strided branch first (then `lateral`, when given).
  int down(int x, int64_t half, std::optional<int> lateral = std::nullopt) {
    const int p = conv(pool(x), half, 1);
    const int s = conv(conv(x, half, 1), half, 3, 2);
    if (!lateral) return concat({s, p});
    return concat({s, p, *lateral});
  }

 private:
  std::string next_name() const { return std::to_string(layers_.size()); }
  int add(Layer l) {
    layers_.push_back(std::move(l));
    return static_cast<int>(layers_.size()) - 1;
  }
  std::vector<Layer>& layers_;
  torch::nn::Module& list_;
};

}  // namespace

const std::vector<std::string>& size_names() {
  static const std::vector<std::string> names = {"b"};
  return names;
}

int64_t size_width(const std::string& size) {
  if (size == "b") return 32;
  throw UsageError("unknown YOLOv7 size '" + size + "'", "use b", "model_unknown_size");
}

Yolo7Model::Yolo7Model(int64_t width, int nc) : width_(width) {
  if (nc < 1) throw UsageError(strfmt("number of classes must be >= 1, got %d", nc));
  if (width < 1) throw UsageError(strfmt("YOLOv7 width must be >= 1, got %lld", static_cast<long long>(width)));
  auto list = std::make_shared<torch::nn::Module>();
  Builder b(layers_, *list);
  const int64_t c = width;
  // Stem: 0-3.
  int x = b.conv(kInput, c, 3);
  x = b.conv(x, 2 * c, 3, 2);
  x = b.conv(x, 2 * c, 3);
  x = b.conv(x, 4 * c, 3, 2);
  // Backbone: 4-50.
  x = b.conv(b.elan(x, 2 * c), 8 * c, 1);
  const int b3 = b.elan(b.down(x, 4 * c), 4 * c);
  x = b.conv(b3, 16 * c, 1);
  const int b4 = b.conv(b.elan(b.down(x, 8 * c), 8 * c), 32 * c, 1);
  const int b5 = b.conv(b.elan(b.down(b4, 16 * c), 8 * c), 32 * c, 1);
  // Neck, top-down: 51-75.
  const int n3 = b.sppcsp(b5, 16 * c);
  x = b.upsample(b.conv(n3, 8 * c, 1));
  x = b.concat({b.conv(b4, 8 * c, 1), x});
  const int n2 = b.conv(b.elan_wide(x, 8 * c, 4 * c), 8 * c, 1);
  x = b.upsample(b.conv(n2, 4 * c, 1));
  x = b.concat({b.conv(b3, 4 * c, 1), x});
  const int p3 = b.conv(b.elan_wide(x, 4 * c, 2 * c), 4 * c, 1);
  // Bottom-up: 76-101.
  const int p4 = b.conv(b.elan_wide(b.down(p3, 4 * c, n2), 8 * c, 4 * c), 8 * c, 1);
  const int p5 = b.conv(b.elan_wide(b.down(p4, 8 * c, n3), 16 * c, 8 * c), 16 * c, 1);
  // Re-parameterisable convolutions and the detection layers: 102-105.
  const int r3 = b.repconv(p3, 8 * c), r4 = b.repconv(p4, 16 * c), r5 = b.repconv(p5, 32 * c);
  heads_ = b.detect({r3, r4, r5}, nc);
  register_module("layers", list);

  last_use_.assign(layers_.size(), -1);
  for (size_t i = 0; i < layers_.size(); ++i)
    for (int s : layers_[i].src)
      if (s >= 0) last_use_[static_cast<size_t>(s)] = static_cast<int>(i);
  // A fresh model starts with the objectness and class prior, as the reference trainer sets it for
  // a fresh run (loaded weights overwrite it).
  init_biases(0.01);
}

void Yolo7Model::init_biases(double prior) {
  for (auto& h : heads_->heads) h->init_biases(prior);
}

void Yolo7Model::reset_num_classes(int nc) {
  for (auto& h : heads_->heads) h->reset_num_classes(nc);
}

void Yolo7Model::check_input(const torch::Tensor& x) const { check_stride32_input(x, "YOLOv7"); }

std::vector<torch::Tensor> Yolo7Model::run(const torch::Tensor& x) {
  std::vector<torch::Tensor> out(layers_.size());
  std::vector<torch::Tensor> maps;
  const auto in = [&](int s) -> const torch::Tensor& { return s == kInput ? x : out[static_cast<size_t>(s)]; };
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = layers_[i];
    switch (l.op) {
      case Op::Conv:
        out[i] = l.conv->forward(in(l.src[0]));
        break;
      case Op::Pool:
        out[i] = torch::max_pool2d(in(l.src[0]), {2, 2}, {2, 2});
        break;
      case Op::Upsample:
        out[i] = common::upsample2x(in(l.src[0]));
        break;
      case Op::Concat: {
        std::vector<torch::Tensor> parts;
        parts.reserve(l.src.size());
        for (int s : l.src) parts.push_back(in(s));
        out[i] = torch::cat(parts, 1);
        break;
      }
      case Op::SppCsp:
        out[i] = l.spp->forward(in(l.src[0]));
        break;
      case Op::RepConv:
        out[i] = l.rep->forward(in(l.src[0]));
        break;
      case Op::Detect:
        for (size_t k = 0; k < 3; ++k) maps.push_back(heads_->heads[k]->forward(in(l.src[k])));
        break;
    }
    // Outputs nobody reads any more are let go.
    for (int s : l.src) {
      const auto k = static_cast<size_t>(s);
      if (s >= 0 && last_use_[k] == static_cast<int>(i)) out[k] = torch::Tensor();
    }
  }
  return maps;
}

std::vector<torch::Tensor> Yolo7Model::forward_raw(const torch::Tensor& x) {
  check_input(x);
  return batched_.run_forward(x, [&] { return run(x); });
}

Grid make_grid(const LevelSizes& level_hw, const torch::Device& device) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  std::vector<torch::Tensor> cells, anchors, strides;
  for (size_t i = 0; i < level_hw.size(); ++i) {
    const int64_t h = level_hw[i][0], w = level_hw[i][1], a = kAnchorsPerCell;
    const auto gy = torch::arange(h, f32).view({1, h, 1}).expand({a, h, w}).reshape({1, -1});
    const auto gx = torch::arange(w, f32).view({1, 1, w}).expand({a, h, w}).reshape({1, -1});
    cells.push_back(torch::cat({gx, gy}, 0));
    std::vector<float> wh;
    for (const auto& anchor : kAnchors[i]) {
      wh.push_back(static_cast<float>(anchor[0]));
      wh.push_back(static_cast<float>(anchor[1]));
    }
    const auto per_anchor = torch::tensor(wh, f32).view({a, 2}).t().reshape({2, a, 1});  // [2, a, 1]
    anchors.push_back(per_anchor.expand({2, a, h * w}).reshape({2, -1}));
    strides.push_back(torch::full({1, a * h * w}, static_cast<float>(kStrides[i]), f32));
  }
  return {torch::cat(cells, 1).to(device), torch::cat(anchors, 1).to(device), torch::cat(strides, 1).to(device)};
}

torch::Tensor Yolo7Model::decode(const std::vector<torch::Tensor>& raw) {
  const int64_t nc = num_classes(), channels = 5 + nc;
  if (raw.size() != 3) throw UsageError(strfmt("YOLOv7 decode expects 3 level maps, got %zu", raw.size()));
  for (const auto& r : raw)
    if (r.dim() != 4 || r.size(1) != kAnchorsPerCell * channels || r.size(0) != raw[0].size(0))
      throw UsageError(strfmt("YOLOv7 decode expects maps [B, %lld, H, W], got ",
                              static_cast<long long>(kAnchorsPerCell * channels)) +
                       c10::str(r.sizes()));
  // Boxes in float32 even under autocast (bf16 cannot resolve pixel coordinates).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto dtype = raw[0].scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  const int64_t batch = raw[0].size(0);
  std::vector<torch::Tensor> flat;
  flat.reserve(raw.size());
  for (const auto& r : raw)  // [B, a (5 + nc), H, W] -> [B, 5 + nc, a H W]
    flat.push_back(r.reshape({batch, kAnchorsPerCell, channels, -1}).transpose(1, 2).reshape({batch, channels, -1}));
  const auto x = torch::sigmoid(torch::cat(flat, 2).to(dtype));  // [B, C, A]
  const Grid g = grids_.get(raw, [](const LevelSizes& sizes, c10::Device device) { return make_grid(sizes, device); });
  const auto cells = g.cells.to(dtype), anchors = g.anchors.to(dtype), st = g.strides.to(dtype);
  const auto xy = (x.narrow(1, 0, 2) * 2 - 0.5 + cells) * st;
  const auto wh = (x.narrow(1, 2, 2) * 2).pow(2) * anchors;
  const auto scores = x.narrow(1, 4, 1) * x.narrow(1, 5, nc);
  return torch::cat({xy - wh / 2, xy + wh / 2, scores}, 1);
}

}  // namespace libreyolo::models::yolo7
