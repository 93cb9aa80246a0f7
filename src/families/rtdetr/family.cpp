// The rtdetr, rtdetrv2 and dfine registry entries: building, recognising and sizing RT-DETR(v2)
// and D-FINE weights, their recipes (AdamW with a slower backbone, clipping, no mosaic; a constant
// rate for RT-DETR, flat_cosine for D-FINE), their stretched input and their top-k postprocess.
// RT-DETRv2 is RT-DETR with the decoder options of Config::v2 (recognised by its num_points_scale
// buffers) and LibreYOLO's v1 recipe; D-FINE (families/rtdetr/dfine.hpp) is recognised by its
// decoder's pre_bbox_head.

#include <algorithm>

#include "core/log.hpp"
#include "families/rtdetr/dfine.hpp"
#include "families/rtdetr/dfine_loss.hpp"
#include "families/rtdetr/loss.hpp"
#include "families/rtdetr/model.hpp"
#include "libreyolo/errors.hpp"
#include "ops/postprocess.hpp"

namespace libreyolo::models::rtdetr {

namespace {

// Without DDP's "module." prefix; the encoder's input projections under upstream RT-DETR's names
// (input_proj.{i}.conv / .norm) take LibreYOLO's numeric ones (input_proj.{i}.0 / .1).
std::string canonical_key(const std::string& key) {
  std::string k = io::strip_ddp_prefix(key);
  const std::string prefix = "encoder.input_proj.";
  if (k.rfind(prefix, 0) == 0) {
    const size_t dot = k.find('.', prefix.size());
    if (dot != std::string::npos) {
      const std::string rest = k.substr(dot + 1);
      if (rest.rfind("conv.", 0) == 0) k = k.substr(0, dot + 1) + "0." + rest.substr(5);
      else if (rest.rfind("norm.", 0) == 0) k = k.substr(0, dot + 1) + "1." + rest.substr(5);
    }
  }
  return k;
}

void normalize_keys(io::StateDict& sd) {
  for (auto& kv : sd) kv.first = canonical_key(kv.first);
}

io::StateDict normalized(const io::StateDict& sd) {
  io::StateDict out = sd;
  normalize_keys(out);
  return out;
}

// RT-DETR(v2) weights: a PResNet or HGNetv2 backbone and the decoder's per-layer score heads;
// RT-DETRv2's decoder has num_points_scale buffers, v1's has none.
bool can_load_decoder(const io::StateDict& sd, bool v2) {
  if (is_dfine_state_dict(sd)) return false;  // D-FINE's decoder has the same heads and buffers
  bool backbone = false, heads = false, scale = false;
  const std::string buffer = "cross_attn.num_points_scale";
  for (const auto& kv : sd) {
    const std::string k = canonical_key(kv.first);
    backbone = backbone || k.rfind("backbone.res_layers.", 0) == 0 || k.rfind("backbone.stem.stem1.", 0) == 0;
    heads = heads || k.rfind("decoder.dec_score_head.", 0) == 0;
    scale = scale || (k.size() > buffer.size() && k.compare(k.size() - buffer.size(), buffer.size(), buffer) == 0);
  }
  return backbone && heads && scale == v2;
}

bool can_load(const io::StateDict& sd) { return can_load_decoder(sd, false); }
bool can_load_v2(const io::StateDict& sd) { return can_load_decoder(sd, true); }

std::optional<std::string> infer_size(const io::StateDict& sd) {
  const auto cfg = config_from_state_dict(normalized(sd));
  if (!cfg || cfg->size.empty()) return std::nullopt;
  return cfg->size;
}

std::optional<int> infer_num_classes(const io::StateDict& sd) {
  const auto cfg = config_from_state_dict(normalized(sd));
  if (!cfg) return std::nullopt;
  return cfg->nc;
}

// A fresh model is LibreYOLO's from-scratch build: no backbone weights come with it, so its
// backbone norms train (the sizes' frozen norms describe its pretrained builds, whose checkpoints
// build_like reads as they are).
std::shared_ptr<Detector> build(const std::string& size, int nc) {
  auto cfg = size_config(size, nc);
  cfg.frozen_norm = false;
  return std::make_shared<RtdetrModel>(cfg);
}

std::shared_ptr<Detector> build_v2(const std::string& size, int nc) {
  auto cfg = v2_size_config(size, nc);
  cfg.frozen_norm = false;
  return std::make_shared<RtdetrModel>(cfg);
}

// Shaped by the weights' own widths (a checkpoint of any width builds its network); nc <= 0 keeps
// the weights' class count.
std::shared_ptr<Detector> build_like(const io::StateDict& sd, int nc) {
  auto cfg = config_from_state_dict(normalized(sd));
  if (!cfg)
    throw ModelError("cannot tell the RT-DETR widths from the weights (a backbone, encoder or decoder key is missing)");
  if (nc > 0) cfg->nc = nc;
  return std::make_shared<RtdetrModel>(*cfg);
}

std::unique_ptr<TrainingLoss> make_loss(const Detector& model) {
  return std::make_unique<loss::RtdetrLoss>(model.num_classes());
}

// Decoded predictions [4 + nc, Q] (xyxy in input pixels, sigmoid scores) of one image: the flat
// top-k over queries x classes (query-major), those above conf, boxes mapped back by the fit's
// scales (no NMS: one query may give several classes).
ops::Detections postprocess(const torch::Tensor& pred, const PostprocessArgs& a) {
  const torch::Tensor p = pred.dim() == 3 ? pred[0] : pred;
  if (!p.defined() || p.dim() != 2 || p.size(0) <= 4)
    throw UsageError("rtdetr postprocess: pred must be a tensor [4 + nc, Q] for one image");
  const auto& g = a.geometry;
  if (!(g.sx > 0) || !(g.sy > 0) || g.orig_h < 1 || g.orig_w < 1)
    throw UsageError(strfmt("rtdetr postprocess: bad geometry (scales %g x %g, original %dx%d)", g.sx, g.sy,
                            g.orig_w, g.orig_h));
  if (a.max_det < 1) throw UsageError(strfmt("rtdetr postprocess: max_det must be >= 1, got %d", a.max_det));
  // The top-k and the gather where the predictions are (on a GPU: one copy of k rows to the host
  // instead of the whole [4 + nc, Q] map and a host top-k), the rest on the host.
  const torch::Tensor f = p.to(torch::kFloat);
  const int64_t nc = f.size(0) - 4;
  const torch::Tensor scores = f.slice(0, 4).t().flatten();  // index q * nc + c
  const int64_t k = std::min<int64_t>(a.max_det, scores.numel());
  const auto [top_at, idx_at] = torch::topk(scores, k, 0, /*largest=*/true, /*sorted=*/true);
  const torch::Tensor gathered = f.slice(0, 0, 4).index_select(1, torch::div(idx_at, nc, "floor")).t();  // [k, 4]
  // Rows [x1, y1, x2, y2, score] in float32, and the flat indices, each in one copy.
  const torch::Tensor rows = torch::cat({gathered, top_at.unsqueeze(1)}, 1).to(torch::kCPU);
  const torch::Tensor idx = idx_at.to(torch::kCPU);
  const torch::Tensor top = rows.select(1, 4);
  const torch::Tensor keep = top > a.conf;
  const torch::Tensor scale = torch::tensor({g.sx, g.sy, g.sx, g.sy}, torch::kDouble);
  ops::Detections d;
  d.boxes = (rows.narrow(1, 0, 4).index({keep}).to(torch::kDouble) / scale).to(torch::kFloat).contiguous();
  d.scores = top.index({keep}).contiguous();
  d.classes = torch::remainder(idx, nc).index({keep}).contiguous();
  return d;
}

// What both entries share: the recipe, the optimizer groups, the input and the postprocess.
void set_recipe(Family& f) {
  f.make_loss = make_loss;
  // LibreYOLO's RTDETRConfig where it differs from the defaults of config.hpp (RT-DETRv2 trains
  // with the same configuration, experiment name included).
  f.train_defaults = {
      {"epochs", "72"},         {"batch", "4"},           {"optimizer", "adamw"},
      {"lr0", "1e-4"},          {"lr_backbone", "5e-6"},  {"weight_decay", "1e-4"},
      {"scheduler", "constant"}, {"warmup_epochs", "0"},  {"clip_max_norm", "0.1"},
      {"mosaic_prob", "0"},     {"mixup_prob", "0"},      {"hsv_prob", "0.5"},
      {"flip_prob", "0.5"},     {"no_aug_epochs", "0"},   {"eval_interval", "1"},
      {"aux_weight", "0"},      {"name", "rtdetr_exp"},
  };
  // The optimizer groups by name, first match wins: the backbone at lr_backbone (its norms without
  // decay), the encoder's and decoder's norms and biases without decay, the rest with it.
  f.param_rules = {
      {{"backbone"}, {"norm", "bn"}, /*decay=*/false, /*backbone_lr=*/true},
      {{"backbone"}, {}, /*decay=*/true, /*backbone_lr=*/true},
      {{"encoder"}, {"norm", "bias"}, /*decay=*/false, /*backbone_lr=*/false},
      {{"decoder"}, {"norm", "bias"}, /*decay=*/false, /*backbone_lr=*/false},
      {{}, {}, /*decay=*/true, /*backbone_lr=*/false},
  };
  // No mosaic: every sample is one image, HSV-shifted and mirrored with probability 1/2, stretched
  // to S x S; up to 300 boxes a sample.
  f.augment.max_labels = 300;
  f.input = InputSpec{};
  f.input.fit = ops::Fit::Stretch;
  f.postprocess = postprocess;
  // Validation scores the top 300 of every image (conf 0: no threshold; no NMS).
  f.train_val_thresholds = ops::PostprocessThresholds{0.0, 0.45, 300};
}

// ----- D-FINE

void strip_ddp(io::StateDict& sd) {
  for (auto& kv : sd) kv.first = io::strip_ddp_prefix(kv.first);
}

io::StateDict without_ddp(const io::StateDict& sd) {
  io::StateDict out = sd;
  strip_ddp(out);
  return out;
}

// Upstream RT-DETRv4 training checkpoints carry the distillation projector, training-only; its
// presence is what tells a raw RT-DETRv4 file from a D-FINE or DEIM one (every other key is shared).
bool is_distillation_key(const std::string& key) { return key.rfind("encoder.feature_projector.", 0) == 0; }

bool has_distillation_keys(const io::StateDict& sd) {
  for (const auto& kv : sd)
    if (is_distillation_key(io::strip_ddp_prefix(kv.first))) return true;
  return false;
}

io::StateDict without_distillation(const io::StateDict& sd) {
  io::StateDict out;
  for (const auto& kv : sd)
    if (!is_distillation_key(io::strip_ddp_prefix(kv.first))) out.push_back(kv);
  return out;
}

// D-FINE-line weights: its decoder's pre_bbox_head, the HGNetv2 stem, and the decoder's own
// layout (the layers' linear feed-forward, the encoder-output projection). DEIMv2's weights share
// the first two but not the last (RMS norms, a SwiGLU feed-forward): they are not this line's.
bool dfine_keys(const io::StateDict& sd) {
  const auto k = without_ddp(sd);
  if (!is_dfine_state_dict(k)) return false;
  const auto has = [&](const std::string& key) {
    return std::any_of(k.begin(), k.end(), [&](const auto& kv) { return kv.first == key; });
  };
  const bool stem = std::any_of(k.begin(), k.end(),
                                [](const auto& kv) { return kv.first.rfind("backbone.stem.stem1.", 0) == 0; });
  return stem && has("decoder.decoder.layers.0.linear1.weight") && has("decoder.enc_output.proj.weight");
}

std::optional<std::string> dfine_infer_size(const io::StateDict& sd) {
  const auto cfg = dfine_config_from_state_dict(without_ddp(sd));
  if (!cfg || cfg->size.empty()) return std::nullopt;
  return cfg->size;
}

std::optional<int> dfine_infer_num_classes(const io::StateDict& sd) {
  const auto cfg = dfine_config_from_state_dict(without_ddp(sd));
  if (!cfg) return std::nullopt;
  return cfg->nc;
}

// The D-FINE line's networks: D-FINE's, or with silu DEIM's and RT-DETRv4's (the same tensors).
// A fresh model is LibreYOLO's from-scratch build (backbone norms train).
Family dfine_line_family(const std::string& name, std::vector<std::string> sizes, bool silu) {
  Family f(name, std::move(sizes), "s");
  const auto build = [silu](const std::string& size, int nc) -> std::shared_ptr<Detector> {
    auto cfg = dfine_size_config(size, nc);
    cfg.frozen_norm = false;
    cfg.silu = silu;
    return std::make_shared<DfineModel>(cfg);
  };
  const auto build_like = [silu, name](const io::StateDict& sd, int nc) -> std::shared_ptr<Detector> {
    auto cfg = dfine_config_from_state_dict(without_ddp(without_distillation(sd)));
    if (!cfg)
      throw ModelError("cannot tell the " + name + " widths from the weights (a backbone, encoder or decoder key is missing)");
    if (nc > 0) cfg->nc = nc;
    cfg->silu = silu;
    return std::make_shared<DfineModel>(*cfg);
  };
  // Raw RT-DETRv4 weights (with their distillation projector) are RT-DETRv4's (its entry says so).
  const auto can_load = [](const io::StateDict& sd) { return dfine_keys(sd) && !has_distillation_keys(sd); };
  f.set_weight_functions(build, build_like, can_load, dfine_infer_size, dfine_infer_num_classes, strip_ddp);
  set_recipe(f);  // RT-DETR's input (stretch), augmentation cap, postprocess and validation top 300
  // The eval forward's replay equals eager bit for bit for D-FINE, DEIM and RT-DETRv4 (H100,
  // GpuInferenceGraph.ReplayEqualsEagerBitForBitOnTwoProbes, fp32 and bf16): capture_inference.
  // The training seams (DfineModel::train_head) are declared per family where their GPU tests ran.
  f.capture_inference = true;
  // LibreYOLO's four D-FINE-line groups: {backbone (at backbone_lr_mult x lr0), the rest} x {with
  // decay, without it for norms, biases (in_proj_bias included) and the learnable affine scales}.
  const std::vector<std::string> no_decay = {"norm", ".bn.", "bias", "lab.scale"};
  f.param_rules = {
      {{"backbone."}, no_decay, /*decay=*/false, /*backbone_lr=*/true},
      {{"backbone."}, {}, /*decay=*/true, /*backbone_lr=*/true},
      {{}, no_decay, /*decay=*/false, /*backbone_lr=*/false},
      {{}, {}, /*decay=*/true, /*backbone_lr=*/false},
  };
  // Like RT-DETR's, the whole training step has data-dependent shapes (denoising groups,
  // host-side matching): the families declare seams (DfineModel::train_head) where their GPU
  // tests have passed.
  f.default_amp = false;
  return f;
}

// DEIM's recipe, shared by RT-DETRv4 (LibreYOLO's DEIMConfig over the D-FINE line's): AdamW at
// 1e-4, decay 1e-4, flat_cosine (2 warm-up epochs from 1e-6, a cosine to 0.05 over the last 12),
// clipping 0.1, EMA 0.9999, flips only; the backbone's rate a fraction of lr0 that shrinks with
// the size (n, s 0.5; m 0.1; l 0.05; x 0.01).
void set_deim_recipe(Family& f) {
  f.make_loss = [](const Detector& model) -> std::unique_ptr<TrainingLoss> {
    return std::make_unique<loss::DfineLoss>(model.num_classes(), loss::deim_loss_weights());
  };
  f.train_defaults = {
      {"epochs", "132"},        {"optimizer", "adamw"},       {"lr0", "1e-4"},        {"weight_decay", "1e-4"},
      {"scheduler", "flat_cosine"}, {"warmup_epochs", "2"},   {"warmup_lr_start", "1e-6"}, {"min_lr_ratio", "0.05"},
      {"no_aug_epochs", "12"},  {"clip_max_norm", "0.1"},     {"mosaic_prob", "0"},   {"mixup_prob", "0"},
      {"hsv_prob", "0"},        {"flip_prob", "0.5"},         {"ema_decay", "0.9999"}, {"eval_interval", "1"},
      {"aux_weight", "0"},      {"name", f.name + "_exp"},
  };
  f.size_train_defaults = [](const std::string& size) -> std::vector<std::pair<std::string, std::string>> {
    const char* mult = size == "m" ? "0.1" : size == "l" ? "0.05" : size == "x" ? "0.01" : "0.5";
    return {{"backbone_lr_mult", mult}};
  };
}

}  // namespace

Family make_family() {
  Family f("rtdetr", size_names(), "r18");
  // The whole training step is not capturable: contrastive denoising groups sized by the batch's
  // largest box count and the host-side Hungarian matching give it data-dependent shapes and host
  // reads. Its head (backbone and encoder: RtdetrModel::train_head) and the eval forward (300
  // queries) have fixed shapes and no host reads. The eval forward's replay equals eager bit for
  // bit (GpuInferenceGraph.ReplayEqualsEagerBitForBitOnTwoProbes, fp32 and bf16): capture_inference.
  // The head replayed from its graphs equals the eager head bit for bit (outputs and gradients,
  // RtdetrGpu.GraphedHeadEqualsEagerHeadBitForBit), and head-graphed training stays within the
  // eager runs' own spread (RtdetrGpu.HeadGraphedStepsStayWithinTheEagerSpread: deformable
  // attention's backward accumulates with atomics): capture_train_head.
  // The whole network (RtdetrModel's network seam, denoising in fixed slots) with the loss scored
  // from its plan (RtdetrLoss::plan) replayed too: outputs equal eager bit for bit, gradients and
  // 16-step runs within the eager runs' spread (H100, Seam/RtdetrLineGpu.*/rtdetr_network), and
  // the step 36.5 ms against 58.5 head-graphed (r18, batch 8, bf16): capture_train_network.
  f.set_weight_functions(build, build_like, can_load, infer_size, infer_num_classes, normalize_keys);
  set_recipe(f);
  f.capture_inference = true;
  f.capture_train_head = true;
  f.capture_train_network = true;
  return f;
}

Family make_v2_family() {
  // LibreYOLO 1.6.0's RT-DETRv2 sizes (its HGNetv2 ones are refused: they are RT-DETR's l and x).
  Family f("rtdetrv2", v2_size_names(), "r18");
  f.set_weight_functions(build_v2, build_like, can_load_v2, infer_size, infer_num_classes, normalize_keys);
  set_recipe(f);
  // RT-DETR's capture seam (RtdetrModel::train_head), with the same GPU evidence (H100): the eval
  // forward's replay and the head's equal eager bit for bit, head-graphed steps stay within the
  // eager runs' spread (Seam/RtdetrLineGpu.*/rtdetrv2). The network and the loss from its plan
  // replayed: 8 outputs equal eager bit for bit, parameter gradients and 16-step runs within the
  // eager runs' spread (H100, Seam/RtdetrLineGpu.*/rtdetrv2_network), and the r18 step 36.4 ms
  // against 83.9 eager (H200, batch 8, 640 px, bf16): capture_train_network.
  f.capture_inference = true;
  f.capture_train_head = true;
  f.capture_train_network = true;
  return f;
}

Family make_dfine_family() {
  Family f = dfine_line_family("dfine", dfine_size_names(), /*silu=*/false);
  // The head replayed equals eager bit for bit; head-graphed steps stay within the eager runs'
  // spread (H100, Seam/RtdetrLineGpu.*/dfine). The network and the loss from its plan replayed:
  // outputs equal eager bit for bit, gradients and 16-step runs within the eager spread (H100,
  // Seam/RtdetrLineGpu.*/dfine_network), and the n step 35.1 ms against 105.9 eager (H200, batch 8,
  // 640 px, bf16; 1.6.0's graphed step 471.7 ms on that machine): capture_train_network.
  f.capture_train_head = true;
  f.capture_train_network = true;
  f.make_loss = [](const Detector& model) -> std::unique_ptr<TrainingLoss> {
    return std::make_unique<loss::DfineLoss>(model.num_classes());
  };
  // LibreYOLO's DFINEConfig where it differs from the defaults of config.hpp: AdamW at 2e-4 with
  // the backbone at half of it, decay 1e-4, flat_cosine (2 warm-up epochs from 1e-6, flat, a cosine
  // to 0.05 over the last 4), clipping 0.1, EMA 0.9999, flips only (no mosaic, mixup or HSV).
  f.train_defaults = {
      {"epochs", "132"},        {"optimizer", "adamw"},     {"lr0", "2e-4"},           {"backbone_lr_mult", "0.5"},
      {"weight_decay", "1e-4"}, {"scheduler", "flat_cosine"}, {"warmup_epochs", "2"},     {"warmup_lr_start", "1e-6"}, {"min_lr_ratio", "0.05"},
      {"no_aug_epochs", "4"},   {"clip_max_norm", "0.1"},   {"mosaic_prob", "0"},      {"mixup_prob", "0"},
      {"hsv_prob", "0"},        {"flip_prob", "0.5"},       {"ema_decay", "0.9999"},   {"eval_interval", "1"},
      {"aux_weight", "0"},      {"name", "dfine_exp"},
  };
  f.default_amp_reason =
      "its decoder clamps activations at 65504, float16's largest finite value; amp=true turns it on. "
      "LibreYOLO 1.6.0's code defaults it on, its documentation off";
  return f;
}

Family make_deim_family() {
  // D-FINE's network with SiLU in the decoder, trained with the matchability-aware class loss.
  Family f = dfine_line_family("deim", dfine_size_names(), /*silu=*/true);
  // As D-FINE's (H100, Seam/RtdetrLineGpu.*/deim and deim_network); the n step 36.5 ms against
  // 121.4 eager (H200, batch 8, 640 px, bf16; 1.6.0's graphed step 591.4 ms on that machine).
  f.capture_train_head = true;
  f.capture_train_network = true;
  set_deim_recipe(f);
  f.default_amp_reason =
      "DEIM ships with amp=False (its D-FINE decoder clamps activations at 65504, float16's largest finite "
      "value); amp=true turns it on. LibreYOLO 1.6.0's code defaults it on";
  return f;
}

Family make_rtdetrv4_family() {
  // DEIM's network and training at sizes s, m, l, x, with its own learning rate, decay and length.
  static const std::vector<std::string> sizes{"s", "m", "l", "x"};
  Family f = dfine_line_family("rtdetrv4", sizes, /*silu=*/true);
  // The head replayed equals eager bit for bit (outputs and gradients, fp32 and bf16); head-graphed
  // steps stay within the eager runs' spread (H100, Seam/RtdetrLineGpu.*/rtdetrv4_head). The
  // network and the loss replayed as D-FINE's (H100, Seam/RtdetrLineGpu.*/rtdetrv4_network), and
  // the s step 54.3 ms against 132.8 eager (H100, batch 8, 640 px, bf16; 1.6.0's graphed step
  // 443.5 ms on another H100): capture_train_network.
  f.capture_train_head = true;
  f.capture_train_network = true;
  f.can_load = [](const io::StateDict& sd) { return dfine_keys(without_distillation(sd)); };
  f.normalize_keys = [](io::StateDict& sd) {
    sd = without_distillation(sd);
    strip_ddp(sd);
  };
  set_deim_recipe(f);
  for (auto& [k, v] : f.train_defaults) {
    if (k == "lr0") v = "5e-4";
    if (k == "weight_decay") v = "1.25e-4";
    if (k == "epochs") v = "58";
  }
  f.default_amp_reason =
      "RT-DETRv4 takes DEIM's amp=False (its D-FINE decoder clamps activations at 65504, float16's largest "
      "finite value); amp=true turns it on. LibreYOLO 1.6.0's code defaults it on";
  return f;
}

}  // namespace libreyolo::models::rtdetr
