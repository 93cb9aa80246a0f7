#include "families/picodet/model.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cmath>

#include "core/log.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::models::picodet {

namespace {

std::shared_ptr<torch::nn::Module> container() { return std::make_shared<torch::nn::Module>(); }

// v rounded to the nearest multiple of d (at least d), one d more when that loses over 10%.
int64_t make_divisible(double v, int64_t d) {
  int64_t n = std::max<int64_t>(d, static_cast<int64_t>(v + d / 2.0) / d * d);
  if (static_cast<double>(n) < 0.9 * v) n += d;
  return n;
}

// LibreYOLO's size table: ESNet's scale and per-block middle-width ratios, the neck/head width and
// the head's tower depth.
struct SizeRow {
  const char* name;
  double scale;
  std::array<double, kBlocks> ratio;
  int64_t width, stacked_convs;
  int input;
};
const SizeRow kSizes[] = {
    {"s", 0.75, {0.875, 0.5, 0.5, 0.5, 0.625, 0.5, 0.625, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5}, 96, 2, 320},
    {"m", 1.0, {0.875, 0.5, 1.0, 0.625, 0.5, 0.75, 0.625, 0.625, 0.5, 0.625, 1.0, 0.625, 0.75}, 128, 4, 416},
    {"l", 1.25, {0.875, 0.5, 1.0, 0.625, 0.5, 0.75, 0.625, 0.625, 0.5, 0.625, 1.0, 0.625, 0.75}, 160, 4, 640},
};

// Blocks per stage (3, 7, 3): the stage of block i.
int stage_of(int block) { return block < 3 ? 0 : (block < 10 ? 1 : 2); }

Arch arch_of(const SizeRow& r) {
  Arch a;
  const double base[3] = {128, 256, 512};
  for (int i = 0; i < 3; ++i) a.stage[i] = make_divisible(base[i] * r.scale, 16);
  for (int b = 0; b < kBlocks; ++b)
    a.mid[b] = make_divisible(static_cast<double>(static_cast<int64_t>(static_cast<double>(a.stage[stage_of(b)]) * r.ratio[b])), 8);
  a.width = r.width;
  a.stacked_convs = r.stacked_convs;
  return a;
}

torch::nn::Conv2d prediction_conv(int64_t cin, int64_t cout) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(cin, cout, 1).bias(true));
}

const double kClsPriorBias = -std::log((1.0 - 0.01) / 0.01);

// N(0, 0.01) weight, zero bias, the class rows of the bias at the prior.
void init_prediction_conv(torch::nn::Conv2d& c, int nc) {
  torch::NoGradGuard no_grad;
  c->weight.normal_(0.0, 0.01);
  c->bias.zero_();
  c->bias.narrow(0, 0, nc).fill_(kClsPriorBias);
}

// Every convolution and BatchNorm under m: Kaiming-normal (fan out, ReLU) or N(0, 0.01) weights.
void init_convs_and_norms(torch::nn::Module& m, bool kaiming) {
  torch::NoGradGuard no_grad;
  for (auto& sub : m.modules(/*include_self=*/true)) {
    if (auto* conv = sub->as<torch::nn::Conv2d>()) {
      if (kaiming)
        torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
      else
        conv->weight.normal_(0.0, 0.01);
      if (conv->bias.defined()) conv->bias.zero_();
    } else if (auto* bn = sub->as<torch::nn::BatchNorm2d>()) {
      bn->weight.fill_(1.0);
      bn->bias.zero_();
    }
  }
}

}  // namespace

bool Arch::operator==(const Arch& o) const {
  return stage == o.stage && mid == o.mid && width == o.width && stacked_convs == o.stacked_convs;
}

const std::vector<std::string>& size_names() {
  static const std::vector<std::string> names = {"s", "m", "l"};
  return names;
}

Arch size_arch(const std::string& size) {
  for (const auto& r : kSizes)
    if (size == r.name) return arch_of(r);
  throw UsageError("unknown PicoDet size '" + size + "'", "use one of s, m, l", "model_unknown_size");
}

std::optional<std::string> size_of_width(int64_t width) {
  for (const auto& r : kSizes)
    if (r.width == width) return std::string(r.name);
  return std::nullopt;
}

int size_input(const std::string& size) {
  for (const auto& r : kSizes)
    if (size == r.name) return r.input;
  throw UsageError("unknown PicoDet size '" + size + "'", "use one of s, m, l", "model_unknown_size");
}

bool is_downsample_block(int block) { return block == 0 || block == 3 || block == 10; }

// ---------------------------------------------------------------------------------- the model

