// The picodet registry entry: building, recognising and sizing PicoDet weights (LibreYOLO's and
// the mmdetection-style names of the Bo396543018/Picodet_Pytorch port), its recipe, its input
// convention (RGB stretched to S x S, minus the ImageNet mean over its standard deviation in 0-255
// space) and its per-level multi-label postprocess.

#include <algorithm>
#include <cmath>
#include <regex>

#include "core/log.hpp"
#include "core/strings.hpp"
#include "families/picodet/loss.hpp"
#include "families/picodet/model.hpp"
#include "libreyolo/errors.hpp"
#include "loss/loss.hpp"
#include "ops/nms.hpp"
#include "ops/postprocess.hpp"

namespace libreyolo::models::picodet {

namespace {

// Candidates each level keeps before NMS.
constexpr int64_t kNmsPre = 1000;

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// The upstream port numbers ESNet's blocks "<stage>_<i>" (stages 2, 3, 4 of 3, 7 and 3 blocks,
// i from 1): the flat block index, or -1.
int flat_block(int stage, int i) {
  static const int first[3] = {0, 3, 10}, count[3] = {3, 7, 3};
  if (stage < 2 || stage > 4 || i < 1 || i > count[stage - 2]) return -1;
  return first[stage - 2] + i - 1;
}

// Without DDP's prefix, the upstream port's names as LibreYOLO's: "bbox_head." -> "head.",
// "backbone.<stage>_<i>." -> "backbone.blocks.<flat>.", "neck.trans.trans." -> "neck.trans.",
// ".se.convK.conv." -> ".se.convK.".
std::string canonical_key(const std::string& key) {
  std::string k = io::strip_ddp_prefix(key);
  if (starts_with(k, "bbox_head.")) k = "head." + k.substr(10);
  static const std::regex block(R"(^backbone\.(\d+)_(\d+)\.)");
  std::smatch m;
  if (std::regex_search(k, m, block)) {
    const int flat = flat_block(std::stoi(m[1].str()), std::stoi(m[2].str()));
    if (flat >= 0) k = "backbone.blocks." + std::to_string(flat) + "." + m.suffix().str();
  }
  if (starts_with(k, "neck.trans.trans.")) k = "neck.trans." + k.substr(17);
  static const std::regex se(R"(\.se\.conv([12])\.conv\.)");
  return std::regex_replace(k, se, ".se.conv$1.");
}

// A head whose single per-level prediction convolution is "gfl_cls" and an ESNet block list.
bool can_load(const io::StateDict& sd) {
  bool gfl = false, esnet = false;
  for (const auto& kv : sd) {
    const std::string k = canonical_key(kv.first);
    gfl = gfl || contains(k, "head.gfl_cls");
    esnet = esnet || contains(k, "backbone.blocks");
  }
  return gfl && esnet;
}

// LibreYOLO's names; the upstream port's EMA copies ("ema_*") and its fixed DFL projection
// ("integral.project") dropped.
void normalize_keys(io::StateDict& sd) {
  io::StateDict out;
  out.reserve(sd.size());
  for (auto& kv : sd) {
    const std::string k = canonical_key(kv.first);
    if (starts_with(k, "ema_") || contains(k, "integral.project")) continue;
    out.emplace_back(k, kv.second);
  }
  sd = std::move(out);
}

const torch::Tensor* tensor(const io::StateDict& sd, const std::string& key) {
  return io::find_tensor(sd, key, canonical_key);
}

std::optional<int64_t> out_channels(const io::StateDict& sd, const std::string& key) {
  return io::leading_dim(sd, key, canonical_key);
}

std::optional<std::string> infer_size(const io::StateDict& sd) {
  const auto c = out_channels(sd, "neck.trans.0.conv.weight");
  if (!c) return std::nullopt;
  return size_of_width(*c);
}

// gfl_cls carries nc class rows and 32 box rows.
std::optional<int> infer_num_classes(const io::StateDict& sd) {
  if (auto n = out_channels(sd, "head.gfl_cls.0.weight"); n && *n > kBoxChannels)
    return static_cast<int>(*n - kBoxChannels);
  return std::nullopt;
}

// Every width from the tensors' shapes, the head's depth from its tower's length.
Arch arch_from_weights(const io::StateDict& sd) {
  const auto need = [&](const std::string& key, int64_t dim) {
    const torch::Tensor* t = tensor(sd, key);
    if (!t || t->dim() <= dim) throw ModelError("cannot tell the PicoDet widths from the weights (" + key + " missing)");
    return t->size(dim);
  };
  Arch a;
  for (int i = 0; i < 3; ++i) a.stage[i] = need("neck.trans." + std::to_string(i) + ".conv.weight", 1);
  for (int b = 0; b < kBlocks; ++b)
    a.mid[b] = 2 * need("backbone.blocks." + std::to_string(b) + (is_downsample_block(b) ? ".conv_pw_2" : ".conv_pw") +
                            ".conv.weight",
                        0);
  a.width = need("neck.trans.0.conv.weight", 0);
  while (tensor(sd, "head.cls_convs.0." + std::to_string(a.stacked_convs) + ".depthwise_conv.conv.weight"))
    ++a.stacked_convs;
  return a;
}

std::shared_ptr<Detector> build(const std::string& size, int nc) {
  return std::make_shared<PicoDetModel>(size_arch(size), nc);
}

std::shared_ptr<Detector> build_like(const io::StateDict& sd, int nc) {
  const Arch a = arch_from_weights(sd);
  nc = class_count(nc, nc > 0 ? std::nullopt : infer_num_classes(sd), "PicoDet");
  return std::make_shared<PicoDetModel>(a, nc);
}

std::unique_ptr<TrainingLoss> make_loss(const Detector& model) {
  return std::make_unique<PicodetLoss>(model.num_classes());
}

// The four levels' cell counts of A predictions from a square input: the stride-8 side n gives
// sides n, ceil(n/2), ceil(n/4), ceil(n/8) (each stride-2 layer rounds up).
std::array<int64_t, 4> level_counts(int64_t a) {
  for (int64_t n = 1;; ++n) {
    std::array<int64_t, 4> c{};
    int64_t total = 0;
    for (int i = 0; i < 4; ++i) {
      const int64_t side = (n + (int64_t{1} << i) - 1) >> i;
      c[static_cast<size_t>(i)] = side * side;
      total += side * side;
    }
    if (total == a) return c;
    if (total > a)
      throw UsageError(strfmt("picodet postprocess: %lld predictions are not the four levels of a square input",
                              static_cast<long long>(a)));
  }
}

// One image, as LibreYOLO's PicoDet postprocess: per level every (prediction, class) pair with
// score > conf is a candidate, the level's best kNmsPre kept; boxes clipped to the input canvas
// (S x S), scaled back by the stretch's factors, clipped to the original image, those of width or
// height <= 0 dropped (ops::nms_detections); class-aware NMS at `iou`; the best max_det by score.
ops::Detections postprocess(const torch::Tensor& pred, const PostprocessArgs& a) {
  const torch::Tensor p = pred.dim() == 3 && pred.size(0) == 1 ? pred[0] : pred;
  if (!p.defined() || p.dim() != 2 || p.size(0) <= 4 || !at::isFloatingType(p.scalar_type()))
    throw UsageError("picodet postprocess: pred must be a floating tensor [4 + nc, A] for one image");
  if (a.max_det < 1) throw UsageError("picodet postprocess: max_det must be >= 1");
  const auto counts = level_counts(p.size(1));
  const auto boxes_all = p.narrow(0, 0, 4).t();               // [A, 4]
  const auto scores_all = p.narrow(0, 4, p.size(0) - 4).t();  // [A, nc]
  std::vector<torch::Tensor> boxes, scores, classes;
  int64_t start = 0;
  for (int64_t n : counts) {
    const auto s = scores_all.narrow(0, start, n);
    const auto idx = (s > a.conf).nonzero();  // [M, 2] (prediction, class), row-major
    if (idx.size(0) > 0) {
      auto flat = s.index({idx.select(1, 0), idx.select(1, 1)});
      auto keep = idx;
      if (flat.size(0) > kNmsPre) {
        auto top = torch::topk(flat, kNmsPre);
        flat = std::get<0>(top);
        keep = idx.index_select(0, std::get<1>(top));
      }
      scores.push_back(flat);
      classes.push_back(keep.select(1, 1));
      boxes.push_back(boxes_all.index_select(0, keep.select(1, 0) + start));
    }
    start += n;
  }
  if (boxes.empty()) return ops::no_detections();
  auto b = torch::cat(boxes).to(torch::kFloat).clone();
  auto sc = torch::cat(scores).to(torch::kFloat);
  auto cl = torch::cat(classes);
  const auto& g = a.geometry;
  // The canvas is the original stretched by (sx, sy); back by the inverse factors.
  const double canvas_w = std::round(g.sx * g.orig_w), canvas_h = std::round(g.sy * g.orig_h);
  const double fx = g.orig_w / canvas_w, fy = g.orig_h / canvas_h;
  for (int c : {0, 2}) b.select(1, c).clamp_(0, canvas_w).mul_(fx).clamp_(0, g.orig_w);
  for (int c : {1, 3}) b.select(1, c).clamp_(0, canvas_h).mul_(fy).clamp_(0, g.orig_h);
  return ops::nms_detections(b, sc, cl, a.iou, a.max_det);
}

}  // namespace

Family make_family() {
  Family f("picodet", size_names(), "s");
  f.default_sync_bn = true;  // SyncBN; only has an effect under DDP
  f.set_weight_functions(build, build_like, can_load, infer_size, infer_num_classes, normalize_keys);
  f.make_loss = make_loss;
  f.input_size = size_input;
  // The eval forward's replay equals eager bit for bit (GpuInferenceGraph.ReplayEqualsEagerBitForBit-
  // OnTwoProbes): capture_inference. The loss has no host reads and fixed shapes, and graphed
  // training steps equal eager ones bit for bit (GpuFamilyStepGraph/Dense.GraphedTrainingSteps-
  // EqualEagerBitForBit/picodet): capture_train_step.
  f.capture_inference = true;
  f.capture_train_step = true;
  // LibreYOLO's PICODETConfig where it differs from the defaults of config.hpp: SGD at 0.01
  // (momentum 0.9 from the first step, Nesterov, decay 4e-5 on the convolution weights: the shared
  // grouping), a quadratic warm-up of one epoch from 0.001 and a cosine to 0 (cos_flat with no flat
  // tail), no mosaic, mixup, HSV or affine: the horizontal flip is the only augmentation, EMA 0.9998.
  // JPEGs decoded in full, as predict decodes them: trained on reduced decodes (smoother than the
  // pixels it is later shown) PicoDet-s learnt more slowly, 0.145 against 0.229 mAP50-95 after 3
  // epochs on the convergence benchmark's colour set (CPU, same starting weights, full-decode
  // validation; the reference 0.30), and ended lower after 15 on the GPU (0.767 / 0.801 against
  // 0.774 / 0.812, seeds 0 / 1).
  f.train_defaults = {
      {"reduced_decode", "false"},
      {"optimizer", "sgd"},        {"lr0", "0.01"},          {"momentum", "0.9"},
      {"warmup_momentum", "0.9"},  {"nesterov", "true"},     {"weight_decay", "4e-5"},
      {"scheduler", "cos_flat"},   {"warmup_epochs", "1"},   {"warmup_lr_start", "0.001"},
      {"min_lr_ratio", "0"},       {"no_aug_epochs", "0"},   {"mosaic_prob", "0"},
      {"mixup_prob", "0"},         {"hsv_prob", "0"},        {"flip_prob", "0.5"},
      {"degrees", "0"},            {"translate", "0"},       {"shear", "0"},
      {"ema_decay", "0.9998"},     {"ema_tau", "2000"},      {"eval_interval", "10"},
      {"save_period", "10"},       {"patience", "50"},       {"workers", "4"},
      {"name", "picodet_exp"},     {"aux_weight", "0"},
  };
  // The shared per-sample transform (flip, stretch; boxes of a side of at most one pixel after
  // the fit dropped), up to 50 boxes a sample.
  f.augment.max_labels = 50;
  // RGB 0-255 minus the ImageNet mean over its standard deviation, stretched to S x S.
  f.input.bgr = false;
  f.input.divisor = 1.0;
  f.input.mean = {123.675, 116.28, 103.53};
  f.input.stddev = {58.395, 57.12, 57.375};
  f.input.fit = ops::Fit::Stretch;
  f.postprocess = postprocess;
  f.train_val_thresholds = ops::kTrainValThresholds;  // conf 0.001, iou 0.65, max_det 300
  return f;
}

}  // namespace libreyolo::models::picodet
