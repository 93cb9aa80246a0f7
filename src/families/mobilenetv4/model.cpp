#include "families/mobilenetv4/model.hpp"

#include <cmath>

#include <libreyolo/errors.hpp>

namespace libreyolo::models::mobilenetv4 {

namespace nn = torch::nn;

namespace {

int64_t pad_of(int64_t k, int64_t stride) { return ((stride - 1) + (k - 1)) / 2; }

nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t groups = 1) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(pad_of(k, stride)).groups(groups).bias(false));
}

// A convolution and its BatchNorm as children "conv" and "bn", ReLU after or not.
class ConvNormImpl : public nn::Module {
 public:
  ConvNormImpl(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t groups, bool act) : act_(act) {
    conv_ = register_module("conv", conv(in, out, k, stride, groups));
    bn_ = register_module("bn", nn::BatchNorm2d(out));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = bn_(conv_(x));
    return act_ ? torch::relu(y) : y;
  }

 private:
  bool act_;
  nn::Conv2d conv_{nullptr};
  nn::BatchNorm2d bn_{nullptr};
};
TORCH_MODULE(ConvNorm);

class BlockImpl : public nn::Module {
 public:
  BlockImpl(const BlockSpec& s, int64_t in) : s_(s), skip_(in == s.out && s.stride == 1 && s.kind != BlockSpec::Cn) {
    switch (s.kind) {
      case BlockSpec::Cn:
        conv_ = register_module("conv", conv(in, s.out, s.kernel, s.stride));
        bn1_ = register_module("bn1", nn::BatchNorm2d(s.out));
        break;
      case BlockSpec::Er:
        conv_exp_ = register_module("conv_exp", conv(in, s.mid, s.kernel, s.stride));
        bn1_ = register_module("bn1", nn::BatchNorm2d(s.mid));
        conv_pwl_ = register_module("conv_pwl", conv(s.mid, s.out, 1, 1));
        bn2_ = register_module("bn2", nn::BatchNorm2d(s.out));
        break;
      case BlockSpec::Uir:
        if (s.start_kernel > 0)
          dw_start_ = register_module(
              "dw_start", ConvNorm(in, in, s.start_kernel, s.kernel > 0 ? 1 : s.stride, in, false));
        pw_exp_ = register_module("pw_exp", ConvNorm(in, s.mid, 1, 1, 1, true));
        if (s.kernel > 0) dw_mid_ = register_module("dw_mid", ConvNorm(s.mid, s.mid, s.kernel, s.stride, s.mid, true));
        pw_proj_ = register_module("pw_proj", ConvNorm(s.mid, s.out, 1, 1, 1, false));
        break;
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y;
    switch (s_.kind) {
      case BlockSpec::Cn:
        return torch::relu(bn1_(conv_(x)));
      case BlockSpec::Er:
        y = bn2_(conv_pwl_(torch::relu(bn1_(conv_exp_(x)))));
        break;
      case BlockSpec::Uir:
        y = dw_start_ ? dw_start_(x) : x;
        y = pw_exp_(y);
        if (dw_mid_) y = dw_mid_(y);
        y = pw_proj_(y);
        break;
    }
    return skip_ ? y + x : y;
  }

 private:
  BlockSpec s_;
  bool skip_;
  nn::Conv2d conv_{nullptr}, conv_exp_{nullptr}, conv_pwl_{nullptr};
  nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  ConvNorm dw_start_{nullptr}, pw_exp_{nullptr}, dw_mid_{nullptr}, pw_proj_{nullptr};
};
TORCH_MODULE(Block);

// One stage written as LibreYOLO's block strings: {kind, repeats, start kernel, kernel, stride, expansion, out}.
struct Row {
  BlockSpec::Kind kind;
  int repeats;
  int64_t a, k, s;
  double e;
  int64_t c;
};

std::vector<std::vector<Row>> rows_of(const std::string& size) {
  using K = BlockSpec::Kind;
  if (size == "s")
    return {{{K::Cn, 1, 0, 3, 2, 1, 32}, {K::Cn, 1, 0, 1, 1, 1, 32}},
            {{K::Cn, 1, 0, 3, 2, 1, 96}, {K::Cn, 1, 0, 1, 1, 1, 64}},
            {{K::Uir, 1, 5, 5, 2, 3, 96}, {K::Uir, 4, 0, 3, 1, 2, 96}, {K::Uir, 1, 3, 0, 1, 4, 96}},
            {{K::Uir, 1, 3, 3, 2, 6, 128},
             {K::Uir, 1, 5, 5, 1, 4, 128},
             {K::Uir, 1, 0, 5, 1, 4, 128},
             {K::Uir, 1, 0, 5, 1, 3, 128},
             {K::Uir, 2, 0, 3, 1, 4, 128}},
            {{K::Cn, 1, 0, 1, 1, 1, 960}}};
  if (size == "m")
    return {{{K::Er, 1, 0, 3, 2, 4, 48}},
            {{K::Uir, 1, 3, 5, 2, 4, 80}, {K::Uir, 1, 3, 3, 1, 2, 80}},
            {{K::Uir, 1, 3, 5, 2, 6, 160},
             {K::Uir, 2, 3, 3, 1, 4, 160},
             {K::Uir, 1, 3, 5, 1, 4, 160},
             {K::Uir, 1, 3, 3, 1, 4, 160},
             {K::Uir, 1, 3, 0, 1, 4, 160},
             {K::Uir, 1, 0, 0, 1, 2, 160},
             {K::Uir, 1, 3, 0, 1, 4, 160}},
            {{K::Uir, 1, 5, 5, 2, 6, 256},
             {K::Uir, 1, 5, 5, 1, 4, 256},
             {K::Uir, 2, 3, 5, 1, 4, 256},
             {K::Uir, 1, 0, 0, 1, 4, 256},
             {K::Uir, 1, 3, 0, 1, 4, 256},
             {K::Uir, 1, 3, 5, 1, 2, 256},
             {K::Uir, 1, 5, 5, 1, 4, 256},
             {K::Uir, 2, 0, 0, 1, 4, 256},
             {K::Uir, 1, 5, 0, 1, 2, 256}},
            {{K::Cn, 1, 0, 1, 1, 1, 960}}};
  if (size == "l")
    return {{{K::Er, 1, 0, 3, 2, 4, 48}},
            {{K::Uir, 1, 3, 5, 2, 4, 96}, {K::Uir, 1, 3, 3, 1, 4, 96}},
            {{K::Uir, 1, 3, 5, 2, 4, 192},
             {K::Uir, 3, 3, 3, 1, 4, 192},
             {K::Uir, 1, 3, 5, 1, 4, 192},
             {K::Uir, 5, 5, 3, 1, 4, 192},
             {K::Uir, 1, 3, 0, 1, 4, 192}},
            {{K::Uir, 4, 5, 5, 2, 4, 512},
             {K::Uir, 1, 5, 0, 1, 4, 512},
             {K::Uir, 1, 5, 3, 1, 4, 512},
             {K::Uir, 2, 5, 0, 1, 4, 512},
             {K::Uir, 1, 5, 3, 1, 4, 512},
             {K::Uir, 1, 5, 5, 1, 4, 512},
             {K::Uir, 3, 5, 0, 1, 4, 512}},
            {{K::Cn, 1, 0, 1, 1, 1, 960}}};
  throw UsageError("Unknown MobileNetV4 size '" + size + "' (sizes: s, m, l)");
}

}  // namespace