PicoDetModel::PicoDetModel(const Arch& a, int nc) : arch_(a), nc_(nc) {
  if (nc < 1) throw UsageError(strfmt("number of classes must be >= 1, got %d", nc));
  if (a.width < 2 || a.stacked_convs < 0) throw UsageError("PicoDet widths must be >= 2");
  for (int i = 0; i < 3; ++i)
    if (a.stage[i] < 2) throw UsageError("PicoDet stage widths must be >= 2");
  for (int b = 0; b < kBlocks; ++b)
    if (a.mid[b] < 2) throw UsageError("PicoDet block widths must be >= 2");

  auto backbone = register_module("backbone", container());
  stem_ = backbone->register_module("conv1", ConvBnHs(3, kStemChannels, 3, 2));
  auto blocks = backbone->register_module("blocks", container());
  int64_t cin = kStemChannels;
  for (int b = 0; b < kBlocks; ++b) {
    const int64_t cout = a.stage[stage_of(b)];
    if (is_downsample_block(b))
      blocks_.push_back(blocks->register_module(std::to_string(b), ESBlockDS(cin, a.mid[b], cout)));
    else
      blocks_.push_back(blocks->register_module(std::to_string(b), ESBlock(cout, a.mid[b], cout)));
    cin = cout;
  }

  const int64_t w = a.width;
  auto neck = register_module("neck", container());
  auto trans = neck->register_module("trans", container());
  for (int i = 0; i < 3; ++i) trans_[i] = trans->register_module(std::to_string(i), ConvBnHs(a.stage[i], w, 1));
  first_top_ = neck->register_module("first_top_conv", DepthwiseSeparable(w, w, 5, 2));
  second_top_ = neck->register_module("second_top_conv", DepthwiseSeparable(w, w, 5, 2));
  auto top_down = neck->register_module("top_down_blocks", container());
  for (int i = 0; i < 2; ++i) top_down_[i] = top_down->register_module(std::to_string(i), CSPLayer(2 * w, w, 1));
  auto downsamples = neck->register_module("downsamples", container());
  auto bottom_up = neck->register_module("bottom_up_blocks", container());
  for (int i = 0; i < 2; ++i) downsample_[i] = downsamples->register_module(std::to_string(i), DepthwiseSeparable(w, w, 5, 2));
  for (int i = 0; i < 2; ++i) bottom_up_[i] = bottom_up->register_module(std::to_string(i), CSPLayer(2 * w, w, 1));

  auto head = register_module("head", container());
  auto cls_convs = head->register_module("cls_convs", container());
  head->register_module("reg_convs", container());  // LibreYOLO's empty per-level lists: no tensors
  gfl_cls_list_ = head->register_module("gfl_cls", container());
  for (size_t l = 0; l < kStrides.size(); ++l) {
    auto tower = cls_convs->register_module(std::to_string(l), container());
    std::vector<DepthwiseSeparable> convs;
    for (int64_t i = 0; i < a.stacked_convs; ++i)
      convs.push_back(tower->register_module(std::to_string(i), DepthwiseSeparable(w, w, 5)));
    cls_convs_.push_back(std::move(convs));
    gfl_cls_.push_back(gfl_cls_list_->register_module(std::to_string(l), prediction_conv(w, nc + kBoxChannels)));
  }
  init_weights();
}

void PicoDetModel::init_weights() {
  for (const auto& child : named_children()) init_convs_and_norms(*child.value(), child.key() != "head");
  for (auto& c : gfl_cls_) init_prediction_conv(c, nc_);
}

std::string PicoDetModel::size() const {
  for (const auto& name : size_names())
    if (size_arch(name) == arch_) return name;
  if (auto s = size_of_width(arch_.width)) return *s;
  return "s";
}

void PicoDetModel::reset_num_classes(int new_nc) {
  if (new_nc < 1) throw UsageError(strfmt("number of classes must be >= 1, got %d", new_nc));
  if (new_nc == nc_) return;
  nc_ = new_nc;
  for (size_t l = 0; l < gfl_cls_.size(); ++l) {
    const auto device = gfl_cls_[l]->weight.device();
    const auto dtype = gfl_cls_[l]->weight.scalar_type();
    auto conv = prediction_conv(arch_.width, nc_ + kBoxChannels);
    init_prediction_conv(conv, nc_);
    conv->to(device, dtype);
    gfl_cls_[l] = gfl_cls_list_->replace_module(std::to_string(l), conv);
  }
}

namespace {

// The top-down path's upsampling: nearest 2x, then (a map of an odd side below) nearest to the
// size of the map it joins.
torch::Tensor upsample_to(const torch::Tensor& x, const torch::Tensor& like) {
  auto up = at::upsample_nearest2d(x, {2 * x.size(2), 2 * x.size(3)});
  if (up.size(2) != like.size(2) || up.size(3) != like.size(3))
    up = at::upsample_nearest2d(up, {like.size(2), like.size(3)});
  return up;
}

}  // namespace

