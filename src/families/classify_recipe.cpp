#include "families/classify_recipe.hpp"

#include "loss/classify.hpp"

namespace libreyolo::models {

void apply_classify_recipe(Family& f) {
  f.task = "classify";
  f.default_num_classes = 1000;
  f.default_amp = true;
  f.default_sync_bn = false;
  f.supports_spawn = false;
  // The step (forward, cross-entropy, backward, update) has fixed shapes and no host reads, and
  // graphed steps equal eager ones bit for bit for all three families
  // (GpuClassifierStepGraph/Classify.GraphedTrainingStepsEqualEagerBitForBit): capture_train_step.
  // The eval forward (input conversion, network, softmax) replays bit for bit for all three, fp32
  // and bf16 (GpuInferenceGraph.ReplayEqualsEagerBitForBitOnTwoProbes, H100): capture_inference.
  f.capture_train_step = true;
  f.capture_train_head = false;
  f.capture_inference = true;
  f.input.bgr = false;
  f.input.divisor = 255.0;
  f.input.mean = {0.485, 0.456, 0.406};
  f.input.stddev = {0.229, 0.224, 0.225};
  f.input.fit = ops::Fit::Stretch;
  f.make_loss = [](const Detector&) -> std::unique_ptr<TrainingLoss> { return std::make_unique<loss::ClassificationLoss>(); };
  f.train_defaults = {
      {"epochs", "100"},         {"batch", "64"},          {"workers", "8"},
      {"optimizer", "adamw"},    {"lr0", "0.001"},         {"momentum", "0.9"},
      {"weight_decay", "1e-4"},  {"scheduler", "cos_flat"}, {"warmup_epochs", "1"},
      {"warmup_lr_start", "0"},  {"min_lr_ratio", "0.01"}, {"no_aug_epochs", "0"},
      {"mosaic_prob", "0"},      {"mixup_prob", "0"},      {"hsv_prob", "0"},
      {"flip_prob", "0.5"},      {"degrees", "0"},         {"translate", "0"},
      {"shear", "0"},            {"ema_decay", "0.9998"},  {"ema_tau", "2000"},
      {"eval_interval", "1"},    {"save_period", "10"},    {"patience", "50"},
      {"sync_bn", "false"},      {"aux_weight", "0"},      {"name", f.name + "_exp"},
  };
}

}  // namespace libreyolo::models
