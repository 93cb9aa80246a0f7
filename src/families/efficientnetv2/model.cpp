#include "families/efficientnetv2/model.hpp"

#include <cmath>

#include <libreyolo/errors.hpp>

namespace libreyolo::models::efficientnetv2 {

namespace nn = torch::nn;

namespace {

constexpr double kBnEps = 1e-3;

nn::BatchNorm2d bn(int64_t c) { return nn::BatchNorm2d(nn::BatchNorm2dOptions(c).eps(kBnEps)); }

// Stride 1: static symmetric padding; stride 2: none here, the input padded at run time (same()).
nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t groups = 1, bool bias = false) {
  return nn::Conv2d(
      nn::Conv2dOptions(in, out, k).stride(stride).padding(stride == 1 ? (k - 1) / 2 : 0).groups(groups).bias(bias));
}

// TensorFlow's "SAME" padding of a stride-s convolution: total max((ceil(x / s) - 1) s + k - x, 0)
// per side pair, the smaller half before.
torch::Tensor same(const torch::Tensor& x, int64_t k, int64_t s) {
  if (s == 1) return x;
  const auto pad = [&](int64_t n) { return std::max<int64_t>(((n + s - 1) / s - 1) * s + k - n, 0); };
  const int64_t ph = pad(x.size(2)), pw = pad(x.size(3));
  if (ph == 0 && pw == 0) return x;
  return torch::constant_pad_nd(x, {pw / 2, pw - pw / 2, ph / 2, ph - ph / 2}, 0);
}

class SqueezeExciteImpl : public nn::Module {
 public:
  SqueezeExciteImpl(int64_t c, int64_t rd) {
    conv_reduce = register_module("conv_reduce", nn::Conv2d(nn::Conv2dOptions(c, rd, 1).bias(true)));
    conv_expand = register_module("conv_expand", nn::Conv2d(nn::Conv2dOptions(rd, c, 1).bias(true)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto s = conv_expand(torch::silu(conv_reduce(x.mean({2, 3}, true))));
    return x * torch::sigmoid(s);
  }
  nn::Conv2d conv_reduce{nullptr}, conv_expand{nullptr};
};
TORCH_MODULE(SqueezeExcite);

class BlockImpl : public nn::Module {
 public:
  BlockImpl(const BlockSpec& s, int64_t in) : s_(s), skip_(s.skip && in == s.out && s.stride == 1) {
    switch (s.kind) {
      case BlockSpec::Cn:
        conv_ = register_module("conv", conv(in, s.out, s.kernel, s.stride));
        bn1_ = register_module("bn1", bn(s.out));
        break;
      case BlockSpec::Er:
        conv_exp_ = register_module("conv_exp", conv(in, s.mid, s.kernel, s.stride));
        bn1_ = register_module("bn1", bn(s.mid));
        conv_pwl_ = register_module("conv_pwl", conv(s.mid, s.out, 1, 1));
        bn2_ = register_module("bn2", bn(s.out));
        break;
      case BlockSpec::Ir:
        conv_pw_ = register_module("conv_pw", conv(in, s.mid, 1, 1));
        bn1_ = register_module("bn1", bn(s.mid));
        conv_dw_ = register_module("conv_dw", conv(s.mid, s.mid, s.kernel, s.stride, s.mid));
        bn2_ = register_module("bn2", bn(s.mid));
        if (s.se > 0) se_ = register_module("se", SqueezeExcite(s.mid, s.se));
        conv_pwl_ = register_module("conv_pwl", conv(s.mid, s.out, 1, 1));
        bn3_ = register_module("bn3", bn(s.out));
        break;
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y;
    switch (s_.kind) {
      case BlockSpec::Cn:
        y = torch::silu(bn1_(conv_(same(x, s_.kernel, s_.stride))));
        break;
      case BlockSpec::Er:
        y = torch::silu(bn1_(conv_exp_(same(x, s_.kernel, s_.stride))));
        y = bn2_(conv_pwl_(y));
        break;
      case BlockSpec::Ir:
        y = torch::silu(bn1_(conv_pw_(x)));
        y = torch::silu(bn2_(conv_dw_(same(y, s_.kernel, s_.stride))));
        if (se_) y = se_(y);
        y = bn3_(conv_pwl_(y));
        break;
    }
    return skip_ ? y + x : y;
  }

 private:
  BlockSpec s_;
  bool skip_;
  nn::Conv2d conv_{nullptr}, conv_exp_{nullptr}, conv_pwl_{nullptr}, conv_pw_{nullptr}, conv_dw_{nullptr};
  nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr};
  SqueezeExcite se_{nullptr};
};
TORCH_MODULE(Block);

int64_t make_divisible(double v, double round_limit) {
  int64_t n = std::max<int64_t>(8, static_cast<int64_t>(v + 4.0) / 8 * 8);
  if (static_cast<double>(n) < round_limit * v) n += 8;
  return n;
}

struct SizeRow {
  const char* name;
  double channel_mult;
  std::array<int, 6> depth;
  int input;
  double crop;
};

const std::vector<SizeRow>& size_table() {
  static const std::vector<SizeRow> rows = {
      {"b0", 1.0, {1, 2, 2, 3, 5, 8}, 224, 0.875},
      {"b1", 1.0, {2, 3, 3, 4, 6, 9}, 240, 0.882},
      {"b2", 1.1, {2, 3, 3, 4, 6, 10}, 260, 0.890},
      {"b3", 1.2, {2, 3, 3, 5, 7, 12}, 300, 0.904},
  };
  return rows;
}

const SizeRow& row_of(const std::string& size) {
  for (const auto& r : size_table())
    if (size == r.name) return r;
  throw UsageError("Unknown EfficientNetV2 size '" + size + "' (sizes: b0, b1, b2, b3)");
}

}  // namespace

int64_t stage_stride(size_t stage) {
  static const int64_t strides[6] = {1, 2, 2, 2, 1, 2};
  return stage < 6 ? strides[stage] : 1;
}

const std::vector<std::string>& size_names() {
  static const std::vector<std::string> names = {"b0", "b1", "b2", "b3"};
  return names;
}

int size_input(const std::string& size) { return row_of(size).input; }
double size_crop_pct(const std::string& size) { return row_of(size).crop; }

Arch size_arch(const std::string& size) {
  const SizeRow& r = row_of(size);
  // The base stages: kind, kernel, expansion, out channels, squeeze-excite ratio.
  struct Stage {
    BlockSpec::Kind kind;
    double e;
    int64_t c;
    double se;
  };
  static const Stage stages[6] = {{BlockSpec::Cn, 1, 16, 0},  {BlockSpec::Er, 4, 32, 0},     {BlockSpec::Er, 4, 48, 0},
                                  {BlockSpec::Ir, 4, 96, 0.25}, {BlockSpec::Ir, 6, 112, 0.25}, {BlockSpec::Ir, 6, 192, 0.25}};
  Arch a;
  a.stem = make_divisible(32 * r.channel_mult, 0.0);
  a.head = make_divisible(1280 * r.channel_mult, 0.0);
  int64_t in = a.stem;
  for (size_t i = 0; i < 6; ++i) {
    std::vector<BlockSpec> blocks;
    for (int j = 0; j < r.depth[i]; ++j) {
      BlockSpec b;
      b.kind = stages[i].kind;
      b.kernel = 3;
      b.stride = j == 0 ? stage_stride(i) : 1;
      b.out = make_divisible(static_cast<double>(stages[i].c) * r.channel_mult, 0.0);
      b.skip = true;  // "cn" carries the skip flag; er and ir have the residual by default
      if (b.kind != BlockSpec::Cn) b.mid = make_divisible(static_cast<double>(in) * stages[i].e, 0.9);
      if (stages[i].se > 0)
        b.se = static_cast<int64_t>(std::nearbyint(static_cast<double>(b.mid) * (stages[i].se / stages[i].e)));
      blocks.push_back(b);
      in = b.out;
    }
    a.stages.push_back(blocks);
  }
  return a;
}

EfficientNetV2Model::EfficientNetV2Model(const Arch& arch, int nc, std::string size_name)
    : Classifier("EfficientNetV2", nc, std::move(size_name)), arch_(arch) {
  conv_stem = register_module("conv_stem", conv(3, arch.stem, 3, 2));
  bn1 = register_module("bn1", bn(arch.stem));
  blocks = nn::ModuleList();
  int64_t in = arch.stem;
  for (const auto& stage : arch.stages) {
    nn::Sequential seq;
    for (const auto& b : stage) {
      seq->push_back(Block(b, in));
      in = b.out;
    }
    blocks->push_back(seq);
    stages_.push_back(seq);
  }
  register_module("blocks", blocks);
  conv_head = register_module("conv_head", conv(in, arch.head, 1, 1));
  bn2 = register_module("bn2", bn(arch.head));
  register_head("classifier", arch.head);
}

torch::Tensor EfficientNetV2Model::features(const torch::Tensor& x) {
  auto y = torch::silu(bn1(conv_stem(same(x, 3, 2))));
  for (auto& stage : stages_) y = stage->forward(y);
  return torch::silu(bn2(conv_head(y)));
}

torch::Tensor EfficientNetV2Model::logits(const torch::Tensor& x) {
  if (x.dim() != 4 || x.size(1) != 3) throw UsageError("EfficientNetV2: expected an image batch [B, 3, H, W]");
  return head(features(x).mean({2, 3}));
}

std::vector<std::string> EfficientNetV2Model::freeze_groups() const {
  std::vector<std::string> g = {"conv_stem.", "bn1."};
  for (size_t i = 0; i < arch_.stages.size(); ++i) g.push_back("blocks." + std::to_string(i) + ".");
  return g;
}

}  // namespace libreyolo::models::efficientnetv2