std::vector<torch::Tensor> PicoDetModel::neck_forward(const std::array<torch::Tensor, 3>& c) {
  const auto f3 = trans_[0]->forward(c[0]), f4 = trans_[1]->forward(c[1]), f5 = trans_[2]->forward(c[2]);
  const auto t4 = top_down_[0]->forward(torch::cat({upsample_to(f5, f4), f4}, 1));
  const auto p3 = top_down_[1]->forward(torch::cat({upsample_to(t4, f3), f3}, 1));
  const auto n4 = bottom_up_[0]->forward(torch::cat({downsample_[0]->forward(p3), t4}, 1));
  const auto n5 = bottom_up_[1]->forward(torch::cat({downsample_[1]->forward(n4), f5}, 1));
  const auto n6 = first_top_->forward(f5) + second_top_->forward(n5);
  return {p3, n4, n5, n6};
}

std::vector<torch::Tensor> PicoDetModel::forward_raw(const torch::Tensor& x) {
  if (x.dim() != 4 || x.size(1) != 3 || x.size(2) < 1 || x.size(3) < 1)
    throw UsageError("PicoDet expects an image batch [B, 3, H, W], got " + c10::str(x.sizes()));
  auto y = at::max_pool2d(stem_->forward(x), {3, 3}, {2, 2}, {1, 1});
  std::array<torch::Tensor, 3> c;
  for (int b = 0; b < kBlocks; ++b) {
    if (is_downsample_block(b))
      y = std::static_pointer_cast<ESBlockDSImpl>(blocks_[static_cast<size_t>(b)])->forward(y);
    else
      y = std::static_pointer_cast<ESBlockImpl>(blocks_[static_cast<size_t>(b)])->forward(y);
    if (b == 2) c[0] = y;
    if (b == 9) c[1] = y;
    if (b == 12) c[2] = y;
  }
  auto levels = neck_forward(c);
  std::vector<torch::Tensor> maps;
  maps.reserve(levels.size());
  for (size_t l = 0; l < levels.size(); ++l) {
    auto h = levels[l];
    for (auto& conv : cls_convs_[l]) h = conv->forward(h);
    maps.push_back(gfl_cls_[l]->forward(h));
  }
  return maps;
}

namespace {

// ((x + 0.5) s, (y + 0.5) s, s) of every cell of every level, level-major then row-major: [3, A].
torch::Tensor make_priors(const LevelSizes& level_hw, const torch::Device& device) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  std::vector<torch::Tensor> parts;
  for (size_t i = 0; i < level_hw.size(); ++i) {
    const int64_t h = level_hw[i][0], w = level_hw[i][1];
    const float s = static_cast<float>(kStrides[i]);
    const auto cx = ((torch::arange(w, f32) + 0.5f) * s).view({1, w}).expand({h, w}).reshape({1, -1});
    const auto cy = ((torch::arange(h, f32) + 0.5f) * s).view({h, 1}).expand({h, w}).reshape({1, -1});
    parts.push_back(torch::cat({cx, cy, torch::full({1, h * w}, s, f32)}, 0));
  }
  return torch::cat(parts, 1).to(device);
}

}  // namespace

torch::Tensor PicoDetModel::decode(const std::vector<torch::Tensor>& raw) {
  const int64_t nc = nc_, channels = nc + kBoxChannels;
  if (raw.size() != kStrides.size())
    throw UsageError(strfmt("PicoDet decode expects 4 level maps, got %zu", raw.size()));
  for (const auto& r : raw)
    if (r.dim() != 4 || r.size(1) != channels || r.size(0) != raw[0].size(0))
      throw UsageError(strfmt("PicoDet decode expects maps [B, %lld, H, W], got ", static_cast<long long>(channels)) +
                       c10::str(r.sizes()));
  // Boxes in float32 even under autocast (bf16 cannot resolve pixel coordinates).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto dtype = raw[0].scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  const int64_t batch = raw[0].size(0);
  std::vector<torch::Tensor> flat;
  flat.reserve(raw.size());
  for (const auto& r : raw) flat.push_back(r.reshape({batch, channels, -1}));
  const auto x = torch::cat(flat, 2).to(dtype);  // [B, nc + 32, A]
  const int64_t a = x.size(2);
  const auto priors = priors_.get(raw, [](const LevelSizes& sizes, c10::Device device) {
    return make_priors(sizes, device);
  }).to(dtype);  // [3, A]
  const auto bins = torch::arange(kRegMax + 1, x.options()).view({1, 1, kRegMax + 1, 1});
  const auto prob = torch::softmax(x.narrow(1, nc, kBoxChannels).reshape({batch, 4, kRegMax + 1, a}), 2);
  const auto dist = (prob * bins).sum(2) * priors.narrow(0, 2, 1);  // [B, 4, A] in pixels
  const auto centre = priors.narrow(0, 0, 2);
  return torch::cat({centre - dist.narrow(1, 0, 2), centre + dist.narrow(1, 2, 2), torch::sigmoid(x.narrow(1, 0, nc))}, 1);
}

}  // namespace libreyolo::models::picodet