int64_t make_divisible(double v, int64_t divisor) {
  int64_t n = std::max<int64_t>(divisor, static_cast<int64_t>(v + static_cast<double>(divisor) / 2) / divisor * divisor);
  if (static_cast<double>(n) < 0.9 * v) n += divisor;
  return n;
}

const std::vector<std::string>& size_names() {
  static const std::vector<std::string> names = {"s", "m", "l"};
  return names;
}

int size_input(const std::string& size) { return size == "l" ? 256 : 224; }
double size_crop_pct(const std::string& size) { return size == "s" ? 0.875 : 0.95; }

Arch size_arch(const std::string& size) {
  Arch a;
  a.stem = size == "l" ? 24 : 32;
  int64_t in = a.stem;
  for (const auto& stage : rows_of(size)) {
    std::vector<BlockSpec> blocks;
    for (const auto& r : stage)
      for (int i = 0; i < r.repeats; ++i) {
        BlockSpec b;
        b.kind = r.kind;
        b.kernel = r.k;
        b.start_kernel = r.a;
        b.stride = blocks.empty() ? r.s : 1;
        b.out = make_divisible(static_cast<double>(r.c));
        b.mid = r.kind == BlockSpec::Cn ? 0 : make_divisible(static_cast<double>(in) * r.e);
        blocks.push_back(b);
        in = b.out;
      }
    a.stages.push_back(blocks);
  }
  return a;
}

MobileNetV4Model::MobileNetV4Model(const Arch& arch, int nc, std::string size_name)
    : Classifier("MobileNetV4", nc, std::move(size_name)), arch_(arch) {
  conv_stem = register_module("conv_stem", conv(3, arch.stem, 3, 2));
  bn1 = register_module("bn1", nn::BatchNorm2d(arch.stem));
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
  norm_head = register_module("norm_head", nn::BatchNorm2d(arch.head));
  register_head("classifier", arch.head);
}

torch::Tensor MobileNetV4Model::features(const torch::Tensor& x) {
  auto y = torch::relu(bn1(conv_stem(x)));
  for (auto& stage : stages_) y = stage->forward(y);
  return y;
}

torch::Tensor MobileNetV4Model::logits(const torch::Tensor& x) {
  if (x.dim() != 4 || x.size(1) != 3) throw UsageError("MobileNetV4: expected an image batch [B, 3, H, W]");
  auto y = features(x).mean({2, 3}, /*keepdim=*/true);
  y = torch::relu(norm_head(conv_head(y)));
  return head(y.flatten(1));
}

std::vector<std::string> MobileNetV4Model::freeze_groups() const {
  std::vector<std::string> g = {"conv_stem.", "bn1."};
  for (size_t i = 0; i < arch_.stages.size(); ++i) g.push_back("blocks." + std::to_string(i) + ".");
  return g;
}

}  // namespace libreyolo::models::mobilenetv4
