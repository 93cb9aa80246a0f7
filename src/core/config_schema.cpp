#include "core/config_schema.hpp"

#include <filesystem>
#include <set>

#include <libreyolo/errors.hpp>

namespace libreyolo {

const OptionSchema<TrainConfig>& train_schema() {
  static const OptionSchema<TrainConfig> s = [] {
    OptionSchema<TrainConfig> o;
    using C = TrainConfig;
    o.add("data", &C::data, "dataset YAML, or 'builtin' for the generated shapes dataset; a classifier: a folder of class folders (root/train/<class>, root/val/<class>)")
        .add("epochs", &C::epochs, "number of epochs")
        .add("batch", &C::batch, "global batch size (-1 = autobatch)")
        .add("imgsz", &C::imgsz, "square training image size (multiple of 32)")
        .add("device", &C::device, "auto, cpu, cuda, cuda:N, N")
        .add("workers", &C::workers, "data loader threads")
        .add("cache", &C::cache, "cache decoded images: false, ram, or disk (files beside the images)")
        .add("loader", &C::loader, "where samples are decoded and augmented: auto (cpu), cpu, gpu (nvJPEG + CUDA kernels)")
        .add("reduced_decode", &C::reduced_decode,
             "CPU loader: decode JPEGs at the reduced DCT scale covering the size they are shown at (faster); false: full decodes, the reference's pixels")
        .add("seed", &C::seed, "random seed")
        .add("deterministic", &C::deterministic,
             "CUDA: deterministic cuDNN algorithms by heuristics, no autotuning (same weights run to run; slower)")
        .add("resume", &C::resume, "resume from a checkpoint path (or true: the loaded one)")
        .add("pretrained", &C::pretrained, "start from the loaded weights")
        .add("amp", &C::amp, "mixed precision on CUDA")
        .add("amp_dtype", &C::amp_dtype, "float16 (with loss scaling) or bfloat16")
        .add("memory_format", &C::memory_format, "auto, channels_last or contiguous")
        .add("cuda_graph", &C::cuda_graph, "replay the whole training step from CUDA graphs (captured per input shape)")
        .add("cuda_graph_scope", &C::cuda_graph_scope, "what CUDA graphs capture, the deepest the family allows within it: step (the whole step), network (the whole network, the loss eager) or head (the backbone and encoder); the update with each")
        .add("optimizer", &C::optimizer, "sgd, adam or adamw")
        .add("lr0", &C::lr0, "initial learning rate")
        .add("lr_backbone", &C::lr_backbone, "the backbone's learning rate, for families that train it apart (0 = lr0)")
        .add("backbone_lr_mult", &C::backbone_lr_mult, "the backbone's learning rate as a fraction of lr0, when lr_backbone is 0 (0 = lr0)")
        .add("momentum", &C::momentum, "SGD momentum")
        .add("warmup_momentum", &C::warmup_momentum, "SGD momentum at the start of warm-up (rises linearly to momentum)")
        .add("weight_decay", &C::weight_decay, "weight decay (conv weights only)")
        .add("nesterov", &C::nesterov, "Nesterov momentum")
        .add("scheduler", &C::scheduler, "linear, cos (warmcos), cos_flat, constant, flat_cosine, or the model family's name for one of them")
        .add("warmup_epochs", &C::warmup_epochs, "linear warm-up length in epochs")
        .add("warmup_lr_start", &C::warmup_lr_start, "learning rate at the start of warm-up")
        .add("min_lr_ratio", &C::min_lr_ratio, "final learning rate as a fraction of lr0")
        .add("nbs", &C::nbs, "nominal batch size for gradient accumulation (0 = off)")
        .add("clip_max_norm", &C::clip_max_norm, "gradient clipping max norm (0 = off)")
        .add("aux_weight", &C::aux_weight, "loss weight of the training-only auxiliary branch (PGI; 0: none)")
        .add("freeze", &C::freeze, "freeze the first N module groups, or named modules")
        .add("no_aug_epochs", &C::no_aug_epochs, "final epochs without mosaic/mixup")
        .add("mosaic_prob", &C::mosaic_prob, "mosaic probability")
        .add("mixup_prob", &C::mixup_prob, "mixup probability")
        .add("hsv_prob", &C::hsv_prob, "HSV augmentation probability")
        .add("flip_prob", &C::flip_prob, "horizontal flip probability")
        .add("degrees", &C::degrees, "mosaic affine: rotation range in degrees (+-)")
        .add("translate", &C::translate, "mosaic affine: translation range, fraction of imgsz (+-)")
        .add("shear", &C::shear, "mosaic affine: shear range in degrees (+-)")
        .add("mosaic_scale", &C::mosaic_scale, "mosaic affine: scale range 'lo,hi' (or x: 1-x,1+x)")
        .add("mixup_scale", &C::mixup_scale, "scaled-paste mixup: partner scale range 'lo,hi' (or x: 1-x,1+x)")
        .add("ema", &C::ema, "keep an exponential moving average of the weights")
        .add("ema_decay", &C::ema_decay, "EMA decay")
        .add("ema_tau", &C::ema_tau, "EMA warm-up constant (updates)")
        .add("val", &C::val, "validate during training")
        .add("eval_interval", &C::eval_interval, "validate every N epochs and after the last (0: the last only)")
        .add("patience", &C::patience, "early stop after N validations without improvement (0 = off)")
        .add("save_period", &C::save_period, "save a checkpoint every N epochs")
        .add("save_plots", &C::save_plots, "write plots (val curves) at the end of training")
        .add("project", &C::project, "parent folder of run directories")
        .add("name", &C::name, "run directory name")
        .add("exist_ok", &C::exist_ok, "reuse an existing run directory")
        .add("sync_bn", &C::sync_bn, "synchronised BatchNorm under multi-GPU training")
        .add("verbose", &C::verbose, "print progress")
        .add("profile", &C::profile, "profile a window of steps: verdict, report and files in the run dir")
        .add("profile_warmup", &C::profile_warmup, "steps discarded before the profile window")
        .add("profile_steps", &C::profile_steps, "steps measured by the profiler")
        .add("profile_then_stop", &C::profile_then_stop, "stop training when the profile window closes")
        .add("profile_trace", &C::profile_trace, "record the Kineto trace in the profile window")
        .add("profile_open", &C::profile_open, "open timeline.html when a display exists");
    o.alias("mosaic", "mosaic_prob").alias("mixup", "mixup_prob");
    return o;
  }();
  return s;
}

const OptionSchema<PredictConfig>& predict_schema() {
  static const OptionSchema<PredictConfig> s = [] {
    OptionSchema<PredictConfig> o;
    using C = PredictConfig;
    o.add("source", &C::source, "image file, directory, or SAMPLE_IMAGE")
        .add("conf", &C::conf, "confidence threshold")
        .add("iou", &C::iou, "NMS IoU threshold")
        .add("imgsz", &C::imgsz, "inference size, a multiple of 32 (0: the size the model was trained at)")
        .add("max_det", &C::max_det, "maximum detections per image")
        .add("classes", &C::classes, "keep only these class ids (comma-separated)")
        .add("device", &C::device, "auto, cpu, cuda, cuda:N, N")
        .add("half", &C::half, "float16 (autocast) inference on CUDA")
        .add("cuda_graph", &C::cuda_graph, "false, true or auto: replay the forward from CUDA graphs per input shape")
        .add("batch", &C::batch, "images per forward")
        .add("save", &C::save, "save annotated images")
        .add("project", &C::project, "parent folder of output directories")
        .add("name", &C::name, "output directory name")
        .add("exist_ok", &C::exist_ok, "reuse an existing output directory");
    return o;
  }();
  return s;
}

const OptionSchema<ValConfig>& val_schema() {
  static const OptionSchema<ValConfig> s = [] {
    OptionSchema<ValConfig> o;
    using C = ValConfig;
    o.add("data", &C::data, "dataset YAML, or 'builtin'; a classifier: a folder of class folders")
        .add("split", &C::split, "val, train or test")
        .add("batch", &C::batch, "batch size")
        .add("imgsz", &C::imgsz, "image size, a multiple of 32 (0: the size the model was trained at)")
        .add("conf", &C::conf, "confidence threshold")
        .add("iou", &C::iou, "NMS IoU threshold")
        .add("max_det", &C::max_det, "maximum detections per image")
        .add("half", &C::half, "float16 (autocast) inference on CUDA")
        .add("cuda_graph", &C::cuda_graph, "false, true or auto: replay the forward from CUDA graphs per input shape")
        .add("workers", &C::workers, "data loader threads")
        .add("reduced_decode", &C::reduced_decode,
             "true: decode JPEGs at the reduced DCT scale covering imgsz (faster, but not the pixels predict gives the model); default false: full decodes")
        .add("device", &C::device, "auto, cpu, cuda, cuda:N, N")
        .add("project", &C::project, "parent folder of run directories")
        .add("name", &C::name, "run directory name")
        .add("exist_ok", &C::exist_ok, "reuse an existing run directory");
    o.alias("batch_size", "batch").alias("conf_thres", "conf").alias("iou_thres", "iou");
    return o;
  }();
  return s;
}

namespace {
void range_error(const std::string& key, const std::string& why) {
  throw UsageError("Invalid value for '" + key + "': " + why, "", "config_range_error");
}
void check_imgsz(int imgsz, bool zero_ok = false) {
  if (zero_ok && imgsz == 0) return;
  if (imgsz < 32 || imgsz % 32 != 0)
    range_error("imgsz", std::to_string(imgsz) + " is not a positive multiple of 32");
  // One 3 x S x S float32 image at 8192 is 0.8 GB, and a network's activations are hundreds of
  // times that: larger sizes cannot run anywhere.
  if (imgsz > 8192) range_error("imgsz", std::to_string(imgsz) + " is above 8192");
}
void check_one_of(const std::string& key, const std::string& v, std::initializer_list<const char*> ok) {
  std::string all;
  for (const char* o : ok) {
    if (v == o) return;
    all += all.empty() ? o : std::string(", ") + o;
  }
  range_error(key, "'" + v + "' is not one of: " + all);
}
// The run (or output) directory's name: a folder under project, made by the run. Empty, absolute
// (which would leave project), or with a "." or ".." part, the run would land elsewhere than named
// (an empty name numbered the project folder itself: "2", "3").
void check_run_name(const std::string& name) {
  if (name.empty()) range_error("name", "must not be empty (the run directory's name under project)");
  const std::filesystem::path p(name);
  if (p.is_absolute()) range_error("name", "'" + name + "' is absolute; name is a folder under project (set project= for the parent)");
  for (const auto& part : p)
    if (part == "." || part == "..")
      range_error("name", "'" + name + "' has a '" + part.string() + "' part; name is a folder under project");
}

void check_unit(const std::string& key, double v) {
  if (v < 0.0 || v > 1.0) range_error(key, "must be within [0, 1]");
}
}  // namespace

std::pair<double, double> parse_scale_range(const std::string& key, const std::string& value) {
  std::string v;
  for (char ch : value)
    if (ch != '(' && ch != ')' && ch != '[' && ch != ']' && ch != ' ') v += ch;
  const size_t comma = v.find(',');
  double lo = 0, hi = 0;
  try {
    if (comma == std::string::npos) {
      const double x = parse_float(key, v);
      lo = 1.0 - x, hi = 1.0 + x;
    } else {
      if (v.find(',', comma + 1) != std::string::npos) throw UsageError("three values");
      lo = parse_float(key, v.substr(0, comma));
      hi = parse_float(key, v.substr(comma + 1));
    }
  } catch (const UsageError&) {
    range_error(key, "'" + value + "' is not a range 'lo,hi' (or one number x for 1-x,1+x)");
  }
  if (!(lo > 0 && lo <= hi && hi < 1e3)) range_error(key, "'" + value + "' needs 0 < lo <= hi");
  return {lo, hi};
}

void validate(const TrainConfig& c) {
  if (c.epochs < 1) range_error("epochs", "must be at least 1");
  check_run_name(c.name);
  if (c.batch == 0 || c.batch < -1) range_error("batch", "must be positive, or -1 for autobatch");
  check_imgsz(c.imgsz);
  if (c.workers < 0) range_error("workers", "must be >= 0");
  check_one_of("amp_dtype", c.amp_dtype, {"float16", "bfloat16", "fp16", "bf16"});
  check_one_of("memory_format", c.memory_format, {"auto", "channels_last", "contiguous"});
  check_one_of("cuda_graph_scope", c.cuda_graph_scope, {"step", "network", "head"});
  check_one_of("optimizer", c.optimizer, {"sgd", "adam", "adamw", "SGD", "Adam", "AdamW"});
  if (c.scheduler.empty()) range_error("scheduler", "must name a schedule");  // the family reads it (engine/schedule)
  check_one_of("cache", c.cache, {"false", "ram", "disk", "true", "0", "1", "no", "yes"});
  check_one_of("loader", c.loader, {"auto", "cpu", "gpu"});
  if (c.lr0 <= 0) range_error("lr0", "must be positive");
  if (!(c.lr_backbone >= 0)) range_error("lr_backbone", "must be >= 0 (0: lr0)");
  if (!(c.backbone_lr_mult >= 0)) range_error("backbone_lr_mult", "must be >= 0 (0: lr0)");
  if (c.warmup_lr_start < 0) range_error("warmup_lr_start", "must be >= 0 (a negative learning rate climbs the loss)");
  if (c.ema_tau < 0) range_error("ema_tau", "must be >= 0");
  if (c.eval_interval < 0) range_error("eval_interval", "must be >= 0 (0: the last epoch only)");
  if (c.momentum < 0 || c.momentum >= 1) range_error("momentum", "must be within [0, 1)");
  if (c.warmup_momentum < 0 || c.warmup_momentum >= 1) range_error("warmup_momentum", "must be within [0, 1)");
  if (!(c.aux_weight >= 0) || c.aux_weight > 100) range_error("aux_weight", "must be within [0, 100]");
  if (c.weight_decay < 0) range_error("weight_decay", "must be >= 0");
  if (c.warmup_epochs < 0) range_error("warmup_epochs", "must be >= 0");
  if (c.min_lr_ratio < 0 || c.min_lr_ratio > 1) range_error("min_lr_ratio", "must be within [0, 1]");
  if (c.nbs < 0) range_error("nbs", "must be >= 0");
  if (c.clip_max_norm < 0)
    range_error("clip_max_norm", "clip_max_norm must be a finite non-negative number");
  if (c.no_aug_epochs < 0) range_error("no_aug_epochs", "must be >= 0");
  check_unit("mosaic_prob", c.mosaic_prob);
  check_unit("mixup_prob", c.mixup_prob);
  check_unit("hsv_prob", c.hsv_prob);
  check_unit("flip_prob", c.flip_prob);
  if (!(c.degrees >= 0 && c.degrees <= 180)) range_error("degrees", "must be within [0, 180]");
  if (!(c.translate >= 0 && c.translate < 1)) range_error("translate", "must be within [0, 1)");
  if (!(c.shear >= 0 && c.shear < 90)) range_error("shear", "must be within [0, 90)");
  parse_scale_range("mosaic_scale", c.mosaic_scale);
  parse_scale_range("mixup_scale", c.mixup_scale);
  if (c.ema_decay < 0 || c.ema_decay >= 1) range_error("ema_decay", "must be within [0, 1)");
  if (c.save_period < 0) range_error("save_period", "must be >= 0");
  if (c.patience < 0) range_error("patience", "must be >= 0");
  if (c.profile_warmup < 0) range_error("profile_warmup", "must be >= 0");
  if (c.profile_steps < 2) range_error("profile_steps", "must be at least 2 (an unsynced and a synced half)");
}

void validate(const PredictConfig& c) {
  check_imgsz(c.imgsz, /*zero_ok=*/true);
  check_run_name(c.name);
  check_one_of("cuda_graph", c.cuda_graph, {"false", "true", "auto", "0", "1", "off", "on"});
  check_unit("conf", c.conf);
  check_unit("iou", c.iou);
  if (c.max_det < 1) range_error("max_det", "must be at least 1");
  if (c.batch < 1) range_error("batch", "must be at least 1");
}

void validate(const ValConfig& c) {
  check_imgsz(c.imgsz, /*zero_ok=*/true);
  check_run_name(c.name);
  check_one_of("cuda_graph", c.cuda_graph, {"false", "true", "auto", "0", "1", "off", "on"});
  check_unit("conf", c.conf);
  check_unit("iou", c.iou);
  if (c.batch < 1) range_error("batch", "must be at least 1");
  if (c.max_det < 1) range_error("max_det", "must be at least 1");
  check_one_of("split", c.split, {"train", "val", "test"});
}

static std::string yaml_scalar(const std::string& v) {
  if (v.empty()) return "''";
  bool plain = true;
  for (char ch : v)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-' || ch == '/'))
      plain = false;
  if (plain) return v;
  std::string out = "'";
  for (char ch : v) out += ch == '\'' ? std::string("''") : std::string(1, ch);
  return out + "'";
}

template <class C>
std::string to_yaml(const OptionSchema<C>& schema, const C& c) {
  std::string out;
  for (const auto& [k, v] : schema.dump(c)) out += k + ": " + yaml_scalar(v) + "\n";
  return out;
}
template std::string to_yaml(const OptionSchema<TrainConfig>&, const TrainConfig&);
template std::string to_yaml(const OptionSchema<PredictConfig>&, const PredictConfig&);
template std::string to_yaml(const OptionSchema<ValConfig>&, const ValConfig&);

}  // namespace libreyolo
